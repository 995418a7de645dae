"""Comparing a vector step with the envs stepped by hand, for the contract: a step read as
one :class:`Row` per sub-env (a gymnasium env's row is the one-agent case), random valid
actions, and the checks :func:`assert_row` and :func:`assert_acting`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.steps import BatchStep, MultiAgentStep
from jaxrunner._src.testing.assertions import assert_trees_equal
from jaxrunner._src.testing.reference import ONE_AGENT, ByHand, ExpectedRow


@dataclasses.dataclass(kw_only=True)
class Row(ExpectedRow):
    """One sub-env's row of a step (or of ``reset_batch``), per agent id: what the env
    stepped by hand gives too (:class:`ExpectedRow`), and what only a backend reports."""

    acting: dict[str, Any]
    """The observation each acting agent acts on next."""
    starts: dict[str, bool] | None = None
    """Per acting agent: its episode starts with this observation (None: not reported,
    as by a gymnasium backend, whose every row of a reset starts one)."""
    slots: dict[str, tuple[float, bool, bool]]
    """Every agent slot's (reward, terminated, truncated), completed or not."""
    failed: bool = False


def env_ids(out: Any, num_rows: int) -> list[int]:
    """The env index of each row of ``out`` (``env_ids`` None: every env, in order)."""
    ids = out.env_ids
    if ids is None:
        return list(range(num_rows))
    if isinstance(ids, slice):
        return list(range(ids.start or 0, ids.stop, ids.step or 1))
    return np.atleast_1d(ids).tolist()


def read_rows(vec: Any, out: Any, first: int = 0) -> list[Row]:
    """``out`` (a ``step_batch``/``recv``/``reset_batch`` result of ``vec``; ``first``:
    the env of its first row where it has no ``env_ids``) as rows."""
    reset_rows = getattr(out, "reset_rows", None)
    if reset_rows is not None and np.any(reset_rows) and not vec.capabilities.reset_steps:
        raise AssertionError(
            f"reset_rows marks rows {np.flatnonzero(reset_rows).tolist()} as reset steps, but "
            "the backend's capabilities.reset_steps is False"
        )
    if isinstance(out, MultiAgentStep):
        return [_agent_row(vec, out, b) for b in range(len(out.env_done))]
    space = vec.single_observation_space
    if isinstance(out, BatchStep):
        n = len(out.reward)
        ids = range(first, first + n) if out.env_ids is None else env_ids(out, n)
        return [_one_agent_row(space, out, r, ids[r]) for r in range(n)]
    obs, infos = out  # a gymnasium backend's reset_batch
    return [
        Row({}, False, 0.0, info, acting={ONE_AGENT: space_arrays.take(space, obs, b)}, slots={})
        for b, info in enumerate(infos)
    ]


def _one_agent_row(space: Any, out: BatchStep, r: int, env: int) -> Row:
    failed = out.failed is not None and bool(out.failed[r])
    flags = (float(out.reward[r]), bool(out.terminated[r]), bool(out.truncated[r]))
    completed = {} if failed else {ONE_AGENT: (space_arrays.take(space, out.next_obs, r), *flags)}
    return Row(
        acting={ONE_AGENT: space_arrays.take(space, out.obs, r)},
        completed=completed,
        slots={ONE_AGENT: flags},
        done=flags[1] or flags[2],
        env_reward=flags[0],
        infos=out.infos[r],
        reset_info=out.reset_infos.get(env),
        failed=failed,
    )


def _slot(tree: Any, b: int, a: int) -> Any:
    return jax.tree.map(lambda x: x[b, a], tree)


def _agent_row(vec: Any, out: MultiAgentStep, b: int) -> Row:
    done, env_reward = bool(out.env_done[b]), float(out.env_reward[b])
    row = Row({}, done, env_reward, out.infos[b], acting={}, starts={}, slots={})
    row.failed = out.failed is not None and bool(out.failed[b])
    row.unassigned_reward = float(out.unassigned_reward[b])
    for group in vec.groups:
        buf = out.groups[group.policy_id]
        for a, agent in enumerate(group.agents):
            flags = (float(buf.reward[b, a]), bool(buf.terminated[b, a]), bool(buf.truncated[b, a]))
            row.slots[agent] = flags
            if buf.acting[b, a]:
                row.acting[agent] = _slot(buf.obs, b, a)
                row.starts[agent] = bool(buf.agent_start[b, a])  # type: ignore[index]
            if buf.completed[b, a]:
                row.completed[agent] = (_slot(buf.next_obs, b, a), *flags)
    return row


def _close(actual: float, expected: float, atol: float) -> bool:
    return actual == expected or math.isclose(actual, expected, rel_tol=0.0, abs_tol=atol)


def assert_acting(row: Row, ref: ByHand, where: str) -> None:
    """``row`` says who acts next on what, as the env stepped by hand."""
    if sorted(row.acting) != sorted(ref.acting):
        raise AssertionError(
            f"{where}: acting agents {sorted(row.acting)}, by hand {sorted(ref.acting)}"
        )
    for agent, obs in ref.acting.items():
        assert_trees_equal(row.acting[agent], obs, f"{where}, agent {agent!r}: obs")
        if row.starts is not None and row.starts[agent] != (agent not in ref.started):
            raise AssertionError(f"{where}, agent {agent!r}: agent_start={row.starts[agent]}")


def assert_row(row: Row, expected: ExpectedRow, ref: ByHand, where: str) -> None:
    """``row`` equals the env stepped by hand (``expected``, and ``ref`` after it)."""
    if sorted(row.completed) != sorted(expected.completed):
        raise AssertionError(
            f"{where}: completed transitions of {sorted(row.completed)}, by hand "
            f"{sorted(expected.completed)}"
        )
    for agent, (next_obs, reward, term, trunc) in expected.completed.items():
        what = f"{where}, agent {agent!r}"
        got_next, got_reward, *got_flags = row.completed[agent]
        assert_trees_equal(got_next, next_obs, f"{what}: next_obs")
        if not _close(got_reward, reward, ref.reward_atol):
            raise AssertionError(f"{what}: reward {got_reward!r}, by hand {reward!r}")
        if tuple(got_flags) != (bool(term), bool(trunc)):
            raise AssertionError(
                f"{what}: (terminated, truncated)={tuple(got_flags)}, by hand {term, trunc}"
            )
    if row.done != expected.done:
        raise AssertionError(f"{where}: env done={row.done}, by hand {expected.done}")
    if not _close(row.env_reward, expected.env_reward, ref.reward_atol):
        raise AssertionError(
            f"{where}: env_reward {row.env_reward!r}, by hand {expected.env_reward!r}"
        )
    if not _close(row.unassigned_reward, expected.unassigned_reward, ref.reward_atol):
        raise AssertionError(
            f"{where}: unassigned_reward {row.unassigned_reward!r}, by hand "
            f"{expected.unassigned_reward!r} (rewards no transition carries, where the env's "
            "episode ends: MultiAgentStep.unassigned_reward)"
        )
    assert_trees_equal(row.infos, expected.infos, f"{where}: infos")
    assert_trees_equal(row.reset_info, expected.reset_info, f"{where}: reset info")
    assert_acting(row, ref, where)


def assert_failed_slot(row: Row, ref: ByHand, where: str) -> None:
    """A failed sub-env's row: no transition, zero rewards, no flags, no infos; who acts
    next on what is the new sub-env's first observation (``ref``, just reset)."""
    if not row.failed or row.completed or row.done or row.infos != {}:
        raise AssertionError(
            f"{where}: a failed row: failed={row.failed}, transitions of "
            f"{sorted(row.completed)}, done={row.done}, infos {row.infos!r}"
        )
    for agent, flags in row.slots.items():
        if flags != (0.0, False, False):
            raise AssertionError(
                f"{where}, agent {agent!r}: (reward, flags) {flags} in a failed row"
            )
    if row.env_reward != 0.0:
        raise AssertionError(f"{where}: env_reward {row.env_reward!r} in a failed row")
    assert_acting(row, ref, where)


class ActionSampler:
    """Random valid actions for every acting agent of a vector env's rows (within
    ``obs['action_mask']`` where the observation has one), as the backend takes them: a
    ``[B, ...]`` batch for a gymnasium backend, one ``[B, A_g]`` batch per group else."""

    def __init__(self, vec: Any, seed: int) -> None:
        self.groups = vec.groups if vec.multi_agent else None  # per-group batches
        self.rng = np.random.default_rng(seed)
        if self.groups is None:
            self.space = batch_space(vec.single_action_space, vec.num_envs)
            self.space.seed(seed)

    def sample(self, rows: Sequence[Row]) -> Any:
        if self.groups is None:
            return self.space.sample()
        batches = []
        for group in self.groups:
            batch = np.zeros((len(rows), len(group.agents)), np.int64)
            for b, row in enumerate(rows):
                for a, agent in enumerate(group.agents):
                    if agent not in row.acting:
                        continue
                    obs = row.acting[agent]
                    if isinstance(obs, dict) and "action_mask" in obs:
                        batch[b, a] = self.rng.choice(np.flatnonzero(obs["action_mask"]))
                    else:
                        batch[b, a] = self.rng.integers(_num_actions(group.action_space))
            batches.append(batch)
        return batches

    def of_row(self, actions: Any, b: int) -> Callable[[str], Any]:
        """``agent -> action`` of sub-env ``b`` in ``actions``."""
        if self.groups is None:
            return lambda agent: actions[b]
        where = {
            agent: (g, a)
            for g, group in enumerate(self.groups)
            for a, agent in enumerate(group.agents)
        }
        return lambda agent: actions[where[agent][0]][b, where[agent][1]]


def _num_actions(space: Any) -> int:
    if not isinstance(space, spaces.Discrete):
        raise TypeError(f"random agent actions: expected Discrete action spaces, got {space}.")
    return int(space.n)

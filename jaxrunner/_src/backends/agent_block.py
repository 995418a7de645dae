"""The step loop of PettingZoo sub-envs (parallel or AEC): each sub-env's driver writes
its acting agents into the block's rows of the group buffers."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.multi_agent.drivers import AECDriver, Driver, make_driver
from jaxrunner._src.backends.multi_agent.layout import Layout
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.steps import (
    AgentStepBuffers,
    GroupBuffers,
    MultiAgentStep,
)
from jaxrunner._src.backends.sub_env_block import (
    DONE,
    RUNNING,
    EnvFactory,
    Marks,
    StepResult,
    SubEnvBlock,
    SubEnvRaised,
    failed_mask,
    with_env_index,
)
from jaxrunner._src.core.agent_groups import AgentGroup, PolicyMappingFn, build_groups
from jaxrunner._src.space_arrays.checks import all_finite_test, nonfinite_observations
from jaxrunner.errors import InvalidStepError, JaxRunnerError, SpaceMismatchError


def env_groups(env: Any, policy_mapping_fn: PolicyMappingFn | None) -> tuple[AgentGroup, ...]:
    """The groups of a PettingZoo env's ``possible_agents``."""
    return build_groups(
        env.possible_agents, env.observation_space, env.action_space, policy_mapping_fn
    )


class TreeRows:
    """A Dict or Tuple group's action batch, indexed as an array is: ``rows[b, a]`` is
    one agent's action, a dict or tuple of its leaves' copies."""

    __slots__ = ("space", "tree")

    def __init__(self, space: Any, tree: Any) -> None:
        self.space, self.tree = space, tree

    def __getitem__(self, index: Any) -> Any:
        return space_arrays.take(self.space, self.tree, index)


class AgentBlock(SubEnvBlock):
    """PettingZoo sub-envs ``[offset, offset + len(envs))`` (all parallel or all AEC, with
    equal agent ``groups``) stepped into ``[n, A_g, ...]`` group ``buffers`` (None: its
    own). A failed step (:class:`~jaxrunner._src.backends.sub_env_block.SubEnvBlock`'s
    rules) yields no transition for any of its agents and ends its episode as a fault."""

    def __init__(
        self,
        envs: Sequence[Any],
        groups: Sequence[AgentGroup],
        offset: int = 0,
        *,
        fns: Sequence[EnvFactory],
        restart_policy: RestartPolicy | None = None,
        buffers: AgentStepBuffers | None = None,
        status: Marks | None = None,
    ) -> None:
        super().__init__(envs, fns, offset, restart_policy, status)
        self.groups = tuple(groups)
        n = len(self.envs)
        self.possible_agents = tuple(self.envs[0].possible_agents)
        for i, env in enumerate(self.envs):
            self._check_agents(env, offset + i)
        if buffers is None:
            buffers = AgentStepBuffers.allocate(self.groups, n)
        self.step_buffers = buffers
        self.buffers = buffers.groups
        self.layout = Layout(self.groups, self.buffers, offset)
        self.finite = FiniteObservations(self.buffers, self.layout)
        self.drivers: list[Driver] = [
            make_driver(env, i, self.layout) for i, env in enumerate(self.envs)
        ]
        self.turn_based = isinstance(self.drivers[0], AECDriver)
        """AEC sub-envs: one agent acts per step."""
        self.env_done = buffers.env_done
        self.env_reward = buffers.env_reward
        self.unassigned_reward = buffers.unassigned_reward
        self._groups_by_id = {g.policy_id: buf for g, buf in zip(self.groups, self.buffers)}
        self._action_rows: list[Any] | None = None  # a block's actions, placed at its rows
        # The drivers pick an agent's action as batch[b, a]: a Dict or Tuple group's batch
        # (a dict or tuple of arrays) is read through a view that picks it leaf by leaf.
        self._tree_spaces = [
            None if type(g.action_space) in space_arrays.LEAF_TYPES else g.action_space
            for g in self.groups
        ]
        if not any(self._tree_spaces):
            self._tree_spaces = None

    def _check_agents(self, env: Any, index: int) -> None:
        """``env`` (sub-env ``index``, new or recreated) has the block's agents and spaces."""
        if tuple(env.possible_agents) != self.possible_agents:
            raise SpaceMismatchError(
                f"multi-agent sub-env {index} has possible_agents {list(env.possible_agents)}, "
                f"sub-env {self.offset} has {list(self.possible_agents)}; every sub-env must "
                "have the same agents. Check the factory."
            )
        for g in self.groups:
            for agent in g.agents:
                for name, expected in (
                    ("observation_space", g.observation_space),
                    ("action_space", g.action_space),
                ):
                    got = getattr(env, name)(agent)
                    if got != expected:
                        raise SpaceMismatchError(
                            f"multi-agent sub-env {index} has {name}({agent!r})={got}, but "
                            f"the vector env's agent groups (from sub-env 0) have {expected}; "
                            "every sub-env must have the same agents and spaces. Check the "
                            "factory."
                        )

    def reset(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        # (reset_one clears each row's completed transitions)
        self.env_done[:], self.env_reward[:], self.unassigned_reward[:] = False, 0.0, 0.0
        return super().reset(seeds, options)

    def reset_one(self, i: int, seed: int | None, options: dict[str, Any] | None) -> dict:
        b = i - self.offset
        for buf in self.buffers:
            buf.completed[b] = False
        driver = self.drivers[b]
        self.step_buffers.clear_row("obs", b)  # the check below reads the whole row
        try:
            info = driver.reset(seed, options)
            self._seeded(i, seed)
            self._check_finite_reset(b)
        except Exception as err:
            raise located(err, driver, "reset") from _cause(err)
        return info

    def step(self, lo: int, hi: int, actions: Sequence[Any]) -> StepResult:
        """Steps sub-envs ``[lo, hi)`` (global indices); ``actions[g]`` is group ``g``'s
        ``[hi - lo, A_g, ...]`` batch (only the acting agents' entries are read)."""
        offset = self.offset
        infos, errors = self.step_rows(lo - offset, hi - offset, actions)
        failed = [offset + b for b in self.failed_rows(errors)]
        return StepResult(infos, {}, failed, {offset + b: e for b, e in errors.items()})

    def step_rows(
        self, lo: int, hi: int, actions: Sequence[Any]
    ) -> tuple[list[dict[str, Any]], dict[int, BaseException]]:
        """Steps the sub-envs in rows ``[lo, hi)`` of the block (``actions[g]`` holds
        those rows only); returns their infos and the errors by row."""
        if (lo, hi) != (0, len(self.drivers)):  # the drivers read actions at their own row
            actions = self._placed(lo, hi, actions)
        if self._tree_spaces is not None:
            actions = [
                a if space is None else TreeRows(space, a)
                for space, a in zip(self._tree_spaces, actions)
            ]
        infos: list[dict[str, Any]] = []
        same_step = not self.turn_based
        part = slice(lo, hi)
        for buf in self.buffers:  # every row at once; the drivers set what they write
            buf.clear_step(same_step, part)
        _, env_done, env_reward, unassigned_reward = self.step_buffers
        env_done[part] = False
        unassigned_reward[part] = 0.0
        errors: dict[int, BaseException] = {}
        status, offset = self.status, self.offset
        self.layout.obs_apart = False
        for b in range(lo, hi):
            driver = self.drivers[b]
            status[offset + b] = RUNNING
            try:
                done, reward, unassigned, info = driver.step(actions)
            except Exception as err:
                error = located(err, driver, "step")
                if self.restart_policy is None:
                    raise error from _cause(err)
                errors[b] = error
                self.step_buffers.fail_row(b)
                self.restart(offset + b, _cause(err) or error, failed_step=False)
                infos.append({})
                continue
            status[offset + b] = DONE
            env_reward[b] = reward
            infos.append(info)
            if done:  # rare: written only then
                env_done[b], unassigned_reward[b] = True, unassigned
                try:
                    driver.reset(None, None)  # SAME_STEP
                except Exception as err:
                    error = located(err, driver, "reset")
                    if self.restart_policy is None:
                        raise error from _cause(err)
                    errors[b] = error  # the step's transitions stay valid
                    self.restart(offset + b, _cause(err) or error, failed_step=False)
        bad = self.finite.step(lo, hi, env_done, self.layout.obs_apart)
        if bad:
            self._fail_nonfinite(bad, lo, infos, errors)
        return infos, errors

    def _fail_nonfinite(
        self,
        bad: Mapping[int, tuple[JaxRunnerError, bool]],
        lo: int,
        infos: list[dict[str, Any]],
        errors: dict[int, BaseException],
    ) -> None:
        """Rows ``bad`` of :meth:`FiniteObservations.step`: a NaN or an infinity from a
        step is an invalid step, from the reset after an episode's end a failed reset."""
        for b, (err, in_step) in bad.items():
            if b in errors and not self.env_done[b]:
                continue  # its step failed already
            error = located(err, self.drivers[b], "step")
            if self.restart_policy is None:
                raise error
            restarted = b in errors  # its reset had failed: the sub-env is new already
            errors[b] = error
            if in_step:
                infos[b - lo], self.status[self.offset + b] = {}, RUNNING
                self.step_buffers.fail_row(b)
            if not restarted:
                self.restart(self.offset + b, error, failed_step=False)

    def _check_finite_reset(self, b: int) -> None:
        error = self.finite.row(b, "reset")
        if error is not None:
            raise error

    def _placed(self, lo: int, hi: int, actions: Sequence[Any]) -> list[Any]:
        """``actions`` (rows ``[lo, hi)``) copied to those rows of block-sized arrays."""
        n = len(self.drivers)
        if self._action_rows is None:
            self._action_rows = [
                space_arrays.tree_map(
                    lambda x: np.zeros((n, *np.shape(x)[1:]), np.asarray(x).dtype), a
                )
                for a in actions
            ]
        for dst, src in zip(self._action_rows, actions):
            space_arrays.tree_map(lambda d, s: d.__setitem__(slice(lo, hi), s), dst, src)
        return self._action_rows

    def failed_rows(self, errors: dict[int, BaseException]) -> list[int]:
        """The rows of ``errors`` whose step failed (not a reset after a good step)."""
        return [b for b in errors if not self.env_done[b]]

    def _fresh(self, j: int, env: Any, seed: int | None) -> dict[str, Any]:
        self.step_buffers.clear_row("obs", j)  # no observation of the old sub-env stays
        self._check_agents(env, self.offset + j)
        driver = make_driver(env, j, self.layout)
        info = driver.reset(seed, None)
        self._check_finite_reset(j)
        self.drivers[j], self.envs[j] = driver, env
        return info

    def _fail_slot(self, i: int) -> None:
        self.step_buffers.fail_row(i - self.offset)

    def result(
        self, infos: list[dict[str, Any]], errors: dict[int, BaseException] | None = None
    ) -> MultiAgentStep:
        failed = failed_mask(self.failed_rows(errors), 0, len(self.drivers)) if errors else None
        return MultiAgentStep(
            groups=self._groups_by_id,
            env_done=self.env_done,
            env_reward=self.env_reward,
            unassigned_reward=self.unassigned_reward,
            infos=infos,
            failed=failed,
            errors={self.offset + b: err for b, err in errors.items()} if errors else None,
        )


def located(err: Exception, driver: Driver, call: str) -> Exception:
    """``err`` from ``driver``'s sub-env as the error to raise: jaxrunner's own checks with
    ``env_index`` set, anything the env's code raised as a ``SubEnvRaised``."""
    if isinstance(err, JaxRunnerError):
        return with_env_index(err, driver.env_index)
    agent = driver.env.agent_selection if isinstance(driver, AECDriver) else None
    return SubEnvRaised(err, driver.env_index, call, agent if isinstance(agent, str) else None)


def _cause(err: Exception) -> BaseException | None:
    """What :func:`located`'s error chains: the env's exception (ours keep their own)."""
    return err.__cause__ if isinstance(err, JaxRunnerError) else err


FiniteTest = Callable[[int, int], bool]


class FiniteObservations:
    """Finds the sub-envs of a block whose ``obs`` or ``next_obs`` rows hold a NaN or an
    infinity: one sum per float leaf, group and buffer, the exact check only when a sum
    is not finite (the buffers must hold finite values except where this step wrote)."""

    def __init__(self, buffers: Sequence[GroupBuffers], layout: Layout) -> None:
        self._groups: list[tuple[Any, int, GroupBuffers, Any, FiniteTest, FiniteTest]] = []
        for group, buf, where in zip(layout.groups, buffers, layout.row_names):
            space = group.observation_space
            next_finite = all_finite_test(space, buf.next_obs_rows)
            obs_finite = all_finite_test(space, buf.obs_rows)
            if next_finite is not None and obs_finite is not None:  # else no float leaf
                self._groups.append((space, group.num_agents, buf, where, next_finite, obs_finite))

    def step(
        self, lo: int, hi: int, env_done: np.ndarray, obs_apart: bool = True
    ) -> dict[int, tuple[InvalidStepError, bool]]:
        """Rows ``[lo, hi)`` after a step: sub-env row ``b`` -> ``(error, in_step)``;
        ``in_step`` is False where only the observations of the reset after the episode's
        end (``env_done[b]``) are bad: the step's transitions are good. ``obs_apart``
        False (``Layout.obs_apart``): every ``obs`` written is a ``next_obs`` too, so
        only ``next_obs`` is tested."""
        bad: dict[int, tuple[InvalidStepError, bool]] = {}
        for space, a, buf, where, next_finite, obs_finite in self._groups:
            rows = lo * a, hi * a
            if not next_finite(*rows):
                found = nonfinite_observations(space, buf.next_obs_rows, *rows, "step", (), where)
                for row, err in found.items():
                    bad.setdefault(row // a, (err, True))
            if obs_apart and not obs_finite(*rows):
                found = nonfinite_observations(space, buf.obs_rows, *rows, "step", (), where)
                for row, err in found.items():
                    b = row // a
                    if b in bad:
                        continue
                    # Where the episode ended, every observation is the reset's.
                    reset_error = self.row(b, "reset") if env_done[b] else None
                    bad[b] = (reset_error, False) if reset_error else (err, True)
        return bad

    def row(self, b: int, call: str) -> InvalidStepError | None:
        """The first NaN or infinity in row ``b``'s ``obs`` (after ``call``), as an error."""
        for space, a, buf, where, _, _ in self._groups:
            found = nonfinite_observations(space, buf.obs_rows, b * a, (b + 1) * a, call, (), where)
            if found:
                return found[min(found)]
        return None

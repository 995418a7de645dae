"""Comparing a multi-agent step with the envs stepped by hand, for the multi-agent contract:
random valid actions for every acting slot, and the checks that a row equals its env
stepped by hand (:func:`assert_row`, :func:`assert_acting`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from gymnasium import spaces

from jaxrunner._src.backends.multi_agent.buffers import MultiAgentStep
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.testing.assertions import assert_trees_equal
from jaxrunner._src.testing.multi_agent_reference import ExpectedRow

# Rewards are sums of the env's rewards; the backends and PettingZoo's own bookkeeping
# may add them in another order, so they agree to rounding, not bit for bit.
_REWARD_ATOL = 1e-12


def _slot(tree: Any, b: int, a: int) -> Any:
    return jax.tree.map(lambda x: x[b, a], tree)


def _close(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=0.0, abs_tol=_REWARD_ATOL)


def assert_acting(
    out: MultiAgentStep, groups: Sequence[AgentGroup], b: int, ref: Any, where: str
) -> None:
    """Row ``b`` says who acts next on what, as the env stepped by hand."""
    for group in groups:
        buf = out.groups[group.policy_id]
        for a, agent in enumerate(group.agents):
            what = f"{where}: sub-env {b}, agent {agent!r}"
            if bool(buf.acting[b, a]) != (agent in ref.acting):
                raise AssertionError(f"{what}: acting={bool(buf.acting[b, a])}")
            if agent in ref.acting:
                assert_trees_equal(_slot(buf.obs, b, a), ref.acting[agent], f"{what}: obs")
                if bool(buf.agent_start[b, a]) != (agent not in ref.started):
                    raise AssertionError(f"{what}: agent_start={bool(buf.agent_start[b, a])}")


def assert_row(
    out: MultiAgentStep,
    groups: Sequence[AgentGroup],
    b: int,
    expected: ExpectedRow,
    ref: Any,
    where: str,
) -> None:
    """Row ``b`` of a step equals the env stepped by hand."""
    for group in groups:
        buf = out.groups[group.policy_id]
        for a, agent in enumerate(group.agents):
            what = f"{where}: sub-env {b}, agent {agent!r}"
            want = expected.completed.get(agent)
            if bool(buf.completed[b, a]) != (want is not None):
                raise AssertionError(f"{what}: completed={bool(buf.completed[b, a])}")
            if want is None:
                continue
            next_obs, reward, term, trunc = want
            assert_trees_equal(_slot(buf.next_obs, b, a), next_obs, f"{what}: next_obs")
            if not _close(float(buf.reward[b, a]), reward):
                raise AssertionError(f"{what}: reward {buf.reward[b, a]!r}, by hand {reward!r}")
            got = (bool(buf.terminated[b, a]), bool(buf.truncated[b, a]))
            if got != (bool(term), bool(trunc)):
                raise AssertionError(
                    f"{what}: (terminated, truncated)={got}, by hand {term, trunc}"
                )
    if bool(out.env_done[b]) != expected.done:
        raise AssertionError(f"{where}: sub-env {b}: env_done={bool(out.env_done[b])}")
    if not _close(float(out.env_reward[b]), expected.env_reward):
        raise AssertionError(
            f"{where}: sub-env {b}: env_reward {out.env_reward[b]!r}, by hand "
            f"{expected.env_reward!r}"
        )
    assert_trees_equal(out.infos[b], expected.infos, f"{where}: sub-env {b}: infos")
    assert_acting(out, groups, b, ref, where)


def sample_actions(
    rng: np.random.Generator, groups: Sequence[AgentGroup], out: MultiAgentStep
) -> list[np.ndarray]:
    """Valid actions for every acting slot (within ``obs['action_mask']`` where the
    observation has one), zeros elsewhere: one ``[B, A_g]`` batch per group."""
    actions = []
    for group in groups:
        buf = out.groups[group.policy_id]
        batch = np.zeros(buf.acting.shape, np.int64)
        for b, a in zip(*np.nonzero(buf.acting)):
            if isinstance(buf.obs, dict) and "action_mask" in buf.obs:
                batch[b, a] = rng.choice(np.flatnonzero(buf.obs["action_mask"][b, a]))
            else:
                batch[b, a] = rng.integers(_num_actions(group.action_space))
        actions.append(batch)
    return actions


def _num_actions(space: Any) -> int:
    if not isinstance(space, spaces.Discrete):
        raise TypeError(f"random agent actions: expected Discrete action spaces, got {space}.")
    return int(space.n)


def actions_of_row(actions: Sequence[np.ndarray], groups: Sequence[AgentGroup], b: int) -> Callable:
    """``agent -> action`` of sub-env ``b`` in the batches ``actions``."""
    where = {
        agent: (g, a) for g, group in enumerate(groups) for a, agent in enumerate(group.agents)
    }

    def act(agent: str) -> Any:
        g, a = where[agent]
        return actions[g][b, a]

    return act

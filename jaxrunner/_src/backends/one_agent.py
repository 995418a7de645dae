"""A single-agent vector env seen as every env is sampled: one policy group of one agent,
who acts at every step (the env's own arrays, with an agent axis of 1)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.batch_step import BatchStep, EnvIds
from jaxrunner._src.backends.multi_agent.buffers import GroupBuffers, MultiAgentStep
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.core.runner_state import DEFAULT_POLICY_ID

ONE_AGENT = "agent_0"
"""The agent id of a single-agent env's one agent."""


class OneAgentSteps:
    """A single-agent vector env's ``reset_batch``, ``send`` and ``recv`` in the group
    model: ``send`` takes the group's ``[n, ...]`` actions (one agent's, without an
    agent axis), ``recv`` returns a :class:`MultiAgentStep` of views of the env's arrays
    (made once per block of envs and buffers), its ``failed`` the env's."""

    turn_based = False
    one_agent = True
    """Every step's one group is the env's only agent, who always acts: its arrays are
    the env-level ones, and no agent is ever masked."""

    def __init__(self, envs: Any) -> None:
        self.envs, self.num_envs = envs, envs.num_envs
        self.capabilities = envs.capabilities
        self._obs_space = envs.single_observation_space
        self._action_space = envs.single_action_space
        self.groups = (
            AgentGroup(DEFAULT_POLICY_ID, (ONE_AGENT,), self._obs_space, self._action_space),
        )
        self.possible_agents = (ONE_AGENT,)
        n = self.num_envs
        self._acting = np.ones((n, 1), np.bool_)
        self._start = np.ones((n, 1), np.bool_)  # the next action starts an episode
        self._completed = np.ones((n, 1), np.bool_)
        self._no_reward = np.zeros(n)
        self._blocks: dict[tuple[int, int], _Block] = {}
        self._obs_is_leaf = type(self._obs_space) in space_arrays.LEAF_TYPES

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> MultiAgentStep:
        obs, _ = self.envs.reset_batch(seeds, options)
        return self.first_step(obs)

    def first_step(self, obs: Any) -> MultiAgentStep:
        """The step of a reset of every env to ``obs``: every agent starts an episode."""
        self._start[:] = True
        self._blocks.clear()
        n = self.num_envs
        no_flags = np.zeros((n, 1), np.bool_)
        group = GroupBuffers.of(
            obs=self._agent_axis(obs), acting=self._acting, agent_start=self._start,
            completed=no_flags, reward=np.zeros((n, 1)), terminated=no_flags,
            truncated=no_flags, next_obs=self._agent_axis(obs),
        )  # fmt: skip
        return MultiAgentStep(
            {DEFAULT_POLICY_ID: group}, no_flags[:, 0], self._no_reward, self._no_reward,
            [{}] * n,
        )  # fmt: skip

    def send(self, actions: Sequence[Any], env_ids: EnvIds = None) -> None:
        (action,) = actions  # the one agent's: [n, ...], as the env takes them
        self.envs.send(action, env_ids)

    def recv(self) -> MultiAgentStep:
        return self.group_step(self.envs.recv())

    def group_step(self, out: BatchStep) -> MultiAgentStep:
        """``out`` (a block of envs, or all) as the step of one group of one agent."""
        rows = out.env_ids
        lo, hi = (0, self.num_envs) if rows is None else (rows.start, rows.stop)  # type: ignore[union-attr]
        block = self._blocks.get((lo, hi))
        if block is None:  # the block's own rows of what every step writes
            block = self._blocks[lo, hi] = _Block(self, lo, hi)
        done = np.logical_or(out.terminated, out.truncated, out=block.start)
        if out.reset_rows is not None:  # the env's reset steps: the episode starts next
            done |= out.reset_rows
        seen = block.arrays
        if out.failed is not None:  # restarted sub-envs: no transition, a new episode
            done |= out.failed
            groups = self._group(out, lo, hi, ~out.failed[:, None])
        elif (
            out.reward is seen[0] and out.terminated is seen[1] and out.truncated is seen[2]
            and out.obs is seen[3] and out.next_obs is seen[4]
        ):  # the very arrays of the last step: its views hold  # fmt: skip
            groups = block.groups
        else:
            sources = self._sources(out)
            if block.sources is None or not all(map(operator.is_, block.sources, sources)):
                # Other buffers than the last step's (most backends keep theirs).
                block.sources, block.groups = sources, self._group(out, lo, hi, block.completed)
            block.arrays = (out.reward, out.terminated, out.truncated, out.obs, out.next_obs)
            groups = block.groups
        return MultiAgentStep(
            groups, done, out.reward, block.no_reward, out.infos, out.failed, out.errors,
            rows, out.reset_rows,  # type: ignore[arg-type]
        )  # fmt: skip

    def _group(self, out: BatchStep, lo: int, hi: int, completed: np.ndarray) -> dict:
        group = GroupBuffers.of(
            obs=self._agent_axis(out.obs), acting=self._acting[lo:hi],
            agent_start=self._start[lo:hi], completed=completed,
            reward=out.reward[:, None], terminated=out.terminated[:, None],
            truncated=out.truncated[:, None], next_obs=self._agent_axis(out.next_obs),
        )  # fmt: skip
        return {DEFAULT_POLICY_ID: group}

    def _sources(self, out: BatchStep) -> tuple[Any, ...]:
        """The arrays ``out``'s arrays view (themselves where they own their memory)."""
        arrays: tuple[Any, ...] = (out.reward, out.terminated, out.truncated)
        if self._obs_is_leaf:
            arrays += (out.obs, out.next_obs)
        else:
            arrays += (*space_arrays.leaves(out.obs), *space_arrays.leaves(out.next_obs))
        return tuple(x if x.base is None else x.base for x in arrays)

    def _agent_axis(self, tree: Any) -> Any:
        return space_arrays.map_structure(self._obs_space, lambda x: x[:, None], tree)


class _Block:
    """A block of envs' rows of the view's own arrays, and its step views (made when
    the env's buffers change)."""

    def __init__(self, steps: OneAgentSteps, lo: int, hi: int) -> None:
        self.start = steps._start[lo:hi, 0]
        self.completed = steps._completed[lo:hi]
        self.no_reward = steps._no_reward[lo:hi]
        self.sources: tuple[Any, ...] | None = None
        self.arrays: tuple[Any, ...] = (None,) * 5
        """The last step's own arrays (reward, flags, obs, next_obs), as handed in."""
        self.groups: dict[str, GroupBuffers] = {}

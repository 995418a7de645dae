"""A single-agent vector env seen as every env is sampled: one policy group of one agent,
who acts at every step (the env's own arrays, with an agent axis of 1)."""

from __future__ import annotations

import collections
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.steps import BatchStep, EnvIds, GroupBuffers, MultiAgentStep
from jaxrunner._src.core.agent_groups import DEFAULT_POLICY_ID

_new_step = tuple.__new__
"""A step's tuple built without its class's ``__new__`` frame (the per-step path)."""


class OneAgentSteps:
    """A single-agent vector env's ``reset_batch``, ``send`` and ``recv`` in the group
    model: ``send`` takes the one agent's ``[n, ...]`` actions, ``recv`` returns a
    :class:`MultiAgentStep` of views of the env's arrays (made once per block)."""

    turn_based = False
    one_agent = True
    """Every step's one group is the env's only agent, who always acts: its arrays are
    the env-level ones, and no agent is ever masked."""

    def __init__(self, envs: Any) -> None:
        self.envs, self.num_envs = envs, envs.num_envs
        self.capabilities = envs.capabilities
        self._obs_space = envs.single_observation_space
        self.groups, self.possible_agents = envs.groups, envs.possible_agents
        n = self.num_envs
        self._acting = np.ones((n, 1), np.bool_)
        self._start = np.ones((n, 1), np.bool_)  # the next action starts an episode
        self._completed = np.ones((n, 1), np.bool_)
        self._no_reward = np.zeros(n)
        self._blocks: dict[tuple[int, int], _Block] = {}
        self._every: _Block | None = None  # the block of every env, also in _blocks
        self._obs_is_leaf = type(self._obs_space) in space_arrays.LEAF_TYPES
        # A backend that steps in recv() anyway, in the order sent, is stepped by
        # step_batch there (one call, not a send queued then taken back).
        caps = envs.capabilities
        self._inline = not (caps.steps_in_background or caps.ready_first)
        # (actions, env_ids, whether they passed the backend's checks: send_checked)
        self._sent: collections.deque[tuple[Any, EnvIds, bool]] = collections.deque()

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> MultiAgentStep:
        obs, _ = self.envs.reset_batch(seeds, options)
        return self.first_step(obs)

    def first_step(self, obs: Any) -> MultiAgentStep:
        """The step of a reset of every env to ``obs``: every agent starts an episode."""
        self._start[:] = True
        self._blocks.clear()
        self._every = None
        self._sent.clear()  # a reset answers no earlier send
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
        if self._inline:
            self._sent.append((action, env_ids, False))
        else:
            self.envs.send(action, env_ids)

    def send_checked(self, actions: Sequence[Any], env_ids: EnvIds = None) -> None:
        if self._inline:
            self._sent.append((actions[0], env_ids, True))
        else:
            self.envs.send_checked(actions[0], env_ids)

    def recv(self) -> MultiAgentStep:
        if not self._inline:
            return self.group_step(self.envs.recv())
        action, env_ids, checked = self._sent.popleft()
        if not checked:
            return self.group_step(self.envs.step_batch(action, env_ids))
        self.envs.send_checked(action, env_ids)
        return self.group_step(self.envs.recv())

    def group_step(self, out: BatchStep) -> MultiAgentStep:
        """``out`` (a block of envs, or all) as the step of one group of one agent."""
        rows = out.env_ids
        if rows is None:  # every env: the block kept apart (no key to build per step)
            block = self._every or self._block(0, self.num_envs)
        elif isinstance(rows, slice):
            block = self._blocks.get((rows.start, rows.stop)) or self._block(rows.start, rows.stop)
        else:
            return self._any_order(out)
        if (
            out.obs is block.obs and out.next_obs is block.next_obs and out.reward is block.reward
            and out.terminated is block.terminated and out.truncated is block.truncated
            and out.failed is None
        ):  # the very arrays of the last step, none failed: its views hold  # fmt: skip
            # (bool flags, checked when kept: bitwise_or is logical_or at half the cost)
            done = np.bitwise_or(out.terminated, out.truncated, block.start)
            if out.reset_rows is not None:  # the env's reset steps: the episode starts next
                done |= out.reset_rows
            return _new_step(
                MultiAgentStep,
                (block.groups, done, out.reward, block.no_reward, out.infos, None, out.errors,
                 rows, out.reset_rows),
            )  # fmt: skip
        lo, hi = block.lo, block.hi
        done = np.logical_or(out.terminated, out.truncated, out=block.start)
        if out.reset_rows is not None:  # the env's reset steps: the episode starts next
            done |= out.reset_rows
        if out.failed is not None:  # restarted sub-envs: no transition, a new episode
            done |= out.failed
            groups = self._group(out, lo, hi, self._start[lo:hi], ~out.failed[:, None])
        else:
            sources = self._sources(out)
            if block.sources is None or not all(map(operator.is_, block.sources, sources)):
                # Other buffers than the last step's (most backends keep theirs; EnvPool's
                # calls hand out new arrays at each step).
                block.sources = sources
                block.groups = self._group(out, lo, hi, self._start[lo:hi], block.completed)
            block.obs, block.next_obs, block.reward = out.obs, out.next_obs, out.reward
            if out.terminated.dtype == np.bool_ and out.truncated.dtype == np.bool_:
                block.terminated, block.truncated = out.terminated, out.truncated
            groups = block.groups
        return MultiAgentStep(
            groups, done, out.reward, block.no_reward, out.infos, out.failed, out.errors,
            rows, out.reset_rows,  # type: ignore[arg-type]
        )  # fmt: skip

    def _any_order(self, out: BatchStep) -> MultiAgentStep:
        """``out`` of envs ``out.env_ids`` (an index array: EnvPool's async ``recv``):
        views of its arrays, made per answer (its envs differ from one to the next)."""
        n = len(out.reward)
        done = out.terminated | out.truncated
        completed = self._completed[:n]
        if out.reset_rows is not None:
            done |= out.reset_rows
        if out.failed is not None:
            done |= out.failed
            completed = ~out.failed[:, None]
        return MultiAgentStep(
            self._group(out, 0, n, done[:, None], completed), done, out.reward,
            self._no_reward[:n], out.infos, out.failed, out.errors,
            out.env_ids, out.reset_rows,  # type: ignore[arg-type]
        )  # fmt: skip

    def _block(self, lo: int, hi: int) -> _Block:
        block = self._blocks[lo, hi] = _Block(self, lo, hi)
        if hi - lo == self.num_envs:
            self._every = block
        return block

    def _group(
        self, out: BatchStep, lo: int, hi: int, start: np.ndarray, completed: np.ndarray
    ) -> dict[str, GroupBuffers]:
        """``out``'s arrays (envs ``[lo, hi)``) as the one agent's group: views with an
        agent axis, and as its rows the env's own arrays (no reshape per step)."""
        group = GroupBuffers(
            obs=self._agent_axis(out.obs), acting=self._acting[lo:hi], agent_start=start,
            completed=completed, reward=out.reward[:, None], terminated=out.terminated[:, None],
            truncated=out.truncated[:, None], next_obs=self._agent_axis(out.next_obs),
            obs_rows=out.obs, next_obs_rows=out.next_obs,
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
        if self._obs_is_leaf:
            return tree[:, None]
        return space_arrays.map_structure(self._obs_space, lambda x: x[:, None], tree)


class _Block:
    """A block of envs' rows of the view's own arrays, and its step views (made when
    the env's buffers change)."""

    def __init__(self, steps: OneAgentSteps, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.start = steps._start[lo:hi, 0]
        self.completed = steps._completed[lo:hi]
        self.no_reward = steps._no_reward[lo:hi]
        self.sources: tuple[Any, ...] | None = None
        # The last step's own arrays, as handed in (a backend hands out the same ones).
        self.obs: Any = None
        self.next_obs: Any = None
        self.reward: Any = None
        self.terminated: Any = None
        self.truncated: Any = None
        self.groups: dict[str, GroupBuffers] = {}

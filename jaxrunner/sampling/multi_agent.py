"""The multi-agent sampler: groups of agents, one compiled policy step per group.

Per step: for each group, its acting agents' observations (``[B * A_g, ...]`` rows)
go to the group's :class:`~jaxrunner.policy_step.CompiledPolicyStep` (one
host->device and one device->host transfer per group); rows of agents that do not act
are computed and dropped, so their keys and carries do not move. Each action is kept
with its observation and extras until the env completes its transition (the same step
in a parallel env, the agent's next turn in an AEC env), then written to slot
``[t, b, a]`` of the step that completed it.

Connectors (``MultiAgentSetup.connectors``, per policy id) run inside a group's step
with its agent slots as rows (:mod:`jaxrunner.multi_agent.connectors`); their
per-sample part runs once per ``sample()`` on the group's trajectory.

Keys: agent ``a`` of env ``b`` draws from ``fold_in(fold_in(seed_key, b * N + k),
its action count)``, ``k`` its index among the env's ``N`` possible agents: its
actions depend on the seed, the env, the agent and its own history only.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxrunner import spaces as jr_spaces
from jaxrunner.connectors.pipeline import Connectors, ConnectorsState, SampleEnd
from jaxrunner.metrics import PERF_KEYS
from jaxrunner.multi_agent.buffers import GroupBuffers, MultiAgentStep
from jaxrunner.multi_agent.groups import AgentGroup
from jaxrunner.multi_agent.metrics import MultiAgentMetrics
from jaxrunner.multi_agent.trajectory import GroupTrajectory, MultiAgentTrajectory
from jaxrunner.multi_agent.vector_env import MultiAgentVectorEnv
from jaxrunner.policy import Params, Policy
from jaxrunner.policy_step import CompiledPolicyStep, host_actor_state
from jaxrunner.sampling.episodes import EpisodeBook
from jaxrunner.sampling.sampler import attach_partial


@dataclasses.dataclass(frozen=True)
class MultiAgentSetup:
    """What the multi-agent sampler is built from, besides its envs."""

    policies: dict[str, Policy]
    """Policy id -> Policy."""
    params: dict[str, Params]
    """Policy id -> device params (their shapes fix the compile)."""
    rollout_length: int
    seed: int
    metrics: MultiAgentMetrics
    connectors: Mapping[str, Connectors] = dataclasses.field(default_factory=dict)
    """Policy id -> the connectors of its group (groups without connectors absent)."""


class _GroupSampler:
    """One group's compiled step, stage and pending turns."""

    def __init__(
        self,
        group: AgentGroup,
        first: GroupBuffers,
        policy: Policy,
        params: Params,
        seed: int,
        num_envs: int,
        agent_offset: int,
        num_possible: int,
        connectors: Connectors | None = None,
    ) -> None:
        self.group, self.num_envs = group, num_envs
        a_g = group.num_agents
        self.rows = num_envs * a_g
        ids = (np.arange(num_envs)[:, None] * num_possible + agent_offset + np.arange(a_g)).ravel()
        # Connector state per agent slot (the rows), packed as in the single-agent samplers.
        self.state, self.packing = host_actor_state(
            policy, seed, self.rows, connectors, group.observation_space, env_ids=ids
        )
        self.call = CompiledPolicyStep(
            policy, params, self.state, self.rows, first.obs_rows, connectors, self.packing
        )
        self.sample_end = None
        if connectors is not None and connectors.per_sample:
            self.sample_end = SampleEnd(connectors, self.packing, agent_axis=True)  # type: ignore[arg-type]
        self.stage = self.call.new_stage()
        self._stage_obs = _leaves(self.stage.obs)
        self.action_spec, self.extras_spec = self.call.output_spec
        shape = (num_envs, a_g)
        self.pending_obs = jr_spaces.allocate(group.observation_space, shape)
        self.pending_action = jax.tree.map(
            lambda s: np.zeros((*shape, *s.shape[1:]), s.dtype), self.action_spec
        )
        self._pending_obs = _leaves(self.pending_obs)
        self._pending_action = _leaves(self.pending_action)
        self.pending_extras = [
            np.zeros((*shape, *s.shape[1:]), s.dtype) for s in jax.tree.leaves(self.extras_spec)
        ]
        self.agent_step = np.zeros(shape, np.int64)  # transitions so far in the agent episode
        self.clip = jr_spaces.clip_box_actions(group.action_space)
        self._all_rows = np.arange(self.rows, dtype=np.int32)
        self.pending: Any = None
        self.acting = np.zeros(shape, np.bool_)
        self.env_action: Any = None
        # Agent-episode returns and lengths across samples (for the metrics).
        self.running_return = np.zeros(shape, np.float64)
        self.running_length = np.zeros(shape, np.int64)

    def begin(self, traj: GroupTrajectory) -> None:
        """Resolves the leaves of a new sample's buffers (no tree walks per step)."""
        self._traj_leaves = [
            _leaves(traj.obs),
            _leaves(traj.action),
            _leaves(traj.extras),
            _leaves(traj.next_obs),
        ]

    def dispatch(self, params: Params, buf: GroupBuffers) -> None:
        stage = self.stage
        for dst, src in zip(self._stage_obs, _leaves(buf.obs_rows)):
            np.copyto(dst, src)
        stage.episode_start[:] = buf.agent_start.ravel()
        np.copyto(self.acting, buf.acting)
        stage.env_index[:] = np.where(self.acting.ravel(), self._all_rows, self.rows)
        self.pending, self.state = self.call.dispatch(params, self.state, stage)

    def collect(self, buf: GroupBuffers) -> None:
        """Takes the actions and keeps each acting agent's turn until it completes."""
        policy_action, env_action, extras = self.call.collect(self.pending)
        self.pending = None
        shape, acting = self.acting.shape, self.acting
        action = _agent_axis(policy_action, shape)
        # With action connectors the env gets their actions, else the policy's.
        same = env_action is policy_action
        env_action = action if same else _agent_axis(env_action, shape)
        for dst, src in zip(self._pending_obs, _leaves(buf.obs)):
            _copy_where(dst, src, acting)
        for dst, src in zip(self._pending_action, _leaves(action)):
            _copy_where(dst, src, acting)
        for dst, src in zip(self.pending_extras, extras):
            _copy_where(dst, src.reshape(*shape, *src.shape[1:]), acting)
        self.env_action = env_action if self.clip is None else self.clip(env_action)

    def record(self, out: GroupBuffers, traj: GroupTrajectory, t: int) -> None:
        """Writes the transitions completed at step ``t`` into slot ``t``."""
        done = out.completed
        obs, action, extras, next_obs = self._traj_leaves
        for dsts, srcs in (
            (obs, self._pending_obs),
            (action, self._pending_action),
            (extras, self.pending_extras),
            (next_obs, _leaves(out.next_obs)),
        ):
            for dst, src in zip(dsts, srcs):
                _copy_where(dst[t], src, done)
        traj.reward[t] = out.reward
        traj.terminated[t] = out.terminated
        traj.truncated[t] = out.truncated
        traj.valid[t] = done
        np.copyto(traj.agent_step[t], self.agent_step, where=done)
        self.agent_step += done
        self.agent_step[done & (out.terminated | out.truncated)] = 0

    def allocate(self, num_steps: int) -> GroupTrajectory:
        shape = (num_steps, self.num_envs, self.group.num_agents)
        space = self.group.observation_space
        return GroupTrajectory(
            obs=jr_spaces.allocate(space, shape),
            action=jax.tree.map(
                lambda s: np.zeros((*shape, *s.shape[1:]), s.dtype), self.action_spec
            ),
            reward=np.zeros(shape, np.float64),
            terminated=np.zeros(shape, np.bool_),
            truncated=np.zeros(shape, np.bool_),
            next_obs=jr_spaces.allocate(space, shape),
            extras=jax.tree.map(
                lambda s: np.zeros((*shape, *s.shape[1:]), s.dtype), self.extras_spec
            ),
            valid=np.zeros(shape, np.bool_),
            agent_step=np.zeros(shape, np.int64),
        )

    def close(self, traj: GroupTrajectory, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The agent episodes that ended in steps ``[0, t)``: ``(slot, return, length)``."""
        return agent_episode_ends(
            self.running_return,
            self.running_length,
            traj.reward,
            traj.valid,
            traj.terminated | traj.truncated,
            t,
        )


def agent_episode_ends(
    running_return: np.ndarray,
    running_length: np.ndarray,
    reward: np.ndarray,
    valid: np.ndarray,
    done: np.ndarray,
    t: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Moves each agent's running return and length (``[B, A_g]``, updated in place)
    over steps ``[0, t)`` of ``[T, B, A_g]`` arrays; returns the agent episodes that
    ended there as arrays ``(slot, return, length)``, in (step, env, slot) order."""
    slots, returns, lengths = [], [], []
    for s in range(t):
        running_return += np.where(valid[s], reward[s], 0.0)
        running_length += valid[s]
        ends = valid[s] & done[s]
        if ends.any():
            slots.append(np.nonzero(ends)[1])
            returns.append(running_return[ends])
            lengths.append(running_length[ends])
            running_return[ends] = 0.0
            running_length[ends] = 0
    if not slots:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
    return np.concatenate(slots), np.concatenate(returns), np.concatenate(lengths)


@dataclasses.dataclass
class EnvLevel:
    """The env-level fields :class:`EpisodeBook` numbers episodes from."""

    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray
    episode_id: np.ndarray
    step: np.ndarray


class MultiAgentSampler:
    """Samples a :class:`~jaxrunner.multi_agent.MultiAgentVectorEnv` (see the module
    docstring).

    Args:
        envs: the multi-agent vector env, just reset; ``first`` its reset result.
        setup: policies, params, rollout length, seed and metrics.
    """

    def __init__(
        self, envs: MultiAgentVectorEnv, first: MultiAgentStep, setup: MultiAgentSetup
    ) -> None:
        self.envs, self.rollout_length = envs, setup.rollout_length
        self.metrics = setup.metrics
        self._book = EpisodeBook(envs.num_envs)
        num_possible = len(envs.possible_agents)
        self.groups: dict[str, _GroupSampler] = {}
        offset = 0
        for group in envs.groups:
            pid = group.policy_id
            self.groups[pid] = _GroupSampler(
                group,
                first.groups[pid],
                setup.policies[pid],
                setup.params[pid],
                setup.seed,
                envs.num_envs,
                offset,
                num_possible,
                setup.connectors.get(pid),
            )
            offset += group.num_agents
        self._last = first
        self.agents = {g.policy_id: g.agents for g in envs.groups}

    def sample(self, params: dict[str, Params]) -> MultiAgentTrajectory:
        num_steps, num_envs = self.rollout_length, self.envs.num_envs
        groups = {pid: gs.allocate(num_steps) for pid, gs in self.groups.items()}
        for pid, gs in self.groups.items():
            gs.begin(groups[pid])
        shape = (num_steps, num_envs)
        env_level = EnvLevel(
            reward=np.zeros(shape, np.float64),
            terminated=np.zeros(shape, np.bool_),
            truncated=np.zeros(shape, np.bool_),
            valid=np.ones(shape, np.bool_),
            episode_id=np.zeros(shape, np.int64),
            step=np.zeros(shape, np.int64),
        )
        traj = MultiAgentTrajectory(
            groups=groups,
            env_id=np.broadcast_to(np.arange(num_envs, dtype=np.int64), shape).copy(),
            episode_id=env_level.episode_id,
            step=env_level.step,
            env_done=env_level.terminated,
            agents=self.agents,
        )
        perf = dict.fromkeys(PERF_KEYS, 0.0)
        start_time = time.perf_counter()
        t = 0
        try:
            for t in range(num_steps):
                self._step(params, traj, env_level, t, perf)
            t = num_steps
        except BaseException as err:
            attach_partial(err, self._close(traj, env_level, t) if t else None)
            raise
        finally:
            self.metrics.sample_time_s += time.perf_counter() - start_time
            self.metrics.perf.record(perf, t)
        return self._end_sample(self._close(traj, env_level, num_steps))

    def _end_sample(self, traj: MultiAgentTrajectory) -> MultiAgentTrajectory:
        """The groups' connectors' per-sample part (statistics, scaled rewards, what the
        policy would see of each next_obs), timed as sampling."""
        clock = time.perf_counter()
        groups = dict(traj.groups)
        for pid, gs in self.groups.items():
            if gs.sample_end is not None:
                groups[pid], connectors = gs.sample_end(gs.state.connectors, groups[pid])
                gs.state = gs.state.replace(connectors=connectors)
        self.metrics.sample_time_s += time.perf_counter() - clock
        return traj.replace(groups=groups)

    def get_connector_state(self, policy_id: str) -> ConnectorsState:
        """A host copy of the state of ``policy_id``'s connectors."""
        gs = self.groups[policy_id]
        return gs.packing.to_host(gs.state.connectors)  # type: ignore[union-attr]

    def set_connector_state(self, policy_id: str, state: ConnectorsState) -> None:
        """Replaces the state of ``policy_id``'s connectors; never recompiles."""
        gs = self.groups[policy_id]
        gs.state = gs.state.replace(connectors=gs.packing.to_device(state))  # type: ignore[union-attr]

    def _step(
        self,
        params: dict[str, Params],
        traj: MultiAgentTrajectory,
        env_level: EnvLevel,
        t: int,
        perf: dict[str, float],
    ) -> None:
        last = self._last
        clock = time.perf_counter()
        for pid, gs in self.groups.items():
            gs.dispatch(params[pid], last.groups[pid])
        tick = time.perf_counter()
        perf["inference_ms"] += tick - clock
        for pid, gs in self.groups.items():
            gs.collect(last.groups[pid])
        clock = time.perf_counter()
        perf["action_processing_ms"] += clock - tick
        out = self.envs.step_batch([gs.env_action for gs in self.groups.values()])
        tick = time.perf_counter()
        perf["env_wait_ms"] += tick - clock
        for pid, gs in self.groups.items():
            gs.record(out.groups[pid], traj.groups[pid], t)
        env_level.reward[t] = out.env_reward
        env_level.terminated[t] = out.env_done
        self.metrics.unassigned_reward += float(out.unassigned_reward.sum())
        self._last = out
        perf["obs_processing_ms"] += time.perf_counter() - tick

    def _close(
        self, traj: MultiAgentTrajectory, env_level: EnvLevel, t: int
    ) -> MultiAgentTrajectory:
        self.metrics.add(self._book.close(env_level, t))  # type: ignore[arg-type]
        for pid, gs in self.groups.items():
            group = traj.groups[pid]
            steps = np.count_nonzero(group.valid[:t], axis=(0, 1))
            self.metrics.add_group_counts(pid, steps, gs.close(group, t))
        if t == self.rollout_length:
            return traj
        return jax.tree.map(lambda x: x[:t], traj)


def _leaves(tree: Any) -> list[np.ndarray]:
    """The arrays of a pytree (a lone array without a tree walk)."""
    return [tree] if isinstance(tree, np.ndarray) else jax.tree.leaves(tree)


def _agent_axis(action: Any, shape: tuple[int, ...]) -> Any:
    """``[B * A_g, ...]`` rows viewed as ``[B, A_g, ...]``."""
    if isinstance(action, np.ndarray):
        return action.reshape(*shape, *action.shape[1:])
    return jax.tree.map(lambda x: x.reshape(*shape, *x.shape[1:]), action)


def _copy_where(dst: np.ndarray, src: np.ndarray, mask: np.ndarray) -> None:
    """``dst[mask] = src[mask]``; ``mask`` covers the leading axes."""
    if dst.ndim > mask.ndim:
        mask = mask.reshape(*mask.shape, *([1] * (dst.ndim - mask.ndim)))
    np.copyto(dst, src, where=mask)


__all__ = ["EnvLevel", "MultiAgentSampler", "MultiAgentSetup", "agent_episode_ends"]

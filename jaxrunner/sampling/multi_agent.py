"""The multi-agent sampler: groups of agents, one compiled policy step per group.

Per step: for each group, its acting agents' observations (``[B * A_g, ...]`` rows)
go to the group's :class:`~jaxrunner.policy_step.CompiledPolicyStep` (one
host->device and one device->host transfer per group); rows of agents that do not act
are computed and dropped, so their keys and carries do not move. Each action is
written with its observation and extras to slot ``[t, b, a]`` of the step that
completes its transition: in a parallel env that is the step that takes it (written
straight into slot ``t``); in an AEC env the agent's next turn (kept until then).

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
from jaxrunner.sampling.agent_episodes import agent_episode_ends, agent_steps
from jaxrunner.sampling.episodes import EpisodeBook
from jaxrunner.sampling.multi_agent_state import GroupState, MultiAgentSamplerState
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
        same_step: bool = False,
    ) -> None:
        self.group, self.num_envs = group, num_envs
        self.same_step = same_step
        """Each action's transition completes in the step that takes it (parallel envs)."""
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
        self.clip = jr_spaces.clip_box_actions(group.action_space)
        self._all_rows = np.arange(self.rows, dtype=np.int32)
        self.pending: Any = None
        self.acting = np.zeros(shape, np.bool_)
        self.awaiting = np.zeros(shape, np.bool_)
        """AEC envs: agents whose last action's transition has not completed yet."""
        self._acting_rows = self.acting.reshape(-1)  # a view
        self.all_acting = False
        """Every agent of every env acts at this step (the masks can be skipped)."""
        self._index_all = False  # the stage's env_index marks every row as acting
        self.env_action: Any = None
        # Agent-episode returns and lengths across samples (for the metrics).
        self.running_return = np.zeros(shape, np.float64)
        self.running_length = np.zeros(shape, np.int64)

    def get_state(self, last: GroupBuffers) -> GroupState:
        """This group's :class:`GroupState` (copies); ``last`` is the step the next
        dispatch reads."""
        return GroupState(
            actor=self.state,
            running_return=self.running_return.copy(),
            running_length=self.running_length.copy(),
            awaiting=self.awaiting.copy(),
            pending_obs=jax.tree.map(np.copy, self.pending_obs),
            pending_action=jax.tree.map(np.copy, self.pending_action),
            pending_extras=tuple(x.copy() for x in self.pending_extras),
            obs=jax.tree.map(np.copy, last.obs),
            acting=last.acting.copy(),
            agent_start=last.agent_start.copy(),
        )

    def set_state(self, state: GroupState, last: GroupBuffers) -> None:
        """Takes a :meth:`get_state` as its own; ``last``'s observations and masks are
        overwritten in place (they are views of the env's buffers, which the backend
        reads too: a parallel driver's next step starts from ``acting``)."""
        self.state = state.actor
        np.copyto(self.running_return, state.running_return)
        np.copyto(self.running_length, state.running_length)
        np.copyto(self.awaiting, state.awaiting)
        _put(self._pending_obs, _leaves(state.pending_obs), None, None)
        _put(self._pending_action, _leaves(state.pending_action), None, None)
        _put(self.pending_extras, list(state.pending_extras), None, None)
        _put(_leaves(last.obs), _leaves(state.obs), None, None)
        np.copyto(last.acting, state.acting)
        np.copyto(last.agent_start, state.agent_start)

    def restart_episodes(self) -> None:
        """Every agent's episode is abandoned (its env was reset): no turn waits for
        its transition, and the running returns and lengths start again."""
        self.awaiting[:] = False
        self.running_return[:] = 0.0
        self.running_length[:] = 0

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
        np.copyto(stage.episode_start, buf.agent_start.reshape(-1))
        np.copyto(self.acting, buf.acting)
        self.all_acting = np.count_nonzero(self._acting_rows) == self.rows
        if not (self.all_acting and self._index_all):  # else the index is unchanged
            stage.env_index[:] = np.where(self._acting_rows, self._all_rows, self.rows)
            self._index_all = self.all_acting
        self.pending, self.state = self.call.dispatch(params, self.state, stage)

    def collect(self, buf: GroupBuffers, t: int) -> None:
        """Takes the actions; writes each acting agent's turn into slot ``t`` (parallel
        envs) or keeps it until its transition completes (AEC envs)."""
        policy_action, env_action, extras = self.call.collect(self.pending)
        self.pending = None
        shape, acting = self.acting.shape, self.acting
        action = _agent_axis(policy_action, shape)
        # With action connectors the env gets their actions, else the policy's.
        same = env_action is policy_action
        env_action = action if same else _agent_axis(env_action, shape)
        if self.same_step:
            (obs_dst, action_dst, extras_dst), slot = self._traj_leaves[:3], t
        else:
            obs_dst, action_dst, slot = self._pending_obs, self._pending_action, None
            extras_dst = self.pending_extras
        mask = None if self.all_acting else acting
        _put(obs_dst, _leaves(buf.obs), slot, mask)
        _put(action_dst, _leaves(action), slot, mask)
        _put(extras_dst, [x.reshape(*shape, *x.shape[1:]) for x in extras], slot, mask)
        self.env_action = env_action if self.clip is None else self.clip(env_action)
        if not self.same_step:
            np.logical_or(self.awaiting, acting, out=self.awaiting)

    def record(self, out: GroupBuffers, traj: GroupTrajectory, t: int) -> None:
        """Writes the transitions completed at step ``t`` into slot ``t``."""
        done = out.completed
        obs, action, extras, next_obs = self._traj_leaves
        # A parallel env completes exactly the turns taken at this step, which
        # collect() has already written.
        everyone = self.same_step and self.all_acting
        mask = None if everyone else done
        if not self.same_step:
            _put(obs, self._pending_obs, t, mask)
            _put(action, self._pending_action, t, mask)
            _put(extras, self.pending_extras, t, mask)
        _put(next_obs, _leaves(out.next_obs), t, mask)
        traj.reward[t] = out.reward
        traj.terminated[t] = out.terminated
        traj.truncated[t] = out.truncated
        traj.valid[t] = done  # agent_step is filled in at close()
        if not self.same_step:
            self.awaiting &= ~done

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

    def drop(self, failed: np.ndarray) -> int:
        """Envs ``failed`` (``[B]`` bool) failed their step: the actions of their agents
        that no transition will carry (those just taken, and in AEC envs those still
        waiting for their next turn) are dropped; returns how many."""
        if self.same_step:
            return int(np.count_nonzero(self.acting[failed]))
        dropped = int(np.count_nonzero(self.awaiting[failed]))
        self.awaiting[failed] = False
        return dropped

    def close(
        self, traj: GroupTrajectory, t: int, aborted: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Fills in ``agent_step`` for steps ``[0, t)``; returns the agent episodes that
        ended there: ``(slot, return, length)``. ``aborted`` (``[T, B]``, None: none):
        envs whose step failed, cutting their agents' episodes as faults."""
        done = traj.terminated | traj.truncated
        # An agent's step index is its running episode length before the transition.
        agent_steps(self.running_length, traj.valid, done, t, traj.agent_step, aborted)
        return agent_episode_ends(
            self.running_return, self.running_length, traj.reward, traj.valid, done, t, aborted
        )


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
                same_step=not envs.turn_based,
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
        self._unassigned = np.zeros(shape, np.float64)  # summed once, in _close
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

    def get_state(self) -> MultiAgentSamplerState:
        """What the sampler carries from one ``sample()`` to the next (copies; valid
        between samples): see :class:`MultiAgentSamplerState`."""
        last = self._last.groups
        return MultiAgentSamplerState(
            book=self._book.get_state(),
            groups={pid: gs.get_state(last[pid]) for pid, gs in self.groups.items()},
        )

    def set_state(self, state: MultiAgentSamplerState) -> None:
        """Takes ``state`` (a :meth:`get_state`, shapes and dtypes checked by the caller)
        as its own: sampling goes on exactly where it was taken, provided the envs are in
        their saved state too."""
        self._book.set_state(state.book)
        for pid, gs in self.groups.items():
            gs.set_state(state.groups[pid], self._last.groups[pid])

    def restart_episodes(self, seeds: list[int]) -> None:
        """After :meth:`set_state` when the envs could not be restored: resets sub-env
        ``i`` with ``seeds[i]`` and starts a new env episode (the next free ids, in env
        order) and new agent episodes (carries restart) in each; the episodes under way
        are abandoned, uncounted."""
        self._last = self.envs.reset_batch(seeds)
        self._book.restart()
        for gs in self.groups.values():
            gs.restart_episodes()

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
            gs.collect(last.groups[pid], t)
        clock = time.perf_counter()
        perf["action_processing_ms"] += clock - tick
        out = self.envs.step_batch([gs.env_action for gs in self.groups.values()])
        tick = time.perf_counter()
        perf["env_wait_ms"] += tick - clock
        for pid, gs in self.groups.items():
            gs.record(out.groups[pid], traj.groups[pid], t)
        env_level.reward[t] = out.env_reward
        env_level.terminated[t] = out.env_done
        if out.failed is not None:  # faults: their episodes end, their actions are dropped
            env_level.valid[t] = ~out.failed
            self.metrics.num_dropped_agent_steps += sum(
                gs.drop(out.failed) for gs in self.groups.values()
            )
        self._unassigned[t] = out.unassigned_reward
        self._last = out
        perf["obs_processing_ms"] += time.perf_counter() - tick

    def _close(
        self, traj: MultiAgentTrajectory, env_level: EnvLevel, t: int
    ) -> MultiAgentTrajectory:
        self.metrics.add(self._book.close(env_level, t))  # type: ignore[arg-type]
        self.metrics.unassigned_reward += float(self._unassigned[:t].sum())
        valid = env_level.valid[:t]
        aborted = None if valid.all() else ~valid
        for pid, gs in self.groups.items():
            group = traj.groups[pid]
            steps = np.count_nonzero(group.valid[:t], axis=(0, 1))
            self.metrics.add_group_counts(pid, steps, gs.close(group, t, aborted))
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


def _put(
    dsts: list[np.ndarray], srcs: list[np.ndarray], t: int | None, mask: np.ndarray | None
) -> None:
    """Leaf by leaf, ``dst[t] = src`` (``dst`` itself where ``t`` is None) where ``mask``
    (None: everywhere)."""
    for dst, src in zip(dsts, srcs):
        if mask is not None:
            _copy_where(dst if t is None else dst[t], src, mask)
        elif t is None:
            dst[...] = src
        else:
            dst[t] = src


def _copy_where(dst: np.ndarray, src: np.ndarray, mask: np.ndarray) -> None:
    """``dst[mask] = src[mask]``; ``mask`` covers the leading axes."""
    if dst.ndim > mask.ndim:
        mask = mask.reshape(*mask.shape, *([1] * (dst.ndim - mask.ndim)))
    np.copyto(dst, src, where=mask)


__all__ = ["EnvLevel", "MultiAgentSampler", "MultiAgentSetup"]

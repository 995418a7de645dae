"""One agent group's part of the host loop: its compiled policy steps, stages and pending
turns, stepped block by block (envs in any order: :mod:`.group_rows`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.steps import GroupBuffers
from jaxrunner._src.connectors.pipeline import Connectors
from jaxrunner._src.connectors.sample_end import SampleEnd
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.core.multi_agent_trajectory import GroupTrajectory
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.samplers.episode_ids import agent_episode_ends
from jaxrunner._src.samplers.info_arrays import InfoRecorder, policy_extras
from jaxrunner._src.samplers.kept_programs import kept_for, packing_layout
from jaxrunner._src.samplers.leaf_writes import put_leaves, tree_leaves
from jaxrunner._src.samplers.multi_agent_state import GroupState
from jaxrunner._src.samplers.policy_step import CompiledPolicyStep, Stage, host_actor_state

RowsPart = tuple[list[list[np.ndarray]], Any, np.ndarray, Any]
"""Where envs record a step: a sample's buffer leaves (:meth:`GroupSampler.leaves_of`),
each env's step in it (an int, or one per env), the envs, and their rows in the step."""


class _Block:
    """A block's stage and what its last dispatch saw, with the views each dispatch
    writes through (made once: slicing per step costs more than the copies)."""

    def __init__(
        self, call: CompiledPolicyStep, lo: int, hi: int, acting: np.ndarray, one_agent: bool
    ) -> None:
        a_g = acting.shape[1]
        self.call = call
        self.rows = slice(lo, hi)
        self.size = size = (hi - lo) * a_g
        self.lead = (hi - lo, a_g) if not one_agent else (hi - lo,)  # a single agent: env rows
        self.stage: Stage = call.new_stage()
        self.stage_obs = [x[:size] for x in tree_leaves(self.stage.obs)]
        self.stage_start = self.stage.episode_start[:size]
        self.acting = acting[lo:hi]  # a view of the group's
        self.acting_flat = self.acting.reshape(-1)
        self.ids = np.arange(lo * a_g, hi * a_g, dtype=np.int32)  # rows of the actor state
        self.all_acting = False  # at the last dispatch: no masks
        # The last dispatch's step buffers and their obs leaves (rows, and [n, A_g, ...]):
        # a backend hands out the same views step after step.
        self.source: Any = None
        self.source_leaves: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
        self.source_start: np.ndarray = np.zeros(0, np.bool_)
        self.result: Any = None  # the step buffers the last record read, and their leaves
        self.next_obs_leaves: list[np.ndarray] = []
        self.index_all = False  # the stage's env_index marks every row as acting


class GroupSampler:
    """One group's compiled steps, stages and pending turns."""

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
        blocks: Sequence[slice] = (),
        infos: InfoRecorder | None = None,
        one_agent: bool = False,
        *,
        chunk_rows: int,
    ) -> None:
        """``blocks``: the envs of the blocks to compile now (the others compile at
        their first dispatch; none: every env). ``infos``: records the group's info
        entries, a row per agent slot (``info_keys``). ``one_agent``: a single-agent
        env's one agent, who acts at every step (no mask is ever read) and whose infos
        are the env's. ``chunk_rows``: the runner's policy chunk for the group's rows."""
        self.group, self.num_envs, self.infos = group, num_envs, infos
        # same_step: each action's transition completes in the step that takes it (parallel).
        self.same_step, self.always_acting = same_step, one_agent
        a_g = group.num_agents
        self.rows = num_envs * a_g
        ids = (np.arange(num_envs)[:, None] * num_possible + agent_offset + np.arange(a_g)).ravel()
        # Connector state per agent slot (the rows), packed as in the single-agent samplers.
        self.state, self.packing = host_actor_state(
            policy, seed, self.rows, connectors, group.observation_space, env_ids=ids
        )

        def compiled(size: int) -> CompiledPolicyStep:
            return CompiledPolicyStep(
                policy, params, self.state, size, first.obs_rows, connectors, self.packing,
                chunk_rows=chunk_rows, action_space=group.action_space,
            )  # fmt: skip

        self._compile, self.chunk_rows = compiled, chunk_rows
        self.acting = np.full((num_envs, a_g), one_agent)  # at each block's last dispatch
        self._calls: dict[int, CompiledPolicyStep] = {}
        self._blocks: dict[tuple[int, int], _Block] = {}
        for rows in blocks or [slice(0, num_envs)]:
            self._block(rows.start, rows.stop)
        self.pending: dict[tuple[int, int], Any] = {}  # each block's queued policy step
        self._pending_views: dict[tuple[int, int], list[list[np.ndarray]]] = {}
        self.sample_end = None
        if connectors is not None and connectors.per_sample:
            packing, agent_axis = self.packing, not one_agent
            self.sample_end = kept_for(
                policy,
                connectors,
                ("sample_end", packing_layout(packing), agent_axis),
                lambda: SampleEnd(connectors, packing, agent_axis=agent_axis),  # type: ignore[arg-type]
            )
        # The same for every block: shapes of num_envs rows.
        call = next(iter(self._calls.values()))
        self.action_spec, self.extras_spec = call.env_output_spec
        self.env_action_spec = call.env_action_spec  # None without action connectors
        shape = (num_envs, a_g)
        self.pending_obs = space_arrays.allocate(group.observation_space, shape)
        self.pending_action = _zeros(self.action_spec, shape)
        self.pending_extras = jax.tree.leaves(_zeros(self.extras_spec, shape))
        self.pending_leaves = (
            tree_leaves(self.pending_obs), tree_leaves(self.pending_action), self.pending_extras
        )  # fmt: skip
        self.clip = space_arrays.clip_box_actions(group.action_space)
        self.fill_idle = None if one_agent else space_arrays.idle_action_filler(group.action_space)
        self._unrecorded: Any = None  # the actions collect() took, until they are sent
        self.awaiting = np.zeros(shape, np.bool_)  # AEC: last transition not completed yet
        # Agent-episode returns and lengths across samples (for the metrics).
        self.running_return = np.zeros(shape, np.float64)
        self.running_length = np.zeros(shape, np.int64)

    def compiled(self, size: int, key: int) -> CompiledPolicyStep:
        """The policy step for ``size`` rows, compiled once per ``key`` (a block's size;
        a smaller bucket's is minus its rows: buckets of the same whole chunks share)."""
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = self._compile(size)
        return call

    def _block(self, lo: int, hi: int) -> _Block:
        block = self._blocks.get((lo, hi))
        if block is None:
            size = (hi - lo) * self.group.num_agents
            call = self.compiled(size, size)
            block = self._blocks[lo, hi] = _Block(call, lo, hi, self.acting, self.always_acting)
            if self.always_acting:  # every row acts, at every dispatch
                block.all_acting = block.index_all = True
                block.stage.env_index[: block.size] = block.ids
        return block

    def _pending_rows(self, lo: int, hi: int) -> list[list[np.ndarray]]:
        """AEC envs: views of envs ``[lo, hi)``'s pending turns (obs, action, extras)."""
        views = self._pending_views.get((lo, hi))
        if views is None:
            views = self._pending_views[lo, hi] = [
                [x[lo:hi] for x in leaves] for leaves in self.pending_leaves
            ]
        return views

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
        pending = (state.pending_obs, state.pending_action, list(state.pending_extras))
        for dsts, tree in zip(self.pending_leaves, pending):
            put_leaves(dsts, tree_leaves(tree), None, None)
        put_leaves(tree_leaves(last.obs), tree_leaves(state.obs), None, None)
        np.copyto(last.acting, state.acting)
        np.copyto(last.agent_start, state.agent_start)

    def restart_episodes(self) -> None:
        """Every agent's episode is abandoned (its env was reset): no turn waits for
        its transition, and the running returns and lengths start again."""
        self.awaiting[:] = False
        self.running_return[:] = 0.0
        self.running_length[:] = 0

    def leaves_of(self, traj: GroupTrajectory) -> list[list[np.ndarray]]:
        """The leaves of a sample's buffers that the steps write (no tree walks per
        step): obs, action, extras and next_obs."""
        leaves = [traj.obs, traj.action, policy_extras(traj.extras), traj.next_obs]
        if self.always_acting:  # a single agent's [T, B, 1] buffers, written as [T, B]
            return [[x[:, :, 0] for x in tree_leaves(tree)] for tree in leaves]
        return [tree_leaves(tree) for tree in leaves]

    def begin(self, leaves: list[list[np.ndarray]]) -> None:
        """The buffers the block methods write, from now on (:meth:`leaves_of`)."""
        self._traj_leaves = leaves

    def dispatch(self, params: Params, buf: GroupBuffers, lo: int, hi: int) -> None:
        """Queues the policy step of block ``[lo, hi)``; ``buf`` holds its rows."""
        block = self._blocks.get((lo, hi)) or self._block(lo, hi)
        if buf is not block.source:  # a backend's step views: their leaves found once
            rows = tree_leaves(buf.obs_rows)  # (a single agent's: the env's, as its own obs)
            block.source = buf
            block.source_leaves = (rows, rows if self.always_acting else tree_leaves(buf.obs))
            block.source_start = buf.agent_start.reshape(-1)
        for dst, src in zip(block.stage_obs, block.source_leaves[0]):
            dst[...] = src  # cast as the stage packs it (JAX's canonical dtypes)
        block.stage_start[...] = block.source_start  # setitem: cheaper than copyto
        if not self.always_acting:
            n, flat = block.size, block.acting_flat
            block.acting[...] = buf.acting
            block.all_acting = np.count_nonzero(flat) == n
            if not (block.all_acting and block.index_all):  # else the index is unchanged
                block.stage.env_index[:n] = np.where(flat, block.ids, self.rows)
                block.index_all = block.all_acting
        self.pending[lo, hi], self.state = block.call.dispatch(params, self.state, block.stage)

    def collect(self, t: int, lo: int, hi: int) -> Any:
        """Takes the actions of block ``[lo, hi)``, dispatched, and writes each acting agent's
        observation into slot ``t`` (parallel envs) or keeps it until its transition
        completes (AEC envs); :meth:`record_actions` writes the actions there, once they
        are sent. Returns the env's actions, ``[n, A_g, ...]``, and whether they passed the
        backends' checks of their values (``send_checked``)."""
        block = self._blocks[lo, hi]
        # The block's own rows (padding dropped), on the agent axis: [n, A_g, ...].
        pending = self.pending.pop((lo, hi))
        action, env_action, extras, passed = block.call.collect(pending, block.lead)
        obs = block.source_leaves[1]  # the observations it acted on
        if self.same_step:
            obs_dst, action_dst, extras_dst, _ = self._traj_leaves
            index = (t, block.rows)
        else:
            (obs_dst, action_dst, extras_dst), index = self._pending_rows(lo, hi), None
        mask = None if block.all_acting else block.acting
        if mask is None and index is not None:  # every agent acted: no masks
            for dst, src in zip(obs_dst, obs):  # before the send: the env's buffers
                dst[index] = src
        else:
            put_leaves(obs_dst, obs, index, mask)
        self._unrecorded = (action_dst, tree_leaves(action), extras_dst, extras, index, mask)
        if not self.same_step:
            awaiting = self.awaiting[block.rows]
            np.logical_or(awaiting, block.acting, out=awaiting)
        if mask is not None and self.fill_idle is not None:
            env_action = self.fill_idle(env_action, mask)
        return (env_action if self.clip is None else self.clip(env_action)), passed

    def record_actions(self) -> None:
        """Writes the actions and policy outputs :meth:`collect` took (after the send: a
        background backend steps meanwhile)."""
        action_dst, action, extras_dst, extras, index, mask = self._unrecorded
        self._unrecorded = None
        if mask is None and index is not None:  # every agent acted: no masks
            for dst, src in zip(action_dst, action):
                dst[index] = src
            for dst, src in zip(extras_dst, extras):
                dst[index] = src
        else:
            put_leaves(action_dst, action, index, mask)
            put_leaves(extras_dst, extras, index, mask)

    def record(self, out: GroupBuffers, traj: GroupTrajectory, lo: int, hi: int, t: int) -> None:
        """Writes the transitions of envs ``[lo, hi)`` completed at their step ``t`` into
        slot ``t`` (the block may be part of the one that was sent: a ready-first
        backend answers each worker's envs apart)."""
        # A parallel env completes the turns taken at this step, which collect() wrote.
        block = self._blocks.get((lo, hi))  # None: part of a block (ready-first)
        if block is not None and self.same_step and block.all_acting:  # no masks
            index = (t, block.rows)
            if out is not block.result:  # a backend's step views: their leaves found once
                rows = out.next_obs_rows if self.always_acting else out.next_obs
                block.result, block.next_obs_leaves = out, tree_leaves(rows)
            for dst, src in zip(self._traj_leaves[3], block.next_obs_leaves):
                dst[index] = src
            if not self.always_acting:  # (a single agent's validity is its env's)
                traj.valid[index] = out.completed  # agent_step is filled in at close()
        else:
            done = out.completed
            obs, action, extras, next_obs = self._traj_leaves
            rows = slice(lo, hi)
            index = (t, rows)
            everyone = False  # (a whole block where everyone acted: above)
            if block is None:
                acting = self.acting[rows]
                everyone = self.same_step and np.count_nonzero(acting) == acting.size
            mask = None if everyone else done
            if not self.same_step:
                pending_obs, pending_action, pending_extras = self._pending_rows(lo, hi)
                put_leaves(obs, pending_obs, index, mask)
                put_leaves(action, pending_action, index, mask)
                put_leaves(extras, pending_extras, index, mask)
                self.awaiting[rows] &= ~done
            out_rows = out.next_obs_rows if self.always_acting else out.next_obs
            put_leaves(next_obs, tree_leaves(out_rows), index, mask)
            traj.valid[index] = done  # agent_step is filled in at close()
        traj.reward[index] = out.reward
        traj.terminated[index] = out.terminated
        traj.truncated[index] = out.truncated

    def allocate(self, num_steps: int, next_obs: bool = True) -> GroupTrajectory:
        """Zeroed ``[T, B, A_g]`` buffers (``next_obs=False``: without that field, for a
        compact sampler's scratch to fill)."""
        shape = (num_steps, self.num_envs, self.group.num_agents)
        space = self.group.observation_space
        extras = _zeros(self.extras_spec, shape)
        if self.infos is not None:
            self.infos.allocate(extras, shape)
        return GroupTrajectory(
            obs=space_arrays.allocate(space, shape),
            # The env's dtype (int64 for Discrete), whatever the policy's: what the env got.
            action=space_arrays.allocate(self.group.action_space, shape),
            reward=np.zeros(shape, np.float64),
            terminated=np.zeros(shape, np.bool_),
            truncated=np.zeros(shape, np.bool_),
            next_obs=space_arrays.allocate(space, shape) if next_obs else None,
            extras=extras,
            valid=np.zeros(shape, np.bool_),
            agent_step=np.zeros(shape, np.int64),
        )

    def close(
        self, traj: GroupTrajectory, t: int, aborted: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Fills in ``agent_step`` for steps ``[0, t)``; returns the agent episodes that
        ended there: ``(slot, return, length)``. ``aborted`` (``[T, B]``, None: none):
        envs whose step failed, cutting their agents' episodes as faults."""
        valid, reward = np.asarray(traj.valid), np.asarray(traj.reward)
        done = np.asarray(traj.terminated) | np.asarray(traj.truncated)
        step = traj.agent_step
        assert isinstance(step, np.ndarray)  # written in place: a host buffer
        return agent_episode_ends(
            self.running_return, self.running_length, reward, valid, done, t, aborted, step
        )

    def record_infos(
        self,
        traj: GroupTrajectory,
        completed: np.ndarray,
        infos: Sequence[dict],
        t: Any,
        envs: np.ndarray,
    ) -> None:
        """Into ``traj``'s extras, the infos of the agents whose transition completed at
        step ``t`` (an int, or one per env) of envs ``envs`` (``completed``, ``[n, A_g]``):
        each agent's own entry of its env's per-agent infos."""
        if self.always_acting:  # a single agent: the env's infos, every env's row
            self.infos.record(traj.extras, t, envs.tolist(), infos)  # type: ignore[union-attr]
            return
        b, a = np.nonzero(completed)
        if b.size:
            agents = self.group.agents
            rows = (envs[b] * self.group.num_agents + a).tolist()
            mine = [infos[i].get(agents[j], {}) for i, j in zip(b.tolist(), a.tolist())]
            steps = np.broadcast_to(t, envs.shape)[b]
            self.infos.record(traj.extras, steps, rows, mine)  # type: ignore[union-attr]

    def drop(self, failed: np.ndarray, part: RowsPart) -> int:
        """Envs ``failed`` of ``part`` (its ``[n]`` rows) failed their step: their slot
        holds no transition, so every field of it is zero (the acting agents' turns were
        written there, a failed step may have written some ``next_obs``); the actions
        of their agents that no transition will carry (those just taken, and in AEC envs
        those still waiting for their next turn) are dropped. Returns how many."""
        leaves, t, envs, _ = part
        rows, steps = envs[failed], np.broadcast_to(t, envs.shape)[failed]
        for tree in leaves:  # obs, action, extras, next_obs
            for leaf in tree:
                leaf[steps, rows] = 0
        if self.same_step:
            return int(np.count_nonzero(self.acting[rows]))
        dropped = int(np.count_nonzero(self.awaiting[rows]))
        self.awaiting[rows] = False
        return dropped


def _zeros(spec: Any, shape: tuple[int, ...]) -> Any:
    """Zeroed ``[*shape, ...]`` arrays for ``spec``'s ``[rows, ...]`` leaves."""
    return jax.tree.map(lambda s: np.zeros((*shape, *s.shape[1:]), s.dtype), spec)

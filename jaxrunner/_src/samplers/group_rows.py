"""One agent group's part of the ready-first mode's merged calls: envs in any order,
each at its own step, gathered into the stage of a bucket (a call for that many envs,
compiled once) and written where each records its step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxrunner._src.backends.steps import GroupBuffers
from jaxrunner._src.core.multi_agent_trajectory import GroupTrajectory
from jaxrunner._src.core.policy import Params
from jaxrunner._src.samplers.group_step import GroupSampler, RowsPart
from jaxrunner._src.samplers.leaf_writes import put_rows, tree_leaves
from jaxrunner._src.samplers.policy_step import CompiledPolicyStep, Stage


class GroupRows:
    """Group ``gs``'s calls for envs in any order, one per bucket size of ``buckets``
    (compiled now; buckets of the same whole policy chunks share a step)."""

    def __init__(self, gs: GroupSampler, buckets: Sequence[int]) -> None:
        self.gs = gs
        self._buckets: dict[int, tuple[CompiledPolicyStep, Stage]] = {}  # envs -> call, stage
        for envs in buckets:
            size = envs * gs.group.num_agents
            rows = -(-size // gs.chunk_rows) * gs.chunk_rows
            call = gs.compiled(size, size if envs == gs.num_envs else -rows)  # all: rows are slots
            self._buckets[envs] = (call, call.new_stage())
        self._queued: Any = None  # the last dispatch: its pending step, envs, stage rows, call, obs

    def dispatch(self, params: Params, last: GroupBuffers, index: np.ndarray, envs: int) -> None:
        """Queues the policy step of envs ``index`` (any order), whose latest step is in
        ``last`` (every env's rows), in the call for ``envs`` envs: a call for all envs
        computes each agent slot at its own row, a smaller bucket the envs in order, then
        padding (computed, never written back)."""
        gs = self.gs
        call, stage = self._buckets[envs]
        a_g = gs.group.num_agents
        slots = index if a_g == 1 else (index[:, None] * a_g + np.arange(a_g)).ravel()
        at = slots if envs == gs.num_envs else slice(0, len(slots))  # (a slice: views)
        obs = [x[slots] for x in tree_leaves(last.obs_rows)]  # the buffers' copy too
        for dst, rows in zip(tree_leaves(stage.obs), obs):
            dst[at] = rows
        stage.episode_start[:] = False
        stage.episode_start[at] = last.agent_start.reshape(-1)[slots]
        stage.env_index[:] = gs.rows
        if gs.always_acting:
            stage.env_index[at] = slots
        else:
            acting = gs.acting[index] = last.acting[index]
            stage.env_index[at] = np.where(acting.ravel(), slots, gs.rows)
        pending, gs.state = call.dispatch(params, gs.state, stage)
        self._queued = (pending, index, at, call, obs)

    def collect(self, parts: Sequence[RowsPart]) -> Any:
        """Takes the actions :meth:`dispatch` queued and writes each acting agent's
        observation, action and extras where its env records this step (``parts``), or
        keeps them until its transition completes (AEC envs). Returns the env's actions
        in the order of the envs, ``[n, A_g, ...]`` (a single agent's ``[n, ...]``), and
        whether they passed the backends' checks of their values (``send_checked``)."""
        gs = self.gs
        pending, index, at, call, obs = self._queued
        self._queued = None
        action, env_action, extras, passed = call.collect(pending)
        lead = (len(index),) if gs.always_acting else (len(index), gs.group.num_agents)

        def mine(x: np.ndarray) -> np.ndarray:  # of this call's own output: the backend may keep it
            return x[at].reshape(*lead, *x.shape[1:])

        own = mine(action) if isinstance(action, np.ndarray) else jax.tree.map(mine, action)
        if env_action is action:
            env_action = own
        elif isinstance(env_action, np.ndarray):
            env_action = mine(env_action)
        else:
            env_action = jax.tree.map(mine, env_action)
        mask = None if gs.always_acting else gs.acting[index]
        if mask is not None and np.count_nonzero(mask) == mask.size:
            mask = None  # every agent acted: plain copies
        if not gs.always_acting:  # the agent slots' rows on the agent axis
            obs = [x.reshape(*lead, *x.shape[1:]) for x in obs]
        taken = (obs, tree_leaves(own), [mine(x) for x in extras])
        if not gs.same_step:  # into the pending turns, until their transitions complete
            for dsts, srcs in zip(gs.pending_leaves, taken):
                put_rows(dsts, srcs, index, mask)
            gs.awaiting[index] |= gs.acting[index]
        else:
            for leaves, t, envs, sel in parts:
                whole = isinstance(sel, slice)  # every env of the call
                part_mask = mask if whole or mask is None else mask[sel]
                for dsts, srcs in zip(leaves[:3], taken):
                    put_rows(dsts, srcs if whole else [x[sel] for x in srcs], (t, envs), part_mask)
        if mask is not None and gs.fill_idle is not None:
            env_action = gs.fill_idle(env_action, mask)
        return (env_action if gs.clip is None else gs.clip(env_action)), passed

    def record(self, out: GroupBuffers, traj: GroupTrajectory, part: RowsPart) -> None:
        """Writes the transitions of envs ``envs`` (rows ``sel`` of ``out``) completed at
        their steps ``t`` into those slots of ``traj`` (``part``: its leaves, ``t``,
        ``envs`` and ``sel``)."""
        gs = self.gs
        leaves, t, envs, sel = part
        index, whole = (t, envs), isinstance(sel, slice)  # whole: every row of ``out``
        if gs.always_acting:  # no masks; its validity is its env's
            next_obs = tree_leaves(out.next_obs_rows)
            put_rows(leaves[3], next_obs if whole else [x[sel] for x in next_obs], index, None)
        else:
            done = out.completed[sel]
            mask = None if np.count_nonzero(done) == done.size else done  # None: all completed
            if not gs.same_step:
                for dsts, srcs in zip(leaves[:3], gs.pending_leaves):
                    put_rows(dsts, [x[envs] for x in srcs], index, mask)
                gs.awaiting[envs] &= ~done
            put_rows(leaves[3], [x[sel] for x in tree_leaves(out.next_obs)], index, mask)
            traj.valid[index] = done
        traj.reward[index] = out.reward[sel]
        traj.terminated[index] = out.terminated[sel]
        traj.truncated[index] = out.truncated[sel]

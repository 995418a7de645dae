"""One agent group's steps for envs in any order (the ready-first mode's bucket calls):
index arrays of envs, not blocks, each env at its own step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxrunner._src.backends.multi_agent.buffers import GroupBuffers
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.core.multi_agent_trajectory import GroupTrajectory
from jaxrunner._src.core.policy import Params
from jaxrunner._src.samplers.info_arrays import InfoRecorder
from jaxrunner._src.samplers.policy_step import CompiledPolicyStep, Stage

ANY_ORDER = (-1, -1)
"""The key of a :meth:`GroupRows.dispatch_rows` call in ``pending`` (blocks: ``(lo, hi)``)."""

RowsPart = tuple[list[list[np.ndarray]], Any, np.ndarray, Any]
"""Where envs record a step: a sample's buffer leaves (:meth:`GroupSampler.begin`), each
env's step in it, the envs, and their rows in the step."""


class GroupRows:
    """:class:`~jaxrunner._src.samplers.group_step.GroupSampler`'s methods for envs in
    any order: each call's envs gathered into the stage of a bucket (a call for that many
    envs, compiled once), written where each env records its step."""

    group: AgentGroup
    num_envs: int
    rows: int
    state: Any
    infos: InfoRecorder | None
    same_step: bool
    always_acting: bool
    acting: np.ndarray
    awaiting: np.ndarray
    pending: dict[tuple[int, int], Any]
    pending_extras: list[np.ndarray]
    clip: Callable[[Any], Any] | None
    _compile: Callable[[int], CompiledPolicyStep]
    _calls: dict[int, CompiledPolicyStep]
    _chunk_rows: int
    _pending_obs: list[np.ndarray]
    _pending_action: list[np.ndarray]

    def __init__(self) -> None:
        self._buckets: dict[int, tuple[CompiledPolicyStep, Stage]] = {}
        """Envs per bucket call -> its compiled step (shared by buckets of the same whole
        chunks) and stage."""
        self._rows_at: Any = None  # the last dispatch_rows: envs, stage rows, call, obs
        self._row_ids = np.arange(self.rows)

    def bucket(self, envs: int) -> tuple[CompiledPolicyStep, Stage]:
        """The compiled step and stage of a call for ``envs`` envs (compiled at the first
        ask; buckets of the same whole policy chunks share a step)."""
        entry = self._buckets.get(envs)
        if entry is None:
            size = envs * self.group.num_agents
            rows = -(-size // self._chunk_rows) * self._chunk_rows
            key = size if envs == self.num_envs else -rows  # all envs: rows are slots
            call = self._calls.get(key)
            if call is None:
                call = self._calls[key] = self._compile(size)
            entry = self._buckets[envs] = (call, call.new_stage())
        return entry

    def dispatch_rows(
        self, params: Params, last: GroupBuffers, index: np.ndarray, envs: int
    ) -> None:
        """Queues the policy step of envs ``index`` (any order), whose latest step is in
        ``last`` (every env's rows), in the call for ``envs`` envs: a call for all envs
        computes each agent slot at its own row, a smaller bucket the envs in order, then
        padding (computed, never written back)."""
        call, stage = self.bucket(envs)
        a_g = self.group.num_agents
        slots = index if a_g == 1 else (index[:, None] * a_g + np.arange(a_g)).ravel()
        at = slots if envs == self.num_envs else self._row_ids[: len(slots)]
        obs = [x[slots] for x in tree_leaves(last.obs_rows)]  # the buffers' copy too
        for dst, rows in zip(tree_leaves(stage.obs), obs):
            dst[at] = rows
        stage.episode_start[:] = False
        stage.episode_start[at] = last.agent_start.reshape(-1)[slots]
        stage.env_index[:] = self.rows
        if self.always_acting:
            stage.env_index[at] = slots
        else:
            acting = self.acting[index] = last.acting[index]
            stage.env_index[at] = np.where(acting.ravel(), slots, self.rows)
        self._rows_at = (index, at, call, obs)
        self.pending[ANY_ORDER], self.state = call.dispatch(params, self.state, stage)

    def collect_rows(self, parts: Sequence[RowsPart]) -> Any:
        """Takes the actions :meth:`dispatch_rows` queued and writes each acting agent's
        observation, action and extras where its env records this step (``parts``), or
        keeps them until its transition completes (AEC envs). Returns the env's actions
        in the order of the envs, ``[n, A_g, ...]`` (a single agent's ``[n, ...]``)."""
        index, at, call, obs = self._rows_at
        action, env_action, extras = call.collect(self.pending.pop(ANY_ORDER))
        lead = (len(index),) if self.always_acting else (len(index), self.group.num_agents)

        def mine(x: np.ndarray) -> np.ndarray:  # a fresh array: the backend may keep it
            return x[at].reshape(*lead, *x.shape[1:])

        own = mine(action) if isinstance(action, np.ndarray) else jax.tree.map(mine, action)
        if env_action is action:
            env_action = own
        elif isinstance(env_action, np.ndarray):
            env_action = mine(env_action)
        else:
            env_action = jax.tree.map(mine, env_action)
        mask = None if self.always_acting else self.acting[index]
        if mask is not None and np.count_nonzero(mask) == mask.size:
            mask = None  # every agent acted: plain copies
        if not self.always_acting:  # the agent slots' rows on the agent axis
            obs = [x.reshape(*lead, *x.shape[1:]) for x in obs]
        taken = (obs, tree_leaves(own), [mine(x) for x in extras])
        if not self.same_step:  # into the pending turns, until their transitions complete
            for dsts, srcs in zip(self._pending_trees(), taken):
                put_rows(dsts, srcs, index, mask)
            self.awaiting[index] |= self.acting[index]
        else:
            for leaves, t, envs, sel in parts:
                whole = isinstance(sel, slice)  # every env of the call
                part_mask = mask if whole or mask is None else mask[sel]
                for dsts, srcs in zip(leaves[:3], taken):
                    put_rows(dsts, srcs if whole else [x[sel] for x in srcs], (t, envs), part_mask)
        return env_action if self.clip is None else self.clip(env_action)

    def record_rows(self, out: GroupBuffers, traj: GroupTrajectory, part: RowsPart) -> None:
        """Writes the transitions of envs ``envs`` (rows ``sel`` of ``out``) completed at
        their steps ``t`` into those slots of ``traj`` (``part``: its leaves, ``t``,
        ``envs`` and ``sel``)."""
        leaves, t, envs, sel = part
        index, whole = (t, envs), isinstance(sel, slice)  # whole: every row of ``out``
        if self.always_acting:  # no masks; its validity is its env's
            next_obs = tree_leaves(out.next_obs_rows)
            put_rows(leaves[3], next_obs if whole else [x[sel] for x in next_obs], index, None)
            traj.reward[index] = out.reward[sel]
            traj.terminated[index] = out.terminated[sel]
            traj.truncated[index] = out.truncated[sel]
            return
        done = out.completed[sel]
        mask = None if np.count_nonzero(done) == done.size else done  # None: all completed
        if not self.same_step:
            for dsts, srcs in zip(leaves[:3], self._pending_trees()):
                put_rows(dsts, [x[envs] for x in srcs], index, mask)
            self.awaiting[envs] &= ~done
        put_rows(leaves[3], [x[sel] for x in tree_leaves(out.next_obs)], index, mask)
        traj.reward[index] = out.reward[sel]
        traj.terminated[index] = out.terminated[sel]
        traj.truncated[index] = out.truncated[sel]
        traj.valid[index] = done

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

    def _pending_trees(self) -> tuple[list[np.ndarray], ...]:
        return self._pending_obs, self._pending_action, self.pending_extras


def tree_leaves(tree: Any) -> list[np.ndarray]:
    """The arrays of a pytree (a lone array without a tree walk)."""
    return [tree] if isinstance(tree, np.ndarray) else jax.tree.leaves(tree)


def put_rows(dsts: list[np.ndarray], srcs: list[np.ndarray], index: Any, mask: Any) -> None:
    """Leaf by leaf, ``dst[index] = src`` (fancy ``index``) where ``mask`` (None:
    everywhere; it covers the leading axes of ``src``)."""
    for dst, src in zip(dsts, srcs):
        if mask is None:
            dst[index] = src
        else:
            where = mask.reshape(*mask.shape, *([1] * (src.ndim - mask.ndim)))
            dst[index] = np.where(where, src, dst[index])

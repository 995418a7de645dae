"""The host loop's ready-first mode: acts on whichever envs the backend has answered,
each env at its own step count. See docs/design.md."""

from __future__ import annotations

import bisect
import time
from typing import Any

import jax
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.steps import FIELDS, GroupBuffers, MultiAgentStep
from jaxrunner._src.core.policy import Params
from jaxrunner._src.samplers.group_rows import GroupRows
from jaxrunner._src.samplers.sampler import StepProgress
from jaxrunner.errors import InvalidArgumentError, JaxRunnerError


def default_buckets(num_envs: int, chunk_rows: int, factor: int = 2) -> tuple[int, ...]:
    """``chunk_rows`` (the runner's policy chunk) times powers of ``factor`` below
    ``num_envs``, then ``num_envs``."""
    buckets, size = [], chunk_rows
    while size < num_envs:
        buckets.append(size)
        size *= factor
    return (*buckets, num_envs)


def _env_indices(env_ids: Any, num_envs: int) -> np.ndarray:
    """A step's ``env_ids`` as an int array."""
    if env_ids is None:
        return np.arange(num_envs)
    if isinstance(env_ids, slice):
        return np.arange(env_ids.start, env_ids.stop)
    return np.asarray(env_ids, dtype=np.int64)


def _count(ids: list[Any]) -> int:
    """How many envs ``ids`` (slices and index arrays) name."""
    return sum(len(x) if isinstance(x, np.ndarray) else x.stop - x.start for x in ids)


def _rows(tree: Any, lo: int, hi: int) -> Any:
    if isinstance(tree, np.ndarray):
        return tree[lo:hi]
    return jax.tree.map(lambda x: x[lo:hi], tree)


def own_step(step: MultiAgentStep) -> MultiAgentStep:
    """``step`` with its group buffers copied: the latest step of every env, which
    answers in any order write into."""
    groups = {
        pid: GroupBuffers.of(**{f: space_arrays.tree_map(np.copy, getattr(g, f)) for f in FIELDS})
        for pid, g in step.groups.items()
    }
    return step._replace(groups=groups)


class ReadyFirst:
    """The ready-first mode of a :class:`~jaxrunner._src.samplers.host_loop.HostLoop`:
    each block answered acts again at once, or (``merging``) the ready envs are gathered
    into one call padded to a bucket (docs/design.md, "Ready-first")."""

    def __init__(self, loop: Any, chunk_rows: int) -> None:
        caps, num_envs = loop.envs.capabilities, loop.envs.num_envs
        self.loop, self.num_envs, self.chunk_rows = loop, num_envs, chunk_rows
        self.keep = caps.recv_batch_size or 0  # envs recv waits for: as many stay in flight
        self.merging = bool(caps.any_order or caps.batch_buckets or self.keep)
        buckets = caps.batch_buckets or default_buckets(num_envs, chunk_rows)
        if any(not 1 <= b <= num_envs for b in buckets):
            raise InvalidArgumentError(
                f"batch_buckets={buckets!r}: every bucket must be in [1, num_envs={num_envs}]."
            )
        # Policy batch sizes (each compiled once), and the calls so far per bucket size
        # and per number of ready envs.
        self.buckets = tuple(sorted({*buckets, num_envs})) if self.merging else (num_envs,)
        self.bucket_counts: dict[int, int] = dict.fromkeys(self.buckets, 0)
        self.ready_counts: dict[int, int] = {}
        self.rows: list[tuple[str, GroupRows]] = []  # each group's calls (merging)
        if self.merging:
            self.rows = [(pid, GroupRows(gs, self.buckets)) for pid, gs in loop._parts]
            loop._last = own_step(loop._last)
        self.t = np.zeros(num_envs, np.int64)  # the steps each env has recorded, this sample on
        self.in_flight = 0  # envs sent and not yet received
        self.ready: list[Any] = [slice(0, num_envs)]  # env ids waiting for actions
        self.bufs: list[Any] = []  # this sample's rollout, then the next one's
        self._views: dict[tuple[int, int], Any] = {}  # each block's latest step (views)

    def rollout(self) -> Any:
        """The rollout this sample writes: the one envs ahead have begun."""
        if not self.merging:
            return self.loop._open()
        while len(self.bufs) < (2 if self.keep else 1):
            self.bufs.append(self.loop._open())
        return self.bufs[0]

    def steps_done(self) -> int:
        """Steps every env has recorded in this sample."""
        return int(min(self.t.min(), self.loop.rollout_length))

    def run(
        self,
        params: dict[str, Params],
        rollout: Any,
        perf: dict[str, float],
        progress: StepProgress | None,
    ) -> None:
        """Samples until every env has recorded ``T`` steps into ``rollout``."""
        num_steps, num_envs, loop = self.loop.rollout_length, self.num_envs, self.loop
        keep = self.keep
        if not self.merging:  # every env acts first, on the loop's last step
            self.t[:] = 0
            self.ready, self.in_flight = [slice(0, num_envs)], 0
            self.bufs, self._views = [rollout], {(0, num_envs): loop._last.groups}
        while True:
            todo = self._take_ready()
            # Act now where it fills a policy chunk (a call computes whole chunks: EnvPool
            # async's smaller batches are gathered), or no more envs can be received first.
            if todo and (not keep or self.in_flight < keep or _count(todo) >= self.chunk_rows):
                self._act(params, todo, perf)
            elif todo:  # receive more first; these envs act with them
                self.ready[:0] = todo
            if self.t.min() >= num_steps and (keep or not self.in_flight):
                break
            self._check_can_recv()
            clock = time.perf_counter()
            out = loop.envs.recv()
            perf["env_wait_ms"] += time.perf_counter() - clock
            self._record(out, perf)
            if progress is not None:
                progress(int(np.minimum(self.t, num_steps).sum()))

    def finish(self) -> None:
        """After a whole sample: the next one's rollout and step counts start."""
        if self.merging:
            self.bufs.pop(0)
        self.t -= self.loop.rollout_length

    def check_not_ahead(self) -> None:
        """Refuses a restore while envs step ahead of the last sample (blocks: each
        sample starts afresh from the loop's last step, as a lockstep one does)."""
        if self.merging and (self.in_flight or self.t.any()):
            raise InvalidArgumentError(
                "EnvRunner.restore(): this runner has envs stepping ahead of its last "
                "sample; restore into a new EnvRunner, before its first sample()."
            )

    def restart(self) -> None:
        """Every env acts next (they were reset)."""
        self.ready = [slice(0, self.num_envs)]
        if self.merging:
            self.loop._last = own_step(self.loop._last)

    def _take_ready(self) -> list[Any]:
        """The waiting envs that may step now: below ``T`` steps; with a backend that
        needs envs in flight, below ``2T`` and at most ``T - 1`` ahead of the slowest
        (so every env can always be sent: ``recv`` never waits on fewer than it needs),
        then as many more as its ``recv`` needs, the slowest first."""
        num_steps, keep = self.loop.rollout_length, self.keep
        limit = min(2 * num_steps, int(self.t.min()) + num_steps - 1) if keep else num_steps
        todo, waiting = [], []
        for ids in self.ready:
            if isinstance(ids, slice):  # a block steps together: one step count
                (todo if self.t[ids.start] < limit else waiting).append(ids)
                continue
            below = self.t[ids] < limit
            count = np.count_nonzero(below)  # (cheaper than any() and all())
            if count == len(ids):
                todo.append(ids)
                continue
            if count:
                todo.append(ids[below])
            waiting.append(ids[~below])
        if not keep or not waiting:
            self.ready = waiting
            return todo
        need = keep - self.in_flight - _count(todo)
        if need > 0:  # the slowest of the held envs fill the batch
            held = np.concatenate([_env_indices(ids, 0) for ids in waiting])
            held = held[np.argsort(self.t[held], kind="stable")]
            sent = held[: np.count_nonzero(self.t[held] < 2 * num_steps)][:need]
            if len(sent):
                todo.append(sent)
            waiting = [held[len(sent) :]] if len(held) > len(sent) else []
        self.ready = waiting
        return todo

    def _check_can_recv(self) -> None:
        if self.in_flight == 0 or self.in_flight < self.keep:
            envs = getattr(self.loop.envs, "envs", self.loop.envs)  # a single-agent env's own
            raise JaxRunnerError(
                f"ready-first sampling stalled: {self.in_flight} envs in flight, but "
                f"{type(envs).__name__}.recv() needs {max(self.keep, 1)}; a backend's "
                f"recv_batch_size must not exceed its num_envs ({self.num_envs})."
            )

    def _parts(self, index: np.ndarray) -> list[tuple[Any, np.ndarray, np.ndarray, Any]]:
        """Where envs ``index`` record their current step: (rollout, steps, envs, their
        positions in ``index``); envs a sample ahead go to the next sample's rollout."""
        t, num_steps = self.t[index], self.loop.rollout_length
        ahead = t >= num_steps
        if not ahead.any():
            return [(self.bufs[0], t, index, slice(None))]
        parts = [(self.bufs[1], t[ahead] - num_steps, index[ahead], np.flatnonzero(ahead))]
        if not ahead.all():
            parts.append((self.bufs[0], t[~ahead], index[~ahead], np.flatnonzero(~ahead)))
        return parts

    def _act(self, params: dict[str, Params], todo: list[Any], perf: dict[str, float]) -> None:
        """One policy call for the envs of ``todo``; sends their actions."""
        loop = self.loop
        if not self.merging:  # the block just answered (or every env, first)
            ((lo, hi),) = [(ids.start, ids.stop) for ids in todo]
            loop._dispatch(params, lo, hi, self._views[lo, hi], perf)
            loop._send(lo, hi, perf, int(self.t[lo]))
            self.in_flight += hi - lo
            return
        clock = time.perf_counter()
        indices = [_env_indices(ids, self.num_envs) for ids in todo]
        index = np.concatenate(indices)
        bucket = self.buckets[bisect.bisect_left(self.buckets, len(index))]
        last = loop._last.groups
        for pid, rows in self.rows:  # every group's queued before any is waited for
            rows.dispatch(params[pid], last[pid], index, bucket)
        tick = time.perf_counter()
        perf["obs_processing_ms"] += tick - clock
        parts = self._parts(index)
        actions, passed = [], True
        for pid, rows in self.rows:
            action, ok = rows.collect(
                [(ro.leaves[pid], t, envs, sel) for ro, t, envs, sel in parts]
            )
            actions.append(action)
            passed = passed and ok
        send = loop.envs.send_checked if passed else loop.envs.send
        self.bucket_counts[bucket] += 1
        self.ready_counts[len(index)] = self.ready_counts.get(len(index), 0) + 1
        clock = time.perf_counter()
        perf["inference_ms"] += clock - tick
        k = 0
        for ids, part in zip(todo, indices):
            n = len(part)
            sent = actions
            if len(todo) > 1:
                sent = [_rows(a, k, k + n) for a in actions]
            send(sent, ids)
            self.in_flight += n
            k += n
        perf["action_processing_ms"] += time.perf_counter() - clock

    def _record(self, out: MultiAgentStep, perf: dict[str, float]) -> None:
        """Records the step ``out`` of the envs that answered and queues them."""
        loop = self.loop
        if not self.merging:
            rows = out.env_ids
            lo, hi = (0, self.num_envs) if rows is None else (rows.start, rows.stop)  # type: ignore[union-attr]
            self.in_flight -= hi - lo
            t = int(self.t[lo])
            loop._record(self.bufs[0], lo, hi, out, perf, t)
            self.t[lo:hi] = t + 1  # the block's envs share their step (setitem: cheaper than +=)
            self._views[lo, hi] = out.groups
            self.ready.append(slice(lo, hi))
            return
        clock = time.perf_counter()
        index = _env_indices(out.env_ids, self.num_envs)
        self.in_flight -= len(index)
        for ro, t, envs, sel in self._parts(index):
            self._record_part(ro, out, t, envs, sel)
        for pid, gs in loop._parts:  # the latest step of these envs, for their next action
            src, dst = out.groups[pid], loop._last.groups[pid]
            if gs.always_acting:  # its rows are the envs'; it always acts
                dst_obs, src_obs = dst.obs_rows, src.obs_rows
            else:
                dst_obs, src_obs = dst.obs, src.obs
                dst.acting[index] = src.acting
            if isinstance(src_obs, np.ndarray):
                dst_obs[index] = src_obs
            else:
                for d, s in zip(space_arrays.leaves(dst_obs), space_arrays.leaves(src_obs)):
                    d[index] = s
            dst.agent_start[index] = src.agent_start
        self.t[index] += 1
        self.ready.append(out.env_ids if out.env_ids is not None else slice(0, len(index)))
        perf["obs_processing_ms"] += time.perf_counter() - clock

    def _record_part(
        self, ro: Any, out: MultiAgentStep, t: Any, envs: np.ndarray, sel: Any
    ) -> None:
        """Writes rows ``sel`` of ``out`` (envs ``envs``) into slots ``(t, envs)``."""
        loop, index = self.loop, (t, envs)
        for pid, rows in self.rows:
            gs, group, traj = rows.gs, out.groups[pid], ro.traj.groups[pid]
            rows.record(group, traj, (ro.leaves[pid], t, envs, sel))
            if gs.infos is not None:
                infos = out.infos if isinstance(sel, slice) else [out.infos[k] for k in sel]
                gs.record_infos(traj, group.completed[sel], infos, t, envs)
        if not loop._one_agent:  # else the group's arrays, just written
            ro.level.reward[index] = out.env_reward[sel]
            ro.level.terminated[index] = out.env_done[sel]
            ro.unassigned[index] = out.unassigned_reward[sel]
        if out.failed is not None or out.reset_rows is not None:
            loop._faults(ro, out, t, envs, sel)

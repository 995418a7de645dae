"""The ready-first sampler: infer for whichever envs have answered.
See docs/design.md."""

from __future__ import annotations

import bisect
import time
from typing import Any

import jax
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.batch_step import BatchStep
from jaxrunner._src.connectors.sample_end import SampleEnd
from jaxrunner._src.core.metrics import PERF_KEYS
from jaxrunner._src.core.policy import Params
from jaxrunner._src.core.trajectory import Trajectory
from jaxrunner._src.samplers.buffer_pool import BufferPool, finish_next_obs, record_next_obs
from jaxrunner._src.samplers.episode_ids import EpisodeBook
from jaxrunner._src.samplers.info_arrays import InfoRecorder, policy_extras
from jaxrunner._src.samplers.policy_step import (
    CompiledPolicyStep,
    host_actor_state,
    runner_chunk_rows,
)
from jaxrunner._src.samplers.sampler import (
    HostSampler,
    SamplerSetup,
    StepProgress,
    attach_partial,
)
from jaxrunner.errors import InvalidArgumentError, JaxRunnerError


def default_buckets(num_envs: int, chunk_rows: int) -> tuple[int, ...]:
    """``chunk_rows`` (the runner's policy chunk) times powers of two below
    ``num_envs``, then ``num_envs``."""
    buckets, size = [], chunk_rows
    while size < num_envs:
        buckets.append(size)
        size *= 2
    return (*buckets, num_envs)


def _env_indices(env_ids: Any, num_envs: int) -> np.ndarray:
    """``BatchStep.env_ids`` as an int array."""
    if env_ids is None:
        return np.arange(num_envs)
    if isinstance(env_ids, slice):
        return np.arange(env_ids.start, env_ids.stop)
    return np.asarray(env_ids, dtype=np.int64)


class ReadyFirstSampler(HostSampler):
    """Samples a ``ready_first`` backend (see docs/design.md, Inside the samplers):
    each ``recv`` of ready envs is acted on in one padded, compiled bucket.

    Args:
        envs: the vector env, just reset; ``obs`` its first observations.
        setup: the policy, params, rollout length, seed and metrics.
    """

    def __init__(self, envs: VectorEnv, obs: Any, setup: SamplerSetup) -> None:
        policy, params, connectors = setup.one()
        rollout_length = setup.rollout_length
        num_envs = envs.num_envs
        caps = envs.capabilities
        # The host loop's chunk: the same bits.
        chunk_rows, _ = runner_chunk_rows(
            policy, params, envs.single_observation_space, connectors, num_envs, setup.chunk_rows
        )
        buckets = caps.batch_buckets or default_buckets(num_envs, chunk_rows)
        if any(not 1 <= b <= num_envs for b in buckets):
            raise InvalidArgumentError(
                f"batch_buckets={buckets!r}: every bucket must be in [1, num_envs={num_envs}]."
            )
        self.buckets = tuple(sorted({*buckets, num_envs}))
        """Policy batch sizes, each compiled once."""
        self.bucket_counts: dict[int, int] = dict.fromkeys(self.buckets, 0)
        """Policy calls per bucket size so far."""
        self.ready_counts: dict[int, int] = {}
        """Policy calls per number of ready envs so far."""
        self.envs, self.rollout_length, self.metrics = envs, rollout_length, setup.metrics
        self._keep_in_flight = caps.recv_batch_size or 0
        self._chunk_rows = chunk_rows
        self._obs_space = envs.single_observation_space
        self._action_space = envs.single_action_space
        self._clip = space_arrays.clip_box_actions(self._action_space)
        self._obs = space_arrays.map_structure(self._obs_space, np.copy, obs)  # latest, per env
        self._state, self._packing = host_actor_state(
            policy, setup.seed, num_envs, connectors, self._obs_space
        )
        self._sample_end = None
        if connectors is not None and connectors.per_sample:
            self._sample_end = SampleEnd(connectors, self._packing)  # type: ignore[arg-type]
        self._calls: dict[int, CompiledPolicyStep] = {}
        by_rows: dict[int, CompiledPolicyStep] = {}  # buckets of the same whole chunks
        for n in self.buckets:
            rows = -(-n // chunk_rows) * chunk_rows
            if rows not in by_rows or n == num_envs:
                by_rows[rows] = CompiledPolicyStep(
                    policy, params, self._state, n, obs, connectors, self._packing,
                    chunk_rows=chunk_rows,
                )  # fmt: skip
            self._calls[n] = by_rows[rows]
        self._stages = {n: call.new_stage() for n, call in self._calls.items()}
        self.action_spec, self._extras_spec = self._calls[num_envs].env_output_spec
        self._book = EpisodeBook(num_envs)
        self._infos = InfoRecorder(setup.info_keys) if setup.info_keys else None
        self._pool = BufferPool(
            self._obs_space, self._action_space, self._extras_spec, setup.rollout_length,
            num_envs, self._infos, setup.compact_next_obs,
        )  # fmt: skip
        self._episode_start = np.ones(num_envs, np.bool_)
        self._t = np.zeros(num_envs, np.int64)  # steps recorded per env, this sample on
        self._in_flight = 0  # envs sent and not yet received
        self._ready: list[Any] = [slice(0, num_envs)]  # env ids waiting for actions
        self._bufs: list[Trajectory] = []  # this sample's buffers, then the next one's
        # Backends that keep their reset steps: each buffer's reset slots (for the book).
        self._reset_steps = caps.reset_steps
        self._resets: list[np.ndarray] = []
        self._leaves_of: tuple[Any, list[np.ndarray]] = (None, [])

    def sample(self, params: Params, progress: StepProgress | None = None) -> Trajectory:
        num_steps = self.rollout_length
        perf = dict.fromkeys(PERF_KEYS, 0.0)
        start_time = time.perf_counter()
        while len(self._bufs) < 2:
            self._bufs.append(self._pool.take())
            if self._reset_steps:
                self._resets.append(np.zeros((num_steps, self.envs.num_envs), np.bool_))
        resets = self._resets[0] if self._reset_steps else None
        try:
            while True:
                todo = self._take_ready()
                if todo and self._fills_chunk(todo):
                    self._act(params, todo, perf)
                elif todo:  # receive more first; these envs act with them
                    self._ready[:0] = todo
                if self._t.min() >= num_steps and (self._keep_in_flight or not self._in_flight):
                    break
                self._check_can_recv()
                clock = time.perf_counter()
                out = self.envs.recv()
                tick = time.perf_counter()
                perf["env_wait_ms"] += tick - clock
                self._record(out)
                perf["obs_processing_ms"] += time.perf_counter() - tick
                if progress is not None:
                    progress(int(np.minimum(self._t, num_steps).sum()))
        except BaseException as err:
            done = int(min(self._t.min(), num_steps))
            partial = None
            if done:
                self.metrics.add(self._book.close(self._bufs[0], done, resets))
                partial = self._bufs[0].time_slice(0, done)
            attach_partial(err, partial)
            raise
        finally:
            self.metrics.sample_time_s += time.perf_counter() - start_time
            self.metrics.perf.record(perf, num_steps)
        buf = self._bufs.pop(0)
        if self._reset_steps:
            self._resets.pop(0)
        self.metrics.add(self._book.close(buf, num_steps, resets))
        self._t -= num_steps
        return self._end_sample(finish_next_obs(buf))

    def get_state(self) -> dict[str, Any]:
        return {
            "actor": self._state,
            "book": self._book.get_state(),
            "episode_start": self._episode_start.copy(),
            "obs": space_arrays.map_structure(self._obs_space, np.copy, self._obs),
        }

    def set_state(self, state: dict[str, Any], live: list[Any] | None = None) -> None:
        del live  # no per-step callbacks here
        if self._in_flight or self._t.any():
            raise InvalidArgumentError(
                "EnvRunner.restore(): this runner has envs stepping ahead of its last "
                "sample; restore into a new EnvRunner, before its first sample()."
            )
        self._state = state["actor"]
        self._book.set_state(state["book"])
        self._episode_start[:] = state["episode_start"]
        self._obs = space_arrays.map_structure(self._obs_space, np.array, state["obs"])

    def restart_episodes(self, seeds: list[int]) -> None:
        obs, _ = self.envs.reset_batch(seeds)
        self._obs = space_arrays.map_structure(self._obs_space, np.copy, obs)
        self._book.restart()
        self._episode_start[:] = True
        self._ready = [slice(0, self.envs.num_envs)]

    # -- internals -------------------------------------------------------------------------

    def _take_ready(self) -> list[Any]:
        """The waiting envs that may step now: below ``T`` steps; with a backend that
        needs envs in flight, below ``2T`` and below the slowest env's count plus
        ``T - 1``, and then as many more as its ``recv`` needs, the slowest first. The
        others keep waiting.

        Why the second bound: such a backend answers whichever envs it picks (EnvPool:
        the first to finish), so step counts drift apart with nothing pulling them
        back. An env a whole sample ahead of the slowest would wait at ``2T`` with
        the slowest still in flight, and once fewer than ``recv_batch_size`` were in
        flight, ``recv`` could never answer. Held at ``T - 1`` ahead (one more step
        when sent to fill the batch), no env reaches ``2T`` before the slowest has
        finished its sample, so every env can always be sent."""
        num_steps, keep = self.rollout_length, self._keep_in_flight
        limit = min(2 * num_steps, int(self._t.min()) + num_steps - 1) if keep else num_steps
        todo, waiting = [], []
        for ids in self._ready:
            if isinstance(ids, slice):  # a block steps together: one step count
                (todo if self._t[ids.start] < limit else waiting).append(ids)
                continue
            below = self._t[ids] < limit
            if below.any():
                todo.append(ids[below])
            if not below.all():
                waiting.append(ids[~below])
        need = keep - self._in_flight - sum(len(_env_indices(ids, 0)) for ids in todo)
        if need > 0 and waiting:  # the slowest of the held envs fill the batch
            held = np.concatenate([_env_indices(ids, 0) for ids in waiting])
            held = held[np.argsort(self._t[held], kind="stable")]
            sent = held[: np.count_nonzero(self._t[held] < 2 * num_steps)][:need]
            if len(sent):
                todo.append(sent)
            waiting = [held[len(sent) :]] if len(held) > len(sent) else []
        self._ready = waiting
        return todo

    def _fills_chunk(self, todo: list[Any]) -> bool:
        """Whether to act on ``todo`` now: it fills a policy chunk, or no more envs can
        be received first. A call computes whole chunks, so with a backend that answers
        fixed batches smaller than a chunk (EnvPool async) each batch would cost a whole
        chunk; its batches are gathered into one call instead (each row's bits are the
        same in any call)."""
        keep = self._keep_in_flight
        if not keep or self._in_flight < keep:
            return True
        return sum(len(_env_indices(ids, 0)) for ids in todo) >= self._chunk_rows

    def _check_can_recv(self) -> None:
        if self._in_flight == 0 or self._in_flight < self._keep_in_flight:
            raise JaxRunnerError(
                f"ready-first sampling stalled: {self._in_flight} envs in flight, but "
                f"{type(self.envs).__name__}.recv() needs {max(self._keep_in_flight, 1)}; a "
                "backend's recv_batch_size must not exceed its num_envs "
                f"({self.envs.num_envs})."
            )

    def _rows(self, index: np.ndarray) -> list[tuple[Trajectory, np.ndarray, np.ndarray, Any]]:
        """Where envs ``index`` record their current step: (buffer, rows, envs, their
        positions in ``index``); envs a sample ahead go to the next sample's buffer."""
        return [(self._bufs[b], rows, envs, sel) for b, rows, envs, sel in self._parts(index)]

    def _parts(self, index: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray, Any]]:
        """:meth:`_rows` with the buffer's position in ``_bufs`` (0: this sample's)."""
        t, num_steps = self._t[index], self.rollout_length
        ahead = t >= num_steps
        if not ahead.any():
            return [(0, t, index, slice(None))]
        parts = [(1, t[ahead] - num_steps, index[ahead], np.flatnonzero(ahead))]
        if not ahead.all():
            parts.append((0, t[~ahead], index[~ahead], np.flatnonzero(~ahead)))
        return parts

    def _act(self, params: Params, todo: list[Any], perf: dict[str, float]) -> None:
        """One policy call for the envs of ``todo``; records their obs and actions at
        each env's current step and sends the actions."""
        clock = time.perf_counter()
        num_envs = self.envs.num_envs
        indices = [_env_indices(ids, num_envs) for ids in todo]
        index = np.concatenate(indices)
        count = len(index)
        bucket = self.buckets[bisect.bisect_left(self.buckets, count)]
        call, stage = self._calls[bucket], self._stages[bucket]
        obs = space_arrays.map_structure(self._obs_space, lambda x: x[index], self._obs)
        where = self._rows(index)
        for buf, rows, envs, sel in where:
            if buf.is_compact:  # its recorder wrote every row but the first
                first = np.flatnonzero(rows == 0)
                if not len(first):
                    continue
                rows, envs, sel = rows[first], envs[first], np.arange(count)[sel][first]
            space_arrays.copy_into(
                self._obs_space, buf.obs, space_arrays.take(self._obs_space, obs, sel), (rows, envs)
            )
        # A full batch computes env i at row i (its rows are the envs); a smaller
        # bucket takes the ready envs in order, then padding.
        at = index if bucket == num_envs else np.arange(count)
        stage.env_index[:] = num_envs  # padding: computed, never written back
        stage.episode_start[:] = False
        space_arrays.copy_into(self._obs_space, stage.obs, obs, at)
        stage.episode_start[at] = self._episode_start[index]
        stage.env_index[at] = index
        tick = time.perf_counter()
        perf["obs_processing_ms"] += tick - clock
        pending, self._state = call.dispatch(params, self._state, stage)
        action, env_actions, extras = call.collect(pending)
        self.bucket_counts[bucket] += 1
        self.ready_counts[count] = self.ready_counts.get(count, 0) + 1
        clock = time.perf_counter()
        perf["inference_ms"] += clock - tick
        k = 0
        for ids, part_index in zip(todo, indices):
            n = len(part_index)
            part_at = at[k : k + n]
            part = space_arrays.map_structure(
                self._action_space, lambda x, at=part_at: x[at], action
            )
            env_part = part
            if env_actions is not action:  # action connectors: the env's own actions
                env_part = space_arrays.map_structure(
                    self._action_space, lambda x, at=part_at: x[at], env_actions
                )
            # One ready group (the common case) records where its observations went.
            for buf, rows, envs, sel in where if len(todo) == 1 else self._rows(part_index):
                recorded = part  # all of it, unless some envs record into the next sample
                if not isinstance(sel, slice):
                    recorded = space_arrays.take(self._action_space, part, sel)
                space_arrays.copy_into(self._action_space, buf.action, recorded, (rows, envs))
                for dst, src in zip(self._extras_leaves(buf), extras):
                    dst[rows, envs] = src[part_at][sel]
            self._episode_start[part_index] = False
            # ``part`` is a fresh array (fancy indexing): the backend may keep it.
            env_action = env_part if self._clip is None else self._clip(env_part)
            self.envs.send(env_action, ids)
            self._in_flight += n
            k += n
        perf["action_processing_ms"] += time.perf_counter() - clock

    def _extras_leaves(self, buf: Trajectory) -> list[np.ndarray]:
        """``jax.tree.leaves(buf.extras)``, kept per buffer (a buffer serves a sample)."""
        if buf is not self._leaves_of[0]:
            self._leaves_of = (buf, jax.tree.leaves(policy_extras(buf.extras)))
        return self._leaves_of[1]

    def _record(self, out: BatchStep) -> None:
        """Records the step ``out`` of the envs that answered and queues them."""
        index = _env_indices(out.env_ids, self.envs.num_envs)
        n = len(index)
        self._in_flight -= n
        reset = out.reset_rows
        for b, rows, envs, sel in self._parts(index):
            buf = self._bufs[b]
            record_next_obs(self._obs_space, buf, (rows, envs), out, sel)
            buf.reward[rows, envs] = out.reward[sel]
            buf.terminated[rows, envs] = out.terminated[sel]
            buf.truncated[rows, envs] = out.truncated[sel]
            if out.failed is not None:  # a replaced actor or restarted sub-env
                buf.valid[rows, envs] = ~out.failed[sel]
            if reset is not None:  # the env's reset steps: no transition, and no fault
                self._resets[b][rows, envs] = reset[sel]
                buf.valid[rows, envs] &= ~reset[sel]
            if self._infos is not None:
                infos = out.infos if isinstance(sel, slice) else [out.infos[k] for k in sel]
                self._infos.record(buf.extras, rows, envs.tolist(), infos)
        space_arrays.copy_into(self._obs_space, self._obs, out.obs, index)
        done = np.logical_or(out.terminated, out.truncated)
        if out.failed is not None:
            done |= out.failed
        if reset is not None:  # the new episode's first policy step comes next
            done |= reset
        self._episode_start[index] = done
        self._t[index] += 1
        self._ready.append(out.env_ids if out.env_ids is not None else slice(0, n))

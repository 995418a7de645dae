"""The lockstep sampler: every env steps once per time step, in pipelined splits."""

from __future__ import annotations

import collections
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
from jaxrunner._src.samplers.batch_invariance import default_chunk_rows
from jaxrunner._src.samplers.buffer_pool import BufferPool, finish_next_obs, record_next_obs
from jaxrunner._src.samplers.callbacks import Callbacks, LiveEpisode, overrides
from jaxrunner._src.samplers.episode_ids import EpisodeBook
from jaxrunner._src.samplers.info_arrays import InfoRecorder, policy_extras
from jaxrunner._src.samplers.pipeline_splits import pipeline_splits
from jaxrunner._src.samplers.policy_step import (
    CompiledPolicyStep,
    host_actor_state,
    runner_policy_flops,
)
from jaxrunner._src.samplers.sampler import (
    HostSampler,
    SamplerSetup,
    StepProgress,
    attach_partial,
)


class LockstepSampler(HostSampler):
    """Samples a lockstep backend: per step and split, one transfer each way, one
    compiled policy call on that split's rows, one ``send``/``recv``; a split's policy
    computes while the other splits' envs step.

    Args:
        envs: the vector env, just reset; ``obs`` its first observations.
        setup: the policy, params, rollout length, seed and metrics.
        num_splits: pipelining splits (None:
            :func:`~jaxrunner._src.samplers.pipeline_splits.default_num_splits`).
        callbacks: optional hooks, called with ``runner``.
        runner: what the callbacks receive as their runner.
    """

    def __init__(
        self,
        envs: VectorEnv,
        obs: Any,
        setup: SamplerSetup,
        *,
        num_splits: int | None = None,
        callbacks: Callbacks | None = None,
        runner: Any = None,
    ) -> None:
        num_envs = envs.num_envs
        policy, params, connectors = setup.one()
        flops = runner_policy_flops(policy, params, envs.single_observation_space, connectors)
        chunk_rows = default_chunk_rows(num_envs, flops)  # as runner_chunk_rows: same bits
        self.splits = pipeline_splits(envs, num_splits, chunk_rows, flops)
        """The envs of each pipelining split."""
        self.envs, self.rollout_length = envs, setup.rollout_length
        self.metrics, self.callbacks, self._runner = setup.metrics, callbacks, runner
        self._obs_space = envs.single_observation_space
        self._action_space = envs.single_action_space
        self._clip = space_arrays.clip_box_actions(self._action_space)
        self._book = EpisodeBook(num_envs)
        self._infos = InfoRecorder(setup.info_keys) if setup.info_keys else None
        self._episode_start = np.ones(num_envs, dtype=np.bool_)
        self._state, self._packing = host_actor_state(
            policy, setup.seed, num_envs, connectors, self._obs_space
        )
        calls: dict[int, CompiledPolicyStep] = {}  # one compile per split size
        for rows in self.splits:
            size = rows.stop - rows.start
            if size not in calls:
                calls[size] = CompiledPolicyStep(
                    policy, params, self._state, size,
                    space_arrays.rows(self._obs_space, obs, slice(0, size)),
                    connectors, self._packing, chunk_rows=chunk_rows,
                )  # fmt: skip
        self._calls = [calls[rows.stop - rows.start] for rows in self.splits]
        self._sample_end = None
        if connectors is not None and connectors.per_sample:
            self._sample_end = SampleEnd(connectors, self._packing)  # type: ignore[arg-type]
        self._stages = [call.new_stage() for call in self._calls]
        for stage, rows in zip(self._stages, self.splits):
            stage.env_index[: rows.stop - rows.start] = np.arange(rows.start, rows.stop)
        self._pending: list[Any] = [None] * len(self.splits)
        self._whole = len(self.splits) == 1
        # Backends that step in the background get each split's actions as soon as they
        # are ready and are waited for one split later; in-process ones step at recv.
        self._background = envs.capabilities.steps_in_background
        self._actions: list[Any] = [None] * len(self.splits)
        # The latest observations of each split's envs (views of the env's buffer).
        self._split_obs = [space_arrays.rows(self._obs_space, obs, g) for g in self.splits]
        self.action_spec, self._extras_spec = self._calls[0].env_output_spec
        self._pool = BufferPool(
            self._obs_space, self._action_space, self._extras_spec, setup.rollout_length,
            num_envs, self._infos, setup.compact_next_obs,
        )  # fmt: skip
        self._live: list[LiveEpisode] = []
        self._on_step = callbacks is not None and overrides(callbacks, "on_episode_step")
        self._live_next_id = num_envs  # the next id, counted step by step for callbacks
        # Backends that keep their reset steps: which slots are resets (for the book),
        # and the ids reserved at each episode end for the live episode that starts at
        # the env's reset step (its first observation).
        self._reset_steps = envs.capabilities.reset_steps
        self._resets: np.ndarray | None = None
        self._live_reserved = np.zeros(num_envs, dtype=np.int64)
        if callbacks is not None:
            self._live = [self._start_live(i, i, obs) for i in range(num_envs)]

    def sample(self, params: Params, progress: StepProgress | None = None) -> Trajectory:
        num_steps = self.rollout_length
        buf = self._pool.take()
        perf = dict.fromkeys(PERF_KEYS, 0.0)
        start_time = time.perf_counter()
        # Ids of episodes that start during this sample, for callbacks' live episodes
        # (the book gives the same ids to the trajectory, after the loop).
        self._live_next_id = self._book.next_episode_id
        self._extras_leaves = jax.tree.leaves(policy_extras(buf.extras))
        self._params = params
        if self._reset_steps:
            self._resets = np.zeros((num_steps, self.envs.num_envs), dtype=np.bool_)
        t = 0  # steps recorded for every split
        splits = range(len(self.splits))
        lag = 1 if self._background and len(splits) > 1 else 0
        in_flight: collections.deque[tuple[int, int]] = collections.deque()
        try:
            for g in splits:
                self._dispatch(g, buf, 0, perf)
            for step in range(num_steps):
                for g in splits:
                    self._send_split(g, buf, step, perf)
                    in_flight.append((g, step))
                    while len(in_flight) > lag:
                        t = self._finish_group(*in_flight.popleft(), buf, perf)
                if progress is not None:
                    progress(t * self.envs.num_envs)
            while in_flight:
                t = self._finish_group(*in_flight.popleft(), buf, perf)
        except BaseException as err:
            partial = None
            if t:
                self.metrics.add(self._book.close(buf, t, self._resets))
                partial = buf.time_slice(0, t)
            attach_partial(err, partial)
            raise
        finally:
            self.metrics.sample_time_s += time.perf_counter() - start_time
            self.metrics.perf.record(perf, t)
        for live in self._live:  # the next sample writes other buffers
            live.detach(buf)
        self.metrics.add(self._book.close(buf, num_steps, self._resets))
        return self._end_sample(finish_next_obs(buf))

    def get_state(self) -> dict[str, Any]:
        obs = space_arrays.allocate(self._obs_space, (self.envs.num_envs,))
        for rows, group_obs in zip(self.splits, self._split_obs):
            space_arrays.copy_into(self._obs_space, obs, group_obs, rows)
        return {
            "actor": self._state,
            "book": self._book.get_state(),
            "episode_start": self._episode_start.copy(),
            "obs": obs,
        }

    def set_state(self, state: dict[str, Any], live: list[LiveEpisode] | None = None) -> None:
        self._state = state["actor"]
        self._book.set_state(state["book"])
        self._episode_start[:] = state["episode_start"]
        self._set_obs(space_arrays.map_structure(self._obs_space, np.array, state["obs"]), live)

    def live_episodes(self) -> list[LiveEpisode]:
        return list(self._live)  # empty without callbacks

    def restart_episodes(self, seeds: list[int]) -> None:
        obs, _ = self.envs.reset_batch(seeds)
        self._book.restart()
        self._episode_start[:] = True
        self._set_obs(obs)

    def _set_obs(self, obs: Any, live: list[LiveEpisode] | None = None) -> None:
        """The envs' latest observations are ``obs``; callbacks' live episodes go on as
        ``live`` or restart from them, with the book's ids."""
        self._split_obs = [space_arrays.rows(self._obs_space, obs, g) for g in self.splits]
        if self.callbacks is not None and live is not None:
            self._live = list(live)
        elif self.callbacks is not None:
            ids = self._book.episode_id.tolist()
            self._live = [self._start_live(i, ids[i], obs) for i in range(self.envs.num_envs)]

    def _dispatch(self, g: int, buf: Trajectory, t: int, perf: dict[str, float]) -> None:
        """Records split ``g``'s observations at step ``t`` and queues its policy step."""
        clock = time.perf_counter()
        rows, obs, stage = self.splits[g], self._split_obs[g], self._stages[g]
        if t == 0 or not buf.is_compact:  # a compact buffer's recorder wrote the rest
            space_arrays.copy_into(self._obs_space, buf.obs, obs, (t, rows))
        own = slice(0, rows.stop - rows.start)  # then padding, up to whole chunks
        space_arrays.copy_into(self._obs_space, stage.obs, obs, own)
        stage.episode_start[own] = self._episode_start[rows]
        tick = time.perf_counter()
        perf["obs_processing_ms"] += tick - clock
        self._pending[g], self._state = self._calls[g].dispatch(self._params, self._state, stage)
        perf["inference_ms"] += time.perf_counter() - tick

    def _send_split(self, g: int, buf: Trajectory, t: int, perf: dict[str, float]) -> None:
        """Takes split ``g``'s actions for step ``t``, hands them to its envs (sent now
        if the backend steps in the background) and records them."""
        clock = time.perf_counter()
        rows = self.splits[g]
        index = (t, rows)
        call = self._calls[g]
        action, env_action, extras = call.collect(self._pending[g])
        self._pending[g] = None
        if call.rows != call.size:  # drop the padding rows
            own, same = slice(0, call.size), env_action is action
            action = space_arrays.rows(self._action_space, action, own)
            env_action = action if same else space_arrays.rows(self._action_space, env_action, own)
            extras = [leaf[own] for leaf in extras]
        tick = time.perf_counter()
        perf["inference_ms"] += tick - clock
        if self._clip is not None:
            env_action = self._clip(env_action)
        sending = time.perf_counter()
        if self._background:  # sent first: the envs step while the actions are recorded
            self.envs.send(env_action, None if self._whole else rows)
        else:
            self._actions[g] = env_action
        clock = time.perf_counter()
        perf["env_wait_ms"] += clock - sending
        space_arrays.copy_into(self._action_space, buf.action, action, index)
        for dst, src in zip(self._extras_leaves, extras):
            dst[index] = src
        perf["action_processing_ms"] += (sending - tick) + (time.perf_counter() - clock)

    def _finish_group(self, g: int, t: int, buf: Trajectory, perf: dict[str, float]) -> int:
        """Waits for split ``g``'s envs, records step ``t`` and queues the split's next
        policy step; returns the number of steps now recorded for every split."""
        clock = time.perf_counter()
        rows, index = self.splits[g], (t, self.splits[g])
        if self._background:
            out = self.envs.recv()
        else:
            out = self.envs.step_batch(self._actions[g], None if self._whole else rows)
        tick = time.perf_counter()
        perf["env_wait_ms"] += tick - clock
        record_next_obs(self._obs_space, buf, index, out)
        buf.reward[index] = out.reward
        buf.terminated[index] = out.terminated
        buf.truncated[index] = out.truncated
        self._split_obs[g] = out.obs
        if self._infos is not None:
            self._infos.record(buf.extras, t, range(rows.start, rows.stop), out.infos)
        self._advance_episodes(buf, t, rows, out)
        perf["obs_processing_ms"] += time.perf_counter() - tick
        if t + 1 < self.rollout_length:
            self._dispatch(g, buf, t + 1, perf)
        return t + 1 if g == len(self.splits) - 1 else t

    def _advance_episodes(self, buf: Trajectory, t: int, rows: slice, out: BatchStep) -> None:
        """What step ``t`` of envs ``rows`` needs at once: the episode-start flags of
        their next policy step, the fault and reset masks and the callbacks. The rest of
        the bookkeeping waits for the end of the sample (:class:`EpisodeBook`)."""
        done = np.logical_or(out.terminated, out.truncated, out=self._episode_start[rows])
        if self.callbacks is not None:  # they see the env's own flags
            self._run_callbacks(buf, t, rows, out, done)
        if out.failed is not None:  # restarted sub-envs: no transition, episode cut
            buf.valid[t, rows] = ~out.failed
            np.logical_or(done, out.failed, out=done)
        reset = out.reset_rows
        if reset is not None:  # the env's reset steps: no transition, and no fault
            assert self._resets is not None  # internal: the backend declares reset_steps
            self._resets[t, rows] = reset
            buf.valid[t, rows] &= ~reset
        if self.callbacks is not None:
            # New episodes get ids in env order, as the book gives them; where the env
            # resets a call later, the episode starts there, from its first observation.
            for i in (rows.start + np.flatnonzero(done)).tolist():
                if self._reset_steps:
                    self._live_reserved[i] = self._live_next_id
                else:
                    self._live[i] = self._start_live(i, self._live_next_id, out.obs, rows.start)
                self._live_next_id += 1
            if reset is not None:
                for i in (rows.start + np.flatnonzero(reset)).tolist():
                    reserved = int(self._live_reserved[i])
                    self._live[i] = self._start_live(i, reserved, out.obs, rows.start)
        if reset is not None:  # the new episode's first policy step comes next
            np.logical_or(done, reset, out=done)

    def _start_live(self, i: int, episode_id: int, obs: Any, offset: int = 0) -> LiveEpisode:
        first_obs = space_arrays.take(self._obs_space, obs, i - offset)
        live = LiveEpisode(i, int(episode_id), first_obs)
        self.callbacks.on_episode_start(self._runner, i, live)  # type: ignore[union-attr]
        return live

    def _run_callbacks(
        self, buf: Trajectory, t: int, rows: slice, out: BatchStep, done: np.ndarray
    ) -> None:
        callbacks, runner = self.callbacks, self._runner
        assert callbacks is not None  # internal: only called with callbacks
        for j, i in enumerate(range(rows.start, rows.stop)):
            live = self._live[i]
            if out.reset_rows is not None and out.reset_rows[j]:
                continue  # the ended episode's reset: no step of any episode
            if out.failed is not None and out.failed[j]:
                live.truncated = live.faulty = True
                callbacks.on_episode_end(runner, i, live)
                live.detach(buf)
                continue
            live.add_step(buf, t, float(out.reward[j]), out.infos[j])
            live.terminated, live.truncated = bool(out.terminated[j]), bool(out.truncated[j])
            if self._on_step:
                callbacks.on_episode_step(runner, i, live)
            if done[j]:
                callbacks.on_episode_end(runner, i, live)
                live.detach(buf)  # a kept episode must not keep the trajectory alive

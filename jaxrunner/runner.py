"""EnvRunner: the host loop, the only place with side effects.

Per step: one host->device transfer (observations and episode-start flags), one
jitted policy call, one device->host transfer (actions and extras), one step of
the vector env, and numpy writes into preallocated ``[T, B]`` buffers.
"""

from __future__ import annotations

import collections
import itertools
import time
from typing import Any

import jax
import numpy as np
from gymnasium import spaces

from jaxrunner import spaces as jr_spaces
from jaxrunner.actor import GroupActor
from jaxrunner.callbacks import Callbacks, LiveEpisode
from jaxrunner.cpu_dispatch import inline_cpu_dispatch
from jaxrunner.dynamic import DynamicBatcher
from jaxrunner.envs.base import VectorEnv
from jaxrunner.envs.jax_env import JaxVectorEnv
from jaxrunner.errors import (
    ClosedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    RunnerFailedError,
)
from jaxrunner.faults import RestartPolicy
from jaxrunner.metrics import PERF_KEYS, EpisodeStats, MetricsConfig, PerfTimers
from jaxrunner.policy import Params, Policy, check_params_like
from jaxrunner.rollout import ScanRollout, check_runner_options
from jaxrunner.trajectory import Episode, Trajectory, concatenate_episodes

PIPELINE_MIN_ENVS = 8
"""From this many envs up, the runner pipelines two groups by default on accelerators."""
PIPELINE_MIN_ENVS_CPU = 256
"""The same on a CPU host with asynchronous dispatch, where XLA and the envs share the
cores: one group's policy computes while the other's envs step only pays once the env
work per group outweighs the extra dispatch (CartPole-v1, 2 cores, 3 interleaved
rounds: at 256 envs 2.6 ms a step with two groups against 3.3 ms with one; at 64 envs
no difference). With inline CPU dispatch (:func:`jaxrunner.use_inline_cpu_dispatch`)
a policy call cannot overlap the envs, so the default is one group."""


class EnvRunner:
    """Samples trajectories from a vector env with a jitted policy.

    Args:
        envs: a jaxrunner vector env (:func:`jaxrunner.make_vec`).
        policy: the :class:`~jaxrunner.Policy`.
        params: its params (``policy.init(...)``).
        rollout_length: T, the steps per env of each :meth:`sample`.
        seed: seeds the policy's keys and the envs (sub-env ``i`` is reset with
            ``seed + i``): the same seed gives the same trajectories.
        callbacks: optional :class:`~jaxrunner.Callbacks`.
        metrics: optional :class:`~jaxrunner.MetricsConfig`.
        num_groups: pipelining: the envs are split in this many groups, and the
            policy computes one group's actions while another group's envs step.
            ``None`` picks 2 from ``PIPELINE_MIN_ENVS`` envs up on accelerators and
            from ``PIPELINE_MIN_ENVS_CPU`` up on a CPU host (1 with inline CPU
            dispatch), else 1. Outputs are bitwise identical whatever the number of
            groups: each group's call computes the policy for every env at its own
            row (XLA's matmuls round differently by batch size), which costs the
            compute of the other groups' rows.
        restart_failed_sub_envs: if True, a sub-env that raises in ``step()`` or
            ``reset()`` (or returns an invalid step) is closed, recreated from its
            factory and reset, and sampling goes on: its episode ends at its last
            good step (``Episode.faulty``; bootstrap it like a truncation), the failed
            step's slot is marked ``valid=False`` in the Trajectory, and metrics count
            ``num_faulty_episodes`` and ``num_dropped_steps``. If False (default), the
            error propagates with the original chained.
        restart_policy: attempts and backoff of the recreation
            (:class:`~jaxrunner.RestartPolicy`; implies ``restart_failed_sub_envs``).
    """

    def __init__(
        self,
        envs: VectorEnv,
        policy: Policy,
        params: Params,
        rollout_length: int,
        seed: int,
        callbacks: Callbacks | None = None,
        *,
        metrics: MetricsConfig | None = None,
        num_groups: int | None = None,
        restart_failed_sub_envs: bool = False,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        if not isinstance(envs, (VectorEnv, JaxVectorEnv)):
            raise InvalidArgumentTypeError(
                f"EnvRunner(envs=...): expected a jaxrunner vector env, got "
                f"{type(envs).__name__}. Build one with jaxrunner.make_vec(env_id_or_factory, "
                "num_envs)."
            )
        if not isinstance(policy, Policy):
            raise InvalidArgumentTypeError(
                f"EnvRunner(policy=...): expected a jaxrunner.Policy, got {policy!r}."
            )
        for name, value, low in (("rollout_length", rollout_length, 1), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise InvalidArgumentError(
                    f"EnvRunner({name}=...): expected an int >= {low}, got {value!r}."
                )
        if restart_policy is not None or restart_failed_sub_envs:
            if not getattr(envs, "supports_restart", False):
                raise InvalidArgumentError(
                    f"EnvRunner(restart_failed_sub_envs=True): the {type(envs).__name__} "
                    "backend cannot restart sub-envs. Use a backend that can (e.g. "
                    "make_vec(..., backend='sync')), or leave restarts off."
                )
            envs.restart_policy = restart_policy or RestartPolicy()
        self.envs = envs
        self.policy = policy
        self.rollout_length = int(rollout_length)
        self.seed = int(seed)
        self.callbacks = callbacks
        config = metrics or MetricsConfig()
        self._closed = False
        self._failure: BaseException | None = None

        num_envs = envs.num_envs
        self._obs_space = envs.single_observation_space
        self._action_space = envs.single_action_space
        self._clip = jr_spaces.clip_box_actions(self._action_space)

        # Host-side episode bookkeeping, one entry per env.
        self._episode_id = np.arange(num_envs, dtype=np.int64)
        self._next_episode_id = num_envs
        self._live_next_id = num_envs  # the next id, counted step by step for callbacks
        # Host-loop steps done before this sample(), and the step each env's episode
        # began at: lengths and Trajectory.step follow without a per-step counter.
        self._steps_done = 0
        self._episode_begin = np.zeros(num_envs, dtype=np.int64)
        self._episode_return = np.zeros(num_envs, dtype=np.float64)
        self._episode_start = np.ones(num_envs, dtype=np.bool_)
        self._env_id = np.arange(num_envs, dtype=np.int64)
        self._num_env_steps = 0  # valid transitions only
        self._num_faulty_episodes = 0
        self._num_dropped_steps = 0
        self._sample_time_s = 0.0
        self._episode_stats = EpisodeStats(config.episode_window)
        self._perf = PerfTimers(config.perf_ema)
        self._live: list[LiveEpisode] = []
        self._fragments: dict[int, Episode] = {}  # unfinished episodes, for sample_episodes
        self._finished: list[Episode] = []  # complete episodes not yet returned

        # A pure-JAX env runs as one compiled lax.scan per sample (jaxrunner.rollout).
        self._scan: ScanRollout | None = None
        self._dynamic: DynamicBatcher | None = None
        if isinstance(envs, JaxVectorEnv):
            check_runner_options(callbacks, num_groups)
            self._params = jax.device_put(params)
            self._scan = ScanRollout(envs, policy, self._params, self.rollout_length, self.seed)
            return

        obs, _ = envs.reset_batch([self.seed + i for i in range(num_envs)])
        self._params = jax.device_put(params)
        if getattr(envs, "dynamic_batching", False):
            # Sub-envs that step at their own pace (Ray actors): jaxrunner.dynamic's loop.
            config = getattr(envs, "config", None)
            self._dynamic = DynamicBatcher(
                envs,  # type: ignore[arg-type]
                policy,
                self._params,
                self.rollout_length,
                self.seed,
                obs,
                callbacks=callbacks,
                num_groups=num_groups,
                batch_buckets=getattr(config, "batch_buckets", None),
                wait_ms=getattr(config, "remote_env_batch_wait_ms", 0.0),
            )
            jr_spaces.check_policy_actions(self._action_space, self._dynamic.action_spec, num_envs)
            return
        self._groups = self._make_groups(policy, obs, num_groups)
        # In-process backends step in step_batch itself: the runner keeps each group's
        # actions until its results are due and skips the async bookkeeping (None:
        # the backend steps in the background, through step_batch_async/wait).
        self._pending_actions: list[Any] | None = (
            None if getattr(envs, "steps_in_background", False) else [None] * len(self._groups)
        )
        # The latest observations of each group's envs (views of the env's buffer).
        self._group_obs = [jr_spaces.rows(self._obs_space, obs, g.rows) for g in self._groups]
        action_spec, self._extras_spec = self._groups[0].output_spec
        jr_spaces.check_policy_actions(self._action_space, action_spec, num_envs)
        if callbacks is not None:
            self._live = [self._start_live(i, i, obs) for i in range(num_envs)]

    # -- construction helpers ---------------------------------------------------------------

    def _make_groups(self, policy: Policy, obs: Any, num_groups: int | None) -> list[GroupActor]:
        num_envs = self.envs.num_envs
        backend_default = getattr(self.envs, "default_num_groups", None)
        if num_groups is None and backend_default is not None:
            num_groups = min(backend_default, num_envs)
        if num_groups is None:
            if jax.default_backend() != "cpu":
                min_envs = PIPELINE_MIN_ENVS
            elif inline_cpu_dispatch():  # calls block: nothing to overlap
                min_envs = num_envs + 1
            else:
                min_envs = PIPELINE_MIN_ENVS_CPU
            num_groups = 2 if num_envs >= min_envs else 1
        if isinstance(num_groups, bool) or not 1 <= num_groups <= num_envs:
            raise InvalidArgumentError(
                f"EnvRunner(num_groups={num_groups!r}): expected an int in [1, num_envs="
                f"{num_envs}] (or None for automatic)."
            )
        bounds = np.linspace(0, num_envs, num_groups + 1).round().astype(int).tolist()
        compiled: dict[str, Any] = {}  # every group runs the same compiled step
        return [
            GroupActor(policy, self._params, self.seed, slice(lo, hi), obs, compiled)
            for lo, hi in itertools.pairwise(bounds)
        ]

    # -- public API ---------------------------------------------------------------------------

    def sample(self) -> Trajectory:
        """Collects ``rollout_length`` steps of every env.

        Episodes carry on across calls. If a step fails, the exception propagates
        with ``err.partial_trajectory`` holding every step completed before it, and
        the runner refuses further sampling (its envs are in an unknown state).
        """
        self._check_usable("sample")
        if self._scan is not None:
            return self._sample_scan()
        if self._dynamic is not None:
            return self._sample_dynamic()
        num_steps, num_envs = self.rollout_length, self.envs.num_envs
        obs_space, action_space = self._obs_space, self._action_space
        buf = Trajectory(
            obs=jr_spaces.allocate(obs_space, (num_steps, num_envs)),
            action=jr_spaces.allocate(action_space, (num_steps, num_envs)),
            reward=np.zeros((num_steps, num_envs), np.float64),
            terminated=np.zeros((num_steps, num_envs), np.bool_),
            truncated=np.zeros((num_steps, num_envs), np.bool_),
            next_obs=jr_spaces.allocate(obs_space, (num_steps, num_envs)),
            extras=jax.tree.map(
                lambda s: np.zeros((num_steps, num_envs, *s.shape[1:]), s.dtype), self._extras_spec
            ),
            env_id=np.broadcast_to(self._env_id, (num_steps, num_envs)).copy(),
            episode_id=np.zeros((num_steps, num_envs), np.int64),
            step=np.zeros((num_steps, num_envs), np.int64),
            valid=np.ones((num_steps, num_envs), np.bool_),
        )
        perf = dict.fromkeys(PERF_KEYS, 0.0)
        start_time = time.perf_counter()
        # Ids of episodes that start during this sample, for callbacks' live episodes
        # (_close_steps gives the same ids to the trajectory, after the loop).
        self._live_next_id = self._next_episode_id
        t = 0  # steps recorded for every group
        groups = range(len(self._groups))
        # A group's policy step is queued as soon as its envs' results are in, and
        # computes while the other groups' envs step (pipelining). Backends that step
        # in the background (other processes) also get each group's actions as soon as
        # they are ready and are waited for one group later, when the results are due.
        lag = 1 if self._pending_actions is None and len(groups) > 1 else 0
        self._extras_leaves = jax.tree.leaves(buf.extras)
        in_flight: collections.deque[tuple[int, int]] = collections.deque()
        try:
            for g in groups:
                self._dispatch(g, buf, 0, perf)
            for step in range(num_steps):
                for g in groups:
                    self._send_group(g, buf, step, perf)
                    in_flight.append((g, step))
                    while len(in_flight) > lag:
                        t = self._finish_group(*in_flight.popleft(), buf, perf)
            while in_flight:
                t = self._finish_group(*in_flight.popleft(), buf, perf)
        except BaseException as err:
            if t:
                self._close_steps(buf, t)
            self._fail(err, buf.time_slice(0, t) if t else None)
            raise
        finally:
            self._sample_time_s += time.perf_counter() - start_time
            self._perf.record(perf, t)
        self._close_steps(buf, num_steps)
        return buf

    def _close_steps(self, buf: Trajectory, t: int) -> None:
        """The episode bookkeeping of steps ``[0, t)``, vectorised, once per sample:
        ``episode_id`` and ``step`` of each step, the returns and lengths of the
        episodes that ended, the counters, and each env's episode carried into the
        next sample. An episode ends where the env ended it or a fault cut it; the
        next one gets a new id, given in step-major, env-minor order (the order of
        the loop, whatever the grouping)."""
        valid = buf.valid[:t]
        cut = buf.terminated[:t] | buf.truncated[:t] | ~valid
        steps = np.arange(t)[:, None]
        cols = np.arange(cut.shape[1])
        # The last step at which each env's episode ended: up to each step, and before it.
        last_end = np.maximum.accumulate(np.where(cut, steps, -1), axis=0)
        prev_end = np.concatenate([np.full((1, cut.shape[1]), -1), last_end[:-1]])
        started = prev_end >= 0  # the step's episode began in this sample
        new_ids = self._next_episode_id - 1 + np.cumsum(cut.ravel()).reshape(cut.shape)
        at_prev = np.maximum(prev_end, 0), cols
        episode_id, step = buf.episode_id[:t], buf.step[:t]
        episode_id[...] = np.where(started, new_ids[at_prev], self._episode_id)
        step[...] = np.where(
            started, steps - prev_end - 1, self._steps_done + steps - self._episode_begin
        )
        # Each step's episode return so far, from running sums of the sample's rewards.
        total = np.cumsum(buf.reward[:t], axis=0)
        before = np.where(started, total[at_prev], -self._episode_return)
        end_t, end_env = np.nonzero(cut)
        good = valid[end_t, end_env]  # faulty episodes stay out of the statistics
        self._episode_stats.add(
            (total - before)[end_t, end_env][good], step[end_t, end_env][good] + 1
        )
        num_failed = cut.size - int(np.count_nonzero(valid))
        self._num_faulty_episodes += num_failed
        self._num_dropped_steps += num_failed
        self._num_env_steps += cut.size - num_failed
        # The episode each env is in after step t - 1.
        final_end = last_end[-1]
        ended = final_end >= 0
        at_end = np.maximum(final_end, 0), cols
        self._episode_id = np.where(ended, new_ids[at_end], self._episode_id)
        self._episode_begin = np.where(ended, self._steps_done + final_end + 1, self._episode_begin)
        self._episode_return = np.where(
            ended, total[-1] - total[at_end], self._episode_return + total[-1]
        )
        self._next_episode_id += len(end_t)
        self._steps_done += t

    def _sample_scan(self) -> Trajectory:
        """``sample()`` of a JaxVectorEnv: one compiled scan; device arrays out. Perf
        timers stay 0: policy and env run fused, with no phase to time apart."""
        start_time = time.perf_counter()
        traj, returns, lengths = self._scan.sample(self._params)  # type: ignore[union-attr]
        self._episode_stats.add(returns, lengths)
        self._num_env_steps += self.rollout_length * self.envs.num_envs
        self._sample_time_s += time.perf_counter() - start_time
        return traj

    def _sample_dynamic(self) -> Trajectory:
        """``sample()`` of envs that step at their own pace (:mod:`jaxrunner.dynamic`)."""
        start_time = time.perf_counter()
        try:
            return self._dynamic.sample(self._params)  # type: ignore[union-attr]
        except BaseException as err:
            self._fail(err, getattr(err, "partial_trajectory", None))
            raise
        finally:
            stats = self._dynamic.take_stats()  # type: ignore[union-attr]
            self._sample_time_s += time.perf_counter() - start_time
            self._num_env_steps += stats.num_env_steps
            self._num_faulty_episodes += stats.num_faulty_episodes
            self._num_dropped_steps += stats.num_dropped_steps
            self._episode_stats.add(np.array(stats.returns), np.array(stats.lengths))
            self._perf.record(stats.perf, stats.num_steps)

    def _dispatch(self, g: int, buf: Trajectory, t: int, perf: dict[str, float]) -> None:
        """Records group ``g``'s observations at step ``t`` and queues its policy step."""
        clock = time.perf_counter()
        group, obs = self._groups[g], self._group_obs[g]
        jr_spaces.copy_into(self._obs_space, buf.obs, obs, (t, group.rows))
        tick = time.perf_counter()
        perf["obs_processing_ms"] += tick - clock
        group.dispatch(self._params, self._obs_space, obs, self._episode_start[group.rows])
        perf["inference_ms"] += time.perf_counter() - tick

    def _send_group(self, g: int, buf: Trajectory, t: int, perf: dict[str, float]) -> None:
        """Takes group ``g``'s actions for step ``t``, records them and sends them to
        its envs (``step_batch_async``)."""
        clock = time.perf_counter()
        group = self._groups[g]
        index = (t, group.rows)
        action, extras = group.collect()
        tick = time.perf_counter()
        perf["inference_ms"] += tick - clock
        jr_spaces.copy_into(self._action_space, buf.action, action, index)
        for dst, src in zip(self._extras_leaves, extras):
            dst[index] = src
        env_action = action if self._clip is None else self._clip(action)
        clock = time.perf_counter()
        perf["action_processing_ms"] += clock - tick
        if self._pending_actions is not None:
            self._pending_actions[g] = env_action
            return
        self.envs.step_batch_async(env_action, group.rows if len(self._groups) > 1 else None)
        perf["env_wait_ms"] += time.perf_counter() - clock

    def _finish_group(self, g: int, t: int, buf: Trajectory, perf: dict[str, float]) -> int:
        """Waits for group ``g``'s envs, records step ``t`` and queues the group's next
        policy step; returns the number of steps now recorded for every group."""
        clock = time.perf_counter()
        rows, index = self._groups[g].rows, (t, self._groups[g].rows)
        part = rows if len(self._groups) > 1 else None
        if self._pending_actions is None:
            out = self.envs.step_batch_wait(part)
        else:
            out = self.envs.step_batch(self._pending_actions[g], part)
        tick = time.perf_counter()
        perf["env_wait_ms"] += tick - clock
        jr_spaces.copy_into(self._obs_space, buf.next_obs, out.next_obs, index)
        buf.reward[index] = out.reward
        buf.terminated[index] = out.terminated
        buf.truncated[index] = out.truncated
        self._group_obs[g] = out.obs
        self._advance_episodes(buf, t, rows, out)
        perf["obs_processing_ms"] += time.perf_counter() - tick
        if t + 1 < self.rollout_length:
            self._dispatch(g, buf, t + 1, perf)
        return t + 1 if g == len(self._groups) - 1 else t

    def sample_episodes(self, num_episodes: int, include_faulty: bool = False) -> list[Episode]:
        """Samples until ``num_episodes`` complete episodes (seen from their first
        step) are available; returns them in the order they started. Episodes that
        complete beyond the count are kept for the next call, so none is lost.
        Episodes already under way before the first call are not complete and are
        skipped (their steps went to earlier ``sample()`` results). Episodes cut by a
        sub-env failure (``Episode.faulty``) are skipped unless ``include_faulty``."""
        if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
            raise InvalidArgumentError(
                f"sample_episodes(num_episodes=...): expected an int >= 1, got {num_episodes!r}."
            )
        while len(self._finished) < num_episodes:
            complete = []
            for part in self.sample().split_episodes():
                episode = self._join_fragment(part)
                if not episode.is_done:
                    self._fragments[episode.env_id] = episode
                elif episode.is_complete and (include_faulty or not episode.faulty):
                    complete.append(episode)
            self._finished.extend(sorted(complete, key=lambda e: e.episode_id))
        result, self._finished = self._finished[:num_episodes], self._finished[num_episodes:]
        return result

    def set_params(self, params: Params) -> None:
        """Replaces the policy params; takes effect at the next step, never recompiles.
        The new params must have the structure, shapes and dtypes of the old ones."""
        self._check_usable("set_params")
        check_params_like(self._params, params, "runner")
        self._params = jax.device_put(params)

    def get_params(self) -> Params:
        return self._params

    def get_metrics(self) -> dict[str, Any]:
        """Counters since construction, recent-episode statistics and perf timers, as
        of the last ``sample()`` (the episode bookkeeping is done once per sample)."""
        return {
            "num_env_steps": self._num_env_steps,
            **self._episode_stats.summary(),
            "env_steps_per_s": self._num_env_steps / self._sample_time_s
            if self._sample_time_s
            else 0.0,
            "num_faulty_episodes": self._num_faulty_episodes,
            "num_dropped_steps": self._num_dropped_steps,
            "perf": self._perf.summary(),
        }

    def get_spaces(self) -> dict[str, spaces.Space]:
        """The single-env and batched observation and action spaces."""
        return {
            "observation_space": self.envs.single_observation_space,
            "action_space": self.envs.single_action_space,
            "batched_observation_space": self.envs.observation_space,
            "batched_action_space": self.envs.action_space,
        }

    def stop(self) -> None:
        """Closes the envs; the runner cannot sample afterwards."""
        if not self._closed:
            self._closed = True
            self.envs.close()

    def __enter__(self) -> EnvRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------------------

    def _check_usable(self, what: str) -> None:
        if self._closed:
            raise ClosedError(f"EnvRunner.{what}() called after stop(); create a new EnvRunner.")
        if self._failure is not None:
            raise RunnerFailedError(
                f"EnvRunner.{what}(): an earlier sample() failed ({self._failure!r}), leaving the "
                "envs in an unknown state; its collected steps are in that error's "
                "partial_trajectory. Create a new EnvRunner to continue."
            ) from self._failure

    def _fail(self, err: BaseException, partial: Trajectory | None) -> None:
        self._failure = err
        try:
            err.partial_trajectory = partial  # type: ignore[attr-defined]
            steps = 0 if partial is None else partial.num_steps
            err.add_note(
                f"jaxrunner: the {steps} steps completed before this error are in "
                "err.partial_trajectory."
            )
        except AttributeError:  # exceptions that refuse new attributes
            pass

    def _advance_episodes(self, buf: Trajectory, t: int, rows: slice, out: Any) -> None:
        """What step ``t`` of envs ``rows`` needs at once: the episode-start flags of
        their next policy step, the fault mask and the callbacks. The rest of the
        bookkeeping waits for the end of the sample (:meth:`_close_steps`)."""
        done = np.logical_or(out.terminated, out.truncated, out=self._episode_start[rows])
        if self.callbacks is not None:  # they see the env's own flags
            self._run_callbacks(buf, t, rows, out, done)
        if out.failed is not None:  # restarted sub-envs: no transition, episode cut
            buf.valid[t, rows] = ~out.failed
            np.logical_or(done, out.failed, out=done)
        if self.callbacks is not None:
            # New episodes get ids in env order, as _close_steps gives them.
            for i in (rows.start + np.flatnonzero(done)).tolist():
                self._live[i] = self._start_live(i, self._live_next_id, out.obs, rows.start)
                self._live_next_id += 1

    def _start_live(self, i: int, episode_id: int, obs: Any, offset: int = 0) -> LiveEpisode:
        first_obs = jr_spaces.take(self._obs_space, obs, i - offset)
        live = LiveEpisode(i, int(episode_id), first_obs)
        self.callbacks.on_episode_start(self, i, live)  # type: ignore[union-attr]
        return live

    def _run_callbacks(
        self, buf: Trajectory, t: int, rows: slice, out: Any, done: np.ndarray
    ) -> None:
        for j, i in enumerate(range(rows.start, rows.stop)):
            live = self._live[i]
            if out.failed is not None and out.failed[j]:
                live.truncated = live.faulty = True
                self.callbacks.on_episode_end(self, i, live)  # type: ignore[union-attr]
                continue
            live.obs.append(jr_spaces.take(self._obs_space, buf.next_obs, (t, i)))
            live.action.append(jr_spaces.take(self._action_space, buf.action, (t, i)))
            live.reward.append(float(out.reward[j]))
            live.extras.append(jax.tree.map(lambda x, i=i: np.array(x[t, i]), buf.extras))
            live.infos.append(out.infos[j])
            live.terminated, live.truncated = bool(out.terminated[j]), bool(out.truncated[j])
            self.callbacks.on_episode_step(self, i, live)  # type: ignore[union-attr]
            if done[j]:
                self.callbacks.on_episode_end(self, i, live)  # type: ignore[union-attr]

    def _join_fragment(self, part: Episode) -> Episode:
        """Prepends the unfinished start of ``part``'s episode kept from earlier samples."""
        head = self._fragments.pop(part.env_id, None)
        if head is None or head.episode_id != part.episode_id:
            return part
        return concatenate_episodes(head, part)


__all__ = ["PIPELINE_MIN_ENVS", "PIPELINE_MIN_ENVS_CPU", "EnvRunner"]

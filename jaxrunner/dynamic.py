"""Dynamic batching: the host loop for envs that step at their own pace.

For vector envs whose sub-envs run elsewhere in independent units (``backend="ray"``:
one Ray actor per block of sub-envs), waiting for every unit each step would make the
whole batch as slow as its slowest unit. :class:`DynamicBatcher` instead polls the env
(``poll(remote_env_batch_wait_ms)``), computes actions for whichever units are ready in
one jitted policy call, sends them, and polls again. Each env still records exactly
``rollout_length`` consecutive steps per ``sample()``; a unit that gets there first
idles until the others do.

Exactness. The ready envs are padded to the smallest of a few bucket sizes, each
compiled once up front, so XLA never recompiles. An env's action key depends only on
the seed, its env id and its step count (:func:`jaxrunner.actor.act`), and episode ids
are numbered in (step, env) order at the end of each sample, as the sync loop numbers
them, so the trajectory equals the sync backend's for the same seed whatever the
batching, provided the policy computes a row the same whatever the batch size. XLA's
CPU matmuls do at the sizes measured here (a 64x64 MLP from batch 2 up; batch 1 takes a
matrix-vector path and differs in the last bits, so buckets start at 2), but wide
layers can round differently at small batches (a 256x256 MLP differs below batch 64).
``batch_buckets=(num_envs,)`` computes every row in a full batch, as the sync backend
does, which is exact for any policy.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import time
from collections import Counter
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner import spaces as jr_spaces
from jaxrunner.actor import ActorState, act, initial_actor_state
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.metrics import PERF_KEYS
from jaxrunner.policy import Params, Policy
from jaxrunner.trajectory import Trajectory
from jaxrunner.transfer import Packing


class PollingVectorEnv(Protocol):
    """What :class:`DynamicBatcher` needs from a vector env (``RayVectorEnv`` has it)."""

    num_envs: int
    unit_rows: list[slice]
    single_observation_space: Any
    single_action_space: Any
    num_in_flight: int

    def send(self, unit: int, actions: Any) -> None: ...

    def poll(self, wait_s: float) -> list[tuple[int, Any]]: ...


@dataclasses.dataclass
class SampleStats:
    """What one ``sample()`` adds to the runner's metrics."""

    num_steps: int = 0
    """Time steps completed by every env."""
    num_env_steps: int = 0
    """Valid transitions."""
    num_faulty_episodes: int = 0
    num_dropped_steps: int = 0
    returns: list[float] = dataclasses.field(default_factory=list)
    """Returns of the episodes that ended well, in (step, env) order."""
    lengths: list[int] = dataclasses.field(default_factory=list)
    perf: dict[str, float] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(PERF_KEYS, 0.0)
    )


def default_buckets(num_envs: int) -> tuple[int, ...]:
    """Powers of two from 2 below ``num_envs``, then ``num_envs`` (1 alone if 1 env)."""
    buckets, size = [], 2
    while size < num_envs:
        buckets.append(size)
        size *= 2
    return (*buckets, num_envs)


class DynamicBatcher:
    """Samples ``[T, B]`` trajectories from a :class:`PollingVectorEnv`.

    Args:
        envs: the vector env, just reset.
        policy: the policy.
        params: device params (only their shapes matter here).
        rollout_length: T.
        seed: the runner's seed (action keys as in the sync loop).
        obs: the envs' first observations (``reset_batch``).
        callbacks: must be None: per-step callbacks need a lock-step loop.
        num_groups: must be None or 1: the loop overlaps units by itself.
        batch_buckets: policy batch sizes (None: :func:`default_buckets`); ``num_envs``
            is always added as the largest.
        wait_ms: ``remote_env_batch_wait_ms``, passed to ``envs.poll``.
    """

    def __init__(
        self,
        envs: PollingVectorEnv,
        policy: Policy,
        params: Params,
        rollout_length: int,
        seed: int,
        obs: Any,
        *,
        callbacks: Any = None,
        num_groups: int | None = None,
        batch_buckets: tuple[int, ...] | None = None,
        wait_ms: float = 0.0,
    ) -> None:
        if callbacks is not None:
            raise InvalidArgumentError(
                f"EnvRunner(callbacks=...): {type(envs).__name__} steps its sub-envs at their "
                "own pace (dynamic batching), where per-step callbacks cannot run in order. "
                "Read the Trajectory instead, or use backend='sync'/'process'."
            )
        if num_groups not in (None, 1):
            raise InvalidArgumentError(
                f"EnvRunner(num_groups={num_groups!r}): {type(envs).__name__} batches whichever "
                "sub-envs are ready (dynamic batching); pipelining groups do not apply. Leave "
                "num_groups=None."
            )
        num_envs = envs.num_envs
        buckets = default_buckets(num_envs) if batch_buckets is None else batch_buckets
        if any(b > num_envs for b in buckets):
            raise InvalidArgumentError(
                f"batch_buckets={batch_buckets!r}: every bucket must be <= num_envs={num_envs}."
            )
        self.buckets = tuple(sorted({*buckets, num_envs}))
        """Policy batch sizes, each compiled once."""
        self.bucket_counts: Counter[int] = Counter()
        """Policy calls per bucket size so far."""
        self.ready_counts: Counter[int] = Counter()
        """Policy calls per number of ready envs so far."""
        self.envs = envs
        self.rollout_length = rollout_length
        self.wait_s = wait_ms / 1000.0
        self._obs_space = envs.single_observation_space
        self._action_space = envs.single_action_space
        self._clip = jr_spaces.clip_box_actions(self._action_space)
        self._obs = jr_spaces.map_structure(self._obs_space, np.copy, obs)  # latest, per env
        self._state = initial_actor_state(policy, seed, np.arange(num_envs))
        self._calls = {n: _BucketCall(policy, params, self._state, n, obs) for n in self.buckets}
        self.action_spec, self.extras_spec = self._calls[num_envs].output_spec
        # Per-env episode bookkeeping (ids are renumbered at the end of each sample).
        self._episode_id = np.arange(num_envs, dtype=np.int64)
        self._next_episode_id = num_envs
        self._episode_step = np.zeros(num_envs, np.int64)
        self._episode_return = np.zeros(num_envs, np.float64)
        self._episode_start = np.ones(num_envs, np.bool_)
        self._stats = SampleStats()

    def take_stats(self) -> SampleStats:
        """What the samples since the last call added (then reset)."""
        stats, self._stats = self._stats, SampleStats()
        return stats

    def sample(self, params: Params) -> Trajectory:
        """Collects ``rollout_length`` consecutive steps of every env.

        If a step fails, the error propagates with ``err.partial_trajectory`` holding
        the steps every env had completed (envs ahead of the slowest lose the steps
        beyond it from the partial trajectory; the runner is unusable afterwards).
        """
        envs, num_steps = self.envs, self.rollout_length
        buf = self._allocate()
        t_unit = np.zeros(len(envs.unit_rows), np.int64)
        ended: list[tuple[int, int, float, int]] = []  # (t, env, return, length), good ends
        perf = self._stats.perf
        ready = list(range(len(envs.unit_rows)))
        try:
            while True:
                todo = [u for u in ready if t_unit[u] < num_steps]
                if todo:
                    self._act(params, todo, t_unit, buf, perf)
                if not envs.num_in_flight:
                    break
                clock = time.perf_counter()
                results = envs.poll(self.wait_s)
                tick = time.perf_counter()
                perf["env_wait_ms"] += tick - clock
                ready = []
                for u, result in results:
                    self._record(int(t_unit[u]), result.rows, result.step, buf, ended)
                    t_unit[u] += 1
                    ready.append(u)
                perf["obs_processing_ms"] += time.perf_counter() - tick
        except BaseException as err:
            done_steps = int(t_unit.min())
            partial = buf.time_slice(0, done_steps) if done_steps else None
            if partial is not None:
                partial = self._number_episodes(partial, ended, commit=False)
            with contextlib.suppress(AttributeError):  # exceptions that refuse attributes
                err.partial_trajectory = partial  # type: ignore[attr-defined]
            raise
        buf = self._number_episodes(buf, ended, commit=True)
        self._stats.num_steps += num_steps
        return buf

    # -- internals -------------------------------------------------------------------------

    def _allocate(self) -> Trajectory:
        num_steps, num_envs = self.rollout_length, self.envs.num_envs
        return Trajectory(
            obs=jr_spaces.allocate(self._obs_space, (num_steps, num_envs)),
            action=jr_spaces.allocate(self._action_space, (num_steps, num_envs)),
            reward=np.zeros((num_steps, num_envs), np.float64),
            terminated=np.zeros((num_steps, num_envs), np.bool_),
            truncated=np.zeros((num_steps, num_envs), np.bool_),
            next_obs=jr_spaces.allocate(self._obs_space, (num_steps, num_envs)),
            extras=jax.tree.map(
                lambda s: np.zeros((num_steps, num_envs, *s.shape[1:]), s.dtype), self.extras_spec
            ),
            env_id=np.broadcast_to(np.arange(num_envs), (num_steps, num_envs)).copy(),
            episode_id=np.zeros((num_steps, num_envs), np.int64),
            step=np.zeros((num_steps, num_envs), np.int64),
            valid=np.ones((num_steps, num_envs), np.bool_),
        )

    def _act(
        self,
        params: Params,
        units: list[int],
        t_unit: np.ndarray,
        buf: Trajectory,
        perf: dict[str, float],
    ) -> None:
        """One policy call for the envs of ``units``; records their obs and actions at
        each unit's current step and sends the actions."""
        clock = time.perf_counter()
        rows = [self.envs.unit_rows[u] for u in units]
        count = sum(r.stop - r.start for r in rows)
        bucket = self.buckets[bisect.bisect_left(self.buckets, count)]
        call = self._calls[bucket]
        k = 0
        for u, r in zip(units, rows):
            n = r.stop - r.start
            obs = jr_spaces.rows(self._obs_space, self._obs, r)
            jr_spaces.copy_into(self._obs_space, buf.obs, obs, (int(t_unit[u]), r))
            jr_spaces.copy_into(self._obs_space, call.stage_obs, obs, slice(k, k + n))
            call.stage_start[k : k + n] = self._episode_start[r]
            call.stage_index[k : k + n] = np.arange(r.start, r.stop)
            k += n
        call.stage_index[k:] = self.envs.num_envs  # padding: computed, never written back
        call.stage_start[k:] = False
        tick = time.perf_counter()
        perf["obs_processing_ms"] += tick - clock
        action, extras, self._state = call(params, self._state)
        self.bucket_counts[bucket] += 1
        self.ready_counts[count] += 1
        clock = time.perf_counter()
        perf["inference_ms"] += clock - tick
        k = 0
        for u, r in zip(units, rows):
            n = r.stop - r.start
            index = (int(t_unit[u]), r)
            part = jr_spaces.rows(self._action_space, action, slice(k, k + n))
            jr_spaces.copy_into(self._action_space, buf.action, part, index)
            for dst, src in zip(jax.tree.leaves(buf.extras), jax.tree.leaves(extras)):
                dst[index] = src[k : k + n]
            self._episode_start[r] = False
            # The clip makes a new array; unclipped, Ray copies the actions when sending.
            self.envs.send(u, part if self._clip is None else self._clip(part))
            k += n
        perf["action_processing_ms"] += time.perf_counter() - clock

    def _record(
        self,
        t: int,
        rows: slice,
        out: Any,
        buf: Trajectory,
        ended: list[tuple[int, int, float, int]],
    ) -> None:
        """Records the step ``t`` of envs ``rows`` and advances their episodes."""
        index = (t, rows)
        stats = self._stats
        jr_spaces.copy_into(self._obs_space, buf.next_obs, out.next_obs, index)
        buf.reward[index] = out.reward
        buf.terminated[index] = out.terminated
        buf.truncated[index] = out.truncated
        buf.step[index] = self._episode_step[rows]
        jr_spaces.copy_into(self._obs_space, self._obs, out.obs, rows)
        self._episode_return[rows] += out.reward
        self._episode_step[rows] += 1
        done = np.logical_or(out.terminated, out.truncated)
        num_failed = 0
        if out.failed is not None:  # a replaced actor or restarted sub-env: no transition
            buf.valid[index] = ~out.failed
            num_failed = int(out.failed.sum())
            stats.num_faulty_episodes += num_failed
            stats.num_dropped_steps += num_failed
            good_ends = done & ~out.failed
            done = done | out.failed
        else:
            good_ends = done
        stats.num_env_steps += rows.stop - rows.start - num_failed
        for j in np.flatnonzero(good_ends).tolist():
            i = rows.start + j
            ended.append((t, i, float(self._episode_return[i]), int(self._episode_step[i])))
        self._episode_start[rows] = done
        self._episode_return[rows] = np.where(done, 0.0, self._episode_return[rows])
        self._episode_step[rows] = np.where(done, 0, self._episode_step[rows])

    def _number_episodes(
        self, buf: Trajectory, ended: list[tuple[int, int, float, int]], commit: bool
    ) -> Trajectory:
        """Writes ``episode_id``: an episode that starts after slot ``(t, b)`` (done or
        failed) gets the next id in (t, b) order, as the sync loop numbers them, so the
        ids do not depend on which env happened to be ahead."""
        num_steps, num_envs = buf.reward.shape
        ends = np.logical_or(buf.done, ~buf.valid)
        flat = np.flatnonzero(ends.ravel())  # row-major: (t, b) order
        new_ids = self._next_episode_id + np.arange(len(flat), dtype=np.int64)
        t_end, b_end = np.divmod(flat, num_envs)
        start_ids = np.full((num_steps, num_envs), -1, np.int64)
        start_ids[0] = self._episode_id
        inside = t_end + 1 < num_steps
        start_ids[t_end[inside] + 1, b_end[inside]] = new_ids[inside]
        last_start = np.where(start_ids >= 0, np.arange(num_steps)[:, None], 0)
        np.maximum.accumulate(last_start, axis=0, out=last_start)
        buf.episode_id[...] = np.take_along_axis(start_ids, last_start, axis=0)
        if commit:
            np.maximum.at(self._episode_id, b_end, new_ids)  # ids grow: the last end wins
            self._next_episode_id += len(flat)
            for _, _, ret, length in sorted(ended):
                self._stats.returns.append(ret)
                self._stats.lengths.append(length)
        return buf


class _BucketCall:
    """The policy step for ``size`` envs out of all: gathers their actor state by env
    index, runs :func:`jaxrunner.actor.act`, scatters the state back (padding rows,
    index ``num_envs``, are dropped). Compiled once, ahead of time; one packed transfer
    each way."""

    def __init__(self, policy: Policy, params: Params, state: ActorState, size: int, obs: Any):
        num_envs = int(state.env_steps.shape[0])
        obs_example = jax.tree.map(lambda x: np.zeros((size, *x.shape[1:]), x.dtype), obs)
        in_packing = Packing((obs_example, np.zeros(size, np.bool_), np.zeros(size, np.int32)))
        self._stage = in_packing.allocate()
        self.stage_obs, self.stage_start, self.stage_index = in_packing.host_views(self._stage)
        traced: dict[str, Any] = {}

        def step(params: Params, state: ActorState, packed: jax.Array) -> tuple[jax.Array, Any]:
            obs, start, index = in_packing.unpack(packed)
            gather = jnp.minimum(index, num_envs - 1)

            def take(x: jax.Array) -> jax.Array:
                return x[gather]

            sub = ActorState(
                env_keys=state.env_keys[gather],
                env_steps=state.env_steps[gather],
                carry=jax.tree.map(take, state.carry),
                initial_carry=jax.tree.map(take, state.initial_carry),
            )
            action, extras, sub = act(policy.apply_fn, params, sub, obs, start)
            state = state.replace(
                env_steps=state.env_steps.at[index].set(sub.env_steps, mode="drop"),
                carry=jax.tree.map(
                    lambda full, part: full.at[index].set(part, mode="drop"), state.carry, sub.carry
                ),
            )
            traced["spec"] = jax.eval_shape(lambda: (action, extras))
            traced["packing"] = Packing((action, extras))
            return traced["packing"].pack((action, extras)), state

        packed_spec = jax.ShapeDtypeStruct((in_packing.nbytes,), jnp.uint8)
        lowered = jax.jit(step, donate_argnums=1).trace(params, state, packed_spec).lower()
        self._step = lowered.compile()
        self._out_packing: Packing = traced["packing"]
        self.output_spec = traced["spec"]

    def __call__(self, params: Params, state: ActorState) -> tuple[Any, Any, ActorState]:
        """Runs the staged batch: one host->device and one device->host transfer."""
        packed, state = self._step(params, state, jax.device_put(self._stage))
        action, extras = self._out_packing.host_views(jax.device_get(packed))
        return action, extras, state


__all__ = ["DynamicBatcher", "PollingVectorEnv", "SampleStats", "default_buckets"]

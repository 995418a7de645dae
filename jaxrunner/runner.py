"""EnvRunner: the host loop, the only place with side effects.

Per step: one host->device transfer (observations and episode-start flags), one
jitted policy call, one device->host transfer (actions and extras), one step of
the vector env, and numpy writes into preallocated ``[T, B]`` buffers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner import spaces as jr_spaces
from jaxrunner.callbacks import Callbacks, LiveEpisode
from jaxrunner.envs.base import VectorEnv
from jaxrunner.errors import (
    ClosedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    RunnerFailedError,
    SpaceMismatchError,
)
from jaxrunner.metrics import PERF_KEYS, EpisodeStats, MetricsConfig, PerfTimers
from jaxrunner.policy import Params, Policy
from jaxrunner.trajectory import Episode, Trajectory, concatenate_episodes
from jaxrunner.transfer import Packing


@flax.struct.dataclass
class ActorState:
    """Device-resident state of the policy side of the loop."""

    env_keys: jax.Array
    """[B] one key per env: ``fold_in(runner_key, env_id)``."""
    env_steps: jax.Array
    """[B] steps each env has taken so far (folded into its key each step)."""
    carry: Any
    """[B, ...] recurrent state (None for feed-forward policies)."""
    initial_carry: Any
    """[B, ...] the carry each env restarts from at an episode start."""


def initial_actor_state(policy: Policy, seed: int, env_ids: np.ndarray) -> ActorState:
    key = jax.random.key(seed)
    return ActorState(
        env_keys=jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.asarray(env_ids, jnp.uint32)),
        env_steps=jnp.zeros(len(env_ids), dtype=jnp.uint32),
        carry=policy.batched_carry(len(env_ids)),
        initial_carry=policy.batched_carry(len(env_ids)),
    )


def act(
    apply_fn: Callable, params: Params, state: ActorState, obs: Any, episode_start: jax.Array
) -> tuple[Any, dict[str, Any], ActorState]:
    """One policy step for every env (pure; the runner jits it once).

    Env ``i``'s key is ``fold_in(fold_in(seed_key, env_id[i]), env_steps[i])``: its
    actions depend on the seed, its id and its step count only (invariant 7).
    """

    def restart(c: jax.Array, c0: jax.Array) -> jax.Array:
        mask = episode_start.reshape(-1, *([1] * (c.ndim - 1)))
        return jnp.where(mask, c0, c)

    carry = jax.tree.map(restart, state.carry, state.initial_carry)
    keys = jax.vmap(jax.random.fold_in)(state.env_keys, state.env_steps)
    action, extras, carry = apply_fn(params, obs, carry, keys)
    return action, extras, state.replace(carry=carry, env_steps=state.env_steps + 1)


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
    ) -> None:
        if not isinstance(envs, VectorEnv):
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
        self._episode_step = np.zeros(num_envs, dtype=np.int64)
        self._episode_return = np.zeros(num_envs, dtype=np.float64)
        self._episode_start = np.ones(num_envs, dtype=np.bool_)
        self._env_id = np.arange(num_envs, dtype=np.int64)
        self._num_env_steps = 0
        self._sample_time_s = 0.0
        self._episode_stats = EpisodeStats(config.episode_window)
        self._perf = PerfTimers(config.perf_ema)
        self._live: list[LiveEpisode] = []
        self._fragments: dict[int, Episode] = {}  # unfinished episodes, for sample_episodes
        self._finished: list[Episode] = []  # complete episodes not yet returned

        self._obs, _ = envs.reset_batch([self.seed + i for i in range(num_envs)])
        self._params = jax.device_put(params)
        self._state = initial_actor_state(policy, self.seed, self._env_id)
        self._act = self._compile(policy)
        if callbacks is not None:
            self._live = [self._start_live(i) for i in range(num_envs)]

    # -- construction helpers ---------------------------------------------------------------

    def _compile(self, policy: Policy) -> Callable:
        """Compiles the policy step once, ahead of time, and checks its outputs.

        The compiled step takes the packed host inputs (observations and
        episode-start flags) and returns the packed outputs (actions and extras):
        one array each way (see :mod:`jaxrunner.transfer`).
        """
        in_packing = Packing((self._obs, self._episode_start))
        self._stage = in_packing.allocate()
        self._stage_obs, self._stage_start = in_packing.host_views(self._stage)

        specs: dict[str, Any] = {}

        def step(params: Params, state: ActorState, packed: jax.Array):
            obs, start = in_packing.unpack(packed)
            action, extras, state = act(policy.apply_fn, params, state, obs, start)
            # Shapes are static while tracing: the output layout is fixed here, once.
            specs["action"], specs["extras"] = jax.eval_shape(lambda: (action, extras))
            specs["packing"] = Packing((action, extras))
            return specs["packing"].pack((action, extras)), state

        packed_spec = jax.ShapeDtypeStruct((in_packing.nbytes,), jnp.uint8)
        traced = jax.jit(step, donate_argnums=1).trace(self._params, self._state, packed_spec)
        self._check_action_spec(specs["action"])
        self._extras_spec = specs["extras"]
        self._out_packing = specs["packing"]
        return traced.lower().compile()

    def _check_action_spec(self, spec: Any) -> None:
        num_envs = self.envs.num_envs
        expected = jr_spaces.allocate(self._action_space, (num_envs,))

        def check(exp: np.ndarray, got: Any) -> None:
            if tuple(got.shape) != exp.shape or not np.can_cast(got.dtype, exp.dtype, "safe"):
                raise SpaceMismatchError(
                    f"the policy returns actions of shape {tuple(got.shape)} and dtype "
                    f"{got.dtype}; the action space {self._action_space} needs shape "
                    f"{exp.shape} (num_envs={num_envs}) and a dtype safely castable to "
                    f"{exp.dtype}. Check the policy's action head against the env."
                )

        try:
            jr_spaces.map_structure(self._action_space, check, expected, spec)
        except (KeyError, IndexError, TypeError) as err:
            raise SpaceMismatchError(
                f"the policy's action structure {jax.tree.structure(spec)} does not match "
                f"the action space {self._action_space}."
            ) from err

    # -- public API ---------------------------------------------------------------------------

    def sample(self) -> Trajectory:
        """Collects ``rollout_length`` steps of every env.

        Episodes carry on across calls. If a step fails, the exception propagates
        with ``err.partial_trajectory`` holding every step completed before it, and
        the runner refuses further sampling (its envs are in an unknown state).
        """
        self._check_usable("sample")
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
                lambda s: np.zeros((num_steps, *s.shape), s.dtype), self._extras_spec
            ),
            env_id=np.broadcast_to(self._env_id, (num_steps, num_envs)).copy(),
            episode_id=np.zeros((num_steps, num_envs), np.int64),
            step=np.zeros((num_steps, num_envs), np.int64),
        )
        perf = dict.fromkeys(PERF_KEYS, 0.0)
        clip, envs, act = self._clip, self.envs, self._act
        stage, stage_obs, stage_start = self._stage, self._stage_obs, self._stage_start
        unpack = self._out_packing.host_views
        copy_into, write_extras = jr_spaces.copy_into, _extras_writer(buf.extras)
        start_time = clock = time.perf_counter()
        t = 0
        try:
            for t in range(num_steps):
                copy_into(obs_space, buf.obs, self._obs, t)
                copy_into(obs_space, stage_obs, self._obs)
                stage_start[:] = self._episode_start
                packed = jax.device_put(stage)
                tick = time.perf_counter()
                perf["obs_processing_ms"] += tick - clock
                packed, self._state = act(self._params, self._state, packed)
                action, extras = unpack(jax.device_get(packed))
                clock = time.perf_counter()
                perf["inference_ms"] += clock - tick
                copy_into(action_space, buf.action, action, t)
                write_extras(extras, t)
                env_action = action if clip is None else clip(action)
                tick = time.perf_counter()
                perf["action_processing_ms"] += tick - clock
                out = envs.step_batch(env_action)
                clock = time.perf_counter()
                perf["env_wait_ms"] += clock - tick
                copy_into(obs_space, buf.next_obs, out.next_obs, t)
                buf.reward[t] = out.reward
                buf.terminated[t] = out.terminated
                buf.truncated[t] = out.truncated
                buf.episode_id[t] = self._episode_id
                buf.step[t] = self._episode_step
                self._obs = out.obs
                self._advance_episodes(buf, t, out)
                tick = time.perf_counter()
                perf["obs_processing_ms"] += tick - clock
                clock = tick
            t = num_steps
        except BaseException as err:
            self._fail(err, buf.time_slice(0, t) if t else None)
            raise
        finally:
            self._num_env_steps += t * num_envs
            self._sample_time_s += time.perf_counter() - start_time
            self._perf.record(perf, t)
        return buf

    def sample_episodes(self, num_episodes: int) -> list[Episode]:
        """Samples until ``num_episodes`` complete episodes (seen from their first
        step) are available; returns them in the order they started. Episodes that
        complete beyond the count are kept for the next call, so none is lost.
        Episodes already under way before the first call are not complete and are
        skipped (their steps went to earlier ``sample()`` results)."""
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
                elif episode.is_complete:
                    complete.append(episode)
            self._finished.extend(sorted(complete, key=lambda e: e.episode_id))
        result, self._finished = self._finished[:num_episodes], self._finished[num_episodes:]
        return result

    def set_params(self, params: Params) -> None:
        """Replaces the policy params; takes effect at the next step, never recompiles.
        The new params must have the structure, shapes and dtypes of the old ones."""
        self._check_usable("set_params")
        old = jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), self._params)
        new = jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), params)
        if jax.tree.structure(old) != jax.tree.structure(new) or old != new:
            raise SpaceMismatchError(
                "set_params(params): the new params differ in structure, shape or dtype from "
                "the runner's; the policy is compiled for the old ones. Pass params with the "
                "same pytree structure (e.g. the output of the same Policy.init)."
            )
        self._params = jax.device_put(params)

    def get_params(self) -> Params:
        return self._params

    def get_metrics(self) -> dict[str, Any]:
        """Counters since construction, recent-episode statistics and perf timers."""
        return {
            "num_env_steps": self._num_env_steps,
            **self._episode_stats.summary(),
            "env_steps_per_s": self._num_env_steps / self._sample_time_s
            if self._sample_time_s
            else 0.0,
            "num_faulty_episodes": 0,
            "num_dropped_steps": 0,
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

    def _advance_episodes(self, buf: Trajectory, t: int, out: Any) -> None:
        """Per-env episode bookkeeping after step ``t`` (vectorised over envs)."""
        self._episode_return += out.reward
        self._episode_step += 1
        done = np.logical_or(out.terminated, out.truncated)
        if self.callbacks is not None:
            self._run_callbacks(buf, t, out, done)
        self._episode_start = done
        if not done.any():
            return
        ended = np.flatnonzero(done)
        self._episode_stats.add(self._episode_return[ended], self._episode_step[ended])
        self._episode_id[ended] = np.arange(
            self._next_episode_id, self._next_episode_id + len(ended)
        )
        self._next_episode_id += len(ended)
        self._episode_return[ended] = 0.0
        self._episode_step[ended] = 0
        if self.callbacks is not None:
            for i in ended.tolist():
                self._live[i] = self._start_live(i)

    def _start_live(self, i: int) -> LiveEpisode:
        live = LiveEpisode(
            i, int(self._episode_id[i]), jr_spaces.take(self._obs_space, self._obs, i)
        )
        self.callbacks.on_episode_start(self, i, live)  # type: ignore[union-attr]
        return live

    def _run_callbacks(self, buf: Trajectory, t: int, out: Any, done: np.ndarray) -> None:
        for i, live in enumerate(self._live):
            live.obs.append(jr_spaces.take(self._obs_space, buf.next_obs, (t, i)))
            live.action.append(jr_spaces.take(self._action_space, buf.action, (t, i)))
            live.reward.append(float(out.reward[i]))
            live.extras.append(jax.tree.map(lambda x, i=i: np.array(x[t, i]), buf.extras))
            live.infos.append(out.infos[i])
            live.terminated, live.truncated = bool(out.terminated[i]), bool(out.truncated[i])
            self.callbacks.on_episode_step(self, i, live)  # type: ignore[union-attr]
            if done[i]:
                self.callbacks.on_episode_end(self, i, live)  # type: ignore[union-attr]

    def _join_fragment(self, part: Episode) -> Episode:
        """Prepends the unfinished start of ``part``'s episode kept from earlier samples."""
        head = self._fragments.pop(part.env_id, None)
        if head is None or head.episode_id != part.episode_id:
            return part
        return concatenate_episodes(head, part)


def _extras_writer(extras_buf: dict[str, Any]) -> Callable[[Any, int], None]:
    leaves, treedef = jax.tree.flatten(extras_buf)

    def write(extras: Any, t: int) -> None:
        for dst, src in zip(leaves, treedef.flatten_up_to(extras)):
            dst[t] = src

    return write


__all__ = ["ActorState", "EnvRunner", "act", "initial_actor_state"]

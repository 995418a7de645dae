"""The scan sampler: policy, env, autoreset and bookkeeping in one jitted ``lax.scan``.

:class:`ScanSampler` is what :class:`~jaxrunner.EnvRunner` runs for a
:class:`~jaxrunner.JaxVectorEnv`. One ``sample()`` is one call of a program compiled
once, ahead of time, at construction (new params never retrace). Everything stays on
device; the only transfer per ``sample()`` is one, allowed by name, of the
returns and lengths of the episodes that ended (for the runner's metrics), whatever
the rollout length.

Semantics are the host loop's:

* ``next_obs`` is the env's true next observation; where an episode ended, the env
  is then reset with a fresh key (a new random start, never a cached one).
* Episode ids are unique per runner: the envs start with ids ``0..B-1``; ended
  episodes get the next free ids in env order within a step.
* Policy keys follow :func:`jaxrunner._src.samplers.policy_step.act`: env ``i``'s action at its
``n``-th
  step uses ``fold_in(fold_in(key(seed), i), n)``, as in the host loop.
* Env keys come from three streams of their own, rooted at ``fold_in(key(seed), r)``
  for ``r`` in the streams of :mod:`jaxrunner._src.samplers.env_streams`.
  The first reset of env ``i`` uses ``fold_in(first_reset_root, i)``. At the envs'
  ``n``-th step (the envs of a JaxVectorEnv step in lockstep), env ``i`` steps with
  ``fold_in(fold_in(step_root, n), i)`` and, if its episode ended, resets with
  ``fold_in(fold_in(reset_root, n), i)``. So env ``i``'s trajectory depends on the seed
  and ``i`` only, not on the batch size. Every key is a :mod:`jaxrunner._src.samplers.keys` key:
  JAX's threefry, bit for bit, in a form XLA fuses. (The step comes first and the env
  id last, so each batch of keys hashes with one shared key: on CPU that costs about
  half of a hash with a key per env, and two such fold-ins cost less than a ``split``.)

The loop itself (:func:`scan_envs`: keys, resets, episode numbering, the episode ends
for the metrics; :class:`ScanLoop`: the ahead-of-time compile and the carried state;
:func:`episode_counts`: the metrics from the ends) is shared with the multi-agent scan
(:mod:`jaxrunner._src.samplers.multi_agent_scan`), which supplies only its step function.

On device, without ``jax_enable_x64``, rewards are float32 and ``env_id``,
``episode_id`` and ``step`` are int32 (JAX's canonical dtypes); the host loop's
numpy buffers hold float64/int64.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, TypeVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner._src import space_arrays as jr_spaces
from jaxrunner._src.backends.functional_env import EnvStep
from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.connectors.pipeline import (
    POLICY_OBS,
    Connectors,
    ConnectorsState,
)
from jaxrunner._src.connectors.state_rows import device_copy
from jaxrunner._src.runner.policy import Params, Policy
from jaxrunner._src.runner.trajectory import Trajectory
from jaxrunner._src.samplers import keys
from jaxrunner._src.samplers.env_streams import (
    env_roots,
    env_step_keys,
    first_reset_keys,
    reset_where_done,
)
from jaxrunner._src.samplers.episode_ids import SampleCounts
from jaxrunner._src.samplers.policy_step import ActorState, act, initial_actor_state
from jaxrunner._src.samplers.sampler import Sampler, SamplerSetup
from jaxrunner.errors import InvalidArgumentError


class SampleFields(Protocol):
    """What :func:`finish_sample` reads of a device trajectory: a :class:`Trajectory`
    or an agent group's (both dataclasses)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def obs(self) -> Any: ...
    @property
    def next_obs(self) -> Any: ...
    @property
    def extras(self) -> dict[str, Any]: ...
    @property
    def reward(self) -> Any: ...
    @property
    def terminated(self) -> Any: ...
    @property
    def truncated(self) -> Any: ...
    @property
    def valid(self) -> Any: ...


TrajT = TypeVar("TrajT", bound=SampleFields)


class RolloutState(flax.struct.PyTreeNode):
    """Everything the scan carries from one step (and one ``sample()``) to the next."""

    obs: Any
    """[B, ...] observations to act on."""
    env_state: Any
    """[B, ...] env states."""
    actor: Any
    """The policy side's state, which only the step function reads: an
    :class:`ActorState` (policy keys, per-env step counts and recurrent state, as in
    the host loop), or the multi-agent scan's groups."""
    env_roots: jax.Array
    """[2, ...] the step and reset roots (raw key data)."""
    num_steps: jax.Array
    """[] uint32: steps every env has taken (they step in lockstep)."""
    episode_start: jax.Array
    """[B] bool: ``obs`` is the first observation of an episode."""
    episode_id: jax.Array
    """[B] the id of each env's current episode."""
    episode_step: jax.Array
    """[B] steps taken in the current episode."""
    episode_return: jax.Array
    """[B] reward summed over the current episode."""
    next_episode_id: jax.Array
    """[] the next free episode id."""


StepFn = Callable[[Any, Any, jax.Array, Any, jax.Array], tuple[EnvStep, Any, Any]]
"""``(actor, obs, episode_start, env_state, step_keys) -> (env_step, record, actor)``:
the policy acts on ``[B]`` envs and the envs step (no reset) with ``step_keys``;
``record`` is what the scan stacks besides the env-level fields."""


def initial_state(
    reset: Callable[[jax.Array], tuple[Any, Any]], actor: Any, seed: int, num_envs: int
) -> RolloutState:
    """Resets every env with its first-reset key (``reset(keys) -> (obs, env_state)``,
    ``[B]`` envs); pure, jit it."""
    obs, env_state = reset(first_reset_keys(seed, jnp.arange(num_envs)))
    int_dtype = jax.dtypes.canonicalize_dtype(np.int64)
    return RolloutState(
        obs=obs,
        env_state=env_state,
        actor=actor,
        env_roots=jax.random.key_data(env_roots(seed)),
        num_steps=jnp.zeros((), jnp.uint32),
        episode_start=jnp.ones(num_envs, bool),
        episode_id=jnp.arange(num_envs, dtype=int_dtype),
        episode_step=jnp.zeros(num_envs, int_dtype),
        episode_return=jnp.zeros(num_envs, jax.dtypes.canonicalize_dtype(np.float64)),
        next_episode_id=jnp.asarray(num_envs, int_dtype),
    )


def scan_envs(
    step_fn: StepFn,
    reset: Callable[[jax.Array], tuple[Any, Any]],
    num_steps: int,
    state: RolloutState,
) -> tuple[RolloutState, Any, dict[str, jax.Array], jax.Array]:
    """``num_steps`` steps of every env (pure; jit it): ``step_fn``, then the resets of
    the envs whose episode ended (``reset`` as for :func:`initial_state`) and the
    episode numbering.

    Returns:
        The new state, the stacked records ``[T, B, ...]``, the env-level fields
        ``[T, B]`` (``reward``, ``terminated``, ``truncated``, ``episode_id``, ``step``,
        ``total``: the episode's return so far) and ``ends``, a ``[2, T, B]`` float
        array: the return (``[0]``) and length (``[1]``) of each episode that ended at
        ``[t, b]`` (length 0 where none did).
    """
    env_ids = jnp.arange(state.episode_id.shape[0])

    def step(s: RolloutState, _: None) -> tuple[RolloutState, tuple[Any, dict[str, Any]]]:
        roots = keys.wrap(s.env_roots)
        key_step = env_step_keys(roots[0], s.num_steps, env_ids)
        out, record, actor = step_fn(s.actor, s.obs, s.episode_start, s.env_state, key_step)
        done = jnp.logical_or(out.terminated, out.truncated)
        obs, env_state = reset_where_done(
            done, (out.obs, out.state), reset, roots[1], s.num_steps, env_ids
        )
        total = s.episode_return + out.reward
        # New ids in env order within the step, as the host loop gives them.
        new_ids = s.next_episode_id + jnp.cumsum(done, dtype=s.episode_id.dtype)
        # Only what varies per step is stacked by the scan (each output costs a write
        # per step); the rest is derived after the loop.
        env = {
            "reward": out.reward,
            "terminated": out.terminated,
            "truncated": out.truncated,
            "episode_id": s.episode_id,
            "step": s.episode_step,
            "total": total,
        }
        new_state = RolloutState(
            obs=obs,
            env_state=env_state,
            actor=actor,
            env_roots=s.env_roots,
            num_steps=s.num_steps + 1,
            episode_start=done,
            episode_id=jnp.where(done, new_ids - 1, s.episode_id),
            episode_step=jnp.where(done, 0, s.episode_step + 1),
            episode_return=jnp.where(done, 0, total),
            next_episode_id=new_ids[-1],
        )
        return new_state, (record, env)

    state, (record, env) = jax.lax.scan(step, state, None, length=num_steps)
    done = jnp.logical_or(env["terminated"], env["truncated"])
    ends = jnp.stack(
        [
            jnp.where(done, env["total"], 0),
            jnp.where(done, env["step"] + 1, 0).astype(env["total"].dtype),
        ],
    )
    return state, record, env, ends


def rollout(
    envs: JaxVectorEnv,
    policy: Policy,
    num_steps: int,
    params: Params,
    state: RolloutState,
    env_params: Any,
    connectors: Connectors | None = None,
) -> tuple[RolloutState, Trajectory, jax.Array]:
    """``num_steps`` steps of every env (pure; jit it). With ``connectors``, they run in
    each step and, at the end, over the whole rollout (see :mod:`jaxrunner.connectors`).

    Returns:
        The new state, the :class:`Trajectory` ``[T, B, ...]`` and the ``ends`` of
        :func:`scan_envs`.
    """
    clip = jr_spaces.clip_box_actions_jax(envs.single_action_space)

    def step_fn(
        actor: ActorState, obs: Any, start: jax.Array, env_state: Any, step_keys: jax.Array
    ) -> tuple[EnvStep, dict[str, Any], ActorState]:
        action, env_action, extras, actor = act(
            policy.apply_fn, params, actor, obs, start, None, connectors
        )
        # Checked while tracing (shapes only), before the env sees the actions.
        jr_spaces.check_policy_actions(envs.single_action_space, action, envs.num_envs)
        out = envs.step(step_keys, env_state, clip(env_action), env_params)
        record = {"obs": obs, "action": action, "next_obs": out.obs, "extras": extras}
        return out, record, actor

    state, rec, env, ends = scan_envs(
        step_fn, lambda reset_keys: envs.reset(reset_keys, env_params), num_steps, state
    )
    shape = (num_steps, envs.num_envs)
    traj = Trajectory(
        obs=rec["obs"],
        action=rec["action"],
        reward=env["reward"],
        terminated=env["terminated"],
        truncated=env["truncated"],
        next_obs=rec["next_obs"],
        extras=rec["extras"],
        env_id=jnp.broadcast_to(jnp.arange(envs.num_envs, dtype=state.episode_id.dtype), shape),
        episode_id=env["episode_id"],
        step=env["step"],
    )
    if connectors is not None and connectors.per_sample:
        traj, conn = finish_sample(connectors.finish_sample, state.actor.connectors, traj)
        state = state.replace(actor=state.actor.replace(connectors=conn))
    return state, traj, ends


def finish_sample(
    finish: Callable[..., tuple], state: ConnectorsState, traj: TrajT
) -> tuple[TrajT, ConnectorsState]:
    """The connectors' per-sample part on a device trajectory (pure): ``finish`` is
    :meth:`Connectors.finish_sample` for a :class:`Trajectory`, or
    :func:`~jaxrunner._src.connectors.pipeline.finish_group_sample` for a group's."""
    extras, state = finish(
        state,
        traj.obs,
        traj.extras.get(POLICY_OBS),
        traj.next_obs,
        traj.reward,
        traj.terminated,
        traj.truncated,
        traj.valid,
    )
    return dataclasses.replace(traj, extras={**traj.extras, **extras}), state


class ScanLoop:
    """A compiled rollout and the :class:`RolloutState` it carries between samples.

    ``fn(params, state, *args) -> (state, *outputs)`` is compiled once, ahead of time,
    for ``params``, ``state`` and ``args`` of these shapes (new values never retrace);
    the state is donated to each call.
    """

    def __init__(self, fn: Callable[..., tuple], params: Any, state: RolloutState, *args: Any):
        self.state = state
        self._run = jax.jit(fn, donate_argnums=1).trace(params, state, *args).lower().compile()

    def __call__(self, params: Any, *args: Any) -> tuple:
        """One rollout: its outputs, the state kept for the next."""
        self.state, *outputs = self._run(params, self.state, *args)
        return tuple(outputs)


def episode_counts(ends: np.ndarray, window: int, num_env_steps: int) -> SampleCounts:
    """What a rollout adds to the metrics, from its ``ends`` (see :func:`scan_envs`, on
    the host): the episodes that ended, the latest ``window`` at least, in step order
    then env order (as the host loop)."""
    num_episodes = int(np.count_nonzero(ends[1]))
    # The metrics keep the latest episodes only: read the last steps that hold them
    # (a mask over every step cost another ~0.1 ms at 8 x 4096).
    first, held = len(ends[1]), 0
    while first > 0 and held < window:
        first -= 1
        held += np.count_nonzero(ends[1, first])
    returns, lengths = ends[0, first:], ends[1, first:]
    mask = lengths > 0  # row-major: step order, then env order
    return SampleCounts(
        num_env_steps=num_env_steps,
        num_faulty_episodes=0,
        num_dropped_steps=0,
        returns=returns[mask].astype(np.float64),
        lengths=lengths[mask].astype(np.int64),
        num_episodes=num_episodes,
    )


class ScanSampler(Sampler):
    """Runs :func:`rollout` for an :class:`~jaxrunner.EnvRunner` on a JaxVectorEnv.

    ``sample()`` returns device arrays. Perf timers stay 0: policy and env run fused,
    with no phase to time apart.

    Args:
        envs: the pure-JAX vector env.
        setup: the policy, params, rollout length, seed and metrics.

    Raises:
        SpaceMismatchError: the policy's actions do not fit the action space.
    """

    def __init__(self, envs: JaxVectorEnv, setup: SamplerSetup) -> None:
        policy, rollout_length, seed = setup.policy, setup.rollout_length, setup.seed
        self.envs, self.rollout_length, self.metrics = envs, rollout_length, setup.metrics
        self._env_params = jax.device_put(envs.params)
        connectors, num_envs = setup.connectors, envs.num_envs

        def start(env_params: Any) -> RolloutState:
            actor = initial_actor_state(
                policy, seed, np.arange(num_envs), connectors, envs.single_observation_space
            )
            return initial_state(lambda k: envs.reset(k, env_params), actor, seed, num_envs)

        run = functools.partial(rollout, envs, policy, rollout_length, connectors=connectors)
        state = jax.jit(start)(self._env_params)
        self._loop = ScanLoop(run, setup.params, state, self._env_params)
        self.action_spec = None  # checked against the action space while tracing

    def sample(self, params: Params) -> Trajectory:
        """One rollout; the returns and lengths of the episodes that ended, in step
        order then env order, go to the metrics (the sample's one transfer)."""
        start_time = time.perf_counter()
        traj, ends = self._loop(params, self._env_params)
        # The one transfer of a sample(), allowed by name; a view where the device is
        # the host CPU (device_get copied it: ~0.1 ms a sample at 8 x 4096).
        with jax.transfer_guard_device_to_host("allow"):
            ends = np.asarray(ends)
        num_env_steps = self.rollout_length * self.envs.num_envs
        self.metrics.add(episode_counts(ends, self.metrics.episodes.window, num_env_steps))
        self.metrics.sample_time_s += time.perf_counter() - start_time
        return traj

    def get_connector_state(self) -> ConnectorsState:
        """The connectors' state (a host copy): the statistics the next sample uses."""
        return jax.device_get(self._loop.state.actor.connectors)

    def set_connector_state(self, state: ConnectorsState) -> None:
        """Replaces the connectors' state (shapes as :meth:`get_connector_state`'s)."""
        actor = self._loop.state.actor.replace(connectors=device_copy(state))
        self._loop.state = self._loop.state.replace(actor=actor)

    def get_state(self) -> dict[str, Any]:
        """The whole rollout state, env states included (always restorable exactly)."""
        return {"rollout": self._loop.state}

    def set_state(self, state: dict[str, Any]) -> None:
        self._loop.state = state["rollout"]


def check_runner_options(callbacks: Any, num_splits: int | None) -> None:
    """Options of the host loop that a scan cannot honour."""
    if callbacks is not None:
        raise InvalidArgumentError(
            "EnvRunner(callbacks=...): callbacks run Python per env step, which a JaxVectorEnv "
            "rollout (one compiled lax.scan) cannot do. Drop them and read the Trajectory, or "
            "use a host vector env (jaxrunner.make_vec)."
        )
    if num_splits not in (None, 1):
        raise InvalidArgumentError(
            f"EnvRunner(num_splits={num_splits!r}): pipelining groups only applies to host vector "
            "envs; a JaxVectorEnv rollout is one compiled program. Leave num_splits=None."
        )


__all__ = [
    "RolloutState",
    "ScanLoop",
    "ScanSampler",
    "StepFn",
    "check_runner_options",
    "episode_counts",
    "finish_sample",
    "initial_state",
    "rollout",
    "scan_envs",
]

"""The scan sampler: policy, env, autoreset and bookkeeping in one jitted ``lax.scan``,
for a :class:`~jaxrunner.JaxVectorEnv`. See docs/backends/jax.md."""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.functional_env import EnvStep
from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.connectors.pipeline import (
    Connectors,
    ConnectorsState,
)
from jaxrunner._src.connectors.state_rows import device_copy
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.core.trajectory import Trajectory
from jaxrunner._src.samplers.policy_step import ActorState, act, initial_actor_state
from jaxrunner._src.samplers.sampler import Sampler, SamplerSetup, StepProgress
from jaxrunner._src.samplers.scan_loop import (
    RolloutState,
    ScanLoop,
    episode_counts,
    finish_sample,
    initial_state,
    scan_envs,
)
from jaxrunner.errors import InvalidArgumentError


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
        :func:`~.scan_loop.scan_envs`.
    """
    clip = space_arrays.clip_box_actions_jax(envs.single_action_space)

    def step_fn(
        actor: ActorState, obs: Any, start: jax.Array, env_state: Any, step_keys: jax.Array
    ) -> tuple[EnvStep, dict[str, Any], ActorState]:
        action, env_action, extras, actor = act(
            policy.apply_fn, params, actor, obs, start, None, connectors
        )
        # Checked while tracing (shapes only), before the env sees the actions.
        space_arrays.check_policy_actions(envs.single_action_space, action, envs.num_envs)
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

    def sample(self, params: Params, progress: StepProgress | None = None) -> Trajectory:
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

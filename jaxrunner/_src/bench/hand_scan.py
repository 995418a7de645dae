"""The pure-JAX hand loop: what a user writes with gymnax, jaxrunner's reference for
pure-JAX envs (``JaxVectorEnv``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner.models import mlp_policy


def build_hand_scan(
    num_envs: int, rollout_length: int, seed: int, env_id: str = "CartPole-v1"
) -> Callable[[], int]:
    """One jitted ``lax.scan`` over ``vmap(env.step)`` (gymnax's auto-resetting step,
    keys from ``split``) with the benchmark MLP, recording obs, action, reward,
    terminated, truncated, the final observation (``info["final_observation"]``) and
    the log-prob on device; no episode ids, step indices or statistics. Returns
    ``rollout() -> env steps done`` (it waits for the scan to finish).
    """
    import gymnax  # type: ignore[import-not-found]  # an optional extra

    env, env_params = gymnax.make(env_id)
    spaces = JaxVectorEnv(env, env_params, 1)
    policy = mlp_policy(spaces.single_action_space)
    params = policy.init(jax.random.key(seed), spaces.single_observation_space)
    step_envs = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def rollout(params: Any, carry: Any) -> tuple[Any, Any]:
        def step(carry: Any, _: None) -> tuple[Any, Any]:
            obs, state, key = carry
            key, act_key, env_key = jax.random.split(key, 3)
            action, extras, _ = policy.apply_fn(
                params, obs, None, jax.random.split(act_key, num_envs)
            )
            next_obs, state, reward, terminated, truncated, info = step_envs(
                jax.random.split(env_key, num_envs), state, action, env_params
            )
            transition = (
                obs,
                action,
                reward,
                terminated,
                truncated,
                info["final_observation"],
                extras["log_prob"],
            )
            return (next_obs, state, key), transition

        return jax.lax.scan(step, carry, None, rollout_length)

    key, reset_key = jax.random.split(jax.random.key(seed))
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(reset_key, num_envs), env_params
    )
    carry = (obs, state, key)
    compiled = jax.jit(rollout, donate_argnums=1)

    def run() -> int:
        nonlocal carry
        carry, traj = compiled(params, carry)
        jax.block_until_ready(traj)
        return rollout_length * num_envs

    return run

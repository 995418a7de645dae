"""Brax-style envs (unbatched, not auto-resetting) as a ``FunctionalEnv``, for
:meth:`JaxVectorEnv.from_brax <jaxrunner.JaxVectorEnv.from_brax>`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner._src.backends.functional_env import EnvStep, FunctionalEnv, env_step
from jaxrunner.errors import InvalidArgumentError


def brax_functions(env: Any) -> FunctionalEnv:
    """:class:`FunctionalEnv` of a brax-style env. The env state is brax's whole
    ``State``; ``truncated = info["truncation"]`` (False if absent) and
    ``terminated = done & ~truncated`` (brax's ``EpisodeWrapper`` sets ``truncation``
    only where the time limit, not a terminal state, ended the episode)."""

    def reset(key: jax.Array, params: Any) -> tuple[Any, Any]:
        del params
        state = env.reset(key)
        return state.obs, state

    def step(key: jax.Array, state: Any, action: Any, params: Any) -> EnvStep:
        del key, params  # brax steps are deterministic
        state = env.step(state, action)
        info = state.info if isinstance(state.info, dict) else {}
        truncated = jnp.asarray(info.get("truncation", False)) > 0
        terminated = jnp.logical_and(jnp.asarray(state.done) > 0, jnp.logical_not(truncated))
        return env_step(state.obs, state, state.reward, terminated, truncated)

    return FunctionalEnv(reset=reset, step=step)


def check_brax_wrappers(env: Any) -> None:
    """Refuses brax wrappers that would hide episode ends or batch the env already."""
    layer: Any = env
    while layer is not None:
        name = type(layer).__name__
        if name == "AutoResetWrapper" or "Vmap" in name:
            raise InvalidArgumentError(
                f"JaxVectorEnv.from_brax(env=...): the env is wrapped in brax's {name}. "
                "jaxrunner batches the env itself and resets ended episodes with a fresh random "
                "reset (AutoResetWrapper restores one cached first state and hides final "
                "observations). Pass the env with at most brax's EpisodeWrapper, e.g. "
                "brax.envs.create(name, auto_reset=False, batch_size=None)."
            )
        layer = vars(layer).get("env") if hasattr(layer, "__dict__") else None


def brax_spaces(
    env: Any,
    functions: FunctionalEnv,
    observation_space: spaces.Space | None,
    action_space: spaces.Space | None,
) -> tuple[spaces.Space, spaces.Space]:
    """The spaces of a brax-style env: those given, else observations ``Box(-inf, inf)``
    shaped as ``reset`` returns them and brax's ``Box(-1, 1, (action_size,), float32)`` actions."""
    if observation_space is None:
        obs = jax.eval_shape(functions.reset, jax.random.key(0), None)[0]
        observation_space = jax.tree.map(
            lambda o: spaces.Box(-np.inf, np.inf, tuple(o.shape), np.dtype(o.dtype)), obs
        )
        if not isinstance(observation_space, spaces.Box):
            raise InvalidArgumentError(
                "JaxVectorEnv.from_brax: the env's observations are not one array; pass "
                "observation_space= (a gymnasium Dict/Tuple space)."
            )
    if action_space is None:
        if not hasattr(env, "action_size"):
            raise InvalidArgumentError(
                "JaxVectorEnv.from_brax: the env has no action_size; pass action_space=."
            )
        action_space = spaces.Box(-1.0, 1.0, (int(env.action_size),), np.float32)
    return observation_space, action_space

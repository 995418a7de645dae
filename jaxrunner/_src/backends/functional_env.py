"""One env as a pair of pure functions (:class:`FunctionalEnv`), and its adapters for
gymnax, functional and brax-style envs. See docs/backends/jax.md."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


class EnvStep(NamedTuple):
    """What :attr:`FunctionalEnv.step` returns (for one env, or batched ``[B]``)."""

    obs: Any
    """The true next observation (never a reset one)."""
    state: Any
    """The env state after the step."""
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array


@dataclasses.dataclass(frozen=True)
class FunctionalEnv:
    """One env as two pure, jittable functions, neither auto-resetting:
    ``reset(key, params) -> (obs, state)``, ``step(key, state, action, params)``."""

    reset: Callable[[jax.Array, Any], tuple[Any, Any]]
    step: Callable[[jax.Array, Any, Any, Any], EnvStep]


def _defines(env: Any, name: str) -> bool:
    """Whether ``env``'s class (not a ``__getattr__`` forward) defines method ``name``."""
    return any(name in vars(cls) for cls in type(env).__mro__)


def _time_limit(state: Any, params: Any, info: Any) -> jax.Array:
    """Truncation of a done-only step: ``info["truncation"]``, else the gymnax time
    limit ``state.time >= params.max_steps_in_episode`` where both exist, else False."""
    if isinstance(info, dict) and "truncation" in info:
        return jnp.asarray(info["truncation"]).astype(bool)
    if hasattr(state, "time") and hasattr(params, "max_steps_in_episode"):
        return jnp.asarray(state.time >= params.max_steps_in_episode)
    return jnp.asarray(False)


def env_step(obs: Any, state: Any, reward: Any, terminated: Any, truncated: Any) -> EnvStep:
    """An :class:`EnvStep` with the reward as a float (float64 under x64) and bool flags."""
    return EnvStep(
        obs,
        state,
        jnp.asarray(reward).astype(jax.dtypes.canonicalize_dtype(np.float64)),
        jnp.asarray(terminated).astype(bool),
        jnp.asarray(truncated).astype(bool),
    )


def from_done_only(obs: Any, state: Any, reward: Any, done: Any, info: Any, params: Any) -> EnvStep:
    """The :class:`EnvStep` of a done-only step: ``truncated`` from :func:`_time_limit`,
    ``terminated = done & ~truncated``."""
    truncated = _time_limit(state, params, info)
    terminated = jnp.logical_and(jnp.asarray(done).astype(bool), jnp.logical_not(truncated))
    return env_step(obs, state, reward, terminated, truncated)


def gymnax_functions(env: Any) -> FunctionalEnv:
    """:class:`FunctionalEnv` of a gymnax environment, via ``reset_env``/``step_env``
    (gymnax's own ``step`` auto-resets, which would lose the final observation)."""
    new_api = hasattr(env, "is_truncated")

    def step(key: jax.Array, state: Any, action: Any, params: Any) -> EnvStep:
        obs, state, reward, flag, info = env.step_env(key, state, action, params)
        if new_api:
            # gymnax >= 1.0: step_env's flag is `terminated`; the time limit is separate.
            return env_step(obs, state, reward, flag, env.is_truncated(state, params))
        return from_done_only(obs, state, reward, flag, info, params)

    return FunctionalEnv(reset=env.reset_env, step=step)


def functional_functions(env: Any) -> FunctionalEnv:
    """:class:`FunctionalEnv` of an env with ``reset(key, params)`` and a non-auto-
    resetting ``step(key, state, action, params)`` returning 6 or 5 items."""

    def step(key: jax.Array, state: Any, action: Any, params: Any) -> EnvStep:
        out = env.step(key, state, action, params)
        if not isinstance(out, tuple) or len(out) not in (5, 6):
            raise InvalidArgumentError(
                f"JaxVectorEnv: {type(env).__name__}.step(key, state, action, params) returned "
                f"{type(out).__name__} of length {len(out) if isinstance(out, tuple) else '?'}; "
                "expected (obs, state, reward, terminated, truncated, info) or the done-only "
                "(obs, state, reward, done, info)."
            )
        if len(out) == 6:
            return env_step(*out[:5])
        obs, state, reward, done, info = out
        return from_done_only(obs, state, reward, done, info, params)

    return FunctionalEnv(reset=env.reset, step=step)


def functions_of(env: Any) -> FunctionalEnv:
    """The :class:`FunctionalEnv` of a gymnax env or a functional env (see the module
    docstring); a gymnax wrapper is refused (it auto-resets in ``step``)."""
    if _defines(env, "step_env") and _defines(env, "reset_env"):
        return gymnax_functions(env)
    if hasattr(env, "step_env"):
        raise InvalidArgumentError(
            f"JaxVectorEnv(env=...): {type(env).__name__} forwards step_env to a wrapped "
            "env but transforms reset/step (a gymnax wrapper). Wrappers auto-reset inside "
            "step and hide the final observation; pass the unwrapped gymnax env (jaxrunner "
            "resets episodes itself and logs returns in its metrics)."
        )
    if callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None)):
        return functional_functions(env)
    raise InvalidArgumentTypeError(
        f"JaxVectorEnv(env=...): expected a gymnax env or an object with reset(key, params) "
        f"and step(key, state, action, params), got {type(env).__name__}. For brax envs use "
        "JaxVectorEnv.from_brax(env, num_envs)."
    )


def to_gymnasium_space(
    space: Any, where: str = "space", caller: str = "to_gymnasium_space"
) -> spaces.Space:
    """A gymnasium space equal to a gymnax or JaxMARL (or duck-typed) space: ``Discrete``
    (has ``n``), ``MultiDiscrete`` (has ``num_categories``), ``Box`` (has
    ``low``/``high``/``shape``; ``dtype`` float32 if absent), ``Dict`` or ``Tuple``; a
    gymnasium space as it is. ``caller`` opens the refusal."""
    if isinstance(space, spaces.Space):
        return space
    inner = getattr(space, "spaces", None)
    if isinstance(inner, dict):
        return spaces.Dict(
            {k: to_gymnasium_space(v, f"{where}[{k!r}]", caller) for k, v in inner.items()}
        )
    if isinstance(inner, (list, tuple)):
        return spaces.Tuple(
            [to_gymnasium_space(v, f"{where}[{j}]", caller) for j, v in enumerate(inner)]
        )
    if hasattr(space, "n") and not hasattr(space, "low"):
        return spaces.Discrete(int(space.n))
    if hasattr(space, "num_categories"):  # JaxMARL's MultiDiscrete (e.g. switch_riddle's)
        nvec = np.asarray(space.num_categories)
        return spaces.MultiDiscrete(nvec, dtype=np.dtype(getattr(space, "dtype", np.int64)))
    if all(hasattr(space, a) for a in ("low", "high", "shape")):
        # A JaxMARL Box may give its shape as one int (e.g. Hanabi's): a 1-D shape.
        shape = tuple(np.atleast_1d(space.shape).astype(int).tolist())
        dtype = np.dtype(getattr(space, "dtype", np.float32))
        bounds = [np.asarray(space.low), np.asarray(space.high)]
        if dtype.kind in "iu":  # a bound the dtype cannot hold would wrap, or raise raw
            info = np.iinfo(dtype.name)
            if any(b.size and (b.min() < info.min or b.max() > info.max) for b in bounds):
                raise InvalidArgumentError(
                    f"{caller}: {where} is a Box of dtype {dtype}, which holds "
                    f"[{info.min}, {info.max}], with bounds outside it (low {space.low!r:.40}, "
                    f"high {space.high!r:.40}); fix the env's space. For a gymnax env, pass "
                    "observation_space=/action_space= as gymnasium spaces."
                )
        low, high = (np.broadcast_to(b.astype(dtype), shape) for b in bounds)
        return spaces.Box(low, high, shape, dtype)
    raise InvalidArgumentTypeError(
        f"{caller}: cannot convert {where} ({space!r:.80}) to a gymnasium space; "
        "expected a Discrete (with n), a MultiDiscrete (with num_categories), a Box (with "
        "low, high, shape, dtype), or a Dict or Tuple of them. For a gymnax env, pass "
        "observation_space=/action_space= as gymnasium spaces."
    )


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

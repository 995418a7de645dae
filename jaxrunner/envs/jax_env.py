"""Pure-JAX vector envs: functional (gymnax-style) and brax-style envs, batched with vmap.

A :class:`JaxVectorEnv` holds no mutable state. It is a description: a pair of pure
functions for ONE env (:class:`FunctionalEnv`: reset and step, never auto-resetting),
the env params, the number of envs and the spaces. Given one, :class:`~jaxrunner.EnvRunner`
compiles policy, env, autoreset and bookkeeping into one ``lax.scan`` per ``sample()``
(:mod:`jaxrunner.sampling.scan`), so the runner, not the env, resets ended episodes: it keeps
the true final observation and draws a fresh random reset for every new episode.

Three kinds of env are accepted:

* **gymnax environments** (a class that defines ``step_env`` and ``reset_env``, as
  every ``gymnax.environments.environment.Environment``). Their auto-resetting
  ``step`` is bypassed: jaxrunner calls ``step_env``/``reset_env``, which return the
  true next observation. ``terminated`` and ``truncated`` are derived as gymnax's
  own ``step`` derives them: where the env has ``is_truncated`` (gymnax >= 1.0),
  ``step_env``'s flag is ``terminated`` and ``is_truncated(state, params)`` is
  ``truncated``. Older gymnax envs return one ``done`` flag that includes the time
  limit; then ``truncated`` is ``info["truncation"]`` if the env reports it, else
  ``state.time >= params.max_steps_in_episode`` when both fields exist (else False),
  and ``terminated = done & ~truncated``. (So in the old form, a natural end that
  falls exactly on the time limit reads as a truncation: the old API cannot tell.)
  gymnax wrappers (``LogWrapper`` and co.) forward ``step_env`` to the wrapped env
  and auto-reset in ``step``: they are refused with an explanation.
* **functional envs** with ``reset(key, params) -> (obs, state)`` and
  ``step(key, state, action, params) -> (obs, state, reward, terminated, truncated,
  info)``, or the done-only form ``(obs, state, reward, done, info)`` (truncation
  read as for old gymnax). ``step`` must NOT auto-reset: ``obs`` is the true next
  observation.
* **brax-style envs** through :meth:`JaxVectorEnv.from_brax`: ``reset(rng) -> State``
  and ``step(state, action) -> State`` with ``obs``, ``reward``, ``done`` and
  ``info["truncation"]`` (brax's ``EpisodeWrapper`` sets it).

Randomness: env ``i`` draws from its own key stream (see :mod:`jaxrunner.sampling.scan`),
independent of the policy's keys, of the batch size and of the other envs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner import spaces as jr_spaces
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError, SpaceMismatchError


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
    """One env as two pure, jittable functions. Neither auto-resets.

    Attributes:
        reset: ``(key, params) -> (obs, state)``.
        step: ``(key, state, action, params) -> EnvStep``.
    """

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


def _env_step(obs: Any, state: Any, reward: Any, terminated: Any, truncated: Any) -> EnvStep:
    return EnvStep(
        obs,
        state,
        jnp.asarray(reward).astype(jax.dtypes.canonicalize_dtype(np.float64)),
        jnp.asarray(terminated).astype(bool),
        jnp.asarray(truncated).astype(bool),
    )


def _from_done_only(obs: Any, state: Any, reward: Any, done: Any, info: Any, params: Any):
    truncated = _time_limit(state, params, info)
    terminated = jnp.logical_and(jnp.asarray(done).astype(bool), jnp.logical_not(truncated))
    return _env_step(obs, state, reward, terminated, truncated)


def gymnax_functions(env: Any) -> FunctionalEnv:
    """:class:`FunctionalEnv` of a gymnax environment, via ``reset_env``/``step_env``
    (gymnax's own ``step`` auto-resets, which would lose the final observation)."""
    new_api = hasattr(env, "is_truncated")

    def step(key: jax.Array, state: Any, action: Any, params: Any) -> EnvStep:
        obs, state, reward, flag, info = env.step_env(key, state, action, params)
        if new_api:
            # gymnax >= 1.0: step_env's flag is `terminated`; the time limit is separate.
            return _env_step(obs, state, reward, flag, env.is_truncated(state, params))
        return _from_done_only(obs, state, reward, flag, info, params)

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
            return _env_step(*out[:5])
        return _from_done_only(*out, params)

    return FunctionalEnv(reset=env.reset, step=step)


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
        return _env_step(state.obs, state, state.reward, terminated, truncated)

    return FunctionalEnv(reset=reset, step=step)


def _check_brax_wrappers(env: Any) -> None:
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


def from_gymnax_space(space: Any, where: str = "space") -> spaces.Space:
    """A gymnasium space equal to a gymnax (or duck-typed) space: ``Discrete`` (has
    ``n``), ``Box`` (has ``low``/``high``/``shape``), ``Dict`` or ``Tuple``."""
    if isinstance(space, spaces.Space):
        return space
    inner = getattr(space, "spaces", None)
    if isinstance(inner, dict):
        return spaces.Dict({k: from_gymnax_space(v, f"{where}[{k!r}]") for k, v in inner.items()})
    if isinstance(inner, (list, tuple)):
        return spaces.Tuple([from_gymnax_space(v, f"{where}[{j}]") for j, v in enumerate(inner)])
    if hasattr(space, "n") and not hasattr(space, "low"):
        return spaces.Discrete(int(space.n))
    if all(hasattr(space, a) for a in ("low", "high", "shape", "dtype")):
        shape = tuple(space.shape)
        dtype = np.dtype(space.dtype)
        low = np.broadcast_to(np.asarray(space.low, dtype=dtype), shape)
        high = np.broadcast_to(np.asarray(space.high, dtype=dtype), shape)
        return spaces.Box(low, high, shape, dtype)
    raise InvalidArgumentTypeError(
        f"JaxVectorEnv: cannot convert {where} ({space!r:.80}) to a gymnasium space; pass "
        "observation_space=/action_space= as gymnasium spaces."
    )


class JaxVectorEnv:
    """``num_envs`` copies of a pure-JAX env, for :class:`~jaxrunner.EnvRunner`.

    Args:
        env: a gymnax environment or a functional env (see the module docstring).
            For brax-style envs use :meth:`from_brax`.
        env_params: the params passed to every ``reset``/``step`` call (``None``: the
            env's ``default_params`` if it has them).
        num_envs: B, the number of envs stepped in lockstep.
        observation_space: a single env's observation space (gymnasium). Default:
            converted from ``env.observation_space(env_params)``.
        action_space: a single env's action space (gymnasium). Default: converted from
            ``env.action_space(env_params)``.

    Raises:
        SpaceMismatchError: ``reset`` returns observations that differ in structure,
            shape or dtype from the observation space (checked by tracing, no compute).
    """

    def __init__(
        self,
        env: Any,
        env_params: Any = None,
        num_envs: int = 1,
        *,
        observation_space: spaces.Space | None = None,
        action_space: spaces.Space | None = None,
        functions: FunctionalEnv | None = None,
    ) -> None:
        if (
            isinstance(num_envs, bool)
            or not isinstance(num_envs, (int, np.integer))
            or (num_envs < 1)
        ):
            raise InvalidArgumentError(
                f"JaxVectorEnv(num_envs=...): expected an int >= 1, got {num_envs!r}."
            )
        if functions is None:
            functions = self._functions_of(env)
        if env_params is None:
            env_params = getattr(env, "default_params", None)
        self.env = env
        self.functions = functions
        self.params = env_params
        self.num_envs = int(num_envs)
        self.single_observation_space = self._space(
            observation_space, env, "observation_space", env_params
        )
        self.single_action_space = self._space(action_space, env, "action_space", env_params)
        for name, space in (
            ("observation_space", self.single_observation_space),
            ("action_space", self.single_action_space),
        ):
            jr_spaces.check_supported(space, f"JaxVectorEnv {name}")
        self.observation_space = gymnasium.vector.utils.batch_space(
            self.single_observation_space, self.num_envs
        )
        self.action_space = gymnasium.vector.utils.batch_space(
            self.single_action_space, self.num_envs
        )
        self._check_reset_obs()

    @classmethod
    def from_brax(
        cls,
        env: Any,
        num_envs: int,
        *,
        observation_space: spaces.Space | None = None,
        action_space: spaces.Space | None = None,
    ) -> JaxVectorEnv:
        """Adapts a brax-style env (``reset(rng) -> State``, ``step(state, action) ->
        State``; an unbatched env without ``AutoResetWrapper``).

        Default spaces: observations ``Box(-inf, inf)`` of the shape and dtype ``reset``
        returns; actions ``Box(-1, 1, (env.action_size,), float32)`` (brax's convention).
        """
        _check_brax_wrappers(env)
        functions = brax_functions(env)
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
        return cls(
            env,
            None,
            num_envs,
            observation_space=observation_space,
            action_space=action_space,
            functions=functions,
        )

    # -- batched pure functions (used inside jit) ---------------------------------------

    def reset(self, keys: jax.Array, params: Any) -> tuple[Any, Any]:
        """Resets B envs, env ``i`` with ``keys[i]``: ``(obs [B, ...], state [B, ...])``."""
        return jax.vmap(self.functions.reset, in_axes=(0, None))(keys, params)

    def step(self, keys: jax.Array, state: Any, action: Any, params: Any) -> EnvStep:
        """Steps B envs (no reset): an :class:`EnvStep` of ``[B, ...]`` arrays."""
        return jax.vmap(self.functions.step, in_axes=(0, 0, 0, None))(keys, state, action, params)

    def close(self) -> None:
        """Nothing to release (kept for the vector-env interface)."""

    def __enter__(self) -> JaxVectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JaxVectorEnv({type(self.env).__name__}, num_envs={self.num_envs})"

    # -- construction helpers ----------------------------------------------------------

    @staticmethod
    def _functions_of(env: Any) -> FunctionalEnv:
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

    @staticmethod
    def _space(given: spaces.Space | None, env: Any, name: str, params: Any) -> spaces.Space:
        if given is not None:
            if not isinstance(given, spaces.Space):
                raise InvalidArgumentTypeError(
                    f"JaxVectorEnv({name}=...): expected a gymnasium space, got "
                    f"{type(given).__name__}."
                )
            return given
        method = getattr(env, name, None)
        if not callable(method):
            raise InvalidArgumentError(
                f"JaxVectorEnv: {type(env).__name__} has no {name}(params) method; pass "
                f"{name}= (a gymnasium space for one env)."
            )
        return from_gymnax_space(method(params), name)

    def _check_reset_obs(self) -> None:
        """Invariant 6: the env's observations have the space's structure, shapes and
        dtypes (dtypes as JAX stores them: float64 spaces are float32 without x64)."""
        space = self.single_observation_space
        obs = jax.eval_shape(self.functions.reset, jax.random.key(0), self.params)[0]
        expected = jr_spaces.allocate(space, ())

        def check(exp: np.ndarray, got: Any) -> None:
            want = jax.dtypes.canonicalize_dtype(exp.dtype)
            if tuple(got.shape) != exp.shape or np.dtype(got.dtype) != want:
                raise jr_spaces.mismatch(
                    f"JaxVectorEnv: {type(self.env).__name__}'s reset returns observations",
                    f"dtype {want} and shape {exp.shape} (the observation space {space})",
                    got,
                    "Pass a matching observation_space=, or make the env return what its "
                    "space declares.",
                )

        try:
            jr_spaces.map_structure(space, check, expected, obs)
        except (KeyError, IndexError, TypeError, AttributeError) as err:
            raise SpaceMismatchError(
                f"JaxVectorEnv: the structure of {type(self.env).__name__}'s observations "
                f"({jax.tree.structure(obs)}) does not match the observation space {space}."
            ) from err


__all__ = [
    "EnvStep",
    "FunctionalEnv",
    "JaxVectorEnv",
    "brax_functions",
    "from_gymnax_space",
    "functional_functions",
    "gymnax_functions",
]

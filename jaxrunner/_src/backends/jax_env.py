""":class:`JaxVectorEnv`: pure-JAX envs batched with vmap, sampled in one ``lax.scan``.
See docs/backends/jax.md."""

from __future__ import annotations

from typing import Any

import gymnasium
import jax
import numpy as np
from gymnasium import spaces

from jaxrunner._src import space_arrays
from jaxrunner._src.arg_checks import check_int
from jaxrunner._src.backends.brax_adapter import brax_functions, brax_spaces, check_brax_wrappers
from jaxrunner._src.backends.functional_env import (
    EnvStep,
    FunctionalEnv,
    from_gymnax_space,
    functions_of,
)
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError, SpaceMismatchError


class JaxVectorEnv:
    """``num_envs`` copies of a pure-JAX env, for :class:`~jaxrunner.EnvRunner`.

    Args:
        env: a gymnax environment or a functional env (see docs/backends/jax.md).
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

    multi_agent = False
    """The kind of env (see ``BaseVectorEnv.multi_agent``): one agent."""

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
        check_int("JaxVectorEnv", "num_envs", num_envs)
        if functions is None:
            functions = functions_of(env)
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
            space_arrays.check_supported(space, f"JaxVectorEnv {name}")
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
        check_brax_wrappers(env)
        functions = brax_functions(env)
        observation_space, action_space = brax_spaces(
            env, functions, observation_space, action_space
        )
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

    def get_sub_environments(self) -> list[Any]:
        """Refused: the envs are one env's pure functions vmapped over a batch of states,
        with no per-env Python object."""
        raise InvalidArgumentError(
            "JaxVectorEnv.get_sub_environments(): a pure-JAX vector env has no per-env "
            "objects (one env's functions are vmapped over a batch of states held by the "
            "runner's compiled scan; .env is the one env object, shared by all). For "
            "per-sub-env access use a gymnasium env with make_vec(..., backend='sync')."
        )

    def __enter__(self) -> JaxVectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JaxVectorEnv({type(self.env).__name__}, num_envs={self.num_envs})"

    # -- construction helpers ----------------------------------------------------------

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
        expected = space_arrays.allocate(space, ())

        def check(exp: np.ndarray, got: Any) -> None:
            want = jax.dtypes.canonicalize_dtype(exp.dtype)
            if tuple(got.shape) != exp.shape or np.dtype(got.dtype) != want:
                raise space_arrays.mismatch(
                    f"JaxVectorEnv: {type(self.env).__name__}'s reset returns observations",
                    f"dtype {want} and shape {exp.shape} (the observation space {space})",
                    got,
                    "Pass a matching observation_space=, or make the env return what its "
                    "space declares.",
                )

        try:
            space_arrays.map_structure(space, check, expected, obs)
        except (KeyError, IndexError, TypeError, AttributeError) as err:
            raise SpaceMismatchError(
                f"JaxVectorEnv: the structure of {type(self.env).__name__}'s observations "
                f"({jax.tree.structure(obs)}) does not match the observation space {space}."
            ) from err

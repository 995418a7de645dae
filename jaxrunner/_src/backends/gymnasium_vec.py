"""``make_vec(env_id, n, backend="gymnasium")``: gymnasium's own ``make_vec``, in the
env's own vectorization where it has one, adopted by
:class:`~jaxrunner._src.backends.gymnasium_adapter.GymnasiumVectorEnv`."""

from __future__ import annotations

from typing import Any

import gymnasium
from gymnasium.vector import AutoresetMode

from jaxrunner._src.backends.env_api import with_namespace_hint
from jaxrunner._src.backends.gymnasium_adapter import GymnasiumVectorEnv
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


def make_gymnasium_vec(
    env_id: str,
    num_envs: int,
    vectorization_mode: str | gymnasium.VectorizeMode | None = None,
    vector_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> GymnasiumVectorEnv:
    """``gymnasium.make_vec(env_id, num_envs, vectorization_mode, ...)``, adopted.
    ``vectorization_mode`` None: the env's own vector implementation where it has one,
    else ``"sync"``; Sync/AsyncVectorEnv default to SAME_STEP here (no masked resets)."""
    if not isinstance(env_id, str):
        raise InvalidArgumentTypeError(
            f"make_vec(env=..., backend='gymnasium'): expected a registered gymnasium id "
            f"(gymnasium.make_vec needs one), got {type(env_id).__name__}. Use backend='sync' "
            "for a factory, or adopt your own vector env with jaxrunner.from_gymnasium()."
        )
    try:
        mode = None if vectorization_mode is None else gymnasium.VectorizeMode(vectorization_mode)
    except ValueError as err:
        raise InvalidArgumentError(
            f"make_vec(backend='gymnasium', vectorization_mode={vectorization_mode!r}): expected "
            f"one of {[m.value for m in gymnasium.VectorizeMode]} (or None for the env's own "
            "vector implementation where it has one)."
        ) from err
    if mode is None:
        try:
            spec = gymnasium.spec(env_id)
        except gymnasium.error.NamespaceNotFound as err:
            raise with_namespace_hint(err, env_id) from err
        has_own = spec.vector_entry_point is not None
        mode = (
            gymnasium.VectorizeMode.VECTOR_ENTRY_POINT if has_own else gymnasium.VectorizeMode.SYNC
        )
    if mode != gymnasium.VectorizeMode.VECTOR_ENTRY_POINT:
        vector_kwargs = {"autoreset_mode": AutoresetMode.SAME_STEP, **(vector_kwargs or {})}
    try:
        env = gymnasium.make_vec(
            env_id, num_envs, vectorization_mode=mode, vector_kwargs=vector_kwargs, **kwargs
        )
    except gymnasium.error.NamespaceNotFound as err:
        raise with_namespace_hint(err, env_id) from err
    return GymnasiumVectorEnv(env)

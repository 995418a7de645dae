"""Vector-env backends and ``make_vec``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium

from jaxrunner.envs.base import BatchStep, VectorEnv
from jaxrunner.envs.envpool_adapter import EnvPoolVectorEnv, make_envpool_vec
from jaxrunner.envs.gymnasium_adapter import GymnasiumVectorEnv, from_gymnasium, make_gymnasium_vec
from jaxrunner.envs.process import ProcessVectorEnv
from jaxrunner.envs.ray_env import RAY_OPTIONS, RayEnvConfig, RayVectorEnv
from jaxrunner.envs.sync import SyncVectorEnv
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

BACKENDS = ("sync", "gymnasium", "process", "envpool", "ray")
_PROCESS_OPTIONS = ("envs_per_worker", "num_workers", "start_method", "step_timeout_s")


def make_vec(
    env: str | Callable[[], gymnasium.Env],
    num_envs: int,
    backend: str = "sync",
    seed: int | None = None,
    **env_kwargs: Any,
) -> VectorEnv:
    """Builds a vector env of ``num_envs`` sub-envs.

    Args:
        env: a gymnasium id (made with ``gymnasium.make(env, **env_kwargs)``) or a
            zero-argument callable returning a ``gymnasium.Env``.
        num_envs: number of sub-envs (>= 1).
        backend: where the sub-envs run; one of ``BACKENDS``.
        seed: if given, the envs are reset now with sub-env ``i`` seeded ``seed + i``.
        **env_kwargs: keyword arguments for ``gymnasium.make`` (ids only). With
            ``backend="gymnasium"``: for ``gymnasium.make_vec``, ``vectorization_mode``
            included (default: the env's own vector entry point where it has one).
            With ``backend="envpool"``: for ``envpool.make_gymnasium`` (``env`` is an
            EnvPool task id; sync mode only).
            With ``backend="process"``: also ``envs_per_worker``, ``num_workers``,
            ``start_method`` and ``step_timeout_s`` for :class:`ProcessVectorEnv` (not
            passed to the env).
            With ``backend="ray"``: also the fields of :class:`RayEnvConfig`
            (``envs_per_actor``, ``num_cpus_per_actor``, ``remote_env_batch_wait_ms``,
            ``batch_buckets``, ``step_timeout_s``, ``actor_start_timeout_s``).

    Returns:
        A ``gymnasium.vector.VectorEnv`` (autoreset mode SAME_STEP).
    """
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise InvalidArgumentError(
            f"make_vec(num_envs=...): expected an int >= 1, got {num_envs!r}."
        )
    if backend == "gymnasium":
        # gymnasium.make_vec builds the vector env itself (its own vector entry point
        # where the env has one); env_kwargs may include vectorization_mode.
        vec: VectorEnv = make_gymnasium_vec(env, num_envs, **env_kwargs)  # type: ignore[arg-type]
        if seed is not None:
            vec.reset(seed=seed)
        return vec
    if backend == "envpool":
        # EnvPool builds its own pool from a task id (extra jaxrunner[envpool]).
        vec = make_envpool_vec(env, num_envs, **env_kwargs)  # type: ignore[arg-type]
        if seed is not None:
            vec.reset(seed=seed)
        return vec
    process_options = {}
    if backend == "process":
        process_options = {k: env_kwargs.pop(k) for k in _PROCESS_OPTIONS if k in env_kwargs}
    ray_options = {}
    if backend == "ray":
        ray_options = {k: env_kwargs.pop(k) for k in RAY_OPTIONS if k in env_kwargs}
    if isinstance(env, str):
        factory: Callable[[], gymnasium.Env] = functools.partial(gymnasium.make, env, **env_kwargs)
    elif callable(env):
        if env_kwargs:
            raise InvalidArgumentTypeError(
                f"make_vec(env=<callable>, {', '.join(env_kwargs)}=...): keyword arguments "
                "are passed to gymnasium.make and only apply to env ids; bind them in your "
                "callable instead (e.g. functools.partial)."
            )
        factory = env
    else:
        raise InvalidArgumentTypeError(
            f"make_vec(env=...): expected a gymnasium id (str) or a zero-argument callable "
            f"returning a gymnasium.Env, got {type(env).__name__}."
        )
    if backend == "sync":
        vec = SyncVectorEnv([factory] * num_envs)
    elif backend == "process":
        vec = ProcessVectorEnv([factory] * num_envs, **process_options)
    elif backend == "ray":
        vec = RayVectorEnv([factory] * num_envs, RayEnvConfig(**ray_options))
    else:
        raise InvalidArgumentError(f"make_vec(backend={backend!r}): expected one of {BACKENDS}.")
    if seed is not None:
        vec.reset(seed=seed)
    return vec


__all__ = [
    "BACKENDS",
    "BatchStep",
    "EnvPoolVectorEnv",
    "GymnasiumVectorEnv",
    "ProcessVectorEnv",
    "RayEnvConfig",
    "RayVectorEnv",
    "SyncVectorEnv",
    "VectorEnv",
    "from_gymnasium",
    "make_vec",
]

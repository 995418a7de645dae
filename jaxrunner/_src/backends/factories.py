"""Sub-env factories: one per sub-env from what ``make_vec`` is given (an id, a
factory or a list), and sub-env 0 built once to learn the env's kind."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any, cast

import gymnasium

from jaxrunner._src.backends.auto import Overran, on_own_thread
from jaxrunner._src.backends.env_api import check_env, with_namespace_hint
from jaxrunner._src.backends.process import ProcessConfig
from jaxrunner._src.backends.ray import RayConfig
from jaxrunner._src.backends.restarts import close_quietly
from jaxrunner._src.backends.sub_env_block import SubEnvRaised
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

BACKEND_CONFIGS: dict[str, type] = {"process": ProcessConfig, "ray": RayConfig}
"""The config class of each backend that takes one."""
ENV_KINDS = "a gymnasium.Env or a PettingZoo ParallelEnv/AECEnv"
"""What an env factory returns, as errors say it."""
EnvSpec = str | Callable[[], Any] | Sequence[Callable[[], Any]]
"""What ``make_vec`` builds sub-envs from: a gymnasium id, one factory (of a gymnasium or a
PettingZoo env), or one per sub-env."""


class FirstBuilt:
    """Sub-env 0's factory on the sync backend: its first call returns the env
    ``make_vec`` built to learn the kind; later ones (restarts) call ``fn``."""

    def __init__(self, fn: Callable[[], Any], env: Any) -> None:
        self.fn, self.env = fn, env

    def __call__(self) -> Any:
        env, self.env = self.env, None
        return self.fn() if env is None else env

    def discard(self) -> None:
        if self.env is not None:
            close_quietly(self.env)
            self.env = None


# How long make_vec waits for sub-env 0's close where it built it only to read its kind.
KIND_PROBE_CLOSE_S = 2.0


def close_kind_probe(env: Any) -> None:
    """Closes sub-env 0, built in this process only to read its kind, on a daemon thread
    given :data:`KIND_PROBE_CLOSE_S`: a close that hangs (its worker's twin would be
    killed on ``close()``) is left running, with a warning, not waited on forever."""
    try:
        on_own_thread(lambda: close_quietly(env), KIND_PROBE_CLOSE_S)
    except Overran:
        warnings.warn(
            f"make_vec: sub-env 0 ({type(env).__name__}), built in this process to learn "
            f"the env's kind, did not close within {KIND_PROBE_CLOSE_S} s; its close() is "
            "left running on a background thread (the workers build their own envs).",
            RuntimeWarning,
            stacklevel=3,
        )


def first_env(env: EnvSpec, factory: Callable[[], Any]) -> Any:
    """Sub-env 0, built here to read its kind (and, for ``"auto"``, to time it). A
    factory's own error is raised as :class:`SubEnvRaised`, as every other sub-env's;
    ``gymnasium.make``'s for an env id as it is (the id, not a sub-env, is at fault)."""
    try:
        made = factory()
    except Exception as err:
        if isinstance(env, str):
            raise
        raise SubEnvRaised(err, 0, "factory") from err
    return check_env(made, 0)


def factories_for(
    env: EnvSpec, env_kwargs: dict[str, Any], backend: str, num_envs: int
) -> list[Callable[[], gymnasium.Env]]:
    """One factory per sub-env."""
    if isinstance(env, str):
        return [GymnasiumMake(env, env_kwargs, backend)] * num_envs
    if env_kwargs and (callable(env) or isinstance(env, Sequence)):
        given, yours = ("<callable>", "callable") if callable(env) else ("[...]", "factories")
        raise InvalidArgumentTypeError(
            f"make_vec(env={given}, {', '.join(env_kwargs)}=...): keyword arguments are "
            "passed to gymnasium.make and only apply to env ids; bind them in your "
            f"{yours} instead (e.g. functools.partial)."
        )
    if callable(env):
        return [cast(Callable[[], gymnasium.Env], env)] * num_envs
    if isinstance(env, Sequence):
        if len(env) != num_envs:
            raise InvalidArgumentError(
                f"make_vec(env=[...], num_envs={num_envs}): {len(env)} factories for "
                f"{num_envs} sub-envs; give one factory per sub-env (or num_envs={len(env)})."
            )
        for i, fn in enumerate(env):
            if not callable(fn):
                raise InvalidArgumentTypeError(
                    f"make_vec(env=[...]): env[{i}] is a {type(fn).__name__}; expected a "
                    f"zero-argument callable returning {ENV_KINDS}."
                )
        return list(env)
    built = ""
    if callable(getattr(env, "step", None)):
        built = (
            " (an env already built: make_vec builds num_envs of them and rebuilds one on a "
            "restart, so pass the zero-argument callable that makes it)"
        )
    raise InvalidArgumentTypeError(
        f"make_vec(env=...): expected a gymnasium id (str), a zero-argument callable "
        f"returning {ENV_KINDS} or a list of them (one per sub-env), got "
        f"{type(env).__name__}{built}."
    )


class GymnasiumMake:
    """A picklable ``gymnasium.make(env_id, **kwargs)`` factory. Where the env refuses a
    keyword that is an option of the backend's config, the error says so."""

    def __init__(self, env_id: str, kwargs: dict[str, Any], backend: str) -> None:
        self.env_id, self.kwargs, self.backend = env_id, dict(kwargs), backend

    def __call__(self) -> gymnasium.Env:
        try:
            return gymnasium.make(self.env_id, **self.kwargs)
        except gymnasium.error.NamespaceNotFound as err:
            raise with_namespace_hint(err, self.env_id) from err
        except TypeError as err:
            config = BACKEND_CONFIGS.get(self.backend)
            names = {f.name for f in dataclasses.fields(config)} if config else set()
            bad = [k for k in self.kwargs if k in names and f"'{k}'" in str(err)]
            if not bad or config is None:
                raise
            raise InvalidArgumentTypeError(
                f"make_vec({self.env_id!r}, backend={self.backend!r}, {bad[0]}=...): keyword "
                f"arguments go to the env (gymnasium.make), which refused {bad[0]!r} ({err}). "
                f"It is an option of the backend: pass config=jaxrunner.{config.__name__}("
                f"{bad[0]}=...) instead."
            ) from err

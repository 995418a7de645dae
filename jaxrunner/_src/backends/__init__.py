"""Vector-env backends and ``make_vec``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import gymnasium

from jaxrunner._src.arg_checks import check_int
from jaxrunner._src.backends.auto import LayoutChoice, choose_for
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.batch_step import BatchStep as BatchStep
from jaxrunner._src.backends.envpool import EnvPoolVectorEnv as EnvPoolVectorEnv
from jaxrunner._src.backends.envpool import make_envpool_vec
from jaxrunner._src.backends.gymnasium_adapter import (
    GymnasiumVectorEnv as GymnasiumVectorEnv,
)
from jaxrunner._src.backends.gymnasium_adapter import (
    from_gymnasium as from_gymnasium,
)
from jaxrunner._src.backends.gymnasium_vec import make_gymnasium_vec
from jaxrunner._src.backends.process import (
    LocalShareVectorEnv as LocalShareVectorEnv,
)
from jaxrunner._src.backends.process import (
    ProcessConfig,
    make_process_vec,
)
from jaxrunner._src.backends.process import (
    ProcessVectorEnv as ProcessVectorEnv,
)
from jaxrunner._src.backends.process.launch import check_main_guard
from jaxrunner._src.backends.ray import RayConfig, RayVectorEnv
from jaxrunner._src.backends.restarts import RestartPolicy, check_restart_policy
from jaxrunner._src.backends.sync import SyncVectorEnv
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

BACKENDS = ("sync", "gymnasium", "process", "envpool", "ray", "auto")
_CONFIGS: dict[str, type] = {"process": ProcessConfig, "ray": RayConfig}
"""The config class of each backend that takes one."""


EnvSpec = str | Callable[[], gymnasium.Env] | Sequence[Callable[[], gymnasium.Env]]
"""What ``make_vec`` builds sub-envs from: a gymnasium id, one factory, or one per sub-env."""


def make_vec(
    env: EnvSpec,
    num_envs: int,
    backend: str = "sync",
    seed: int | None = None,
    *,
    config: ProcessConfig | RayConfig | None = None,
    restart_policy: RestartPolicy | None = None,
    **env_kwargs: Any,
) -> VectorEnv:
    """Builds a vector env of ``num_envs`` sub-envs.

    Args:
        env: a gymnasium id (made with ``gymnasium.make(env, **env_kwargs)``), a
            zero-argument callable returning a ``gymnasium.Env``, or a list of
            ``num_envs`` such callables, sub-env ``i`` built (and rebuilt on a restart)
            by the ``i``-th (CleanRL's ``[make_env(env_id, i, ...) for i in range(n)]``:
            env 0 records video, each its own wrapper); backends ``"sync"``,
            ``"process"``, ``"ray"`` and ``"auto"`` (which times the first).
        num_envs: number of sub-envs (>= 1).
        backend: where the sub-envs run; one of ``BACKENDS``. ``"auto"``: ``"sync"``
            or ``"process"`` with its number of workers, chosen here by timing one
            probe sub-env (built from the same factory, stepped
            with seeded random actions for up to 0.3 s, then closed) against the
            CPUs this process may use; the choice is ``vec.layout_choice`` (see
            ``docs/backends/index.md``). The vector env is the one that backend and
            layout build, so its trajectories are theirs.
        seed: if given, the envs are reset now with sub-env ``i`` seeded ``seed + i``.
        config: the backend's options: a :class:`~jaxrunner.ProcessConfig` for
            ``"process"``, a :class:`~jaxrunner.RayConfig` for ``"ray"``; None: its
            defaults. The other backends take none (``"auto"`` chooses the layout
            itself: to set it, use ``"process"`` with a config).
        restart_policy: for the backends that can restart sub-envs (``"sync"``,
            ``"process"``, ``"ray"``): failed sub-envs are recreated as it says and
            sampling goes on (see :class:`~jaxrunner.RestartPolicy`). None: failures raise.
        **env_kwargs: keyword arguments for ``gymnasium.make`` (ids only), passed
            untouched, whatever their names (a backend option given here reaches the
            env, not the backend: use ``config``). With ``backend="gymnasium"``: for
            ``gymnasium.make_vec``, ``vectorization_mode`` included (default: the env's
            own vector entry point where it has one). With ``backend="envpool"``: for
            ``envpool.make_gymnasium`` (``env`` is an EnvPool task id).

    Returns:
        A ``gymnasium.vector.VectorEnv`` (autoreset mode SAME_STEP).
    """
    check_int("make_vec", "num_envs", num_envs)
    check_int("make_vec", "seed", seed, low=-math.inf, none="for no reset")
    if backend not in BACKENDS:
        raise InvalidArgumentError(f"make_vec(backend={backend!r}): expected one of {BACKENDS}.")
    check_vec_options(backend, config, restart_policy)
    choice: LayoutChoice | None = None
    if backend == "auto":
        choice = choose_auto_layout(env, env_kwargs, num_envs, seed)
        backend, config = choice.backend, choice.process_config()
    if (
        not isinstance(env, str)
        and isinstance(env, Sequence)
        and backend in ("gymnasium", "envpool")
    ):
        raise InvalidArgumentTypeError(
            f"make_vec(env=[...], backend={backend!r}): a list of factories is for the backends "
            "that build each sub-env themselves ('sync', 'process', 'ray', 'auto'). For "
            "gymnasium's own vector env, wrap it: jaxrunner.from_gymnasium("
            "gymnasium.vector.SyncVectorEnv([...]))."
        )
    if backend == "gymnasium":
        # gymnasium.make_vec builds the vector env itself (its own vector entry point
        # where the env has one); env_kwargs may include vectorization_mode.
        vec: VectorEnv = make_gymnasium_vec(env, num_envs, **env_kwargs)  # type: ignore[arg-type]
    elif backend == "envpool":
        # EnvPool builds its own pool from a task id (extra jaxrunner[envpool]).
        vec = make_envpool_vec(env, num_envs, **env_kwargs)  # type: ignore[arg-type]
    else:
        fns = _factories(env, env_kwargs, backend, num_envs)
        if backend == "sync":
            vec = SyncVectorEnv(fns, restart_policy=restart_policy)
        elif backend == "process":
            vec = make_process_vec(fns, config, restart_policy=restart_policy)  # type: ignore[arg-type]
        else:
            vec = RayVectorEnv(fns, config, restart_policy=restart_policy)  # type: ignore[arg-type]
    vec.layout_choice = choice
    if seed is not None:
        vec.reset(seed=seed)
    return vec


def choose_auto_layout(
    env: EnvSpec,
    env_kwargs: dict[str, Any],
    num_envs: int,
    seed: int | None,
    caller: str = 'make_vec(backend="auto")',
) -> LayoutChoice:
    """``backend="auto"``'s measurement and choice (:mod:`.auto`); an env id gymnasium
    cannot make (an EnvPool task id, say) is refused with what to use instead, and
    workers from a script's unguarded top level with an error that says ``caller``
    chose them (before any starts)."""
    factory = _factories(env, env_kwargs, "auto", num_envs)[0]
    try:
        choice = choose_for(factory, num_envs, seed)
    except gymnasium.error.Error as err:
        if not isinstance(env, str):
            raise
        raise InvalidArgumentError(
            f"make_vec({env!r}, backend='auto'): 'auto' chooses between the sync and "
            f"process backends, which build envs with gymnasium.make, and that failed "
            f"({err}). For an EnvPool task id use backend='envpool'; else register the "
            "env with gymnasium or pass a zero-argument factory."
        ) from err
    if choice.backend == "process":
        check_main_guard(chosen_by=f"{caller} chose the process backend ({choice.reason})")
    return choice


def check_vec_options(
    backend: str, config: Any, restart_policy: RestartPolicy | None, what: str = "make_vec"
) -> None:
    """Raises unless ``config`` and ``restart_policy`` suit ``backend`` (as in
    :func:`make_vec`; ``what`` names the caller in errors)."""
    check_restart_policy(what, restart_policy)
    expected = _CONFIGS.get(backend)
    if backend == "auto" and config is not None:
        raise InvalidArgumentTypeError(
            f"{what}(backend='auto', config={type(config).__name__}(...)): 'auto' "
            "chooses the layout itself and takes no config. To set the layout, use "
            "backend='process' with your config (or 'ray'); else leave config=None."
        )
    if config is not None and not isinstance(config, expected or ()):
        want = f"a jaxrunner.{expected.__name__}" if expected else "no config (None)"
        raise InvalidArgumentTypeError(
            f"{what}(backend={backend!r}, config=...): expected {want}, got "
            f"{type(config).__name__}."
        )
    if restart_policy is not None and backend not in ("sync", "process", "ray", "auto"):
        raise InvalidArgumentError(
            f"{what}(backend={backend!r}, restart_policy=...): the {backend} backend cannot "
            "restart sub-envs. Use backend='sync', 'process', 'ray' or 'auto', or leave "
            "restart_policy=None."
        )


def _factories(
    env: EnvSpec, env_kwargs: dict[str, Any], backend: str, num_envs: int
) -> list[Callable[[], gymnasium.Env]]:
    """One factory per sub-env."""
    if isinstance(env, str) or callable(env):
        return [_factory(env, env_kwargs, backend)] * num_envs
    if isinstance(env, Sequence):
        if env_kwargs:
            raise InvalidArgumentTypeError(
                f"make_vec(env=[...], {', '.join(env_kwargs)}=...): keyword arguments are "
                "passed to gymnasium.make and only apply to env ids; bind them in your "
                "factories instead (e.g. functools.partial)."
            )
        return per_env_factories(env, num_envs, "make_vec", "env", "a gymnasium.Env")
    return [_factory(env, env_kwargs, backend)]


def per_env_factories(
    factories: Any, num_envs: int, where: str, name: str, returning: str
) -> list[Callable[[], Any]]:
    """One factory per sub-env: ``factories`` repeated where it is one callable, else the
    sequence itself, checked to hold ``num_envs`` callables."""
    if callable(factories):
        return [factories] * num_envs
    if isinstance(factories, str) or not isinstance(factories, Sequence):
        raise InvalidArgumentTypeError(
            f"{where}({name}=...): expected a zero-argument callable returning {returning}, "
            f"or a list of them (one per sub-env), got {type(factories).__name__}."
        )
    if len(factories) != num_envs:
        raise InvalidArgumentError(
            f"{where}({name}=[...], num_envs={num_envs}): {len(factories)} factories for "
            f"{num_envs} sub-envs; give one factory per sub-env (or num_envs={len(factories)})."
        )
    for i, fn in enumerate(factories):
        if not callable(fn):
            raise InvalidArgumentTypeError(
                f"{where}({name}=[...]): {name}[{i}] is a {type(fn).__name__}; expected a "
                f"zero-argument callable returning {returning}."
            )
    return list(factories)


def _factory(env: Any, env_kwargs: dict[str, Any], backend: str) -> Callable[[], gymnasium.Env]:
    if isinstance(env, str):
        return GymnasiumMake(env, env_kwargs, backend)
    if callable(env):
        if env_kwargs:
            raise InvalidArgumentTypeError(
                f"make_vec(env=<callable>, {', '.join(env_kwargs)}=...): keyword arguments "
                "are passed to gymnasium.make and only apply to env ids; bind them in your "
                "callable instead (e.g. functools.partial)."
            )
        return cast(Callable[[], gymnasium.Env], env)
    raise InvalidArgumentTypeError(
        f"make_vec(env=...): expected a gymnasium id (str), a zero-argument callable "
        f"returning a gymnasium.Env or a list of them (one per sub-env), got "
        f"{type(env).__name__}."
    )


class GymnasiumMake:
    """A picklable ``gymnasium.make(env_id, **kwargs)`` factory. Where the env refuses a
    keyword that is an option of the backend's config, the error says so."""

    def __init__(self, env_id: str, kwargs: dict[str, Any], backend: str) -> None:
        self.env_id, self.kwargs, self.backend = env_id, dict(kwargs), backend

    def __call__(self) -> gymnasium.Env:
        try:
            return gymnasium.make(self.env_id, **self.kwargs)
        except TypeError as err:
            config = _CONFIGS.get(self.backend)
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

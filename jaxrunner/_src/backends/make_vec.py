"""``make_vec``: a vector env of either kind on any backend (and ``make_multi_agent_vec``,
its alias for PettingZoo envs)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, overload

import gymnasium
from gymnasium.vector import AutoresetMode

from jaxrunner._src.arg_checks import check_int
from jaxrunner._src.backends.auto import LayoutChoice, choose_for, envpool_only
from jaxrunner._src.backends.base import MultiAgentVectorEnv, VectorEnv
from jaxrunner._src.backends.env_api import is_multi_agent_env, with_namespace_hint
from jaxrunner._src.backends.envpool_make import make_envpool_vec
from jaxrunner._src.backends.factories import (
    BACKEND_CONFIGS,
    EnvSpec,
    FirstBuilt,
    close_kind_probe,
    factories_for,
    first_env,
)
from jaxrunner._src.backends.gymnasium_adapter import GymnasiumVectorEnv
from jaxrunner._src.backends.process import ProcessConfig, make_process_vec
from jaxrunner._src.backends.process.launch import check_main_guard
from jaxrunner._src.backends.ray import RayConfig, RayVectorEnv
from jaxrunner._src.backends.restarts import RestartPolicy, check_restart_policy, close_quietly
from jaxrunner._src.backends.sub_env_block import EnvFactory
from jaxrunner._src.backends.sync import SyncMultiAgentVectorEnv, SyncVectorEnv
from jaxrunner._src.core.agent_groups import PolicyMappingFn
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

BACKENDS = ("sync", "gymnasium", "process", "envpool", "ray", "auto")
FACTORY_BACKENDS = ("sync", "process", "ray", "auto")
"""The backends that build each sub-env from a factory: they serve both kinds of env."""


@overload  # an id makes gymnasium envs
def make_vec(
    env: str,
    num_envs: int,
    backend: str = ...,
    seed: int | None = ...,
    *,
    config: ProcessConfig | RayConfig | None = ...,
    restart_policy: RestartPolicy | None = ...,
    policy_mapping_fn: None = ...,
    **env_kwargs: Any,
) -> VectorEnv: ...
@overload  # a factory makes either kind: VectorEnv or MultiAgentVectorEnv
def make_vec(
    env: Callable[[], Any] | Sequence[Callable[[], Any]],
    num_envs: int,
    backend: str = ...,
    seed: int | None = ...,
    *,
    config: ProcessConfig | RayConfig | None = ...,
    restart_policy: RestartPolicy | None = ...,
    policy_mapping_fn: PolicyMappingFn | None = ...,
    **env_kwargs: Any,
) -> Any: ...
def make_vec(
    env: EnvSpec,
    num_envs: int,
    backend: str = "sync",
    seed: int | None = None,
    *,
    config: ProcessConfig | RayConfig | None = None,
    restart_policy: RestartPolicy | None = None,
    policy_mapping_fn: PolicyMappingFn | None = None,
    **env_kwargs: Any,
) -> VectorEnv | MultiAgentVectorEnv:
    """Builds a vector env of ``num_envs`` sub-envs: single-agent (gymnasium) or
    multi-agent (PettingZoo), whichever kind ``env`` makes.

    Args:
        env: a gymnasium id (made with ``gymnasium.make(env, **env_kwargs)``), a
            zero-argument callable returning a ``gymnasium.Env`` or a PettingZoo
            ``ParallelEnv``/``AECEnv``, or a list of ``num_envs`` such callables, sub-env
            ``i`` built (and rebuilt on a restart) by the ``i``-th (CleanRL's
            ``[make_env(env_id, i, ...) for i in range(n)]``: env 0 records video, each its
            own wrapper); backends ``"sync"``, ``"process"``, ``"ray"`` and ``"auto"``.
            The kind is read from sub-env 0 (docs/multi-agent.md): a PettingZoo env
            (it has ``possible_agents``) gives a :class:`~jaxrunner.MultiAgentVectorEnv`.
        num_envs: number of sub-envs (>= 1).
        backend: where the sub-envs run; one of ``BACKENDS`` (a multi-agent env: one of
            ``FACTORY_BACKENDS``). ``"auto"``: ``"sync"`` or ``"process"`` with its number
            of workers, chosen by timing one probe sub-env against the CPUs this process
            may use, or ``"envpool"`` for a task id only EnvPool has (``"Pong-v5"``); the
            choice is ``vec.layout_choice`` (see ``docs/backends/index.md``).
        seed: if given, the envs are reset now with sub-env ``i`` seeded ``seed + i``.
        config: the backend's options: a :class:`~jaxrunner.ProcessConfig` for
            ``"process"``, a :class:`~jaxrunner.RayConfig` for ``"ray"``; None: its
            defaults. The other backends take none (``"auto"`` chooses the layout
            itself: to set it, use ``"process"`` with a config).
        restart_policy: for the backends that can restart sub-envs (``"sync"``,
            ``"process"``, ``"ray"``, ``"auto"``): failed sub-envs are recreated as it says
            and sampling goes on (see :class:`~jaxrunner.RestartPolicy`). None: failures
            raise.
        policy_mapping_fn: multi-agent envs only: ``agent_id -> policy_id``; None: one
            shared policy per distinct pair of observation and action spaces
            (``policy_0``, ...).
        **env_kwargs: keyword arguments for ``gymnasium.make`` (ids only), passed
            untouched, whatever their names (a backend option given here reaches the
            env, not the backend: use ``config``). With ``backend="gymnasium"``: for
            ``gymnasium.make_vec``, ``vectorization_mode`` included (default: the env's
            own vector entry point where it has one). With ``backend="envpool"``: for
            ``envpool.make_gymnasium`` (``env`` is an EnvPool task id), but
            ``batch_size`` (async mode), ``num_pools`` (sync pools stepped in turn) and
            ``keep_reset_steps``, the backend's (docs/backends/envpool.md).

    Returns:
        A ``gymnasium.vector.VectorEnv`` (autoreset mode SAME_STEP) for a gymnasium env; a
        :class:`~jaxrunner.MultiAgentVectorEnv` for a PettingZoo env.
    """
    check_int("make_vec", "num_envs", num_envs)
    check_int("make_vec", "seed", seed, low=0, none="for no reset")
    check_vec_options(backend, config, restart_policy)
    choice = envpool_only(env, num_envs, restart_policy) if backend == "auto" else None
    if choice is not None:
        backend = choice.backend
    if backend not in FACTORY_BACKENDS:
        vec = _make_from_id(env, num_envs, backend, policy_mapping_fn, env_kwargs)
    else:
        fns = factories_for(env, env_kwargs, backend, num_envs)
        first = None
        multi_agent: bool | None  # None: the process backend learns it from its workers
        if backend == "auto":
            choice, multi_agent = choose_auto_layout(
                env, env_kwargs, num_envs, seed, restart_policy
            )
            backend, config = choice.backend, choice.process_config()
        elif isinstance(env, str) and backend != "sync":
            multi_agent = False  # a gymnasium id (sync builds sub-env 0 first: its errors raw)
        elif backend == "process":
            multi_agent = None  # worker 0 (or the main process's share) reports the kind
        else:
            first = first_env(env, fns[0])
            multi_agent = is_multi_agent_env(first)
        if policy_mapping_fn is not None and multi_agent is False:
            if first is not None:
                close_quietly(first)
            raise _mapping_refused()
        vec = _make_from_factories(
            fns, first, multi_agent, backend, config, restart_policy, policy_mapping_fn
        )
        if policy_mapping_fn is not None and not vec.multi_agent:
            vec.close()
            raise _mapping_refused()
    vec.layout_choice = choice
    if seed is not None:
        try:
            vec.reset_batch([seed + i for i in range(num_envs)])  # as reset(seed=seed)
            vec.reset_seed = int(seed)
        except BaseException:
            vec.close()
            raise
    return vec


def _mapping_refused() -> InvalidArgumentTypeError:
    return InvalidArgumentTypeError(
        "make_vec(policy_mapping_fn=...): a policy mapping is for multi-agent "
        "(PettingZoo) envs, and this env is a gymnasium one (one agent, one "
        "policy). Leave policy_mapping_fn=None."
    )


def _make_from_id(
    env: Any,
    num_envs: int,
    backend: str,
    policy_mapping_fn: PolicyMappingFn | None,
    env_kwargs: dict[str, Any],
) -> VectorEnv:
    """The backends that build their own pool from an id: single-agent envs only."""
    if not isinstance(env, str) or policy_mapping_fn is not None:
        given = "policy_mapping_fn=..." if isinstance(env, str) else f"env=<{type(env).__name__}>"
        source = "an EnvPool task id" if backend == "envpool" else "a registered gymnasium id"
        raise InvalidArgumentTypeError(
            f"make_vec({given}, backend={backend!r}): the {backend} backend builds its own "
            f"pool of single-agent envs from {source}. Factories, lists of factories and "
            "multi-agent (PettingZoo) envs are for the backends that build each sub-env "
            f"themselves: {', '.join(map(repr, FACTORY_BACKENDS))}. For gymnasium's own "
            "vector env, wrap it: jaxrunner.from_gymnasium(gymnasium.vector.SyncVectorEnv([...]))."
        )
    if backend == "gymnasium":
        return make_gymnasium_vec(env, num_envs, **env_kwargs)
    return make_envpool_vec(env, num_envs, **env_kwargs)


def make_gymnasium_vec(
    env_id: str,
    num_envs: int,
    vectorization_mode: str | gymnasium.VectorizeMode | None = None,
    vector_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> GymnasiumVectorEnv:
    """``gymnasium.make_vec(env_id, num_envs, vectorization_mode, ...)``, adopted.
    ``vectorization_mode`` None: the env's own vector implementation where it has one,
    else ``"sync"``; Sync/AsyncVectorEnv default to DISABLED here (the adapter resets)."""
    try:
        mode = None if vectorization_mode is None else gymnasium.VectorizeMode(vectorization_mode)
    except ValueError as err:
        raise InvalidArgumentError(
            f"make_vec(backend='gymnasium', vectorization_mode={vectorization_mode!r}): expected "
            f"one of {[m.value for m in gymnasium.VectorizeMode]} (or None for the env's own "
            "vector implementation where it has one)."
        ) from err
    try:  # an id in an unknown namespace: at the spec lookup, or at make_vec
        if mode is None:
            has_own = gymnasium.spec(env_id).vector_entry_point is not None
            mode = (
                gymnasium.VectorizeMode.VECTOR_ENTRY_POINT
                if has_own
                else gymnasium.VectorizeMode.SYNC
            )
        if mode != gymnasium.VectorizeMode.VECTOR_ENTRY_POINT:
            # DISABLED: the adapter resets ended sub-envs itself. SAME_STEP would merge an
            # ended sub-env's reset info into the others' step infos, casting them to its
            # dtypes (gymnasium 1.x).
            vector_kwargs = {"autoreset_mode": AutoresetMode.DISABLED, **(vector_kwargs or {})}
        env = gymnasium.make_vec(
            env_id, num_envs, vectorization_mode=mode, vector_kwargs=vector_kwargs, **kwargs
        )
    except gymnasium.error.NamespaceNotFound as err:
        raise with_namespace_hint(err, env_id) from err
    return GymnasiumVectorEnv(env)


def _make_from_factories(
    fns: list[Callable[[], Any]],
    first: Any,
    multi_agent: bool | None,
    backend: str,
    config: Any,
    restart_policy: RestartPolicy | None,
    policy_mapping_fn: PolicyMappingFn | None,
) -> VectorEnv | MultiAgentVectorEnv:
    """The sync, process or Ray vector env of ``fns``' kind (None: not known, for the
    process backend to learn); ``first`` (sub-env 0 if already built, else None) becomes
    sub-env 0 on sync, and is closed on the others."""
    if first is not None and backend == "sync":
        fns = [FirstBuilt(fns[0], first), *fns[1:]]
    elif first is not None:
        close_kind_probe(first)  # its kind is known; the workers build their own
    try:
        if backend == "process":
            return make_process_vec(
                fns, config, restart_policy=restart_policy,
                policy_mapping_fn=policy_mapping_fn, multi_agent=multi_agent,
            )  # fmt: skip
        if not multi_agent:
            if backend == "sync":
                return SyncVectorEnv(fns, restart_policy=restart_policy)
            return RayVectorEnv(fns, config, restart_policy=restart_policy)
        if backend == "sync":
            return SyncMultiAgentVectorEnv(fns, policy_mapping_fn, restart_policy=restart_policy)
        from jaxrunner._src.backends.ray.vector_env import RayMultiAgentVectorEnv

        return RayMultiAgentVectorEnv(
            fns, policy_mapping_fn, config=config, restart_policy=restart_policy
        )
    finally:
        if isinstance(fns[0], FirstBuilt):
            fns[0].discard()  # never taken: the vector env failed before sub-env 0


def choose_auto_layout(
    env: EnvSpec,
    env_kwargs: dict[str, Any],
    num_envs: int,
    seed: int | None,
    restart_policy: RestartPolicy | None,
    caller: str = 'make_vec(backend="auto")',
) -> tuple[LayoutChoice, bool]:
    """``backend="auto"``'s choice (:func:`.auto.choose_for`) and whether the env is
    multi-agent; workers from a script's unguarded top level are refused, naming ``caller``."""
    factory = factories_for(env, env_kwargs, "auto", num_envs)[0]
    try:
        probe = first_env(env, factory)
    except gymnasium.error.Error as err:  # an id gymnasium cannot make
        raise InvalidArgumentError(
            f"make_vec({env!r}, backend='auto'): 'auto' chooses between the sync and "
            f"process backends, which build envs with gymnasium.make, and that failed "
            f"({err}). For an EnvPool task id use backend='envpool'; else register the "
            "env with gymnasium or pass a zero-argument factory."
        ) from err
    multi_agent = is_multi_agent_env(probe)
    choice = choose_for(probe, factory, num_envs, seed, restart_policy)
    if choice.backend == "process":
        check_main_guard(chosen_by=f"{caller} chose the process backend ({choice.reason})")
    return choice, multi_agent


def check_vec_options(
    backend: str, config: Any, restart_policy: RestartPolicy | None, what: str = "make_vec"
) -> None:
    """Raises unless ``backend`` is one and ``config`` and ``restart_policy`` suit it (as
    in :func:`make_vec`; ``what`` names the caller in errors)."""
    if backend not in BACKENDS:
        raise InvalidArgumentError(f"{what}(backend={backend!r}): expected one of {BACKENDS}.")
    check_restart_policy(what, restart_policy)
    expected = BACKEND_CONFIGS.get(backend)
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
    if restart_policy is not None and backend not in FACTORY_BACKENDS:
        raise InvalidArgumentError(
            f"{what}(backend={backend!r}, restart_policy=...): the {backend} backend cannot "
            "restart sub-envs. Use backend='sync', 'process', 'ray' or 'auto', or leave "
            "restart_policy=None."
        )


def make_multi_agent_vec(
    env_fn: EnvFactory | Sequence[EnvFactory],
    num_envs: int,
    backend: str = "sync",
    seed: int | None = None,
    *,
    policy_mapping_fn: PolicyMappingFn | None = None,
    config: ProcessConfig | RayConfig | None = None,
    restart_policy: RestartPolicy | None = None,
    num_workers: int | None = None,
) -> MultiAgentVectorEnv:
    """``make_vec(env_fn, num_envs, backend, seed, ...)`` for PettingZoo envs: an alias
    kept for older code; :func:`jaxrunner.make_vec` builds both kinds of env.

    Takes :func:`jaxrunner.make_vec`'s arguments (``env_fn`` is its ``env``: factories
    only, no env kwargs), and refuses a factory of gymnasium envs. ``num_workers`` is
    deprecated (a ``FutureWarning``), to be removed:
    ``config=ProcessConfig(num_workers=...)``.
    """
    if num_workers is not None:
        config = _deprecated_num_workers(num_workers, backend, config)
    vec = make_vec(
        env_fn,
        num_envs,
        backend,
        seed,
        config=config,
        restart_policy=restart_policy,
        policy_mapping_fn=policy_mapping_fn,
    )
    if not isinstance(vec, MultiAgentVectorEnv):
        vec.close()
        raise InvalidArgumentTypeError(
            "make_multi_agent_vec: the env factory made a gymnasium env, not a PettingZoo "
            "one. make_vec builds both kinds: call jaxrunner.make_vec(env_fn, num_envs, ...)."
        )
    return vec


def _deprecated_num_workers(
    num_workers: int, backend: str, config: ProcessConfig | RayConfig | None
) -> ProcessConfig:
    """The ``num_workers`` shorthand as the config it stands for, with its warning."""
    if backend != "process":
        raise InvalidArgumentError(
            f"make_multi_agent_vec(backend={backend!r}, num_workers=...): num_workers applies "
            "to backend='process' only (and is deprecated: use "
            "config=jaxrunner.ProcessConfig(num_workers=...))."
        )
    if config is not None:
        raise InvalidArgumentError(
            "make_multi_agent_vec(backend='process', num_workers=..., config=...): give "
            "the worker count in one place, ProcessConfig(num_workers=...)."
        )
    warnings.warn(
        "make_multi_agent_vec(num_workers=...) is deprecated and will be removed; pass "
        f"config=jaxrunner.ProcessConfig(num_workers={num_workers!r}), as make_vec takes it.",
        FutureWarning,
        stacklevel=3,
    )
    return ProcessConfig(num_workers=num_workers)

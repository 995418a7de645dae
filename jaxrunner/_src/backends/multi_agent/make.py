"""``make_multi_agent_vec``: a multi-agent vector env from a PettingZoo env factory, with
:func:`jaxrunner.make_vec`'s argument conventions."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

from jaxrunner._src.arg_checks import check_int
from jaxrunner._src.backends import BACKENDS, check_vec_options, per_env_factories
from jaxrunner._src.backends.multi_agent.sub_envs import MultiAgentEnvFactory
from jaxrunner._src.backends.multi_agent.vector_env import (
    MultiAgentVectorEnv,
    SyncMultiAgentVectorEnv,
)
from jaxrunner._src.backends.process.config import ProcessConfig
from jaxrunner._src.backends.ray.config import RayConfig
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.core.agent_groups import PolicyMappingFn
from jaxrunner.errors import InvalidArgumentError

MULTI_AGENT_BACKENDS = ("sync", "process", "ray")


def make_multi_agent_vec(
    env_fn: MultiAgentEnvFactory | Sequence[MultiAgentEnvFactory],
    num_envs: int,
    backend: str = "sync",
    seed: int | None = None,
    *,
    policy_mapping_fn: PolicyMappingFn | None = None,
    config: ProcessConfig | RayConfig | None = None,
    restart_policy: RestartPolicy | None = None,
    num_workers: int | None = None,
) -> MultiAgentVectorEnv:
    """``num_envs`` copies of a PettingZoo env (parallel or AEC) stepped together.

    Args:
        env_fn: zero-argument callable returning a PettingZoo ``ParallelEnv`` or
            ``AECEnv`` (picklable, e.g. a module-level function, for ``"process"``), or a
            list of ``num_envs`` such callables, sub-env ``i`` built (and rebuilt on a
            restart) by the ``i``-th, as for :func:`jaxrunner.make_vec`.
        num_envs: B.
        backend: ``"sync"`` (this process), ``"process"`` (worker processes) or
            ``"ray"`` (Ray actors; extra ``[ray]``). :func:`jaxrunner.make_vec`'s
            ``"gymnasium"``, ``"envpool"`` and ``"auto"`` build single-agent envs only.
        seed: as :func:`jaxrunner.make_vec`'s: if given, the envs are reset now with
            sub-env ``i`` seeded ``seed + i``. (A ``MultiAgentRunner`` resets its envs
            itself, from its own seed.)
        policy_mapping_fn: ``agent_id -> policy_id``; None: one shared policy per
            distinct pair of observation and action spaces (``policy_0``, ...).
        config: the backend's typed config, as for :func:`jaxrunner.make_vec`: a
            :class:`~jaxrunner.ProcessConfig` for ``"process"`` (workers, start method,
            ``step_timeout_s``, ``ready_first``), a :class:`~jaxrunner.RayConfig` for
            ``"ray"`` (placement, ``step_timeout_s``, ``ready_first``).
        restart_policy: a :class:`~jaxrunner.RestartPolicy`: a sub-env that raises or
            returns an invalid step is recreated and reset, its step yields no
            transition for any of its agents and its episode ends as a fault (counted in
            ``num_faulty_episodes``/``num_dropped_steps``); every backend. None
            (default): failures raise.
        num_workers: deprecated (a ``FutureWarning``), to be removed:
            ``config=ProcessConfig(num_workers=...)``, which :func:`jaxrunner.make_vec`
            takes too.
    """
    check_int("make_multi_agent_vec", "num_envs", num_envs)
    fns = per_env_factories(env_fn, num_envs, "make_multi_agent_vec", "env_fn", "a PettingZoo env")
    if backend not in MULTI_AGENT_BACKENDS:
        single = " (make_vec's, for single-agent envs)" if backend in BACKENDS else ""
        raise InvalidArgumentError(
            f"make_multi_agent_vec(backend={backend!r}): expected one of "
            f"{MULTI_AGENT_BACKENDS}, got {backend!r}{single}."
        )
    seed = check_int("make_multi_agent_vec", "seed", seed, low=-math.inf, none="for no reset")
    if num_workers is not None:
        config = _deprecated_num_workers(num_workers, backend, config)
    check_vec_options(backend, config, restart_policy, "make_multi_agent_vec")
    vec: MultiAgentVectorEnv
    if backend == "sync":
        vec = SyncMultiAgentVectorEnv(fns, policy_mapping_fn, restart_policy=restart_policy)
    elif backend == "ray":
        from jaxrunner._src.backends.ray.agents import RayMultiAgentVectorEnv

        vec = RayMultiAgentVectorEnv(
            fns,
            policy_mapping_fn,
            config=config,  # type: ignore[arg-type]  # checked above
            restart_policy=restart_policy,
        )
    else:
        from jaxrunner._src.backends.process.agents import ProcessMultiAgentVectorEnv

        vec = ProcessMultiAgentVectorEnv(
            fns,
            policy_mapping_fn,
            config=config,  # type: ignore[arg-type]  # checked above
            restart_policy=restart_policy,
        )
    if seed is not None:
        try:
            vec.reset_batch([seed + i for i in range(num_envs)])
        except BaseException:
            vec.close()
            raise
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

"""``make_multi_agent_vec``: a multi-agent vector env from a PettingZoo env factory."""

from __future__ import annotations

from jaxrunner._src.arg_checks import check_int
from jaxrunner._src.backends.multi_agent.sub_envs import MultiAgentEnvFactory
from jaxrunner._src.backends.multi_agent.vector_env import (
    MultiAgentVectorEnv,
    SyncMultiAgentVectorEnv,
)
from jaxrunner._src.backends.process.config import ProcessConfig
from jaxrunner._src.backends.ray.config import RayConfig
from jaxrunner._src.backends.restarts import RestartPolicy, check_restart_policy
from jaxrunner._src.core.agent_groups import PolicyMappingFn
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

MULTI_AGENT_BACKENDS = ("sync", "process", "ray")


def make_multi_agent_vec(
    env_fn: MultiAgentEnvFactory,
    num_envs: int,
    backend: str = "sync",
    *,
    policy_mapping_fn: PolicyMappingFn | None = None,
    num_workers: int | None = None,
    config: ProcessConfig | RayConfig | None = None,
    restart_policy: RestartPolicy | None = None,
) -> MultiAgentVectorEnv:
    """``num_envs`` copies of a PettingZoo env (parallel or AEC) stepped together.

    Args:
        env_fn: zero-argument callable returning a PettingZoo ``ParallelEnv`` or
            ``AECEnv`` (picklable, e.g. a module-level function, for ``"process"``).
        num_envs: B.
        backend: ``"sync"`` (this process), ``"process"`` (worker processes) or
            ``"ray"`` (Ray actors; extra ``[ray]``).
        policy_mapping_fn: ``agent_id -> policy_id``; None: one shared policy per
            distinct pair of observation and action spaces (``policy_0``, ...).
        num_workers: ``"process"`` only: worker processes (None: one per CPU, at
            most one per sub-env); a shorthand for ``ProcessConfig(num_workers=...)``.
        config: the backend's typed config, as for :func:`jaxrunner.make_vec`: a
            :class:`~jaxrunner.ProcessConfig` for ``"process"`` (workers, start method,
            ``step_timeout_s``, ``ready_first``), a :class:`~jaxrunner.RayConfig` for
            ``"ray"`` (placement, ``step_timeout_s``, ``ready_first``).
        restart_policy: a :class:`~jaxrunner.RestartPolicy`: a sub-env that raises or
            returns an invalid step is recreated and reset, its step yields no
            transition for any of its agents and its episode ends as a fault (counted in
            ``num_faulty_episodes``/``num_dropped_steps``); every backend. None
            (default): failures raise.
    """
    check_restart_policy("make_multi_agent_vec", restart_policy)
    if not callable(env_fn):
        raise InvalidArgumentTypeError(
            f"make_multi_agent_vec(env_fn=...): expected a zero-argument callable returning a "
            f"PettingZoo env, got {env_fn!r}."
        )
    check_int("make_multi_agent_vec", "num_envs", num_envs)
    fns = [env_fn] * num_envs
    if num_workers is not None and backend != "process":
        raise InvalidArgumentError(
            f"make_multi_agent_vec(backend={backend!r}, num_workers=...): num_workers applies "
            "to backend='process' only."
        )
    if config is not None and backend not in ("process", "ray"):
        raise InvalidArgumentError(
            f"make_multi_agent_vec(backend={backend!r}, config=...): config applies to "
            "backend='process' (a ProcessConfig) and backend='ray' (a RayConfig) only."
        )
    if backend == "process" and num_workers is not None:
        if config is not None:
            raise InvalidArgumentError(
                "make_multi_agent_vec(backend='process', num_workers=..., config=...): give "
                "the worker count in one place, ProcessConfig(num_workers=...)."
            )
        config = ProcessConfig(num_workers=num_workers)
    expected = {"process": ProcessConfig, "ray": RayConfig}.get(backend)
    if config is not None and expected is not None and not isinstance(config, expected):
        raise InvalidArgumentTypeError(
            f"make_multi_agent_vec(backend={backend!r}, config=...): expected a "
            f"jaxrunner.{expected.__name__}, got {type(config).__name__}."
        )
    if backend == "sync":
        return SyncMultiAgentVectorEnv(fns, policy_mapping_fn, restart_policy=restart_policy)
    if backend == "ray":
        from jaxrunner._src.backends.ray.agents import RayMultiAgentVectorEnv

        assert config is None or isinstance(config, RayConfig)  # checked above
        return RayMultiAgentVectorEnv(
            fns, policy_mapping_fn, config=config, restart_policy=restart_policy
        )
    if backend == "process":
        from jaxrunner._src.backends.process.agents import ProcessMultiAgentVectorEnv

        assert config is None or isinstance(config, ProcessConfig)  # checked above
        return ProcessMultiAgentVectorEnv(
            fns, policy_mapping_fn, config=config, restart_policy=restart_policy
        )
    raise InvalidArgumentError(
        f"make_multi_agent_vec(backend={backend!r}): expected one of {MULTI_AGENT_BACKENDS}."
    )


__all__ = ["MULTI_AGENT_BACKENDS", "make_multi_agent_vec"]

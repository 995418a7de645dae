"""``make_multi_agent_vec``: a multi-agent vector env from a PettingZoo env factory."""

from __future__ import annotations

from jaxrunner.envs.ray.config import RayConfig
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError
from jaxrunner.multi_agent.groups import PolicyMappingFn
from jaxrunner.multi_agent.sub_envs import MultiAgentEnvFactory
from jaxrunner.multi_agent.vector_env import MultiAgentVectorEnv, SyncMultiAgentVectorEnv

MULTI_AGENT_BACKENDS = ("sync", "process", "ray")


def make_multi_agent_vec(
    env_fn: MultiAgentEnvFactory,
    num_envs: int,
    backend: str = "sync",
    *,
    policy_mapping_fn: PolicyMappingFn | None = None,
    num_workers: int | None = None,
    config: RayConfig | None = None,
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
            most one per sub-env).
    """
    if not callable(env_fn):
        raise InvalidArgumentTypeError(
            f"make_multi_agent_vec(env_fn=...): expected a zero-argument callable returning a "
            f"PettingZoo env, got {env_fn!r}."
        )
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise InvalidArgumentError(
            f"make_multi_agent_vec(num_envs=...): expected an int >= 1, got {num_envs!r}."
        )
    fns = [env_fn] * num_envs
    if num_workers is not None and backend != "process":
        raise InvalidArgumentError(
            f"make_multi_agent_vec(backend={backend!r}, num_workers=...): num_workers applies "
            "to backend='process' only."
        )
    if config is not None and backend != "ray":
        raise InvalidArgumentError(
            f"make_multi_agent_vec(backend={backend!r}, config=...): config applies to "
            "backend='ray' only."
        )
    if backend == "sync":
        return SyncMultiAgentVectorEnv(fns, policy_mapping_fn)
    if backend == "ray":
        from jaxrunner.multi_agent.ray import RayMultiAgentVectorEnv

        return RayMultiAgentVectorEnv(fns, policy_mapping_fn, config=config)
    if backend == "process":
        from jaxrunner.multi_agent.process import ProcessMultiAgentVectorEnv

        return ProcessMultiAgentVectorEnv(fns, policy_mapping_fn, num_workers=num_workers)
    raise InvalidArgumentError(
        f"make_multi_agent_vec(backend={backend!r}): expected one of {MULTI_AGENT_BACKENDS}."
    )


__all__ = ["MULTI_AGENT_BACKENDS", "make_multi_agent_vec"]

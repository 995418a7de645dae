"""``make_multi_agent_vec``: an alias of :func:`jaxrunner.make_vec` for PettingZoo envs,
with its deprecated ``num_workers`` shorthand."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from jaxrunner._src.backends.make_vec import make_vec
from jaxrunner._src.backends.multi_agent.vector_env import MultiAgentVectorEnv
from jaxrunner._src.backends.process.config import ProcessConfig
from jaxrunner._src.backends.ray.config import RayConfig
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.sub_env_block import EnvFactory
from jaxrunner._src.core.agent_groups import PolicyMappingFn
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


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

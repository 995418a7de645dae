"""``make_vec(..., backend="process")``: the process backend of the sub-envs' kind."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.process.config import ProcessConfig
from jaxrunner._src.backends.process.handle import shutdown
from jaxrunner._src.backends.process.transport import ProcessTransport
from jaxrunner._src.backends.process.vector_env import ProcessVectorEnv
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.sub_env_block import EnvFactory
from jaxrunner._src.core.agent_groups import PolicyMappingFn

if TYPE_CHECKING:
    from jaxrunner._src.backends.base import MultiAgentVectorEnv


def make_process_vec(
    env_fns: Sequence[EnvFactory],
    config: ProcessConfig | None,
    *,
    restart_policy: RestartPolicy | None = None,
    policy_mapping_fn: PolicyMappingFn | None = None,
    multi_agent: bool | None = False,
) -> VectorEnv | MultiAgentVectorEnv:
    """The process backend of the sub-envs' kind (a multi-agent one takes
    ``policy_mapping_fn``). ``multi_agent=None``: the kind is not known: the workers
    (or the main process's share) report it as they start."""
    config = ProcessConfig() if config is None else config
    transport = None
    if multi_agent is None and isinstance(config, ProcessConfig) and env_fns:
        transport = ProcessTransport(env_fns, config, None)
        multi_agent = transport.multi_agent
    try:
        if not multi_agent:
            return ProcessVectorEnv(
                env_fns, config, restart_policy=restart_policy, _transport=transport
            )
        from jaxrunner._src.backends.process.vector_env import ProcessMultiAgentVectorEnv

        return ProcessMultiAgentVectorEnv(
            env_fns, policy_mapping_fn, config=config, restart_policy=restart_policy,
            _transport=transport,
        )  # fmt: skip
    except BaseException:
        if transport is not None:  # not taken by a vector env (its close is idempotent)
            shutdown(transport.res)
        raise

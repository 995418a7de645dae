"""Multi-agent sampling: PettingZoo and JaxMARL envs, agent groups, a policy mapping,
per-group ``[T, B, A_g, ...]`` trajectories with masks, and the multi-agent form of
:class:`~jaxrunner.ExternalEnv`."""

from jaxrunner._src.backends.multi_agent.buffers import GroupBuffers, MultiAgentStep
from jaxrunner._src.backends.multi_agent.jax_env import JaxMultiAgentVectorEnv, to_gymnasium_space
from jaxrunner._src.backends.multi_agent.make import make_multi_agent_vec
from jaxrunner._src.backends.multi_agent.vector_env import (
    MultiAgentVectorEnv,
    SyncMultiAgentVectorEnv,
)
from jaxrunner._src.core.agent_groups import (
    AgentGroup,
    PolicyMappingFn,
    build_groups,
    default_policy_mapping,
)
from jaxrunner._src.core.group_returns import group_gae
from jaxrunner._src.core.multi_agent_trajectory import (
    AgentEpisode,
    GroupTrajectory,
    MultiAgentTrajectory,
    concatenate_agent_episodes,
)
from jaxrunner._src.core.policy_pool import pool_params, pooled_policy
from jaxrunner._src.runner.multi_agent_runner import MultiAgentRunner
from jaxrunner._src.samplers.agent_callbacks import AgentCallbacks
from jaxrunner._src.services.external.multi_agent_env import MultiAgentExternalEnv
from jaxrunner._src.services.multi_agent_evaluation import MultiAgentEvaluationResult

__all__ = [
    "AgentCallbacks",
    "AgentEpisode",
    "AgentGroup",
    "GroupBuffers",
    "GroupTrajectory",
    "JaxMultiAgentVectorEnv",
    "MultiAgentRunner",
    "MultiAgentEvaluationResult",
    "MultiAgentExternalEnv",
    "MultiAgentStep",
    "MultiAgentTrajectory",
    "MultiAgentVectorEnv",
    "PolicyMappingFn",
    "SyncMultiAgentVectorEnv",
    "build_groups",
    "concatenate_agent_episodes",
    "default_policy_mapping",
    "group_gae",
    "make_multi_agent_vec",
    "pool_params",
    "pooled_policy",
    "to_gymnasium_space",
]

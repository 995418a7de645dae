"""Multi-agent sampling: PettingZoo envs, agent groups, a policy mapping, per-group
``[T, B, A_g, ...]`` trajectories with masks (see DESIGN.md, "Multi-agent")."""

from jaxrunner.multi_agent.buffers import GroupBuffers, MultiAgentStep
from jaxrunner.multi_agent.callbacks import AgentCallbacks
from jaxrunner.multi_agent.evaluation import MultiAgentEvaluationResult
from jaxrunner.multi_agent.groups import (
    AgentGroup,
    PolicyMappingFn,
    build_groups,
    default_policy_mapping,
)
from jaxrunner.multi_agent.jax_env import JaxMultiAgentVectorEnv, to_gymnasium_space
from jaxrunner.multi_agent.make import MULTI_AGENT_BACKENDS, make_multi_agent_vec
from jaxrunner.multi_agent.pool import pool_params, pooled_policy
from jaxrunner.multi_agent.returns import group_gae
from jaxrunner.multi_agent.runner import MultiAgentRunner
from jaxrunner.multi_agent.trajectory import (
    AgentEpisode,
    GroupTrajectory,
    MultiAgentTrajectory,
    concatenate_agent_episodes,
)
from jaxrunner.multi_agent.vector_env import MultiAgentVectorEnv, SyncMultiAgentVectorEnv

__all__ = [
    "MULTI_AGENT_BACKENDS",
    "AgentCallbacks",
    "AgentEpisode",
    "AgentGroup",
    "GroupBuffers",
    "GroupTrajectory",
    "JaxMultiAgentVectorEnv",
    "MultiAgentRunner",
    "MultiAgentEvaluationResult",
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

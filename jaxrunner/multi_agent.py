"""Multi-agent sampling: PettingZoo and JaxMARL envs, agent groups, policy mapping,
per-group trajectories; the entry points live at the top level, ``jaxrunner``."""

from jaxrunner._src.backends.functional_env import to_gymnasium_space
from jaxrunner._src.backends.jax_env import JaxMultiAgentVectorEnv
from jaxrunner._src.core.agent_groups import (
    AgentGroup,
    PolicyMappingFn,
    build_groups,
    default_policy_mapping,
)
from jaxrunner._src.core.episode import concatenate_agent_episodes
from jaxrunner._src.core.multi_agent_trajectory import GroupTrajectory
from jaxrunner._src.core.policy_pool import pool_params, pooled_policy
from jaxrunner._src.core.returns import group_gae
from jaxrunner._src.samplers.agent_callbacks import AgentCallbacks
from jaxrunner._src.services.evaluation import MultiAgentEvaluationResult
from jaxrunner._src.services.external.multi_agent_env import MultiAgentExternalEnv

__all__ = [
    "AgentCallbacks",
    "AgentGroup",
    "GroupTrajectory",
    "JaxMultiAgentVectorEnv",
    "MultiAgentEvaluationResult",
    "MultiAgentExternalEnv",
    "PolicyMappingFn",
    "build_groups",
    "concatenate_agent_episodes",
    "default_policy_mapping",
    "group_gae",
    "pool_params",
    "pooled_policy",
    "to_gymnasium_space",
]

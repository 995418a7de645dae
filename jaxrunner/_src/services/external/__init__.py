"""ExternalEnv and MultiAgentExternalEnv (one core, two views): environments that run on
their own and call in for actions (RLlib's ExternalEnv). See docs/serving.md."""

from jaxrunner._src.services.external.config import ExternalEnvConfig as ExternalEnvConfig
from jaxrunner._src.services.external.env import ExternalEnv as ExternalEnv
from jaxrunner._src.services.external.episodes import MAX_EPISODE_ID as MAX_EPISODE_ID
from jaxrunner._src.services.external.episodes import AgentRecord as AgentRecord
from jaxrunner._src.services.external.multi_agent_env import (
    MultiAgentExternalEnv as MultiAgentExternalEnv,
)

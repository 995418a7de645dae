"""ExternalEnv: environments that run on their own and call in for actions.

Inverted control, as RLlib's ExternalEnv: a game client, a robot or a simulator
owned by someone else drives the episode and asks for actions::

    env = jr.ExternalEnv(obs_space, action_space, policy, params, seed=0)
    eid = env.start_episode()
    action = env.get_action(eid, obs)      # on-policy: the policy chooses
    env.log_returns(eid, reward)           # rewards add up until the next action
    env.log_action(eid, obs, action)       # off-policy: the action was chosen elsewhere
    env.end_episode(eid, final_obs)        # or truncated=True
    episodes = env.poll_episodes()         # list[jr.Episode], same schema as EnvRunner's

Any number of threads may call in for any number of episodes at once; their
``get_action``/``log_action`` calls are batched into one compiled policy call
(:mod:`jaxrunner._src.services.external.batching`). A transition ``(obs[t], action[t], reward[t],
obs[t+1])`` is made of the observation of one call, the action it got, the rewards
logged after it and the observation of the next call (or of ``end_episode``).

Every argument is checked before any state changes: a bad call raises and leaves
the episode exactly as it was. Abandoned episodes (no call for
``episode_timeout_s``) are ended by a reaper as truncated at the last observation
seen; the action that observation got never had an outcome, so that step is
dropped and counted in ``num_dropped_steps``.

:class:`MultiAgentExternalEnv` is the multi-agent form (RLlib's
ExternalMultiAgentEnv): the same calls with ``{agent_id: value}`` dicts, agents
batched per policy, agent episodes (:class:`~jaxrunner.AgentEpisode`) out; it is built
from the same parts (:mod:`.multi_agent_env`, :mod:`.multi_agent_env_core`, :mod:`.agents`,
:mod:`.multi_agent_delivery`, :mod:`.multi_agent_endings`).

Modules: :mod:`.env` (the :class:`ExternalEnv` facade), :mod:`.checks` (argument
checks), :mod:`.episodes` (live records and episode ids), :mod:`.delivery` (policy
requests, from submission to the recorded step), :mod:`.memory` (the byte budget),
:mod:`.endings` (ending episodes), :mod:`.output` (finished episodes until polled),
:mod:`.metrics`, :mod:`.reaper`, :mod:`.run_thread`, :mod:`.config`.
"""

from jaxrunner._src.services.external.config import ExternalEnvConfig
from jaxrunner._src.services.external.env import ExternalEnv
from jaxrunner._src.services.external.episodes import (
    CLIENT_IDS_KEPT,
    ENDED_IDS_KEPT,
    MAX_EPISODE_ID,
    EpisodeRecord,
)
from jaxrunner._src.services.external.multi_agent_env import MultiAgentExternalEnv

__all__ = [
    "CLIENT_IDS_KEPT",
    "ENDED_IDS_KEPT",
    "MAX_EPISODE_ID",
    "ExternalEnv",
    "ExternalEnvConfig",
    "EpisodeRecord",
    "MultiAgentExternalEnv",
]

"""Multi-agent runner hooks, per agent episode, and the joining of agent episodes that
span samples (shared by the hooks and ``MultiAgentRunner.sample_episodes``)."""

from __future__ import annotations

from collections.abc import Sequence

from jaxrunner._src.core.multi_agent_trajectory import AgentEpisode, concatenate_agent_episodes
from jaxrunner._src.core.runner_state import EpisodeJoiner, Runner
from jaxrunner._src.samplers.callbacks import overrides as overrides_hook


class AgentCallbacks:
    """Subclass and override the hooks you need (``MultiAgentRunner(...,
    callbacks=...)``). Hooks you do not override cost nothing; they run on the host,
    after each ``sample()``."""

    def on_agent_episode_end(self, runner: Runner, episode: AgentEpisode) -> None:
        """Once per complete agent episode (every transition, from its first to the one
        that ended it, joined across samples): after each ``sample()``, those that
        completed in it, by env episode id, then agent; those cut by a failure of their
        env (a restart) end there, ``episode.faulty``."""


def overrides(callbacks: AgentCallbacks | None, hook: str) -> bool:
    """Whether ``callbacks`` overrides ``hook`` (else it is never called)."""
    return callbacks is not None and overrides_hook(callbacks, hook, AgentCallbacks)


def agent_episode_joiner(possible_agents: Sequence[str]) -> EpisodeJoiner[AgentEpisode]:
    """Joins agent episodes across samples: one stream per agent and env, complete
    episodes by env episode id, then the env's agent order."""
    rank = {agent: k for k, agent in enumerate(possible_agents)}
    return EpisodeJoiner(
        key=lambda e: (e.agent_id, e.env_id),
        concatenate=concatenate_agent_episodes,
        order=lambda e: (e.episode_id, rank[e.agent_id]),
    )

"""Multi-agent runner hooks, per agent episode, and the joining of agent episodes that
span samples (shared by the hooks and ``MultiAgentRunner.sample_episodes``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxrunner.multi_agent.trajectory import (
    AgentEpisode,
    MultiAgentTrajectory,
    concatenate_agent_episodes,
)

if TYPE_CHECKING:
    from jaxrunner.multi_agent.runner import MultiAgentRunner


class AgentCallbacks:
    """Subclass and override the hooks you need (``MultiAgentRunner(...,
    callbacks=...)``). Hooks you do not override cost nothing; they run on the host,
    after each ``sample()``."""

    def on_agent_episode_end(self, runner: MultiAgentRunner, episode: AgentEpisode) -> None:
        """Once per complete agent episode (every transition, from its first to the one
        that ended it, joined across samples): after each ``sample()``, those that
        completed in it, by env episode id, then agent. Agent episodes cut by a failure
        of their env (a restart) never complete, and are not reported."""


def overrides(callbacks: AgentCallbacks | None, hook: str) -> bool:
    """Whether ``callbacks`` overrides ``hook`` (else it is never called)."""
    return callbacks is not None and getattr(type(callbacks), hook) is not getattr(
        AgentCallbacks, hook
    )


class AgentEpisodeJoiner:
    """Joins each sample's agent episodes with their parts from earlier samples; keeps
    the unfinished ones for the next sample.

    Args:
        order: agent id -> its rank (the env's agent order).
    """

    def __init__(self, order: dict[str, int]) -> None:
        self.order = order
        self.fragments: dict[tuple[str, int], AgentEpisode] = {}
        """(agent, env) -> the unfinished agent episode so far."""

    def complete(self, traj: MultiAgentTrajectory) -> list[AgentEpisode]:
        """The agent episodes that complete in ``traj``, by env episode id, then agent."""
        done = []
        for part in traj.split_episodes():
            key = (part.agent_id, part.env_id)
            head = self.fragments.pop(key, None)
            if head is not None and head.episode_id == part.episode_id:
                part = concatenate_agent_episodes(head, part)
            if not part.is_done:
                self.fragments[key] = part
            elif part.is_complete:
                done.append(part)
        done.sort(key=lambda e: (e.episode_id, self.order[e.agent_id]))
        return done


__all__ = ["AgentCallbacks", "AgentEpisodeJoiner", "overrides"]

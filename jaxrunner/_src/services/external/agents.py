"""The records of a :class:`~jaxrunner._src.services.external.MultiAgentExternalEnv` episode:
one single-agent :class:`~.episodes.EpisodeRecord` per agent (so the single-agent endings,
memory accounting and output serve it unchanged), under one live record per env episode.
Nothing here locks: the env holds its lock around every call."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from gymnasium import spaces

from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.core.episode import AgentEpisode
from jaxrunner._src.services.external.episodes import EpisodeRecord


@dataclasses.dataclass
class AgentRecord(EpisodeRecord):
    """One agent's part of a live multi-agent episode.

    ``episode_id``, ``client``, ``env_id`` and ``training_enabled`` are the env
    episode's. A reward logged before the agent's first action waits in
    ``pending_reward`` and goes onto that action (as the multi-agent runner does).
    """

    agent_id: str = ""
    policy_id: str = ""
    index: int = 0
    """The agent's index in ``possible_agents`` (for its action keys)."""
    env_steps: list[int] = dataclasses.field(default_factory=list)
    """The env step (index of the episode's action call) of each action."""
    done: bool = False
    """The agent has ended (or its episode has): no further call may name it."""

    def record_at(
        self,
        env_step: int,
        obs: Any,
        action: Any,
        extras: dict[str, np.ndarray],
        carry: Any,
        ticket: object = None,
    ) -> None:
        """Appends one step taken at ``env_step`` (see :meth:`EpisodeRecord.record`)."""
        self.record(obs, action, extras, carry, ticket=ticket)
        self.env_steps.append(env_step)

    def can_undo(self, ticket: object) -> bool:
        """Whether the latest step is the one recorded with ``ticket``."""
        return self._undo is not None and self._undo[0] is ticket

    def undo(self, ticket: object) -> bool:
        """As :meth:`EpisodeRecord.undo`, keeping ``env_steps`` aligned."""
        if not super().undo(ticket):
            return False
        self.env_steps.pop()
        return True

    def abandon(self, observation_space: spaces.Space) -> int:
        """As :meth:`EpisodeRecord.abandon`, keeping ``env_steps`` aligned."""
        dropped = super().abandon(observation_space)
        del self.env_steps[len(self.env_steps) - dropped :]
        return dropped

    def to_episode(  # type: ignore[override]
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        *,
        terminated: bool,
        truncated: bool,
    ) -> AgentEpisode:
        """The closed record as an :class:`~jaxrunner.AgentEpisode`
        (consumes it, as :meth:`EpisodeRecord.to_episode`)."""
        env_steps = np.asarray(self.env_steps, np.int64)
        episode = super().to_episode(
            observation_space, action_space, terminated=terminated, truncated=truncated
        )
        return AgentEpisode(
            obs=episode.obs,
            action=episode.action,
            reward=episode.reward,
            extras=episode.extras,
            env_step=env_steps,
            terminated=terminated,
            truncated=truncated,
            agent_id=self.agent_id,
            policy_id=self.policy_id,
            env_id=self.env_id,
            episode_id=self.episode_id,
            start_step=0,
        )


@dataclasses.dataclass
class MultiAgentEpisodeRecord(EpisodeRecord):
    """A live multi-agent episode: the env-level record (``busy``, ``reserved``,
    ``last_seen``, as for one agent) and its agents' records. Its own step lists stay
    empty; ``num_calls`` counts its env steps (action calls)."""

    agents: dict[str, AgentRecord] = dataclasses.field(default_factory=dict)
    num_calls: int = 0

    def agent(self, group: AgentGroup, agent_id: str, index: int, carry: Any) -> AgentRecord:
        """The record of ``agent_id`` (of ``group``), made at its first mention."""
        record = self.agents.get(agent_id)
        if record is None:
            record = AgentRecord(
                self.episode_id,
                self.client,
                self.env_id,
                self.training_enabled,
                carry,
                self.last_seen,
                agent_id=agent_id,
                policy_id=group.policy_id,
                index=index,
            )
            self.agents[agent_id] = record
        return record

    def open_agents(self) -> list[AgentRecord]:
        """The agents that have acted and not ended: each needs a final observation."""
        return [r for r in self.agents.values() if not r.done and r.num_actions]

"""How the agents of a :class:`~jaxrunner._src.services.external.MultiAgentExternalEnv` end
(``end_agents``, ``end_episode`` or the reaper): each agent that acted goes to the
single-agent :class:`~.endings.EpisodeEndings` of its policy; one that never acted has no
episode."""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import Any, cast

from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.core.metrics import EpisodeStats
from jaxrunner._src.services.external.agents import AgentRecord, MultiAgentEpisodeRecord
from jaxrunner._src.services.external.endings import Emit, EpisodeEndings
from jaxrunner._src.services.external.episodes import EpisodeTable
from jaxrunner._src.services.external.memory import MemoryBudget


class AgentEndings:
    """Ends the agents of live multi-agent episodes.

    Args:
        lock: the env's lock; :meth:`close` is called with it held, :meth:`finish`
            and :meth:`reap` without it.
        episodes: the env's live episodes.
        memory, counts, stats: the env's memory budget, counters and recent-episode
            statistics (agent steps count in ``num_agent_steps``).
        groups: the env's agent groups (one :class:`EpisodeEndings` each).
        emit: called, with the lock held, with each ended agent and its AgentEpisode.
    """

    def __init__(
        self,
        lock: threading.Lock,
        episodes: EpisodeTable,
        memory: MemoryBudget,
        counts: collections.Counter[str],
        stats: EpisodeStats,
        groups: Sequence[AgentGroup],
        emit: Emit,
    ) -> None:
        self._lock, self._episodes, self._counts = lock, episodes, counts
        self._group_of = {a: g for g in groups for a in g.agents}
        self._per_policy = {
            g.policy_id: EpisodeEndings(
                lock,
                episodes,
                memory,
                counts,
                stats,
                g.observation_space,
                g.action_space,
                emit,
                steps_key="num_agent_steps",
            )
            for g in groups
        }

    @staticmethod
    def close(record: AgentRecord, final_obs: Any) -> AgentRecord | None:
        """Marks the agent ended; if it acted, closes its record at ``final_obs`` (the
        caller made sure there is one) and returns it for :meth:`finish`; else None
        (caller holds the lock)."""
        record.done = True
        if not record.num_actions:
            return None
        record.close_at(final_obs)
        return record

    def finish(self, records: Sequence[AgentRecord | None], truncated: bool) -> None:
        """Stacks, counts and outputs closed agent records (without the lock)."""
        for record in records:
            if record is not None:
                self._per_policy[record.policy_id].finish(
                    record, terminated=not truncated, truncated=bool(truncated)
                )

    def reap(self, idle_since: float) -> int:
        """Ends every idle episode last seen before ``idle_since``: each agent still in
        it is truncated at its last observation, its step in wait of an outcome
        dropped; returns how many episodes (without the lock)."""
        ended: list[AgentRecord | None] = []
        with self._lock:
            stale = self._episodes.idle_since(idle_since)
            for live in stale:
                for record in cast(MultiAgentEpisodeRecord, live).agents.values():
                    if record.done:
                        continue
                    record.done = True
                    if record.num_actions:
                        space = self._group_of[record.agent_id].observation_space
                        self._counts["num_dropped_steps"] += record.abandon(space)
                        ended.append(record)
                self._counts["num_abandoned_episodes"] += 1
                self._counts["num_ended_episodes"] += 1
                self._episodes.remove(live)
        self.finish(ended, truncated=True)
        return len(stale)

"""How the agents of an external env's episodes end (``end_agents``, ``end_episode`` or the
reaper): closed under the lock, stacked without it (a long episode stalls no other call),
and counted and handed on under the lock again."""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.core.episode import Episode
from jaxrunner._src.core.metrics import EpisodeStats
from jaxrunner._src.services.external.episodes import AgentRecord, EpisodeRecord, EpisodeTable
from jaxrunner._src.services.external.memory import MemoryBudget


@dataclasses.dataclass(eq=False)
class EpisodeEndings:
    """Ends the agents of live episodes. :meth:`close` runs with the env's ``lock`` held,
    :meth:`finish` and :meth:`reap` without it; ``emit`` is called with it held, with each
    ended agent and its Episode (None when it had no step). ``unassigned_reward`` sums the
    rewards of agents that ended without an action (as the multi-agent sampler's)."""

    lock: threading.Lock
    episodes: EpisodeTable
    memory: MemoryBudget
    counts: collections.Counter[str]
    stats: EpisodeStats
    groups: Mapping[str, AgentGroup]
    """Each policy id's group."""
    emit: Callable[[AgentRecord, Any], None]
    unassigned_reward: float = 0.0

    def close(self, record: AgentRecord, final_obs: Any) -> AgentRecord | None:
        """Marks the agent ended; if it ends as an episode, closes its record at
        ``final_obs`` (the caller made sure there is one) and returns it for
        :meth:`finish`; else None, its rewards counted as unassigned (caller holds the
        lock)."""
        record.done = True
        if not record.ends_as_episode:
            self.unassigned_reward += record.pending_reward
            return None
        record.close_at(final_obs)
        return record

    def remove(self, live: EpisodeRecord) -> None:
        """Ends the live episode ``live`` (its agents closed already): gone from the
        live ones, its records' charge given back (caller holds the lock)."""
        self.episodes.remove(live)
        self.memory.live -= live.nbytes
        self.counts["num_ended_episodes"] += 1

    def finish(self, records: Sequence[AgentRecord | None], truncated: bool) -> None:
        """Stacks, counts and outputs closed agent records (without the lock)."""
        for record in (r for r in records if r is not None):
            group = self.groups[record.policy_id]
            episode: Episode | None = None
            length = record.num_actions  # stacking empties the record
            try:
                if length:
                    episode = record.to_episode(
                        group.observation_space,
                        group.action_space,
                        terminated=not truncated,
                        truncated=bool(truncated),
                    )
            finally:
                with self.lock:
                    self.memory.live -= record.nbytes
                    self.counts["num_agent_steps"] += length
                    if length and episode is None:  # stacking failed (out of memory)
                        self.counts["num_dropped_steps"] += length
                    rewards = np.array([sum(record.rewards)], np.float64)
                    self.stats.add(rewards, np.array([length]))
                    self.emit(record, episode)

    def reap(self, idle_since: float) -> int:
        """What ``ExternalEnvCore.reap`` says it does (called without the lock)."""
        ended: list[AgentRecord | None] = []
        with self.lock:
            stale = self.episodes.idle_since(idle_since)
            for live in stale:
                for record in live.agents.values():
                    if record.done:
                        continue
                    if not record.ends_as_episode:
                        self.close(record, None)  # its rewards are unassigned
                        continue
                    record.done = True
                    space = self.groups[record.policy_id].observation_space
                    self.counts["num_dropped_steps"] += record.abandon(space)
                    ended.append(record)
                self.counts["num_abandoned_episodes"] += 1
                self.remove(live)
        self.finish(ended, truncated=True)
        return len(stale)

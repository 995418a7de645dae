"""How the agents of an external env's episodes end: closed under the lock, stacked without
it (a long episode stalls no other call), then counted and output under the lock."""

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
    """Ends the agents of live episodes: :meth:`close` and :meth:`remove` with the env's
    ``lock`` held, :meth:`finish` and :meth:`reap` without it. ``unassigned_reward`` sums
    the rewards of ended agents that no step of theirs carries (none, or an overflow)."""

    lock: threading.Lock
    episodes: EpisodeTable
    memory: MemoryBudget
    counts: collections.Counter[str]
    stats: EpisodeStats
    groups: Mapping[str, AgentGroup]  # by policy id
    emit: Callable[[AgentRecord, Any], None]  # under the lock, Episode None if no step
    unassigned_reward: float = 0.0

    def close(self, record: AgentRecord, final_obs: Any) -> AgentRecord | None:
        """Marks the agent ended; returns its record closed at ``final_obs`` for
        :meth:`finish`, or None if it ends without an episode (rewards unassigned)."""
        record.done = True
        self._unassign(record)
        if not record.ends_as_episode:
            return None
        record.close_at(final_obs)
        return record

    def _unassign(self, record: AgentRecord) -> None:
        """Counts the rewards of an ending agent that no step of it will carry."""
        self.unassigned_reward += record.unassigned_reward
        if not record.ends_as_episode:
            self.unassigned_reward += record.pending_reward

    def remove(self, live: EpisodeRecord) -> None:
        """Ends ``live`` (its agents closed already), giving its records' charge back."""
        self.episodes.remove(live)
        self.memory.live -= live.nbytes
        self.counts["num_ended_episodes"] += 1

    def finish(self, records: Sequence[AgentRecord | None], truncated: bool) -> None:
        """Stacks, counts and outputs closed agent records."""
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
                    if length:  # reaped with its one action dropped: no episode to count
                        rewards = np.array([sum(record.rewards)], np.float64)
                        self.stats.add(rewards, np.array([length]))
                    self.emit(record, episode)

    def reap(self, idle_since: float) -> int:
        """See ``ExternalEnvCore.reap``."""
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
                    self.counts["num_dropped_steps"] += record.abandon()
                    self._unassign(record)  # its only action dropped: its rewards too
                    ended.append(record)
                self.counts["num_abandoned_episodes"] += 1
                self.remove(live)
        self.finish(ended, truncated=True)
        return len(stale)

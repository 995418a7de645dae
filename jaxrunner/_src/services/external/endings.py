"""How an :class:`~jaxrunner.ExternalEnv` episode ends (``end_episode`` or the reaper): it
leaves the live table under the lock, is stacked without it (a long episode stalls no
other call), and is counted and handed on under the lock again."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

from jaxrunner._src.core.metrics import EpisodeStats
from jaxrunner._src.services.external.episodes import EpisodeRecord, EpisodeTable
from jaxrunner._src.services.external.memory import MemoryBudget

Emit = Callable[[EpisodeRecord, Any], None]
"""``emit(record, episode)``: ``episode`` is what ``record.to_episode`` gave, or None."""


class EpisodeEndings:
    """Ends live episodes.

    Args:
        lock: the env's lock; :meth:`finish` and :meth:`reap` take it themselves.
        episodes: the env's live episodes.
        memory: the env's memory budget (an ended episode's live bytes are freed).
        counts: the env's counters (``steps_key``, ``num_dropped_steps``,
            ``num_abandoned_episodes``).
        stats: the env's recent-episode statistics.
        observation_space: one episode's observation space.
        action_space: one episode's action space.
        emit: called, with the lock held, with each ended episode and its Episode
            (None when it had no step); ``ExternalEnv._emit``, which a policy client
            overrides.
        steps_key: the counter the ended episode's steps are added to
            (``num_agent_steps`` for the agent records of a MultiAgentExternalEnv).

    An agent record's ``to_episode`` gives an AgentEpisode: the same ending serves
    each agent of a multi-agent episode, one group's spaces per instance.
    """

    def __init__(
        self,
        lock: threading.Lock,
        episodes: EpisodeTable,
        memory: MemoryBudget,
        counts: collections.Counter[str],
        stats: EpisodeStats,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        emit: Emit,
        steps_key: str = "num_env_steps",
    ) -> None:
        self._lock = lock
        self._episodes, self._memory, self._counts, self._stats = episodes, memory, counts, stats
        self._observation_space, self._action_space = observation_space, action_space
        self._emit = emit
        self._steps_key = steps_key

    def finish(self, live: EpisodeRecord, terminated: bool, truncated: bool) -> None:
        """Stacks ``live`` (closed, and removed from the live table by the caller) and
        counts and emits it. Called without the lock."""
        episode, length = None, live.num_actions  # stacking empties the record
        try:
            if length:
                episode = live.to_episode(
                    self._observation_space,
                    self._action_space,
                    terminated=terminated,
                    truncated=truncated,
                )
        finally:
            with self._lock:
                self._memory.live -= live.nbytes
                self._counts[self._steps_key] += length
                if length and episode is None:  # stacking failed (out of memory)
                    self._counts["num_dropped_steps"] += length
                self._stats.add(np.array([sum(live.rewards)], np.float64), np.array([length]))
                self._emit(live, episode)

    def reap(self, idle_since: float) -> int:
        """Ends every idle episode last seen before ``idle_since`` as truncated at its
        last observation, dropping its step in wait of an outcome; returns how many.
        Called without the lock."""
        with self._lock:
            stale = self._episodes.idle_since(idle_since)
            for live in stale:
                self._counts["num_dropped_steps"] += live.abandon(self._observation_space)
                self._counts["num_abandoned_episodes"] += 1
                self._episodes.remove(live)
        for live in stale:
            self.finish(live, terminated=False, truncated=True)
        return len(stale)

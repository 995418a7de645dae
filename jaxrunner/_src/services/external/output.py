"""The output of the external envs: finished training episodes until polled."""

from __future__ import annotations

import collections
import threading
from typing import Generic, TypeVar

from jaxrunner._src.core.episode import EpisodeSpan
from jaxrunner._src.services.external.memory import MemoryBudget, episode_nbytes
from jaxrunner.errors import ActionTimeoutError

E = TypeVar("E", bound=EpisodeSpan)


class EpisodeOutput(Generic[E]):
    """Finished episodes in the order they ended, charged to ``memory.output``; past
    ``max_episodes`` the oldest are dropped. :meth:`put` is called with ``lock`` held."""

    def __init__(self, lock: threading.Lock, memory: MemoryBudget, max_episodes: int) -> None:
        self._episodes: collections.deque[E] = collections.deque()
        self._ready = threading.Condition(lock)
        self._memory = memory
        self._max_episodes = max_episodes

    def put(self, episode: E) -> int:
        """Adds ``episode``; returns the steps dropped to make room."""
        self._episodes.append(episode)
        self._memory.output += episode_nbytes(episode)
        dropped_steps = 0
        if len(self._episodes) > self._max_episodes:
            dropped = self._episodes.popleft()
            self._memory.output -= episode_nbytes(dropped)
            dropped_steps = dropped.length
        self._ready.notify_all()
        return dropped_steps

    def poll(self) -> list[E]:
        with self._ready:
            episodes = list(self._episodes)
            self._episodes.clear()
            self._memory.output = 0
            return episodes

    def take(self, num_episodes: int, timeout_s: float | None) -> list[E]:
        """Waits until ``num_episodes`` are held and takes them (none on a timeout)."""
        with self._ready:
            if not self._ready.wait_for(lambda: len(self._episodes) >= num_episodes, timeout_s):
                raise ActionTimeoutError(
                    f"sample_episodes({num_episodes}): only {len(self._episodes)} episodes "
                    f"ended within {timeout_s} s."
                )
            taken = [self._episodes.popleft() for _ in range(num_episodes)]
            self._memory.output -= sum(episode_nbytes(e) for e in taken)
            return taken

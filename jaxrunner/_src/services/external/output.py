"""The output of the external envs: finished training episodes until polled."""

from __future__ import annotations

import collections
import threading
from typing import Generic, TypeVar

from jaxrunner._src.core.episode import EpisodeSpan
from jaxrunner._src.services.external.memory import MemoryBudget, episode_nbytes
from jaxrunner.errors import ActionTimeoutError, ClosedError

E = TypeVar("E", bound=EpisodeSpan)


class EpisodeOutput(Generic[E]):
    """Finished episodes in the order they ended, charged to ``memory.output``; past
    ``max_episodes`` the oldest are dropped. :meth:`put` is called with ``lock`` held."""

    def __init__(self, lock: threading.Lock, memory: MemoryBudget, max_episodes: int) -> None:
        self._episodes: collections.deque[E] = collections.deque()
        self._ready = threading.Condition(lock)
        self._memory = memory
        self._max_episodes = max_episodes
        self._closed = False  # no call can end an episode any more

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

    def close(self) -> None:
        """No more episodes will end: wakes the waiters of :meth:`take`."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def take(self, num_episodes: int, timeout_s: float | None, owner: str) -> list[E]:
        """Waits until ``num_episodes`` are held and takes them (none on a timeout, or
        once :meth:`close` says no more will come)."""
        with self._ready:

            def done() -> bool:
                return len(self._episodes) >= num_episodes or self._closed

            self._ready.wait_for(done, timeout_s)
            held = len(self._episodes)
            if held < num_episodes and self._closed:
                raise ClosedError(
                    f"{owner}.sample_episodes({num_episodes}): the env is closed, only {held} "
                    "episodes are held and no more can end; take them with poll_episodes(), "
                    f"or create a new {owner}."
                )
            if held < num_episodes:
                raise ActionTimeoutError(
                    f"sample_episodes({num_episodes}): only {held} episodes "
                    f"ended within {timeout_s} s."
                )
            taken = [self._episodes.popleft() for _ in range(num_episodes)]
            self._memory.output -= sum(episode_nbytes(e) for e in taken)
            return taken

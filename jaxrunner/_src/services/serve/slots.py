"""Connection slots of the policy server: who holds them, and whom to close when they run
short (docs/serving.md, "Limits"). Used on the event loop thread only: nothing locks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Slot(Protocol):
    """What :class:`ConnectionSlots` needs of a connection."""

    def evict(self, reason: str) -> None:
        """Closes the connection now."""

    def linger(self, reason: str) -> None:
        """Stops reading; closes once :meth:`ConnectionSlots.linger_over` says so."""


class ConnectionSlots:
    """The open connections of one server, in the order they opened and went idle.
    ``grace_s`` spares a new connection that has sent nothing; one closed for the
    unauthenticated share after a tokenless request lingers ``linger_s`` (see
    :meth:`linger_over`), at most ``max_lingering`` of them (None: ``max_connections``)."""

    def __init__(
        self,
        max_connections: int,
        max_unauthenticated: int,
        grace_s: float = 1.0,
        linger_s: float = 0.0,
        max_lingering: int | None = None,
        max_linger_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_connections = max_connections
        self.max_unauthenticated = max_unauthenticated
        self.grace_s = grace_s
        self.linger_s = linger_s
        self.max_lingering = max_connections if max_lingering is None else max_lingering
        self.max_linger_s = max_linger_s
        self._clock = clock
        self._open: set[Slot] = set()
        # dicts as ordered sets: oldest first
        self._unauthenticated: dict[Slot, None] = {}
        self._tokenless: dict[Slot, None] = {}  # sent a whole request without the token
        self._fresh: dict[Slot, float] = {}  # never sent a byte: since when open
        self._idle: dict[Slot, None] = {}
        self._lingering: dict[Slot, float] = {}  # out of the slots, still open: since when
        # The transport's: whether a trim() is due, connections refused since it last
        # logged them, and when it did (its loop's clock).
        self.trim_scheduled = False
        self.refused = 0
        self.refusal_logged_at = float("-inf")

    def __len__(self) -> int:
        return len(self._open)

    @property
    def num_unauthenticated(self) -> int:
        return len(self._unauthenticated)

    @property
    def num_lingering(self) -> int:
        return len(self._lingering)

    def admit(self, slot: Slot) -> bool:
        """Takes a slot for a new connection (unauthenticated, idle); False: none is
        free (refuse it). At ``max_connections`` the connection idle the longest is
        closed: a tokenless one, then one silent for ``grace_s``, then any other
        unauthenticated one, then, only while the share is kept, an authenticated one.
        The share is restored by :meth:`trim`, after the newcomers' grace."""
        if len(self._open) >= self.max_connections:
            victim = (
                self._first(self._tokenless, self._idle)
                or self._oldest_silent()
                or self._first(self._unauthenticated, self._idle, exclude=self._fresh)
            )
            if victim is None and len(self._unauthenticated) < self.max_unauthenticated:
                victim = self._first(self._idle, exclude=self._fresh)
            if victim is None:
                return False
            self._close(victim, "the server is at max_connections: idle connections go first")
        self._open.add(slot)
        self._unauthenticated[slot] = None
        self._fresh[slot] = self._clock()
        self._idle[slot] = None
        return True

    def over_share(self) -> bool:
        """Whether connections without the token hold more than their share."""
        return len(self._unauthenticated) > self.max_unauthenticated

    def trim(self) -> bool:
        """Closes connections without the token down to their share, the oldest first:
        tokenless ones (idle first), then silent ones, then any but those in their grace.
        Returns whether some are still over the share (new ones in their grace)."""
        while self.over_share():
            victim = (
                self._first(self._tokenless, self._idle)
                or self._first(self._tokenless)
                or self._oldest_silent()
                or self._first(self._unauthenticated, exclude=self._fresh)
            )
            if victim is None:
                return True
            self._close(victim, "too many connections without a token")
        return False

    def _oldest_silent(self) -> Slot | None:
        """The oldest connection, if it has sent nothing for ``grace_s``."""
        for slot, opened in self._fresh.items():  # in the order they opened
            return slot if opened <= self._clock() - self.grace_s else None
        return None

    def authenticated(self, slot: Slot) -> None:
        """``slot`` sent a request with the token."""
        self._unauthenticated.pop(slot, None)
        self._tokenless.pop(slot, None)

    def is_authenticated(self, slot: Slot) -> bool:
        """Whether ``slot`` has sent a request with the token."""
        return slot in self._open and slot not in self._unauthenticated

    def tokenless(self, slot: Slot) -> None:
        """``slot`` sent a whole request without the token."""
        if slot in self._unauthenticated:
            self._tokenless.setdefault(slot, None)

    def busy(self, slot: Slot) -> None:
        """A request is arriving or being answered on ``slot``."""
        self._idle.pop(slot, None)
        self._fresh.pop(slot, None)

    def idle(self, slot: Slot) -> None:
        """``slot`` is between requests (it joins the idle ones as the newest)."""
        if slot in self._open:
            self._idle.pop(slot, None)
            self._idle[slot] = None

    def release(self, slot: Slot) -> None:
        """``slot``'s connection is closed."""
        self._open.discard(slot)
        self._unauthenticated.pop(slot, None)
        self._tokenless.pop(slot, None)
        self._fresh.pop(slot, None)
        self._idle.pop(slot, None)
        self._lingering.pop(slot, None)

    def linger_over(self, slot: Slot) -> bool:
        """Whether ``slot``, lingering for ``linger_s`` (again), is closed now; False: it
        lingers ``linger_s`` more, as it does while more than ``max_unauthenticated``
        linger (an attack: a closed socket would come back into the accept queue ahead of
        newcomers with the token), up to ``max_linger_s`` in all."""
        since = self._lingering.get(slot)
        if since is None:
            return True
        if (
            len(self._lingering) > self.max_unauthenticated
            and self._clock() - since + self.linger_s <= self.max_linger_s
        ):
            return False
        self.release(slot)
        return True

    def _close(self, slot: Slot, reason: str) -> None:
        # Lingering, an owner that reconnects on the close cannot come straight back.
        if (
            self.linger_s > 0
            and self.max_lingering > 0
            and slot in self._tokenless
            and slot in self._idle
        ):
            if len(self._lingering) >= self.max_lingering:
                self._evict(next(iter(self._lingering)), "too many lingering connections")
            self.release(slot)
            self._lingering[slot] = self._clock()
            slot.linger(reason)
        else:
            self._evict(slot, reason)

    def _evict(self, slot: Slot, reason: str) -> None:
        self.release(slot)
        slot.evict(reason)

    @staticmethod
    def _first(
        slots: dict[Slot, None],
        among: dict[Slot, None] | None = None,
        exclude: dict[Slot, float] | None = None,
    ) -> Slot | None:
        """The oldest of ``slots`` that is in ``among`` and not in ``exclude``."""
        for slot in slots:
            if (among is None or slot in among) and (exclude is None or slot not in exclude):
                return slot
        return None

"""Connection slots of the policy server: who holds them, and whom to close when
they run short.

Two rules keep sockets without a token from denying service (issue 30):

* Connections that have not yet sent a request with the server's token (every new
  one, until its first request's headers arrive) hold at most
  ``max_unauthenticated`` slots. One more closes the oldest of them, idle ones
  first (a keep-alive socket between requests, a socket that never sent a byte),
  else the oldest: a tokenless client can churn that share, never take the rest.
* At ``max_connections``, a new connection closes the connection idle the longest
  (unauthenticated ones first) instead of being refused, as nginx and HAProxy reuse
  idle keep-alive connections when they run out; it is refused (503) only when no
  connection is idle.

Everything here runs on the server's event loop thread, so nothing locks.
"""

from __future__ import annotations

from typing import Protocol


class Slot(Protocol):
    """What :class:`ConnectionSlots` needs of a connection."""

    def evict(self, reason: str) -> None:
        """Closes the connection now (it is given back its slot by :meth:`release`)."""


class ConnectionSlots:
    """The open connections of one server, in the order they opened and went idle.

    Args:
        max_connections: the most open connections.
        max_unauthenticated: the most open connections without a token yet.
    """

    def __init__(self, max_connections: int, max_unauthenticated: int) -> None:
        self.max_connections = max_connections
        self.max_unauthenticated = max_unauthenticated
        self._open: set[Slot] = set()
        # dicts as ordered sets: oldest first
        self._unauthenticated: dict[Slot, None] = {}
        self._idle: dict[Slot, None] = {}
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._open)

    @property
    def num_unauthenticated(self) -> int:
        return len(self._unauthenticated)

    def admit(self, slot: Slot) -> bool:
        """Takes a slot for a new connection (unauthenticated, idle), closing others
        as the module docstring says; False: none is free (refuse it)."""
        if len(self._unauthenticated) >= self.max_unauthenticated:
            victim = self._first(self._unauthenticated, idle_first=True)
            if victim is not None:
                self._evict(victim, "too many connections without a token")
        if len(self._open) >= self.max_connections:
            victim = self._first(self._idle, unauthenticated_first=True)
            if victim is None:
                return False
            self._evict(victim, "the server is at max_connections: idle connections go first")
        self._open.add(slot)
        self._unauthenticated[slot] = None
        self._idle[slot] = None
        return True

    def authenticated(self, slot: Slot) -> None:
        """``slot`` sent the token: it no longer counts as unauthenticated."""
        self._unauthenticated.pop(slot, None)

    def busy(self, slot: Slot) -> None:
        """A request is arriving or being answered on ``slot``."""
        self._idle.pop(slot, None)

    def idle(self, slot: Slot) -> None:
        """``slot`` is between requests (it joins the idle ones as the newest)."""
        if slot in self._open:
            self._idle.pop(slot, None)
            self._idle[slot] = None

    def release(self, slot: Slot) -> None:
        """``slot``'s connection is closed."""
        self._open.discard(slot)
        self._unauthenticated.pop(slot, None)
        self._idle.pop(slot, None)

    def _evict(self, slot: Slot, reason: str) -> None:
        self.release(slot)
        self.num_evicted += 1
        slot.evict(reason)

    def _first(
        self,
        slots: dict[Slot, None],
        *,
        idle_first: bool = False,
        unauthenticated_first: bool = False,
    ) -> Slot | None:
        """The oldest of ``slots``, preferring idle or unauthenticated ones."""
        if idle_first:
            for slot in slots:
                if slot in self._idle:
                    return slot
        if unauthenticated_first:
            for slot in slots:
                if slot in self._unauthenticated:
                    return slot
        return next(iter(slots), None)


__all__ = ["ConnectionSlots", "Slot"]

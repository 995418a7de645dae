"""The actor steps of ``backend="ray"`` in flight, each with its deadline
(``RayConfig.step_timeout_s``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from jaxrunner.errors import RemoteTimeoutError


class InFlightSteps:
    """Actor steps sent and not yet received: Ray object ref -> actor, rows and the send
    it belongs to; each may take ``timeout_s`` (None: no deadline)."""

    def __init__(self, ray: Any, timeout_s: float | None) -> None:
        self.ray, self.timeout_s = ray, timeout_s
        self._steps: dict[Any, tuple[int, slice, Any, float]] = {}  # ref -> u, rows, call, sent

    def units(self) -> set[int]:
        return {u for u, _, _, _ in self._steps.values()}

    def add(self, ref: Any, u: int, rows: slice, call: Any) -> None:
        self._steps[ref] = (u, rows, call, time.monotonic())

    def pop(self, ref: Any) -> tuple[int, slice, Any]:
        u, rows, call, _ = self._steps.pop(ref)
        return u, rows, call

    def clear(self) -> None:
        self._steps.clear()

    def first_ready(self) -> Any | None:
        """Waits for the first step to answer, no longer than the oldest step's deadline;
        returns its ref (still in flight: :meth:`pop` it), or None when the deadline
        came first (:meth:`pop_expired` then yields at least that step). Only while a
        step is in flight."""
        timeout = None
        if self.timeout_s is not None:
            oldest = min(sent for _, _, _, sent in self._steps.values())
            timeout = max(0.0, oldest + self.timeout_s - time.monotonic())
        done, _ = self.ray.wait(list(self._steps), num_returns=1, timeout=timeout)
        return done[0] if done else None

    def ready_within(self, wait_s: float) -> list[Any]:
        """The refs of the steps that answer within ``wait_s`` seconds (none in flight:
        none, at once)."""
        if not self._steps:
            return []
        refs = list(self._steps)
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        return ready

    def pop_expired(self) -> Iterator[tuple[Any, int, slice, Any, RemoteTimeoutError]]:
        """Yields the steps past their deadline (ref, actor, rows, send, the error saying
        it timed out), each forgotten as it is yielded: a consumer that raises leaves the
        rest in flight."""
        timeout, now = self.timeout_s, time.monotonic()
        if timeout is None:
            return
        expired = [ref for ref, (_, _, _, sent) in self._steps.items() if now - sent >= timeout]
        for ref in expired:
            u, rows, call = self.pop(ref)
            yield ref, u, rows, call, missed_deadline(u, rows, timeout, "a step")

    def discard(self) -> None:
        """Waits for the steps in flight (each up to the timeout) and forgets them,
        dropping their results and errors (a dead actor is found, and replaced, by the
        reset that follows)."""
        for ref in list(self._steps):
            with contextlib.suppress(Exception):
                self.ray.get(ref, timeout=self.timeout_s)
        self.clear()


def missed_deadline(
    u: int, rows: slice, timeout: float | None, what: str, then: str = ""
) -> RemoteTimeoutError:
    """The error of env actor ``u`` (sub-envs ``rows``) that did not answer ``what``
    within ``step_timeout_s=timeout``; ``then``: what follows, and how to avoid it."""
    error = RemoteTimeoutError(
        f"Ray env actor {u} (sub-envs {rows.start}..{rows.stop - 1}) did not answer {what} "
        f"within step_timeout_s={timeout}s; it is treated as dead{then}."
    )
    # As a WorkerError's: who timed out, for callers that handle it.
    error.worker_index, error.env_indices = u, range(rows.start, rows.stop)
    return error

"""Action delivery of an :class:`~jaxrunner.ExternalEnv`: a policy request from submission
to its step recorded, or to nothing (a step is recorded only for an action that reached
its agent; one withdrawn or retracted counts in ``num_undelivered_actions``)."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from jaxrunner._src.services.external.batching import PolicyBatcher, Row, RowResult
from jaxrunner._src.services.external.episodes import EpisodeRecord, EpisodeTable
from jaxrunner._src.services.external.memory import MemoryBudget
from jaxrunner.errors import ActionTimeoutError


@dataclasses.dataclass(eq=False)
class ActionDelivery:
    """Submits, records, withdraws and retracts the policy requests of live episodes.

    Attributes:
        lock: the owning env's lock, taken around every change to an episode.
        batcher: computes the actions.
        episodes: the env's live episodes (for :meth:`retract`).
        memory: the env's memory budget: a claimed episode's reservation
            (``live.reserved``) is settled by what is recorded, or released.
        counts: the env's counters (``num_dropped_steps``, ``num_undelivered_actions``).
        action_timeout_s: how long :meth:`wait` waits.
        tickets: the row of each single-step request, for :meth:`retract`.
    """

    lock: threading.Lock
    batcher: PolicyBatcher
    episodes: EpisodeTable
    memory: MemoryBudget
    counts: collections.Counter[str]
    action_timeout_s: float
    tickets: weakref.WeakKeyDictionary[concurrent.futures.Future, Row] = dataclasses.field(
        default_factory=weakref.WeakKeyDictionary, repr=False
    )

    def submit(self, live: EpisodeRecord, row: Row) -> concurrent.futures.Future:
        """Requests the action of ``row`` for ``live`` (claimed by the caller); the
        future resolves to the action, or to None for a logged action."""

        def on_done(results: list[RowResult]) -> Any:
            taken, extras, carry = results[0]
            with self.lock:
                before = live.nbytes
                try:
                    live.record(row.obs, taken, extras, carry, ticket=row)
                finally:
                    self._settle(live, live.nbytes - before, 1)
            return taken if row.action is None else None

        future = self._submit_rows(live, [row], on_done)
        with self.lock:
            self.tickets[future] = row  # for retract
        return future

    def submit_many(
        self, live: EpisodeRecord, rows: list[Row], rewards: list[float]
    ) -> concurrent.futures.Future:
        """Logged steps of a feed-forward policy (rows are independent, so one
        request): row ``t`` is recorded with ``rewards[t]`` after it."""

        def on_done(results: list[RowResult]) -> None:
            with self.lock:
                before = live.nbytes
                try:
                    for t, (taken, extras, _) in enumerate(results):
                        live.record(rows[t].obs, taken, extras, None)
                        live.pending_reward += rewards[t]
                finally:
                    self._settle(live, live.nbytes - before, len(results))

        return self._submit_rows(live, rows, on_done)

    def _submit_rows(
        self, live: EpisodeRecord, rows: list[Row], on_done: Callable[[list[RowResult]], Any]
    ) -> concurrent.futures.Future:
        def on_abort(error: BaseException | None) -> None:
            # Nothing was recorded: the episode is free again (a failed policy call
            # never wedges it). Cancelled (None): its waiter gave up, so the action
            # was never delivered; it is counted, never recorded.
            with self.lock:
                self._settle(live, 0, 0)
                live.last_seen = time.monotonic()
                if error is None:
                    self.counts["num_dropped_steps"] += len(rows)
                    self.counts["num_undelivered_actions"] += len(rows)

        try:
            return self.batcher.submit(rows, on_done, on_abort)
        except BaseException:
            with self.lock:
                self._settle(live, 0, 0)
            raise

    def _settle(self, live: EpisodeRecord, grown: int, steps: int) -> None:
        """Frees ``live`` (its call is over) and replaces its reservation by the
        ``grown`` bytes its ``steps`` recorded steps took (caller holds the lock)."""
        live.busy = False
        self.memory.settle(live.reserved, grown, steps)
        live.reserved = 0

    def retract(self, episode_id: int, future: concurrent.futures.Future) -> bool:
        """Takes back the step of ``future`` if it is still the episode's latest
        (cancels the future if pending); returns whether anything was taken back."""
        if future.cancel():
            return True  # on_abort counts it
        with self.lock:
            live = self.episodes.find(episode_id)
            ticket = self.tickets.get(future)
            before = 0 if live is None else live.nbytes
            if ticket is None or live is None or live.busy or not live.undo(ticket):
                return False
            self.memory.live -= before - live.nbytes
            self.counts["num_dropped_steps"] += 1
            self.counts["num_undelivered_actions"] += 1
            return True

    def wait(self, future: concurrent.futures.Future) -> Any:
        """The future's result, waiting at most ``action_timeout_s`` (see :func:`wait_for`)."""
        return wait_for(future, self.action_timeout_s)


def wait_for(future: concurrent.futures.Future, timeout_s: float) -> Any:
    """The future's result; after ``timeout_s`` it is cancelled (never recorded,
    counted in ``num_dropped_steps`` by whoever submitted it) and ActionTimeoutError
    raised, unless it was already being recorded: then the caller gets it after all.
    Shared by the single- and multi-agent deliveries."""
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        if not future.cancel():
            return future.result()  # computed just now: deliver it
        raise ActionTimeoutError(
            "the policy did not answer within action_timeout_s="
            f"{timeout_s} s; the request was withdrawn (nothing "
            "recorded): retry it."
        ) from None

"""Action delivery of a :class:`~jaxrunner._src.services.external.MultiAgentExternalEnv`: a
call's agents, split into one request per policy, recorded all together when the last
policy answers, or not at all."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

from jaxrunner._src.services.external.agents import AgentRecord, MultiAgentEpisodeRecord
from jaxrunner._src.services.external.batching import PolicyBatcher, Row, RowResult
from jaxrunner._src.services.external.memory import MemoryBudget


@dataclasses.dataclass(eq=False)
class _Call:
    live: MultiAgentEpisodeRecord
    parts: dict[str, list[tuple[AgentRecord, Row]]]
    """Policy id -> its agents' records and rows."""
    # Not its future: ``calls`` maps the future to the call weakly, which a call
    # holding its future would defeat (the callbacks get the future instead).
    results: dict[str, list[RowResult]] = dataclasses.field(default_factory=dict)
    finished: bool = False  # recorded, failed or dropped: later answers are ignored

    @property
    def num_rows(self) -> int:
        return sum(len(part) for part in self.parts.values())


@dataclasses.dataclass(eq=False)
class MultiAgentDelivery:
    """Submits the calls of live multi-agent episodes and records their steps.

    Attributes:
        lock: the owning env's lock, taken around every change to an episode.
        batchers: one per policy id.
        memory: the env's memory budget: a claimed episode's reservation
            (``live.reserved``) is settled by what is recorded, or released.
        counts: the env's counters (``num_env_steps``, ``num_dropped_steps``,
            ``num_undelivered_actions``).
    """

    lock: threading.Lock
    batchers: Mapping[str, PolicyBatcher]
    memory: MemoryBudget
    counts: collections.Counter[str]
    calls: weakref.WeakKeyDictionary[concurrent.futures.Future, _Call] = dataclasses.field(
        default_factory=weakref.WeakKeyDictionary, repr=False
    )
    """The call of each future, for :meth:`retract`."""

    def submit(
        self, live: MultiAgentEpisodeRecord, parts: dict[str, list[tuple[AgentRecord, Row]]]
    ) -> concurrent.futures.Future:
        """Requests the rows of ``parts`` for ``live`` (claimed by the caller). The
        future resolves to ``{agent_id: action}`` for sampled rows (rows with
        ``action=None``; logged rows are left out), once every agent's step is recorded.
        """
        call, future = _Call(live, parts), concurrent.futures.Future()
        with self.lock:
            self.calls[future] = call  # for retract
        try:
            for policy_id, part in parts.items():
                self.batchers[policy_id].submit(
                    [row for _, row in part],
                    functools.partial(self._on_done, call, future, policy_id),
                    functools.partial(self._on_abort, call, future),
                )
        except BaseException:  # a closed batcher: answers already asked for are ignored
            with self.lock:
                if not call.finished:
                    call.finished = True
                    self._settle(live, 0, 0)
            raise
        return future

    def _on_done(
        self,
        call: _Call,
        future: concurrent.futures.Future,
        policy_id: str,
        results: list[RowResult],
    ) -> None:
        """One policy's answer (batcher thread); the last one records the call."""
        with self.lock:
            if call.finished:
                return
            call.results[policy_id] = results
            if len(call.results) < len(call.parts):
                return
            call.finished = True
            # Running only now: until here the waiter could cancel (give up on) the call.
            if not future.set_running_or_notify_cancel():
                self._settle(call.live, 0, 0)
                self._count_undelivered(call)
                return
            actions: dict[str, Any] = {}
            before = sum(r.nbytes for part in call.parts.values() for r, _ in part)
            try:
                env_step = call.live.num_calls
                for pid, part in call.parts.items():
                    for (record, row), (taken, extras, carry) in zip(part, call.results[pid]):
                        record.record_at(env_step, row.obs, taken, extras, carry, ticket=call)
                        if row.action is None:
                            actions[record.agent_id] = taken
                call.live.num_calls += 1
                self.counts["num_env_steps"] += 1
            finally:
                grown = sum(r.nbytes for part in call.parts.values() for r, _ in part) - before
                self._settle(call.live, grown, call.num_rows)
        future.set_result(actions)

    def _on_abort(
        self, call: _Call, future: concurrent.futures.Future, error: BaseException | None
    ) -> None:
        """A policy failed (or the batcher closed): the call fails, nothing recorded."""
        with self.lock:
            if call.finished:
                return
            call.finished = True
            self._settle(call.live, 0, 0)
            delivered = future.set_running_or_notify_cancel()
            if not delivered or error is None:
                self._count_undelivered(call)
        if delivered:
            future.set_exception(error or concurrent.futures.CancelledError())

    def retract(self, future: concurrent.futures.Future) -> bool:
        """Takes back the call of ``future`` (its actions never reached the agents)
        if its steps are still every agent's latest; cancels the future if pending.
        Returns whether anything was taken back."""
        if future.cancel():
            return True  # _on_done counts it
        with self.lock:
            call = self.calls.get(future)
            if call is None or call.live.busy or not future.done():
                return False
            records = [record for part in call.parts.values() for record, _ in part]
            if not all(not record.done and record.can_undo(call) for record in records):
                return False  # a later call or an ending came first: too late
            before = sum(record.nbytes for record in records)
            for record in records:
                record.undo(call)
            self.memory.live -= before - sum(record.nbytes for record in records)
            call.live.num_calls -= 1
            self.counts["num_env_steps"] -= 1
            self._count_undelivered(call)
            return True

    def _count_undelivered(self, call: _Call) -> None:
        """Actions nobody received: counted, never recorded (caller holds the lock)."""
        self.counts["num_dropped_steps"] += call.num_rows
        self.counts["num_undelivered_actions"] += call.num_rows

    def _settle(self, live: MultiAgentEpisodeRecord, grown: int, steps: int) -> None:
        """Frees ``live`` and replaces its reservation by the ``grown`` bytes its
        ``steps`` recorded agent steps took (caller holds the lock)."""
        live.busy = False
        self.memory.settle(live.reserved, grown, steps)
        live.reserved = 0
        live.last_seen = time.monotonic()

"""Action delivery of the external envs: a call's agents, one request per policy, recorded
together when the last policy answers, or not at all (only actions that reached their agent)."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from jaxrunner._src.services.external.batching import PolicyBatcher, Row, RowResult
from jaxrunner._src.services.external.episodes import AgentRecord, EpisodeRecord
from jaxrunner._src.services.external.memory import MemoryBudget
from jaxrunner.errors import ActionTimeoutError

Parts = dict[str, list[tuple[AgentRecord, Row]]]  # policy id -> one call's records and rows
Answer = Callable[[dict[str, Any]], Any]  # a call's result from its {agent_id: action}


@dataclasses.dataclass(eq=False)
class _Call:
    live: EpisodeRecord
    parts: Parts
    # Not its future: ``calls`` maps the future to the call weakly.
    results: dict[str, list[RowResult]] = dataclasses.field(default_factory=dict)
    finished: bool = False  # recorded, failed or dropped: later answers are ignored

    @property
    def num_rows(self) -> int:
        return sum(len(part) for part in self.parts.values())


@dataclasses.dataclass(eq=False)
class ActionDelivery:
    """Submits the calls of live episodes and records their steps under the env's ``lock``;
    a claimed episode's reservation (``live.reserved``) is settled by what is recorded."""

    lock: threading.Lock
    batchers: Mapping[str, PolicyBatcher]
    memory: MemoryBudget
    counts: collections.Counter[str]
    answer: Answer  # what the future of a submitted call resolves to
    calls: weakref.WeakKeyDictionary[concurrent.futures.Future, _Call] = dataclasses.field(
        default_factory=weakref.WeakKeyDictionary, repr=False
    )  # the call of each future, for retract

    def submit(self, live: EpisodeRecord, parts: Parts) -> concurrent.futures.Future:
        """Requests the rows of ``parts`` for ``live`` (claimed by the caller); once every
        step is recorded the future resolves to ``answer({agent_id: action})`` of the
        sampled rows."""
        call = _Call(live, parts)
        future: concurrent.futures.Future = concurrent.futures.Future()
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
                    self._drop(call, undelivered=False)
            raise
        with self.lock:
            self.calls[future] = call  # for retract
        return future

    def submit_many(
        self, live: EpisodeRecord, record: AgentRecord, rows: list[Row], rewards: list[float]
    ) -> concurrent.futures.Future:
        """Logged steps of one agent of a feed-forward policy in one request, each an env
        step with its reward."""

        def on_done(results: list[RowResult]) -> None:
            with self.lock:
                before = record.nbytes
                try:
                    for t, (taken, extras, _) in enumerate(results):
                        record.record(rows[t].obs, taken, extras, None, live.num_calls)
                        record.pending_reward += rewards[t]
                        live.num_calls += 1
                        self.counts["num_env_steps"] += 1
                finally:
                    self._settle(live, record.nbytes - before, len(results))

        # A call for its abort only: on_done records the rows (and none is retracted).
        call = _Call(live, {record.policy_id: [(record, row) for row in rows]})

        def on_abort(error: BaseException | None) -> None:  # failed, or (None) cancelled
            with self.lock:
                self._drop(call, undelivered=error is None)

        try:
            return self.batchers[record.policy_id].submit(rows, on_done, on_abort)
        except BaseException:
            with self.lock:
                self._drop(call, undelivered=False)
            raise

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
            # Running only now: until here the waiter could cancel (give up on) the call.
            if not future.set_running_or_notify_cancel():
                self._drop(call, undelivered=True)
                return
            call.finished = True
            actions = self._record(call)
        future.set_result(self.answer(actions))

    def _record(self, call: _Call) -> dict[str, Any]:
        """Records ``call`` as one env step; returns ``{agent_id: action}`` of its
        sampled rows."""
        actions: dict[str, Any] = {}
        before = sum(r.nbytes for part in call.parts.values() for r, _ in part)
        try:
            env_step = call.live.num_calls
            for pid, part in call.parts.items():
                for (record, row), (taken, extras, carry) in zip(part, call.results[pid]):
                    record.record(row.obs, taken, extras, carry, env_step, ticket=call)
                    if row.action is None:
                        actions[record.agent_id] = taken
            call.live.num_calls += 1
            self.counts["num_env_steps"] += 1
        finally:
            grown = sum(r.nbytes for part in call.parts.values() for r, _ in part) - before
            self._settle(call.live, grown, call.num_rows)
        return actions

    def _on_abort(
        self, call: _Call, future: concurrent.futures.Future, error: BaseException | None
    ) -> None:
        """A policy failed (or the batcher closed): nothing is recorded."""
        with self.lock:
            if call.finished:
                return
            delivered = future.set_running_or_notify_cancel()
            self._drop(call, undelivered=not delivered or error is None)
        if delivered:
            future.set_exception(error or concurrent.futures.CancelledError())

    def retract(self, future: concurrent.futures.Future) -> bool:
        """See ``ExternalEnvCore.retract_action``."""
        if future.cancelled():  # cancel() says True again: nothing more to take back
            return False  # withdrawn already, by its waiter or an earlier retract
        if future.cancel():
            return True  # _on_done counts it
        with self.lock:
            call = self.calls.get(future)
            if call is None or call.live.busy or not future.done():
                return False
            records = [record for part in call.parts.values() for record, _ in part]
            if not all(not record.done and record.can_undo(call) for record in records):
                return False  # a later call or an ending came first: too late
            env_step = records[0].env_steps[-1]
            before = sum(record.nbytes for record in records)
            for record in records:
                record.undo()
            self.memory.live -= before - sum(record.nbytes for record in records)
            # Its env step is given again only if no later call (of other agents) took
            # the next one: the next call would repeat that one's. A gap is left instead.
            if env_step == call.live.num_calls - 1:
                call.live.num_calls -= 1
            self.counts["num_env_steps"] -= 1
            self._count_undelivered(call.num_rows)
            return True

    def _drop(self, call: _Call, undelivered: bool) -> None:
        """Finishes ``call`` with nothing recorded, its episode free again; counted if
        ``undelivered`` (its waiter gave up)."""
        call.finished = True
        self._settle(call.live, 0, 0)
        if undelivered:
            self._count_undelivered(call.num_rows)

    def _count_undelivered(self, rows: int) -> None:
        self.counts["num_dropped_steps"] += rows
        self.counts["num_undelivered_actions"] += rows

    def _settle(self, live: EpisodeRecord, grown: int, steps: int) -> None:
        """Frees ``live``, its reservation replaced by what ``steps`` steps took."""
        live.busy = False
        self.memory.settle(live.reserved, grown, steps)
        live.reserved = 0
        live.last_seen = time.monotonic()


def wait_for(future: concurrent.futures.Future, timeout_s: float) -> Any:
    """The future's result; after ``timeout_s`` it is cancelled (never recorded) and
    ActionTimeoutError raised, unless it was already being recorded."""
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

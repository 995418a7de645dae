"""The process backend's ``send``/``recv``: lockstep (answered in the order sent; a send of
rows still in flight waits until they are received) or ready-first (one call per worker,
``recv`` returns whichever worker answers first)."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

import jaxrunner._src.backends.process.protocol as protocol
from jaxrunner._src.backends.process.handle import WorkerLost
from jaxrunner._src.backends.process.pool import LOST, WorkerPool
from jaxrunner._src.backends.process.protocol import StepReply
from jaxrunner._src.backends.process.recovery import Sent, WorkerRecovery
from jaxrunner._src.backends.process.shared import BlockLayout
from jaxrunner._src.backends.steps import BatchStep, EnvIds, block_rows
from jaxrunner._src.backends.sub_env_block import NOT_RUN, stepped_runs
from jaxrunner.errors import InvalidArgumentError


@dataclasses.dataclass
class StepCall:
    """One step of sub-envs ``[lo, hi)`` in flight."""

    lo: int
    hi: int
    sent: list[Sent] = dataclasses.field(default_factory=list)  # its step commands
    failed: dict[int, BaseException] = dataclasses.field(default_factory=dict)
    """Sub-envs given a failed slot without a step (their worker had been replaced)."""
    actions: Any = None
    """The actions of a send that waits for earlier sends of its rows (then unsent)."""
    per_worker: bool = False  # a ready-first call (one worker's rows): its result names them

    def overlaps(self, lo: int, hi: int) -> bool:
        return self.lo < hi and lo < self.hi


class Stepper:
    """Sends step commands to the pool's workers and turns their replies into
    :class:`BatchStep` results (one per :class:`StepCall`)."""

    def __init__(
        self,
        pool: WorkerPool,
        recovery: WorkerRecovery,
        layout: BlockLayout,
        views: Any,
        ready_first: bool,
        name: str,
    ) -> None:
        self.pool, self.recovery, self.views, self.ready_first = pool, recovery, views, ready_first
        self.name = name  # the vector env's class name, for errors
        self.layout = layout
        self.num_envs = layout.num_envs
        self.calls: list[StepCall] = []  # sent and not yet received, in send order
        self.num_waiting = 0  # calls whose send waits for earlier sends of their rows
        self.num_restarts = 0  # ProcessBackend.num_restarts

    def in_flight(self) -> Iterator[Sent]:
        for call in self.calls:
            yield from call.sent

    def send(
        self, actions: Any, env_ids: EnvIds, per_worker: bool, checked: bool = False
    ) -> list[StepCall]:
        """Validates ``actions`` (unless ``checked``: their values passed the checks),
        then starts the step of ``env_ids``: one call, or one per worker (``per_worker``:
        ``env_ids`` must cover whole workers)."""
        if self.num_waiting:
            self._dispatch_waiting()
        n = self.num_envs
        lo, hi = (0, n) if env_ids is None else block_rows(env_ids, n, self.name)
        # Validates before any sub-env steps (the workers read the rows from shared memory).
        if not checked:
            self.layout.action_checks[hi - lo](actions)
        busy = [c for c in self.calls if c.overlaps(lo, hi)] if self.calls else []
        if busy and (self.ready_first or per_worker):
            raise InvalidArgumentError(
                f"{self.name}.send(env_ids=slice({lo}, {hi})): sub-envs "
                f"{busy[0].lo}..{busy[0].hi - 1} are still in flight from an earlier send; "
                "recv() their results first (a ready-first env steps each env once at a time)."
            )
        if per_worker:
            bounds = [b for b in self.pool.bounds if lo <= b[0] < hi]
            if not bounds or bounds[0][0] != lo or bounds[-1][1] != hi:
                raise InvalidArgumentError(
                    f"{self.name}.send(env_ids=slice({lo}, {hi})): with ready_first=True, "
                    f"env_ids must cover whole workers; the workers' sub-envs are "
                    f"{[slice(*b) for b in self.pool.bounds]}. Send None, or a slice from one "
                    "worker's start to another's stop."
                )
            calls = [StepCall(a, b, per_worker=True) for a, b in bounds]
        else:
            calls = [StepCall(lo, hi)]
        self.calls.extend(calls)  # registered first: a recovery sees them
        if busy:  # rows still in flight: sent once the earlier sends are received
            import jax  # here: a Ray actor's import of this module skips JAX

            calls[0].actions = jax.tree.map(np.array, actions)
            self.num_waiting += 1
            return calls
        self.layout.write_actions(self.views, actions, lo, hi)
        for call in calls:
            self._dispatch(call)
        return calls

    def _dispatch(self, call: StepCall) -> None:
        """Tells the workers of ``call`` to step, except sub-envs of a replaced worker
        that were not stepping then: their slot fails now, unstepped."""
        if call.actions is not None:
            actions, call.actions = call.actions, None
            self.num_waiting -= 1
            self.layout.write_actions(self.views, actions, call.lo, call.hi)
        for w, (wlo, whi) in enumerate(self.pool.bounds):
            lo, hi = max(call.lo, wlo), min(call.hi, whi)
            if lo < hi:
                self._send_step(w, lo, hi, call)

    def _send_step(self, w: int, lo: int, hi: int, call: StepCall) -> None:
        runs: Iterable[tuple[int, int]] = ((lo, hi),)
        if pending := self.recovery.pending:
            runs = stepped_runs(lo, hi, pending, self.recovery.fail_unrun, call.failed)
        for start, stop in runs:
            self.views.status[start:stop] = NOT_RUN
            try:
                seq = self.pool.send(w, protocol.OP_STEP, start, stop)
            except WorkerLost as lost:
                self.pool.lost_worker(lost)  # raises, or replaces it: its envs are pending
                return self._send_step(w, start, hi, call)
            call.sent.append((w, seq, start, stop))

    def recv(self) -> Any:
        """The oldest call's result (lockstep), or the first call answered (ready-first)."""
        if not self.calls:
            raise InvalidArgumentError(
                f"{self.name}.recv(): no send() is waiting for its results. Call "
                "send(actions, env_ids) first, once per result."
            )
        if not self.ready_first:
            return self.finish(self.calls[0])
        while True:
            for call in self.calls:
                if all(self.pool.replied(w, seq) for w, seq, _, _ in call.sent):
                    return self.finish(call)
            waiting = {w for w, seq, _, _ in self.in_flight() if not self.pool.replied(w, seq)}
            self.pool.read_any(sorted(waiting))

    def finish(self, call: StepCall) -> BatchStep:
        if self.num_waiting:
            self._dispatch_waiting()
        errors = call.failed
        failed = list(errors)
        replies = []
        all_ok = True
        try:
            for w, seq, start, stop in call.sent:
                status, payload = self.pool.reply(w, seq)
                if status == LOST:  # its worker was replaced: the slots were failed then
                    error = self.pool.take_lost(w, seq)
                    errors.update(dict.fromkeys(range(start, stop), error))
                    failed.extend(range(start, stop))
                else:
                    replies.append((w, status, payload))
                    all_ok = all_ok and status == protocol.STATUS_OK
        finally:
            self.calls.remove(call)
        if not all_ok:
            remote_errors = [(w, pickle.loads(p)) for w, s, p in replies if s != protocol.STATUS_OK]
            raise self.pool.remote_exception(*protocol.first_error(remote_errors))
        return self._result(call, replies, failed, errors)

    def _dispatch_waiting(self) -> None:
        """Sends the waiting calls whose rows no earlier call holds any more (at the
        next send or recv: the last result's views must stay valid until then)."""
        for k, call in enumerate(self.calls):
            if call.actions is not None and not any(
                c.overlaps(call.lo, call.hi) for c in self.calls[:k]
            ):
                self._dispatch(call)

    def discard(self) -> None:
        """Waits for every call in flight and drops its result (before a reset)."""
        for call in self.calls:
            for w, seq, _, _ in call.sent:
                self.pool.reply(w, seq)
                self.pool.forget(w, seq)
        self.calls.clear()
        self.num_waiting = 0

    def _result(
        self,
        call: StepCall,
        replies: list[tuple[int, int, bytes]],
        failed: list[int],
        errors: dict[int, BaseException],
    ) -> Any:
        infos: dict[int, dict[str, Any]] = {}
        reset_infos: dict[int, dict[str, Any]] = {}
        for w, _, payload in replies:
            if not payload:
                continue
            reply: StepReply = pickle.loads(payload)
            infos.update(reply.infos)
            reset_infos.update(reply.reset_infos)
            failed.extend(reply.failed)
            for i, remote in reply.errors.items():
                errors[i] = self.pool.remote_exception(w, remote)
            self.num_restarts += len(reply.errors)
        # The workers are done: what they wrote in shared memory is this step's.
        whole = (call.lo, call.hi) == (0, self.num_envs) and not call.per_worker
        out = StepReply(infos, reset_infos, failed, errors)
        return self.layout.result(self.views, call.lo, call.hi, whole, out)

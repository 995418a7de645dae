"""The workers as seen from the main process: commands numbered by one sequence, and replies
kept when they arrive before anyone waits for them."""

from __future__ import annotations

import math
import pickle
import select
import time
from collections.abc import Callable, Sequence
from multiprocessing.context import BaseContext
from typing import Any, cast

import jaxrunner._src.backends.process.protocol as protocol
from jaxrunner._src.backends.process.handle import (
    MainProcessHandle,
    Resources,
    WorkerHandle,
    WorkerLost,
    spawn_worker,
    start_deadline,
)
from jaxrunner._src.backends.process.launch import available_cpus

LOST = -1  # a reply status of ours: the worker was replaced before it answered


class WorkerPool:
    """The worker processes, their commands and replies. ``bounds``: each worker's ``[lo, hi)``
    sub-envs; ``payloads``: its pickled factories; ``main_process_fns``: worker 0's
    factories when it is the main process."""

    lost_worker: Callable[..., BaseException]
    """Set by the vector env: ``(lost, fatal=False)`` replaces a lost worker (returns the
    error its sub-envs failed with), or closes the vector env and raises."""

    def __init__(
        self,
        ctx: BaseContext,
        bounds: list[tuple[int, int]],
        payloads: list[bytes],
        step_timeout_s: float | None,
        res: Resources,
        spin_s: float = 0.0,
        main_process_fns: Sequence[Callable[[], Any]] | None = None,
    ) -> None:
        self.ctx, self.bounds, self.payloads = ctx, bounds, payloads
        self.main_process_fns = main_process_fns
        self.step_timeout_s, self.spin_s = step_timeout_s, spin_s
        self.spin = protocol.Spin(spin_s, available_cpus())
        self.res = res
        self.workers: list[WorkerHandle | MainProcessHandle] = res.workers
        """Worker ``w`` is ``workers[w]`` (a replacement takes its place)."""
        self.memory_message = b""  # OP_MEMORY's payload
        self.close_after: Callable[[str], None] = lambda reason: None
        """Set by the vector env: closes it after a failure it cannot go on from."""
        self._seq = 0
        self._stash: dict[tuple[int, int], tuple[int, bytes]] = {}  # early replies
        self._lost: dict[tuple[int, int], BaseException] = {}  # never answered: why

    # -- start-up

    def spawn(self, w: int) -> WorkerHandle | MainProcessHandle:
        """Starts worker ``w`` (it builds its sub-envs, then reports)."""
        envs = range(*self.bounds[w])
        if w == 0 and self.main_process_fns is not None:
            return MainProcessHandle(envs, self.main_process_fns)
        return spawn_worker(self.ctx, w, envs, self.payloads[w], self.step_timeout_s)

    def grow(self, w: int) -> Any:
        """Worker ``w``, started over its first sub-env alone, builds the rest of its
        sub-envs (from :attr:`payloads`, under the start deadline); their start report."""
        worker = self.workers[w]
        worker.envs = range(*self.bounds[w])
        seq = self.send_call(w, "grow", (self.payloads[w],))
        worker.inflight[seq] = start_deadline(self.step_timeout_s)
        return self.expect(w, seq)

    def send_memory(self, w: int) -> int:
        seq = self.send(w, protocol.OP_MEMORY, payload=self.memory_message)
        self.workers[w].send_fd(self.res.fd)  # type: ignore[arg-type]  # set by then
        return seq

    def worker_of(self, index: int) -> int:
        return next(w for w, (lo, hi) in enumerate(self.bounds) if lo <= index < hi)

    # -- sending and receiving

    def send(self, w: int, op: int, lo: int = 0, hi: int = 0, payload: bytes = b"") -> int:
        self._seq += 1
        seq = self._seq
        message = protocol.COMMAND.pack(op, seq, lo, hi, len(payload)) + payload
        self.workers[w].send(message, seq)
        return seq

    def send_call(self, w: int, method: str, args: tuple) -> int:
        """Asks worker ``w`` to run ``method(*args)``; raises :class:`WorkerLost`."""
        return self.send(w, protocol.OP_CALL, payload=pickle.dumps((method, args), protocol=5))

    def expect(self, w: int, seq: int) -> Any:
        """The unpickled result of command ``seq`` (no stash: start-up only), or its
        error raised here; raises :class:`WorkerLost`."""
        while True:
            got, status, payload = self.workers[w].read()
            if got == seq:
                return self.result(w, status, payload)

    def result(self, w: int, status: int, payload: bytes) -> Any:
        """Worker ``w``'s unpickled result, or its error raised here."""
        if status != protocol.STATUS_OK:
            raise self.remote_exception(w, pickle.loads(payload))
        return pickle.loads(payload) if payload else None

    def mark_lost(self, w: int, error: BaseException) -> list[int]:
        """Worker ``w`` is being replaced: its commands in flight will never be answered
        (waiting for them gives ``LOST``); returns their seqs."""
        worker = self.workers[w]
        seqs = list(worker.inflight)
        for seq in seqs:
            self._lost[(w, seq)] = error
        worker.inflight.clear()
        return seqs

    def take_lost(self, w: int, seq: int) -> BaseException:
        """Why command ``seq`` of worker ``w`` was answered ``LOST`` (asked once)."""
        return self._lost.pop((w, seq))

    def forget(self, w: int, seq: int) -> None:
        self._stash.pop((w, seq), None)
        self._lost.pop((w, seq), None)

    def replied(self, w: int, seq: int) -> bool:
        """Whether waiting for command ``seq`` of worker ``w`` would return at once."""
        return (w, seq) in self._stash or (w, seq) in self._lost

    def reply(self, w: int, seq: int) -> tuple[int, bytes]:
        """Worker ``w``'s reply to command ``seq`` (replies to earlier commands that
        arrive first are kept for whoever waits for them). ``(LOST, b"")`` if the
        worker was replaced before it answered (:meth:`take_lost` says why)."""
        key = (w, seq)
        while key not in self._stash:
            if key in self._lost:
                return LOST, b""
            self._read(w)
        return self._stash.pop(key)

    def read_any(self, ws: list[int]) -> None:
        """Waits until one of workers ``ws`` (each with commands in flight) answers, and
        keeps the reply of every worker that has; a worker that dies or misses its
        deadline goes to the :attr:`lost_worker`."""
        # Ready-first stepping only, where ProcessConfig refuses a main-process share.
        workers = cast(list[WorkerHandle], [self.workers[w] for w in ws])
        by_fd = {worker.sock.fileno(): worker for worker in workers}
        poller = select.poll()
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        first = min(workers, key=lambda wk: next(iter(wk.inflight.values()), math.inf))
        deadline = next(iter(first.inflight.values()), math.inf)
        timeout_ms = None
        if deadline != math.inf:
            timeout_ms = math.ceil(max(0.0, deadline - time.monotonic()) * 1000)
        self.spin.until_readable(poller.poll)
        ready = poller.poll(timeout_ms)
        # Nothing ready: the worker with the first deadline missed it (its read says so).
        # Every ready worker is read: reading only the first (poll lists them in worker
        # order) left a worker's earlier answer unread while worker 0 kept answering.
        for worker in [by_fd[fd] for fd, _ in ready] if ready else [first]:
            self._read(worker.index)

    def _read(self, w: int) -> None:
        try:
            got, status, payload = self.workers[w].read(self.spin)
        except WorkerLost as lost:
            self.lost_worker(lost)
            return
        self._stash[(w, got)] = (status, payload)

    # -- calls

    def _send_call(self, w: int, method: str, args: tuple) -> int:
        try:
            return self.send_call(w, method, args)
        except WorkerLost as lost:
            self.lost_worker(lost)  # replaced (or raised): ask the new worker
        try:
            return self.send_call(w, method, args)
        except WorkerLost as lost:
            raise self.lost_worker(lost, fatal=True) from None

    def call(self, w: int, method: str, args: tuple, seq: int | None = None) -> tuple[int, bytes]:
        """Worker ``w``'s reply to ``method(*args)`` (sent as ``seq`` if given); asks a
        replaced worker's successor once more."""
        if seq is None:
            seq = self._send_call(w, method, args)
        status, payload = self.reply(w, seq)
        if status != LOST:
            return status, payload
        self.take_lost(w, seq)
        seq = self._send_call(w, method, args)
        status, payload = self.reply(w, seq)
        if status == LOST:
            error = self.take_lost(w, seq)
            self.close_after(f"{error}")
            raise error
        return status, payload

    def call_all(self, method: str, args: list[tuple]) -> list[Any]:
        """Calls ``method`` in every worker (``args[w]`` for worker ``w``); raises the
        error of the lowest sub-env index once every worker has answered."""
        seqs = [self._send_call(w, method, a) for w, a in enumerate(args)]
        results, errors = [], []
        for w, seq in enumerate(seqs):
            status, payload = self.call(w, method, args[w], seq)
            if status == protocol.STATUS_OK:
                results.append(pickle.loads(payload))
            else:
                errors.append((w, pickle.loads(payload)))
        if errors:
            raise self.remote_exception(*protocol.first_error(errors))
        return results

    def remote_exception(self, w: int, remote: protocol.RemoteError) -> BaseException:
        """Worker ``w``'s error as an exception of this process, its traceback chained."""
        worker = self.workers[w]
        return remote.rebuild(w, worker.envs, worker.place)

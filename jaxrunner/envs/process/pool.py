"""The vector env's workers as seen from the main process: commands and replies.

Commands are numbered by one sequence for all workers. A worker answers its
commands in order, but the main process may wait for them in another order (the
runner steps several groups of workers at once), so replies that arrive before
anyone waits for them are kept (``_stash``). What happens when a worker is lost is
:mod:`.recovery`'s business (:meth:`WorkerPool._worker_lost`).
"""

from __future__ import annotations

import abc
import dataclasses
import multiprocessing
import pickle
import weakref
from typing import Any

from jaxrunner.envs.base import VectorEnv
from jaxrunner.envs.process import wire
from jaxrunner.envs.process.handle import Resources, WorkerHandle, WorkerLost, spawn_worker
from jaxrunner.envs.process.remote import remote_exception
from jaxrunner.envs.process.shared import Views

LOST = -1
"""A reply status of ours: the worker was replaced before it answered (``_lost`` says
why)."""


@dataclasses.dataclass
class StepCall:
    """A ``step_batch_async`` call in flight."""

    sent: list[tuple[int, int, int, int]] = dataclasses.field(default_factory=list)
    """``(worker, seq, lo, hi)`` of each step command sent."""
    failed: dict[int, BaseException] = dataclasses.field(default_factory=dict)
    """Sub-envs given a failed slot without a step (their worker had been replaced)."""


class WorkerPool(VectorEnv):
    """A :class:`VectorEnv` whose sub-envs live in worker processes: starting them,
    sending them commands and matching their replies.

    Attributes are set by the concrete vector env's constructor.
    """

    step_timeout_s: float | None
    """How long a worker may take to answer a command (None: forever)."""
    _res: Resources
    _finalizer: weakref.finalize
    _workers: list[WorkerHandle]
    """``_res.workers``: worker ``w`` is ``_workers[w]`` (a replacement takes its place)."""
    _bounds: list[tuple[int, int]]
    _payloads: list[bytes]
    """Each worker's factories, pickled (a replacement gets the same)."""
    _ctx: multiprocessing.context.BaseContext
    _views: Views
    _layout_message: bytes
    _seq: int
    _stash: dict[tuple[int, int], tuple[int, bytes]]
    """Replies received before anyone waited for them: (w, seq) -> (status, payload)."""
    _lost: dict[tuple[int, int], BaseException]
    """Commands whose worker was replaced before it answered: (w, seq) -> its error."""

    @abc.abstractmethod
    def _worker_lost(self, lost: WorkerLost, fatal: bool = False) -> BaseException:
        """Handles a dead worker: replaces it, or closes the vector env and raises."""

    def _close_after(self, reason: str) -> None:
        """Closes the vector env after a failure (``reason`` is quoted to later calls)."""
        self._closed_reason = reason
        self._finalizer()

    # -- start-up

    def _spawn(self, w: int) -> WorkerHandle:
        """Starts worker ``w`` (it builds its sub-envs, then reports)."""
        envs = range(*self._bounds[w])
        return spawn_worker(self._ctx, w, envs, self._payloads[w], self.step_timeout_s)

    def _send_memory(self, w: int) -> int:
        """Hands worker ``w`` the shared block; returns the command's seq."""
        seq = self._send(w, wire.OP_MEMORY, payload=self._layout_message)
        self._workers[w].send_fd(self._res.fd)  # type: ignore[arg-type]  # set by then
        return seq

    # -- sending and receiving

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, w: int, op: int, lo: int = 0, hi: int = 0, payload: bytes = b"") -> int:
        """Sends a command; raises :class:`WorkerLost` if the worker is gone."""
        seq = self._next_seq()
        message = wire.COMMAND.pack(op, seq, lo, hi, len(payload)) + payload
        self._workers[w].send(message, seq, self.step_timeout_s)
        return seq

    def _expect(self, w: int, seq: int) -> Any:
        """The unpickled result of command ``seq`` (no stash: start-up only), or its
        error raised here; raises :class:`WorkerLost`."""
        while True:
            got, status, payload = self._workers[w].read(self.step_timeout_s)
            if got == seq:
                break
        if status != wire.STATUS_OK:
            self._raise_remote(w, pickle.loads(payload))
        return pickle.loads(payload) if payload else None

    def _reply(self, w: int, seq: int) -> tuple[int, bytes]:
        """Worker ``w``'s reply to command ``seq`` (replies to earlier commands that
        arrive first are kept for whoever waits for them). ``(LOST, b"")`` if the
        worker was replaced before it answered (``self._lost`` says why)."""
        key = (w, seq)
        while key not in self._stash:
            if key in self._lost:
                return LOST, b""
            try:
                got, status, payload = self._workers[w].read(self.step_timeout_s)
            except WorkerLost as lost:
                self._worker_lost(lost)
                continue
            self._stash[(w, got)] = (status, payload)
        return self._stash.pop(key)

    # -- calls

    def _send_call(self, w: int, method: str, args: tuple) -> int:
        payload = pickle.dumps((method, args), protocol=5)
        try:
            return self._send(w, wire.OP_CALL, payload=payload)
        except WorkerLost as lost:
            self._worker_lost(lost)  # replaced (or raised): ask the new worker
        try:
            return self._send(w, wire.OP_CALL, payload=payload)
        except WorkerLost as lost:
            raise self._worker_lost(lost, fatal=True) from None

    def _call(self, w: int, method: str, args: tuple, seq: int | None = None) -> tuple[int, bytes]:
        """Worker ``w``'s reply to ``method(*args)`` (sent as ``seq`` if given); asks a
        replaced worker's successor once more."""
        if seq is None:
            seq = self._send_call(w, method, args)
        status, payload = self._reply(w, seq)
        if status != LOST:
            return status, payload
        self._lost.pop((w, seq))
        seq = self._send_call(w, method, args)
        status, payload = self._reply(w, seq)
        if status == LOST:
            error = self._lost.pop((w, seq))
            self._close_after(f"{error}")
            raise error
        return status, payload

    def _call_all(self, method: str, args: list[tuple]) -> list[Any]:
        """Calls ``method`` in every worker (``args[w]`` for worker ``w``); raises the
        error of the lowest sub-env index once every worker has answered."""
        seqs = [self._send_call(w, method, a) for w, a in enumerate(args)]
        results, errors = [], []
        for w, seq in enumerate(seqs):
            status, payload = self._call(w, method, args[w], seq)
            if status == wire.STATUS_OK:
                results.append(pickle.loads(payload))
            else:
                errors.append((w, pickle.loads(payload)))
        if errors:
            self._raise_remote(*wire.first_error(errors))
        return results

    def _call_each_env(self, method: str, args: tuple = ()) -> tuple[Any, ...]:
        """``method(*args)`` in every worker, its per-sub-env results in one tuple."""
        parts = self._call_all(method, [args] * len(self._workers))
        return tuple(x for part in parts for x in part)

    def _raise_remote(self, w: int, remote: wire.RemoteError) -> None:
        """Raises a worker's error here, with the worker's traceback chained."""
        raise self._remote_exception(w, remote)

    def _remote_exception(self, w: int, remote: wire.RemoteError) -> BaseException:
        return remote_exception(remote, w, self._workers[w].envs)

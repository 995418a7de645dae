"""The wire protocol between the main process and a worker (both sides import it): a
fixed-size header, then a pickled payload, on the worker's Unix socket. Bulk step data
never crosses it (:mod:`.shared`)."""

from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import struct
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

from jaxrunner._src.backends.sub_env_block import SubEnvRaised, pickled
from jaxrunner.errors import EnvError, WorkerError

COMMAND = struct.Struct("=qqqqq")
"""main -> worker: ``(op, seq, lo, hi, length)``, then ``length`` payload bytes. ``OP_STEP``
steps the worker's envs ``[lo, hi)`` (global indices); ``OP_CALL``'s payload is a pickled
``(method, args)``; ``OP_MEMORY`` comes once, with the shared-memory fd attached and a
pickled ``(Layout, RestartPolicy | None, spin_s)`` (how long the worker spins before it
sleeps)."""
REPLY = struct.Struct("=qqq")
"""worker -> main: ``(seq, status, length)``, then the payload. ``seq`` echoes the
command's, so a reply is never taken for another's (a restarted worker has a fresh
socket). ``STATUS_OK``: the pickled result (``OP_STEP``: a :class:`StepReply`, no payload
when empty); ``STATUS_ERROR``: a pickled :class:`RemoteError`."""
OP_STEP, OP_CALL, OP_MEMORY = 1, 2, 3
STATUS_OK, STATUS_ERROR = 0, 1
START_REPORT_SEQ = 0
"""The ``seq`` of a worker's start report (its sub-envs' spaces and metadata), the reply
to an implicit command 0: every command after it has a larger one."""


class Spin:
    """Busy-polls for data before a process sleeps in ``recv`` (``ProcessConfig.spin_wait_us``).
    Every :attr:`WINDOW` waits the budget halves (to 0 below :attr:`MIN_S`) if under half
    ended in data, and grows back towards ``budget_s`` if nearly all did; while off it
    probes every :attr:`PROBE_EVERY` waits; never while the load average exceeds ``cpus``."""

    WINDOW = 32
    MIN_S = 50e-6
    PROBE_EVERY = 256
    LOAD_CHECK_S = 1.0

    def __init__(self, budget_s: float, cpus: int = 1) -> None:
        self.max_s = self.budget_s = max(0.0, float(budget_s))
        self.cpus = cpus
        self._waits = self._hits = self._skipped = 0
        self._next_load_check = 0.0
        self._loaded = False

    def until_readable(self, poll: Callable[[int], list]) -> None:
        """Busy-polls ``poll(0)`` (a ``select.poll``'s) until it reports data or the
        budget has passed."""
        if self.max_s <= 0.0:
            return
        clock = time.perf_counter
        now = clock()
        if now >= self._next_load_check:
            self._next_load_check = now + self.LOAD_CHECK_S
            self._loaded = os.getloadavg()[0] > self.cpus
        budget = self.budget_s
        if budget <= 0.0 or self._loaded:
            self._skipped += 1
            if budget <= 0.0 and self._skipped >= self.PROBE_EVERY:
                self._skipped = 0
                self.budget_s = self.max_s / 8
            return
        until = now + budget
        while not poll(0):
            if clock() >= until:
                self._record(hit=False)
                return
        self._record(hit=True)

    def _record(self, *, hit: bool) -> None:
        self._waits += 1
        self._hits += hit
        if self._waits < self.WINDOW:
            return
        rate = self._hits / self._waits
        self._waits = self._hits = 0
        if rate < 0.5:
            self.budget_s = self.budget_s / 2 if self.budget_s / 2 >= self.MIN_S else 0.0
        elif rate >= 0.9:
            self.budget_s = min(self.max_s, 2 * self.budget_s)


def recv_exact(sock: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes; ``EOFError`` if the other side has gone."""
    data = sock.recv(size, socket.MSG_WAITALL)
    if len(data) == size:
        return data
    chunks = [data]
    got = len(data)
    while got < size:
        if not data:
            raise EOFError("the socket was closed by the other side")
        data = sock.recv(size - got)
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


@dataclasses.dataclass
class RemoteError:
    """An exception raised in a worker, as sent to the main process."""

    kind: str
    """``"env"`` (a sub-env's own code raised), ``"check"`` (jaxrunner rejected what a
    sub-env returned), ``"recreate"`` (a failed sub-env could not be recreated) or
    ``"worker"`` (anything else)."""
    env_index: int  # the sub-env concerned (-1: none)
    call: str  # its method concerned ("step", "reset", ...)
    exception: bytes | None  # pickled (None: it does not pickle)
    description: str  # its repr
    traceback: str
    recreation: bytes | None = None
    """Kind ``"recreate"``: the last attempt's pickled error; ``exception`` is then the
    failure that made the restart necessary and ``description`` the message of the
    :class:`~jaxrunner.errors.EnvError`."""
    agent_id: str | None = None
    """Kind ``"env"`` in a turn-based multi-agent sub-env: the agent whose turn it was."""

    @classmethod
    def capture(cls, err: BaseException, kind: str, env_index: int, call: str) -> RemoteError:
        return cls(kind, env_index, call, pickled(err), repr(err), _format(err))

    @classmethod
    def capture_recreation(cls, err: EnvError) -> RemoteError:
        """The :class:`EnvError` of a sub-env restart that gave up
        (:meth:`~jaxrunner._src.backends.sub_env_block.SubEnvBlock.restart`)."""
        recreation = pickled(getattr(err, "recreation_error", None))
        cause = pickled(err.__cause__)
        return cls("recreate", err.env_index, "recreate", cause, str(err), _format(err), recreation)

    def rebuild(self, w: int, envs: range, place: str) -> BaseException:
        """The error as an exception of the main process (worker ``w``, sub-envs ``envs``;
        ``place``: ``"worker 2"`` or ``"the main process"``), with its ``__cause__`` set:
        the worker's traceback, or the original exception with the traceback chained."""
        trace = RemoteTraceback(self.traceback)
        original = _unpickle(self.exception)
        if original is not None:
            original.__cause__ = trace
        cause = original if original is not None else trace
        i = self.env_index
        error: BaseException
        if self.kind == "recreate":
            error = EnvError(self.description, i)
            error.recreation_error = _unpickle(self.recreation)  # type: ignore[attr-defined]
        elif self.kind == "env" and self.call == "factory":
            error = EnvError(f"the factory of sub-env {i} raised in {place}: {self.description}", i)
            error.agent_id = self.agent_id  # type: ignore[attr-defined]
        elif self.kind == "env":  # as the sync backend raises it
            error = SubEnvRaised(self.description, i, self.call, self.agent_id)
        elif original is not None:  # a jaxrunner check, or a failing call/get_attr
            error, cause = original, trace
        else:
            error = WorkerError(
                f"{place} (sub-envs {envs.start}..{envs.stop - 1}) raised {self.description}",
                w,
                envs,
            )
            cause = trace
        error.__cause__ = cause
        return error


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process, as text. Chained as
    the ``__cause__`` of that exception when it reaches the main process."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


class StepReply(NamedTuple):
    """A step's results beyond the shared block (global sub-env indices): a worker's
    answer to ``OP_STEP`` (sent only when some field is non-empty), or the step's, gathered
    from its workers' answers for :meth:`~.shared.BlockLayout.result`."""

    infos: dict[int, dict[str, Any]]
    """The non-empty step infos."""
    reset_infos: dict[int, dict[str, Any]]
    """The non-empty infos of the autoresets."""
    failed: list[int]
    """Sub-envs whose slot holds no transition: their step failed and they were restarted
    in the worker (restart policy set), or (gathered) their worker was replaced."""
    errors: dict[int, Any]
    """Every failure of the step (the restarted steps, and autoresets that failed after a
    good step): a worker's :class:`RemoteError`, rebuilt as an exception once gathered."""


def first_error(errors: list[tuple[int, RemoteError]]) -> tuple[int, RemoteError]:
    """The ``(worker, error)`` to raise of several: the lowest sub-env index first (as
    the sync backend would have met it), errors of no sub-env last."""
    return min(errors, key=lambda e: (e[1].env_index < 0, e[1].env_index))


def _format(err: BaseException) -> str:
    return "".join(traceback.format_exception(type(err), err, err.__traceback__))


def _unpickle(payload: bytes | None) -> BaseException | None:
    if payload is None:
        return None
    try:
        return pickle.loads(payload)
    except Exception:
        return None

"""The main process's side of one worker: start, send, receive with a deadline, kill. A
worker it reports lost is dead, so nothing it wrote is ever read again (what the loss
means for the vector env is :mod:`.recovery`'s business)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import os
import pickle
import select
import signal
import socket
import time
from collections.abc import Callable, Sequence
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

import jaxrunner._src.backends.process.protocol as protocol
from jaxrunner._src.backends.process.worker import Worker, describe, worker_main
from jaxrunner._src.backends.sub_env_block import build_envs
from jaxrunner.errors import WorkerError, WorkerTimeoutError

START_TIMEOUT_FLOOR_S = 60.0  # building sub-envs may take this long (imports, assets)
KILL_CONFIRM_S = 5.0  # how long kill() waits for a SIGKILLed worker to be gone


class WorkerLost(Exception):
    """Internal: worker ``w`` died or did not answer in time (it is dead now)."""

    def __init__(self, w: int, envs: range, reason: str, timed_out: bool) -> None:
        super().__init__(reason)
        self.w, self.envs, self.reason, self.timed_out = w, envs, reason, timed_out

    def error(self, consequence: str) -> WorkerError | WorkerTimeoutError:
        """The public error for this loss, saying what became of the vector env."""
        cls = WorkerTimeoutError if self.timed_out else WorkerError
        return cls(f"{self.reason}; {consequence}", self.w, self.envs)


@dataclasses.dataclass
class WorkerHandle:
    """One worker process, its socket and its commands in flight."""

    index: int
    envs: range
    process: BaseProcess
    sock: socket.socket
    pid: int | None
    poller: Any  # select.poll: waits for a reply with a deadline
    timeout_s: float | None  # step_timeout_s: how long each command may take
    inflight: dict[int, float] = dataclasses.field(default_factory=dict)
    """Commands sent and not yet answered: seq -> deadline, oldest (the next reply's) first."""
    started: str | None = None
    """The start time from ``/proc`` (None: no ``/proc``): a recycled pid is never signalled."""
    in_main_process = False

    @property
    def place(self) -> str:
        return f"worker {self.index}"

    def is_running(self) -> bool:
        """The worker process exists and is not a zombie, asked of the OS by pid (with the
        fork server dead, multiprocessing reports exit code 255 for live workers)."""
        if self.pid is None:
            return False
        if self.started is None:  # no /proc: the handle's word is all there is
            with contextlib.suppress(ValueError):
                return self.process.exitcode is None
            return False
        stat = _proc_stat(self.pid)
        return stat is not None and stat[1] == self.started and stat[0] not in ("Z", "X")

    def signal(self, signum: int) -> None:
        if self.pid is not None and self.is_running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def wait_gone(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(ValueError):  # reaps it if it is our child
                self.process.join(0)
            if not self.is_running():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def describe(self) -> str:
        return (
            f"worker {self.index} (pid {self.pid}, sub-envs "
            f"{self.envs.start}..{self.envs.stop - 1})"
        )

    def send(self, message: bytes, seq: int) -> None:
        """Sends command ``seq``; raises :class:`WorkerLost` if the worker is gone."""
        try:
            self.sock.sendall(message)
        except OSError as err:
            raise self.died() from err
        timeout_s = self.timeout_s
        self.inflight[seq] = math.inf if timeout_s is None else time.monotonic() + timeout_s

    def send_fd(self, fd: int) -> None:
        try:
            socket.send_fds(self.sock, [b"m"], [fd])
        except OSError as err:
            raise self.died() from err

    def read(self, spin: protocol.Spin | None = None) -> tuple[int, int, bytes]:
        """The next reply ``(seq, status, payload)`` by the oldest command's deadline;
        raises :class:`WorkerLost` (the worker is then dead) if it died or missed it."""
        if spin is not None:
            spin.until_readable(self.poller.poll)
        deadline = next(iter(self.inflight.values()), math.inf)
        if deadline != math.inf:
            remaining_ms = max(0.0, deadline - time.monotonic()) * 1000
            if not self.poller.poll(math.ceil(remaining_ms)):
                reason = (
                    f"{self.describe()} did not answer within step_timeout_s={self.timeout_s} s "
                    "(a sub-env hangs, or the machine is overloaded)"
                )
                self.kill()
                raise WorkerLost(self.index, self.envs, reason, timed_out=True)
        try:
            header = protocol.recv_exact(self.sock, protocol.REPLY.size)
            got, status, length = protocol.REPLY.unpack(header)
            payload = protocol.recv_exact(self.sock, length) if length else b""
        except (EOFError, OSError) as err:
            raise self.died() from err
        self.inflight.pop(got, None)
        return got, status, payload

    def died(self) -> WorkerLost:
        """The :class:`WorkerLost` of a worker whose socket broke (killed first)."""
        description = self.describe()
        code = None
        with contextlib.suppress(ValueError):
            self.process.join(0.5)
            code = self.process.exitcode
        if code is None:
            what = "stopped answering (its socket broke)"
        elif code < 0:
            what = f"was killed by signal {signal.Signals(-code).name}"
        else:
            what = f"exited with code {code}"
        self.kill()
        return WorkerLost(self.index, self.envs, f"{description} {what}", timed_out=False)

    def release(self) -> None:
        """Frees the process sentinel and socket (once the worker is gone)."""
        with contextlib.suppress(ValueError):  # a kill() already closed it
            self.process.close()
        self.sock.close()

    def kill(self) -> None:
        """Ends the worker now (SIGKILL by pid: a hung one gets no say) and frees its
        resources; raises WorkerError if it still runs ``KILL_CONFIRM_S`` later."""
        self.signal(signal.SIGKILL)
        gone = self.wait_gone(KILL_CONFIRM_S)
        with contextlib.suppress(ValueError):  # already closed
            self.process.join(0)
        self.release()  # its sentinel fd: workers may be replaced many times
        if not gone:
            raise WorkerError(
                f"{self.describe()} still runs {KILL_CONFIRM_S} s after SIGKILL (stuck in the "
                "kernel?); it cannot be stopped from here.",
                self.index,
                self.envs,
            )


class MainProcessWorker(Worker):
    """Worker 0 in the main process (``ProcessConfig(main_process_envs=k)``): the first ``k``
    sub-envs over the same shared block, without a socket; each command runs when its
    reply is read, so in lockstep the main process steps its share while the workers step
    theirs."""

    def __init__(self, fns: Sequence[Callable[[], Any]]) -> None:
        super().__init__(None, 0, list(fns))  # type: ignore[arg-type]  # no socket
        self.replies: collections.deque[tuple[int, int, bytes]] = collections.deque()
        self.fd: int | None = None

    def reply(self, seq: int, status: int, payload: bytes = b"") -> None:
        self.replies.append((seq, status, payload))

    def receive_fd(self) -> int:
        assert self.fd is not None  # internal: send_fd comes with OP_MEMORY
        return os.dup(self.fd)  # the worker maps it, then closes its own


class MainProcessHandle:
    """The pool's handle of a :class:`MainProcessWorker`: a :class:`WorkerHandle`'s calls;
    it never dies nor times out."""

    in_main_process = True
    pid = None

    def __init__(self, envs: range, fns: Sequence[Callable[[], Any]]) -> None:
        self.index, self.envs = 0, envs
        self.place = "the main process"
        self.inflight: dict[int, float] = {}  # seq -> deadline (none: they run here)
        self._commands: collections.deque[bytes] = collections.deque()
        self.worker = MainProcessWorker(fns)
        try:  # built now, reported as a worker process reports
            self.worker.envs = build_envs(self.worker.fns, 0)
            report = pickle.dumps(describe(self.worker.envs, 0))
            self.worker.reply(protocol.START_REPORT_SEQ, protocol.STATUS_OK, report)
        except Exception as err:
            self.worker.error(protocol.START_REPORT_SEQ, err)

    def send(self, message: bytes, seq: int) -> None:
        self._commands.append(message)
        self.inflight[seq] = math.inf

    def send_fd(self, fd: int) -> None:
        self.worker.fd = fd

    def read(self, spin: protocol.Spin | None = None) -> tuple[int, int, bytes]:
        """The next reply: the oldest command runs now, in this thread."""
        replies = self.worker.replies
        if not replies:
            message = self._commands.popleft()
            op, seq, lo, hi, _ = protocol.COMMAND.unpack_from(message)
            self.worker.answer(op, seq, lo, hi, message[protocol.COMMAND.size :])
        got, status, payload = replies.popleft()
        self.inflight.pop(got, None)
        return got, status, payload

    def kill(self) -> None:
        self._commands.clear()
        self.worker.close()


def spawn_worker(
    ctx: BaseContext,
    index: int,
    envs: range,
    factories: bytes,
    step_timeout_s: float | None,
) -> WorkerHandle:
    """Starts worker ``index``; it builds its sub-envs, then reports as command
    :data:`protocol.START_REPORT_SEQ`."""
    mine, theirs = socket.socketpair()
    process = ctx.Process(  # type: ignore[attr-defined]
        target=worker_main,
        args=(theirs, envs.start, factories),  # multiprocessing sends a socket's duplicate
        name=f"jaxrunner-worker-{index}",
        daemon=True,
    )
    try:
        process.start()
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
    poller = select.poll()
    poller.register(mine, select.POLLIN)
    deadline = {protocol.START_REPORT_SEQ: start_deadline(step_timeout_s)}
    stat = None if process.pid is None else _proc_stat(process.pid)
    started = None if stat is None else stat[1]
    return WorkerHandle(
        index, envs, process, mine, process.pid, poller, step_timeout_s, deadline, started
    )


def start_deadline(step_timeout_s: float | None) -> float:
    """When a worker building sub-envs from now must have answered."""
    start_s = math.inf if step_timeout_s is None else max(START_TIMEOUT_FLOOR_S, step_timeout_s)
    return time.monotonic() + start_s


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """``(state, start time)`` of process ``pid`` from ``/proc`` (None: none)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], fields[19]  # fields 3 and 22 of proc(5)


@dataclasses.dataclass
class Resources:
    """What the vector env's finalizer releases (it must not reference the vector env)."""

    workers: list[Any] = dataclasses.field(default_factory=list)  # WorkerHandle | MainProcessHandle
    fd: int | None = None
    memory: Any = None


def shutdown(res: Resources, timeout_s: float = 2.0) -> None:
    """Ends every worker (asked first, then terminated, then killed) and frees the
    shared memory. Safe to call at interpreter exit and more than once."""
    workers, res.workers = res.workers, []
    payload = pickle.dumps(("close", ()))
    close = protocol.COMMAND.pack(protocol.OP_CALL, -1, 0, 0, len(payload)) + payload
    for worker in workers:  # the main process's share closes here and now
        if worker.in_main_process:
            worker.kill()
        else:  # asked (a worker gone already cannot hear it)
            with contextlib.suppress(OSError):
                worker.sock.settimeout(0.5)
                worker.sock.sendall(close)
    workers = [worker for worker in workers if not worker.in_main_process]
    # By pid, never by the multiprocessing handle: with the fork server dead it calls
    # live workers dead (exit code 255) and a hung worker would outlive us.
    deadline = time.monotonic() + timeout_s
    for worker in workers:
        if not worker.wait_gone(max(0.0, deadline - time.monotonic())):
            worker.signal(signal.SIGTERM)
    for worker in workers:
        if not worker.wait_gone(1.0):
            with contextlib.suppress(WorkerError):  # nothing more can be done at exit
                worker.kill()
        worker.release()
    if res.memory is not None:
        # With numpy views still alive, the mapping goes when they are freed.
        with contextlib.suppress(BufferError):
            res.memory.close()
        res.memory = None
    if res.fd is not None:
        os.close(res.fd)
        res.fd = None

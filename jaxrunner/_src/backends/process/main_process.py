"""Worker 0 in the main process (``ProcessConfig(main_process_envs=k)``): the first ``k``
sub-envs, stepped by a :class:`~.worker.Worker` over the same shared block, whose commands
run when their reply is read. In lockstep the main process so steps its share while the
worker processes step theirs."""

from __future__ import annotations

import collections
import math
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import jaxrunner._src.backends.process.protocol as protocol
from jaxrunner._src.backends.process.worker import Worker, describe
from jaxrunner._src.backends.sub_env_block import build_envs


class MainProcessWorker(Worker):
    """A worker without a socket: its replies are kept for :class:`MainProcessHandle`."""

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
    """The pool's handle of worker 0 when it is the main process: a
    :class:`~.handle.WorkerHandle`'s calls; it never dies nor times out."""

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
            report = pickle.dumps(describe(self.worker.envs))
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

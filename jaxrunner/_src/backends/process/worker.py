"""The worker process of ``backend="process"``: steps its block of sub-envs with the shared
loop of :mod:`jaxrunner._src.backends.sub_env_block` over the shared block, answers commands in
order, and ends on close or when its socket reaches EOF. The fork server preloads this
module: it must not start JAX."""

from __future__ import annotations

import mmap
import os
import pickle
import select
import socket
from collections.abc import Callable
from typing import Any

import gymnasium

from jaxrunner._src.backends.base import env_spaces
from jaxrunner._src.backends.env_api import is_multi_agent_env
from jaxrunner._src.backends.process.launch import available_cpus
from jaxrunner._src.backends.process.protocol import (
    COMMAND,
    OP_MEMORY,
    OP_STEP,
    REPLY,
    START_REPORT_SEQ,
    STATUS_ERROR,
    STATUS_OK,
    RemoteError,
    Spin,
    StepReply,
    recv_exact,
)
from jaxrunner._src.backends.process.shared import BlockLayout
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.sub_env_block import SubEnvBlock, SubEnvRaised, build_envs
from jaxrunner.errors import EnvError, JaxRunnerError

# The OP_CALL methods the step loop answers itself; the others are the Worker's.
BLOCK_CALLS = frozenset({"call", "get_attr", "set_attr", "render", "on_sub_env"})


class Worker:
    """Owns sub-envs ``[offset, offset + len(envs))`` and answers the main process."""

    def __init__(
        self, sock: socket.socket, offset: int, fns: list[Callable[[], gymnasium.Env]]
    ) -> None:
        self.sock, self.offset, self.fns = sock, offset, fns
        self.envs: list[gymnasium.Env] = []
        self.sub_envs: SubEnvBlock | None = None  # the step loop, once the block is attached
        self._memory: mmap.mmap | None = None
        self.spin = Spin(0.0)  # how long to busy-wait for the next command

    def attach(
        self, fd: int, layout: BlockLayout, policy: RestartPolicy | None, spin_s: float
    ) -> None:
        self.spin = Spin(spin_s, available_cpus())
        self._memory = mmap.mmap(fd, layout.nbytes)
        os.close(fd)
        v = layout.views(self._memory)
        self.read_actions = layout.actions_reader(v)
        # The marks as a memoryview: faster item writes than numpy's.
        v = v._replace(status=memoryview(v.status))
        self.sub_envs = layout.block(self, v, policy)

    def grow(self, payload: bytes) -> dict[str, Any]:
        """Builds the rest of this worker's sub-envs (it was started over its first one
        to report the kind): ``payload`` holds all their factories; the new ones' report."""
        fns = pickle.loads(payload)
        built = len(self.envs)
        envs = build_envs(fns[built:], self.offset + built)
        self.fns, self.envs = fns, self.envs + envs
        return describe(envs, self.offset + built)

    def step(self, lo: int, hi: int) -> StepReply | None:
        """Steps envs ``[lo, hi)`` with the shared loop, as the sync backend does;
        returns what does not fit in shared memory, or None when that is nothing."""
        out = self.sub_envs.step(lo, hi, self.read_actions(lo, hi))  # type: ignore[union-attr]
        infos = {i: info for i, info in enumerate(out.infos, lo) if info}
        reset_infos = {i: info for i, info in out.reset_infos.items() if info}
        if not (infos or reset_infos or out.errors):
            return None
        remote = {i: _captured(err) for i, err in out.errors.items()}
        return StepReply(infos, reset_infos, out.failed, remote)

    def reset(
        self, seeds: list[int | None], options: dict[str, Any] | None
    ) -> tuple[list[dict], int]:
        """The reset infos, and the sub-envs restarted because their reset failed (the
        main side counts restarts: step replies report theirs)."""
        return self._counting_restarts(self.sub_envs.reset, seeds, options)  # type: ignore[union-attr]

    def reset_at(
        self, index: int, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[dict, int]:
        """Sub-env ``index``'s reset info, and 1 where its reset failed and it restarted."""
        return self._counting_restarts(self.sub_envs.reset_or_restart, index, seed, options)  # type: ignore[union-attr]

    def _counting_restarts(self, reset: Callable[..., Any], *args: Any) -> tuple[Any, int]:
        before = self.sub_envs.num_restarts  # type: ignore[union-attr]
        result = reset(*args)
        return result, self.sub_envs.num_restarts - before  # type: ignore[union-attr]

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []

    def reply(self, seq: int, status: int, payload: bytes = b"") -> None:
        self.sock.sendall(REPLY.pack(seq, status, len(payload)) + payload)

    def error(self, seq: int, err: BaseException) -> None:
        if isinstance(err, EnvError) and hasattr(err, "recreation_error"):
            remote = RemoteError.capture_recreation(err)
        elif isinstance(err, JaxRunnerError):
            remote = _captured(err)
        else:
            remote = RemoteError.capture(err, "worker", -1, "")
        self.reply(seq, STATUS_ERROR, pickle.dumps(remote))

    def serve(self) -> None:
        """Answers commands until told to close or the main process goes away."""
        sock, answer = self.sock, self.answer
        header_size = COMMAND.size
        poll = select.poll()
        poll.register(sock, select.POLLIN)
        while True:
            self.spin.until_readable(poll.poll)
            try:
                op, seq, lo, hi, length = COMMAND.unpack(recv_exact(sock, header_size))
                payload = recv_exact(sock, length) if length else b""
                if answer(op, seq, lo, hi, payload):
                    return
            except (EOFError, OSError):
                return  # the main process is gone

    def answer(self, op: int, seq: int, lo: int, hi: int, payload: bytes) -> bool:
        """Runs one command and replies to it; True once told to close."""
        try:
            if op == OP_STEP:
                result = self.step(lo, hi)
                self.reply(seq, STATUS_OK, b"" if result is None else pickle.dumps(result, 5))
                return False
            if op == OP_MEMORY:
                layout, policy, spin_s = pickle.loads(payload)
                self.attach(self.receive_fd(), layout, policy, spin_s)
                self.reply(seq, STATUS_OK)
                return False
            method, args = pickle.loads(payload)
            result = getattr(self.sub_envs if method in BLOCK_CALLS else self, method)(*args)
            self.reply(seq, STATUS_OK, pickle.dumps(result, protocol=5))
            return method == "close"
        except (EOFError, BrokenPipeError, ConnectionResetError):
            raise
        except Exception as err:
            self.error(seq, err)
            return False

    def receive_fd(self) -> int:  # the shared block's, sent after OP_MEMORY
        return socket.recv_fds(self.sock, 1, 1)[1][0]


def describe(envs: list[Any], offset: int) -> dict[str, Any]:
    """A worker's start report: its sub-envs' (from ``offset`` on) metadata, and their
    spaces (gymnasium) or agents (PettingZoo)."""
    first = envs[0]
    report = {
        "metadata": getattr(first, "metadata", {}),
        "render_mode": getattr(first, "render_mode", None),
    }
    if is_multi_agent_env(first):  # PettingZoo (imported only then)
        from jaxrunner._src.core.agent_groups import describe_agents

        report["agents"] = [describe_agents(env) for env in envs]
    else:
        report["spaces"] = env_spaces(envs, offset)
    return report


def worker_main(sock: socket.socket, offset: int, payload: bytes) -> None:
    """The worker process's entry point: builds the envs, reports them, serves commands."""
    worker = Worker(sock, offset, [])
    try:
        worker.fns = pickle.loads(payload)
        worker.envs = build_envs(worker.fns, offset)
        worker.reply(START_REPORT_SEQ, STATUS_OK, pickle.dumps(describe(worker.envs, offset)))
    except BaseException as err:
        worker.error(START_REPORT_SEQ, err)
        sock.close()
        return
    try:
        worker.serve()
    finally:
        worker.close()
        sock.close()


def _captured(err: BaseException) -> RemoteError:
    """A sub-env's failure for the main process, which rebuilds it as raised here: a
    :class:`SubEnvRaised` from the env's own exception, or a jaxrunner check."""
    if isinstance(err, SubEnvRaised):
        remote = RemoteError.capture(err.__cause__, "env", err.env_index, err.call)  # type: ignore[arg-type]
        remote.agent_id = err.agent_id
        return remote
    return RemoteError.capture(err, "check", getattr(err, "env_index", -1), "")

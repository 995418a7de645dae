"""``backend="process"`` for multi-agent envs: worker processes, each serving a block
of sub-envs (:mod:`jaxrunner.multi_agent.remote`).

Workers start as the single-agent process backend's do (``forkserver``, factories sent
by ``cloudpickle``: :mod:`jaxrunner.envs.process.launch`); commands and replies go
over a pipe (local only).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Sequence
from typing import Any

import cloudpickle

from jaxrunner.envs.process.launch import (
    default_num_workers,
    multiprocessing_context,
    pickle_factories,
    worker_bounds,
)
from jaxrunner.errors import EnvError, JaxRunnerError
from jaxrunner.multi_agent.groups import PolicyMappingFn
from jaxrunner.multi_agent.remote import BlockServer, RemoteBlocksVectorEnv, Reply
from jaxrunner.multi_agent.sub_envs import MultiAgentEnvFactory


def _worker(conn: Any, payload: bytes, offset: int) -> None:
    """The worker loop: builds its block, then answers commands until ``close``."""
    server = None
    try:
        env_fns, mapping = cloudpickle.loads(payload)
        server = BlockServer(env_fns, mapping, offset)
        conn.send(("ok", server.describe()))
        while True:
            command, args = conn.recv()
            if command == "close":
                break
            try:
                conn.send(("ok", getattr(server, command)(*args)))
            except Exception as err:  # sent to the main process, with its traceback
                _send_error(conn, err)
    except Exception as err:
        _send_error(conn, err)
    finally:
        if server is not None:
            server.close()
        conn.close()


def _send_error(conn: Any, err: Exception) -> None:
    """Sends ``err`` (itself if it pickles, else its repr) and its traceback."""
    tb = traceback.format_exc()
    try:
        conn.send(("error", err, tb))
    except Exception:
        conn.send(("error", None, f"{err!r}\n{tb}"))


class ProcessMultiAgentVectorEnv(RemoteBlocksVectorEnv):
    """Multi-agent sub-envs in worker processes (see the module docstring).

    Args:
        env_fns: zero-argument factories of PettingZoo envs (picklable by cloudpickle).
        policy_mapping_fn: as for the sync backend (picklable).
        num_workers: worker processes (None: one per CPU, at most one per env: the main
            process waits while they step).
    """

    def __init__(
        self,
        env_fns: Sequence[MultiAgentEnvFactory],
        policy_mapping_fn: PolicyMappingFn | None = None,
        *,
        num_workers: int | None = None,
    ) -> None:
        super().__init__()
        self.num_envs = len(env_fns)
        if num_workers is None:  # lockstep: the main process waits while workers step
            num_workers = default_num_workers(self.num_envs, main_process="waits")
        self._bounds = worker_bounds(self.num_envs, None, num_workers)
        ctx = multiprocessing_context("forkserver")
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        try:
            for lo, hi in self._bounds:
                pickle_factories(env_fns[lo:hi], lo)  # a clear error for unpicklable ones
                payload = cloudpickle.dumps((list(env_fns[lo:hi]), policy_mapping_fn))
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker, args=(child, payload, lo), daemon=True)
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
            replies = [self._reply(k) for k in range(len(self._conns))]
        except BaseException:
            self._closed = True
            self._close_backend()
            raise
        self.groups, self.turn_based = replies[0]
        self._allocate()

    def _call_all(self, method: str, args_per_remote: list[tuple]) -> list[Reply]:
        for conn, args in zip(self._conns, args_per_remote):
            conn.send((method, args))
        return [self._reply(k) for k in range(len(self._conns))]

    def _reply(self, k: int) -> Any:
        where = f"multi-agent process worker {k} (sub-envs {self._bounds[k]})"
        try:
            status, value, *tb = self._conns[k].recv()
        except EOFError as err:
            raise EnvError(
                f"{where} died; see its output above. Recreate the env with "
                "jaxrunner.make_multi_agent_vec().",
                self._bounds[k][0],
            ) from err
        if status == "ok":
            return value
        self._closed = True
        self._close_backend()
        if value is None:
            raise EnvError(f"{where} failed:\n{tb[0]}", self._bounds[k][0])
        value.add_note(f"--- {where}: worker traceback ---\n{tb[0]}")
        if isinstance(value, JaxRunnerError):
            raise value
        raise EnvError(f"{where}: a sub-env raised {value!r}", self._bounds[k][0]) from value

    def _close_backend(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send(("close", ()))
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        for conn in self._conns:
            conn.close()


__all__ = ["ProcessMultiAgentVectorEnv"]

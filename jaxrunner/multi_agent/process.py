"""``backend="process"`` for multi-agent envs: worker processes, each serving a block
of sub-envs (:mod:`jaxrunner.multi_agent.remote`).

Workers start as the single-agent process backend's do (``forkserver``, factories sent
by ``cloudpickle``: :mod:`jaxrunner.envs.process.launch`); commands and replies go
over a pipe (local only). Failures are the single-agent backend's errors: a sub-env
that raises comes back as the :class:`~jaxrunner.errors.EnvError` the sync backend
raises (its global index, the agent, the worker's traceback); a worker that dies is a
:class:`~jaxrunner.errors.WorkerError` and one that does not answer within
``ProcessConfig.step_timeout_s`` a :class:`~jaxrunner.errors.WorkerTimeoutError`
(the worker is killed). After any of them the vector env is closed.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Sequence
from typing import Any

import cloudpickle

from jaxrunner.envs.process.config import ProcessConfig, checked_config
from jaxrunner.envs.process.launch import (
    default_num_workers,
    multiprocessing_context,
    pickle_factories,
    worker_bounds,
)
from jaxrunner.errors import (
    EnvError,
    InvalidArgumentError,
    JaxRunnerError,
    WorkerError,
    WorkerTimeoutError,
)
from jaxrunner.faults import RestartPolicy
from jaxrunner.multi_agent.groups import PolicyMappingFn
from jaxrunner.multi_agent.remote import BlockServer, RemoteBlocksVectorEnv, Reply
from jaxrunner.multi_agent.sub_envs import MultiAgentEnvFactory

START_TIMEOUT_S = 60.0
"""The least time a worker has to build its sub-envs (``step_timeout_s`` if longer)."""


def _worker(conn: Any, payload: bytes, offset: int) -> None:
    """The worker loop: builds its block, then answers commands until ``close``."""
    server = None
    try:
        env_fns, mapping, restart_policy = cloudpickle.loads(payload)
        server = BlockServer(env_fns, mapping, offset, restart_policy)
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
        config: a :class:`~jaxrunner.ProcessConfig`: ``num_workers`` or
            ``envs_per_worker``, ``start_method`` and ``step_timeout_s`` apply (None: the
            defaults, one worker per CPU, at most one per env: the main process waits
            while they step). Its ``ready_first`` and ``main_process_envs`` do not apply
            to multi-agent envs yet and are refused.
        restart_policy: failed sub-envs are recreated inside their worker, as the sync
            backend does (None: failures raise). A worker that dies or hangs is not
            replaced yet: its error is raised and the vector env closes.

    Raises:
        InvalidArgumentError: a config option multi-agent envs do not take.
        WorkerError: a worker died while starting.
        WorkerTimeoutError: a worker did not start within ``max(60 s, step_timeout_s)``.
    """

    def __init__(
        self,
        env_fns: Sequence[MultiAgentEnvFactory],
        policy_mapping_fn: PolicyMappingFn | None = None,
        *,
        config: ProcessConfig | None = None,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        super().__init__()
        config = checked_config(config, "make_multi_agent_vec")
        self.restart_policy = restart_policy
        if config.ready_first or config.main_process_envs:
            raise InvalidArgumentError(
                "make_multi_agent_vec(backend='process', config=ProcessConfig(...)): "
                "ready_first and main_process_envs do not apply to multi-agent envs yet; leave "
                "them at their defaults."
            )
        self.config = config
        self.num_envs = len(env_fns)
        num_workers = config.num_workers
        if num_workers is None and config.envs_per_worker is None:
            # lockstep: the main process waits while the workers step
            num_workers = default_num_workers(self.num_envs, main_process="waits")
        self._bounds = worker_bounds(self.num_envs, config.envs_per_worker, num_workers)
        ctx = multiprocessing_context(config.start_method)
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        try:
            for lo, hi in self._bounds:
                pickle_factories(env_fns[lo:hi], lo)  # a clear error for unpicklable ones
                payload = cloudpickle.dumps(
                    (list(env_fns[lo:hi]), policy_mapping_fn, restart_policy)
                )
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker, args=(child, payload, lo), daemon=True)
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
            timeout = max(START_TIMEOUT_S, config.step_timeout_s or 0.0)
            deadline = time.monotonic() + timeout
            replies = [self._reply(k, deadline, "start") for k in range(len(self._conns))]
        except BaseException:
            self._closed = True
            self._close_backend()
            raise
        self.groups, self.turn_based = replies[0]
        self._allocate()

    @property
    def step_timeout_s(self) -> float | None:
        """How long a worker may take to answer a command (None: forever)."""
        return self.config.step_timeout_s

    def _call_all(self, method: str, args_per_remote: list[tuple]) -> list[Reply]:
        for k, (conn, args) in enumerate(zip(self._conns, args_per_remote)):
            try:
                conn.send((method, args))
            except OSError as err:  # a broken pipe: the worker is gone
                self._fail(self._lost(k, f"died before {method}()", err))
        timeout = self.config.step_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        return [self._reply(k, deadline, method) for k in range(len(self._conns))]

    def _call_one(self, k: int, method: str, args: tuple) -> Any:
        try:
            self._conns[k].send((method, args))
        except OSError as err:
            self._fail(self._lost(k, f"died before {method}()", err))
        timeout = self.config.step_timeout_s
        return self._reply(k, None if timeout is None else time.monotonic() + timeout, method)

    def _reply(self, k: int, deadline: float | None, method: str) -> Any:
        """Worker ``k``'s answer to ``method``, waited for until ``deadline``."""
        conn = self._conns[k]
        try:
            ready = deadline is None or conn.poll(max(0.0, deadline - time.monotonic()))
            if ready:
                status, value, *tb = conn.recv()
        except (EOFError, OSError) as err:
            self._fail(self._lost(k, f"died during {method}()", err))
        if not ready:
            lo, hi = self._bounds[k]
            self._procs[k].kill()  # a hung worker reads no close command
            self._fail(
                WorkerTimeoutError(
                    f"{self._where(k)} did not answer {method}() within step_timeout_s="
                    f"{self.config.step_timeout_s} s (a sub-env hangs?); it was killed and "
                    "the vector env closed. Raise ProcessConfig(step_timeout_s=...) if your "
                    "envs need longer, and recreate the env with "
                    "jaxrunner.make_multi_agent_vec().",
                    k,
                    range(lo, hi),
                )
            )
        if status == "ok":
            return value
        where = self._where(k)
        if value is None:
            self._fail(EnvError(f"{where} failed:\n{tb[0]}", self._bounds[k][0]))
        with contextlib.suppress(AttributeError):  # add_note: Python 3.11+
            value.add_note(f"--- {where}: worker traceback ---\n{tb[0]}")
        if isinstance(value, JaxRunnerError):
            self._fail(value)
        index = getattr(value, "env_index", self._bounds[k][0])
        self._fail(EnvError(f"{where}: a sub-env raised {value!r}", index), cause=value)

    def _where(self, k: int) -> str:
        lo, hi = self._bounds[k]
        return f"multi-agent process worker {k} (sub-envs {lo}..{hi - 1})"

    def _lost(self, k: int, what: str, err: BaseException) -> WorkerError:
        lo, hi = self._bounds[k]
        code = self._procs[k].exitcode if k < len(self._procs) else None
        error = WorkerError(
            f"{self._where(k)} {what} (exit code {code}); see its output above. The vector "
            "env is closed: recreate it with jaxrunner.make_multi_agent_vec().",
            k,
            range(lo, hi),
        )
        error.__cause__ = err
        return error

    def _fail(self, err: BaseException, cause: BaseException | None = None) -> Any:
        """Closes the vector env (killing its workers) and raises ``err``."""
        self._closed = True
        self._close_backend()
        if cause is not None:
            raise err from cause
        raise err

    def _close_backend(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send(("close", ()))
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self._conns:
            conn.close()


__all__ = ["ProcessMultiAgentVectorEnv"]

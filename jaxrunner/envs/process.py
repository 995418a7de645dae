"""``backend="process"``: sub-envs in worker processes, data in shared memory.

Each worker process owns a contiguous block of sub-envs. Observations, rewards,
flags and actions live in one shared-memory block that the workers write in place
(:mod:`jaxrunner.envs.process_worker`); per step, each worker gets one small command
on its Unix socket and answers with one small reply (plus pickled infos only when
an env returned a non-empty info). ``benchmarks/process_signal.py`` compares this
signalling with the alternatives (pipes, semaphores, spinning on shared flags).

Workers start with ``forkserver`` (or ``spawn``), never a plain ``fork`` of the
main process, which may have started JAX's threads. They end on ``close()``, when
the vector env is garbage collected, at interpreter exit, and on their own when the
main process dies (their socket reaches EOF).

``step_batch_async``/``step_batch_wait`` let the runner keep several groups of
workers stepping while it computes the policy of another group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import multiprocessing
import os
import pickle
import socket
import sys
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import Any, ClassVar

import gymnasium
import numpy as np
from gymnasium.vector.utils import batch_space

from jaxrunner import spaces as jr_spaces
from jaxrunner.envs import process_worker as pw
from jaxrunner.envs.base import BatchStep, VectorEnv
from jaxrunner.errors import (
    EnvError,
    EnvIndexError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    SpaceMismatchError,
    WorkerError,
)

EnvFactory = Callable[[], gymnasium.Env]
START_METHODS = ("forkserver", "spawn")
_WORKER_MODULE = "jaxrunner.envs.process_worker"


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process, as text. Chained as
    the ``__cause__`` of that exception when it reaches the main process."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


def default_num_workers(num_envs: int) -> int:
    """One worker per CPU this process may run on but one, which the main process
    needs for the policy (on 2 cores, 1 worker did as well as 2: see
    ``benchmarks/results/process_cpu_priority*.json``); at least one, at most one per
    sub-env."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(num_envs, cpus - 1))


def worker_bounds(
    num_envs: int, envs_per_worker: int | None, num_workers: int | None
) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` sub-env range of each worker."""
    for name, value in (("envs_per_worker", envs_per_worker), ("num_workers", num_workers)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1
        ):
            raise InvalidArgumentError(
                f"ProcessVectorEnv({name}={value!r}): expected an int >= 1 (or None for a "
                "default from the CPU count)."
            )
    if envs_per_worker is not None and num_workers is not None:
        raise InvalidArgumentError(
            f"ProcessVectorEnv(envs_per_worker={envs_per_worker}, num_workers={num_workers}): "
            "give one of them; the other follows from num_envs."
        )
    if envs_per_worker is not None:
        k = int(envs_per_worker)
        return [(lo, min(lo + k, num_envs)) for lo in range(0, num_envs, k)]
    if num_workers is not None and num_workers > num_envs:
        raise InvalidArgumentError(
            f"ProcessVectorEnv(num_workers={num_workers}): more workers than sub-envs "
            f"({num_envs}); every worker needs at least one sub-env."
        )
    count = default_num_workers(num_envs) if num_workers is None else int(num_workers)
    # The runner splits its pipelining groups the same way, so groups fall on workers.
    edges = np.linspace(0, num_envs, count + 1).round().astype(int).tolist()
    return list(itertools.pairwise(edges))


def pickle_factories(env_fns: Sequence[EnvFactory], offset: int) -> bytes:
    """The factories as bytes for a worker: ``pickle``, else ``cloudpickle`` (lambdas,
    closures) when it is installed, else a clear error naming the factory."""
    try:
        return pickle.dumps(list(env_fns), protocol=5)
    except Exception as err:
        first_error: Exception = err
    try:
        import cloudpickle
    except ImportError:
        cloudpickle = None
    if cloudpickle is not None:
        try:
            return cloudpickle.dumps(list(env_fns), protocol=5)
        except Exception as err:
            first_error = err
    for j, fn in enumerate(env_fns):
        try:
            (cloudpickle or pickle).dumps(fn)
        except Exception as err:
            first_error, bad = err, offset + j
            break
    else:  # pragma: no cover - the list failed but no element did
        bad = offset
    hint = "" if cloudpickle else " or install cloudpickle (pip install cloudpickle)"
    raise InvalidArgumentTypeError(
        f"backend='process': the factory of sub-env {bad} cannot be sent to a worker "
        f"process ({first_error!r}). Use a module-level function or a functools.partial "
        f"of one{hint}; for gymnasium ids pass the id string to make_vec."
    ) from first_error


def _context(start_method: str) -> multiprocessing.context.BaseContext:
    if sys.platform == "win32":
        raise InvalidArgumentError(
            "backend='process' needs a Unix-like OS (it passes file descriptors between "
            "processes); use backend='sync' on Windows."
        )
    if start_method not in START_METHODS:
        raise InvalidArgumentError(
            f"ProcessVectorEnv(start_method={start_method!r}): expected one of "
            f"{START_METHODS}. 'fork' is refused: forking a process that has started JAX's "
            "threads can deadlock the child."
        )
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        from multiprocessing import forkserver

        # The fork server imports the worker module once (numpy, gymnasium, jaxrunner:
        # no JAX backend, so no JAX thread), and each worker forks from it in
        # milliseconds. Takes effect when this process starts its fork server.
        preload = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
        if _WORKER_MODULE not in preload:
            ctx.set_forkserver_preload([*preload, _WORKER_MODULE])
    return ctx


@dataclasses.dataclass
class _Worker:
    index: int
    envs: range
    process: BaseProcess
    sock: socket.socket


@dataclasses.dataclass
class _Resources:
    """What the finalizer releases (it must not reference the vector env itself)."""

    workers: list[_Worker] = dataclasses.field(default_factory=list)
    fd: int | None = None
    memory: Any = None


def _shutdown(res: _Resources, timeout_s: float = 2.0) -> None:
    """Ends every worker (asked first, then terminated, then killed) and frees the
    shared memory. Safe to call at interpreter exit and more than once."""
    workers, res.workers = res.workers, []
    payload = pickle.dumps(("close", ()))
    close = pw.COMMAND.pack(pw.OP_CALL, -1, 0, 0, len(payload)) + payload
    for worker in workers:
        try:
            worker.sock.settimeout(0.5)
            worker.sock.sendall(close)
        except OSError:
            pass
    for worker in workers:
        worker.process.join(timeout_s)
        if worker.process.is_alive():
            worker.process.terminate()
            worker.process.join(1.0)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(1.0)
        worker.sock.close()
    if res.memory is not None:
        # With numpy views still alive, the mapping goes when they are freed.
        with contextlib.suppress(BufferError):
            res.memory.close()
        res.memory = None
    if res.fd is not None:
        os.close(res.fd)
        res.fd = None


class ProcessVectorEnv(VectorEnv):
    """Sub-envs in worker processes, stepped in parallel, data in shared memory.

    Step for step equal to :class:`~jaxrunner.SyncVectorEnv` (and so to
    ``gymnasium.vector.SyncVectorEnv`` with SAME_STEP autoreset) for the same seeds and
    actions, whatever the number of workers. Sub-envs receive actions in the action
    space's dtype.

    Args:
        env_fns: zero-argument factories, one per sub-env; each is pickled (with
            cloudpickle if plain pickle fails and cloudpickle is installed) and
            called in its worker.
        envs_per_worker: sub-envs per worker process (the last may have fewer).
        num_workers: alternatively, the number of worker processes (sub-envs are
            split evenly). Default: one per CPU but one (the main process runs the
            policy), at least one, at most one per sub-env.
        copy: as for :class:`~jaxrunner.SyncVectorEnv`.
        start_method: ``"forkserver"`` (default: workers start in milliseconds) or
            ``"spawn"``.

    Raises:
        InvalidArgumentTypeError: a factory cannot be pickled.
        EnvError: a factory raised in its worker (the original is chained).
        SpaceMismatchError: sub-envs with different or unsupported spaces.
    """

    steps_in_background: ClassVar[bool] = True
    default_num_groups: ClassVar[int | None] = 2

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        *,
        envs_per_worker: int | None = None,
        num_workers: int | None = None,
        copy: bool = True,
        start_method: str = "forkserver",
    ) -> None:
        super().__init__(copy=copy)
        self._res = _Resources()
        self._finalizer = weakref.finalize(self, _shutdown, self._res)
        if len(env_fns) == 0:
            raise InvalidArgumentError("ProcessVectorEnv needs at least one env factory, got none.")
        self.num_envs = len(env_fns)
        self._bounds = worker_bounds(self.num_envs, envs_per_worker, num_workers)
        payloads = [pickle_factories(env_fns[lo:hi], lo) for lo, hi in self._bounds]
        ctx = _context(start_method)
        self._seq = 0
        self._stash: dict[tuple[int, int], tuple[int, bytes]] = {}
        self._calls: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._splitters: dict[int, Callable[[Any], list[Any]]] = {}
        try:
            self._start(ctx, payloads)
        except BaseException:
            self._closed_reason = "construction failed"
            self._finalizer()
            raise

    # -- start-up -----------------------------------------------------------------------------

    def _start(self, ctx: multiprocessing.context.BaseContext, payloads: list[bytes]) -> None:
        for w, ((lo, hi), payload) in enumerate(zip(self._bounds, payloads)):
            mine, theirs = socket.socketpair()
            process = ctx.Process(  # type: ignore[attr-defined]
                target=pw.worker_main,
                args=(pw.SocketHandle(theirs), lo, payload),
                name=f"jaxrunner-worker-{w}",
                daemon=True,
            )
            try:
                process.start()
            finally:
                theirs.close()
            self._res.workers.append(_Worker(w, range(lo, hi), process, mine))
        self._workers = self._res.workers
        reports = [self._expect(w.index, 0) for w in self._workers]
        env_spaces = [pair for report in reports for pair in report["spaces"]]
        self._check_spaces(env_spaces)
        first = reports[0]
        autoreset = VectorEnv.metadata["autoreset_mode"]
        self.metadata = {**first["metadata"], "autoreset_mode": autoreset}
        self.render_mode = first["render_mode"]
        self.spec = None
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        layout = pw.Layout(self.single_observation_space, self.single_action_space, self.num_envs)
        self._res.fd, self._res.memory = pw.create_shared_block(layout.nbytes)
        self._views = layout.views(self._res.memory)
        message = pickle.dumps(layout)
        seqs = []
        for worker in self._workers:
            seq = self._next_seq()
            worker.sock.sendall(pw.COMMAND.pack(pw.OP_MEMORY, seq, 0, 0, len(message)) + message)
            socket.send_fds(worker.sock, [b"m"], [self._res.fd])
            seqs.append(seq)
        for worker, seq in zip(self._workers, seqs):
            self._expect(worker.index, seq)

    def _check_spaces(self, env_spaces: list[tuple[gymnasium.Space, gymnasium.Space]]) -> None:
        self.single_observation_space, self.single_action_space = env_spaces[0]
        for i, pair in enumerate(env_spaces):
            for name, expected, got in zip(
                ("observation_space", "action_space"), env_spaces[0], pair
            ):
                if got != expected:
                    raise SpaceMismatchError(
                        f"sub-env {i} has {name}={got}, but sub-env 0 has {expected}; every "
                        "sub-env of a vector env must have equal spaces. Check the factory."
                    )
        jr_spaces.check_supported(self.single_observation_space, "single_observation_space")
        jr_spaces.check_supported(self.single_action_space, "single_action_space")

    # -- the protocol ---------------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, w: int, op: int, lo: int = 0, hi: int = 0, payload: bytes = b"") -> int:
        seq = self._next_seq()
        try:
            self._workers[w].sock.sendall(pw.COMMAND.pack(op, seq, lo, hi, len(payload)) + payload)
        except OSError as err:
            raise self._died(w) from err
        return seq

    def _reply(self, w: int, seq: int) -> tuple[int, bytes]:
        """Worker ``w``'s reply to command ``seq`` (replies to earlier commands that
        arrive first are kept for whoever waits for them)."""
        key = (w, seq)
        sock = self._workers[w].sock
        while key not in self._stash:
            try:
                got, status, length = pw.REPLY.unpack(pw.recv_exact(sock, pw.REPLY.size))
                payload = pw.recv_exact(sock, length) if length else b""
            except (EOFError, OSError) as err:
                raise self._died(w) from err
            self._stash[(w, got)] = (status, payload)
        return self._stash.pop(key)

    def _expect(self, w: int, seq: int) -> Any:
        """The unpickled result of command ``seq``, or its error raised here."""
        status, payload = self._reply(w, seq)
        if status != pw.STATUS_OK:
            self._raise_remote(w, pickle.loads(payload))
        return pickle.loads(payload) if payload else None

    def _call_all(self, method: str, args: list[tuple]) -> list[Any]:
        """Calls ``method`` in every worker (``args[w]`` for worker ``w``); raises the
        error of the lowest sub-env index once every worker has answered."""
        seqs = [
            self._send(w, pw.OP_CALL, payload=pickle.dumps((method, a), protocol=5))
            for w, a in enumerate(args)
        ]
        results, errors = [], []
        for w, seq in enumerate(seqs):
            status, payload = self._reply(w, seq)
            if status == pw.STATUS_OK:
                results.append(pickle.loads(payload))
            else:
                errors.append((w, pickle.loads(payload)))
        if errors:
            self._raise_remote(*min(errors, key=lambda e: (e[1].env_index < 0, e[1].env_index)))
        return results

    def _died(self, w: int) -> WorkerError:
        worker = self._workers[w]
        worker.process.join(0.5)
        code = worker.process.exitcode
        reason = f"worker {w} (pid {worker.process.pid}, sub-envs {worker.envs.start}.."
        reason += f"{worker.envs.stop - 1}) "
        reason += "stopped answering" if code is None else f"exited with code {code}"
        self._closed_reason = reason
        self._finalizer()
        return WorkerError(
            f"{reason}; the vector env is closed. Create a new one (and check what ended "
            "the worker: a crash in a sub-env, or a kill from outside).",
            w,
            worker.envs,
        )

    def _raise_remote(self, w: int, remote: pw.RemoteError) -> None:
        """Raises a worker's error here, with the worker's traceback chained."""
        trace = RemoteTraceback(remote.traceback)
        original: BaseException | None = None
        if remote.exception is not None:
            try:
                original = pickle.loads(remote.exception)
            except Exception:
                original = None
        if original is not None:
            original.__cause__ = trace
        cause = original if original is not None else trace
        i = remote.env_index
        if remote.kind == "env":
            if remote.call == "factory":
                message = f"the factory of sub-env {i} raised in worker {w}: {remote.description}"
            else:
                message = f"sub-env {i} raised in {remote.call}(): {remote.description}"
            raise EnvError(message, i) from cause
        if original is not None:  # a jaxrunner check, or a failing call/get_attr
            raise original from trace
        worker = self._workers[w]
        raise WorkerError(
            f"worker {w} (sub-envs {worker.envs.start}..{worker.envs.stop - 1}) raised "
            f"{remote.description}",
            w,
            worker.envs,
        ) from trace

    # -- the backend contract -------------------------------------------------------------------

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, list[dict[str, Any]]]:
        self._check_open("reset")
        seeds = list(seeds)
        results = self._call_all(
            "reset", [(seeds[w.envs.start : w.envs.stop], options) for w in self._workers]
        )
        return self._views.obs, [info for infos in results for info in infos]

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._check_open("reset_at")
        if not 0 <= index < self.num_envs:
            raise EnvIndexError(f"reset_at(index={index}): index must be in [0, {self.num_envs}).")
        w = next(w.index for w in self._workers if index in w.envs)
        payload = pickle.dumps(("reset_at", (index, seed, options)), protocol=5)
        info = self._expect(w, self._send(w, pw.OP_CALL, payload=payload))
        return jr_spaces.take(self.single_observation_space, self._views.obs, index), info

    def step_batch(self, actions: Any, rows: slice | None = None) -> BatchStep:
        self.step_batch_async(actions, rows)
        return self.step_batch_wait(rows)

    def step_batch_async(self, actions: Any, rows: slice | None = None) -> None:
        """Validates ``actions``, writes them to shared memory and tells the workers of
        ``rows`` to step; returns without waiting (see :meth:`step_batch_wait`)."""
        self._check_open("step")
        lo, hi = (0, self.num_envs) if rows is None else (rows.start, rows.stop)
        size = hi - lo
        if size not in self._splitters:
            self._splitters[size] = jr_spaces.make_action_splitter(self.single_action_space, size)
        self._splitters[size](actions)  # validates before any sub-env steps
        for key in [k for k in self._calls if k[0] < hi and lo < k[1]]:
            # Still being stepped: its rows' actions must not change under the workers.
            for w, seq in self._calls[key]:
                self._stash[(w, seq)] = self._reply(w, seq)
        jr_spaces.copy_into(self.single_action_space, self._views.action, actions, slice(lo, hi))
        sent = []
        for worker in self._workers:
            start, stop = max(lo, worker.envs.start), min(hi, worker.envs.stop)
            if start < stop:
                sent.append((worker.index, self._send(worker.index, pw.OP_STEP, start, stop)))
        self._calls[(lo, hi)] = sent

    def step_batch_wait(self, rows: slice | None = None) -> BatchStep:
        """The result of the :meth:`step_batch_async` call with the same ``rows``."""
        self._check_open("step")
        lo, hi = (0, self.num_envs) if rows is None else (rows.start, rows.stop)
        try:
            sent = self._calls.pop((lo, hi))
        except KeyError:
            raise InvalidArgumentError(
                f"step_batch_wait(rows={rows}): no step_batch_async call for these rows is "
                "pending. Call step_batch_async(actions, rows) first, once per wait."
            ) from None
        v = self._views
        part = slice(lo, hi)
        replies = [(w, self._reply(w, seq)) for w, seq in sent]
        errors = [(w, pickle.loads(p)) for w, (status, p) in replies if status != pw.STATUS_OK]
        if errors:
            self._raise_remote(*min(errors, key=lambda e: (e[1].env_index < 0, e[1].env_index)))
        # The workers are done: the flags in shared memory are this step's.
        infos: list[dict[str, Any]] = [{} for _ in range(hi - lo)]
        ended = np.flatnonzero(v.terminated[part] | v.truncated[part])
        reset_infos: dict[int, dict[str, Any]] = {lo + int(j): {} for j in ended}
        for _, (_, payload) in replies:
            if payload:
                step_infos, resets = pickle.loads(payload)
                for i, info in step_infos.items():
                    infos[i - lo] = info
                reset_infos.update(resets)
        if rows is None:
            return BatchStep(
                v.obs, v.next_obs, v.reward, v.terminated, v.truncated, infos, reset_infos
            )
        space = self.single_observation_space
        return BatchStep(
            jr_spaces.rows(space, v.obs, part),
            jr_spaces.rows(space, v.next_obs, part),
            v.reward[part],
            v.terminated[part],
            v.truncated[part],
            infos,
            reset_infos,
        )

    def _obs_buffer(self) -> Any:
        return self._views.obs

    def _close_backend(self) -> None:
        self._finalizer()

    # -- the rest of gymnasium's VectorEnv API ---------------------------------------------------

    def render(self) -> tuple[Any, ...]:
        self._check_open("render")
        parts = self._call_all("render", [()] * len(self._workers))
        return tuple(x for part in parts for x in part)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` (or reads attribute ``name``) on every sub-env; the
        results must pickle."""
        self._check_open("call")
        parts = self._call_all("call", [(name, args, kwargs)] * len(self._workers))
        return tuple(x for part in parts for x in part)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        self._check_open("get_attr")
        parts = self._call_all("get_attr", [(name,)] * len(self._workers))
        return tuple(x for part in parts for x in part)

    def set_attr(self, name: str, values: Any) -> None:
        self._check_open("set_attr")
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise InvalidArgumentError(
                f"set_attr({name!r}, values): need one value per sub-env ({self.num_envs}), "
                f"got {len(values)}."
            )
        self._call_all(
            "set_attr", [(name, list(values[w.envs.start : w.envs.stop])) for w in self._workers]
        )

    @property
    def num_workers(self) -> int:
        return len(self._bounds)

    @property
    def worker_pids(self) -> list[int | None]:
        """The worker processes' ids (for monitoring; empty once closed)."""
        return [w.process.pid for w in self._res.workers]


__all__ = ["START_METHODS", "ProcessVectorEnv", "RemoteTraceback", "worker_bounds"]

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
import math
import multiprocessing
import os
import pickle
import select
import signal
import socket
import sys
import time
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
    InvalidArgumentError,
    InvalidArgumentTypeError,
    SpaceMismatchError,
    WorkerError,
    WorkerTimeoutError,
)
from jaxrunner.faults import RestartPolicy

EnvFactory = Callable[[], gymnasium.Env]
START_METHODS = ("forkserver", "spawn")
_WORKER_MODULE = "jaxrunner.envs.process_worker"
DEFAULT_STEP_TIMEOUT_S = 300.0
_LOST = -1  # a reply status of ours: the worker was replaced before it answered


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process, as text. Chained as
    the ``__cause__`` of that exception when it reaches the main process."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


def _unpickle(payload: bytes | None) -> BaseException | None:
    if payload is None:
        return None
    try:
        return pickle.loads(payload)
    except Exception:
        return None


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
    pid: int | None
    poller: Any  # select.poll: waits for a reply with a deadline
    inflight: dict[int, float] = dataclasses.field(default_factory=dict)
    """Commands sent and not yet answered: seq -> deadline (oldest first; the worker
    answers in order, so the first is the next reply's)."""


class _Lost(Exception):
    """Internal: worker ``w`` died or did not answer in time (it is dead now)."""

    def __init__(self, w: int, reason: str, timed_out: bool) -> None:
        super().__init__(reason)
        self.w, self.reason, self.timed_out = w, reason, timed_out


@dataclasses.dataclass
class _StepCall:
    """A ``step_batch_async`` call in flight."""

    sent: list[tuple[int, int, int, int]] = dataclasses.field(default_factory=list)
    """``(worker, seq, lo, hi)`` of each step command sent."""
    failed: dict[int, BaseException] = dataclasses.field(default_factory=dict)
    """Sub-envs given a failed slot without a step (their worker had been replaced)."""


@dataclasses.dataclass
class _Resources:
    """What the finalizer releases (it must not reference the vector env itself)."""

    workers: list[_Worker] = dataclasses.field(default_factory=list)
    fd: int | None = None
    memory: Any = None


def _kill(worker: _Worker) -> None:
    """Ends a worker now (SIGKILL: a hung one gets no say) and frees its resources."""
    process = worker.process
    with contextlib.suppress(ValueError):  # already closed
        if process.exitcode is None:
            process.kill()
        process.join(5.0)
        process.close()  # its sentinel fd: workers may be replaced many times
    worker.sock.close()


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
        with contextlib.suppress(ValueError):  # a worker _kill() already closed
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


def _check_timeout(value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgumentError(
            f"ProcessVectorEnv(step_timeout_s={value!r}): expected a number of seconds > 0, "
            "or None to wait for the workers forever."
        )
    return float(value)


class ProcessVectorEnv(VectorEnv):
    """Sub-envs in worker processes, stepped in parallel, data in shared memory.

    Step for step equal to :class:`~jaxrunner.SyncVectorEnv` (and so to
    ``gymnasium.vector.SyncVectorEnv`` with SAME_STEP autoreset) for the same seeds and
    actions, whatever the number of workers. Sub-envs receive actions in the action
    space's dtype.

    Faults: with a ``restart_policy`` (``EnvRunner(restart_failed_sub_envs=True)``
    sets one), a sub-env that raises or returns an invalid step is recreated inside
    its worker, exactly as the sync backend does. A worker that dies (a crash, a
    segfault, a kill) or does not answer within ``step_timeout_s`` is killed and
    replaced by a new one with new sub-envs (made by the factories and reset without
    a seed), retried as the policy says; every sub-env of the old worker then ends
    its episode as a fault: its slot in the step under way (or, if it was not being
    stepped, in its next step) is failed (``BatchStep.failed``, the error a
    :class:`~jaxrunner.errors.WorkerError` or
    :class:`~jaxrunner.errors.WorkerTimeoutError`). Nothing of a replaced worker is
    ever read again: it is killed before its replacement starts, which talks on a new
    socket. Without a policy, the worker's error is raised (promptly: a hang within
    ``step_timeout_s``) and the vector env closes.

    Accounting: a failed slot of a replaced worker may stand for a step the sub-env
    had completed before its worker died (``num_lost_steps``: its result died with
    the worker) or never started (``num_unrun_steps``); the rest are the failed
    ``env.step`` calls themselves.

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
        step_timeout_s: how long a worker may take to answer a command (a step of
            its sub-envs, restarts of failed ones included; a reset; a call),
            counted from when it was sent. ``None`` waits forever. The default, 300 s,
            only catches real hangs; lower it to what your envs need, since a hang
            costs this long. Building a worker's sub-envs (the factories) may take
            ``max(60 s, step_timeout_s)``.

    Raises:
        InvalidArgumentTypeError: a factory cannot be pickled.
        EnvError: a factory raised in its worker (the original is chained).
        SpaceMismatchError: sub-envs with different or unsupported spaces.
    """

    steps_in_background: ClassVar[bool] = True
    default_num_groups: ClassVar[int | None] = 2
    supports_restart: ClassVar[bool] = True
    _restart_policy: RestartPolicy | None = None

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        *,
        envs_per_worker: int | None = None,
        num_workers: int | None = None,
        copy: bool = True,
        start_method: str = "forkserver",
        step_timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S,
    ) -> None:
        super().__init__(copy=copy)
        self._res = _Resources()
        self._finalizer = weakref.finalize(self, _shutdown, self._res)
        if len(env_fns) == 0:
            raise InvalidArgumentError("ProcessVectorEnv needs at least one env factory, got none.")
        self.step_timeout_s = _check_timeout(step_timeout_s)
        self.num_envs = len(env_fns)
        self._bounds = worker_bounds(self.num_envs, envs_per_worker, num_workers)
        self._payloads = [pickle_factories(env_fns[lo:hi], lo) for lo, hi in self._bounds]
        self._ctx = _context(start_method)
        self._seq = 0
        self._stash: dict[tuple[int, int], tuple[int, bytes]] = {}
        self._calls: dict[tuple[int, int], _StepCall] = {}
        self._lost: dict[tuple[int, int], BaseException] = {}
        self._pending: dict[int, BaseException] = {}
        self._splitters: dict[int, Callable[[Any], list[Any]]] = {}
        self.num_restarts = 0
        """Sub-envs recreated inside their worker after a failure."""
        self.num_worker_restarts = 0
        """Workers replaced after they died or timed out."""
        self.num_lost_steps = 0
        """Completed ``env.step`` calls whose results died with their worker."""
        self.num_unrun_steps = 0
        """Failed slots of replaced workers' sub-envs that had not started their step."""
        try:
            self._start()
        except BaseException:
            self._closed_reason = "construction failed"
            self._finalizer()
            raise

    @property
    def restart_policy(self) -> RestartPolicy | None:  # type: ignore[override]
        """How failed sub-envs and workers are recreated (None: failures raise)."""
        return self._restart_policy

    @restart_policy.setter
    def restart_policy(self, policy: RestartPolicy | None) -> None:
        self._check_open("restart_policy")
        self._call_all("set_restart_policy", [(policy,)] * len(self._workers))
        self._restart_policy = policy

    # -- start-up -----------------------------------------------------------------------------

    def _spawn(self, w: int) -> _Worker:
        """Starts worker ``w`` (it builds its sub-envs, then reports as command 0)."""
        lo, hi = self._bounds[w]
        mine, theirs = socket.socketpair()
        process = self._ctx.Process(  # type: ignore[attr-defined]
            target=pw.worker_main,
            args=(pw.SocketHandle(theirs), lo, self._payloads[w]),
            name=f"jaxrunner-worker-{w}",
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
        start_s = math.inf if self.step_timeout_s is None else max(60.0, self.step_timeout_s)
        deadline = {0: time.monotonic() + start_s}  # command 0: the start report
        return _Worker(w, range(lo, hi), process, mine, process.pid, poller, deadline)

    def _start(self) -> None:
        for w in range(len(self._bounds)):
            self._res.workers.append(self._spawn(w))
        self._workers = self._res.workers
        try:
            reports = [self._expect(w.index, 0) for w in self._workers]
        except _Lost as lost:
            raise self._lost_error(lost, "the vector env could not start") from None
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
        self._layout_message = pickle.dumps(layout)
        try:
            seqs = [self._send_memory(w.index) for w in self._workers]
            for worker, seq in zip(self._workers, seqs):
                self._expect(worker.index, seq)
        except _Lost as lost:
            raise self._lost_error(lost, "the vector env could not start") from None

    def _send_memory(self, w: int) -> int:
        seq = self._send(w, pw.OP_MEMORY, payload=self._layout_message)
        try:
            socket.send_fds(self._workers[w].sock, [b"m"], [self._res.fd])  # type: ignore[list-item]
        except OSError as err:
            raise self._died(w) from err
        return seq

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
        """Sends a command; raises :class:`_Lost` if the worker is gone."""
        seq = self._next_seq()
        worker = self._workers[w]
        try:
            worker.sock.sendall(pw.COMMAND.pack(op, seq, lo, hi, len(payload)) + payload)
        except OSError as err:
            raise self._died(w) from err
        timeout = self.step_timeout_s
        worker.inflight[seq] = math.inf if timeout is None else time.monotonic() + timeout
        return seq

    def _read(self, w: int) -> tuple[int, int, bytes]:
        """Worker ``w``'s next reply ``(seq, status, payload)``, waiting no longer than
        the deadline of its oldest command; raises :class:`_Lost` (and the worker is
        dead) if it died or missed the deadline."""
        worker = self._workers[w]
        deadline = next(iter(worker.inflight.values()), math.inf)
        if deadline != math.inf:
            remaining_ms = max(0.0, deadline - time.monotonic()) * 1000
            if not worker.poller.poll(math.ceil(remaining_ms)):
                reason = (
                    f"{self._describe(w)} did not answer within step_timeout_s="
                    f"{self.step_timeout_s} s (a sub-env hangs, or the machine is overloaded)"
                )
                _kill(worker)
                raise _Lost(w, reason, timed_out=True)
        try:
            got, status, length = pw.REPLY.unpack(pw.recv_exact(worker.sock, pw.REPLY.size))
            payload = pw.recv_exact(worker.sock, length) if length else b""
        except (EOFError, OSError) as err:
            raise self._died(w) from err
        worker.inflight.pop(got, None)
        return got, status, payload

    def _died(self, w: int) -> _Lost:
        """The :class:`_Lost` for a worker whose socket broke (after making sure it is
        dead)."""
        worker = self._workers[w]
        description = self._describe(w)
        code = None
        with contextlib.suppress(ValueError):
            worker.process.join(0.5)
            code = worker.process.exitcode
        if code is None:
            what = "stopped answering (its socket broke)"
        elif code < 0:
            what = f"was killed by signal {signal.Signals(-code).name}"
        else:
            what = f"exited with code {code}"
        _kill(worker)
        return _Lost(w, f"{description} {what}", timed_out=False)

    def _describe(self, w: int) -> str:
        worker = self._workers[w]
        return (
            f"worker {w} (pid {worker.pid}, sub-envs {worker.envs.start}..{worker.envs.stop - 1})"
        )

    def _lost_error(self, lost: _Lost, consequence: str) -> WorkerError | WorkerTimeoutError:
        cls = WorkerTimeoutError if lost.timed_out else WorkerError
        return cls(f"{lost.reason}; {consequence}", lost.w, self._workers[lost.w].envs)

    def _expect(self, w: int, seq: int) -> Any:
        """The unpickled result of command ``seq`` (no stash: start-up only), or its
        error raised here; raises :class:`_Lost`."""
        while True:
            got, status, payload = self._read(w)
            if got == seq:
                break
        if status != pw.STATUS_OK:
            self._raise_remote(w, pickle.loads(payload))
        return pickle.loads(payload) if payload else None

    def _reply(self, w: int, seq: int) -> tuple[int, bytes]:
        """Worker ``w``'s reply to command ``seq`` (replies to earlier commands that
        arrive first are kept for whoever waits for them). ``(_LOST, b"")`` if the
        worker was replaced before it answered (``self._lost`` says why)."""
        key = (w, seq)
        while key not in self._stash:
            if key in self._lost:
                return _LOST, b""
            try:
                got, status, payload = self._read(w)
            except _Lost as lost:
                self._worker_lost(lost)
                continue
            self._stash[(w, got)] = (status, payload)
        return self._stash.pop(key)

    def _worker_lost(self, lost: _Lost, fatal: bool = False) -> BaseException:
        """Handles a dead worker: replaces it (restart policy set and not ``fatal``)
        and returns the error its sub-envs failed with; else closes the vector env and
        raises that error."""
        if self._restart_policy is None or fatal:
            hint = (
                ""
                if fatal
                else ", or let EnvRunner(restart_failed_sub_envs=True) replace failed workers"
            )
            error = self._lost_error(
                lost,
                "the vector env is closed. Create a new one (and check what ended the "
                f"worker: a crash or hang in a sub-env, or a kill from outside){hint}.",
            )
            self._closed_reason = lost.reason
            self._finalizer()
            raise error from lost.__cause__
        error = self._lost_error(lost, "it was replaced by a new worker with new sub-envs")
        self._recover(lost.w, error)
        return error

    def _recover(self, w: int, error: BaseException) -> None:
        """Replaces dead worker ``w``: its commands in flight are lost (their step
        slots fail now), its other sub-envs fail at their next step."""
        worker = self._workers[w]
        self.num_worker_restarts += 1
        status = self._views.status
        stepping: list[int] = []
        for call in self._calls.values():
            for ww, seq, lo, hi in call.sent:
                if ww == w and seq in worker.inflight:
                    marks = status[lo:hi]
                    self.num_lost_steps += int(np.count_nonzero(marks == pw.DONE))
                    self.num_unrun_steps += int(np.count_nonzero(marks == pw.NOT_RUN))
                    stepping.extend(range(lo, hi))
        for seq in worker.inflight:
            self._lost[(w, seq)] = error
        worker.inflight.clear()
        for i in set(worker.envs) - set(stepping):
            self._pending[i] = error
        self._respawn(w, error)
        for i in stepping:
            self._fail_slot(i)

    def _respawn(self, w: int, cause: BaseException) -> None:
        """Starts a new worker ``w`` with new, reset sub-envs, as the restart policy
        says (attempts, backoff); closes the vector env and raises if none succeeds."""
        policy = self._restart_policy
        assert policy is not None  # internal: only with a policy
        last: BaseException | None = None
        for wait in policy.waits():
            time.sleep(wait)
            try:
                self._workers[w] = self._spawn(w)
                report = self._expect(w, 0)
                spaces = (self.single_observation_space, self.single_action_space)
                for pair in report["spaces"]:
                    if pair != spaces:
                        raise SpaceMismatchError(
                            f"a restarted sub-env of worker {w} has spaces {pair}, the vector "
                            f"env {spaces}; every sub-env must have equal spaces."
                        )
                self._expect(w, self._send_memory(w))
                payload = pickle.dumps(("set_restart_policy", (policy,)), protocol=5)
                self._expect(w, self._send(w, pw.OP_CALL, payload=payload))
                seeds = [None] * len(self._workers[w].envs)
                payload = pickle.dumps(("reset", (seeds, None)), protocol=5)
                self._expect(w, self._send(w, pw.OP_CALL, payload=payload))
                return
            except _Lost as lost:
                last = self._lost_error(lost, "while it was being restarted")
            except Exception as err:
                last = err
                _kill(self._workers[w])
        lo, hi = self._bounds[w]
        reason = (
            f"worker {w} (sub-envs {lo}..{hi - 1}) failed ({cause}) and could not be "
            f"restarted: {policy.max_attempts} attempts in a row failed, the last with {last!r}"
        )
        self._closed_reason = reason
        self._finalizer()
        error = WorkerError(
            f"{reason}. The vector env is closed. Fix the env factory, or raise "
            "RestartPolicy(max_attempts=...) / backoff_s.",
            w,
            range(lo, hi),
        )
        error.recreation_error = last  # type: ignore[attr-defined]
        raise error from cause

    def _fail_slot(self, i: int) -> None:
        """Sub-env ``i``'s slot of the step under way holds no transition: reward 0, no
        flags, next_obs = obs (its new env's reset observation)."""
        v, space = self._views, self.single_observation_space
        v.reward[i], v.terminated[i], v.truncated[i] = 0.0, False, False
        jr_spaces.copy_into(space, v.next_obs, jr_spaces.take(space, v.obs, i), i)

    def _send_call(self, w: int, method: str, args: tuple) -> int:
        payload = pickle.dumps((method, args), protocol=5)
        try:
            return self._send(w, pw.OP_CALL, payload=payload)
        except _Lost as lost:
            self._worker_lost(lost)  # replaced (or raised): ask the new worker
        try:
            return self._send(w, pw.OP_CALL, payload=payload)
        except _Lost as lost:
            raise self._worker_lost(lost, fatal=True) from None

    def _call(self, w: int, method: str, args: tuple, seq: int | None = None) -> tuple[int, bytes]:
        """Worker ``w``'s reply to ``method(*args)`` (sent as ``seq`` if given); asks a
        replaced worker's successor once more."""
        if seq is None:
            seq = self._send_call(w, method, args)
        status, payload = self._reply(w, seq)
        if status != _LOST:
            return status, payload
        self._lost.pop((w, seq))
        seq = self._send_call(w, method, args)
        status, payload = self._reply(w, seq)
        if status == _LOST:
            error = self._lost.pop((w, seq))
            self._closed_reason = f"{error}"
            self._finalizer()
            raise error
        return status, payload

    def _call_all(self, method: str, args: list[tuple]) -> list[Any]:
        """Calls ``method`` in every worker (``args[w]`` for worker ``w``); raises the
        error of the lowest sub-env index once every worker has answered."""
        seqs = [self._send_call(w, method, a) for w, a in enumerate(args)]
        results, errors = [], []
        for w, seq in enumerate(seqs):
            status, payload = self._call(w, method, args[w], seq)
            if status == pw.STATUS_OK:
                results.append(pickle.loads(payload))
            else:
                errors.append((w, pickle.loads(payload)))
        if errors:
            self._raise_remote(*min(errors, key=lambda e: (e[1].env_index < 0, e[1].env_index)))
        return results

    def _raise_remote(self, w: int, remote: pw.RemoteError) -> None:
        """Raises a worker's error here, with the worker's traceback chained."""
        raise self._remote_exception(w, remote)

    def _remote_exception(self, w: int, remote: pw.RemoteError) -> BaseException:
        """A worker's error as an exception of this process (the worker's traceback
        chained; ``__cause__`` of the result is set)."""
        trace = RemoteTraceback(remote.traceback)
        original = _unpickle(remote.exception)
        if original is not None:
            original.__cause__ = trace
        cause = original if original is not None else trace
        i = remote.env_index
        error: BaseException
        if remote.kind == "recreate":
            error = EnvError(remote.description, i)
            error.recreation_error = _unpickle(remote.recreation)  # type: ignore[attr-defined]
        elif remote.kind == "env":
            if remote.call == "factory":
                message = f"the factory of sub-env {i} raised in worker {w}: {remote.description}"
            else:
                message = f"sub-env {i} raised in {remote.call}(): {remote.description}"
            error = EnvError(message, i)
        elif original is not None:  # a jaxrunner check, or a failing call/get_attr
            error, cause = original, trace
        else:
            worker = self._workers[w]
            error = WorkerError(
                f"worker {w} (sub-envs {worker.envs.start}..{worker.envs.stop - 1}) raised "
                f"{remote.description}",
                w,
                worker.envs,
            )
            cause = trace
        error.__cause__ = cause
        return error

    # -- the backend contract -------------------------------------------------------------------

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, list[dict[str, Any]]]:
        self._check_open("reset")
        seeds = list(seeds)
        results = self._call_all(
            "reset", [(seeds[w.envs.start : w.envs.stop], options) for w in self._workers]
        )
        self._pending.clear()  # every sub-env starts afresh from what the caller gets
        return self._views.obs, [info for infos in results for info in infos]

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._check_open("reset_at")
        self._check_index(index, "reset_at")
        w = next(w.index for w in self._workers if index in w.envs)
        status, payload = self._call(w, "reset_at", (index, seed, options))
        if status != pw.STATUS_OK:
            self._raise_remote(w, pickle.loads(payload))
        self._pending.pop(index, None)
        return jr_spaces.take(self.single_observation_space, self._views.obs, index), (
            pickle.loads(payload)
        )

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
            for w, seq, _, _ in self._calls[key].sent:
                status, payload = self._reply(w, seq)
                if key == (lo, hi):  # the same rows again: this step supersedes that one
                    self._lost.pop((w, seq), None)
                elif status != _LOST:
                    self._stash[(w, seq)] = (status, payload)
        jr_spaces.copy_into(self.single_action_space, self._views.action, actions, slice(lo, hi))
        call = self._calls[(lo, hi)] = _StepCall()  # registered first: a recovery sees it
        for worker in list(self._workers):
            start, stop = max(lo, worker.envs.start), min(hi, worker.envs.stop)
            if start < stop:
                self._send_step(worker.index, start, stop, call)

    def _send_step(self, w: int, lo: int, hi: int, call: _StepCall) -> None:
        """Tells worker ``w`` to step ``[lo, hi)``, except sub-envs of a replaced
        worker that were not stepping then: their slot fails now, unstepped."""
        status = self._views.status
        while lo < hi:
            start, stop = lo, hi
            if self._pending:
                while start < hi and start in self._pending:
                    call.failed[start] = self._pending.pop(start)
                    self._fail_slot(start)
                    self.num_unrun_steps += 1
                    start += 1
                stop = start
                while stop < hi and stop not in self._pending:
                    stop += 1
                if start == stop:
                    return
            status[start:stop] = pw.NOT_RUN
            try:
                seq = self._send(w, pw.OP_STEP, start, stop)
            except _Lost as lost:
                self._worker_lost(lost)  # raises, or replaces it: its envs are pending now
                lo = start
                continue
            call.sent.append((w, seq, start, stop))
            lo = stop

    def step_batch_wait(self, rows: slice | None = None) -> BatchStep:
        """The result of the :meth:`step_batch_async` call with the same ``rows``."""
        self._check_open("step")
        lo, hi = (0, self.num_envs) if rows is None else (rows.start, rows.stop)
        try:
            call = self._calls[(lo, hi)]  # kept until answered: a recovery must see it
        except KeyError:
            raise InvalidArgumentError(
                f"step_batch_wait(rows={rows}): no step_batch_async call for these rows is "
                "pending. Call step_batch_async(actions, rows) first, once per wait."
            ) from None
        v = self._views
        part = slice(lo, hi)
        errors: dict[int, BaseException] = call.failed
        failed = list(errors)
        replies = []
        try:
            for w, seq, start, stop in call.sent:
                status, payload = self._reply(w, seq)
                if status == _LOST:  # its worker was replaced: the slots were failed then
                    error = self._lost.pop((w, seq))
                    errors.update(dict.fromkeys(range(start, stop), error))
                    failed.extend(range(start, stop))
                else:
                    replies.append((w, status, payload))
        finally:
            self._calls.pop((lo, hi), None)
        remote_errors = [(w, pickle.loads(p)) for w, status, p in replies if status != pw.STATUS_OK]
        if remote_errors:
            self._raise_remote(
                *min(remote_errors, key=lambda e: (e[1].env_index < 0, e[1].env_index))
            )
        # The workers are done: the flags in shared memory are this step's.
        infos: list[dict[str, Any]] = [{} for _ in range(hi - lo)]
        ended = np.flatnonzero(v.terminated[part] | v.truncated[part])
        reset_infos: dict[int, dict[str, Any]] = {lo + int(j): {} for j in ended}
        for w, _, payload in replies:
            if payload:
                parts = pickle.loads(payload)
                for i, info in parts[0].items():
                    infos[i - lo] = info
                reset_infos.update(parts[1])
                if len(parts) > 2:  # sub-envs restarted in the worker
                    failed.extend(parts[2])
                    for i, remote in parts[3].items():
                        errors[i] = self._remote_exception(w, remote).__cause__  # type: ignore[assignment]
                    self.num_restarts += len(parts[3])
        failed_mask = None
        if failed:
            failed_mask = np.zeros(self.num_envs, np.bool_)
            failed_mask[failed] = True
        if rows is None:
            return BatchStep(
                v.obs,
                v.next_obs,
                v.reward,
                v.terminated,
                v.truncated,
                infos,
                reset_infos,
                failed_mask,
                errors or None,
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
            None if failed_mask is None else failed_mask[part],
            errors or None,
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
        values = self._values_per_env(name, values)
        self._call_all(
            "set_attr", [(name, list(values[w.envs.start : w.envs.stop])) for w in self._workers]
        )

    @property
    def num_workers(self) -> int:
        return len(self._bounds)

    @property
    def worker_pids(self) -> list[int | None]:
        """The worker processes' ids (for monitoring; empty once closed)."""
        return [w.pid for w in self._res.workers]


__all__ = ["START_METHODS", "ProcessVectorEnv", "RemoteTraceback", "worker_bounds"]

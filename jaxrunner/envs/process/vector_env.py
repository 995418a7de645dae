"""``ProcessVectorEnv``: the :class:`~jaxrunner.envs.base.VectorEnv` contract on top
of the worker pool (:mod:`.pool`, :mod:`.recovery`)."""

from __future__ import annotations

import pickle
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import gymnasium
import numpy as np
from gymnasium.vector.utils import batch_space

from jaxrunner import spaces as jr_spaces
from jaxrunner.envs.base import BatchStep, VectorEnv
from jaxrunner.envs.process import wire
from jaxrunner.envs.process.handle import Resources, WorkerLost, shutdown
from jaxrunner.envs.process.launch import (
    DEFAULT_STEP_TIMEOUT_S,
    EnvFactory,
    check_step_timeout,
    multiprocessing_context,
    pickle_factories,
    worker_bounds,
)
from jaxrunner.envs.process.pool import LOST, StepCall
from jaxrunner.envs.process.recovery import WorkerRecovery
from jaxrunner.envs.process.shared import NOT_RUN, Layout, create_shared_block
from jaxrunner.errors import InvalidArgumentError, SpaceMismatchError
from jaxrunner.faults import RestartPolicy


class ProcessVectorEnv(WorkerRecovery):
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
        self._res = Resources()
        self._finalizer = weakref.finalize(self, shutdown, self._res)
        if len(env_fns) == 0:
            raise InvalidArgumentError("ProcessVectorEnv needs at least one env factory, got none.")
        self.step_timeout_s = check_step_timeout(step_timeout_s)
        self.num_envs = len(env_fns)
        self._bounds = worker_bounds(self.num_envs, envs_per_worker, num_workers)
        self._payloads = [pickle_factories(env_fns[lo:hi], lo) for lo, hi in self._bounds]
        self._ctx = multiprocessing_context(start_method)
        self._seq = 0
        self._stash = {}
        self._calls = {}
        self._lost = {}
        self._pending = {}
        self._splitters: dict[int, Callable[[Any], list[Any]]] = {}
        self.num_restarts = 0
        """Sub-envs recreated inside their worker after a failure."""
        self.num_worker_restarts = 0
        self.num_lost_steps = 0
        self.num_unrun_steps = 0
        try:
            self._start()
        except BaseException:
            self._close_after("construction failed")
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

    def _start(self) -> None:
        """Starts the workers, checks their sub-envs' spaces and hands them the shared
        block."""
        for w in range(len(self._bounds)):
            self._res.workers.append(self._spawn(w))
        self._workers = self._res.workers
        try:
            reports = [self._expect(w.index, wire.START_REPORT_SEQ) for w in self._workers]
        except WorkerLost as lost:
            raise lost.error("the vector env could not start") from None
        env_spaces = [pair for report in reports for pair in report["spaces"]]
        self._check_spaces(env_spaces)
        first = reports[0]
        autoreset = VectorEnv.metadata["autoreset_mode"]
        self.metadata = {**first["metadata"], "autoreset_mode": autoreset}
        self.render_mode = first["render_mode"]
        self.spec = None
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        layout = Layout(self.single_observation_space, self.single_action_space, self.num_envs)
        self._res.fd, self._res.memory = create_shared_block(layout.nbytes)
        self._views = layout.views(self._res.memory)
        self._layout_message = pickle.dumps(layout)
        try:
            seqs = [self._send_memory(w.index) for w in self._workers]
            for worker, seq in zip(self._workers, seqs):
                self._expect(worker.index, seq)
        except WorkerLost as lost:
            raise lost.error("the vector env could not start") from None

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
        if status != wire.STATUS_OK:
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
                elif status != LOST:
                    self._stash[(w, seq)] = (status, payload)
        jr_spaces.copy_into(self.single_action_space, self._views.action, actions, slice(lo, hi))
        call = self._calls[(lo, hi)] = StepCall()  # registered first: a recovery sees it
        for worker in list(self._workers):
            start, stop = max(lo, worker.envs.start), min(hi, worker.envs.stop)
            if start < stop:
                self._send_step(worker.index, start, stop, call)

    def _send_step(self, w: int, lo: int, hi: int, call: StepCall) -> None:
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
            status[start:stop] = NOT_RUN
            try:
                seq = self._send(w, wire.OP_STEP, start, stop)
            except WorkerLost as lost:
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
                if status == LOST:  # its worker was replaced: the slots were failed then
                    error = self._lost.pop((w, seq))
                    errors.update(dict.fromkeys(range(start, stop), error))
                    failed.extend(range(start, stop))
                else:
                    replies.append((w, status, payload))
        finally:
            self._calls.pop((lo, hi), None)
        remote_errors = [(w, pickle.loads(p)) for w, s, p in replies if s != wire.STATUS_OK]
        if remote_errors:
            self._raise_remote(*wire.first_error(remote_errors))
        infos, reset_infos = self._step_infos(lo, hi, replies, failed, errors)
        failed_mask = None
        if failed:
            failed_mask = np.zeros(self.num_envs, np.bool_)
            failed_mask[failed] = True
        if rows is None:  # the buffers themselves
            obs, next_obs, part = v.obs, v.next_obs, slice(None)
        else:
            space = self.single_observation_space
            obs = jr_spaces.rows(space, v.obs, part)
            next_obs = jr_spaces.rows(space, v.next_obs, part)
        return BatchStep(
            obs,
            next_obs,
            v.reward[part],
            v.terminated[part],
            v.truncated[part],
            infos,
            reset_infos,
            None if failed_mask is None else failed_mask[part],
            errors or None,
        )

    def _step_infos(
        self,
        lo: int,
        hi: int,
        replies: list[tuple[int, int, bytes]],
        failed: list[int],
        errors: dict[int, BaseException],
    ) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
        """The step and reset infos of sub-envs ``[lo, hi)`` from the workers' replies;
        adds the sub-envs the workers restarted to ``failed`` and ``errors``."""
        v = self._views
        # The workers are done: the flags in shared memory are this step's.
        infos: list[dict[str, Any]] = [{} for _ in range(hi - lo)]
        ended = np.flatnonzero(v.terminated[lo:hi] | v.truncated[lo:hi])
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
        return infos, reset_infos

    def _obs_buffer(self) -> Any:
        return self._views.obs

    def _close_backend(self) -> None:
        self._finalizer()

    # -- the rest of gymnasium's VectorEnv API ---------------------------------------------------

    def render(self) -> tuple[Any, ...]:
        self._check_open("render")
        return self._call_each_env("render")

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` (or reads attribute ``name``) on every sub-env; the
        results must pickle."""
        self._check_open("call")
        return self._call_each_env("call", (name, args, kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        self._check_open("get_attr")
        return self._call_each_env("get_attr", (name,))

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

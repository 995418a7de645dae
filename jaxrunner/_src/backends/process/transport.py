"""The process transport: worker processes, the shared block, recovery and stepping, for any
kind of sub-env (:class:`~.shared.BlockLayout`), under the one process backend
(:class:`~.vector_env.ProcessBackend`)."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

import jaxrunner._src.backends.process.protocol as protocol
from jaxrunner._src.backends.process.config import ProcessConfig, spin_wait_s
from jaxrunner._src.backends.process.handle import Resources, WorkerLost
from jaxrunner._src.backends.process.launch import multiprocessing_context, pickle_factories
from jaxrunner._src.backends.process.pool import WorkerPool
from jaxrunner._src.backends.process.recovery import WorkerRecovery
from jaxrunner._src.backends.process.shared import BlockLayout, create_shared_block
from jaxrunner._src.backends.process.stepping import Stepper
from jaxrunner._src.backends.restarts import RestartPolicy

Report = dict[str, Any]
"""A worker's start report (:func:`~.worker.describe`)."""


class ProcessTransport:
    """Starts the workers, checks what they report, hands them the shared block, and
    steps them.

    Args:
        env_fns: the sub-envs' factories.
        bounds: each worker's ``[lo, hi)`` sub-envs.
        config: the vector env's :class:`~jaxrunner.ProcessConfig`.
        restart_policy: None: failures raise (and close the vector env).
        res: what the vector env's finalizer releases.
        close_after: closes the vector env after a failure it cannot go on from.
        layout_for: ``(reports) -> layout``: checks the workers' start reports (all
            sub-envs alike) and returns the shared block's layout.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        bounds: list[tuple[int, int]],
        config: ProcessConfig,
        restart_policy: RestartPolicy | None,
        res: Resources,
        close_after: Callable[[str], None],
        layout_for: Callable[[list[Report]], BlockLayout],
    ) -> None:
        payloads = [pickle_factories(env_fns[lo:hi], lo) for lo, hi in bounds]
        ctx = multiprocessing_context(config.start_method)
        spin_s = spin_wait_s(config, len(bounds))
        self.pool = WorkerPool(ctx, bounds, payloads, config.step_timeout_s, res, spin_s)
        self.pool.close_after = close_after
        self.reports = self._start_workers()
        self.layout = layout_for(self.reports)
        res.fd, res.memory = create_shared_block(self.layout.nbytes)
        self.views = self.layout.views(res.memory)
        self._send_memory(restart_policy)
        self.recovery = WorkerRecovery(
            self.pool,
            restart_policy,
            self.layout,
            self.views,
            lambda: self.stepper.in_flight(),
        )
        self.pool.on_lost = self.recovery.worker_lost
        self.stepper = Stepper(
            self.pool, self.recovery, self.layout, self.views, config.ready_first
        )

    def _start_workers(self) -> list[Report]:
        pool = self.pool
        for w in range(len(pool.bounds)):
            pool.workers.append(pool.spawn(w))
        try:
            return [pool.expect(w, protocol.START_REPORT_SEQ) for w in range(len(pool.bounds))]
        except WorkerLost as lost:
            raise lost.error("the vector env could not start") from None

    def _send_memory(self, restart_policy: RestartPolicy | None) -> None:
        pool = self.pool
        pool.memory_message = pickle.dumps((self.layout, restart_policy, pool.spin_s))
        try:
            seqs = [pool.send_memory(w) for w in range(len(pool.bounds))]
            for w, seq in enumerate(seqs):
                pool.expect(w, seq)
        except WorkerLost as lost:
            raise lost.error("the vector env could not start") from None

    @property
    def bounds(self) -> list[tuple[int, int]]:
        return self.pool.bounds

    def reset(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> list[dict]:
        """Resets every sub-env (the results of sends not yet received are dropped);
        their reset infos, in env order."""
        self.stepper.discard()
        seeds = list(seeds)
        results = self.pool.call_all("reset", [(seeds[lo:hi], options) for lo, hi in self.bounds])
        self.recovery.pending.clear()  # every sub-env starts afresh from what the caller gets
        self.stepper.num_restarts += sum(restarted for _, restarted in results)
        return [info for infos, _ in results for info in infos]

    def reset_at(self, index: int, seed: int | None, options: dict[str, Any] | None) -> dict:
        """Resets sub-env ``index`` alone; its reset info."""
        w = self.pool.worker_of(index)
        status, payload = self.pool.call(w, "reset_at", (index, seed, options))
        if status != protocol.STATUS_OK:
            self.pool.raise_remote(w, pickle.loads(payload))
        self.recovery.pending.pop(index, None)
        return pickle.loads(payload)

    def step_all(self, actions: Any, rows: slice | None, ready_first: bool) -> Any:
        """One step of ``rows`` (None: every env), sent and received at once."""
        stepper = self.stepper
        if stepper.calls and not ready_first:  # the oldest send answers first
            stepper.send(actions, rows, per_worker=False)
            return stepper.recv()
        (call,) = stepper.send(actions, rows, per_worker=False)
        return stepper.finish(call)

    def set_attr(self, name: str, values: list[Any]) -> None:
        self.pool.call_all("set_attr", [(name, list(values[lo:hi])) for lo, hi in self.bounds])

    def on_sub_env(self, index: int, method: str, args: tuple) -> Any:
        """A sub-env handle's request, run on sub-env ``index`` alone in its worker (the
        current one: a replaced worker's successor); its result."""
        w = self.pool.worker_of(index)
        status, payload = self.pool.call(w, "on_sub_env", (index, method, args))
        if status != protocol.STATUS_OK:
            self.pool.raise_remote(w, pickle.loads(payload))
        return pickle.loads(payload)

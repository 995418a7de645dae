"""The process transport: worker processes, the shared block, recovery and stepping, for any
kind of sub-env (:class:`~.shared.BlockLayout`)."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

import jaxrunner._src.backends.process.protocol as protocol
from jaxrunner._src.backends.allocators import create_shared_block
from jaxrunner._src.backends.process.config import (
    ProcessConfig,
    main_process_share,
    spin_wait_s,
)
from jaxrunner._src.backends.process.handle import Resources, WorkerLost, shutdown
from jaxrunner._src.backends.process.launch import (
    default_num_workers,
    multiprocessing_context,
    pickle_factories,
    worker_bounds,
)
from jaxrunner._src.backends.process.pool import WorkerPool
from jaxrunner._src.backends.process.recovery import WorkerRecovery
from jaxrunner._src.backends.process.shared import BlockLayout
from jaxrunner._src.backends.process.stepping import Stepper
from jaxrunner._src.backends.restarts import RestartPolicy

Report = dict[str, Any]  # a worker's start report (worker.describe)


class ProcessTransport:
    """Starts the workers (:attr:`reports`: what their sub-envs are); :meth:`attach` then
    hands them the shared block of the vector env's layout. A failure to start shuts down
    what started. ``multi_agent``: the sub-envs' kind, which sets the default number of
    workers; None: unknown, so worker 0 first builds sub-env 0 alone and reports it."""

    def __init__(
        self, env_fns: Sequence[Callable[[], Any]], config: ProcessConfig, multi_agent: bool | None
    ) -> None:
        self.config, self.res = config, Resources()
        self.main_process_envs = 0  # the first sub-envs, which worker 0 steps in this process
        try:
            self.reports = self._start_workers(env_fns, multi_agent)
        except BaseException:
            shutdown(self.res)
            raise
        self.multi_agent: bool = "agents" in self.reports[0]

    def _start_workers(
        self, env_fns: Sequence[Callable[[], Any]], multi_agent: bool | None
    ) -> list[Report]:
        config, workers, num_envs = self.config, self.res.workers, len(env_fns)
        ctx = multiprocessing_context(config.start_method)
        # The main process's share is worker 0 (it reports the kind, building its sub-envs).
        share = self.main_process_envs = main_process_share(num_envs, config)
        try:
            first = None
            bounds_by_kind = {kind: self._bounds(num_envs, kind) for kind in (False, True)}
            if multi_agent is None and bounds_by_kind[False] != bounds_by_kind[True]:
                # The kind sets the workers: worker 0 first builds sub-env 0 alone to report it.
                payload = pickle_factories(env_fns[:1], 0)
                early = WorkerPool(ctx, [(0, 1)], [payload], config.step_timeout_s, self.res)
                workers.append(early.spawn(0))
                first = early.expect(0, protocol.START_REPORT_SEQ)
                multi_agent = "agents" in first
            bounds = bounds_by_kind[bool(multi_agent)]
            payloads = [  # the main process's share is not pickled: its factories run here
                b"" if share and w == 0 else pickle_factories(env_fns[lo:hi], lo)
                for w, (lo, hi) in enumerate(bounds)
            ]
            spin_s = spin_wait_s(config, len(bounds) - bool(share))
            pool = self.pool = WorkerPool(
                ctx, bounds, payloads, config.step_timeout_s, self.res, spin_s,
                env_fns[:share] if share else None,
            )  # fmt: skip
            for w in range(len(workers), len(bounds)):
                workers.append(pool.spawn(w))
            reports = [] if first is None else [first]
            if first is not None and bounds[0] != (0, 1):  # worker 0 builds the rest of its share
                reports.append(pool.grow(0))
            later = range(0 if first is None else 1, len(bounds))
            return reports + [pool.expect(w, protocol.START_REPORT_SEQ) for w in later]
        except WorkerLost as lost:
            raise lost.error("the vector env could not start") from None

    def _bounds(self, num_envs: int, multi_agent: bool) -> list[tuple[int, int]]:
        """Each worker's ``[lo, hi)`` sub-envs (the main process's share first, if any)."""
        num_workers, per_worker = self.config.num_workers, self.config.envs_per_worker
        share = self.main_process_envs
        if num_workers is None and per_worker is None:
            # Lockstep multi-agent: the main process waits while the workers step; with a
            # share of its own it steps too.
            main = "steps" if share else "waits" if multi_agent else "computes"
            num_workers = default_num_workers(num_envs - share, main_process=main)
        bounds = worker_bounds(num_envs - share, per_worker, num_workers)
        bounds = [(lo + share, hi + share) for lo, hi in bounds]
        return [(0, share), *bounds] if share else bounds

    def attach(
        self,
        layout: BlockLayout,
        restart_policy: RestartPolicy | None,
        close_after: Callable[[str], None],
        name: str,
    ) -> None:
        """Hands the workers the shared block of ``layout`` and makes the stepping parts;
        ``close_after`` closes the vector env after a failure it cannot go on from."""
        pool, res = self.pool, self.res
        pool.close_after = close_after
        res.fd, res.memory = create_shared_block(layout.nbytes)
        self.views = layout.views(res.memory)
        pool.memory_message = pickle.dumps((layout, restart_policy, pool.spin_s))
        try:
            seqs = [pool.send_memory(w) for w in range(len(pool.bounds))]
            for w, seq in enumerate(seqs):
                pool.expect(w, seq)
        except WorkerLost as lost:
            raise lost.error("the vector env could not start") from None
        self.recovery = WorkerRecovery(
            pool, restart_policy, layout, self.views, lambda: self.stepper.in_flight()
        )
        pool.lost_worker = self.recovery.worker_lost
        self.stepper = Stepper(
            pool, self.recovery, layout, self.views, self.config.ready_first, name
        )

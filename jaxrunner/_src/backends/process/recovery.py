"""What a dead or hung worker means for the vector env: without a restart policy, the env
closes and raises; with one, a new worker with new sub-envs, the old ones' episodes ended
as faults, their slots counted as ``num_lost_steps`` or ``num_unrun_steps``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

import jaxrunner._src.backends.process.protocol as protocol
from jaxrunner._src.backends.process.handle import WorkerLost
from jaxrunner._src.backends.process.pool import WorkerPool
from jaxrunner._src.backends.process.shared import BlockLayout
from jaxrunner._src.backends.restarts import RestartPolicy, retry
from jaxrunner._src.backends.sub_env_block import DONE, NOT_RUN
from jaxrunner.errors import WorkerError

Sent = tuple[int, int, int, int]  # a step command in flight: (worker, seq, lo, hi)


class WorkerRecovery:
    """Replaces the pool's lost workers as the restart policy says (None: a lost worker
    closes the vector env and raises), and fails the slots of their sub-envs.
    ``in_flight``: the stepper's step commands sent and not yet answered."""

    def __init__(
        self,
        pool: WorkerPool,
        restart_policy: RestartPolicy | None,
        layout: BlockLayout,
        views: Any,
        in_flight: Callable[[], Iterable[Sent]],
    ) -> None:
        self.pool, self.restart_policy, self.layout = pool, restart_policy, layout
        self.views, self.in_flight = views, in_flight
        self.pending: dict[int, BaseException] = {}
        """Sub-envs of replaced workers that were not being stepped: their next step slot
        fails (with this error) instead of stepping."""
        self.num_worker_restarts = 0  # these: ProcessBackend's properties
        self.num_restarts = 0  # in a new worker's first reset (ProcessBackend.num_restarts)
        self.num_lost_steps = 0
        self.num_unrun_steps = 0

    def worker_lost(self, lost: WorkerLost, fatal: bool = False) -> BaseException:
        """Handles a dead worker: replaces it (restart policy set and not ``fatal``) and
        returns the error its sub-envs failed with: its commands in flight are lost (their
        step slots fail now), its other sub-envs fail at their next step. Else closes the
        vector env and raises that error."""
        if self.restart_policy is None or fatal:
            hint = (
                ""
                if fatal
                else ", or build the envs with restart_policy=jaxrunner.RestartPolicy() "
                "(make_vec) to replace failed workers"
            )
            error = lost.error(
                "the vector env is closed. Create a new one (and check what ended the "
                f"worker: a crash or hang in a sub-env, or a kill from outside){hint}."
            )
            self.pool.close_after(lost.reason)
            raise error from lost.__cause__
        error = lost.error("it was replaced by a new worker with new sub-envs")
        w = lost.w
        self.num_worker_restarts += 1
        marks = self.views.status
        seqs = set(self.pool.mark_lost(w, error))
        stepping: list[int] = []
        for ww, seq, lo, hi in self.in_flight():
            if ww == w and seq in seqs:
                self.num_lost_steps += int(np.count_nonzero(marks[lo:hi] == DONE))
                self.num_unrun_steps += int(np.count_nonzero(marks[lo:hi] == NOT_RUN))
                stepping.extend(range(lo, hi))
        for i in set(range(*self.pool.bounds[w])) - set(stepping):
            self.pending[i] = error
        self._respawn(w, error)
        for i in stepping:
            self.layout.fail_slot(self.views, i)
        return error

    def fail_unrun(self, i: int) -> BaseException:
        """Sub-env ``i`` (pending) does not step: its slot fails now; returns why."""
        self.num_unrun_steps += 1
        self.layout.fail_slot(self.views, i)
        return self.pending.pop(i)

    def _respawn(self, w: int, cause: BaseException) -> None:
        """Starts a new worker ``w`` with new, reset sub-envs, retried as the restart
        policy says; closes the vector env and raises if no attempt succeeds."""
        policy, pool = self.restart_policy, self.pool
        assert policy is not None  # internal: only with a policy
        lo, hi = pool.bounds[w]

        def attempt() -> None:
            try:
                pool.workers[w] = pool.spawn(w)
                report = pool.expect(w, protocol.START_REPORT_SEQ)
                self.layout.check_report(report, f"a restarted sub-env of worker {w}")
                pool.expect(w, pool.send_memory(w))
                _, restarted = pool.expect(
                    w, pool.send_call(w, "reset", ([None] * (hi - lo), None))
                )
                self.num_restarts += restarted
            except WorkerLost as lost:
                raise lost.error("while it was being restarted") from None
            except BaseException:
                pool.workers[w].kill()
                raise

        def give_up(last: BaseException) -> BaseException:
            reason = (
                f"worker {w} (sub-envs {lo}..{hi - 1}) failed ({cause}) and could not be "
                f"restarted: {policy.max_attempts} attempts in a row failed, the last with "
                f"{last!r}"
            )
            pool.close_after(reason)
            return WorkerError(
                f"{reason}. The vector env is closed. Fix the env factory, or raise "
                "RestartPolicy(max_attempts=...) / backoff_s.",
                w,
                range(lo, hi),
            )

        retry(attempt, policy, cause, give_up)

"""What a dead or hung worker means for the vector env, and the accounting of it.

Without a restart policy, a lost worker closes the vector env and its error is
raised. With one, the worker is replaced by a new one with new, reset sub-envs, and
every sub-env of the old worker ends its episode as a fault: its slot in the step
under way (or, if it was not being stepped, in its next step) is failed. The shared
progress marks (:mod:`.shared`) tell which of those slots stand for a step the
sub-env had completed (``num_lost_steps``) or never started (``num_unrun_steps``).
"""

from __future__ import annotations

import pickle
import time

import numpy as np

from jaxrunner.envs.process import shared, wire
from jaxrunner.envs.process.handle import WorkerLost
from jaxrunner.envs.process.pool import StepCall, WorkerPool
from jaxrunner.errors import SpaceMismatchError, WorkerError
from jaxrunner.faults import RestartPolicy


class WorkerRecovery(WorkerPool):
    """A :class:`WorkerPool` that replaces lost workers as its restart policy says."""

    _restart_policy: RestartPolicy | None = None
    _calls: dict[tuple[int, int], StepCall]
    """The ``step_batch_async`` calls not yet waited for, by ``(lo, hi)``; a recovery
    fails the slots of those its lost worker was stepping."""
    _pending: dict[int, BaseException]
    """Sub-envs of replaced workers that were not being stepped: their next step slot
    fails (with this error) instead of stepping."""
    num_worker_restarts: int
    """Workers replaced after they died or timed out."""
    num_lost_steps: int
    """Completed ``env.step`` calls whose results died with their worker."""
    num_unrun_steps: int
    """Failed slots of replaced workers' sub-envs that had not started their step."""

    def _worker_lost(self, lost: WorkerLost, fatal: bool = False) -> BaseException:
        """Handles a dead worker: replaces it (restart policy set and not ``fatal``)
        and returns the error its sub-envs failed with; else closes the vector env and
        raises that error."""
        if self._restart_policy is None or fatal:
            hint = (
                ""
                if fatal
                else ", or let EnvRunner(restart_failed_sub_envs=True) replace failed workers"
            )
            error = lost.error(
                "the vector env is closed. Create a new one (and check what ended the "
                f"worker: a crash or hang in a sub-env, or a kill from outside){hint}."
            )
            self._close_after(lost.reason)
            raise error from lost.__cause__
        error = lost.error("it was replaced by a new worker with new sub-envs")
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
                    self.num_lost_steps += int(np.count_nonzero(marks == shared.DONE))
                    self.num_unrun_steps += int(np.count_nonzero(marks == shared.NOT_RUN))
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
                report = self._expect(w, wire.START_REPORT_SEQ)
                spaces = (self.single_observation_space, self.single_action_space)
                for pair in report["spaces"]:
                    if pair != spaces:
                        raise SpaceMismatchError(
                            f"a restarted sub-env of worker {w} has spaces {pair}, the vector "
                            f"env {spaces}; every sub-env must have equal spaces."
                        )
                self._expect(w, self._send_memory(w))
                payload = pickle.dumps(("set_restart_policy", (policy,)), protocol=5)
                self._expect(w, self._send(w, wire.OP_CALL, payload=payload))
                seeds = [None] * len(self._workers[w].envs)
                payload = pickle.dumps(("reset", (seeds, None)), protocol=5)
                self._expect(w, self._send(w, wire.OP_CALL, payload=payload))
                return
            except WorkerLost as lost:
                last = lost.error("while it was being restarted")
            except Exception as err:
                last = err
                self._workers[w].kill()
        lo, hi = self._bounds[w]
        reason = (
            f"worker {w} (sub-envs {lo}..{hi - 1}) failed ({cause}) and could not be "
            f"restarted: {policy.max_attempts} attempts in a row failed, the last with {last!r}"
        )
        self._close_after(reason)
        error = WorkerError(
            f"{reason}. The vector env is closed. Fix the env factory, or raise "
            "RestartPolicy(max_attempts=...) / backoff_s.",
            w,
            range(lo, hi),
        )
        error.recreation_error = last  # type: ignore[attr-defined]
        raise error from cause

    def _fail_slot(self, i: int) -> None:
        """Sub-env ``i``'s slot of the step under way holds no transition."""
        shared.fail_slot(self._views, self.single_observation_space, i)

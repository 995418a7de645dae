"""The process transport: worker processes, the shared block, recovery and stepping, for any
kind of sub-env (:class:`~.shared.BlockLayout`): gymnasium's in
:class:`~jaxrunner.ProcessVectorEnv`, PettingZoo's in the multi-agent process backend."""

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
from jaxrunner._src.backends.sub_env_handle import SubEnvHandle

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
        check_report: ``(report, where)``: raises if a replacement worker's sub-envs
            differ from the vector env's.
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
        check_report: Callable[[Report, str], None],
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
            check_report,
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


class TransportForwarding:
    """``call``/``get_attr``/``set_attr``/``render`` and ``get_sub_environments`` of a
    vector env over a :class:`ProcessTransport` (``self._transport``): the single- and
    multi-agent process backends. Results must pickle."""

    _transport: ProcessTransport
    num_envs: int
    _res: Resources
    _closed_reason: str | None
    _finalizer: Callable[[], Any]

    def _start_transport(
        self,
        env_fns: Sequence[Callable[[], Any]],
        bounds: list[tuple[int, int]],
        config: ProcessConfig,
        restart_policy: RestartPolicy | None,
    ) -> None:
        """Starts the workers (``self._transport``); a failure closes the vector env
        before it raises."""
        try:
            self._transport = ProcessTransport(
                env_fns,
                bounds,
                config,
                restart_policy,
                self._res,
                self._close_after,
                self._layout_for,  # type: ignore[attr-defined]
                self._check_report,  # type: ignore[attr-defined]
            )
        except BaseException:
            self._close_after("construction failed")
            raise
        self._closed_reason = None

    def _close_after(self, reason: str) -> None:
        """Closes the vector env after a failure (``reason`` is quoted to later calls)."""
        self._closed_reason = reason
        self._finalizer()

    @property
    def num_worker_restarts(self) -> int:
        """Workers replaced after they died or timed out."""
        return self._transport.recovery.num_worker_restarts

    @property
    def num_lost_steps(self) -> int:
        """Completed ``env.step`` calls whose results died with their worker."""
        return self._transport.recovery.num_lost_steps

    @property
    def num_unrun_steps(self) -> int:
        """Failed slots of replaced workers' sub-envs that had not started their step."""
        return self._transport.recovery.num_unrun_steps

    def get_sub_environments(self) -> list[SubEnvHandle]:
        """A :class:`~jaxrunner._src.backends.sub_env_handle.SubEnvHandle` per sub-env,
        in index order (the sub-envs live in the workers)."""
        self._check_open("get_sub_environments")  # type: ignore[attr-defined]
        return [SubEnvHandle(self, i) for i in range(self.num_envs)]

    def _sub_env_request(self, index: int, method: str, args: tuple) -> Any:
        self._check_open(f"get_sub_environments()[{index}].{method}")  # type: ignore[attr-defined]
        return self._transport.on_sub_env(index, method, args)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` (or reads attribute ``name``) on every sub-env; the
        results must pickle."""
        self._check_open("call")  # type: ignore[attr-defined]
        return self._transport.pool.call_each_env("call", (name, args, kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        self._check_open("get_attr")  # type: ignore[attr-defined]
        return self._transport.pool.call_each_env("get_attr", (name,))

    def set_attr(self, name: str, values: Any) -> None:
        self._check_open("set_attr")  # type: ignore[attr-defined]
        self._transport.set_attr(name, self._values_per_env(name, values))  # type: ignore[attr-defined]

    def render(self) -> tuple[Any, ...]:
        self._check_open("render")  # type: ignore[attr-defined]
        return self._transport.pool.call_each_env("render")

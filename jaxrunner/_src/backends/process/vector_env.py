"""The process backend for either kind of sub-env (the per-kind part: a
:class:`~.shared.BlockLayout`), and its two shells, ``ProcessVectorEnv`` (gymnasium) and
``ProcessMultiAgentVectorEnv`` (PettingZoo)."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from jaxrunner._src.arg_checks import check_config, check_env_fns, check_seed_count
from jaxrunner._src.backends.base import MultiAgentVectorEnv, VectorEnv
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.checked_sends import ChecksOnSend
from jaxrunner._src.backends.process.config import ProcessConfig
from jaxrunner._src.backends.process.handle import shutdown
from jaxrunner._src.backends.process.shared import AgentLayout, BlockLayout, Layout
from jaxrunner._src.backends.process.transport import ProcessTransport, Report
from jaxrunner._src.backends.remote_sub_envs import RemoteSubEnvs
from jaxrunner._src.backends.restarts import RestartPolicy, check_restart_policy
from jaxrunner._src.backends.steps import EnvIds
from jaxrunner._src.backends.sub_env_block import EnvFactory
from jaxrunner._src.core.agent_groups import AgentGroup, PolicyMappingFn
from jaxrunner.errors import InvalidArgumentError

TWO_SPLITS_MIN_ENVS = 16
"""Sub-envs from which two splits pay on a CPU host: one split ran 1.10x two at 8
CartPoles, two 1.24-1.36x one at 16 to 64
(benchmarks/results/splits_process_cartpole_widths_cpu.json); on MPE simple_spread (3
agents) one split ran 1.08x two at 4 and 8 envs, two 1.05x one at 16 and 32
(splits_process_mpe_stop105_cpu.json): sub-envs, not rows, set it."""


class ProcessBackend(ChecksOnSend, RemoteSubEnvs):
    """Sub-envs in worker processes over a :class:`~.transport.ProcessTransport`; a shell of
    one kind gives the layout (:meth:`_layout_for`). Results of ``call``/``get_attr`` must
    pickle."""

    # Two pipelining splits from TWO_SPLITS_MIN_ENVS on a CPU host (an accelerator takes
    # one): the workers step one split while the main process computes the other's actions.
    capabilities = Capabilities(can_restart=True, steps_in_background=True, pipeline_splits=2)
    groups: tuple[AgentGroup, ...]  # the kind's: a VectorEnv's one, or the layout's

    def _start(
        self,
        env_fns: Sequence[EnvFactory],
        config: ProcessConfig | None,
        restart_policy: RestartPolicy | None,
        where: str,
        transport: ProcessTransport | None,
    ) -> None:
        """Checks the arguments and starts the workers (or takes ``transport``'s, started
        to learn the kind); a failure closes the vector env before it raises."""
        self._closed_reason = "construction failed"  # until the workers are up
        config = check_config(where, config, ProcessConfig)
        check_restart_policy(where, restart_policy)
        check_env_fns(where, env_fns)
        self.config, self.restart_policy = config, restart_policy
        self.num_envs = len(env_fns)
        if transport is None:
            transport = ProcessTransport(env_fns, config, self.multi_agent)
        self._transport, self._res = transport, transport.res
        self.main_process_envs = transport.main_process_envs
        unsplit = dataclasses.replace(ProcessBackend.capabilities, pipeline_splits=None)
        if config.ready_first:
            self.capabilities = dataclasses.replace(unsplit, ready_first=True)
        elif self.main_process_envs:  # the runner's two splits: the main process's, the rest
            bounds = (0, self.main_process_envs, self.num_envs)
            self.capabilities = dataclasses.replace(unsplit, pipeline_bounds=bounds)
        self._finalizer = weakref.finalize(self, shutdown, self._res)
        try:
            layout = self._layout_for(transport.reports)
            transport.attach(layout, restart_policy, self._close_after, type(self).__name__)
        except BaseException:
            self._close_after("construction failed")
            raise
        self._closed_reason = None
        if self.num_envs < TWO_SPLITS_MIN_ENVS:
            self.capabilities = dataclasses.replace(self.capabilities, pipeline_splits=None)
        self._stepper, self._views, self._pool = transport.stepper, transport.views, transport.pool
        self._layout = layout

    _layout_for: Callable[[list[Report]], BlockLayout]
    """The shell's: checks the workers' start reports, takes what it exposes of them, and
    returns the shared block's layout."""

    def _close_after(self, reason: str) -> None:
        self._closed_reason = reason
        self._finalizer()

    def _close_backend(self) -> None:
        self._finalizer()

    @property
    def step_timeout_s(self) -> float | None:
        """How long a worker may take to answer a command (None: forever)."""
        return self.config.step_timeout_s

    @property
    def num_restarts(self) -> int:
        """Sub-envs recreated inside their worker after a failure."""
        return self._stepper.num_restarts + self._transport.recovery.num_restarts

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

    @property
    def num_workers(self) -> int:
        """Worker processes (the main process's share is not one)."""
        return len(self._pool.bounds) - bool(self.main_process_envs)

    @property
    def worker_pids(self) -> list[int | None]:
        """The worker processes' ids (for monitoring; empty once closed)."""
        return [w.pid for w in self._res.workers if not w.in_main_process]

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> Any:
        """Resets every sub-env; the results of sends not yet received are dropped."""
        self._check_open("reset_batch" if self.multi_agent else "reset")
        check_seed_count(seeds, self.num_envs, type(self).__name__)
        self._stepper.discard()
        seeds, pool = list(seeds), self._pool
        results = pool.call_all("reset", [(seeds[lo:hi], options) for lo, hi in pool.bounds])
        # Every sub-env starts afresh from what the caller gets.
        self._transport.recovery.pending.clear()
        self._stepper.num_restarts += sum(restarted for _, restarted in results)
        infos = [info for infos, _ in results for info in infos]
        return self._layout.reset_result(self._views, infos)

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> Any:
        self._check_open("reset_at")
        self._check_reset_at(index, seed, options)
        if any(call.overlaps(index, index + 1) for call in self._stepper.calls):
            # Its worker steps it first: the reset would overwrite the step's observation.
            raise InvalidArgumentError(
                f"{type(self).__name__}.reset_at({index}): sub-env {index}'s step is in "
                "flight (sent, not received); recv() it first, or reset() every sub-env "
                "(which drops steps in flight)."
            )
        info, restarted = self._call_worker_of(index, "reset_at", (index, seed, options))
        self._stepper.num_restarts += restarted
        self._transport.recovery.pending.pop(index, None)
        return self._layout.reset_at_result(self._views, index, info)

    def _send_actions(self, actions: Any, env_ids: EnvIds, checked: bool) -> None:
        """Validates ``actions`` (unless ``checked``), writes them to shared memory and
        tells the workers of ``env_ids`` to step; returns without waiting (see
        :meth:`recv`). Lockstep: any slice (a send of rows still in flight goes out once
        those are received). Ready-first: ``env_ids`` covers whole workers, none of
        them in flight."""
        self._check_open("step")
        self._stepper.send(actions, env_ids, per_worker=self.config.ready_first, checked=checked)

    def recv(self) -> Any:
        """Lockstep: the result of the oldest send. Ready-first: the result of the first
        worker to answer (``env_ids`` its slice). Raises InvalidArgumentError when no
        send is waiting."""
        self._check_open("step")
        return self._stepper.recv()

    def step_batch(self, actions: Any, rows: slice | None = None) -> Any:
        """:meth:`send` then :meth:`recv` (the base's definition), for all of ``rows``
        at once (in ready-first mode too); nothing in flight: straight to the result."""
        self._check_open("step")
        stepper = self._stepper
        if stepper.calls and not self.config.ready_first:  # the oldest send answers first
            stepper.send(actions, rows, per_worker=False)
            return stepper.recv()
        (call,) = stepper.send(actions, rows, per_worker=False)
        return stepper.finish(call)

    def _ask_one(self, index: int, method: str, args: tuple) -> Any:
        return self._call_worker_of(index, "on_sub_env", (index, method, args))

    def _ask_each(self, method: str, *args: Any) -> tuple[Any, ...]:
        parts = self._pool.call_all(method, [args] * len(self._pool.workers))
        return tuple(x for part in parts for x in part)

    def _set_each(self, name: str, values: list[Any]) -> None:
        pool = self._pool
        pool.call_all("set_attr", [(name, list(values[lo:hi])) for lo, hi in pool.bounds])

    def _call_worker_of(self, index: int, method: str, args: tuple) -> Any:
        """``method(*args)`` asked of sub-env ``index``'s worker (the current one: a
        replaced worker's successor); its result."""
        w = self._pool.worker_of(index)
        return self._pool.result(w, *self._pool.call(w, method, args))


class ProcessVectorEnv(ProcessBackend, VectorEnv):
    """Sub-envs in worker processes, stepped in parallel, data in shared memory (see
    docs/backends/process.md).

    Step for step equal to :class:`~jaxrunner.SyncVectorEnv` (SAME_STEP autoreset) for the
    same seeds and actions, whatever the number of workers; sub-envs receive actions in the
    action space's dtype. Lockstep by default; with ``ProcessConfig(ready_first=True)``,
    ``capabilities.ready_first`` is set and ``recv`` returns whichever worker answers first.

    Faults (docs/fault-tolerance.md): with a ``restart_policy``, a failed sub-env is
    recreated inside its worker, as the sync backend does, and a worker that dies or does
    not answer within ``step_timeout_s`` is killed and replaced, retried as the policy
    says, with new unseeded sub-envs: each of its sub-envs' slot in the step under way (or
    else its next one) fails (``BatchStep.failed``, with a
    :class:`~jaxrunner.errors.WorkerError` or :class:`~jaxrunner.errors.WorkerTimeoutError`),
    counted in ``num_lost_steps`` (a step done whose result died with the worker) or
    ``num_unrun_steps`` (one never started). Without a policy the worker's error is raised
    and the vector env closes.

    Args:
        env_fns: zero-argument factories, one per sub-env; each is pickled by
            cloudpickle and called in its worker (those of the main process's share
            here, unpickled).
        config: workers, start method, timeout, stepping mode and the main process's
            share (:class:`~jaxrunner.ProcessConfig`; None: the defaults).
        copy: as for :class:`~jaxrunner.SyncVectorEnv`.
        restart_policy: if given, failed sub-envs and lost workers are replaced as it
            says and sampling goes on; if None (default), failures raise.

    Raises:
        InvalidArgumentTypeError: a factory cannot be pickled, or ``config`` is not a
            ProcessConfig.
        InvalidArgumentError: a ``main_process_envs`` share that leaves the workers
            too few sub-envs.
        EnvError: a factory raised in its worker (the original is chained).
        SpaceMismatchError: sub-envs with different or unsupported spaces.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        config: ProcessConfig | None = None,
        *,
        copy: bool = True,
        restart_policy: RestartPolicy | None = None,
        _transport: ProcessTransport | None = None,
    ) -> None:
        super().__init__(copy=copy)
        self._start(env_fns, config, restart_policy, "ProcessVectorEnv", _transport)

    def _layout_for(self, reports: list[Report]) -> Layout:
        layout = Layout.from_reports(reports, self.num_envs)
        first = reports[0]
        self._take_spaces(
            layout.observation_space, layout.action_space, first["metadata"], first["render_mode"]
        )
        return layout

    def _obs_buffer(self) -> Any:
        return self._views.buffers.obs


class ProcessMultiAgentVectorEnv(ProcessBackend, MultiAgentVectorEnv):
    """Multi-agent sub-envs in worker processes (see docs/multi-agent.md): the multi-agent
    shell of :class:`~.vector_env.ProcessBackend`, step for step equal to the sync
    multi-agent backend for the same seeds and actions, whatever the number of workers.
    ``config``, ``restart_policy``, faults and their accounting are as for
    :class:`~jaxrunner.ProcessVectorEnv`; ``policy_mapping_fn`` as for the sync backend.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        policy_mapping_fn: PolicyMappingFn | None = None,
        *,
        config: ProcessConfig | None = None,
        restart_policy: RestartPolicy | None = None,
        _transport: ProcessTransport | None = None,
    ) -> None:
        super().__init__()
        self._mapping = policy_mapping_fn
        self._start(env_fns, config, restart_policy, "make_vec", _transport)

    def _layout_for(self, reports: list[Report]) -> AgentLayout:
        layout = AgentLayout.from_reports(reports, self.num_envs, self._mapping)
        self.groups, self.turn_based = layout.groups, layout.description.turn_based
        return layout

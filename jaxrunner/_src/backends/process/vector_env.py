"""``ProcessVectorEnv``: the :class:`~jaxrunner._src.backends.base.VectorEnv` contract on top
of the worker pool (:mod:`.pool`, :mod:`.recovery`)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import gymnasium
from gymnasium.vector.utils import batch_space

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.batch_step import BatchStep, EnvIds
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.process.config import ProcessConfig, checked_config
from jaxrunner._src.backends.process.handle import Resources, shutdown
from jaxrunner._src.backends.process.launch import (
    EnvFactory,
    worker_bounds,
)
from jaxrunner._src.backends.process.shared import Layout
from jaxrunner._src.backends.process.transport import Report, TransportForwarding
from jaxrunner._src.backends.restarts import RestartPolicy, check_restart_policy
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError, SpaceMismatchError


class ProcessVectorEnv(TransportForwarding, VectorEnv):
    """Sub-envs in worker processes, stepped in parallel, data in shared memory.

    Step for step equal to :class:`~jaxrunner.SyncVectorEnv` (and so to
    ``gymnasium.vector.SyncVectorEnv`` with SAME_STEP autoreset) for the same seeds and
    actions, whatever the number of workers. Sub-envs receive actions in the action
    space's dtype. Composed of a :class:`~.pool.WorkerPool` (processes, commands,
    replies), a :class:`~.recovery.WorkerRecovery` (lost workers) and a
    :class:`~.stepping.Stepper` (``send``/``recv``).

    Stepping: lockstep by default (``recv`` answers the sends in order); with
    ``ProcessConfig(ready_first=True)``, ``capabilities.ready_first`` is set and
    ``recv`` returns whichever worker answers first (see :mod:`.stepping`).

    Faults: with a ``restart_policy``, a sub-env that raises or returns an invalid
    step is recreated inside its worker, exactly as the sync backend does. A worker
    that dies (a crash, a segfault, a kill) or does not answer within
    ``step_timeout_s`` is killed and replaced by a new one with new sub-envs (made by
    the factories and reset without a seed), retried as the policy says; every
    sub-env of the old worker then ends its episode as a fault: its slot in the step
    under way (or, if it was not being stepped, in its next step) is failed
    (``BatchStep.failed``, the error a :class:`~jaxrunner.errors.WorkerError` or
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
        config: workers, start method, timeout and stepping mode
            (:class:`~jaxrunner.ProcessConfig`; None: the defaults). Every sub-env steps
            in a worker: ``main_process_envs`` must be None or 0 (a share in the main
            process is built by ``make_vec(..., backend="process")``).
        copy: as for :class:`~jaxrunner.SyncVectorEnv`.
        restart_policy: if given, failed sub-envs and lost workers are replaced as it
            says and sampling goes on; if None (default), failures raise.

    Raises:
        InvalidArgumentTypeError: a factory cannot be pickled, or ``config`` is not a
            ProcessConfig.
        InvalidArgumentError: ``config.main_process_envs`` is 1 or more.
        EnvError: a factory raised in its worker (the original is chained).
        SpaceMismatchError: sub-envs with different or unsupported spaces.
    """

    capabilities = Capabilities(can_restart=True, steps_in_background=True, pipeline_splits=2)

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        config: ProcessConfig | None = None,
        *,
        copy: bool = True,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        super().__init__(copy=copy)
        self._res = Resources()
        self._finalizer = weakref.finalize(self, shutdown, self._res)
        self._closed_reason = "construction failed"  # until the workers are up
        config = checked_config(config, "ProcessVectorEnv")
        check_restart_policy("ProcessVectorEnv", restart_policy)
        if len(env_fns) == 0:
            raise InvalidArgumentError("ProcessVectorEnv needs at least one env factory, got none.")
        if config.main_process_envs:
            raise InvalidArgumentError(
                f"ProcessVectorEnv(config=ProcessConfig(main_process_envs="
                f"{config.main_process_envs})): a ProcessVectorEnv steps every sub-env in its "
                "workers. Build with jaxrunner.make_vec(..., backend='process', config=...) "
                "to step a share in the main process."
            )
        self.config = config
        self.restart_policy = restart_policy
        if config.ready_first:
            self.capabilities = Capabilities(
                can_restart=True, steps_in_background=True, ready_first=True
            )
        self.num_envs = len(env_fns)
        bounds = worker_bounds(self.num_envs, config.envs_per_worker, config.num_workers)
        self._start_transport(env_fns, bounds, config, restart_policy)
        self._pool = self._transport.pool
        self._stepper = self._transport.stepper
        self._views = self._transport.views

    @property
    def step_timeout_s(self) -> float | None:
        """How long a worker may take to answer a command (None: forever)."""
        return self.config.step_timeout_s

    @property
    def num_restarts(self) -> int:
        """Sub-envs recreated inside their worker after a failure."""
        return self._stepper.num_restarts

    def _layout_for(self, reports: list[Report]) -> Layout:
        """Checks the workers' sub-envs (equal, supported spaces) and takes their
        spaces and metadata; the shared block's layout."""
        if "spaces" not in reports[0]:
            raise InvalidArgumentTypeError(
                "ProcessVectorEnv: the env factories made multi-agent (PettingZoo) envs; "
                "build them with jaxrunner.make_vec(env_fn, num_envs, backend='process'), "
                "which builds either kind."
            )
        env_spaces = [pair for report in reports for pair in report["spaces"]]
        self._check_spaces(env_spaces)
        first = reports[0]
        autoreset = VectorEnv.metadata["autoreset_mode"]
        self.metadata = {**first["metadata"], "autoreset_mode": autoreset}
        self.render_mode = first["render_mode"]
        self.spec = None
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        return Layout(self.single_observation_space, self.single_action_space, self.num_envs)

    def _check_report(self, report: Report, where: str) -> None:
        spaces = (self.single_observation_space, self.single_action_space)
        for pair in report.get("spaces", [None]):
            if pair != spaces:
                raise SpaceMismatchError(
                    f"{where} has spaces {pair}, the vector env {spaces}; every sub-env must "
                    "have equal spaces."
                )

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
        space_arrays.check_supported(self.single_observation_space, "single_observation_space")
        space_arrays.check_supported(self.single_action_space, "single_action_space")

    # -- the backend contract -------------------------------------------------------------------

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, list[dict[str, Any]]]:
        """Resets every sub-env; the results of sends not yet received are dropped."""
        self._check_open("reset")
        return self._views.obs, self._transport.reset(seeds, options)

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._check_open("reset_at")
        self._check_index(index, "reset_at")
        info = self._transport.reset_at(index, seed, options)
        return space_arrays.take(self.single_observation_space, self._views.obs, index), info

    def send(self, actions: Any, env_ids: EnvIds = None) -> None:
        """Validates ``actions``, writes them to shared memory and tells the workers of
        ``env_ids`` to step; returns without waiting (see :meth:`recv`). Lockstep:
        any slice (a send of rows still in flight goes out once those are received).
        Ready-first: ``env_ids`` covers whole workers, none of them in flight."""
        self._check_open("step")
        self._stepper.send(actions, env_ids, per_worker=self.config.ready_first)

    def recv(self) -> BatchStep:
        """Lockstep: the result of the oldest send. Ready-first: the result of the first
        worker to answer (``env_ids`` its slice). Raises InvalidArgumentError when no
        send is waiting."""
        self._check_open("step")
        return self._stepper.recv()

    def step_batch(self, actions: Any, rows: slice | None = None) -> BatchStep:
        """:meth:`send` then :meth:`recv` (the base's definition), for all of ``rows``
        at once (in ready-first mode too); nothing in flight: straight to the result."""
        self._check_open("step")
        return self._transport.step_all(actions, rows, self.config.ready_first)

    def _obs_buffer(self) -> Any:
        return self._views.obs

    def _close_backend(self) -> None:
        self._finalizer()

    # -- gymnasium's utilities (call, get_attr, set_attr, render): TransportForwarding

    @property
    def num_workers(self) -> int:
        return len(self._pool.bounds)

    @property
    def worker_pids(self) -> list[int | None]:
        """The worker processes' ids (for monitoring; empty once closed)."""
        return [w.pid for w in self._res.workers]

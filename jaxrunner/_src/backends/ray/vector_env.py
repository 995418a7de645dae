"""``RayVectorEnv``: sub-envs in Ray actors, stepped at their own pace (ready-first)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.batch_step import BatchStep, EnvIds
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.gymnasium_block import ActionSplitters
from jaxrunner._src.backends.ray.actor_manager import ActorForwarding, ActorPool, EnvFactory
from jaxrunner._src.backends.ray.config import RayConfig, import_ray
from jaxrunner._src.backends.ray.deadlines import InFlightSteps
from jaxrunner._src.backends.restarts import RestartPolicy, check_restart_policy
from jaxrunner._src.backends.step_buffers import StepBuffers, fail_slot, span
from jaxrunner.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    SpaceMismatchError,
    WorkerError,
)


class RayVectorEnv(ActorForwarding, VectorEnv):
    """Sub-envs in Ray actors, stepped at their own pace.

    Consecutive blocks of ``envs_per_actor`` sub-envs each run in one Ray actor as a
    :class:`~jaxrunner.SyncVectorEnv`, so validation, SAME_STEP autoreset and restarts
    work as in-process. Ready-first: :meth:`send` starts whole actors' steps and
    :meth:`recv` returns the first actor to finish (``BatchStep.env_ids`` its slice);
    :meth:`step_batch` waits for every actor of its rows. An actor that dies or misses
    ``step_timeout_s`` is killed and, under a ``restart_policy``, replaced: its sub-envs'
    step in flight fails and their episodes end as faulty; without one the failure
    raises :class:`~jaxrunner.errors.WorkerError` (a death) or
    :class:`~jaxrunner.errors.RemoteTimeoutError` (a missed deadline).

    Ray must be importable; if no Ray instance is running, Ray starts a local one on
    first use (call ``ray.init(address="auto")`` first to use a cluster).

    Args:
        env_fns: zero-argument factories, one per sub-env; picklable (cloudpickle), as
            they are sent to the actors.
        config: placement, batching and timeouts (:class:`~jaxrunner.RayConfig`).
        restart_policy: if given, failed sub-envs (inside their actor) and dead actors
            are replaced as it says and sampling goes on; None: failures raise.
        copy: as for :class:`~jaxrunner.SyncVectorEnv`.
    """

    capabilities = Capabilities(can_restart=True, ready_first=True, steps_in_background=True)

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        config: RayConfig | None = None,
        *,
        restart_policy: RestartPolicy | None = None,
        copy: bool = True,
    ) -> None:
        super().__init__(copy=copy)
        self._closed_reason = "construction failed"  # until the actors are up
        if len(env_fns) == 0:
            raise InvalidArgumentError("RayVectorEnv needs at least one env factory, got none.")
        self.config = config or RayConfig()
        if not isinstance(self.config, RayConfig):
            raise InvalidArgumentTypeError(
                f"RayVectorEnv(config=...): expected a jaxrunner.RayConfig, got "
                f"{type(config).__name__}."
            )
        check_restart_policy("RayVectorEnv", restart_policy)
        self.restart_policy = restart_policy
        if self.config.batch_buckets is not None:  # the ready-first sampler's batch sizes
            self.capabilities = dataclasses.replace(
                self.capabilities, batch_buckets=self.config.batch_buckets
            )
        self.num_envs = len(env_fns)
        self._actors = ActorPool(import_ray(), env_fns, self.config, restart_policy)
        self.unit_rows = self._actors.unit_rows
        """The sub-envs each actor runs (consecutive blocks)."""
        self._in_flight = InFlightSteps(self._actors.ray, self.config.step_timeout_s)
        self._done: collections.deque[BatchStep] = collections.deque()  # expired, failed
        described = self._actors.start()
        obs_space, action_space, metadata, render_mode = described[0]
        for u, (other_obs, other_action, _, _) in enumerate(described):
            if other_obs != obs_space or other_action != action_space:
                self._actors.kill_all()
                raise SpaceMismatchError(
                    f"the sub-envs of Ray env actor {u} (envs {self.unit_rows[u]}) have spaces "
                    f"{other_obs}, {other_action}; actor 0's have {obs_space}, {action_space}. "
                    "Every sub-env of a vector env must have equal spaces. Check the factory."
                )
        self._closed_reason = None
        self.single_observation_space = obs_space
        self.single_action_space = action_space
        self.metadata = {**metadata, "autoreset_mode": VectorEnv.metadata["autoreset_mode"]}
        self.render_mode = render_mode
        self.spec = None
        self.observation_space = batch_space(obs_space, self.num_envs)
        self.action_space = batch_space(action_space, self.num_envs)
        self._buffers = StepBuffers.allocate(obs_space, self.num_envs)
        self._obs, self._next_obs, self._reward, self._terminated, self._truncated = self._buffers
        self._actions = ActionSplitters(action_space)

    @property
    def num_restarts(self) -> int:
        """Sub-envs recreated inside the current actors (a replaced actor's count is
        lost with it; :attr:`num_actor_restarts` counts replaced actors)."""
        return self._actors.num_restarts()

    @property
    def num_actor_restarts(self) -> int:
        """Actors replaced after dying or timing out."""
        return self._actors.num_actor_restarts

    @property
    def actors(self) -> list[Any]:
        """The Ray actor handles, one per block of :attr:`unit_rows` (current ones)."""
        return list(self._actors.actors)

    @property
    def num_in_flight(self) -> int:
        """Actor steps sent and not yet returned by :meth:`recv`."""
        return len(self._in_flight) + len(self._done)

    # -- the backend contract --------------------------------------------------------------------

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, list[dict[str, Any]]]:
        """Resets every sub-env; the results of sends not yet received are dropped."""
        self._check_open("reset")
        self._discard()
        refs = [
            actor.reset.remote(list(seeds[rows]), options)
            for actor, rows in zip(self._actors.actors, self.unit_rows)
        ]
        infos: list[dict[str, Any]] = []
        for u, ref in enumerate(refs):
            try:
                obs, part = self._actors.ray.get(ref, timeout=self.config.step_timeout_s)
            except Exception as err:
                cause = self._actors.remote_error(err, u, "reset")
                obs, part = self._actors.replace(u, cause)
            space_arrays.copy_into(self.single_observation_space, self._obs, obs, self.unit_rows[u])
            infos.extend(part)
        return self._obs, infos

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._check_open("reset_at")
        self._check_idle("reset_at")
        self._check_index(index)
        u = index // self.config.envs_per_actor
        local = index - self.unit_rows[u].start
        try:
            ref = self._actors.actors[u].reset_at.remote(local, seed, options)
            obs, info = self._actors.ray.get(ref)
        except Exception as err:
            raise self._actors.remote_error(err, u, "reset_at")  # noqa: B904  (chained)
        space_arrays.copy_into(self.single_observation_space, self._obs, obs, index)
        return space_arrays.take(self.single_observation_space, self._obs, index), info

    def send(self, actions: Any, env_ids: EnvIds = None) -> None:
        """Starts the step of the actors of ``env_ids`` (None: all; else a slice or an
        int array covering whole actors), none of them in flight; validates the whole
        batch first. :meth:`recv` returns their results."""
        self._check_open("step")
        units = self._whole_actors(env_ids)
        self._actions.split(actions, sum(len(at) for _, at in units))
        busy = self._in_flight.units() & {u for u, _ in units}
        if busy:
            raise InvalidArgumentError(
                f"RayVectorEnv.send(env_ids={env_ids!r}): Ray env actor {min(busy)} is still "
                "in flight from an earlier send; recv() its result first."
            )
        for u, at in units:
            part = space_arrays.map_structure(
                self.single_action_space, lambda a, at=at: np.asarray(a)[at], actions
            )
            self._submit(u, part, None)

    def recv(self) -> BatchStep:
        """The results of the first actor to finish and of every other actor that
        finishes within ``config.remote_env_batch_wait_ms`` after it, in one
        :class:`BatchStep` (``env_ids`` the first actor's slice when it is alone, else
        an int array). A dead or timed-out actor is replaced (with a restart policy)
        and every sub-env it ran is failed; without a policy the failure raises
        WorkerError / RemoteTimeoutError. Raises InvalidArgumentError when no actor
        step is in flight."""
        results = [self._recv_one()]
        wait_s = self.config.remote_env_batch_wait_ms / 1000.0
        results.extend(self._finish(ref) for ref in self._in_flight.ready_within(wait_s))
        while self._done:
            results.append(self._done.popleft())
        return results[0] if len(results) == 1 else self._merge(results)

    def _recv_one(self) -> BatchStep:
        self._check_open("step")
        if self._done:
            return self._done.popleft()
        if not self._in_flight:
            raise InvalidArgumentError(
                "RayVectorEnv.recv(): no send() is waiting for its results. Call "
                "send(actions, env_ids) first, once per actor."
            )
        while True:
            ref = self._in_flight.first_ready()
            if ref is not None:
                return self._finish(ref)
            self._expire_steps()
            if self._done:
                return self._done.popleft()

    def _merge(self, results: list[BatchStep]) -> BatchStep:
        """Several actors' results as one BatchStep (rows in actor order)."""
        results.sort(key=lambda r: span(r).start)
        return self._buffers.merge(self.single_observation_space, results)

    def step_batch(self, actions: Any, rows: slice | None = None) -> BatchStep:
        """Every actor of ``rows`` steps (rows may split an actor); returns when all
        have answered. No other step may be in flight."""
        self._check_open("step")
        self._check_idle("step")
        lo, hi = (0, self.num_envs) if rows is None else (rows.start, rows.stop)
        self._actions.split(actions, hi - lo)  # validates the whole batch before any step
        for u, unit in enumerate(self.unit_rows):
            start, stop = max(lo, unit.start), min(hi, unit.stop)
            if start < stop:
                local = slice(start - unit.start, stop - unit.start)
                whole = local == slice(0, unit.stop - unit.start)
                self._submit(u, self._part(actions, lo, start, stop), None if whole else local)
        results = []
        while self.num_in_flight:
            results.append(self._recv_one())
        results.sort(key=lambda r: span(r).start)
        failed = np.zeros(hi - lo, np.bool_)
        infos, reset_infos, errors = [], {}, {}
        for out in results:
            infos.extend(out.infos)
            reset_infos.update(out.reset_infos)
            errors.update(out.errors or {})
            if out.failed is not None:
                failed[out.env_ids.start - lo : out.env_ids.stop - lo] = out.failed
        return self._buffers.batch_step(
            self.single_observation_space,
            None if rows is None else slice(lo, hi),
            infos,
            reset_infos,
            failed if failed.any() else None,
            errors or None,
        )

    # -- internals ------------------------------------------------------------------------------

    def _whole_actors(self, env_ids: EnvIds) -> list[tuple[int, np.ndarray]]:
        """The actors ``env_ids`` covers, each with its rows' positions in the send."""
        index = np.arange(self.num_envs)[slice(None) if env_ids is None else env_ids]
        index = np.atleast_1d(index)
        units, covered = [], 0
        for u, rows in enumerate(self.unit_rows):
            at = np.flatnonzero((index >= rows.start) & (index < rows.stop))
            if len(at) == rows.stop - rows.start and np.array_equal(
                index[at], np.arange(rows.start, rows.stop)
            ):
                units.append((u, at))
                covered += len(at)
            elif len(at):
                break
        if not units or covered != len(index):
            raise InvalidArgumentError(
                f"RayVectorEnv.send(env_ids={env_ids!r}): expected None (every env), or a "
                f"slice or an int array covering whole actors, each actor's sub-envs in "
                f"order; the actors' sub-envs are {self.unit_rows}."
            )
        return units

    def _part(self, actions: Any, lo: int, start: int, stop: int) -> Any:
        """Rows ``[start, stop)`` of ``actions`` (whose row 0 is sub-env ``lo``)."""
        return space_arrays.map_structure(
            self.single_action_space, lambda a: np.asarray(a)[start - lo : stop - lo], actions
        )

    def _submit(self, u: int, actions: Any, local: slice | None) -> None:
        unit = self.unit_rows[u]
        rows = unit if local is None else slice(unit.start + local.start, unit.start + local.stop)
        self._in_flight.add(self._actors.actors[u].step.remote(actions, local), u, rows)

    def _finish(self, ref: Any) -> BatchStep:
        u, rows = self._in_flight.pop(ref)
        try:
            out: BatchStep = self._actors.ray.get(ref)
        except Exception as err:
            cause = self._actors.remote_error(err, u, "step")
            if isinstance(cause, WorkerError):  # the actor died
                obs, _ = self._actors.replace(u, cause)  # raises without a restart policy
                return self._failed_result(u, rows, obs, cause)
            raise cause  # noqa: B904  (a sub-env raised, restarts off or given up; chained)
        space, offset = self.single_observation_space, self.unit_rows[u].start
        space_arrays.copy_into(space, self._obs, out.obs, rows)
        space_arrays.copy_into(space, self._next_obs, out.next_obs, rows)
        self._reward[rows], self._terminated[rows] = out.reward, out.terminated
        self._truncated[rows] = out.truncated
        failed = out.failed
        return self._result(
            rows,
            out.infos,
            {offset + i: info for i, info in out.reset_infos.items()},
            failed if failed is not None and failed.any() else None,
            {offset + i: e for i, e in out.errors.items()} if out.errors else None,
        )

    def _result(self, rows: slice, *fields: Any) -> BatchStep:
        return self._buffers.batch_step(self.single_observation_space, rows, *fields)

    def _failed_result(self, u: int, rows: slice, obs: Any, cause: BaseException) -> BatchStep:
        """Every sub-env of the replaced actor ``u``: a failed slot (reward 0, no flags,
        ``obs`` and ``next_obs`` the new sub-envs' reset observations)."""
        space, unit = self.single_observation_space, self.unit_rows[u]
        space_arrays.copy_into(space, self._obs, obs, unit)
        fail_slot(self._buffers, space, unit)
        n = rows.stop - rows.start
        errors = dict.fromkeys(range(rows.start, rows.stop), cause)
        return self._result(rows, [{} for _ in range(n)], {}, np.ones(n, np.bool_), errors)

    def _expire_steps(self) -> None:
        """Treats in-flight steps older than ``step_timeout_s`` as failed actors (their
        failed results wait in ``_done``)."""
        for u, rows, cause in self._in_flight.pop_expired():
            if self.restart_policy is None:
                self._actors.kill(self._actors.actors[u])
                raise cause
            obs, _ = self._actors.replace(u, cause)
            self._done.append(self._failed_result(u, rows, obs, cause))

    def _discard(self) -> None:
        """Drops the results of the steps in flight (see :meth:`InFlightSteps.discard`)."""
        self._in_flight.discard()
        self._done.clear()

    def _check_idle(self, what: str) -> None:
        if self.num_in_flight:
            raise InvalidArgumentError(
                f"RayVectorEnv.{what}(): {self.num_in_flight} actor steps are in flight; "
                "recv() until num_in_flight is 0 first."
            )

    def _obs_buffer(self) -> Any:
        return self._obs

    def _close_backend(self) -> None:
        self._actors.close()
        self._in_flight.clear()
        self._done.clear()

"""The stepping of ``backend="ray"`` for both kinds of env (what differs by kind:
:mod:`.kinds`): sends, replies gathered into steps, dead and hung actors replaced."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from jaxrunner._src.arg_checks import check_config, check_env_fns, check_seed_count
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.checked_sends import ChecksOnSend
from jaxrunner._src.backends.ray.actor_manager import ActorPool
from jaxrunner._src.backends.ray.config import RayConfig, import_ray
from jaxrunner._src.backends.ray.deadlines import InFlightSteps
from jaxrunner._src.backends.ray.kinds import AgentRows, Answer, GymnasiumRows
from jaxrunner._src.backends.ray.sub_env_calls import ActorSubEnvs
from jaxrunner._src.backends.restarts import RestartPolicy, check_restart_policy
from jaxrunner._src.backends.steps import EnvIds, block_rows
from jaxrunner._src.backends.sub_env_block import NOT_RUN, stepped_runs
from jaxrunner.errors import InvalidArgumentError, WorkerError


class Call:
    """One send in flight: envs ``[lo, hi)``, its actor steps and what came back."""

    def __init__(self, lo: int, hi: int, whole: bool) -> None:
        self.lo, self.hi, self.whole = lo, hi, whole
        self.steps: dict[Any, Any] = {}  # actor step ref -> the actor it went to
        self.replies: list[tuple[int, slice, Any]] = []  # (actor, rows, reply)
        self.lost: dict[int, BaseException] = {}  # envs whose slot fails, and why


class ActorStepping(ChecksOnSend, ActorSubEnvs):
    """The backend contract of a vector env whose sub-envs run in Ray actors, for either
    kind (:mod:`.kinds`); as :class:`~.vector_env.RayVectorEnv` describes."""

    config: RayConfig
    unit_rows: list[slice]
    _actors: ActorPool
    _kind: GymnasiumRows | AgentRows

    def _start(
        self,
        env_fns: Sequence[Any],
        config: RayConfig | None,
        restart_policy: RestartPolicy | None,
        kind: GymnasiumRows | AgentRows,
    ) -> None:
        """Checks the arguments, starts the actors and takes their description (kills
        them if it is refused)."""
        self._closed_reason = "construction failed"  # until the actors are up
        where = type(self).__name__
        check_env_fns(where, env_fns)
        config = check_config(where, config, RayConfig)
        check_restart_policy(where, restart_policy)
        self.config, self.restart_policy, self._kind = config, restart_policy, kind
        self.num_envs = len(env_fns)
        buckets = config.batch_buckets or ()
        if any(b > self.num_envs for b in buckets):
            raise InvalidArgumentError(
                f"{where}: RayConfig(batch_buckets={buckets}) has a bucket above num_envs="
                f"{self.num_envs}; a policy batch holds at most every env once. Pass buckets "
                f"<= {self.num_envs}."
            )
        ready_first = self.config.ready_first
        self.capabilities = Capabilities(
            can_restart=True,
            steps_in_background=True,
            ready_first=kind.ready_first if ready_first is None else ready_first,
            batch_buckets=self.config.batch_buckets,
            any_order=kind.merge is not None,  # gymnasium envs: answers merged
        )
        actors = ActorPool(
            import_ray(), env_fns, self.config, restart_policy, kind.worker, kind.worker_args
        )
        self._actors, self.unit_rows = actors, actors.unit_rows
        self._in_flight = InFlightSteps(actors.ray, self.config.step_timeout_s)
        self._calls: list[Call] = []  # sends not yet received, in send order
        self._pending: dict[int, BaseException] = {}
        """Envs of replaced actors whose slot has not failed yet, and why: it fails in
        their next send, unstepped."""
        self.num_lost_steps = 0
        """Completed sub-env steps whose results died with their actor (counted where
        the actor shares its marks: on the driver's machine)."""
        self.num_unrun_steps = 0
        """Failed slots of replaced actors' sub-envs that had not started their step."""
        self._fresh: dict[int, Any] = {}
        """Each replaced actor's successor's reset reply, written again to each row as
        it fails (a step the dead actor answered may have been written since)."""
        actors.start(lambda described: kind.describe(self, described, self.unit_rows))
        self._closed_reason = None

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
        """Sends not yet received (ready-first: one per actor)."""
        return len(self._calls)

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> Any:
        """Resets every sub-env; the results of sends not yet received are dropped."""
        self._check_open("reset_batch" if self.multi_agent is True else "reset")
        check_seed_count(seeds, self.num_envs, type(self).__name__)
        self._discard()
        self._pending.clear()  # every sub-env starts afresh from what the caller gets
        actors = self._actors
        refs = [
            actor.reset.remote(list(seeds[rows]), options)
            for actor, rows in zip(actors.actors, self.unit_rows)
        ]
        answers = []
        for u, ref in enumerate(refs):
            try:
                reply = actors.ray.get(ref, timeout=self.config.step_timeout_s)
            except Exception as err:
                cause = actors.remote_error(err, u, "reset")
                if not isinstance(cause, WorkerError):  # raised by a sub-env: as sync does
                    for rest in refs[u + 1 :]:  # the other actors' resets, dropped
                        with contextlib.suppress(Exception):
                            actors.ray.get(rest, timeout=self.config.step_timeout_s)
                    raise cause  # noqa: B904  (remote_error chained the cause)
                reply = actors.replace(u, cause)
            answers.append((self.unit_rows[u], self._kind.put_reset(reply, self.unit_rows[u])))
        return self._kind.reset_result(*self._gather(0, self.num_envs, answers, {}))

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> Any:
        self._check_open("reset_at")
        self._check_idle("reset_at")
        self._check_reset_at(index, seed, options)
        u = index // self.config.envs_per_actor
        unit = self.unit_rows[u]
        try:
            ref = self._actors.actors[u].reset_at.remote(index - unit.start, seed, options)
            reply = self._actors.ray.get(ref, timeout=self.config.step_timeout_s)
        except Exception as err:
            raise self._actors.remote_error(err, u, "reset_at")  # noqa: B904  (chained)
        self._pending.pop(index, None)
        return self._kind.reset_at_result(reply, unit, index)

    def _send_actions(self, actions: Any, env_ids: EnvIds, checked: bool) -> None:
        """Validates the whole batch (unless ``checked``), then starts the step of
        ``env_ids`` (None: every env) and returns without waiting. Lockstep: None or a
        slice. Ready-first: whole actors (a slice or an int array, each actor's sub-envs
        in order), none of them in flight."""
        self._check_open("step")
        if not self.capabilities.ready_first:
            lo, hi = block_rows(env_ids, self.num_envs, type(self).__name__)
            self._send_rows(actions, lo, hi, whole=env_ids is None, checked=checked)
            return
        units = self._whole_actors(env_ids)
        if not checked:
            self._kind.checks[sum(len(at) for _, at in units)](actions)
        busy = self._in_flight.units() & {u for u, _ in units}
        if busy:
            raise InvalidArgumentError(
                f"{type(self).__name__}.send(env_ids={env_ids!r}): Ray env actor {min(busy)} "
                "is still in flight from an earlier send; recv() its result first."
            )
        for u, at in units:
            unit = self.unit_rows[u]
            self._send(unit.start, unit.stop, False, [(u, unit, self._kind.part(actions, at))])

    def recv(self) -> Any:
        """Lockstep: the oldest send's step, once every actor of it has answered.
        Ready-first: the step of the first actor to answer; for gymnasium envs, with
        every other actor that answers within ``config.remote_env_batch_wait_ms`` (then
        ``env_ids`` is an int array). Raises InvalidArgumentError when no send waits."""
        self._check_open("step")
        if not self._calls:
            raise InvalidArgumentError(
                f"{type(self).__name__}.recv(): no send() is waiting for its results. Call "
                "send(actions, env_ids) first."
            )
        if not self.capabilities.ready_first:
            return self._result(self._wait(self._calls[0]))
        calls = [self._wait(None)]
        if self._kind.merge is None:
            return self._result(calls[0])
        try:
            for ref in self._in_flight.ready_within(self.config.remote_env_batch_wait_ms / 1000):
                self._take(ref)
        except Exception:
            self._discard()
            raise
        calls += [call for call in self._calls if not call.steps]
        for call in calls[1:]:
            self._calls.remove(call)
        steps = [self._result(call) for call in calls]
        return steps[0] if len(steps) == 1 else self._kind.merge(steps)

    def step_batch(self, actions: Any, rows: slice | None = None) -> Any:
        """Every env of ``rows`` (None: all; may split actors) steps; returns once every
        actor has answered. Lockstep with sends in flight: :meth:`send` then
        :meth:`recv`, as the base defines it; ready-first: refused then."""
        self._check_open("step")
        if self._calls:  # the oldest send answers (lockstep)
            if self.capabilities.ready_first:
                self._check_idle("step")
            self.send(actions, rows)
            return self.recv()
        lo, hi = block_rows(rows, self.num_envs, type(self).__name__)
        return self._result(self._wait(self._send_rows(actions, lo, hi, rows is None)))

    def _whole_actors(self, env_ids: EnvIds) -> list[tuple[int, np.ndarray]]:
        """The actors ``env_ids`` covers, each with its rows' positions in the send."""
        index = np.atleast_1d(np.arange(self.num_envs)[slice(None) if env_ids is None else env_ids])
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
                f"{type(self).__name__}.send(env_ids={env_ids!r}): ready-first sends expect "
                "None (every env), or a slice or an int array covering whole actors, each "
                f"actor's sub-envs in order; the actors' sub-envs are {self.unit_rows}."
            )
        return units

    def _send_rows(
        self, actions: Any, lo: int, hi: int, whole: bool, checked: bool = False
    ) -> Call:
        """Validates ``actions`` (envs ``[lo, hi)``; unless ``checked``), then sends each
        actor its part."""
        if not checked:
            self._kind.checks[hi - lo](actions)
        parts = []
        for u, unit in enumerate(self.unit_rows):
            start, stop = max(lo, unit.start), min(hi, unit.stop)
            if start < stop:
                part = self._kind.part(actions, slice(start - lo, stop - lo))
                parts.append((u, slice(start, stop), part))
        return self._send(lo, hi, whole, parts)

    def _send(self, lo: int, hi: int, whole: bool, parts: list[tuple[int, slice, Any]]) -> Call:
        """Sends each actor its rows' part, except rows of a replaced actor still to
        fail: their slots fail in this send, unstepped."""
        call = Call(lo, hi, whole)
        for u, rows, part in parts:
            actor, unit = self._actors.actors[u], self.unit_rows[u]
            runs: Iterable[slice] = (rows,)
            if self._pending:
                steps = stepped_runs(rows.start, rows.stop, self._pending, self._unrun, call.lost)
                runs = [slice(*run) for run in steps]
            for run in runs:
                at = slice(run.start - rows.start, run.stop - rows.start)
                mine = part if run == rows else self._kind.part(part, at)
                self._actors.progress.marks[run] = NOT_RUN
                ref = actor.step.remote(run.start - unit.start, run.stop - unit.start, mine)
                self._in_flight.add(ref, u, run, call)
                call.steps[ref] = actor
        self._calls.append(call)
        return call

    def _unrun(self, i: int) -> BaseException:
        """Pending sub-env ``i`` does not step: why its slot fails."""
        self.num_unrun_steps += 1
        return self._pending.pop(i)

    def _wait(self, call: Call | None) -> Call:
        """Waits until send ``call`` (None: any) has every reply; takes it off the list.
        A failure drops every send in flight."""
        try:
            while True:
                for done in self._calls if call is None else [call]:
                    if not done.steps:
                        self._calls.remove(done)
                        return done
                ref = self._in_flight.first_ready()
                if ref is not None:
                    self._take(ref)
                    continue
                for ref, u, rows, owner, cause in list(self._in_flight.pop_expired()):
                    self._lose(ref, u, rows, owner, cause)
        except Exception:
            self._discard()
            raise

    def _take(self, ref: Any) -> None:
        """Actor step ``ref``'s reply, into its send (a dead actor's: lost)."""
        u, rows, call = self._in_flight.pop(ref)
        try:
            reply = self._actors.ray.get(ref)
        except Exception as err:
            cause = self._actors.remote_error(err, u, "step")
            if not isinstance(cause, WorkerError):  # raised by a sub-env
                raise cause  # noqa: B904  (remote_error chained the cause)
            self._lose(ref, u, rows, call, cause)
            return
        del call.steps[ref]
        call.replies.append((u, rows, reply))

    def _lose(self, ref: Any, u: int, rows: slice, call: Call, cause: BaseException) -> None:
        """Actor ``u``'s step ``ref`` (envs ``rows`` of send ``call``) died with its actor:
        the actor is replaced (its reset written to all of its rows, which are pending
        from then on) unless a step of another send already replaced it; the envs' slots
        fail with ``cause``, each counted lost, unrun or (the one under way) neither."""
        lost, unrun = self._actors.progress.count(u, rows)
        self.num_lost_steps += lost
        self.num_unrun_steps += unrun
        if call.steps.pop(ref) is self._actors.actors[u]:
            if self.restart_policy is None and not isinstance(cause, WorkerError):
                self._actors.kill(self._actors.actors[u])
                raise cause  # a missed deadline
            unit = self.unit_rows[u]
            reset = self._fresh[u] = self._actors.replace(u, cause)  # raises without a policy
            # Its rows show the new sub-envs at once (as a process worker's shared memory).
            self._kind.put_reset(reset, unit)
            self._pending.update(dict.fromkeys(range(unit.start, unit.stop), cause))
        for i in range(rows.start, rows.stop):
            self._pending.pop(i, None)
            call.lost[i] = cause

    def _result(self, call: Call) -> Any:
        """Send ``call``'s replies written to the buffers; its step."""
        answers = [(rows, self._kind.put(reply, rows)) for _, rows, reply in call.replies]
        lo, hi = call.lo, call.hi
        return self._kind.step(lo, hi, call.whole, *self._gather(lo, hi, answers, call.lost))

    def _gather(
        self, lo: int, hi: int, answers: list[tuple[slice, Answer]], lost: dict[int, BaseException]
    ) -> tuple[list[dict[str, Any]], dict, np.ndarray | None, dict | None]:
        """The infos, reset infos, failed mask and errors of envs ``[lo, hi)`` from their
        actors' answers and the envs ``lost`` with their actor (whose slots fail here)."""
        infos: list[dict[str, Any]] = [{} for _ in range(hi - lo)]
        reset_infos: dict[int, dict[str, Any]] = {}
        failed = np.zeros(hi - lo, np.bool_)
        errors: dict[int, BaseException] = {i: e for i, e in lost.items() if lo <= i < hi}
        for rows, answer in answers:
            infos[rows.start - lo : rows.stop - lo] = answer.infos
            if answer.failed is not None:
                failed[rows.start - lo : rows.stop - lo] = answer.failed
            errors.update(answer.errors)
            reset_infos.update(answer.reset_infos)
        per = self.config.envs_per_actor
        for i in lost:
            if lo <= i < hi:
                failed[i - lo] = True
                self._kind.fail(i, self._fresh[i // per], i % per)
        return infos, reset_infos, failed if failed.any() else None, errors or None

    def _discard(self) -> None:
        self._in_flight.discard()
        self._calls.clear()

    def _check_idle(self, what: str) -> None:
        if self._calls:
            raise InvalidArgumentError(
                f"{type(self).__name__}.{what}(): {len(self._calls)} sends are in flight; "
                "recv() until num_in_flight is 0 first."
            )

    def _close_backend(self) -> None:
        self._actors.close()
        self._in_flight.clear()
        self._calls.clear()

"""EnvRunnerGroup: the runner actors, sampling, weight and statistics sync, restarts."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import gymnasium
import jax

from jaxrunner._src.arg_checks import check_number
from jaxrunner._src.backends.ray import import_ray
from jaxrunner._src.connectors.moments import Moments, merge_all
from jaxrunner._src.core.policy import Params
from jaxrunner._src.core.time_major import concatenate_envs
from jaxrunner._src.core.trajectory import Trajectory
from jaxrunner._src.services.distributed.config import EnvRunnerGroupConfig, PolicyFactory
from jaxrunner._src.services.distributed.group_metrics import aggregate_metrics
from jaxrunner._src.services.distributed.worker import RunnerWorker
from jaxrunner.errors import (
    ClosedError,
    InvalidArgumentError,
    RemoteTimeoutError,
    RunnerFailedError,
)


@dataclasses.dataclass
class _Slot:
    """One runner position: its current actor and how it is doing."""

    index: int
    actor: Any
    incarnation: int
    ready_ref: Any  # None once the actor answered ready()
    failures: list[str] = dataclasses.field(default_factory=list)
    given_up: bool = False  # failed with max_restarts used: down for good

    @property
    def healthy(self) -> bool:
        return self.ready_ref is None and not self.given_up


class EnvRunnerGroup:
    """N :class:`~jaxrunner.EnvRunner` s as Ray actors (see docs/distributed.md).

    Args:
        env: a gymnasium id, or a picklable zero-argument factory of a gymnasium.Env
            or of a PettingZoo env (each runner is then a
            :class:`~jaxrunner.EnvRunner`).
        policy_factory: a picklable callable ``(single_action_space) -> Policy`` (e.g.
            ``functools.partial(jaxrunner.models.mlp_policy, hidden=(64, 64))``); for a
            multi-agent env, called with each agent group's action space.
        params: the initial params (any pytree of arrays; sent once via ``ray.put``);
            for a multi-agent env, a dict by policy id, as :meth:`set_params` takes too.
        config: :class:`EnvRunnerGroupConfig`.

    Ray must be importable; ``ray.init(...)`` first to choose the cluster (otherwise
    Ray starts a local instance).
    """

    def __init__(
        self,
        env: str | Callable[[], gymnasium.Env],
        policy_factory: PolicyFactory,
        params: Params,
        config: EnvRunnerGroupConfig | None = None,
    ) -> None:
        self.config = EnvRunnerGroupConfig() if config is None else config
        if not isinstance(self.config, EnvRunnerGroupConfig):
            raise InvalidArgumentError(
                f"EnvRunnerGroup(config=...): expected an EnvRunnerGroupConfig, got {config!r}."
            )
        if not (isinstance(env, str) or callable(env)) or not callable(policy_factory):
            raise InvalidArgumentError(
                "EnvRunnerGroup(env, policy_factory, ...): expected a gymnasium id or env "
                "factory and a callable (single_action_space) -> Policy, got "
                f"{type(env).__name__} and {type(policy_factory).__name__}."
            )
        self._ray = import_ray()
        self._env, self._policy_factory = env, policy_factory
        self._params_ref = self._ray.put(jax.device_get(params))
        self._params_version = 0
        self._params_keys = set(params) if isinstance(params, Mapping) else set()
        self._statistics: list[Moments] | None = None
        self._closed = False
        self.num_restarts = 0
        """Runners replaced so far."""
        self.num_env_steps_sampled = 0
        """Valid transitions returned by :meth:`sample` so far."""
        self._remote_cls = self._ray.remote(RunnerWorker).options(
            num_cpus=self.config.num_cpus_per_runner, num_gpus=self.config.num_gpus_per_runner
        )
        self._slots = [self._start(i, 0) for i in range(self.config.num_runners)]
        try:
            self.wait_until_healthy(self.config.start_timeout_s, all_runners=True)
        except BaseException:
            self.stop()
            raise

    # -- public API ---------------------------------------------------------------------------

    @property
    def runner_actors(self) -> list[Any]:
        """The current Ray actor handle of each runner."""
        return [slot.actor for slot in self._slots]

    @property
    def healthy_runners(self) -> list[int]:
        """Indices of the runners that are up (started and not known to have failed);
        none after :meth:`stop`."""
        if self._closed:  # killed: polling them would restart (or blame) them
            return []
        return [slot.index for slot in self._healthy_slots(block=False)]

    def sample(self, concat: bool = True) -> Trajectory | list[Trajectory]:
        """One ``sample()`` of every healthy runner, run in parallel.

        Args:
            concat: join the trajectories along the env axis (``[T, n * answered]``);
                False returns them as a list, one per runner that answered, in runner
                order (read ``env_id`` to tell them apart).

        A runner that dies, raises or misses ``sample_timeout_s`` is replaced (in the
        background) and left out of this result; restored runners join the next calls
        once started. Blocks for restored runners only when none is healthy. Once
        ``max_restarts`` are used, a failed runner stays down and ``RunnerFailedError``
        carries the others' samples in ``partial_trajectory``.
        """
        self._check_open("sample")
        slots = self._healthy_slots()
        calls = [(slot, slot.actor.sample_with_statistics.remote()) for slot in slots]
        # RayError: also an env error Ray could not unpickle (UnserializableException).
        answers = list(self._answers(calls, "sample", self._ray.exceptions.RayError))
        # The failed are replaced after the merge: they start from it.
        failed = [(slot, why) for slot, _, why in answers if why is not None]
        answered = [answer for _, answer, why in answers if why is None]
        results, deltas = [a[0] for a in answered], [a[1] for a in answered]
        if deltas and deltas[0]:  # connectors with statistics: merged in runner order, exactly
            self._statistics = _merged(self._statistics, deltas)
        self.num_env_steps_sampled += sum(a[2] for a in answered)
        traj = (concatenate_envs(results) if concat else results) if results else None
        gave_up = self._restart_failed(failed)
        if gave_up is not None:  # max_restarts used: the samples go with it
            gave_up.partial_trajectory = traj
            raise gave_up
        if traj is None:
            raise RunnerFailedError(
                f"EnvRunnerGroup.sample(): none of the runners {[s.index for s in slots]} returned "
                "a sample (each was replaced; see get_metrics()['runner_failures']). Check the "
                "env and the runners' logs, or raise sample_timeout_s."
            )
        return traj

    @property
    def connector_statistics(self) -> list[Moments] | None:
        """The connectors' statistics merged over every runner's samples so far (None
        before the first sample or without connectors); :meth:`set_params` sends them
        to every runner with the weights."""
        return self._statistics

    def set_params(self, params: Params) -> None:
        """Sends new params to every runner: one ``ray.put``, one reference for all.
        Returns once every healthy runner has them; runners being restored get them
        too (queued), and later restarts start from them."""
        self._check_open("set_params")
        ray = self._ray
        ref = ray.put(jax.device_get(params))
        old = self._params_ref, self._params_version
        full = ref  # what restarts start from: with some policy ids, every policy's latest
        if isinstance(params, Mapping) and set(params) < self._params_keys:
            full = ray.put({**ray.get(old[0]), **jax.device_get(params)})
        self._params_ref, self._params_version = full, old[1] + 1
        version = self._params_version
        stats = None if self._statistics is None else ray.put(jax.device_get(self._statistics))
        calls = [(slot, slot.actor.set_params.remote(ref, version, stats)) for slot in self._slots]
        healthy = [call for call in calls if call[0].healthy]
        failed: list[tuple[_Slot, str]] = []
        refused: BaseException | None = None
        try:
            for slot, _, why in self._answers(healthy, "set_params", ray.exceptions.RayActorError):
                if why is not None:
                    failed.append((slot, why))
        except ray.exceptions.RayTaskError as err:  # bad params: the caller's to fix
            # Before any restart: the failed runners start from the params the others kept.
            self._params_ref, self._params_version = old
            refused = err
        for slot, why in failed:
            self._restart(slot, why)
        if refused is None:
            return
        cause = getattr(refused, "cause", None)
        if not isinstance(cause, Exception):
            raise refused
        cause.add_note(
            "(EnvRunnerGroup.set_params(): raised by a runner's own set_params; the group "
            "and its runners keep their old params.)"
        )
        raise cause from refused

    @property
    def params_version(self) -> int:
        """How many times :meth:`set_params` succeeded."""
        return self._params_version

    def get_metrics(self) -> dict[str, Any]:
        """Sums (steps, episodes, faults, steps/s; multi-agent: agent steps and
        unassigned reward too), means over runners (episode return and length, perf
        timers), and the group's own: runners up, restarts, params versions, and each
        runner's metrics under ``runners``. A runner's counters
        start again from 0 when it is replaced; ``num_env_steps_sampled`` does not. A
        runner that dies, raises or misses ``sample_timeout_s`` is left out and replaced,
        as :meth:`sample` does (``RunnerFailedError`` once ``max_restarts`` are used)."""
        self._check_open("get_metrics")
        calls = [(s, s.actor.get_metrics.remote()) for s in self._healthy_slots(block=False)]
        # RayError: a runner's own error too (RayTaskError), as sample() takes it.
        answers = list(self._answers(calls, "get_metrics", self._ray.exceptions.RayError))
        failed = [(slot, why) for slot, _, why in answers if why is not None]
        per_runner = {slot.index: metrics for slot, metrics, why in answers if why is None}
        gave_up = self._restart_failed(failed)
        if gave_up is not None:
            raise gave_up
        return aggregate_metrics(per_runner) | {
            "num_runners": self.config.num_runners,
            "num_healthy_runners": len(self.healthy_runners),
            "num_runner_restarts": self.num_restarts,
            "num_env_steps_sampled": self.num_env_steps_sampled,
            "params_version": self._params_version,
            "runner_params_versions": {i: m["params_version"] for i, m in per_runner.items()},
            "runner_failures": {s.index: list(s.failures) for s in self._slots if s.failures},
            "runners": per_runner,
        }

    def wait_until_healthy(self, timeout_s: float, all_runners: bool = True) -> None:
        """Blocks until every runner (or, with ``all_runners=False``, at least one) is up.

        Raises:
            RemoteTimeoutError: not within ``timeout_s``.
            ClosedError: after :meth:`stop`.
        """
        self._check_open("wait_until_healthy")
        where = "EnvRunnerGroup.wait_until_healthy"
        deadline = time.monotonic() + check_number(where, "timeout_s", timeout_s, hint="seconds")
        while True:
            self._poll_restored()
            down = [s for s in self._slots if not s.healthy]
            if not down or (len(down) < len(self._slots) and not all_runners):
                return
            lost = [s.index for s in down if s.given_up]
            if lost and (all_runners or len(lost) == len(down)):
                raise RunnerFailedError(
                    f"EnvRunnerGroup: runners {lost} failed after the group used its max_restarts="
                    f"{self.config.max_restarts}; see get_metrics()['runner_failures']."
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemoteTimeoutError(
                    f"EnvRunnerGroup: runners {[s.index for s in down]} "
                    f"did not start within {timeout_s}s. Each asks for num_cpus="
                    f"{self.config.num_cpus_per_runner}, num_gpus={self.config.num_gpus_per_runner}"
                    f" (available: {self._ray.available_resources()}); lower them or add nodes."
                )
            starting = [s.ready_ref for s in down if not s.given_up]
            self._ray.wait(starting, num_returns=1, timeout=left)

    def stop(self) -> None:
        """Stops every runner (closing its envs) and kills the actors."""
        if self._closed:
            return
        self._closed = True
        ray = self._ray
        with contextlib.suppress(Exception):  # dead or stuck runners: killed below
            ray.get([s.actor.stop.remote() for s in self._slots], timeout=10)
        for slot in self._slots:
            _kill(ray, slot.actor)

    def close(self) -> None:
        """:meth:`stop` (the name ``EnvRunner`` and gymnasium's envs answer to as well)."""
        self.stop()

    def __enter__(self) -> EnvRunnerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------------------------

    def _start(self, index: int, incarnation: int, failures: Sequence[str] = ()) -> _Slot:
        actor = self._remote_cls.remote(
            self._env,
            self._policy_factory,
            self._params_ref,
            self._params_version,
            self.config,
            index,
            incarnation,
            # The latest merged statistics, broadcast or not yet.
            None if self._statistics is None else self._ray.put(jax.device_get(self._statistics)),
        )
        return _Slot(index, actor, incarnation, actor.ready.remote(), list(failures))

    def _restart(self, slot: _Slot, why: str) -> None:
        """Kills ``slot``'s actor and starts its next incarnation (in the background)."""
        _kill(self._ray, slot.actor)
        slot.failures.append(f"incarnation {slot.incarnation}: {why}")
        if self.num_restarts >= self.config.max_restarts:
            slot.given_up = True
            raise RunnerFailedError(
                f"EnvRunnerGroup: runner {slot.index} failed ({why}) and the group has used its "
                f"max_restarts={self.config.max_restarts}. Failures: {slot.failures}"
            )
        self.num_restarts += 1
        self._slots[slot.index] = self._start(slot.index, slot.incarnation + 1, slot.failures)

    def _restart_failed(self, failed: list[tuple[_Slot, str]]) -> RunnerFailedError | None:
        """Replaces each failed runner, or gives it up (``max_restarts`` used); returns
        the first give-up, raised by the caller once every runner is handled."""
        gave_up = None
        for slot, why in failed:
            try:
                self._restart(slot, why)
            except RunnerFailedError as err:
                gave_up = gave_up or err
        return gave_up

    def _poll_restored(self) -> None:
        """Marks runners whose start finished as healthy (restarting those that failed)."""
        pending = [s for s in self._slots if not s.healthy and not s.given_up]
        if not pending:
            return
        done, _ = self._ray.wait(
            [s.ready_ref for s in pending], num_returns=len(pending), timeout=0
        )
        for slot in pending:
            if slot.ready_ref in done:
                try:
                    self._ray.get(slot.ready_ref)
                except Exception as err:  # the runner's constructor raised or it died
                    if slot.incarnation == 0:  # a bad config: no point restarting
                        raise RunnerFailedError(
                            f"EnvRunnerGroup: runner {slot.index} failed to start: {err}"
                        ) from err
                    self._restart(slot, f"failed to start: {err}")
                    continue
                slot.ready_ref = None

    def _answers(
        self, calls: list[tuple[_Slot, Any]], what: str, errors: type[Exception]
    ) -> Iterator[tuple[_Slot, Any, str | None]]:
        """The answers to ``calls`` (``(slot, ref)``), awaited for ``sample_timeout_s`` at
        most: ``(slot, result, None)``, or ``(slot, None, why)`` where the slot was late or
        raised one of ``errors``; other errors propagate."""
        timeout = self.config.sample_timeout_s
        refs = [ref for _, ref in calls]
        done = set(self._ray.wait(refs, num_returns=len(refs), timeout=timeout)[0])
        for slot, ref in calls:
            if ref not in done:
                yield slot, None, f"no answer to {what}() within sample_timeout_s={timeout}"
                continue
            try:
                yield slot, self._ray.get(ref), None
            except errors as err:
                yield slot, None, f"{what}() failed: {err}"

    def _healthy_slots(self, block: bool = True) -> list[_Slot]:
        self._poll_restored()
        if block and not any(s.healthy for s in self._slots):
            self.wait_until_healthy(self.config.start_timeout_s, all_runners=False)
        return [s for s in self._slots if s.healthy]

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ClosedError(
                f"EnvRunnerGroup.{what}() called after stop(); create a new EnvRunnerGroup."
            )


def _merged(statistics: Any, deltas: list[Any]) -> Any:
    """The group's statistics with the runners' new ones merged in (in runner order);
    a multi-agent group's per policy id."""
    if isinstance(deltas[0], dict):
        base = statistics or {}
        return {pid: _merged(base.get(pid), [delta[pid] for delta in deltas]) for pid in deltas[0]}
    return merge_all([*([] if statistics is None else [statistics]), *deltas])


def _kill(ray: Any, actor: Any) -> None:
    with contextlib.suppress(Exception):  # already dead, or Ray shut down
        ray.kill(actor, no_restart=True)

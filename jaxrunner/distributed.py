"""EnvRunnerGroup: N EnvRunners as Ray actors, with weight sync and fault tolerance.

Each runner is built inside its actor from picklable factories (an env id or factory,
a policy factory and the params), so nothing unpicklable crosses a process or machine.
``sample()`` asks every healthy runner at once and gathers what they return;
``set_params()`` puts the new weights in Ray's object store once and hands every
runner the same reference. A runner that dies, raises, or does not answer within
``sample_timeout_s`` is killed and replaced by a new one (with the latest weights)
while the group goes on sampling from the others.

Ids. Runner ``i`` (of ``N``, ``n`` envs each) reports env ids ``i*n .. i*n+n-1``.
Its ``k``-th incarnation (0 at first, +1 per restart) uses seed
``seed + (k*N + i) * n``: no two runners or incarnations share a seed, so their sub-envs'
reset seeds (:func:`jaxrunner.env_seeds`) are unrelated blocks that do not overlap, and
its episode ids are ``((k*N + i) << 40) + local id``:
unique across runners and restarts.

Connector statistics (``runner_options={"connectors": ...}``, e.g. observation
normalization). Each runner reports the statistics it gathered in a sample beside the
sample; the group merges them exactly (parallel variance, in runner order) into one
global set, and :meth:`EnvRunnerGroup.set_params` broadcasts it with the weights, so
every runner then normalizes with the statistics of every runner's observations. A
restarted runner starts from the merged statistics.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium
import jax
import numpy as np

from jaxrunner.connectors.moments import Moments, merge_all, set_statistics, take_deltas
from jaxrunner.envs import ProcessConfig, RayConfig, check_vec_options, make_vec
from jaxrunner.envs.ray import import_ray
from jaxrunner.errors import InvalidArgumentError, RemoteTimeoutError, RunnerFailedError
from jaxrunner.faults import RestartPolicy
from jaxrunner.policy import Params, Policy
from jaxrunner.sampling import EnvRunner
from jaxrunner.trajectory import Trajectory

EPISODE_ID_BITS = 40
"""Low bits of a group episode id that hold the runner-local id."""

PolicyFactory = Callable[[gymnasium.Space], Policy]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvRunnerGroupConfig:
    """What each runner of an :class:`EnvRunnerGroup` runs, and where."""

    num_runners: int = 2
    """Runners (Ray actors)."""
    num_envs_per_runner: int = 8
    """Sub-envs of each runner's vector env."""
    rollout_length: int = 128
    """T of every runner's ``sample()``."""
    seed: int = 0
    """Base seed (see the module docstring for each runner's)."""
    backend: str = "sync"
    """Each runner's ``make_vec`` backend."""
    env_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments for the env (``gymnasium.make``), passed untouched."""
    vec_config: ProcessConfig | RayConfig | None = None
    """The backend's options (``make_vec(config=...)``): a ProcessConfig for
    ``backend="process"``, a RayConfig for ``"ray"``; None: its defaults."""
    restart_policy: RestartPolicy | None = None
    """How each runner's envs recreate failed sub-envs (``make_vec(restart_policy=...)``);
    None: a failure fails the runner (which the group then replaces)."""
    runner_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments for :class:`~jaxrunner.EnvRunner` (
    ``metrics``, ``num_groups``...)."""
    num_cpus_per_runner: float = 1.0
    """Ray CPU resources each runner reserves."""
    num_gpus_per_runner: float = 0.0
    """Ray GPU resources each runner reserves (fractions share a GPU); JAX in the actor
    then sees the GPU Ray assigned."""
    sample_timeout_s: float | None = None
    """A runner that has not returned a sample (or acknowledged new params) after this
    long is treated as failed: killed and replaced. None: wait forever."""
    start_timeout_s: float = 300.0
    """How long to wait for a runner to start (import, build its envs, compile)."""
    max_restarts: int = 100
    """Runner restarts the group allows in all, before it gives up and raises."""

    def __post_init__(self) -> None:
        check_vec_options(self.backend, self.vec_config, self.restart_policy)
        for name in ("num_runners", "num_envs_per_runner", "rollout_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(
                    f"EnvRunnerGroupConfig({name}={value!r}): expected an int >= 1."
                )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise InvalidArgumentError(
                f"EnvRunnerGroupConfig(seed={self.seed!r}): expected an int >= 0."
            )
        for name in ("num_cpus_per_runner", "num_gpus_per_runner"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InvalidArgumentError(
                    f"EnvRunnerGroupConfig({name}={value!r}): expected a number >= 0."
                )
        for name in ("sample_timeout_s", "start_timeout_s"):
            value = getattr(self, name)
            if value is None and name == "sample_timeout_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise InvalidArgumentError(
                    f"EnvRunnerGroupConfig({name}={value!r}): expected a number of seconds > 0."
                )
        if (
            isinstance(self.max_restarts, bool)
            or not isinstance(self.max_restarts, int)
            or (self.max_restarts < 0)
        ):
            raise InvalidArgumentError(
                f"EnvRunnerGroupConfig(max_restarts={self.max_restarts!r}): expected an int >= 0."
            )

    def runner_seed(self, index: int, incarnation: int) -> int:
        """The seed of runner ``index``'s ``incarnation``-th instance."""
        return self.seed + (incarnation * self.num_runners + index) * self.num_envs_per_runner


class RunnerWorker:
    """The body of one runner actor: an :class:`~jaxrunner.EnvRunner` whose output
    carries group-wide env and episode ids."""

    def __init__(
        self,
        env: str | Callable[[], gymnasium.Env],
        policy_factory: PolicyFactory,
        params: Params,
        params_version: int,
        config: EnvRunnerGroupConfig,
        index: int,
        incarnation: int,
        statistics: list[Moments] | None = None,
    ) -> None:
        n = config.num_envs_per_runner
        envs = make_vec(
            env,
            n,
            config.backend,
            config=config.vec_config,
            restart_policy=config.restart_policy,
            **dict(config.env_options),
        )
        policy = policy_factory(envs.single_action_space)
        self.runner = EnvRunner(
            envs,
            policy,
            params,
            config.rollout_length,
            config.runner_seed(index, incarnation),
            **dict(config.runner_options),
        )
        self.params_version = params_version
        if statistics is not None:  # a restart: start from the group's merged statistics
            self.set_statistics(statistics)
        self._env_offset = index * n
        self._id_offset = (incarnation * config.num_runners + index) << EPISODE_ID_BITS

    def ready(self) -> bool:
        return True

    def sample(self) -> Trajectory:
        traj = self.runner.sample()
        return traj.replace(
            env_id=np.asarray(traj.env_id) + self._env_offset,
            episode_id=np.asarray(traj.episode_id) + self._id_offset,
        )

    def sample_with_statistics(self) -> tuple[Trajectory, list[Moments]]:
        """A sample, and the connector statistics gathered since the last call (taken
        out of the runner's state, so each is reported to the group once)."""
        traj = self.sample()
        if self.runner.connectors is None:
            return traj, []
        state, deltas = take_deltas(self.runner.get_connector_state())
        self.runner.set_connector_state(state)
        return traj, deltas

    def set_statistics(self, statistics: list[Moments]) -> None:
        state = self.runner.get_connector_state()
        self.runner.set_connector_state(set_statistics(state, statistics))

    def get_connector_state(self) -> Any:
        return self.runner.get_connector_state()

    def set_params(
        self, params: Params, version: int, statistics: list[Moments] | None = None
    ) -> int:
        self.runner.set_params(params)
        if statistics is not None:
            self.set_statistics(statistics)
        self.params_version = version
        return version

    def get_params(self) -> tuple[Params, int]:
        return jax.device_get(self.runner.get_params()), self.params_version

    def get_metrics(self) -> dict[str, Any]:
        return {**self.runner.get_metrics(), "params_version": self.params_version}

    def stop(self) -> None:
        self.runner.stop()


@dataclasses.dataclass
class _Slot:
    """One runner position: its current actor and how it is doing."""

    index: int
    actor: Any
    incarnation: int
    ready_ref: Any  # None once the actor answered ready()
    failures: list[str] = dataclasses.field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.ready_ref is None


def concatenate_envs(trajectories: list[Trajectory]) -> Trajectory:
    """Joins trajectories of the same T along the env axis (``[T, B1 + B2 + ...]``)."""
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *trajectories)


class EnvRunnerGroup:
    """N :class:`~jaxrunner.EnvRunner` s as Ray actors (see the module docstring).

    Args:
        env: a gymnasium id, or a picklable zero-argument factory of a gymnasium.Env.
        policy_factory: a picklable callable ``(single_action_space) -> Policy`` (e.g.
            ``functools.partial(jaxrunner.bench.mlp_policy, hidden=(64, 64))``).
        params: the initial params (any pytree of arrays; sent once via ``ray.put``).
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
        self.config = config or EnvRunnerGroupConfig()
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
        self._statistics: list[Moments] | None = None
        self._statistics_ref: Any = None
        self._closed = False
        self.num_restarts = 0
        """Runners replaced so far."""
        self.num_env_steps_sampled = 0
        """Valid transitions returned by :meth:`sample` so far."""
        options = {
            "num_cpus": self.config.num_cpus_per_runner,
            "num_gpus": self.config.num_gpus_per_runner,
        }
        self._remote_cls = self._ray.remote(RunnerWorker).options(**options)
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
        """Indices of the runners that are up (started and not known to have failed)."""
        self._poll_restored()
        return [slot.index for slot in self._slots if slot.healthy]

    def sample(self, concat: bool = True) -> Trajectory | list[Trajectory]:
        """One ``sample()`` of every healthy runner, run in parallel.

        Args:
            concat: join the trajectories along the env axis (``[T, n * answered]``);
                False returns them as a list, one per runner that answered, in runner
                order (read ``env_id`` to tell them apart).

        A runner that dies, raises or misses ``sample_timeout_s`` is replaced (in the
        background) and left out of this result; restored runners join the next calls
        once started. Blocks for restored runners only when none is healthy.
        """
        self._check_open("sample")
        ray = self._ray
        slots = self._healthy_slots()
        refs = [slot.actor.sample_with_statistics.remote() for slot in slots]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=self.config.sample_timeout_s)
        finished = set(done)
        results: list[Trajectory] = []
        deltas: list[list[Moments]] = []
        failed: list[tuple[_Slot, str]] = []  # replaced after the merge: they start from it
        for slot, ref in zip(slots, refs):
            if ref not in finished:
                failed.append(
                    (slot, f"no sample within sample_timeout_s={self.config.sample_timeout_s}")
                )
                continue
            try:
                traj, delta = ray.get(ref)
                results.append(traj)
                deltas.append(delta)
            # RayError: also an env error Ray could not unpickle (UnserializableException).
            except ray.exceptions.RayError as err:
                failed.append((slot, f"sample() failed: {err}"))
        if deltas and deltas[0]:  # connectors with statistics: merged in runner order, exactly
            base = [] if self._statistics is None else [self._statistics]
            self._statistics = merge_all([*base, *deltas])
        for slot, why in failed:
            self._restart(slot, why)
        if not results:
            raise RunnerFailedError(
                f"EnvRunnerGroup.sample(): none of the runners {[s.index for s in slots]} returned "
                "a sample (each was replaced; see get_metrics()['runner_failures']). Check the "
                "env and the runners' logs, or raise sample_timeout_s."
            )
        self.num_env_steps_sampled += sum(int(np.sum(t.valid)) for t in results)
        return concatenate_envs(results) if concat else results

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
        self._params_ref = ray.put(jax.device_get(params))
        self._params_version += 1
        version = self._params_version
        if self._statistics is not None:
            self._statistics_ref = ray.put(jax.device_get(self._statistics))
        stats = self._statistics_ref
        refs = [
            slot.actor.set_params.remote(self._params_ref, version, stats) for slot in self._slots
        ]
        waiting = [ref for slot, ref in zip(self._slots, refs) if slot.healthy]
        done, _ = ray.wait(waiting, num_returns=len(waiting), timeout=self.config.sample_timeout_s)
        finished = set(done)
        for slot, ref in zip(list(self._slots), refs):
            if not slot.healthy:
                continue
            if ref not in finished:
                self._restart(slot, "no answer to set_params() within sample_timeout_s")
                continue
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as err:
                self._restart(slot, f"died during set_params(): {err}")
            except ray.exceptions.RayTaskError as err:  # bad params: the caller's to fix
                cause = getattr(err, "cause", None)
                raise (cause if isinstance(cause, Exception) else err) from err

    @property
    def params_version(self) -> int:
        """How many times :meth:`set_params` was called."""
        return self._params_version

    def get_metrics(self) -> dict[str, Any]:
        """Sums (steps, episodes, faults, steps/s), means over runners (episode return
        and length, perf timers), and the group's own: runners up, restarts, params
        versions, and each runner's metrics under ``runners``. A runner's counters
        start again from 0 when it is replaced; ``num_env_steps_sampled`` does not."""
        self._check_open("get_metrics")
        ray = self._ray
        slots = self._healthy_slots(block=False)
        refs = [slot.actor.get_metrics.remote() for slot in slots]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=self.config.sample_timeout_s)
        per_runner: dict[int, dict[str, Any]] = {}
        for slot, ref in zip(slots, refs):
            try:
                if ref not in done:
                    raise RemoteTimeoutError("no answer within sample_timeout_s")
                per_runner[slot.index] = ray.get(ref)
            except (ray.exceptions.RayActorError, RemoteTimeoutError) as err:
                self._restart(slot, f"get_metrics() failed: {err}")
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
        """
        deadline = time.monotonic() + timeout_s
        while True:
            self._poll_restored()
            up = [s for s in self._slots if s.healthy]
            if len(up) == len(self._slots) or (up and not all_runners):
                return
            pending = [s.ready_ref for s in self._slots if not s.healthy]
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemoteTimeoutError(
                    f"EnvRunnerGroup: runners {[s.index for s in self._slots if not s.healthy]} "
                    f"did not start within {timeout_s}s. Each asks for num_cpus="
                    f"{self.config.num_cpus_per_runner}, num_gpus={self.config.num_gpus_per_runner}"
                    f" (available: {self._ray.available_resources()}); lower them or add nodes."
                )
            self._ray.wait(pending, num_returns=1, timeout=left)

    def stop(self) -> None:
        """Stops every runner (closing its envs) and kills the actors."""
        if self._closed:
            return
        self._closed = True
        ray = self._ray
        try:  # noqa: SIM105
            ray.get([s.actor.stop.remote() for s in self._slots], timeout=10)
        except Exception:  # dead or stuck runners: killed below
            pass
        for slot in self._slots:
            _kill(ray, slot.actor)

    def __enter__(self) -> EnvRunnerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------------------------

    def _start(self, index: int, incarnation: int) -> _Slot:
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
        return _Slot(index, actor, incarnation, actor.ready.remote())

    def _restart(self, slot: _Slot, why: str) -> None:
        """Kills ``slot``'s actor and starts its next incarnation (in the background)."""
        _kill(self._ray, slot.actor)
        slot.failures.append(f"incarnation {slot.incarnation}: {why}")
        if self.num_restarts >= self.config.max_restarts:
            raise RunnerFailedError(
                f"EnvRunnerGroup: runner {slot.index} failed ({why}) and the group has used its "
                f"max_restarts={self.config.max_restarts}. Failures: {slot.failures}"
            )
        self.num_restarts += 1
        new = self._start(slot.index, slot.incarnation + 1)
        self._slots[slot.index] = new
        new.failures = slot.failures

    def _poll_restored(self) -> None:
        """Marks runners whose start finished as healthy (restarting those that failed)."""
        pending = [s for s in self._slots if not s.healthy]
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

    def _healthy_slots(self, block: bool = True) -> list[_Slot]:
        self._poll_restored()
        if block and not any(s.healthy for s in self._slots):
            self.wait_until_healthy(self.config.start_timeout_s, all_runners=False)
        return [s for s in self._slots if s.healthy]

    def _check_open(self, what: str) -> None:
        if self._closed:
            from jaxrunner.errors import ClosedError

            raise ClosedError(
                f"EnvRunnerGroup.{what}() called after stop(); create a new EnvRunnerGroup."
            )


def aggregate_metrics(per_runner: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Group metrics from runners' ``get_metrics()``: counters and rates summed (the
    runners run in parallel), episode statistics and perf timers averaged."""
    runs = list(per_runner.values())
    if not runs:
        return {}
    summed = ("num_env_steps", "num_episodes", "num_faulty_episodes", "num_dropped_steps")
    out: dict[str, Any] = {key: sum(int(m.get(key, 0)) for m in runs) for key in summed}
    out["env_steps_per_s"] = float(sum(m.get("env_steps_per_s", 0.0) for m in runs))
    with np.errstate(all="ignore"):
        for key, fn in (
            ("episode_return_mean", np.nanmean),
            ("episode_length_mean", np.nanmean),
            ("episode_return_min", np.nanmin),
            ("episode_return_max", np.nanmax),
        ):
            values = [m.get(key, float("nan")) for m in runs]
            out[key] = float(fn(values)) if not np.all(np.isnan(values)) else float("nan")
    perf_keys = set().union(*(m.get("perf", {}) for m in runs))
    out["perf"] = {
        k: float(np.mean([m["perf"][k] for m in runs if k in m.get("perf", {})]))
        for k in sorted(perf_keys)
    }
    return out


def _kill(ray: Any, actor: Any) -> None:
    try:  # noqa: SIM105
        ray.kill(actor, no_restart=True)
    except Exception:  # already dead, or Ray shut down
        pass


__all__ = [
    "EPISODE_ID_BITS",
    "EnvRunnerGroup",
    "EnvRunnerGroupConfig",
    "RunnerWorker",
    "aggregate_metrics",
    "concatenate_envs",
]

"""``backend="ray"``: sub-envs in Ray actors, stepped at their own pace.

The sub-envs are split into consecutive blocks (``envs_per_actor`` each); every block
runs in one Ray actor as a :class:`~jaxrunner.SyncVectorEnv`, so validation, SAME_STEP
autoreset and sub-env restarts work exactly as in-process. The actor is the unit of
work: its sub-envs step together, and every actor steps concurrently with the others.

Two ways to drive it:

* the :class:`~jaxrunner.envs.base.VectorEnv` contract (``step_batch``): every actor
  steps, and the call returns when all have answered;
* dynamic batching (``dynamic_batching = True``; :mod:`jaxrunner.dynamic`, which
  :class:`~jaxrunner.EnvRunner` uses): :meth:`RayVectorEnv.send` starts one actor's
  step and :meth:`RayVectorEnv.poll` returns the actors that have finished, so the
  policy runs for whichever envs are ready. Autoresets run inside each actor's step,
  concurrently with the other actors: no reset ever blocks another actor.

An actor that dies (its process crashed or was ``ray.kill``-ed) or does not answer
within ``step_timeout_s`` is killed and replaced by a new one made from the same
factories, if a ``restart_policy`` is set (``EnvRunner(restart_failed_sub_envs=True)``):
its sub-envs' in-flight step yields no transition (``BatchStep.failed``) and their
episodes end as faulty, exactly as an in-process sub-env failure. Without a policy the
failure raises :class:`~jaxrunner.errors.WorkerError`.
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import gymnasium
import numpy as np
from gymnasium.vector.utils import batch_space

from jaxrunner import spaces as jr_spaces
from jaxrunner.envs.base import BatchStep, VectorEnv
from jaxrunner.envs.sync import SyncVectorEnv
from jaxrunner.errors import (
    EnvIndexError,
    InvalidArgumentError,
    RemoteTimeoutError,
    SpaceMismatchError,
    WorkerError,
)
from jaxrunner.faults import RestartPolicy

EnvFactory = Callable[[], gymnasium.Env]


def import_ray() -> Any:
    """The ``ray`` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as err:
        raise ImportError(
            f"jaxrunner's Ray support needs Ray: pip install 'jaxrunner[ray]' ({err})"
        ) from err
    return ray


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayEnvConfig:
    """How ``backend="ray"`` places sub-envs in actors and how the runner batches them."""

    envs_per_actor: int = 4
    """Sub-envs per Ray actor (the last actor may hold fewer). They step together: more
    per actor means fewer messages, fewer means finer-grained dynamic batching."""
    num_cpus_per_actor: float = 1.0
    """Ray CPU resources each env actor reserves (fractions allowed, e.g. 0.5)."""
    remote_env_batch_wait_ms: float = 0.0
    """After the first actor's results arrive, how long the runner waits for more before
    computing actions (0: take whatever is ready now). Longer waits give larger policy
    batches; shorter waits give lower latency."""
    batch_buckets: tuple[int, ...] | None = None
    """Policy batch sizes: the ready envs are padded to the smallest bucket that holds
    them, and each bucket is compiled once, up front. None: powers of two from 2 up to
    ``num_envs``, and ``num_envs``. ``(num_envs,)`` computes every env's row in a full
    batch, as the sync backend does (see :mod:`jaxrunner.dynamic` on exactness)."""
    step_timeout_s: float | None = None
    """An actor whose step has not answered after this long is treated as dead (killed,
    and replaced if restarts are on). None: wait forever."""
    actor_start_timeout_s: float = 120.0
    """How long to wait for a new actor to start and reset its sub-envs (the cluster may
    lack the resources to place it)."""

    def __post_init__(self) -> None:
        def positive(name: str, value: Any, kind: type | tuple[type, ...]) -> None:
            if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
                raise InvalidArgumentError(
                    f"RayEnvConfig({name}={value!r}): expected a number > 0."
                )

        positive("envs_per_actor", self.envs_per_actor, int)
        positive("actor_start_timeout_s", self.actor_start_timeout_s, (int, float))
        if self.step_timeout_s is not None:
            positive("step_timeout_s", self.step_timeout_s, (int, float))
        for name in ("num_cpus_per_actor", "remote_env_batch_wait_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InvalidArgumentError(
                    f"RayEnvConfig({name}={value!r}): expected a number >= 0."
                )
        if self.batch_buckets is not None and (
            not isinstance(self.batch_buckets, tuple)
            or not self.batch_buckets
            or any(
                isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.batch_buckets
            )
        ):
            raise InvalidArgumentError(
                f"RayEnvConfig(batch_buckets={self.batch_buckets!r}): expected None or a "
                "non-empty tuple of ints >= 1, e.g. (8, 16, 32)."
            )


RAY_OPTIONS = tuple(field.name for field in dataclasses.fields(RayEnvConfig))
"""``make_vec(..., backend="ray", **options)`` keywords that go to :class:`RayEnvConfig`."""


def _portable(err: BaseException) -> BaseException:
    """``err`` if it survives pickling (it crosses a process boundary), else a
    RuntimeError carrying its repr."""
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:
        return RuntimeError(repr(err))
    return err


class EnvWorker:
    """The body of one env actor: a SyncVectorEnv over a block of sub-envs. Returns
    copies of its buffers (Ray serializes return values) and portable errors."""

    def __init__(self, env_fns: Sequence[EnvFactory], restart_policy: RestartPolicy | None):
        self.envs = SyncVectorEnv(env_fns, copy=False)
        self.envs.restart_policy = restart_policy

    def describe(self) -> tuple[gymnasium.Space, gymnasium.Space, dict[str, Any], Any]:
        envs = self.envs
        return (
            envs.single_observation_space,
            envs.single_action_space,
            envs.metadata,
            (envs.render_mode),
        )

    def set_restart_policy(self, policy: RestartPolicy | None) -> None:
        self.envs.restart_policy = policy

    def reset(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None
    ) -> tuple[Any, list[dict[str, Any]]]:
        return self.envs.reset_batch(seeds, options)

    def reset_at(
        self, index: int, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[Any, dict[str, Any]]:
        return self.envs.reset_at(index, seed=seed, options=options)

    def step(self, actions: Any, rows: slice | None) -> BatchStep:
        out = self.envs.step_batch(actions, rows)
        if out.errors:
            out = out._replace(errors={i: _portable(e) for i, e in out.errors.items()})
        return out

    def num_restarts(self) -> int:
        return self.envs.num_restarts

    def call(self, name: str, args: tuple, kwargs: dict[str, Any]) -> tuple[Any, ...]:
        return self.envs.call(name, *args, **kwargs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return self.envs.get_attr(name)

    def set_attr(self, name: str, values: list[Any]) -> None:
        self.envs.set_attr(name, values)

    def render(self) -> tuple[Any, ...]:
        return self.envs.render()

    def close(self) -> None:
        self.envs.close()


class RayVectorEnv(VectorEnv):
    """Sub-envs in Ray actors (see the module docstring).

    Ray must be importable; if no Ray instance is running, Ray starts a local one on
    first use (call ``ray.init(address="auto")`` first to use a cluster).

    Args:
        env_fns: zero-argument factories, one per sub-env; picklable (cloudpickle), as
            they are sent to the actors.
        config: placement, batching and timeouts (:class:`RayEnvConfig`).
        copy: as for :class:`~jaxrunner.SyncVectorEnv`.
    """

    supports_restart = True
    dynamic_batching: ClassVar[bool] = True
    """The runner drives this env with :mod:`jaxrunner.dynamic` (``send``/``poll``)."""

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        config: RayEnvConfig | None = None,
        *,
        copy: bool = True,
    ) -> None:
        super().__init__(copy=copy)
        self._closed_reason = "construction failed"  # until the actors are up
        if len(env_fns) == 0:
            raise InvalidArgumentError("RayVectorEnv needs at least one env factory, got none.")
        self.config = config or RayEnvConfig()
        if not isinstance(self.config, RayEnvConfig):
            raise InvalidArgumentError(
                f"RayVectorEnv(config=...): expected a RayEnvConfig, got {config!r}."
            )
        self._ray = import_ray()
        self.env_fns = list(env_fns)
        self.num_envs = len(self.env_fns)
        per = self.config.envs_per_actor
        self.unit_rows = [
            slice(lo, min(lo + per, self.num_envs)) for lo in range(0, self.num_envs, per)
        ]
        """The sub-envs each actor runs (consecutive blocks)."""
        self._restart_policy: RestartPolicy | None = None
        self._remote_cls = self._ray.remote(EnvWorker)
        self._actors: list[Any] = []
        self._in_flight: dict[Any, tuple[int, slice, float]] = {}  # ref -> unit, rows, sent
        self._expired: dict[Any, tuple[int, UnitResult]] = {}  # timed-out steps, failed
        self.num_actor_restarts = 0
        """Actors replaced after dying or timing out."""
        try:
            self._actors = [self._make_actor(u) for u in range(len(self.unit_rows))]
            described = self._get_all(
                [a.describe.remote() for a in self._actors], self.config.actor_start_timeout_s
            )
        except BaseException:
            self._kill_all()
            raise
        obs_space, action_space, metadata, render_mode = described[0]
        for u, (other_obs, other_action, _, _) in enumerate(described):
            if other_obs != obs_space or other_action != action_space:
                self._kill_all()
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
        n = self.num_envs
        self._obs = jr_spaces.allocate(obs_space, (n,))
        self._next_obs = jr_spaces.allocate(obs_space, (n,))
        self._reward = np.zeros(n, dtype=np.float64)
        self._terminated = np.zeros(n, dtype=np.bool_)
        self._truncated = np.zeros(n, dtype=np.bool_)
        self._splitters: dict[int, Callable[[Any], list[Any]]] = {}

    # -- restarts ------------------------------------------------------------------------------

    @property  # type: ignore[override]
    def restart_policy(self) -> RestartPolicy | None:
        """Restart policy of the sub-envs (applied inside the actors) and of the actors."""
        return self._restart_policy

    @restart_policy.setter
    def restart_policy(self, policy: RestartPolicy | None) -> None:
        self._restart_policy = policy
        if self._actors:
            self._get_all(
                [a.set_restart_policy.remote(policy) for a in self._actors],
                self.config.actor_start_timeout_s,
            )

    @property
    def num_restarts(self) -> int:
        """Sub-envs recreated inside the current actors (a replaced actor's count is
        lost with it; :attr:`num_actor_restarts` counts replaced actors)."""
        counts = self._get_all([a.num_restarts.remote() for a in self._actors], None)
        return sum(counts)

    @property
    def actors(self) -> list[Any]:
        """The Ray actor handles, one per block of :attr:`unit_rows` (current ones)."""
        return list(self._actors)

    def _make_actor(self, u: int) -> Any:
        rows = self.unit_rows[u]
        return self._remote_cls.options(num_cpus=self.config.num_cpus_per_actor).remote(
            self.env_fns[rows], self._restart_policy
        )

    def _replace_actor(self, u: int, cause: BaseException) -> tuple[Any, list[dict[str, Any]]]:
        """Kills actor ``u`` and starts a new one (reset, unseeded, as an in-process
        restart); returns its first observations and infos, or raises WorkerError."""
        ray, policy = self._ray, self._restart_policy
        self._kill(self._actors[u])
        rows = self.unit_rows[u]
        if policy is None:
            raise WorkerError(
                f"Ray env actor {u} (sub-envs {rows.start}..{rows.stop - 1}) failed: {cause!r}. "
                "Pass EnvRunner(restart_failed_sub_envs=True) (or set a restart_policy) to "
                "replace failed actors and go on sampling.",
                u,
                range(rows.start, rows.stop),
            ) from cause
        last: BaseException | None = None
        for wait in policy.waits():
            time.sleep(wait)
            actor = self._make_actor(u)
            try:
                obs, infos = ray.get(
                    actor.reset.remote([None] * (rows.stop - rows.start), None),
                    timeout=self.config.actor_start_timeout_s,
                )
            except Exception as err:
                last = err
                self._kill(actor)
                continue
            self._actors[u] = actor
            self.num_actor_restarts += 1
            return obs, infos
        raise WorkerError(
            f"Ray env actor {u} (sub-envs {rows.start}..{rows.stop - 1}) failed ({cause!r}) and "
            f"could not be replaced: {policy.max_attempts} attempts failed, the last with "
            f"{last!r}. Check the cluster's resources and the env factory.",
            u,
            range(rows.start, rows.stop),
        ) from cause

    # -- the backend contract --------------------------------------------------------------------

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, list[dict[str, Any]]]:
        self._check_open("reset")
        self._check_idle("reset")
        refs = [
            actor.reset.remote(list(seeds[rows]), options)
            for actor, rows in zip(self._actors, self.unit_rows)
        ]
        infos: list[dict[str, Any]] = []
        for u, ref in enumerate(refs):
            try:
                obs, part = self._ray.get(ref, timeout=self.config.step_timeout_s)
            except Exception as err:
                obs, part = self._replace_actor(u, self._remote_error(err, u, "reset"))
            jr_spaces.copy_into(self.single_observation_space, self._obs, obs, self.unit_rows[u])
            infos.extend(part)
        return self._obs, infos

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._check_open("reset_at")
        self._check_idle("reset_at")
        if isinstance(index, bool) or not 0 <= index < self.num_envs:
            raise EnvIndexError(f"reset_at(index={index}): index must be in [0, {self.num_envs}).")
        u = index // self.config.envs_per_actor
        local = index - self.unit_rows[u].start
        try:
            obs, info = self._ray.get(self._actors[u].reset_at.remote(local, seed, options))
        except Exception as err:
            raise self._remote_error(err, u, "reset_at") from err
        jr_spaces.copy_into(self.single_observation_space, self._obs, obs, index)
        return jr_spaces.take(self.single_observation_space, self._obs, index), info

    def step_batch(self, actions: Any, rows: slice | None = None) -> BatchStep:
        self._check_open("step")
        self._check_idle("step")
        lo, hi = (0, self.num_envs) if rows is None else (rows.start, rows.stop)
        self._splitter(hi - lo)(actions)  # validates the whole batch before any step
        space = self.single_action_space
        for u, unit in enumerate(self.unit_rows):
            start, stop = max(lo, unit.start), min(hi, unit.stop)
            if start < stop:
                part = jr_spaces.map_structure(
                    space, lambda a, s=start, e=stop: np.asarray(a)[s - lo : e - lo], actions
                )
                local = slice(start - unit.start, stop - unit.start)
                self._submit(u, part, None if local == slice(0, unit.stop - unit.start) else local)
        results = []
        while self._in_flight:
            results.extend(self.poll(0.0))
        results.sort(key=lambda r: r[1].rows.start)
        infos: list[dict[str, Any]] = []
        reset_infos: dict[int, dict[str, Any]] = {}
        errors: dict[int, BaseException] = {}
        failed = np.zeros(hi - lo, np.bool_)
        for _, result in results:
            infos.extend(result.step.infos)
            reset_infos.update(result.step.reset_infos)
            errors.update(result.step.errors or {})
            if result.step.failed is not None:
                failed[result.rows.start - lo : result.rows.stop - lo] = result.step.failed
        part = slice(lo, hi)
        obs_space = self.single_observation_space
        return BatchStep(
            jr_spaces.rows(obs_space, self._obs, part),
            jr_spaces.rows(obs_space, self._next_obs, part),
            self._reward[part],
            self._terminated[part],
            self._truncated[part],
            infos,
            reset_infos,
            failed if failed.any() else None,
            errors or None,
        )

    # -- dynamic batching: one actor at a time ---------------------------------------------------

    def send(self, unit: int, actions: Any) -> None:
        """Starts a step of actor ``unit``'s sub-envs (``actions``: one per sub-env of
        ``unit_rows[unit]``, as a batch); :meth:`poll` returns its result."""
        self._check_open("send")
        self._submit(unit, actions, None)

    @property
    def num_in_flight(self) -> int:
        """Actor steps sent and not yet returned by :meth:`poll`."""
        return len(self._in_flight)

    def poll(self, wait_s: float) -> list[tuple[int, UnitResult]]:
        """Waits until at least one in-flight actor step is done, then up to ``wait_s``
        more seconds for others; returns ``(unit, result)`` of every finished one.

        The results' arrays are views of this env's buffers, valid until the same rows
        are stepped again. A dead or timed-out actor is replaced (with a restart policy)
        and its result marks every sub-env it ran as failed; without a policy the
        failure raises WorkerError / RemoteTimeoutError.
        """
        ray = self._ray
        if not self._in_flight:
            raise InvalidArgumentError("poll(): no actor step is in flight; send() first.")
        refs = list(self._in_flight)
        done: list[Any] = []
        while not done:
            timeout = self._time_to_deadline()
            done, rest = ray.wait(refs, num_returns=1, timeout=timeout)
            if not done:
                done = self._expire_steps()
        rest = [r for r in refs if r not in done]
        if rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=wait_s)
            done.extend(more)
        results = []
        for ref in done:
            if ref not in self._in_flight:  # expired: already a failed result
                results.append(self._expired.pop(ref))
                continue
            results.append(self._finish(ref))
        return results

    def unit_obs(self, unit: int) -> Any:
        """The current observations of actor ``unit``'s sub-envs (views)."""
        return jr_spaces.rows(self.single_observation_space, self._obs, self.unit_rows[unit])

    # -- internals ------------------------------------------------------------------------------

    def _submit(self, u: int, actions: Any, local: slice | None) -> None:
        if any(unit == u for unit, _, _ in self._in_flight.values()):
            raise InvalidArgumentError(
                f"a step of Ray env actor {u} is already in flight; poll() for it first."
            )
        unit = self.unit_rows[u]
        rows = unit if local is None else slice(unit.start + local.start, unit.start + local.stop)
        ref = self._actors[u].step.remote(actions, local)
        self._in_flight[ref] = (u, rows, time.monotonic())

    def _finish(self, ref: Any) -> tuple[int, UnitResult]:
        u, rows, _ = self._in_flight.pop(ref)
        try:
            out: BatchStep = self._ray.get(ref)
        except Exception as err:
            cause = self._remote_error(err, u, "step")
            if isinstance(cause, WorkerError):  # the actor died
                obs, _ = self._replace_actor(u, cause)  # raises without a restart policy
                return u, self._failed_result(u, rows, obs, cause)
            if cause is err:
                raise
            raise cause from err  # raised by a sub-env (restarts off, or they gave up)
        space, offset = self.single_observation_space, self.unit_rows[u].start
        jr_spaces.copy_into(space, self._obs, out.obs, rows)
        jr_spaces.copy_into(space, self._next_obs, out.next_obs, rows)
        self._reward[rows], self._terminated[rows] = out.reward, out.terminated
        self._truncated[rows] = out.truncated
        failed = (
            None if out.failed is None else out.failed[rows.start - offset : rows.stop - offset]
        )
        step = BatchStep(
            jr_spaces.rows(space, self._obs, rows),
            jr_spaces.rows(space, self._next_obs, rows),
            self._reward[rows],
            self._terminated[rows],
            self._truncated[rows],
            out.infos,
            {offset + i: info for i, info in out.reset_infos.items()},
            failed if failed is not None and failed.any() else None,
            {offset + i: e for i, e in out.errors.items()} if out.errors else None,
        )
        return u, UnitResult(rows, step)

    def _failed_result(self, u: int, rows: slice, obs: Any, cause: BaseException) -> UnitResult:
        """Every sub-env of the replaced actor ``u``: a failed slot (reward 0, no flags,
        ``obs`` and ``next_obs`` the new sub-envs' reset observations)."""
        space, unit = self.single_observation_space, self.unit_rows[u]
        jr_spaces.copy_into(space, self._obs, obs, unit)
        jr_spaces.copy_into(space, self._next_obs, obs, unit)
        self._reward[unit], self._terminated[unit], self._truncated[unit] = 0.0, False, False
        n = rows.stop - rows.start
        step = BatchStep(
            jr_spaces.rows(space, self._obs, rows),
            jr_spaces.rows(space, self._next_obs, rows),
            self._reward[rows],
            self._terminated[rows],
            self._truncated[rows],
            [{} for _ in range(n)],
            {},
            np.ones(n, np.bool_),
            dict.fromkeys(range(rows.start, rows.stop), cause),
        )
        return UnitResult(rows, step)

    def _time_to_deadline(self) -> float | None:
        if self.config.step_timeout_s is None:
            return None
        oldest = min(sent for _, _, sent in self._in_flight.values())
        return max(0.0, oldest + self.config.step_timeout_s - time.monotonic())

    def _expire_steps(self) -> list[Any]:
        """Treats in-flight steps older than ``step_timeout_s`` as failed actors."""
        timeout = self.config.step_timeout_s
        expired = [
            ref
            for ref, (_, _, sent) in self._in_flight.items()
            if time.monotonic() - sent >= timeout
        ]
        for ref in expired:
            u, rows, _ = self._in_flight.pop(ref)
            cause = RemoteTimeoutError(
                f"Ray env actor {u} (sub-envs {rows.start}..{rows.stop - 1}) did not answer a "
                f"step within step_timeout_s={timeout}s; it is treated as dead."
            )
            if self._restart_policy is None:
                self._kill(self._actors[u])
                raise cause
            obs, _ = self._replace_actor(u, cause)
            self._expired[ref] = (u, self._failed_result(u, rows, obs, cause))
        return expired

    def _remote_error(self, err: BaseException, u: int, call: str) -> BaseException:
        """What a failed remote call means: a dead actor (WorkerError) or an error raised
        by its sub-envs (the original, re-indexed where it names a sub-env)."""
        ray = self._ray
        rows = self.unit_rows[u]
        if isinstance(err, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)):
            error = WorkerError(
                f"Ray env actor {u} (sub-envs {rows.start}..{rows.stop - 1}) died or did not "
                f"answer during {call}(): {err}",
                u,
                range(rows.start, rows.stop),
            )
            error.__cause__ = err
            return error
        if isinstance(err, ray.exceptions.RayTaskError):
            cause = err.cause if getattr(err, "cause", None) is not None else err
            index = getattr(cause, "env_index", None)
            if isinstance(index, int):
                cause.env_index = rows.start + index
                cause.add_note(
                    f"jaxrunner: sub-env {index} of Ray env actor {u} is sub-env "
                    f"{rows.start + index} of the vector env."
                )
            return cause
        return err

    def _check_idle(self, what: str) -> None:
        if self._in_flight:
            raise InvalidArgumentError(
                f"RayVectorEnv.{what}(): {len(self._in_flight)} actor steps are in flight; "
                "poll() until num_in_flight is 0 first."
            )

    def _get_all(self, refs: list[Any], timeout: float | None) -> list[Any]:
        ray = self._ray
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError as err:
            raise RemoteTimeoutError(
                f"Ray env actors did not answer within {timeout}s. If they are still being "
                f"placed, the cluster lacks the resources: each asks for num_cpus="
                f"{self.config.num_cpus_per_actor} (ray.available_resources(): "
                f"{ray.available_resources()}). Lower RayEnvConfig.num_cpus_per_actor "
                "(fractions allowed) or envs per actor, or add nodes."
            ) from err

    def _splitter(self, size: int) -> Callable[[Any], list[Any]]:
        if size not in self._splitters:
            self._splitters[size] = jr_spaces.make_action_splitter(self.single_action_space, size)
        return self._splitters[size]

    def _kill(self, actor: Any) -> None:
        try:  # noqa: SIM105
            self._ray.kill(actor, no_restart=True)
        except Exception:  # already gone, or Ray shut down
            pass

    def _kill_all(self) -> None:
        for actor in self._actors:
            self._kill(actor)

    def _obs_buffer(self) -> Any:
        return self._obs

    # -- forwarding to the sub-envs ----------------------------------------------------------

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` (or reads attribute ``name``) on every sub-env."""
        self._check_open("call")
        parts = self._get_all([a.call.remote(name, args, kwargs) for a in self._actors], None)
        return tuple(x for part in parts for x in part)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        self._check_open("get_attr")
        parts = self._get_all([a.get_attr.remote(name) for a in self._actors], None)
        return tuple(x for part in parts for x in part)

    def set_attr(self, name: str, values: Any) -> None:
        self._check_open("set_attr")
        values = self._values_per_env(name, values)
        self._get_all(
            [
                a.set_attr.remote(name, list(values[r]))
                for a, r in zip(self._actors, self.unit_rows)
            ],
            None,
        )

    def render(self) -> tuple[Any, ...]:
        self._check_open("render")
        parts = self._get_all([a.render.remote() for a in self._actors], None)
        return tuple(x for part in parts for x in part)

    def _close_backend(self) -> None:
        try:  # noqa: SIM105  (no contextlib: this may run at interpreter exit)
            self._ray.get([a.close.remote() for a in self._actors], timeout=10)
        except Exception:  # dead actors, or Ray already shut down: nothing to close
            pass
        self._kill_all()
        self._in_flight.clear()


class UnitResult:
    """One actor's finished step: the rows it covered and their :class:`BatchStep`
    (global sub-env indices in ``reset_infos``/``errors``)."""

    __slots__ = ("rows", "step")

    def __init__(self, rows: slice, step: BatchStep) -> None:
        self.rows = rows
        self.step = step


__all__ = ["RAY_OPTIONS", "EnvWorker", "RayEnvConfig", "RayVectorEnv", "UnitResult", "import_ray"]

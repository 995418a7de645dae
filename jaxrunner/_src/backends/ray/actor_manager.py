"""The env actors of ``backend="ray"``: starting, replacing and killing them, and what
their failures mean."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from jaxrunner._src.backends.ray.config import RayConfig
from jaxrunner._src.backends.ray.env_actor import EnvWorker
from jaxrunner._src.backends.ray.progress import ProgressMarks
from jaxrunner._src.backends.restarts import RestartPolicy, retry
from jaxrunner._src.backends.sub_env_block import EnvFactory
from jaxrunner.errors import RemoteTimeoutError, WorkerError


class ActorPool:
    """One Ray actor per block of sub-envs (:attr:`unit_rows`), replaced when it dies (as
    ``restart_policy`` says); ``worker``: the actor's body (:mod:`.env_actor`)."""

    def __init__(
        self,
        ray: Any,
        env_fns: Sequence[EnvFactory],
        config: RayConfig,
        restart_policy: RestartPolicy | None,
        worker: type = EnvWorker,
        worker_args: tuple = (),
    ) -> None:
        self.ray, self.env_fns, self.config = ray, list(env_fns), config
        self.restart_policy = restart_policy
        n, per = len(self.env_fns), config.envs_per_actor
        self.unit_rows = [slice(lo, min(lo + per, n)) for lo in range(0, n, per)]
        self.actors: list[Any] = []  # the current actor handles, one per block
        self.progress = ProgressMarks(len(self.unit_rows), n)
        self.num_actor_restarts = 0  # ActorStepping.num_actor_restarts
        self._remote_cls = ray.remote(worker)
        self._worker_args = worker_args

    def start(self, take: Callable[[list[Any]], None]) -> None:
        """Starts every actor and hands ``take`` each one's ``describe()``; kills them all
        if any fails or ``take`` refuses them."""
        try:
            self.actors = [self._make(u) for u in range(len(self.unit_rows))]
            refs = [a.describe.remote() for a in self.actors]
            described = self.get_all(refs, self.config.actor_start_timeout_s)
            for u, description in enumerate(described):
                self.check_built(description, u)
            take(described)
        except BaseException:
            self.kill_all()
            self.progress.close()
            raise

    def _make(self, u: int) -> Any:
        rows = self.unit_rows[u]
        return self._remote_cls.options(num_cpus=self.config.num_cpus_per_actor).remote(
            self.env_fns[rows],
            self.restart_policy,
            rows.start,
            *self._worker_args,
            progress=self.progress.where(u),
        )

    def replace(self, u: int, cause: BaseException) -> Any:
        """Kills actor ``u`` and starts a new one (reset, unseeded, as an in-process
        restart; retried as the policy says); returns what its ``reset`` returned (its
        first observations and infos), or raises WorkerError."""
        self.kill(self.actors[u])
        rows = self.unit_rows[u]
        policy = self.restart_policy
        if policy is None:
            raise WorkerError(
                f"Ray env actor {u} (sub-envs {rows.start}..{rows.stop - 1}) failed: {cause!r}. "
                "Pass restart_policy=jaxrunner.RestartPolicy() to the vector env (make_vec) to "
                "replace failed actors and go on sampling.",
                u,
                range(rows.start, rows.stop),
            ) from cause

        def attempt() -> Any:
            actor = self._make(u)
            try:
                timeout = self.config.actor_start_timeout_s
                self.check_built(self.ray.get(actor.describe.remote(), timeout=timeout), u)
                first = self.ray.get(
                    actor.reset.remote([None] * (rows.stop - rows.start), None),
                    timeout=self.config.actor_start_timeout_s,
                )
            except BaseException:
                self.kill(actor)
                raise
            self.actors[u] = actor
            self.num_actor_restarts += 1
            return first

        def give_up(last: BaseException) -> BaseException:
            return WorkerError(
                f"Ray env actor {u} (sub-envs {rows.start}..{rows.stop - 1}) failed ({cause!r}) "
                f"and could not be replaced: {policy.max_attempts} attempts failed, the last "
                f"with {last!r}. Check the cluster's resources and the env factory.",
                u,
                range(rows.start, rows.stop),
            )

        return retry(attempt, policy, cause, give_up)

    def check_built(self, description: Any, u: int) -> None:
        """Raises what building actor ``u``'s sub-envs raised, if its ``describe()``
        returned an error (the sync backend's own: EnvError, SpaceMismatchError...)."""
        if isinstance(description, BaseException):
            description.add_note(f"jaxrunner: raised in Ray env actor {u} building its sub-envs")
            raise description

    def remote_error(self, err: BaseException, u: int, call: str) -> BaseException:
        """What a failed remote call means: a dead actor (WorkerError) or an error raised
        by its sub-envs (the original). Raise it as it is, not ``from err``: it chains
        what it should."""
        ray = self.ray
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
        cause = getattr(err, "cause", None)
        if not isinstance(err, ray.exceptions.RayTaskError) or cause is None or cause is err:
            return err
        if cause.__cause__ is None:
            cause.__cause__ = err
        else:
            cause.add_note(f"jaxrunner: raised in Ray env actor {u}: {err}")
        return cause

    def get_all(self, refs: list[Any], timeout: float | None) -> list[Any]:
        """``ray.get(refs)``; a timeout says what the actors may lack."""
        ray = self.ray
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError as err:
            raise RemoteTimeoutError(
                f"Ray env actors did not answer within {timeout}s. If they are still being "
                f"placed, the cluster lacks the resources: each asks for num_cpus="
                f"{self.config.num_cpus_per_actor} (ray.available_resources(): "
                f"{ray.available_resources()}). Lower RayConfig.num_cpus_per_actor "
                "(fractions allowed) or envs per actor, or add nodes."
            ) from err

    def kill(self, actor: Any) -> None:
        try:  # noqa: SIM105
            self.ray.kill(actor, no_restart=True)
        except Exception:  # already gone, or Ray shut down
            pass

    def kill_all(self) -> None:
        for actor in self.actors:
            self.kill(actor)

    def close(self) -> None:
        try:  # noqa: SIM105  (no contextlib: this may run at interpreter exit)
            self.ray.get([a.close.remote() for a in self.actors], timeout=10)
        except Exception:  # dead actors, or Ray already shut down: nothing to close
            pass
        self.kill_all()
        self.progress.close()

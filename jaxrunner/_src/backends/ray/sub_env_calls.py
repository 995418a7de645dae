"""Per-sub-env calls of ``backend="ray"`` (``call``, ``get_attr``, ``set_attr``,
``render``, sub-env handles): each actor asked, and its errors raised as the process
backend raises them (a sub-env's own, or a ``WorkerError``), not Ray's wrappers; an
actor that does not answer within ``step_timeout_s`` is treated as a step's would be."""

from __future__ import annotations

import time
from typing import Any

from jaxrunner._src.backends.ray.actor_manager import ActorPool
from jaxrunner._src.backends.ray.config import RayConfig
from jaxrunner._src.backends.ray.deadlines import missed_deadline
from jaxrunner._src.backends.remote_sub_envs import RemoteSubEnvs


class ActorSubEnvs(RemoteSubEnvs):
    """:class:`RemoteSubEnvs`' requests sent to the Ray actors that hold the sub-envs."""

    config: RayConfig
    unit_rows: list[slice]
    _actors: ActorPool

    @property
    def num_restarts(self) -> int:
        """Sub-envs recreated inside the current actors (a replaced actor's count is
        lost with it; :attr:`num_actor_restarts` counts replaced actors)."""
        self._check_open("num_restarts")  # (the closed actors are gone, and their counts)
        refs = [a.num_restarts.remote() for a in self._actors.actors]
        return sum(self._answers(refs, "num_restarts"))

    def _ask_one(self, index: int, method: str, args: tuple) -> Any:
        actors, u = self._actors, index // self.config.envs_per_actor
        ref = actors.actors[u].on_sub_env.remote(index, method, args)
        try:
            return actors.ray.get(ref, timeout=self.config.step_timeout_s)
        except Exception as err:
            raise self._call_error(err, u, method)  # noqa: B904  (chained as it should be)

    def _ask_each(self, method: str, *args: Any) -> tuple[Any, ...]:
        refs = [getattr(a, method).remote(*args) for a in self._actors.actors]
        return tuple(x for part in self._answers(refs, method) for x in part)

    def _set_each(self, name: str, values: list[Any]) -> None:
        actors = self._actors
        refs = [a.set_attr.remote(name, values[r]) for a, r in zip(actors.actors, self.unit_rows)]
        self._answers(refs, "set_attr")

    def _answers(self, refs: list[Any], method: str) -> list[Any]:
        """Each actor's answer to ``method``; once every actor has answered, raises the
        lowest actor's error as the process backend does: a sub-env's own, a dead
        actor's as WorkerError (not Ray's wrappers), a hung one's as RemoteTimeoutError."""
        actors, answers, errors = self._actors, [], []
        timeout = self.config.step_timeout_s  # for every actor at once: all were asked now
        deadline = None if timeout is None else time.monotonic() + timeout
        for u, ref in enumerate(refs):
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                answers.append(actors.ray.get(ref, timeout=left))
            except Exception as err:
                errors.append(self._call_error(err, u, method))
        if errors:
            raise errors[0]
        return answers

    def _call_error(self, err: BaseException, u: int, method: str) -> BaseException:
        """What actor ``u``'s failed ``method`` call means (:meth:`ActorPool.remote_error`);
        past ``step_timeout_s``, as for a step: the actor is killed, a RemoteTimeoutError."""
        actors = self._actors
        if not isinstance(err, actors.ray.exceptions.GetTimeoutError):
            return actors.remote_error(err, u, method)
        actors.kill(actors.actors[u])  # hung: its next step finds it dead (and replaces it)
        error = missed_deadline(
            u,
            self.unit_rows[u],
            self.config.step_timeout_s,
            f"{method}()",
            f" (killed: its sub-envs' next step replaces it under a restart_policy, else "
            f"raises WorkerError). Raise RayConfig.step_timeout_s if {method}() takes longer",
        )
        error.__cause__ = err
        return error

"""``backend="ray"`` for multi-agent envs: Ray actors, each serving a block of sub-envs
(:mod:`jaxrunner.multi_agent.remote`), stepped in lockstep.

Takes the single-agent backend's :class:`~jaxrunner.RayConfig` for placement
(``envs_per_actor``, ``num_cpus_per_actor``, ``step_timeout_s``,
``actor_start_timeout_s``); its ready-first batching and actor replacement do not
apply here yet (a multi-agent step waits for every actor); sub-env restarts do. Uses
the running Ray instance, or starts a local one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxrunner.envs.ray.config import RayConfig, import_ray
from jaxrunner.errors import EnvError, JaxRunnerError
from jaxrunner.faults import RestartPolicy
from jaxrunner.multi_agent.groups import PolicyMappingFn
from jaxrunner.multi_agent.remote import BlockServer, RemoteBlocksVectorEnv, Reply
from jaxrunner.multi_agent.sub_envs import MultiAgentEnvFactory


class RayMultiAgentVectorEnv(RemoteBlocksVectorEnv):
    """Multi-agent sub-envs in Ray actors (see the module docstring).

    Args:
        env_fns: zero-argument factories of PettingZoo envs.
        policy_mapping_fn: as for the sync backend.
        config: placement options (default ``RayConfig()``).
        restart_policy: failed sub-envs are recreated inside their actor, as the sync
            backend does (None: failures raise). Actors are not replaced yet.
    """

    def __init__(
        self,
        env_fns: Sequence[MultiAgentEnvFactory],
        policy_mapping_fn: PolicyMappingFn | None = None,
        *,
        config: RayConfig | None = None,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        super().__init__()
        self.restart_policy = restart_policy
        ray = import_ray()
        self._ray = ray
        self.config = config or RayConfig()
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        self.num_envs = len(env_fns)
        k = self.config.envs_per_actor
        self._bounds = [(lo, min(lo + k, self.num_envs)) for lo in range(0, self.num_envs, k)]
        actor_class = ray.remote(num_cpus=self.config.num_cpus_per_actor)(BlockServer)
        self._actors: list[Any] = []
        try:
            for lo, hi in self._bounds:
                self._actors.append(
                    actor_class.remote(list(env_fns[lo:hi]), policy_mapping_fn, lo, restart_policy)
                )
            described = self._get(
                [a.describe.remote() for a in self._actors], self.config.actor_start_timeout_s
            )
        except BaseException:
            self._closed = True
            self._close_backend()
            raise
        self.groups, self.turn_based = described[0]
        self._allocate()

    def _call_all(self, method: str, args_per_remote: list[tuple]) -> list[Reply]:
        refs = [
            getattr(actor, method).remote(*args)
            for actor, args in zip(self._actors, args_per_remote)
        ]
        return self._get(refs, self.config.step_timeout_s)

    def _call_one(self, k: int, method: str, args: tuple) -> Any:
        ref = getattr(self._actors[k], method).remote(*args)
        return self._get([ref], self.config.step_timeout_s)[0]

    def _get(self, refs: list[Any], timeout: float | None) -> list[Any]:
        ray = self._ray
        try:
            return ray.get(refs, timeout=timeout)
        except Exception as err:
            self._closed = True
            self._close_backend()
            cause = getattr(err, "cause", None)
            if isinstance(cause, JaxRunnerError):
                raise cause from err
            raise EnvError(
                f"multi-agent Ray actor failed ({type(err).__name__}): {err}. Recreate the "
                "env with jaxrunner.make_multi_agent_vec(..., backend='ray').",
                0,
            ) from err

    def _close_backend(self) -> None:
        for actor in self._actors:
            try:
                self._ray.kill(actor)
            except Exception:  # already gone
                continue
        self._actors = []


__all__ = ["RayMultiAgentVectorEnv"]

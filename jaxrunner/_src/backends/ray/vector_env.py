"""``RayVectorEnv`` and its multi-agent twin: shells over :mod:`.stepping`, each with its
kind of env (:mod:`.kinds`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxrunner._src.backends.base import MultiAgentVectorEnv, VectorEnv
from jaxrunner._src.backends.ray.config import RayConfig
from jaxrunner._src.backends.ray.kinds import AgentRows, GymnasiumRows
from jaxrunner._src.backends.ray.stepping import ActorStepping
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.sub_env_block import EnvFactory
from jaxrunner._src.core.agent_groups import PolicyMappingFn


class RayVectorEnv(ActorStepping, VectorEnv):
    """Sub-envs in Ray actors, stepped at their own pace (see docs/backends/ray.md).

    Consecutive blocks of ``envs_per_actor`` sub-envs each run in one Ray actor with the
    sync backend's loop (validation, SAME_STEP autoreset, restarts). Ready-first by default
    (``RayConfig.ready_first``): :meth:`send` starts whole actors' steps and :meth:`recv`
    returns the first actor to finish (``BatchStep.env_ids`` its slice); lockstep with
    ``ready_first=False``. An actor that dies or misses ``step_timeout_s`` is killed and,
    under a ``restart_policy``, replaced: its sub-envs' steps in flight fail, its other
    sub-envs' next ones (unstepped), counted in ``num_lost_steps`` and ``num_unrun_steps``
    as on the process backend; without one the failure raises
    :class:`~jaxrunner.errors.WorkerError` (a death) or
    :class:`~jaxrunner.errors.RemoteTimeoutError` (a missed deadline). Without a running
    Ray instance, Ray starts a local one (``ray.init(address="auto")`` first for a cluster).

    Args:
        env_fns: zero-argument factories, one per sub-env; picklable (cloudpickle), as
            they are sent to the actors.
        config: placement, batching and timeouts (:class:`~jaxrunner.RayConfig`).
        restart_policy: if given, failed sub-envs (inside their actor) and dead actors
            are replaced as it says and sampling goes on; None: failures raise.
        copy: as for :class:`~jaxrunner.SyncVectorEnv`.
    """

    _kind: GymnasiumRows

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        config: RayConfig | None = None,
        *,
        restart_policy: RestartPolicy | None = None,
        copy: bool = True,
    ) -> None:
        super().__init__(copy=copy)
        self._start(env_fns, config, restart_policy, GymnasiumRows())

    def _obs_buffer(self) -> Any:
        return self._kind.buffers.obs


class RayMultiAgentVectorEnv(ActorStepping, MultiAgentVectorEnv):
    """Multi-agent (PettingZoo) sub-envs in Ray actors, as :class:`RayVectorEnv` runs
    gymnasium ones (see docs/multi-agent.md); lockstep by default. Built by
    ``make_vec(pettingzoo_env_fn, ..., backend="ray")``.

    Args:
        env_fns: zero-argument factories of PettingZoo envs (picklable).
        policy_mapping_fn: as for the sync backend (picklable).
        config: as for :class:`RayVectorEnv`.
        restart_policy: as for :class:`RayVectorEnv`.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        policy_mapping_fn: PolicyMappingFn | None = None,
        *,
        config: RayConfig | None = None,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        super().__init__()
        self._start(env_fns, config, restart_policy, AgentRows((policy_mapping_fn,)))

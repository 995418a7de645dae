"""``backend="ray"`` for multi-agent (PettingZoo) envs, on the single-agent backend's
actor pool (:class:`~.actors.ActorPool`): the same placement, step deadlines, and
replacement of dead or hung actors.

Each actor steps a block of sub-envs with the sync backend's step loop
(:class:`~jaxrunner.multi_agent.sub_envs.SubEnvBlock`, so sub-env restarts happen
inside it) and returns its rows of the group buffers; every actor steps at once and
this side gathers them into ``[B, A_g, ...]`` buffers of its own. A step waits for
every actor (lockstep): ready-first batching does not apply to multi-agent envs yet.

An actor that dies or misses ``step_timeout_s`` is killed and, with a
``restart_policy``, replaced by a new one whose sub-envs start new episodes: its
sub-envs' slots of the step under way hold no transition (``MultiAgentStep.failed``)
and their episodes end as faults, as on the process backend; without a policy, the
failure raises :class:`~jaxrunner.errors.WorkerError` (a death) or
:class:`~jaxrunner.errors.RemoteTimeoutError` (a missed deadline; it names the actor's
sub-envs, ``env_indices``, too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxrunner.envs.ray.actors import ActorPool
from jaxrunner.envs.ray.config import RayConfig, import_ray
from jaxrunner.envs.ray.deadlines import InFlightSteps
from jaxrunner.envs.sub_envs import build_envs
from jaxrunner.errors import InvalidArgumentTypeError, SpaceMismatchError, WorkerError
from jaxrunner.faults import RestartPolicy, close_quietly
from jaxrunner.multi_agent.buffers import FIELDS, AgentStepBuffers, MultiAgentStep
from jaxrunner.multi_agent.groups import AgentGroup, PolicyMappingFn
from jaxrunner.multi_agent.sub_envs import (
    ActionCheck,
    MultiAgentEnvFactory,
    SubEnvBlock,
    env_groups,
)
from jaxrunner.multi_agent.vector_env import MultiAgentVectorEnv


class BlockReply(NamedTuple):
    """An actor's answer to ``reset``/``step``: copies of its rows of the buffers (Ray
    serializes them), its infos, and its failures by global env index."""

    groups: list[dict[str, Any]]
    env_done: np.ndarray
    env_reward: np.ndarray
    unassigned_reward: np.ndarray
    infos: list[dict[str, Any]]
    failed: np.ndarray | None
    errors: dict[int, BaseException] | None


class AgentEnvWorker:
    """The body of one multi-agent env actor: a :class:`SubEnvBlock` over sub-envs
    ``offset..``, built from its factories."""

    def __init__(
        self,
        env_fns: Sequence[MultiAgentEnvFactory],
        restart_policy: RestartPolicy | None,
        offset: int,
        policy_mapping_fn: PolicyMappingFn | None,
    ) -> None:
        envs = build_envs(env_fns, offset)
        try:
            groups = env_groups(envs[0], policy_mapping_fn)
            self.block = SubEnvBlock(
                envs, groups, offset, fns=env_fns, restart_policy=restart_policy
            )
        except BaseException:
            for env in envs:
                close_quietly(env)
            raise

    def describe(self) -> tuple[tuple[AgentGroup, ...], bool]:
        return self.block.groups, self.block.turn_based

    def reset(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> BlockReply:
        return self._reply(self.block.result(self.block.reset(seeds, options)))

    def reset_at(self, index: int, seed: int | None, options: dict[str, Any] | None) -> BlockReply:
        infos: list[dict[str, Any]] = [{} for _ in self.block.envs]
        infos[index] = self.block.reset_at(self.block.offset + index, seed, options)
        return self._reply(self.block.result(infos))

    def step(self, actions: Sequence[Any]) -> BlockReply:
        return self._reply(self.block.step(actions))  # checked before any actor steps

    def num_restarts(self) -> int:
        return self.block.num_restarts

    def call(self, name: str, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        return self.block.call(name, args, kwargs)

    def get_attr(self, name: str) -> list[Any]:
        return self.block.get_attr(name)

    def set_attr(self, name: str, values: list[Any]) -> None:
        self.block.set_attr(name, values)

    def render(self) -> list[Any]:
        return self.block.render()

    def close(self) -> None:
        self.block.close()

    def _reply(self, out: MultiAgentStep) -> BlockReply:
        groups = [{name: getattr(buf, name) for name in FIELDS} for buf in self.block.buffers]
        return BlockReply(
            groups,
            out.env_done,
            out.env_reward,
            out.unassigned_reward,
            out.infos,
            out.failed,
            out.errors,
        )


class RayMultiAgentVectorEnv(MultiAgentVectorEnv):
    """Multi-agent sub-envs in Ray actors (see the module docstring). Uses the running
    Ray instance, or starts a local one.

    Args:
        env_fns: zero-argument factories of PettingZoo envs (picklable).
        policy_mapping_fn: as for the sync backend (picklable).
        config: placement and timeouts (:class:`~jaxrunner.RayConfig`; its
            ``batch_buckets`` and ``remote_env_batch_wait_ms`` do not apply).
        restart_policy: failed sub-envs are recreated inside their actor, dead or hung
            actors replaced; None: failures raise.
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
        self.config = config or RayConfig()
        if not isinstance(self.config, RayConfig):
            raise InvalidArgumentTypeError(
                f"make_multi_agent_vec(backend='ray', config=...): expected a "
                f"jaxrunner.RayConfig, got {type(config).__name__}."
            )
        self.restart_policy = restart_policy
        self.num_envs = len(env_fns)
        self._actors = ActorPool(
            import_ray(),
            env_fns,
            self.config,
            restart_policy,
            worker=AgentEnvWorker,
            worker_args=(policy_mapping_fn,),
        )
        self._closed = True  # until the actors are up
        described = self._actors.start()
        self.groups, self.turn_based = described[0]
        for u, other in enumerate(described):
            if other != described[0]:
                self._actors.kill_all()
                raise SpaceMismatchError(
                    f"the sub-envs of Ray env actor {u} have agent groups {other[0]}, actor "
                    f"0's have {self.groups}; every sub-env must have the same agents and "
                    "spaces. Check the factory."
                )
        self._closed = False
        self.unit_rows = self._actors.unit_rows
        self._buffers = AgentStepBuffers.allocate(self.groups, self.num_envs)
        self._failed = np.zeros(self.num_envs, np.bool_)
        self._check_actions = ActionCheck(self.groups, self.num_envs)
        self._in_flight = InFlightSteps(self._actors.ray, self.config.step_timeout_s)

    @property
    def num_actor_restarts(self) -> int:
        """Actors replaced after dying or timing out."""
        return self._actors.num_actor_restarts

    @property
    def actors(self) -> list[Any]:
        """The Ray actor handles, one per block of :attr:`unit_rows` (current ones)."""
        return list(self._actors.actors)

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> MultiAgentStep:
        self._check_open("reset_batch")
        refs = [
            actor.reset.remote(list(seeds[rows]), options)
            for actor, rows in zip(self._actors.actors, self.unit_rows)
        ]
        replies = []
        for u, ref in enumerate(refs):
            try:
                reply = self._actors.ray.get(ref, timeout=self.config.step_timeout_s)
            except Exception as err:
                reply = self._actors.replace(u, self._actors.remote_error(err, u, "reset"))
            replies.append(reply)
        return self._gather(replies, {})

    def step_batch(self, actions: Sequence[Any]) -> MultiAgentStep:
        """Every actor steps its sub-envs; returns when all have answered (a dead or
        hung actor replaced, with a restart policy: see the module docstring)."""
        self._check_open("step_batch")
        self._check_actions(actions)  # before any actor steps
        for u, rows in enumerate(self.unit_rows):
            ref = self._actors.actors[u].step.remote([np.asarray(a)[rows] for a in actions])
            self._in_flight.add(ref, u, rows)
        replies: list[Any] = [None] * len(self.unit_rows)
        lost: dict[int, BaseException] = {}
        try:
            while self._in_flight:
                ref = self._in_flight.first_ready()
                if ref is None:
                    for u, _, cause in self._in_flight.pop_expired():
                        replies[u] = self._replace(u, cause, lost)
                    continue
                u, _ = self._in_flight.pop(ref)
                try:
                    replies[u] = self._actors.ray.get(ref)
                except Exception as err:
                    cause = self._actors.remote_error(err, u, "step")
                    if not isinstance(cause, WorkerError):  # raised by a sub-env
                        raise cause  # noqa: B904  (remote_error chained the cause)
                    replies[u] = self._replace(u, cause, lost)
        except BaseException:
            self._in_flight.discard()
            raise
        return self._gather(replies, lost)

    def _replace(self, u: int, cause: BaseException, lost: dict[int, BaseException]) -> Any:
        """A new actor ``u`` in place of a lost one (or the failure raised); its sub-envs'
        slots fail with ``cause``."""
        if self.restart_policy is None:
            self._actors.kill(self._actors.actors[u])
            raise cause
        reply = self._actors.replace(u, cause)
        rows = self.unit_rows[u]
        lost.update(dict.fromkeys(range(rows.start, rows.stop), cause))
        return reply

    def _gather(self, replies: list[Any], lost: dict[int, BaseException]) -> MultiAgentStep:
        b = self._buffers
        infos: list[dict[str, Any]] = []
        errors: dict[int, BaseException] = dict(lost)
        self._failed[:] = False
        for rows, reply in zip(self.unit_rows, replies):
            for buf, arrays in zip(b.groups, reply.groups):
                for name, value in arrays.items():
                    _copy_rows(getattr(buf, name), value, rows)
            b.env_done[rows] = reply.env_done
            b.env_reward[rows] = reply.env_reward
            b.unassigned_reward[rows] = reply.unassigned_reward
            if reply.failed is not None:
                self._failed[rows] = reply.failed
            errors.update(reply.errors or {})
            infos.extend(reply.infos)
        for i in lost:  # a replaced actor's sub-envs: no transition, new episodes
            self._failed[i] = True
            b.env_done[i], b.env_reward[i], b.unassigned_reward[i] = False, 0.0, 0.0
            for buf in b.groups:
                buf.completed[i] = False
        return MultiAgentStep(
            groups={g.policy_id: buf for g, buf in zip(self.groups, b.groups)},
            env_done=b.env_done,
            env_reward=b.env_reward,
            unassigned_reward=b.unassigned_reward,
            infos=infos,
            failed=self._failed if self._failed.any() else None,
            errors=errors or None,
        )

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        self._check_open("reset_at")
        self._check_index(index)
        u = index // self.config.envs_per_actor
        rows = self.unit_rows[u]
        try:
            ref = self._actors.actors[u].reset_at.remote(index - rows.start, seed, options)
            reply = self._actors.ray.get(ref, timeout=self.config.step_timeout_s)
        except Exception as err:
            raise self._actors.remote_error(err, u, "reset_at")  # noqa: B904  (chained)
        for buf, arrays in zip(self._buffers.groups, reply.groups):
            for name, value in arrays.items():
                _copy_rows(getattr(buf, name), value, rows)
        return reply.infos[index - rows.start]

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        self._check_open("call")
        return self._actors.call_each("call", name, args, kwargs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        self._check_open("get_attr")
        return self._actors.call_each("get_attr", name)

    def set_attr(self, name: str, values: Any) -> None:
        self._check_open("set_attr")
        self._actors.set_attr(name, self._values_per_env(name, values))

    def render(self) -> tuple[Any, ...]:
        self._check_open("render")
        return self._actors.call_each("render")

    def get_num_restarts(self) -> int:
        self._check_open("get_num_restarts")
        return self._actors.num_restarts()

    def _close_backend(self) -> None:
        self._actors.close()
        self._in_flight.clear()


def _copy_rows(dst: Any, src: Any, rows: slice) -> None:
    if isinstance(dst, dict):
        for key in dst:
            _copy_rows(dst[key], src[key], rows)
    elif isinstance(dst, tuple):
        for d, s in zip(dst, src):
            _copy_rows(d, s, rows)
    else:
        dst[rows] = src


__all__ = ["AgentEnvWorker", "BlockReply", "RayMultiAgentVectorEnv"]

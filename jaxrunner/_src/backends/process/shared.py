"""The shared-memory block both sides read and write in place (both import it): observations,
rewards, flags, actions and each sub-env's step progress, carved into numpy views by a
:class:`BlockLayout`, which also makes the transport generic over the kind of sub-env
(:class:`Layout` for gymnasium's, :class:`AgentLayout` for PettingZoo's)."""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import gymnasium
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.agent_block import AgentBlock
from jaxrunner._src.backends.allocators import Allocator, Carver
from jaxrunner._src.backends.base import check_equal_spaces
from jaxrunner._src.backends.gymnasium_block import GymnasiumBlock
from jaxrunner._src.backends.multi_agent.action_check import ActionCheck
from jaxrunner._src.backends.process.protocol import StepReply
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.steps import (
    AgentStepBuffers,
    BatchStep,
    MultiAgentStep,
    StepBuffers,
    StepViews,
    fail_slot,
)
from jaxrunner._src.backends.sub_env_block import PerSize, SubEnvBlock, failed_mask
from jaxrunner._src.core.agent_groups import AgentGroup, AgentsDescription, PolicyMappingFn
from jaxrunner.errors import InvalidArgumentTypeError, SpaceMismatchError


class Views(NamedTuple):
    """Numpy views of a shared block (all ``[num_envs, ...]``)."""

    buffers: Any  # the kind's: StepBuffers, AgentStepBuffers
    action: Any
    status: Any  # each sub-env's step progress (a memoryview in the worker)
    steps: Any = None  # multi-agent: the steps the main process returns


class BlockLayout(abc.ABC):
    """What a kind of sub-env brings to the process backend (pickled to each worker with
    the shared block); one subclass per kind. Both sides call :meth:`views` on the same
    block."""

    num_envs: int

    @abc.abstractmethod
    def allocate(self, alloc: Allocator) -> tuple[Any, Any]:
        """The kind's step buffers and action buffers, from ``alloc``."""

    def _carve(self, buffer: Any) -> tuple[Views, int]:
        """The views of ``buffer`` (None: only counts) and the block's size in bytes."""
        carve = Carver(buffer, self.num_envs)
        buffers, action = self.allocate(carve)
        return Views(buffers, action, carve.take((self.num_envs,), np.int8)), carve.offset

    @property
    def nbytes(self) -> int:
        return self._carve(None)[1]

    def views(self, buffer: Any) -> Views:
        return self._carve(buffer)[0]

    @abc.abstractmethod
    def check_report(self, report: dict[str, Any], where: str) -> None:
        """Raises unless a (restarted) worker's start report describes sub-envs of this
        layout's kind and spaces (``where`` names them)."""

    # -- worker side

    @abc.abstractmethod
    def block(self, worker: Any, views: Any, policy: RestartPolicy | None) -> SubEnvBlock:
        """The worker's step loop over its sub-envs (``worker.envs``, ``worker.fns``,
        from ``worker.offset``), with ``views.status`` as their progress marks."""

    @abc.abstractmethod
    def actions_reader(self, views: Any) -> Callable[[int, int], list[Any]]:
        """``read(lo, hi)``: sub-envs ``[lo, hi)``'s actions, copied out of the shared
        buffer (an env may keep its action)."""

    # -- main side

    @functools.cached_property
    def action_checks(self) -> PerSize:
        """``action_checks[num](actions)`` validates a batch of ``num`` actions, before any
        sub-env steps (built on the main side, after the layout was pickled for workers)."""
        return PerSize(self.action_check)

    @abc.abstractmethod
    def action_check(self, num: int) -> Callable[[Any], Any]:
        """The check of a batch of ``num`` actions (built once per batch size)."""

    @abc.abstractmethod
    def write_actions(self, views: Any, actions: Any, lo: int, hi: int) -> None:
        """Writes a checked batch of ``hi - lo`` actions to rows ``[lo, hi)``."""

    @abc.abstractmethod
    def fail_slot(self, views: Any, index: int) -> None:
        """Sub-env ``index``'s slot of the step under way holds no transition (its
        worker died): written in place of the worker's results."""

    @abc.abstractmethod
    def result(self, views: Any, lo: int, hi: int, whole: bool, out: StepReply) -> Any:
        """Sub-envs ``[lo, hi)``'s step, read from ``views`` once their workers are done
        (``whole``: every env, in one lockstep call) and from their replies, ``out``."""

    @abc.abstractmethod
    def reset_result(self, views: Any, infos: list[dict[str, Any]]) -> Any:
        """What ``reset_batch`` returns once every sub-env was reset (``infos``)."""

    @abc.abstractmethod
    def reset_at_result(self, views: Any, index: int, info: dict[str, Any]) -> Any:
        """What ``reset_at(index)`` returns once sub-env ``index`` was reset."""


@dataclasses.dataclass(frozen=True)
class Layout(BlockLayout):
    """The single-agent (gymnasium) block: where each stacked buffer lives; both sides
    compute the same offsets from the same spaces and ``num_envs``."""

    observation_space: gymnasium.Space
    action_space: gymnasium.Space
    num_envs: int

    @classmethod
    def from_reports(cls, reports: list[dict[str, Any]], num_envs: int) -> Layout:
        """Checks the workers' sub-envs (gymnasium envs of equal, supported spaces); the
        block of their spaces."""
        if "spaces" not in reports[0]:
            raise InvalidArgumentTypeError(
                "ProcessVectorEnv: the env factories made multi-agent (PettingZoo) envs; "
                "build them with jaxrunner.make_vec(env_fn, num_envs, backend='process'), "
                "which builds either kind."
            )
        env_spaces = [pair for report in reports for pair in report["spaces"]]
        check_equal_spaces(env_spaces)
        observation_space, action_space = env_spaces[0]
        return cls(observation_space, action_space, num_envs)

    def check_report(self, report: dict[str, Any], where: str) -> None:
        spaces = (self.observation_space, self.action_space)
        for pair in report.get("spaces", [None]):
            if pair != spaces:
                raise SpaceMismatchError(
                    f"{where} has spaces {pair}, the vector env {spaces}; every sub-env must "
                    "have equal spaces."
                )

    def allocate(self, alloc: Allocator) -> tuple[StepBuffers, Any]:
        buffers = StepBuffers(self.observation_space, self.num_envs, alloc)
        return buffers, alloc.space(self.action_space)

    def block(self, worker: Any, views: Views, policy: RestartPolicy | None) -> GymnasiumBlock:
        w, space = worker, self.observation_space
        return GymnasiumBlock(w.envs, w.fns, w.offset, views.buffers, space, policy, views.status)

    def actions_reader(self, views: Views) -> Callable[[int, int], list[Any]]:
        space, buffer = self.action_space, views.action
        if isinstance(space, (gymnasium.spaces.Dict, gymnasium.spaces.Tuple)):
            return lambda lo, hi: [space_arrays.take(space, buffer, i) for i in range(lo, hi)]
        if buffer.ndim == 1:
            return lambda lo, hi: list(buffer[lo:hi])  # numpy scalars are copies
        return lambda lo, hi: list(buffer[lo:hi].copy())

    def action_check(self, num: int) -> Callable[[Any], Any]:
        return space_arrays.action_batch_check(self.action_space, num)

    def write_actions(self, views: Views, actions: Any, lo: int, hi: int) -> None:
        space_arrays.copy_into(self.action_space, views.action, actions, slice(lo, hi))

    def fail_slot(self, views: Views, index: int) -> None:
        fail_slot(views.buffers, self.observation_space, index)

    def result(self, views: Views, lo: int, hi: int, whole: bool, out: StepReply) -> BatchStep:
        step_infos: list[dict[str, Any]] = [{} for _ in range(hi - lo)]
        for i, info in out.infos.items():
            step_infos[i - lo] = info
        ended = (views.buffers.terminated[lo:hi] | views.buffers.truncated[lo:hi]).nonzero()[0]
        all_reset_infos = {lo + int(j): {} for j in ended} if len(ended) else {}
        all_reset_infos.update(out.reset_infos)
        return views.buffers.batch_step(
            self.observation_space,
            None if whole else slice(lo, hi),
            step_infos,
            all_reset_infos,
            failed_mask(out.failed, lo, hi) if out.failed else None,
            out.errors or None,
        )

    def reset_result(self, views: Views, infos: list[dict[str, Any]]) -> tuple[Any, list[dict]]:
        return views.buffers.obs, infos

    def reset_at_result(self, views: Views, index: int, info: dict[str, Any]) -> tuple[Any, dict]:
        return space_arrays.take(self.observation_space, views.buffers.obs, index), info


@dataclasses.dataclass(frozen=True)
class AgentLayout(BlockLayout):
    """The multi-agent block: every group's buffers, the env-level arrays, every group's
    actions and the progress marks."""

    groups: tuple[AgentGroup, ...]
    num_envs: int
    description: AgentsDescription  # sub-env 0's agents and spaces, which all must have

    @classmethod
    def from_reports(
        cls, reports: list[dict[str, Any]], num_envs: int, policy_mapping_fn: PolicyMappingFn | None
    ) -> AgentLayout:
        """Checks the workers' sub-envs (PettingZoo envs of equal agents and spaces); the
        block of their groups under ``policy_mapping_fn``."""
        if "agents" not in reports[0]:
            raise InvalidArgumentTypeError(
                "ProcessMultiAgentVectorEnv: the env factory made a gymnasium env, not a "
                "PettingZoo one; build either kind with jaxrunner.make_vec()."
            )
        described: list[AgentsDescription] = [d for r in reports for d in r["agents"]]
        first = described[0]
        layout = cls(first.groups(policy_mapping_fn), num_envs, first)
        for i, description in enumerate(described):
            layout._check_description(description, f"multi-agent sub-env {i}")
        return layout

    def _check_description(self, description: Any, where: str) -> None:
        if description != self.description:
            raise SpaceMismatchError(
                f"{where} has agents {description}, sub-env 0 has {self.description}; every "
                "sub-env must have the same agents and spaces. Check the factory."
            )

    def check_report(self, report: dict[str, Any], where: str) -> None:
        for description in report.get("agents", [None]):
            self._check_description(description, where)

    def allocate(self, alloc: Allocator) -> tuple[AgentStepBuffers, list[Any]]:
        buffers = AgentStepBuffers.allocate(self.groups, self.num_envs, alloc)
        return buffers, [alloc.space(g.action_space, (g.num_agents,)) for g in self.groups]

    def views(self, buffer: Any) -> Views:
        views = super().views(buffer)
        policy_ids = tuple(g.policy_id for g in self.groups)
        return views._replace(steps=StepViews(views.buffers, policy_ids))

    def block(self, worker: Any, views: Views, policy: RestartPolicy | None) -> AgentBlock:
        envs, offset = worker.envs, worker.offset
        return AgentBlock(
            envs,
            self.groups,
            offset,
            fns=worker.fns,
            restart_policy=policy,
            buffers=views.buffers.rows(slice(offset, offset + len(envs))),
            status=views.status,
        )

    def actions_reader(self, views: Views) -> Callable[[int, int], list[Any]]:
        # Copies: an env may keep its action, and the main process rewrites the buffer.
        groups = [(g.action_space, a) for g, a in zip(self.groups, views.action)]
        return lambda lo, hi: [space_arrays.take(s, a, slice(lo, hi)) for s, a in groups]

    def action_check(self, num: int) -> ActionCheck:
        return ActionCheck(self.groups, num)

    def write_actions(self, views: Views, actions: Any, lo: int, hi: int) -> None:
        for group, dst, src in zip(self.groups, views.action, actions):
            space_arrays.copy_into(group.action_space, dst, src, slice(lo, hi))

    def fail_slot(self, views: Views, index: int) -> None:
        # The replacement's sub-envs are reset by then: who acts next is theirs.
        views.buffers.fail_row(index)

    def result(self, views: Views, lo: int, hi: int, whole: bool, out: StepReply) -> MultiAgentStep:
        block_infos = [out.infos.get(i, {}) for i in range(lo, hi)]
        return views.steps.step(lo, hi, block_infos, out.failed, out.errors)

    def reset_result(self, views: Views, infos: list[dict[str, Any]]) -> MultiAgentStep:
        return views.steps.step(0, self.num_envs, infos)

    def reset_at_result(self, views: Views, index: int, info: dict[str, Any]) -> dict:
        return info

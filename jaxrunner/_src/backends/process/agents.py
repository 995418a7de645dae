"""``backend="process"``'s multi-agent (PettingZoo) kind: its block layout and its shell over
:class:`~.vector_env.ProcessBackend`. See docs/multi-agent.md and docs/backends/process.md."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jaxrunner._src.backends.allocators import Allocator
from jaxrunner._src.backends.multi_agent.action_check import ActionCheck
from jaxrunner._src.backends.multi_agent.agent_block import AgentBlock
from jaxrunner._src.backends.multi_agent.buffers import (
    AgentStepBuffers,
    MultiAgentStep,
    StepViews,
)
from jaxrunner._src.backends.multi_agent.vector_env import MultiAgentVectorEnv
from jaxrunner._src.backends.process.config import ProcessConfig
from jaxrunner._src.backends.process.shared import BlockLayout, StepOutcome, Views
from jaxrunner._src.backends.process.transport import ProcessTransport, Report
from jaxrunner._src.backends.process.vector_env import ProcessBackend
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.sub_env_block import EnvFactory
from jaxrunner._src.core.agent_groups import AgentGroup, AgentsDescription, PolicyMappingFn
from jaxrunner.errors import InvalidArgumentTypeError, SpaceMismatchError


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
        return lambda lo, hi: [np.array(a[lo:hi]) for a in views.action]

    def action_check(self, num: int) -> ActionCheck:
        return ActionCheck(self.groups, num)

    def write_actions(self, views: Views, actions: Any, lo: int, hi: int) -> None:
        for dst, src in zip(views.action, actions):
            dst[lo:hi] = src

    def fail_slot(self, views: Views, index: int) -> None:
        # The replacement's sub-envs are reset by then: who acts next is theirs.
        views.buffers.fail_row(index)

    def result(
        self, views: Views, lo: int, hi: int, whole: bool, out: StepOutcome
    ) -> MultiAgentStep:
        block_infos = [out.infos.get(i, {}) for i in range(lo, hi)]
        return views.steps.step(lo, hi, block_infos, out.failed, out.errors)

    def reset_result(self, views: Views, infos: list[dict[str, Any]]) -> MultiAgentStep:
        return views.steps.step(0, self.num_envs, infos)

    def reset_at_result(self, views: Views, index: int, info: dict[str, Any]) -> dict:
        return info


class ProcessMultiAgentVectorEnv(ProcessBackend, MultiAgentVectorEnv):
    """Multi-agent sub-envs in worker processes (see docs/multi-agent.md): the multi-agent
    shell of :class:`~.vector_env.ProcessBackend`, step for step equal to the sync
    multi-agent backend for the same seeds and actions, whatever the number of workers.
    ``config``, ``restart_policy``, faults and their accounting are as for
    :class:`~jaxrunner.ProcessVectorEnv`; ``policy_mapping_fn`` as for the sync backend.
    """

    _reset_call = "reset_batch"

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        policy_mapping_fn: PolicyMappingFn | None = None,
        *,
        config: ProcessConfig | None = None,
        restart_policy: RestartPolicy | None = None,
        _transport: ProcessTransport | None = None,
    ) -> None:
        super().__init__()
        self._mapping = policy_mapping_fn
        self._start(env_fns, config, restart_policy, "make_vec", _transport)

    def _layout_for(self, reports: list[Report]) -> AgentLayout:
        layout = AgentLayout.from_reports(reports, self.num_envs, self._mapping)
        self.groups, self.turn_based = layout.groups, layout.description.turn_based
        return layout

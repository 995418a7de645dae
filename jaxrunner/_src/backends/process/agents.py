"""``backend="process"`` for multi-agent (PettingZoo) envs: the process transport with the
multi-agent layout. See docs/multi-agent.md and docs/backends/process.md."""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable, MutableSequence, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxrunner._src.backends.batch_step import EnvIds
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.multi_agent.action_check import ActionCheck
from jaxrunner._src.backends.multi_agent.agent_block import (
    AgentBlock,
)
from jaxrunner._src.backends.multi_agent.buffers import (
    AgentStepBuffers,
    GroupBuffers,
    MultiAgentStep,
    StepViews,
)
from jaxrunner._src.backends.multi_agent.vector_env import MultiAgentVectorEnv
from jaxrunner._src.backends.process.config import ProcessConfig, checked_config
from jaxrunner._src.backends.process.handle import Resources, shutdown
from jaxrunner._src.backends.process.launch import default_num_workers, worker_bounds
from jaxrunner._src.backends.process.shared import Carver
from jaxrunner._src.backends.process.transport import Report, TransportForwarding
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.sub_env_block import EnvFactory
from jaxrunner._src.core.agent_groups import AgentGroup, AgentsDescription, PolicyMappingFn
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError, SpaceMismatchError


class AgentViews(NamedTuple):
    """Numpy views of a multi-agent shared block (all ``[num_envs, ...]``)."""

    buffers: AgentStepBuffers
    action: list[Any]
    """Group ``g``'s actions, ``[B, A_g, ...]``."""
    status: np.ndarray
    steps: StepViews
    """The steps the main process returns, views of :attr:`buffers`."""


@dataclasses.dataclass(frozen=True)
class AgentLayout:
    """The multi-agent block: every group's buffers and actions, then the env-level
    arrays and the progress marks (a :class:`~.shared.BlockLayout`)."""

    groups: tuple[AgentGroup, ...]
    num_envs: int

    def _carve(self, buffer: Any) -> tuple[AgentViews, int]:
        carve = Carver(buffer, self.num_envs)
        n = self.num_envs
        groups, actions = [], []
        # Counting only (no buffer): no views to build.
        of: Callable[..., Any] = GroupBuffers.of if buffer is not None else dict
        for group in self.groups:
            lead = (group.num_agents,)
            shape = (n, group.num_agents)
            groups.append(
                of(
                    obs=carve.space(group.observation_space, lead),
                    acting=carve.take(shape, np.bool_),
                    agent_start=carve.take(shape, np.bool_),
                    completed=carve.take(shape, np.bool_),
                    reward=carve.take(shape, np.float64),
                    terminated=carve.take(shape, np.bool_),
                    truncated=carve.take(shape, np.bool_),
                    next_obs=carve.space(group.observation_space, lead),
                )
            )
            actions.append(carve.space(group.action_space, lead))
        buffers = AgentStepBuffers(
            groups,
            carve.take((n,), np.bool_),
            carve.take((n,), np.float64),
            carve.take((n,), np.float64),
        )
        status = carve.take((n,), np.int8)
        if buffer is None:
            return None, carve.offset  # type: ignore[return-value]
        policy_ids = tuple(g.policy_id for g in self.groups)
        return AgentViews(buffers, actions, status, StepViews(buffers, policy_ids)), carve.offset

    @property
    def nbytes(self) -> int:
        return self._carve(None)[1]

    def views(self, buffer: Any) -> AgentViews:
        return self._carve(buffer)[0]

    # -- worker side

    def block(
        self,
        envs: list[Any],
        fns: Sequence[Callable[[], Any]],
        offset: int,
        views: AgentViews,
        restart_policy: RestartPolicy | None,
        status: MutableSequence[int],
    ) -> AgentBlock:
        buffers = views.buffers.rows(slice(offset, offset + len(envs)))
        return AgentBlock(
            envs,
            self.groups,
            offset,
            fns=fns,
            restart_policy=restart_policy,
            buffers=buffers,
            status=status,
        )

    def actions_reader(self, views: AgentViews) -> Callable[[int, int], list[Any]]:
        # Copies: an env may keep its action, and the main process rewrites the buffer.
        return lambda lo, hi: [np.array(a[lo:hi]) for a in views.action]

    # -- main side

    @functools.cached_property
    def _action_checks(self) -> dict[int, ActionCheck]:
        return {}

    def check_actions(self, actions: Any, num: int) -> None:
        check = self._action_checks.get(num)
        if check is None:
            check = self._action_checks[num] = ActionCheck(self.groups, num)
        check(actions)

    def write_actions(self, views: AgentViews, actions: Any, lo: int, hi: int) -> None:
        for dst, src in zip(views.action, actions):
            dst[lo:hi] = src

    def fail_slot(self, views: AgentViews, index: int) -> None:
        b = views.buffers
        b.env_done[index], b.env_reward[index], b.unassigned_reward[index] = False, 0.0, 0.0
        for g in b.groups:
            g.completed[index] = False
            g.reward[index] = 0.0
            g.terminated[index] = False
            g.truncated[index] = False
            # The replacement's sub-envs are reset by then: who acts next is theirs, and
            # acting agents act on a new episode.

    def result(
        self,
        views: AgentViews,
        lo: int,
        hi: int,
        whole: bool,
        infos: dict[int, dict[str, Any]],
        reset_infos: dict[int, dict[str, Any]],
        failed: list[int],
        errors: dict[int, BaseException],
    ) -> MultiAgentStep:
        block_infos = [infos.get(i, {}) for i in range(lo, hi)]
        return views.steps.step(lo, hi, block_infos, failed, errors)


class ProcessMultiAgentVectorEnv(TransportForwarding, MultiAgentVectorEnv):
    """Multi-agent sub-envs in worker processes (see docs/multi-agent.md): they step as the
    sync backend steps them, writing every group's buffers into shared memory.

    Step for step equal to the sync multi-agent backend for the same seeds and actions,
    whatever the number of workers.

    Args:
        env_fns: zero-argument factories of PettingZoo envs (picklable by cloudpickle).
        policy_mapping_fn: as for the sync backend.
        config: a :class:`~jaxrunner.ProcessConfig`: ``num_workers`` or
            ``envs_per_worker``, ``start_method``, ``step_timeout_s`` and
            ``spin_wait_us`` and ``ready_first`` apply (default workers: one per CPU, at
            most one per env: the main process waits while they step);
            ``main_process_envs`` does not apply to multi-agent envs yet and is refused.
            Lockstep (the default): ``recv`` answers the sends in order, and the runner
            can pipeline splits (``MultiAgentRunner(num_splits=...)``).
            ``ready_first=True``: ``send`` covers whole workers and ``recv`` answers
            whichever worker's envs are ready (``capabilities.ready_first``), so a slow
            sub-env stalls only its worker's.
        restart_policy: failed sub-envs are recreated inside their worker, and dead or
            hung workers replaced, as the single-agent process backend does (None:
            failures raise and close the vector env).

    Raises:
        InvalidArgumentError: a config option multi-agent envs do not take.
        SpaceMismatchError: sub-envs with different agents or spaces.
        WorkerError, WorkerTimeoutError: a worker died or hung while starting.

    Accounting: as the single-agent process backend's, a failed slot of a replaced
    worker may stand for a step the sub-env had completed before its worker died
    (``num_lost_steps``) or never started (``num_unrun_steps``).
    """

    # Two pipelining splits, as the single-agent process backend: on a quiet 2-core
    # machine MPE simple_spread ran 1.25x / 1.77x / 1.91x the hand loop at 8 / 64 / 256
    # envs with two, 1.18x / 1.64x / 1.74x with one (results/
    # multi_agent_host_quiet_cpu.json; a loaded run had shown the reverse).
    capabilities = Capabilities(can_restart=True, steps_in_background=True, pipeline_splits=2)

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        policy_mapping_fn: PolicyMappingFn | None = None,
        *,
        config: ProcessConfig | None = None,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        super().__init__()
        self._res = Resources()
        self._finalizer = weakref.finalize(self, shutdown, self._res)
        self._closed_reason = "construction failed"  # until the workers are up
        config = checked_config(config, "make_vec")
        if config.main_process_envs:
            raise InvalidArgumentError(
                "make_vec(<PettingZoo env>, backend='process', config=ProcessConfig(...)): "
                "main_process_envs does not apply to multi-agent envs yet; leave it at its "
                "default."
            )
        self.config, self.restart_policy = config, restart_policy
        if config.ready_first:
            self.capabilities = Capabilities(
                can_restart=True, steps_in_background=True, ready_first=True
            )
        self.num_envs = len(env_fns)
        self._mapping = policy_mapping_fn
        num_workers = config.num_workers
        if num_workers is None and config.envs_per_worker is None:
            # lockstep: the main process waits while the workers step
            num_workers = default_num_workers(self.num_envs, main_process="waits")
        bounds = worker_bounds(self.num_envs, config.envs_per_worker, num_workers)
        self._start_transport(env_fns, bounds, config, restart_policy)
        self._bounds = bounds
        self._stepper = self._transport.stepper

    def _layout_for(self, reports: list[Report]) -> AgentLayout:
        if "agents" not in reports[0]:
            raise InvalidArgumentTypeError(
                "ProcessMultiAgentVectorEnv: the env factory made a gymnasium env, not a "
                "PettingZoo one; build either kind with jaxrunner.make_vec()."
            )
        described: list[AgentsDescription] = [d for r in reports for d in r["agents"]]
        self._description = described[0]
        for i, description in enumerate(described):
            self._check_description(description, f"multi-agent sub-env {i}")
        self.groups = self._description.groups(self._mapping)
        self.turn_based = self._description.turn_based
        return AgentLayout(self.groups, self.num_envs)

    def _check_description(self, description: Any, where: str) -> None:
        if description != self._description:
            raise SpaceMismatchError(
                f"{where} has agents {description}, sub-env 0 has {self._description}; every "
                "sub-env must have the same agents and spaces. Check the factory."
            )

    def _check_report(self, report: Report, where: str) -> None:
        for description in report.get("agents", [None]):
            self._check_description(description, where)

    @property
    def step_timeout_s(self) -> float | None:
        """How long a worker may take to answer a command (None: forever)."""
        return self.config.step_timeout_s

    @property
    def worker_pids(self) -> list[int | None]:
        """The worker processes' ids (for monitoring; empty once closed)."""
        return [w.pid for w in self._res.workers]

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> MultiAgentStep:
        self._check_open("reset_batch")
        infos = self._transport.reset(seeds, options)
        step = self._transport.layout.result(
            self._transport.views, 0, self.num_envs, True, {}, {}, [], {}
        )
        return step._replace(infos=infos)

    def send(self, actions: Sequence[Any], env_ids: EnvIds = None) -> None:
        """Validates ``actions``, writes them to shared memory and tells the workers of
        ``env_ids`` to step; returns without waiting. Lockstep: any block (a send of
        rows still in flight goes out once those are received). Ready-first:
        ``env_ids`` covers whole workers, none of them in flight."""
        self._check_open("step")
        self._stepper.send(actions, env_ids, per_worker=self.config.ready_first)

    def recv(self) -> MultiAgentStep:
        """Lockstep: the oldest send's step. Ready-first: the step of the first worker
        to answer (``env_ids`` its envs)."""
        self._check_open("step")
        return self._stepper.recv()

    def step_batch(self, actions: Sequence[Any]) -> MultiAgentStep:
        """Every env's step (in ready-first mode too); nothing in flight: straight to
        the result."""
        self._check_open("step")
        return self._transport.step_all(actions, None, self.config.ready_first)

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        self._check_open("reset_at")
        self._check_index(index)
        return self._transport.reset_at(index, seed, options)

    @property
    def num_restarts(self) -> int:
        """Sub-envs recreated inside their worker after a failure."""
        return self._stepper.num_restarts

    def _close_backend(self) -> None:
        self._finalizer()

"""Multi-agent vector envs: B PettingZoo sub-envs stepped together into group arrays.
See docs/multi-agent.md."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from jaxrunner._src.backends.base import BaseVectorEnv, check_env_fns, check_seed_count
from jaxrunner._src.backends.batch_step import EnvIds
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.in_process import BlockForwarding, InProcessSends
from jaxrunner._src.backends.multi_agent.action_check import ActionCheck
from jaxrunner._src.backends.multi_agent.agent_block import AgentBlock, env_groups
from jaxrunner._src.backends.multi_agent.buffers import MultiAgentStep, StepViews
from jaxrunner._src.backends.multi_agent.drivers import Driver, make_driver
from jaxrunner._src.backends.restarts import RestartPolicy, check_restart_policy, closing_on_error
from jaxrunner._src.backends.snapshots import SnapshotRefusedError
from jaxrunner._src.backends.sub_env_block import EnvFactory, build_envs
from jaxrunner._src.core.agent_groups import GroupedAgents, PolicyMappingFn
from jaxrunner.errors import InvalidArgumentError


class MultiAgentVectorEnv(GroupedAgents, BaseVectorEnv):
    """Base of the multi-agent backends (the contract: docs/multi-agent.md): the core's
    :class:`~jaxrunner._src.backends.base.BaseVectorEnv` with multi-agent steps."""

    multi_agent = True
    turn_based: bool
    """AEC sub-envs: one agent acts per step."""

    @abc.abstractmethod
    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> MultiAgentStep:
        """Resets sub-env ``i`` with ``seeds[i]``; the step says who acts first on what.
        The results of sends not yet received are dropped."""

    @abc.abstractmethod
    def send(self, actions: Sequence[Any], env_ids: EnvIds = None) -> None:
        """Starts one step of the contiguous block ``env_ids`` (None: every env; else a
        slice with step 1): ``actions[g]`` is group ``g``'s ``[hi - lo, A_g, ...]``
        batch, validated whole before any sub-env steps. Sends of disjoint blocks may
        be in flight together."""

    @abc.abstractmethod
    def recv(self) -> MultiAgentStep:
        """The results of one earlier :meth:`send` (the oldest, unless
        ``capabilities.ready_first``: then a block whose envs are ready);
        ``MultiAgentStep.env_ids`` says which envs they are."""

    def step_batch(self, actions: Sequence[Any]) -> MultiAgentStep:
        """Steps every sub-env once (:meth:`send` of every env, then :meth:`recv`)."""
        self.send(actions, None)
        return self.recv()

    @abc.abstractmethod
    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Resets sub-env ``index`` alone (the others are untouched); returns its reset
        infos. Its row of the buffers then holds the new episode's first agents."""


class SyncMultiAgentVectorEnv(BlockForwarding, InProcessSends, MultiAgentVectorEnv):
    """Every sub-env in this process, stepped in turn.

    Args:
        env_fns: zero-argument factories of PettingZoo envs, one per sub-env.
        policy_mapping_fn: ``agent_id -> policy_id`` (None: one shared policy per
            distinct pair of observation and action spaces).
        restart_policy: failed sub-envs are recreated as it says, and their step yields
            no transition (``MultiAgentStep.failed``); None (default): failures raise.
    """

    capabilities = Capabilities(can_restart=True, can_snapshot=True)
    _block: AgentBlock

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        policy_mapping_fn: PolicyMappingFn | None = None,
        *,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        super().__init__()
        check_env_fns("SyncMultiAgentVectorEnv", env_fns)
        check_restart_policy("SyncMultiAgentVectorEnv", restart_policy)
        self.restart_policy = restart_policy
        envs = build_envs(env_fns, 0)
        self._closed_reason = "construction failed"  # until it succeeds
        with closing_on_error(envs):
            self.groups = env_groups(envs[0], policy_mapping_fn)
            self._block = AgentBlock(envs, self.groups, fns=env_fns, restart_policy=restart_policy)
        self._closed_reason = None
        self.num_envs = len(envs)
        self.turn_based = self._block.turn_based
        self._views = StepViews(self._block.step_buffers, self.policy_ids)
        self._checks: dict[int, ActionCheck] = {}

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> MultiAgentStep:
        self._check_open("reset_batch")
        check_seed_count(seeds, self.num_envs, type(self).__name__)
        self._sent.clear()  # sends not yet received are dropped, as on every backend
        return self._block.result(self._block.reset(seeds, options))

    def _checked(self, actions: Sequence[Any], rows: slice | None) -> Any:
        n = self.num_envs if rows is None else rows.stop - rows.start
        check = self._checks.get(n)
        if check is None:
            check = self._checks[n] = ActionCheck(self.groups, n)
        return check(actions)

    def _step(self, actions: Any, rows: slice | None) -> MultiAgentStep:
        lo, hi = (0, self.num_envs) if rows is None else (rows.start, rows.stop)
        infos, errors = self._block.step_rows(lo, hi, actions)
        failed = self._block.failed_rows(errors) if errors else None
        return self._views.step(lo, hi, infos, failed, errors)

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        self._check_open("reset_at")
        self._check_index(index)
        return self._block.reset_or_restart(index, seed, options)

    _state_keys = frozenset({"driver"})

    def _state_of(self, j: int) -> dict[str, Any]:
        """A sub-env's driver state, pickled with the env (the driver's references into it
        stay shared)."""
        return {"driver": self._block.drivers[j].get_state()}

    def _restored(self, j: int, snapshot: dict[str, Any]) -> Driver:
        """Sub-env ``j``'s snapshot as a driver of row ``j`` (not yet installed)."""
        env, kind = snapshot["env"], type(self._block.drivers[j])
        try:
            driver = make_driver(env, j, self._block.layout)
        except InvalidArgumentError as err:
            problem = f"holds a {type(env).__name__}, not a PettingZoo env"
            raise SnapshotRefusedError(j, problem) from err
        if type(driver) is not kind:
            problem = f"holds a {type(env).__name__}, not stepped as a {kind.__name__}"
            raise SnapshotRefusedError(j, problem)
        agents = getattr(env, "possible_agents", None)
        if agents is None or tuple(agents) != self._block.possible_agents:
            problem = (
                f"holds an env with possible_agents {agents!r}, not "
                f"{list(self._block.possible_agents)}"
            )
            raise SnapshotRefusedError(j, problem)
        try:
            driver.set_state(snapshot["driver"])
        except InvalidArgumentError as err:
            raise SnapshotRefusedError(j, f"holds a driver state that is refused ({err})") from err
        return driver

    def _install(self, restored: list[Any]) -> None:
        self._block.envs[:] = [driver.env for driver in restored]
        self._block.drivers[:] = restored

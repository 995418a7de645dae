"""``backend="sync"``: every sub-env in this process, stepped in turn by its kind's block
(:mod:`~jaxrunner._src.backends.gymnasium_block`, :mod:`~jaxrunner._src.backends.agent_block`),
with a shell for each kind."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import gymnasium

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.agent_block import AgentBlock, env_groups
from jaxrunner._src.backends.base import (
    MultiAgentVectorEnv,
    VectorEnv,
    check_equal_spaces,
    env_spaces,
)
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.env_api import is_multi_agent_env
from jaxrunner._src.backends.gymnasium_block import GymnasiumBlock
from jaxrunner._src.backends.in_process import BlockForwarding, InProcessSends
from jaxrunner._src.backends.multi_agent.action_check import ActionCheck
from jaxrunner._src.backends.multi_agent.drivers import Driver, make_driver
from jaxrunner._src.backends.restarts import RestartPolicy, closing_on_error
from jaxrunner._src.backends.snapshots import SnapshotRefusedError
from jaxrunner._src.backends.steps import BatchStep, MultiAgentStep, StepBuffers, StepViews
from jaxrunner._src.backends.sub_env_block import EnvFactory, PerSize, failed_mask
from jaxrunner._src.core.agent_groups import PolicyMappingFn
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


class SyncVectorEnv(BlockForwarding, InProcessSends, VectorEnv):
    """Sub-envs in this process, stepped one after another, with validated,
    in-place writes into stacked buffers.

    Step for step equal to ``gymnasium.vector.SyncVectorEnv(env_fns,
    autoreset_mode=SAME_STEP)`` for the same seeds and actions.

    Args:
        env_fns: zero-argument factories, one per sub-env.
        copy: if True, ``reset``/``step`` return copies of the observation buffer
            (as gymnasium's does); the runner's batch methods never copy.
        restart_policy: if given, a sub-env that fails is recreated and reset as this
            policy says, and sampling goes on (see :class:`~jaxrunner.RestartPolicy`); if None
            (default), the failure raises.
    """

    capabilities = Capabilities(can_restart=True, can_snapshot=True)
    _block: GymnasiumBlock

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        *,
        copy: bool = True,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        super().__init__(copy=copy)
        self.envs: list[gymnasium.Env] = self._build_envs(env_fns, restart_policy)
        self.env_fns = list(env_fns)
        with closing_on_error(self.envs):
            self.num_envs, first = len(self.envs), self.envs[0]
            if is_multi_agent_env(first):  # its spaces are methods, which the check misreads
                raise InvalidArgumentTypeError(
                    f"SyncVectorEnv: sub-env 0 ({type(first).__name__}) is a PettingZoo env; "
                    "build multi-agent envs with jaxrunner.make_vec(env_fn, num_envs, backend)."
                )
            check_equal_spaces(env_spaces(self.envs))
            self._take_spaces(
                first.observation_space, first.action_space, first.metadata, first.render_mode
            )
        self._closed_reason = None
        obs_space = self.single_observation_space
        self._buffers = StepBuffers(obs_space, self.num_envs)
        self._obs = self._buffers.obs
        self._block = GymnasiumBlock(
            self.envs, self.env_fns, 0, self._buffers, obs_space, restart_policy
        )
        self._actions = PerSize(
            functools.partial(space_arrays.make_action_splitter, self.single_action_space)
        )
        self._split_passed = space_arrays.passed_action_splitter(self.single_action_space)

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, list[dict[str, Any]]]:
        self._begin_reset(seeds)
        return self._obs, self._block.reset(seeds, options)

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._check_open("reset_at")
        self._check_reset_at(index, seed, options)
        info = self._block.reset_or_restart(index, seed, options)
        return space_arrays.take(self.single_observation_space, self._obs, index), info

    def _checked(self, actions: Any, rows: slice | None) -> list[Any]:
        return self._actions[self.num_envs if rows is None else rows.stop - rows.start](actions)

    def _passed(self, actions: Any, rows: slice | None) -> list[Any]:
        if self._split_passed is None:  # (a composite batch is never vouched for)
            return self._checked(actions, rows)
        return self._split_passed(actions)

    def _step(self, per_env: list[Any], rows: slice | None) -> BatchStep:
        lo, hi = (0, self.num_envs) if rows is None else (rows.start, rows.stop)
        out = self._block.step(lo, hi, per_env)
        return self._buffers.batch_step(
            self.single_observation_space,
            None if rows is None else slice(lo, hi),
            out.infos,
            out.reset_infos,
            failed_mask(out.failed, lo, hi) if out.failed else None,
            out.errors or None,
        )

    _snapshot_of = "gymnasium.Env"

    def _bare(self, snapshot: Any) -> bool:
        return isinstance(snapshot, gymnasium.Env)

    def _restored(self, j: int, snapshot: dict[str, Any]) -> gymnasium.Env:
        env = snapshot["env"]
        if not isinstance(env, gymnasium.Env):
            raise SnapshotRefusedError(j, f"holds a {type(env).__name__}, not a gymnasium.Env")
        return env

    def _install(self, restored: list[Any]) -> None:
        self.envs[:] = restored  # in place: the step loop holds this list


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
        envs = self._build_envs(env_fns, restart_policy)
        with closing_on_error(envs):
            self.groups = env_groups(envs[0], policy_mapping_fn)
            self._block = AgentBlock(envs, self.groups, fns=env_fns, restart_policy=restart_policy)
        self._closed_reason = None
        self.num_envs = len(envs)
        self.turn_based = self._block.turn_based
        self._views = StepViews(self._block.step_buffers, self.policy_ids)
        self._checks = PerSize(functools.partial(ActionCheck, self.groups))

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> MultiAgentStep:
        self._begin_reset(seeds, "reset_batch")
        return self._block.result(self._block.reset(seeds, options))

    def _checked(self, actions: Sequence[Any], rows: slice | None) -> Any:
        return self._check_of(rows)(actions)

    def _passed(self, actions: Sequence[Any], rows: slice | None) -> Any:
        return self._check_of(rows).passed(actions)

    def _check_of(self, rows: slice | None) -> Any:
        """The action check of a block of ``rows`` (None: every env)."""
        return self._checks[self.num_envs if rows is None else rows.stop - rows.start]

    def _step(self, actions: Any, rows: slice | None) -> MultiAgentStep:
        lo, hi = (0, self.num_envs) if rows is None else (rows.start, rows.stop)
        infos, errors = self._block.step_rows(lo, hi, actions)
        failed = self._block.failed_rows(errors) if errors else None
        return self._views.step(lo, hi, infos, failed, errors)

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        self._check_open("reset_at")
        self._check_reset_at(index, seed, options)
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

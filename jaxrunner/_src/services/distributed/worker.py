"""RunnerWorker: one EnvRunner (or MultiAgentRunner) inside a Ray actor, built there
from picklable parts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxrunner._src.backends import make_vec
from jaxrunner._src.backends.multi_agent.make import make_multi_agent_vec
from jaxrunner._src.connectors.moments import Moments, set_statistics, take_deltas
from jaxrunner._src.core.multi_agent_trajectory import MultiAgentTrajectory
from jaxrunner._src.core.policy import Params
from jaxrunner._src.core.trajectory import Trajectory
from jaxrunner._src.runner.env_runner import EnvRunner
from jaxrunner._src.runner.multi_agent_runner import MultiAgentRunner
from jaxrunner._src.services.distributed.config import (
    EPISODE_ID_BITS,
    EnvRunnerGroupConfig,
    PolicyFactory,
)
from jaxrunner.errors import InvalidArgumentError

Statistics = list[Moments] | dict[str, list[Moments]]
"""Connector statistics: a runner's list, or a multi-agent runner's lists by policy id."""


class RunnerWorker:
    """The body of one runner actor: an :class:`~jaxrunner.EnvRunner` (or, with
    ``config.multi_agent``, a :class:`~jaxrunner.MultiAgentRunner`) whose output carries
    group-wide env and episode ids."""

    def __init__(
        self,
        env: str | Callable[[], Any],
        policy_factory: PolicyFactory,
        params: Params,
        params_version: int,
        config: EnvRunnerGroupConfig,
        index: int,
        incarnation: int,
        statistics: Statistics | None = None,
    ) -> None:
        n = config.num_envs_per_runner
        seed = config.runner_seed(index, incarnation)
        self.multi_agent = config.multi_agent
        self.runner: EnvRunner | MultiAgentRunner
        if config.multi_agent:
            menvs = make_multi_agent_vec(
                env,  # type: ignore[arg-type]
                n,
                config.backend,
                policy_mapping_fn=config.policy_mapping_fn,
                config=config.vec_config,
                restart_policy=config.restart_policy,
            )
            policies = {g.policy_id: policy_factory(g.action_space) for g in menvs.groups}
            self.runner = MultiAgentRunner(
                menvs, policies, params, config.rollout_length, seed, **dict(config.runner_options)
            )
        else:
            envs = make_vec(
                env,
                n,
                config.backend,
                config=config.vec_config,
                restart_policy=config.restart_policy,
                **dict(config.env_options),
            )
            policy = policy_factory(envs.single_action_space)
            self.runner = EnvRunner(
                envs,
                policy,
                params,
                config.rollout_length,
                seed,
                **dict(config.runner_options),
            )
        self.params_version = params_version
        if statistics is not None:  # a restart: start from the group's merged statistics
            self.set_statistics(statistics)
        self._env_offset = index * n
        self._id_offset = (incarnation * config.num_runners + index) << EPISODE_ID_BITS
        self._steps_reported = 0

    def ready(self) -> bool:
        return True

    def sample(self) -> Trajectory | MultiAgentTrajectory:
        traj = self.runner.sample()
        return dataclasses.replace(
            traj,
            env_id=np.asarray(traj.env_id) + self._env_offset,
            episode_id=np.asarray(traj.episode_id) + self._id_offset,
        )

    def sample_with_statistics(
        self,
    ) -> tuple[Trajectory | MultiAgentTrajectory, Statistics, int]:
        """A sample, the connector statistics gathered since the last call (taken out of
        the runner's state, so each is reported to the group once), and the valid env
        steps it holds."""
        traj = self.sample()
        steps = int(self.runner.get_metrics()["num_env_steps"])
        new_steps, self._steps_reported = steps - self._steps_reported, steps
        if not self.runner.connectors:
            return traj, [], new_steps
        if isinstance(self.runner, MultiAgentRunner):
            states = self.runner.get_connector_state()
            deltas = {}
            for pid, state in states.items():
                states[pid], deltas[pid] = take_deltas(state)
            self.runner.set_connector_state(states)
            return traj, deltas, new_steps
        state, delta = take_deltas(self.runner.get_connector_state())
        self.runner.set_connector_state(state)
        return traj, delta, new_steps

    def set_statistics(self, statistics: Statistics) -> None:
        if isinstance(self.runner, MultiAgentRunner):
            assert isinstance(statistics, dict)  # internal: the group keeps them by policy
            state = self.runner.get_connector_state()
            self.runner.set_connector_state(
                {pid: set_statistics(state[pid], stats) for pid, stats in statistics.items()}
            )
            return
        assert isinstance(statistics, list)  # internal: a runner's, in take_deltas order
        state = self.runner.get_connector_state()
        self.runner.set_connector_state(set_statistics(state, statistics))

    def get_connector_state(self) -> Any:
        return self.runner.get_connector_state()

    def set_params(self, params: Params, version: int, statistics: Statistics | None = None) -> int:
        if isinstance(self.runner, MultiAgentRunner):
            _check_policy_dict(params, self.runner.policy_ids)
            for pid, value in params.items():
                self.runner.set_params(value, pid)
        else:
            self.runner.set_params(params)
        if statistics is not None:
            self.set_statistics(statistics)
        self.params_version = version
        return version

    def get_params(self) -> tuple[Params, int]:
        if isinstance(self.runner, MultiAgentRunner):
            params = {pid: self.runner.get_params(pid) for pid in self.runner.policy_ids}
            return jax.device_get(params), self.params_version
        return jax.device_get(self.runner.get_params()), self.params_version

    def get_metrics(self) -> dict[str, Any]:
        return {**self.runner.get_metrics(), "params_version": self.params_version}

    def stop(self) -> None:
        self.runner.stop()


def _check_policy_dict(params: Any, ids: tuple[str, ...]) -> None:
    if not isinstance(params, dict) or not set(params) <= set(ids):
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise InvalidArgumentError(
            f"EnvRunnerGroup.set_params(params): a multi-agent group takes a dict by policy "
            f"id (some of {list(ids)}), got {got}."
        )

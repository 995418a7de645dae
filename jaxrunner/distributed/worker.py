"""RunnerWorker: one EnvRunner inside a Ray actor, built there from picklable parts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium
import jax
import numpy as np

from jaxrunner.connectors.moments import Moments, set_statistics, take_deltas
from jaxrunner.distributed.config import EPISODE_ID_BITS, EnvRunnerGroupConfig, PolicyFactory
from jaxrunner.envs import make_vec
from jaxrunner.policy import Params
from jaxrunner.sampling import EnvRunner
from jaxrunner.trajectory import Trajectory


class RunnerWorker:
    """The body of one runner actor: an :class:`~jaxrunner.EnvRunner` whose output
    carries group-wide env and episode ids."""

    def __init__(
        self,
        env: str | Callable[[], gymnasium.Env],
        policy_factory: PolicyFactory,
        params: Params,
        params_version: int,
        config: EnvRunnerGroupConfig,
        index: int,
        incarnation: int,
        statistics: list[Moments] | None = None,
    ) -> None:
        n = config.num_envs_per_runner
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
            config.runner_seed(index, incarnation),
            **dict(config.runner_options),
        )
        self.params_version = params_version
        if statistics is not None:  # a restart: start from the group's merged statistics
            self.set_statistics(statistics)
        self._env_offset = index * n
        self._id_offset = (incarnation * config.num_runners + index) << EPISODE_ID_BITS

    def ready(self) -> bool:
        return True

    def sample(self) -> Trajectory:
        traj = self.runner.sample()
        return traj.replace(
            env_id=np.asarray(traj.env_id) + self._env_offset,
            episode_id=np.asarray(traj.episode_id) + self._id_offset,
        )

    def sample_with_statistics(self) -> tuple[Trajectory, list[Moments]]:
        """A sample, and the connector statistics gathered since the last call (taken
        out of the runner's state, so each is reported to the group once)."""
        traj = self.sample()
        if self.runner.connectors is None:
            return traj, []
        state, deltas = take_deltas(self.runner.get_connector_state())
        self.runner.set_connector_state(state)
        return traj, deltas

    def set_statistics(self, statistics: list[Moments]) -> None:
        state = self.runner.get_connector_state()
        self.runner.set_connector_state(set_statistics(state, statistics))

    def get_connector_state(self) -> Any:
        return self.runner.get_connector_state()

    def set_params(
        self, params: Params, version: int, statistics: list[Moments] | None = None
    ) -> int:
        self.runner.set_params(params)
        if statistics is not None:
            self.set_statistics(statistics)
        self.params_version = version
        return version

    def get_params(self) -> tuple[Params, int]:
        return jax.device_get(self.runner.get_params()), self.params_version

    def get_metrics(self) -> dict[str, Any]:
        return {**self.runner.get_metrics(), "params_version": self.params_version}

    def stop(self) -> None:
        self.runner.stop()


__all__ = ["RunnerWorker"]

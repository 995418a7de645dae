"""RunnerWorker: one EnvRunner (of either kind of env) inside a Ray actor, built there
from picklable parts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxrunner._src.backends.capabilities import is_multi_agent
from jaxrunner._src.backends.make_vec import make_vec
from jaxrunner._src.connectors.moments import Moments, set_statistics, take_deltas
from jaxrunner._src.core.multi_agent_trajectory import MultiAgentTrajectory
from jaxrunner._src.core.policy import Params
from jaxrunner._src.core.trajectory import Trajectory
from jaxrunner._src.runner.env_runner import EnvRunner
from jaxrunner._src.services.distributed.config import (
    EPISODE_ID_BITS,
    EnvRunnerGroupConfig,
    PolicyFactory,
)
from jaxrunner.errors import InvalidArgumentError

Statistics = list[Moments] | dict[str, list[Moments]]
"""Connector statistics: a runner's list, or a multi-agent runner's lists by policy id."""


class RunnerWorker:
    """The body of one runner actor: an :class:`~jaxrunner.EnvRunner` on the env it
    builds, whose output carries group-wide env and episode ids. Both kinds of env are
    driven through the same runner methods, values by policy id where they differ."""

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
        seed = config.runner_seed(index, incarnation)
        envs = _make_envs(env, config)
        if is_multi_agent(envs):  # the policy factory is called once per agent group
            policy: Any = {g.policy_id: policy_factory(g.action_space) for g in envs.groups}
        else:
            policy = policy_factory(envs.single_action_space)
        self.runner = EnvRunner(
            envs, policy, params, config.rollout_length, seed, **dict(config.runner_options)
        )
        self.params_version = params_version
        if statistics is not None:  # a restart: start from the group's merged statistics
            self.set_statistics(statistics)
        self._env_offset = index * config.num_envs_per_runner
        self._id_offset = (incarnation * config.num_runners + index) << EPISODE_ID_BITS
        self._steps_reported = 0

    def ready(self) -> bool:
        return True

    def sample_with_statistics(
        self,
    ) -> tuple[Trajectory | MultiAgentTrajectory, Statistics, int]:
        """A sample (with group-wide ids), the connector statistics gathered since the last
        call (taken out of the runner's state, so each is reported to the group once), and
        the valid env steps it holds."""
        traj = self.runner.sample()
        traj = dataclasses.replace(
            traj,
            env_id=np.asarray(traj.env_id) + self._env_offset,
            episode_id=np.asarray(traj.episode_id) + self._id_offset,
        )
        steps = int(self.runner.get_metrics()["num_env_steps"])
        new_steps, self._steps_reported = steps - self._steps_reported, steps
        if not self.runner.connectors:
            return traj, [], new_steps
        states = self._connector_states()
        deltas = {}
        for pid, state in states.items():
            states[pid], deltas[pid] = take_deltas(state)
        self.runner.set_connector_state(self.runner.from_policy_dict(states))
        return traj, self.runner.from_policy_dict(deltas), new_steps

    def set_statistics(self, statistics: Statistics) -> None:
        """Loads the group's merged statistics (a runner's list, or lists by policy id)."""
        by_policy = self.runner.to_policy_dict(statistics, "EnvRunnerGroup statistics")
        states = self._connector_states()
        loaded = {pid: set_statistics(states[pid], stats) for pid, stats in by_policy.items()}
        self.runner.set_connector_state(self.runner.from_policy_dict(loaded))

    def get_connector_state(self) -> Any:
        return self.runner.get_connector_state()

    def set_params(self, params: Params, version: int, statistics: Statistics | None = None) -> int:
        """All or nothing: a policy whose params are refused (or statistics that are)
        puts back the params of the policies set before it, so the runner stays on the
        group's old params, as the group does."""
        by_policy = self.runner.to_policy_dict(params, "EnvRunnerGroup.set_params(params)")
        old = {pid: self.runner.get_params(pid) for pid in by_policy}
        try:
            for pid, value in by_policy.items():
                self.runner.set_params(value, pid)
            if statistics is not None:
                self.set_statistics(statistics)
        except BaseException:
            for pid, value in old.items():
                self.runner.set_params(value, pid)
            raise
        self.params_version = version
        return version

    def get_params(self) -> tuple[Params, int]:
        params = {pid: self.runner.get_params(pid) for pid in self.runner.policy_ids}
        return jax.device_get(self.runner.from_policy_dict(params)), self.params_version

    def get_metrics(self) -> dict[str, Any]:
        return {**self.runner.get_metrics(), "params_version": self.params_version}

    def stop(self) -> None:
        self.runner.stop()

    def _connector_states(self) -> dict[str, Any]:
        return self.runner.to_policy_dict(self.runner.get_connector_state(), "RunnerWorker")


def _make_envs(env: str | Callable[[], Any], config: EnvRunnerGroupConfig) -> Any:
    """The runner's vector env, of the kind ``env`` makes (``make_vec`` reads it: a
    factory of PettingZoo envs gives a multi-agent vector env)."""
    where = "EnvRunnerGroupConfig"
    if config.env_options and not isinstance(env, str):
        raise InvalidArgumentError(
            f"{where}(env_options={dict(config.env_options)!r}): env options are passed to "
            "gymnasium.make for a gymnasium id; a factory takes none. Bind them in the "
            "factory instead (e.g. functools.partial)."
        )
    if config.policy_mapping_fn is not None and isinstance(env, str):
        raise InvalidArgumentError(
            f"{where}(policy_mapping_fn=...): a policy mapping applies to multi-agent "
            "(PettingZoo) envs, and this env is single-agent; leave it None."
        )
    spec: Any = env  # an id or a factory: make_vec's overloads type them apart
    return make_vec(
        spec,
        config.num_envs_per_runner,
        config.backend,
        config=config.vec_config,
        restart_policy=config.restart_policy,
        policy_mapping_fn=config.policy_mapping_fn,
        **dict(config.env_options),
    )

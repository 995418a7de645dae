"""Every multi-agent backend keeps the contract of :mod:`jaxrunner.multi_agent.vector_env`
(:class:`jaxrunner.testing.MultiAgentVectorEnvContract`), checked against PettingZoo's
own envs stepped by hand."""

from __future__ import annotations

import pytest

pytest.importorskip("pettingzoo")

import jaxrunner as jr
from jaxrunner.multi_agent import SyncMultiAgentVectorEnv
from jaxrunner.testing import MultiAgentVectorEnvContract


class TestSyncMultiAgentContract(MultiAgentVectorEnvContract):
    def make_envs(self, env_fns, restart_policy=None):
        return SyncMultiAgentVectorEnv(env_fns, restart_policy=restart_policy)


class TestProcessMultiAgentContract(MultiAgentVectorEnvContract):
    def make_envs(self, env_fns, restart_policy=None):
        from jaxrunner.multi_agent.process import ProcessMultiAgentVectorEnv

        config = jr.ProcessConfig(num_workers=2)
        return ProcessMultiAgentVectorEnv(env_fns, config=config, restart_policy=restart_policy)


@pytest.fixture(scope="class")
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.usefixtures("local_ray")
class TestRayMultiAgentContract(MultiAgentVectorEnvContract):
    def make_envs(self, env_fns, restart_policy=None):
        from jaxrunner.multi_agent.ray import RayMultiAgentVectorEnv

        config = jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1)
        return RayMultiAgentVectorEnv(env_fns, config=config, restart_policy=restart_policy)

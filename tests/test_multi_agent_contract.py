"""Every multi-agent backend keeps the contract of :mod:`jaxrunner.multi_agent.vector_env`
(:class:`jaxrunner.testing.MultiAgentVectorEnvContract`), checked against PettingZoo's
own envs stepped by hand."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
        from jaxrunner.envs.process.agents import ProcessMultiAgentVectorEnv

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
        from jaxrunner.envs.ray.agents import RayMultiAgentVectorEnv

        config = jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1)
        return RayMultiAgentVectorEnv(env_fns, config=config, restart_policy=restart_policy)


def test_multi_agent_testing_names_load_pettingzoo_on_first_use():
    # With PettingZoo unimportable, jaxrunner.testing still imports; its multi-agent
    # names say which extra to install.
    code = textwrap.dedent("""
        import sys
        sys.modules["pettingzoo"] = None  # as if it were not installed
        import jaxrunner as jr
        from jaxrunner.errors import MissingDependencyError
        assert jr.testing.FaultyEnv.__name__ == "FaultyEnv"
        assert "ComingAndGoing" in dir(jr.testing)
        try:
            jr.testing.ComingAndGoing
        except MissingDependencyError as err:
            print(err)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert 'needs PettingZoo: pip install "jaxrunner[multiagent]"' in done.stdout
    # With it, the names are the modules' own.
    from jaxrunner.testing import multi_agent_envs, multi_agent_faults

    assert jr.testing.ComingAndGoing is multi_agent_envs.ComingAndGoing
    assert jr.testing.faulty_multi_agent_env_fns is multi_agent_faults.faulty_multi_agent_env_fns
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        jr.testing.Nope  # noqa: B018


def test_process_get_num_restarts_after_close_is_a_closed_error():
    from jaxrunner.envs.process.agents import ProcessMultiAgentVectorEnv

    envs = ProcessMultiAgentVectorEnv(
        [jr.testing.coming_and_going] * 2, config=jr.ProcessConfig(num_workers=1)
    )
    assert envs.get_num_restarts() == 0
    envs.close()
    with pytest.raises(jr.errors.ClosedError):
        envs.get_num_restarts()

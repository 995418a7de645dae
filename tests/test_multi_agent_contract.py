"""Every multi-agent backend keeps the contract of
:mod:`jaxrunner._src.backends.multi_agent.vector_env`
(:class:`jaxrunner.testing.MultiAgentVectorEnvContract`), checked against PettingZoo's
own envs stepped by hand: besides the contract's own envs, mpe2's simple_spread and
simple_tag (two agent groups) and the classic connect_four, on every backend."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("pettingzoo")

import jaxrunner as jr
from jaxrunner._src.backends.multi_agent.vector_env import SyncMultiAgentVectorEnv
from jaxrunner.testing import MultiAgentVectorEnvContract
from tests import multi_agent_envs as envs_mod


class PettingZooCases:
    """The contract's parity test also on PettingZoo's MPE and classic envs (mixed in
    before the contract, whose ``env_cases`` it extends)."""

    def env_cases(self):
        return {
            **super().env_cases(),
            "simple_spread": envs_mod.simple_spread,
            "simple_tag": envs_mod.simple_tag,
            "connect_four": envs_mod.connect_four,
        }


class TestSyncMultiAgentContract(PettingZooCases, MultiAgentVectorEnvContract):
    def make_envs(self, env_fns, restart_policy=None):
        return SyncMultiAgentVectorEnv(env_fns, restart_policy=restart_policy)


class TestProcessMultiAgentContract(PettingZooCases, MultiAgentVectorEnvContract):
    def make_envs(self, env_fns, restart_policy=None):
        from jaxrunner._src.backends.process.agents import ProcessMultiAgentVectorEnv

        config = jr.ProcessConfig(num_workers=2)
        return ProcessMultiAgentVectorEnv(env_fns, config=config, restart_policy=restart_policy)


@pytest.fixture(scope="class")
def envs_by_value(local_ray):
    # The tests' env factories travel to the actors by value (actors cannot import tests/).
    local_ray.cloudpickle.register_pickle_by_value(envs_mod)


@pytest.mark.usefixtures("envs_by_value")
class TestRayMultiAgentContract(MultiAgentVectorEnvContract):
    # The contract's own env cases only: the transport is the same for every env, and
    # each PettingZoo case costs new actors (~3 s each; sync and process cover them).
    def make_envs(self, env_fns, restart_policy=None):
        from jaxrunner._src.backends.ray.agents import RayMultiAgentVectorEnv

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
    from jaxrunner._src.testing import multi_agent_envs, multi_agent_faults

    assert jr.testing.ComingAndGoing is multi_agent_envs.ComingAndGoing
    assert jr.testing.faulty_multi_agent_env_fns is multi_agent_faults.faulty_multi_agent_env_fns
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        jr.testing.Nope  # noqa: B018


def test_process_get_num_restarts_after_close_is_a_closed_error():
    from jaxrunner._src.backends.process.agents import ProcessMultiAgentVectorEnv

    envs = ProcessMultiAgentVectorEnv(
        [jr.testing.coming_and_going] * 2, config=jr.ProcessConfig(num_workers=1)
    )
    assert envs.get_num_restarts() == 0
    envs.close()
    with pytest.raises(jr.errors.ClosedError):
        envs.get_num_restarts()

"""``progress=`` on ``sample()`` and ``sample_episodes()`` of both runners: the bar counts
env steps (episodes), and the samples are those taken without it."""

from __future__ import annotations

import builtins

import jax
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.models import mlp_policy


@pytest.fixture
def no_tqdm(monkeypatch):
    """The stderr line instead of tqdm's bar (what users without tqdm see)."""
    real_import = builtins.__import__

    def without_tqdm(name, *args, **kwargs):
        if name.startswith("tqdm"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_tqdm)


def cartpole_runner(backend: str = "sync", config=None) -> jr.EnvRunner:
    envs = jr.make_vec("CartPole-v1", 4, backend=backend, config=config)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    return jr.EnvRunner(envs, policy, params, 16, seed=0)


@pytest.mark.parametrize(
    "backend, config",
    [("sync", None), ("process", jr.ProcessConfig(num_workers=2, ready_first=True))],
    ids=["lockstep", "ready-first"],
)
def test_sample_progress_counts_env_steps_and_changes_nothing(backend, config, no_tqdm, capsys):
    with cartpole_runner(backend, config) as plain, cartpole_runner(backend, config) as shown:
        for _ in range(2):
            expected, traj = plain.sample(), shown.sample(progress=True)
            jax.tree.map(np.testing.assert_array_equal, traj, expected)
    lines = capsys.readouterr().err.strip().split("\n")
    assert [line.rsplit("\r", 1)[-1] for line in lines] == ["EnvRunner.sample: 64/64 env steps"] * 2


def test_sample_progress_with_tqdm(capsys):
    pytest.importorskip("tqdm")
    with cartpole_runner() as runner:
        runner.sample(progress=True)
        err = capsys.readouterr().err
        assert "EnvRunner.sample" in err and "64/64" in err
        runner.sample()
        assert capsys.readouterr().err == ""  # no bar unless asked for


def test_sample_progress_on_a_pure_jax_env_fills_when_the_scan_returns(no_tqdm, capsys):
    envs = jr.JaxVectorEnv(jr.testing.RandomWalk(), num_envs=4)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, 16, seed=0) as runner:
        runner.sample(progress=True)
    assert capsys.readouterr().err.strip().endswith("64/64 env steps")


def test_progress_must_be_a_bool():
    with cartpole_runner() as runner:
        with pytest.raises(TypeError, match=r"sample\(progress='yes'\)"):
            runner.sample(progress="yes")
        with pytest.raises(TypeError, match=r"sample_episodes\(progress=1\)"):
            runner.sample_episodes(1, progress=1)
        runner.sample()  # nothing was sampled or broken by the refusals


def test_multi_agent_sample_and_sample_episodes_progress(no_tqdm, capsys):
    pytest.importorskip("pettingzoo")
    from tests import multi_agent_envs
    from tests.test_multi_agent import random_policy, zero_params

    def runner() -> jr.EnvRunner:
        envs = jr.make_multi_agent_vec(multi_agent_envs.simple_spread, 2)
        return jr.EnvRunner(envs, random_policy(5), zero_params(5), 10, seed=0)

    with runner() as plain, runner() as shown:
        expected, traj = plain.sample(), shown.sample(progress=True)
        jax.tree.map(np.testing.assert_array_equal, traj, expected)
        assert capsys.readouterr().err.strip().endswith("EnvRunner.sample: 20/20 env steps")
        episodes = shown.sample_episodes(3, progress=True)
        assert len(episodes) == 3
        err = capsys.readouterr().err.strip()
        assert err.endswith("EnvRunner.sample_episodes: 3/3 episodes")
        with pytest.raises(TypeError, match=r"sample\(progress=None\)"):
            shown.sample(progress=None)

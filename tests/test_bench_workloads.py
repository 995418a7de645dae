"""The bench's real workloads (``jaxrunner bench --workload``, ``benchmarks/peers.py
--workload``) and what the peers' hand loops count. No optional extra: Pong and
HalfCheetah are never built here (the workloads' envs are smoke-run by the
benchmarks); nothing timed is asserted."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest

from jaxrunner import models
from jaxrunner._src import bench, cli
from jaxrunner._src.bench.systems import Spec
from jaxrunner._src.bench.workloads import WORKLOADS, get_workload
from jaxrunner.errors import InvalidArgumentError


def test_next_step_reset_steps_are_not_counted():
    """NEXT_STEP autoreset (EnvPool's and PufferLib's): the step after an episode's
    end only resets that env, so the loop counts every step but those."""
    envs = gymnasium.vector.SyncVectorEnv(
        [lambda: gymnasium.make("CartPole-v1")] * 3,
        autoreset_mode=gymnasium.vector.AutoresetMode.NEXT_STEP,
    )
    loop = bench.RecordingHandLoop(envs, rollout_length=60, seed=0, next_step_reset=True)
    ended = np.zeros(3, bool)
    resets = 0
    for _ in range(2):
        counted = loop.rollout()
        done = loop.terminated | loop.truncated
        # Resets: steps whose env had ended on the step before (across rollouts too).
        before = np.concatenate([ended[None], done[:-1]])
        assert counted == 60 * 3 - before.sum()
        resets += before.sum()
        ended = done[-1]
    assert resets > 0  # random CartPole episodes end within 120 steps


def test_hand_loop_records_box_actions_as_sampled():
    """The Gaussian policy's actions are recorded unclipped (the env gets them
    clipped), as the runner records them."""
    envs = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("MountainCarContinuous-v0")])
    policy = models.gaussian_mlp_policy(envs.single_action_space, hidden=(8,))
    loop = bench.RecordingHandLoop(envs, rollout_length=50, seed=0, policy=policy)
    assert loop.rollout() == 50
    assert (np.abs(loop.action) > 1).any()  # N(mean, 1) leaves [-1, 1] a third of the time


def test_workloads_name_their_env_policy_and_widths():
    assert set(WORKLOADS) == {"cartpole", "pong", "halfcheetah"}
    assert get_workload("pong").widths == (8, 32)
    assert get_workload("halfcheetah").rollout_length(32) == 16
    assert get_workload("cartpole").rollout_length(64) == bench.rollout_length(64)
    env = get_workload("cartpole").make()
    policy = get_workload("cartpole").policy(env.observation_space, env.action_space)
    assert policy.action_ndim == 0
    with pytest.raises(InvalidArgumentError, match="expected one of"):
        get_workload("breakout")
    with pytest.raises(InvalidArgumentError, match="workload='nope'"):
        Spec(
            system="hand",
            backend="sync",
            env="X",
            num_envs=1,
            rollout_length=8,
            reference="sync",
            workload="nope",
        )


def test_bench_config_for_a_workload():
    config = bench.BenchConfig.for_workload("halfcheetah", rounds=1)
    assert (config.env, config.widths, config.backends) == (
        "HalfCheetah-v5",
        (8, 32),
        ("sync", "process"),
    )
    with pytest.raises(InvalidArgumentError, match="for_workload"):
        bench.BenchConfig(env="CartPole-v1", workload="pong")


@pytest.mark.parametrize("env", ["Acrobot-v1", "CartPole-v1"])  # the default's value too
def test_bench_cli_refuses_a_workload_with_an_env(capsys, env):
    assert cli.main(["bench", "--workload", "pong", "--env", env]) == 2
    err = capsys.readouterr().err
    assert "--workload pong runs its own env" in err and "--env" in err

"""Seeds said once: the runner's reset seeds, their independence, and the override warning."""

from __future__ import annotations

import warnings

import gymnasium
import jax
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner._src.services.distributed import EnvRunnerGroupConfig
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.models import mlp_policy


def test_env_seeds_are_consecutive_and_independent_of_width():
    seeds = jr.env_seeds(7, 16)
    assert seeds == list(range(seeds[0], seeds[0] + 16))
    assert jr.env_seeds(7, 4) == seeds[:4]
    assert all(0 <= s < 2**31 for s in seeds)  # an int32, as EnvPool takes seeds
    assert jr.env_seeds(7, 16) == seeds  # deterministic


def test_runner_seeds_never_share_env_seeds():
    """The raw ``seed + i`` rule gave seeds 0 and 1 the same seeds for 63 of 64 envs."""
    blocks = [jr.env_seeds(seed, 64) for seed in range(2000)]
    everything = np.concatenate(blocks)
    assert len(np.unique(everything)) == everything.size


def test_group_runner_seeds_never_share_env_seeds():
    config = EnvRunnerGroupConfig(num_runners=8, num_envs_per_runner=32, seed=5)
    blocks = [
        jr.env_seeds(config.runner_seed(index, incarnation), 32)
        for index in range(8)
        for incarnation in range(20)
    ]
    everything = np.concatenate(blocks)
    assert len(np.unique(everything)) == everything.size


@pytest.mark.parametrize("bad", [-1, 1.5, True, [], [1, -2]])
def test_env_seeds_refuses_bad_seeds(bad):
    with pytest.raises(InvalidArgumentError, match="env_seeds"):
        jr.env_seeds(bad, 3)


def first_obs(seed: int, num_envs: int, make_vec_seed: int | None = None) -> np.ndarray:
    envs = jr.make_vec("CartPole-v1", num_envs, seed=make_vec_seed)
    policy = mlp_policy(envs.single_action_space, hidden=(4,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length=1, seed=seed) as runner:
        return runner.sample().obs[0]


def test_the_runner_resets_env_i_with_its_env_seed():
    obs = first_obs(seed=11, num_envs=4)
    for i, s in enumerate(jr.env_seeds(11, 4)):
        want, _ = gymnasium.make("CartPole-v1").reset(seed=s)
        np.testing.assert_array_equal(obs[i], want)
    # Under the old rule, env i+1 of seed 0 started as env i of seed 1.
    assert not np.array_equal(first_obs(0, 4)[1:], first_obs(1, 4)[:-1])


def first_agent_obs(seed: int, num_envs: int, make_vec_seed: int | None = None) -> np.ndarray:
    """:func:`first_obs` of a multi-agent env."""
    pytest.importorskip("pettingzoo")
    from tests.multi_agent_envs import coming_and_going
    from tests.test_multi_agent import random_policy, zero_params

    envs = jr.make_vec(coming_and_going, num_envs, seed=make_vec_seed)
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 1, seed=seed) as runner:
        return runner.sample().groups["policy_0"].obs[0]


KINDS = {"single-agent": first_obs, "multi-agent": first_agent_obs}


@pytest.mark.parametrize("kind", KINDS)
def test_a_different_make_vec_seed_is_overridden_with_a_warning(kind):
    obs_of = KINDS[kind]
    with pytest.warns(UserWarning, match=r"seed=0\): these envs were reset with seed=123"):
        overridden = obs_of(seed=0, num_envs=3, make_vec_seed=123)
    np.testing.assert_array_equal(overridden, obs_of(seed=0, num_envs=3))  # the runner decides


@pytest.mark.parametrize("kind", KINDS)
def test_the_same_seed_in_both_places_is_silent(kind):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KINDS[kind](seed=4, num_envs=2, make_vec_seed=4)
        KINDS[kind](seed=4, num_envs=2)


def test_direct_reset_keeps_gymnasiums_convention():
    envs = jr.make_vec("CartPole-v1", 3)
    obs, _ = envs.reset(seed=9)
    for i in range(3):
        want, _ = gymnasium.make("CartPole-v1").reset(seed=9 + i)
        np.testing.assert_array_equal(obs[i], want)
    envs.close()

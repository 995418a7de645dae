"""Per-step infos as [T, B] arrays (EnvRunner(info_keys=...)), on every host sampler,
against the infos of gymnasium's own wrappers."""

from __future__ import annotations

import gymnasium
import jax
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.models import mlp_policy

T = 48


class Lives(gymnasium.Wrapper):
    """Atari-like ``lives`` in every step's info: one fewer every 5 steps of an episode."""

    def reset(self, **kwargs):
        self.steps = 0
        obs, info = self.env.reset(**kwargs)
        return obs, {**info, "lives": 3}

    def step(self, action):
        self.steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "lives": 3 - self.steps // 5}


def cartpole_with_infos() -> gymnasium.Env:
    env = gymnasium.make("CartPole-v1", max_episode_steps=20)
    return Lives(gymnasium.wrappers.RecordEpisodeStatistics(env))


def run(backend: str, config=None, **kwargs) -> jr.Trajectory:
    envs = jr.make_vec(cartpole_with_infos, 4, backend=backend, config=config)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    keys = ("lives", "episode.r", "episode.l")
    with jr.EnvRunner(envs, policy, params, T, seed=1, info_keys=keys, **kwargs) as runner:
        return runner.sample()


@pytest.fixture(scope="module")
def sync_traj() -> jr.Trajectory:
    return run("sync")


def test_infos_match_what_the_wrappers_returned(sync_traj):
    traj = sync_traj
    infos, present = traj.extras["infos"], traj.extras["infos_present"]
    done = traj.terminated | traj.truncated
    assert done.any() and not done.all()
    # Every step has lives (the final info where an episode ended: its own step count).
    assert present["lives"].all()
    np.testing.assert_array_equal(infos["lives"], 3 - (traj.step + 1) // 5)
    # RecordEpisodeStatistics reports the episode where it ends, and only there.
    np.testing.assert_array_equal(present["episode.r"], done)
    np.testing.assert_array_equal(present["episode.l"], done)
    np.testing.assert_array_equal(infos["episode.l"][done], traj.step[done] + 1)
    for episode in traj.split_episodes():
        if episode.is_complete:  # the return the wrapper counted is the episode's own
            assert episode.extras["infos"]["episode.r"][-1] == episode.reward.sum()
    assert infos["lives"].dtype == np.float64 and present["lives"].dtype == np.bool_


@pytest.mark.parametrize("ready_first", [False, True])
def test_the_process_backend_records_the_same_arrays(sync_traj, ready_first):
    config = jr.ProcessConfig(num_workers=2, ready_first=ready_first)
    traj = run("process", config)
    np.testing.assert_array_equal(traj.action, sync_traj.action)
    for part in ("infos", "infos_present"):
        for key, values in sync_traj.extras[part].items():
            np.testing.assert_array_equal(traj.extras[part][key], values, err_msg=key)


def test_without_info_keys_nothing_is_recorded():
    envs = jr.make_vec(cartpole_with_infos, 2)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, 4, seed=0) as runner:
        assert "infos" not in runner.sample().extras


def test_a_non_numeric_entry_is_refused_naming_the_env_and_key():
    envs = jr.make_vec(cartpole_with_infos, 2)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    runner = jr.EnvRunner(envs, policy, params, T, seed=0, info_keys=("episode",))
    with runner, pytest.raises(InvalidArgumentError, match=r"sub-env \d's info\['episode'\]"):
        runner.sample()


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_a_misspelt_name_is_refused_with_the_names_the_infos_had(backend):
    envs = jr.make_vec(cartpole_with_infos, 2, backend=backend)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    keys = ("lives", "episode.r", "live", "episode.R")
    runner = jr.EnvRunner(envs, policy, params, 8, seed=0, info_keys=keys)
    with runner:
        # No error before an episode ended: end-of-episode entries have not had their chance.
        first = runner.sample()
        assert not first.done.any()
        with pytest.raises(InvalidArgumentError, match=r"\['episode.R', 'live'\]") as info:
            for _ in range(4):  # episodes of at most 20 steps
                runner.sample()
    for name in ("'lives'", "'episode'", "'episode.r'", "'episode.l'"):
        assert name in str(info.value)
    partial = info.value.partial_trajectory  # the sample is not lost
    assert partial.num_steps == 8 and partial.done.any()
    assert partial.extras["infos_present"]["lives"].all()


def test_an_end_of_episode_name_waits_for_the_first_episode_end():
    envs = jr.make_vec(cartpole_with_infos, 2)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, 3, seed=0, info_keys=("episode.l",)) as runner:
        trajs = [runner.sample() for _ in range(10)]
    joined = jr.concatenate(trajs)
    assert not trajs[0].done.any() and joined.done.any()
    np.testing.assert_array_equal(joined.extras["infos_present"]["episode.l"], joined.done)


@pytest.mark.parametrize("bad", ["lives", ("lives", "lives"), ("",), (3,)])
def test_bad_info_keys_are_refused(bad):
    envs = jr.make_vec(cartpole_with_infos, 2)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with pytest.raises(InvalidArgumentError, match="info_keys"):
        jr.EnvRunner(envs, policy, params, 4, seed=0, info_keys=bad)
    jr.EnvRunner(envs, policy, params, 4, seed=0).stop()  # the envs were not claimed

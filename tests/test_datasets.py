"""Tests for jaxrunner.datasets: episodes to Minari and back, checked with Minari's
own reader."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import ActorCritic, short_cartpole

import jaxrunner as jr

minari = pytest.importorskip("minari")


@pytest.fixture
def datasets_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def sampled() -> tuple[list[jr.Episode], object]:
    """CartPole episodes cut at 20 steps: some terminated, some truncated."""
    envs = jr.make_vec(short_cartpole, num_envs=3)
    policy = jr.Policy.from_linen(ActorCritic(2), envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length=16, seed=0) as runner:
        episodes = runner.sample_episodes(8)
        spaces = runner.get_spaces()
    assert any(e.terminated for e in episodes) and any(e.truncated for e in episodes)
    return episodes, spaces


def test_minari_reads_what_to_minari_writes(datasets_path: Path, sampled) -> None:
    episodes, spaces = sampled
    seeds = {episodes[0].episode_id: 123, episodes[2].episode_id: 7}
    jr.to_minari(
        episodes,
        "jaxrunner/cartpole/test-v0",
        observation_space=spaces["observation_space"],
        action_space=spaces["action_space"],
        seeds=seeds,
        algorithm_name="random init",
    )
    dataset = minari.load_dataset("jaxrunner/cartpole/test-v0")
    assert dataset.total_episodes == len(episodes)
    assert dataset.total_steps == sum(e.length for e in episodes)
    for data, episode in zip(dataset.iterate_episodes(), episodes):
        # The reset observation and the true final one, both kept.
        np.testing.assert_array_equal(data.observations, episode.obs)
        assert len(data.observations) == episode.length + 1
        np.testing.assert_array_equal(data.actions, episode.action)
        assert data.actions.dtype == spaces["action_space"].dtype
        np.testing.assert_array_equal(data.rewards, episode.reward)
        # Terminated and truncated stay separate, set at the last step only.
        want_term = np.zeros(episode.length, bool)
        want_trunc = np.zeros(episode.length, bool)
        want_term[-1], want_trunc[-1] = episode.terminated, episode.truncated
        np.testing.assert_array_equal(data.terminations, want_term)
        np.testing.assert_array_equal(data.truncations, want_trunc)
    metadata = list(dataset.storage.get_episode_metadata(range(len(episodes))))
    for meta, episode in zip(metadata, episodes):
        assert meta.get("seed") == seeds.get(episode.episode_id)

    back = jr.from_minari("jaxrunner/cartpole/test-v0")
    assert len(back) == len(episodes)
    for got, want in zip(back, episodes):
        np.testing.assert_array_equal(got.obs, want.obs)
        np.testing.assert_array_equal(got.action, want.action)
        np.testing.assert_array_equal(got.reward, want.reward)
        assert (got.terminated, got.truncated) == (want.terminated, want.truncated)
        assert (got.episode_id, got.env_id) == (want.episode_id, want.env_id)
        assert set(got.extras) == set(want.extras) == {"log_prob", "value"}
        for key in want.extras:
            np.testing.assert_array_equal(got.extras[key], want.extras[key])
        assert got.is_complete


def test_from_minari_reads_a_dataset_minari_collected(datasets_path: Path) -> None:
    """A dataset written by Minari's own DataCollector: no jaxrunner infos."""
    import gymnasium as gym
    from minari import DataCollector

    env = DataCollector(gym.make("CartPole-v1", max_episode_steps=15))
    for seed in range(3):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
    env.create_dataset("jaxrunner/collected/test-v0", algorithm_name="random")
    dataset = minari.load_dataset("jaxrunner/collected/test-v0")
    episodes = jr.from_minari(dataset, episode_indices=[0, 2])
    assert [e.episode_id for e in episodes] == [0, 2]
    for episode, data in zip(episodes, dataset.iterate_episodes([0, 2])):
        np.testing.assert_array_equal(episode.obs, data.observations)
        assert episode.length == len(data.rewards) and episode.extras == {}
        assert episode.terminated == bool(data.terminations[-1])
        assert episode.truncated == bool(data.truncations[-1])


def test_faulty_episodes_are_left_out_unless_asked(datasets_path: Path, sampled) -> None:
    episodes, spaces = sampled
    faulty = episodes[1].replace(faulty=True, terminated=False, truncated=True)
    mixed = [episodes[0], faulty, episodes[2]]
    kwargs = dict(
        observation_space=spaces["observation_space"], action_space=spaces["action_space"]
    )
    assert jr.to_minari(mixed, "jaxrunner/faulty/out-v0", **kwargs).total_episodes == 2
    written = jr.to_minari(mixed, "jaxrunner/faulty/in-v0", include_faulty=True, **kwargs)
    assert written.total_episodes == 3
    assert jr.from_minari(written)[1].truncated


def test_incomplete_episodes_are_refused(datasets_path: Path, sampled) -> None:
    episodes, spaces = sampled
    tail = episodes[0].replace(start_step=4)
    with pytest.raises(ValueError, match=r"not complete.*sample_episodes"):
        jr.to_minari(
            [tail],
            "jaxrunner/tail/test-v0",
            observation_space=spaces["observation_space"],
            action_space=spaces["action_space"],
        )


def ingest(env: jr.ExternalEnv, episode: jr.Episode) -> None:
    """The README's recipe: one logged episode into an ExternalEnv."""
    eid = env.start_episode()
    env.log_steps(eid, list(episode.obs[:-1]), list(episode.action), episode.reward.tolist())
    env.end_episode(eid, episode.obs[-1], truncated=not episode.terminated)


def test_external_env_ingests_a_dataset(datasets_path: Path, sampled) -> None:
    """Offline logs into an ExternalEnv: the episodes come out with the logged steps
    and the current policy's log-probs of the logged actions."""
    episodes, spaces = sampled
    obs_space, action_space = spaces["observation_space"], spaces["action_space"]
    jr.to_minari(
        episodes,
        "jaxrunner/ingest/test-v0",
        observation_space=obs_space,
        action_space=action_space,
    )
    logged = jr.from_minari("jaxrunner/ingest/test-v0")
    policy = jr.Policy.from_linen(ActorCritic(2), action_space)
    params = policy.init(jax.random.key(0), obs_space)
    config = jr.ExternalEnvConfig(max_batch=32, buckets=(32,))
    with jr.ExternalEnv(obs_space, action_space, policy, params, config=config) as env:
        for episode in logged:
            ingest(env, episode)
        out = env.sample_episodes(len(logged), timeout_s=60)
    out.sort(key=lambda e: e.episode_id)
    assert len(out) == len(logged)
    for got, want in zip(out, logged):
        np.testing.assert_array_equal(got.obs, want.obs)
        np.testing.assert_array_equal(got.action, want.action)
        np.testing.assert_array_equal(got.reward, want.reward)
        # ExternalEnv ends an episode one way: terminated wins where both are set.
        assert got.terminated == want.terminated
        # Same params as the sampler's: the log-probs are the ones it stored.
        np.testing.assert_allclose(
            got.extras["log_prob"], want.extras["log_prob"], rtol=1e-5, atol=1e-6
        )

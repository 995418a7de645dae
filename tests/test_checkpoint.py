"""Checkpoints: one long run split at a sample boundary equals the unbroken run."""

from __future__ import annotations

import json
import threading
import warnings

import flax.linen as nn
import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.bench import mlp_policy
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.testing import assert_trees_equal
from jaxrunner.testing.jax_envs import RandomWalk, WalkParams

SEED = 3


def short_cartpole() -> gymnasium.Env:
    return gymnasium.make("CartPole-v1", max_episode_steps=13)


class Recurrent(nn.Module):
    """A GRU policy, so the carries are part of what must resume."""

    @nn.compact
    def __call__(self, carry, obs):
        carry, h = nn.GRUCell(features=8)(carry, obs)
        return carry, (nn.Dense(2)(h), nn.Dense(1)(h))


@pytest.fixture(scope="module")
def gru():
    envs = jr.make_vec(short_cartpole, 1)
    policy = jr.Policy.from_linen(Recurrent(), envs.single_action_space, initial_carry=jnp.zeros(8))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    envs.close()
    return policy, params


def cartpole_runner(gru, env_fn=short_cartpole, num_envs: int = 5, **kwargs) -> jr.EnvRunner:
    policy, params = gru
    envs = jr.make_vec(env_fn, num_envs)
    return jr.EnvRunner(envs, policy, params, rollout_length=11, seed=SEED, **kwargs)


def walk_runner(num_envs: int = 3) -> jr.EnvRunner:
    venv = jr.JaxVectorEnv(RandomWalk(), WalkParams(max_steps_in_episode=9), num_envs)
    policy = mlp_policy(venv.single_action_space, hidden=(16,))
    params = policy.init(jax.random.key(1), venv.single_observation_space)
    return jr.EnvRunner(venv, policy, params, rollout_length=7, seed=SEED)


def samples(runner: jr.EnvRunner, count: int) -> list[jr.Trajectory]:
    return [runner.sample().to_numpy() for _ in range(count)]


def counters(runner: jr.EnvRunner) -> dict:
    """The metrics that do not depend on timing."""
    m = runner.get_metrics()
    keys = ("num_env_steps", "num_episodes", "episode_return_mean", "episode_length_mean")
    return {k: None if m[k] != m[k] else m[k] for k in keys}  # NaN (no episode yet): None


def split_run(make, tmp_path, before: int, after: int, **restore_kwargs):
    """``before`` samples, a save, a new runner (new envs) restored, ``after`` samples."""
    path = tmp_path / "runner.ckpt"
    with make() as runner:
        head = samples(runner, before)
        runner.save(path)
    with make() as resumed:
        report = resumed.restore(path, **restore_kwargs)
        tail = samples(resumed, after)
        metrics = counters(resumed)
    return jr.concatenate(head + tail), report, metrics


@pytest.mark.parametrize("num_groups", [1, 2])
def test_sync_cartpole_resumes_bit_for_bit(gru, tmp_path, num_groups):
    def make():
        return cartpole_runner(gru, num_groups=num_groups)

    with make() as runner:
        whole = jr.concatenate(samples(runner, 4))
        expected_metrics = counters(runner)
    split, report, metrics = split_run(make, tmp_path, 2, 2, load_env_pickles=True)
    assert report.envs_restored
    assert whole.terminated.any() and whole.truncated.any()  # episodes cross the split
    assert_trees_equal(split, whole, "trajectory")
    assert metrics == expected_metrics


def test_jax_env_resumes_bit_for_bit(tmp_path):
    with walk_runner() as runner:
        whole = jr.concatenate(samples(runner, 4))
        expected_metrics = counters(runner)
    split, report, metrics = split_run(walk_runner, tmp_path, 2, 2)
    assert report.envs_restored
    assert (whole.terminated | whole.truncated).any()
    assert_trees_equal(split, whole, "trajectory")
    assert metrics == expected_metrics


def test_sample_episodes_resumes_with_its_fragments(gru, tmp_path):
    with cartpole_runner(gru) as runner:
        whole = runner.sample_episodes(4) + runner.sample_episodes(6)
    path = tmp_path / "runner.ckpt"
    with cartpole_runner(gru) as runner:
        head = runner.sample_episodes(4)
        assert runner._fragments and runner._finished  # both kinds of kept episodes are saved
        runner.save(path)
    with cartpole_runner(gru) as resumed:
        resumed.restore(path, load_env_pickles=True)
        tail = resumed.sample_episodes(6)
    assert [e.episode_id for e in head + tail] == [e.episode_id for e in whole]
    for got, want in zip(head + tail, whole):
        assert_trees_equal(got, want, f"episode {want.episode_id}")


def test_the_file_loads_without_pickle(gru, tmp_path):
    path = tmp_path / "runner.ckpt"
    with cartpole_runner(gru) as runner:
        runner.sample()
        runner.save(path)
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["__meta__"]))
        assert meta["envs"] == "pickle" and meta["num_envs"] == 5
        assert data["envs/0"].dtype == np.uint8  # the pickles are bytes, loaded on request


def test_without_env_pickles_episodes_restart_and_say_so(gru, tmp_path):
    path = tmp_path / "runner.ckpt"
    with cartpole_runner(gru) as runner:
        head = jr.concatenate(samples(runner, 2))
        runner.save(path)
        saved = counters(runner)
        assert saved["num_episodes"] > 0
        next_id = int(runner.sampler._book.next_episode_id)
    with cartpole_runner(gru) as resumed:
        with pytest.warns(UserWarning, match="new episode"):
            report = resumed.restore(path)
        assert not report.envs_restored and "load_env_pickles" in report.note
        assert counters(resumed) == saved
        traj = resumed.sample()
    np.testing.assert_array_equal(traj.step[0], 0)
    np.testing.assert_array_equal(traj.episode_id[0], next_id + np.arange(5))
    assert traj.episode_id.min() > head.episode_id.max()
    # Fresh reset seeds: not the starts of the first run.
    assert not np.array_equal(traj.obs[0], head.obs[0])


class Unpicklable(gymnasium.Wrapper):
    """Holds a lock, which does not pickle."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.lock = threading.Lock()


def test_envs_that_cannot_be_snapshot_restart_cleanly(gru, tmp_path):
    def make():
        return cartpole_runner(gru, env_fn=lambda: Unpicklable(short_cartpole()))

    path = tmp_path / "runner.ckpt"
    with make() as runner:
        runner.sample()
        runner.save(path)
    with make() as resumed:
        with pytest.warns(UserWarning, match="could not be pickled"):
            report = resumed.restore(path, load_env_pickles=True)
        assert not report.envs_restored
        traj = resumed.sample()
    np.testing.assert_array_equal(traj.step[0], 0)


def test_restore_refuses_another_shape_of_runner(gru, tmp_path):
    path = tmp_path / "runner.ckpt"
    with cartpole_runner(gru) as runner:
        runner.save(path)
    with (
        cartpole_runner(gru, num_envs=4) as other,
        pytest.raises(InvalidArgumentError, match="num_envs=5"),
    ):
        other.restore(path)
    with walk_runner() as other, pytest.raises(InvalidArgumentError, match="sampler="):
        other.restore(path)


def test_restore_refuses_other_params(gru, tmp_path):
    path = tmp_path / "runner.ckpt"
    with cartpole_runner(gru) as runner:
        runner.save(path)
    envs = jr.make_vec(short_cartpole, 5)
    policy = mlp_policy(envs.single_action_space, hidden=(16,))
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    with (
        jr.EnvRunner(envs, policy, params, rollout_length=11, seed=SEED) as other,
        pytest.raises(InvalidArgumentError, match="params"),
    ):
        other.restore(path)


def test_sample_episodes_progress_line(gru, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name.startswith("tqdm"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    with cartpole_runner(gru) as runner, warnings.catch_warnings():
        warnings.simplefilter("error")
        runner.sample_episodes(3, progress=True)
        assert capsys.readouterr().err.strip().endswith("3/3 episodes")
        runner.sample_episodes(1)
        assert capsys.readouterr().err == ""


@pytest.mark.parametrize("ready_first", [False, True])
def test_process_backend_restarts_episodes_cleanly(gru, tmp_path, ready_first):
    """Sub-envs in other processes cannot be snapshot: the resumed runner starts new
    episodes, and the rest (ids, metrics, policy step counts) goes on."""
    policy, params = gru
    config = jr.ProcessConfig(num_workers=2, ready_first=ready_first)

    def make():
        envs = jr.make_vec(short_cartpole, 4, backend="process", config=config)
        return jr.EnvRunner(envs, policy, params, rollout_length=11, seed=SEED)

    path = tmp_path / "runner.ckpt"
    with make() as runner:
        runner.sample()
        runner.save(path)
        saved = counters(runner)
        next_id = int(runner.sampler._book.next_episode_id)
    with make() as resumed:
        with pytest.warns(UserWarning, match="cannot snapshot"):
            report = resumed.restore(path, load_env_pickles=True)
        assert not report.envs_restored
        traj = resumed.sample()
        assert counters(resumed)["num_env_steps"] == saved["num_env_steps"] + 44
    np.testing.assert_array_equal(traj.step[0], 0)
    np.testing.assert_array_equal(traj.episode_id[0], next_id + np.arange(4))

"""One runner driven in random call orders (samples, iterators, episodes, params,
checkpoints, connector state) collects exactly the stream that ``sample()`` alone does."""

from __future__ import annotations

import random

import jax
import numpy as np
import pytest

import jaxrunner as jr
import jaxrunner.connectors as jc
from jaxrunner.models import mlp_policy

B, T, SEED = 3, 5, 7
ENVS = {"max_episode_steps": 6}  # short episodes: sample_episodes takes a few samples
CONNECTORS = jc.Connectors(obs=[jc.NormalizeObservation()])  # state that must carry over


def make_runner(policy, params):
    envs = jr.make_vec("CartPole-v1", B, **ENVS)
    return jr.EnvRunner(envs, policy, params, T, SEED, connectors=CONNECTORS, compact_next_obs=True)


def leaves(traj):
    return [np.asarray(x) for x in jax.tree.leaves(traj.dense())]


@pytest.fixture(scope="module")
def stream():
    envs = jr.make_vec("CartPole-v1", B, **ENVS)
    policy = mlp_policy(envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    envs.close()
    with make_runner(policy, params) as runner:
        samples = [runner.sample() for _ in range(40)]
    joined = [np.concatenate(x) for x in zip(*map(leaves, samples))]
    return policy, params, joined, jr.concatenate(samples)


@pytest.mark.parametrize("order_seed", range(12))
def test_random_call_orders_collect_the_stream_of_sample_alone(stream, order_seed, tmp_path):
    policy, params, joined, whole = stream
    ops = ["sample", "iterate", "iterate_reused", "episodes", "params", "save", "restore"]
    ops += ["connector_state"]
    order = random.Random(order_seed).choices(ops, k=10)
    runner = make_runner(policy, params)

    def check(traj, step):  # the stream's rows [step, step + T)
        for got, want in zip(leaves(traj), joined, strict=True):
            np.testing.assert_array_equal(got, want[step : step + T], err_msg=str(order))

    try:
        for op in order:
            step = runner.get_metrics()["num_env_steps"] // B
            if op == "sample":
                check(runner.sample(), step)
            elif op in ("iterate", "iterate_reused"):
                for k, traj in enumerate(runner.iterate(2, reuse_buffers=op == "iterate_reused")):
                    check(traj, step + k * T)
            elif op == "episodes":  # each one the stream's rows of its env and episode id
                for episode in runner.sample_episodes(2):
                    rows = (whole.env_id == episode.env_id) & (
                        whole.episode_id == episode.episode_id
                    )
                    obs = np.concatenate([whole.obs[rows], whole.next_obs[rows][-1:]])
                    np.testing.assert_array_equal(episode.obs, obs)  # its final one too
                    np.testing.assert_array_equal(episode.action, whole.action[rows])
                    np.testing.assert_array_equal(episode.reward, whole.reward[rows])
            elif op == "params":
                runner.set_params(jax.tree.map(np.array, params))  # equal params, a copy
            elif op == "save":
                runner.save(tmp_path / "runner.ckpt")
            elif op == "restore":  # into a new runner, which goes on where this one was
                runner.save(tmp_path / "runner.ckpt")
                runner.close()
                runner = make_runner(policy, params)
                report = runner.restore(tmp_path / "runner.ckpt", load_env_pickles=True)
                assert report.envs_restored
                assert runner.get_metrics()["num_env_steps"] == step * B
            else:
                runner.set_connector_state(runner.get_connector_state())
    finally:
        runner.close()

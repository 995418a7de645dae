"""One runner driven in random call orders (samples, iterators, episodes, params,
checkpoints, connector state) collects exactly the stream that ``sample()`` alone does,
on a gymnasium env and on a turn-based PettingZoo (AEC) one."""

from __future__ import annotations

import functools
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


def make_runner(kind, policy, params):
    if kind == "aec":  # tic-tac-toe: two agents taking turns, one policy each
        envs = jr.make_vec(jr.testing.tictactoe, B)
        return jr.EnvRunner(envs, policy, params, T, SEED, compact_next_obs=True)
    envs = jr.make_vec("CartPole-v1", B, **ENVS)
    return jr.EnvRunner(envs, policy, params, T, SEED, connectors=CONNECTORS, compact_next_obs=True)


def policy_and_params(kind):
    if kind == "aec":
        from tests.test_multi_agent import random_policy, zero_params

        envs = jr.make_vec(jr.testing.tictactoe, B)
        pids = [g.policy_id for g in envs.groups]
        envs.close()
        return {p: random_policy(9, masked=True) for p in pids}, {p: zero_params(9) for p in pids}
    envs = jr.make_vec("CartPole-v1", B, **ENVS)
    policy = mlp_policy(envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    envs.close()
    return policy, params


def leaves(traj):
    return [np.asarray(x) for x in jax.tree.leaves(traj.dense())]


@functools.cache  # once per kind and test process
def stream(kind):
    """The policy, its params, and 40 samples of ``sample()`` alone: leaves and whole."""
    policy, params = policy_and_params(kind)
    with make_runner(kind, policy, params) as runner:
        samples = [runner.sample() for _ in range(40)]
    joined = [np.concatenate(x) for x in zip(*map(leaves, samples))]
    return policy, params, joined, jr.concatenate(samples)


@pytest.mark.parametrize(
    ("kind", "order_seed"), [("gymnasium", k) for k in range(8)] + [("aec", k) for k in range(6)]
)
def test_random_call_orders_collect_the_stream_of_sample_alone(kind, order_seed, tmp_path):
    policy, params, joined, whole = stream(kind)
    ops = ["sample", "iterate", "iterate_reused", "episodes", "params", "save", "restore"]
    ops += ["connector_state"] if kind == "gymnasium" else []
    order = random.Random(order_seed).choices(ops, k=10)
    runner = make_runner(kind, policy, params)

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
            elif op == "episodes" and kind == "aec":  # agent episodes; the stream goes on
                assert len(runner.sample_episodes(2)) == 2
            elif op == "episodes":  # each one the stream's rows of its env and episode id
                for episode in runner.sample_episodes(2):
                    rows = (whole.env_id == episode.env_id) & (
                        whole.episode_id == episode.episode_id
                    )
                    obs = np.concatenate([whole.obs[rows], whole.next_obs[rows][-1:]])
                    np.testing.assert_array_equal(episode.obs, obs)  # its final one too
                    np.testing.assert_array_equal(episode.action, whole.action[rows])
                    np.testing.assert_array_equal(episode.reward, whole.reward[rows])
            elif op == "params" and kind == "aec":
                for pid, own in params.items():
                    runner.set_params(jax.tree.map(np.array, own), pid)  # equal, a copy
            elif op == "params":
                runner.set_params(jax.tree.map(np.array, params))  # equal params, a copy
            elif op == "save":
                runner.save(tmp_path / "runner.ckpt")
            elif op == "restore":  # into a new runner, which goes on where this one was
                runner.save(tmp_path / "runner.ckpt")
                runner.close()
                runner = make_runner(kind, policy, params)
                report = runner.restore(tmp_path / "runner.ckpt", load_env_pickles=True)
                assert report.envs_restored
                assert runner.get_metrics()["num_env_steps"] == step * B
            else:
                runner.set_connector_state(runner.get_connector_state())
    finally:
        runner.close()

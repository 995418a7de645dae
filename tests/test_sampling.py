"""The samplers as parts: ready-first equals lockstep, the episode numbering's host
and jnp twins agree, one owner per vector env."""

from __future__ import annotations

import gc
from typing import Any

import chex
import flax.linen as nn
import jax
import numpy as np
import pytest
from shuffled_sync import ShuffledSync

import jaxrunner as jr
from jaxrunner._src.samplers.episode_ids import EpisodeBook
from jaxrunner._src.samplers.one_agent import OneAgentSampler
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.testing import RandomWalk

NUM_ENVS = 6
SEED = 3


class Actor(nn.Module):
    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        return nn.Dense(2)(nn.tanh(nn.Dense(16)(obs)))


def _short_cartpole() -> Any:
    import gymnasium

    return gymnasium.make("CartPole-v1", max_episode_steps=15)


def _policy() -> tuple[jr.Policy, Any]:
    envs = jr.make_vec(_short_cartpole, 1)
    policy = jr.Policy.from_linen(Actor(), envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    envs.close()
    return policy, params


def _samples(envs: Any, num: int = 3, rollout_length: int = 11) -> list[jr.Trajectory]:
    policy, params = _policy()
    with jr.EnvRunner(envs, policy, params, rollout_length=rollout_length, seed=SEED) as runner:
        return [runner.sample() for _ in range(num)]


@pytest.mark.parametrize("batch", [None, 2])
def test_ready_first_equals_lockstep(batch):
    reference = _samples(jr.make_vec(_short_cartpole, NUM_ENVS))
    envs = ShuffledSync([_short_cartpole] * NUM_ENVS, batch, buckets=(NUM_ENVS,))
    policy, params = _policy()
    with jr.EnvRunner(envs, policy, params, rollout_length=11, seed=SEED) as runner:
        assert runner.sampler.ready_first.merging  # envs in any order
        got = [runner.sample() for _ in range(3)]
        metrics = runner.get_metrics()
    for ours, theirs in zip(got, reference):
        chex.assert_trees_all_equal(ours, theirs)
    assert metrics["num_env_steps"] == 3 * 11 * NUM_ENVS
    # The envs answered out of order: the policy calls saw fewer than all envs.
    counts = runner.sampler.ready_first.ready_counts
    assert sum(n for count, n in counts.items() if count < NUM_ENVS)


def test_a_restore_is_refused_while_envs_step_ahead(tmp_path):
    """With a recv batch (EnvPool async), envs run into the next sample: restoring into
    that runner would lose their steps, so it is refused with the fix; a new runner
    takes the checkpoint."""
    policy, params = _policy()
    envs = ShuffledSync([_short_cartpole] * NUM_ENVS, 2, buckets=(NUM_ENVS,))
    with jr.EnvRunner(envs, policy, params, rollout_length=8, seed=SEED) as runner:
        runner.sample()
        runner.save(tmp_path / "ck")
        with pytest.raises(InvalidArgumentError, match=r"stepping ahead.*new EnvRunner"):
            runner.restore(tmp_path / "ck")
    envs = ShuffledSync([_short_cartpole] * NUM_ENVS, 2, buckets=(NUM_ENVS,))
    with jr.EnvRunner(envs, policy, params, rollout_length=8, seed=SEED) as fresh:
        fresh.restore(tmp_path / "ck")
        assert fresh.sample().num_steps == 8


@pytest.mark.parametrize(("num_envs", "batch", "length"), [(4, 2, 2), (32, 16, 8), (6, 3, 1)])
def test_ready_first_with_a_batch_of_half_the_envs_never_stalls(num_envs, batch, length):
    """A backend answering ``batch`` envs in its own order (here random, as EnvPool's
    first-to-finish) lets step counts drift apart; the sampler holds the envs ahead
    back, so it never waits for more envs than are in flight (it stalled within a few
    samples before), and every sample still equals lockstep sampling's."""
    num_samples = 40
    reference = _samples(jr.make_vec(_short_cartpole, num_envs), num_samples, length)
    envs = ShuffledSync([_short_cartpole] * num_envs, batch, buckets=(num_envs,))
    got = _samples(envs, num_samples, length)
    for t, (ours, theirs) in enumerate(zip(got, reference)):
        chex.assert_trees_all_equal(ours, theirs, custom_message=f"sample {t}")


def test_a_single_agent_env_is_sampled_as_one_group_of_one_agent():
    policy, params = _policy()
    with jr.EnvRunner(jr.make_vec(_short_cartpole, 2), policy, params, 4, 0) as runner:
        assert isinstance(runner.sampler, OneAgentSampler)


def test_host_numbering_agrees_with_the_scan_twin():
    venv = jr.JaxVectorEnv(RandomWalk(), num_envs=5)
    policy = jr.Policy.from_linen(Actor(), venv.single_action_space)
    params = policy.init(jax.random.key(0), venv.single_observation_space)
    book = EpisodeBook(5)
    with jr.EnvRunner(venv, policy, params, rollout_length=17, seed=SEED) as runner:
        for _ in range(3):
            traj = jax.device_get(runner.sample())
            ids, steps = np.array(traj.episode_id), np.array(traj.step)
            traj = traj.replace(
                reward=np.asarray(traj.reward, np.float64),
                episode_id=np.zeros_like(ids, np.int64),
                step=np.zeros_like(steps, np.int64),
                valid=np.ones(ids.shape, np.bool_),
            )
            book.close(traj, 17)
            np.testing.assert_array_equal(traj.episode_id, ids)
            np.testing.assert_array_equal(traj.step, steps)
    assert traj.terminated.any() or traj.truncated.any()  # episodes did end


def test_a_second_live_runner_on_the_same_envs_is_refused():
    policy, params = _policy()
    envs = jr.make_vec(_short_cartpole, 2)
    first = jr.EnvRunner(envs, policy, params, 4, 0)
    with pytest.raises(InvalidArgumentError, match=r"another live EnvRunner.*separate envs"):
        jr.EnvRunner(envs, policy, params, 4, 1)
    first.sample()  # the refused runner touched nothing
    del first
    gc.collect()
    with jr.EnvRunner(envs, policy, params, 4, 1) as second:  # no live owner left
        assert second.sample().num_steps == 4


def test_process_ready_first_equals_lockstep_and_counts_every_step():
    """``ProcessConfig(ready_first=True)``: the runner infers for whichever worker
    answered first; every env still records exactly T steps per sample, equal to the
    sync backend's for the same seed."""
    reference = _samples(jr.make_vec(_short_cartpole, 4))
    config = jr.ProcessConfig(num_workers=2, ready_first=True)
    envs = jr.make_vec(_short_cartpole, 4, backend="process", config=config)
    policy, params = _policy()
    with jr.EnvRunner(envs, policy, params, rollout_length=11, seed=SEED) as runner:
        assert isinstance(runner.sampler, OneAgentSampler)  # the loop's ready-first mode
        got = [runner.sample() for _ in range(3)]
        assert min(runner.sampler.block_sizes) < 4  # each worker's envs acted on alone
        assert runner.get_metrics()["num_env_steps"] == 3 * 11 * 4
    for ours, theirs in zip(got, reference):
        chex.assert_trees_all_equal(ours, theirs)

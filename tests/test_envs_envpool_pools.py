"""Tests for ``make_vec(..., backend="envpool", num_pools=k)``: k EnvPool pools in sync mode
stepped in turn (jaxrunner._src.backends.envpool_pools); skipped without EnvPool."""

from __future__ import annotations

from contextlib import closing

import jax
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.models import mlp_policy
from jaxrunner.testing import assert_trees_equal

envpool = pytest.importorskip("envpool")
pytestmark = pytest.mark.filterwarnings("ignore:.*precision lowered:UserWarning")

SEED = 5


def _vec(num_envs: int, num_pools: int = 1, **kwargs: object) -> jr.VectorEnv:
    return jr.make_vec(
        "CartPole-v1", num_envs, backend="envpool", seed=SEED, max_episode_steps=9,
        num_pools=num_pools, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("keep_reset_steps", [True, False])
def test_pools_step_as_one_pool_does(keep_reset_steps: bool) -> None:
    """gymnasium's reset and step: every observation, reward, flag and info of 3 pools
    (sizes 2, 3, 2) is one pool's, episode ends included."""
    actions = np.random.default_rng(0).integers(0, 2, size=(40, 7))
    with (
        closing(_vec(7, keep_reset_steps=keep_reset_steps)) as one,
        closing(_vec(7, 3, keep_reset_steps=keep_reset_steps)) as pools,
    ):
        assert pools.capabilities.pipeline_bounds == (0, 2, 5, 7)
        assert pools.metadata["autoreset_mode"] == one.metadata["autoreset_mode"]
        assert_trees_equal(pools.reset(seed=SEED), one.reset(seed=SEED))
        ended = 0
        for a in actions:
            got, expected = pools.step(a.tolist()), one.step(a)  # (a list too)
            assert_trees_equal(got, expected)
            ended += int(np.count_nonzero(expected[2] | expected[3]))
        assert ended > 0  # the comparison covered episode ends


def test_runner_over_pools_samples_one_pools_trajectories_in_two_splits() -> None:
    """The runner pipelines the pools (a split each, by default; or one split of both)
    and records the very trajectories of one pool, reset steps and episode statistics
    included."""
    samples = {}
    for num_pools, num_splits in ((1, None), (2, None), (2, 1)):
        envs = _vec(6, num_pools)
        policy = mlp_policy(envs.single_action_space, hidden=(8,))
        params = policy.init(jax.random.key(0), envs.single_observation_space)
        with jr.EnvRunner(envs, policy, params, 16, seed=1, num_splits=num_splits) as runner:
            assert runner.num_splits == (num_splits or num_pools)
            got = [runner.sample() for _ in range(3)]
            samples[num_pools, num_splits] = [*got, runner.get_metrics()["episode_return_mean"]]
    assert_trees_equal(samples[2, None], samples[1, None])
    assert_trees_equal(samples[2, 1], samples[1, None])
    assert not samples[2, None][0].valid.all()  # EnvPool's reset steps were among them


def test_the_runner_refuses_splits_across_pools() -> None:
    envs = _vec(6, 2)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with closing(envs), pytest.raises(InvalidArgumentError, match=r"whole blocks.*\[0, 3, 6\]"):
        jr.EnvRunner(envs, policy, params, 16, seed=1, num_splits=3)


def test_a_pool_is_sent_whole_and_answered_in_the_order_sent() -> None:
    with closing(_vec(6, 2)) as vec:
        vec.reset(seed=SEED)
        with pytest.raises(InvalidArgumentError, match=r"pool edges \[0, 3, 6\]"):
            vec.send(np.zeros(2, np.int64), slice(0, 2))
        with pytest.raises(InvalidArgumentError, match="no send"):
            vec.recv()
        vec.send(np.zeros(3, np.int64), slice(3, 6))
        vec.send(np.ones(3, np.int64), slice(0, 3))
        assert [vec.recv().env_ids, vec.recv().env_ids] == [slice(3, 6), slice(0, 3)]


def test_a_refused_send_steps_no_pool() -> None:
    """A pool still stepping, or a bad action in any pool, refuses the send before any
    pool steps: what was in flight is answered as before, and nothing more."""
    with closing(_vec(6, 2)) as vec:
        vec.reset(seed=SEED)
        vec.send(np.zeros(3, np.int64), slice(3, 6))
        with pytest.raises(InvalidArgumentError, match=r"sub-envs 3\.\.5 \(a pool\) are still"):
            vec.send(np.zeros(6, np.int64))
        assert vec.recv().env_ids == slice(3, 6)
        for actions, rows in (
            (np.array([0, 1, 0, 0, 7, 0]), None),
            (np.array([0, 7, 0]), slice(3, 6)),
        ):
            with pytest.raises(jr.errors.InvalidActionError, match="sub-env 4"):  # not 1
                vec.send(actions, rows)
        with pytest.raises(InvalidArgumentError, match="no send"):
            vec.recv()


def test_reset_at_resets_the_sub_env_of_its_pool() -> None:
    with closing(_vec(4, 2)) as one_of_two, closing(_vec(4)) as one:
        for vec in (one_of_two, one):
            vec.reset(seed=SEED)
            for _ in range(3):
                vec.step(np.ones(4, np.int64))
        obs = [
            vec.reset(options={"reset_mask": np.array([0, 0, 1, 0], bool)})[0]
            for vec in (one_of_two, one)
        ]
        assert_trees_equal(obs[0], obs[1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_pools": 0}, "num_pools"),
        ({"num_pools": 5}, r"2..num_envs=4"),
        ({"num_pools": 2, "batch_size": 2}, "not both"),
    ],
)
def test_bad_num_pools_is_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        jr.make_vec("CartPole-v1", 4, backend="envpool", **kwargs)

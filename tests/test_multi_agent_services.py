"""Runner services for multi-agent envs: evaluation (jr.evaluate), checked against the
env's known episode lengths and the runner's own agent episodes."""

from __future__ import annotations

import collections

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

import jaxrunner as jr
from tests import multi_agent_envs as envs_mod
from tests.test_multi_agent import random_policy, zero_params


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_evaluate_returns_each_envs_first_episodes(backend):
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2, backend)
    policy, params = random_policy(3), zero_params(3)
    with envs:
        result = jr.evaluate(envs, policy, params, 5, deterministic=False, seed=3)
        again = jr.evaluate(envs, policy, params, 5, deterministic=False, seed=3)
    assert isinstance(result, jr.multi_agent.MultiAgentEvaluationResult)
    # Env 0 gives its first 3 episodes, env 1 its first 2. ComingAndGoing's episode k
    # ends at step 6 + k % 2 (when its last agent, a2, terminates).
    np.testing.assert_array_equal(result.env_ids, [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(result.lengths, [6, 7, 6, 6, 7])
    total = sum(result.agent_returns.values())
    np.testing.assert_allclose(result.returns, total)
    assert result.agent_returns["a3"].tolist() == [0.0] * 5  # never appears
    np.testing.assert_array_equal(result.returns, again.returns)  # same seed, same result

    # The same episodes, from the runner's own agent episodes.
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2, backend)
    with jr.MultiAgentRunner(envs, policy, params, 32, seed=3) as runner:
        by_env_episode: dict[tuple[int, int], float] = collections.defaultdict(float)
        for episode in runner.sample_episodes(40):
            by_env_episode[(episode.env_id, episode.episode_id)] += episode.total_reward
    firsts = [
        [ret for (env, _), ret in sorted(by_env_episode.items()) if env == b] for b in range(2)
    ]
    np.testing.assert_allclose(result.returns, firsts[0][:3] + firsts[1][:2])
    assert result.summary()["num_episodes"] == 5.0


def test_evaluate_refuses_a_policy_dict_for_single_agent_envs():
    envs = jr.make_vec("CartPole-v1", 2)
    with envs, pytest.raises(jr.errors.InvalidArgumentError, match=r"one jaxrunner\.Policy"):
        jr.evaluate(envs, {"policy_0": random_policy(2)}, zero_params(2), 2)

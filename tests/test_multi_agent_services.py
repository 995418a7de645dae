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


class _Recorder(jr.multi_agent.AgentCallbacks):
    def __init__(self):
        self.ended = []

    def on_agent_episode_end(self, runner, episode):
        self.ended.append(episode)


@pytest.mark.parametrize("factory", [envs_mod.coming_and_going, envs_mod.relay])
def test_callbacks_see_each_complete_agent_episode_once(factory):
    n = 3 if factory is envs_mod.coming_and_going else 4
    policy, params = random_policy(n), zero_params(n)
    recorder = _Recorder()
    envs = jr.make_multi_agent_vec(factory, 2)
    with jr.MultiAgentRunner(envs, policy, params, 5, seed=1, callbacks=recorder) as runner:
        for _ in range(4):  # 20 steps: episodes span samples
            runner.sample()
    envs = jr.make_multi_agent_vec(factory, 2)
    with jr.MultiAgentRunner(envs, policy, params, 20, seed=1) as runner:
        reference = runner.sample_episodes(len(recorder.ended))
    # The same agent episodes (the callbacks see them sample by sample, so in another
    # order than one long sample sorts them), each whole.
    assert len(recorder.ended) > 4
    ended = sorted(recorder.ended, key=lambda e: (e.episode_id, e.agent_id))
    reference = sorted(reference, key=lambda e: (e.episode_id, e.agent_id))
    assert [(e.episode_id, e.agent_id) for e in ended] == [
        (e.episode_id, e.agent_id) for e in reference
    ]
    for got, want in zip(ended, reference):
        np.testing.assert_array_equal(got.reward, want.reward)
        np.testing.assert_array_equal(got.action, want.action)


def test_callbacks_that_override_nothing_are_never_called():
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    callbacks = jr.multi_agent.AgentCallbacks()
    with jr.MultiAgentRunner(
        envs, random_policy(3), zero_params(3), 5, seed=1, callbacks=callbacks
    ) as runner:
        assert runner._on_agent_episode_end is None
        runner.sample()
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    with pytest.raises(jr.errors.InvalidArgumentTypeError, match="AgentCallbacks"):
        jr.MultiAgentRunner(envs, random_policy(3), zero_params(3), 5, seed=1, callbacks=object())
    # Refused before the runner took the envs: another runner may have them.
    with jr.MultiAgentRunner(envs, random_policy(3), zero_params(3), 5, seed=1) as runner:
        assert runner.sample().num_steps == 5

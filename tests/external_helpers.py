"""Helpers shared by the external-env and serving tests: a CartPole ExternalEnv, play
CartPole episodes against it or a PolicyClient, and replay them in a fresh env."""

from __future__ import annotations

import threading

import gymnasium
import jax
import numpy as np

import jaxrunner as jr
from jaxrunner.models import mlp_policy

CARTPOLE = gymnasium.make("CartPole-v1")
OBS_SPACE, ACTION_SPACE = CARTPOLE.observation_space, CARTPOLE.action_space


def make_external(**config) -> jr.ExternalEnv:
    config.setdefault("max_batch", 8)
    config.setdefault("buckets", (config["max_batch"],))
    policy = mlp_policy(ACTION_SPACE, hidden=(16,))
    params = policy.init(jax.random.key(0), OBS_SPACE)
    return jr.ExternalEnv(
        OBS_SPACE, ACTION_SPACE, policy, params, seed=3, config=jr.ExternalEnvConfig(**config)
    )


def play(client, seed: int, episode_id: int | None = None, max_steps: int = 500) -> int:
    """Runs one CartPole episode against ``client`` (an ExternalEnv or PolicyClient)."""
    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    eid = client.start_episode(episode_id)
    for _ in range(max_steps):
        action = client.get_action(eid, obs)
        obs, reward, terminated, truncated, _ = env.step(int(action))
        client.log_returns(eid, float(reward))
        if terminated or truncated:
            client.end_episode(eid, obs, truncated=bool(truncated and not terminated))
            return eid
    client.end_episode(eid, obs, truncated=True)
    return eid


def run_threads(target, args_list) -> None:
    """Runs ``target(*args)`` for each of ``args_list`` in threads of their own, all at
    once; re-raises the first error one of them raised."""
    errors_seen: list[BaseException] = []

    def guarded(*args):
        try:
            target(*args)
        except BaseException as err:
            errors_seen.append(err)

    threads = [threading.Thread(target=guarded, args=args) for args in args_list]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors_seen:
        raise errors_seen[0]


def assert_replays(episode: jr.Episode, seed: int) -> None:
    """The episode is exactly what a fresh env with the same seed does with its actions."""
    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    np.testing.assert_array_equal(episode.obs[0], obs)
    for t in range(episode.length):
        obs, reward, terminated, truncated, _ = env.step(int(episode.action[t]))
        np.testing.assert_array_equal(episode.obs[t + 1], obs)
        assert episode.reward[t] == reward
        assert (terminated or truncated) == (t == episode.length - 1)
    assert episode.terminated == terminated
    assert episode.truncated == (truncated and not terminated)

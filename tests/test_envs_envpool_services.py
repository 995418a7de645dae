"""Every service over the "envpool" backend's default reset slots (skipped without EnvPool).

By default the backend records EnvPool's own reset steps as ``valid=False`` slots; each
service is checked against EnvPool stepped by hand with the same actions: episodes
(``sample_episodes``, ``evaluate``, what ``to_minari`` writes), ``gae`` and
``discounted_returns``, and ``NormalizeObservation``'s statistics, in sync mode and in
async mode (ready-first).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.connectors import Connectors, FrameStack, NormalizeObservation
from jaxrunner.testing import assert_trees_equal

envpool = pytest.importorskip("envpool")
pytestmark = pytest.mark.filterwarnings("ignore:.*precision lowered:UserWarning")

SEED = 3
MODES = pytest.mark.parametrize("mode", [{}, {"batch_size": 2}], ids=["sync", "async"])


def _rule_policy(rule: Callable[[jax.Array], jax.Array]) -> jr.Policy:
    """A policy acting by ``rule(obs)`` (no keys, no params), so a hand loop acts the same."""

    def apply_fn(params: Any, obs: jax.Array, carry: Any, keys: jax.Array) -> tuple:
        return rule(obs), {}, carry

    return jr.Policy(apply_fn)


def _cartpole_rule(obs: Any) -> Any:
    return (obs[:, 2] > 0).astype(jnp.int32 if isinstance(obs, jax.Array) else np.int32)


def _breakout_rule(obs: Any) -> Any:
    """An action in 0..3 from the frame's pixel sum: exact in numpy and in JAX."""
    if isinstance(obs, jax.Array):
        return jnp.sum(obs.astype(jnp.int32), axis=(1, 2, 3)) % 4
    return (obs.astype(np.int64).sum(axis=(1, 2, 3)) % 4).astype(np.int32)


def _hand_episodes(
    task: str, n: int, per_env: int, rule: Callable, **kwargs: Any
) -> list[list[tuple]]:
    """EnvPool by hand (NEXT_STEP autoreset) acting by ``rule``: each env's first
    ``per_env`` episodes as (obs [L + 1], action, reward, terminated, truncated)."""
    pool = envpool.make_gymnasium(task, num_envs=n, env_seed=jr.env_seeds(SEED, n), **kwargs)
    done: list[list[tuple]] = [[] for _ in range(n)]
    with closing(pool):
        obs = pool.reset()[0]
        rows: list[list[tuple]] = [[] for _ in range(n)]
        pending = np.zeros(n, bool)
        while min(len(d) for d in done) < per_env:
            action = rule(obs)
            next_obs, reward, terminated, truncated, _ = pool.step(action)
            for i in range(n):
                if pending[i]:  # EnvPool's reset step: next_obs[i] starts an episode
                    assert reward[i] == 0 and not terminated[i] and not truncated[i]
                    continue
                rows[i].append((obs[i], action[i], reward[i], terminated[i], next_obs[i]))
                if terminated[i] or truncated[i]:
                    o, a, r, term, final = zip(*rows[i])
                    obs_i = np.stack([*o, final[-1]])
                    done[i].append((obs_i, np.array(a), np.array(r), term[-1], truncated[i]))
                    rows[i] = []
            pending = (terminated | truncated) & ~pending
            obs = next_obs
    return [d[:per_env] for d in done]


def _check_episodes(episodes: list[jr.Episode], hand: list[list[tuple]]) -> None:
    """``episodes`` (each env's first, in start order) are the hand loop's, exactly."""
    for i, expected in enumerate(hand):
        got = [e for e in episodes if e.env_id == i][: len(expected)]
        assert len(got) == len(expected), f"env {i}"
        for k, (e, (obs, action, reward, terminated, truncated)) in enumerate(zip(got, expected)):
            assert e.is_complete and not e.faulty, f"env {i} episode {k}"
            assert_trees_equal(
                (e.obs, e.action.astype(np.int32), e.reward, e.terminated, e.truncated),
                (obs, action, reward.astype(np.float64), bool(terminated), bool(truncated)),
                f"env {i} episode {k}",
            )


@MODES
def test_sample_episodes_and_evaluate_are_envpools_episodes(mode: dict) -> None:
    """Breakout with ``episodic_life`` (a lost life ends an episode, the game goes on):
    ``sample_episodes`` and ``evaluate`` give each env's episodes exactly as EnvPool by
    hand, first observation to final, never a reset step inside (Pong has no lives,
    so ``episodic_life`` changes nothing there). These Episodes are what ``to_minari``
    writes."""
    n, per_env = 4, 2
    kwargs = {"episodic_life": True, "max_episode_steps": 200}
    hand = _hand_episodes("Breakout-v5", n, per_env, _breakout_rule, **kwargs)
    assert any(len(e[2]) < 200 and e[3] for es in hand for e in es)  # lives lost, not cut
    policy = _rule_policy(_breakout_rule)
    envs = jr.make_vec("Breakout-v5", n, backend="envpool", **mode, **kwargs)
    assert envs.capabilities.reset_steps
    with jr.EnvRunner(envs, policy, {}, rollout_length=32, seed=SEED) as runner:
        _check_episodes(runner.sample_episodes(n * per_env), hand)
        metrics = runner.get_metrics()
    assert metrics["num_faulty_episodes"] == metrics["num_dropped_steps"] == 0
    with closing(jr.make_vec("Breakout-v5", n, backend="envpool", **mode, **kwargs)) as envs:
        result = jr.evaluate(
            envs, policy, {}, n * per_env, deterministic=False, seed=SEED, rollout_length=32
        )  # the rule is deterministic: no distribution to take the mode of
    _check_episodes(result.episodes, hand)
    expected = [float(e[2].sum()) for es in hand for e in es]
    np.testing.assert_array_equal(result.returns, expected)
    np.testing.assert_array_equal(result.lengths, [len(e[2]) for es in hand for e in es])


def _hand_steps(n: int, limit: int, actions: np.ndarray) -> dict[str, np.ndarray]:
    """CartPole by hand with ``actions`` ``[T, n]``: every call's arrays, ``[T, n, ...]``,
    and ``valid`` (False at EnvPool's reset steps)."""
    pool = envpool.make_gymnasium(
        "CartPole-v1", num_envs=n, env_seed=jr.env_seeds(SEED, n), max_episode_steps=limit
    )
    out: dict[str, list] = {k: [] for k in ("obs", "next_obs", "reward", "term", "trunc", "valid")}
    with closing(pool):
        obs, ended = pool.reset()[0], np.zeros(n, bool)
        for action in actions:
            next_obs, reward, terminated, truncated, _ = pool.step(action.astype(np.int32))
            for key, x in zip(out, (obs, next_obs, reward, terminated, truncated, ~ended)):
                out[key].append(x)
            obs, ended = next_obs, terminated | truncated
    return {k: np.stack(v) for k, v in out.items()}


def _gae_by_hand(
    reward: np.ndarray, term: np.ndarray, trunc: np.ndarray, valid: np.ndarray,
    value: np.ndarray, next_value: np.ndarray, gamma: float, lam: float,
) -> np.ndarray:  # fmt: skip
    """Each env's real transitions alone (its reset steps dropped), GAE as CleanRL
    writes it, cut at every episode end and at the batch's last step; 0 at reset steps."""
    advantages = np.zeros_like(reward)
    for i in range(reward.shape[1]):
        rows = np.flatnonzero(valid[:, i])
        later = 0.0
        for j in reversed(range(len(rows))):
            t = rows[j]
            delta = reward[t, i] + gamma * (0.0 if term[t, i] else next_value[t, i]) - value[t, i]
            goes_on = j + 1 < len(rows) and not (term[t, i] or trunc[t, i])
            later = delta + gamma * lam * (later if goes_on else 0.0)
            advantages[t, i] = later
    return advantages


@MODES
def test_gae_and_returns_skip_reset_slots_as_envpool_by_hand(mlp: Callable, mode: dict) -> None:
    """``jr.gae`` and ``jr.discounted_returns`` on a default EnvPool trajectory: zero at
    the reset slots, and elsewhere the values computed over each env's real transitions
    alone, those of EnvPool stepped by hand (truncations bootstrap from the final
    observation, which the reset slot holds as its ``obs``)."""
    n, limit, length, gamma, lam = 4, 20, 48, 0.9, 0.8
    envs = jr.make_vec("CartPole-v1", n, backend="envpool", max_episode_steps=limit, **mode)
    policy = mlp(envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, length, SEED, compact_next_obs=True) as runner:
        traj = runner.sample()
    hand = _hand_steps(n, limit, traj.action)
    assert_trees_equal(
        (traj.obs, traj.reward, traj.terminated, traj.truncated, traj.valid),
        (hand["obs"], hand["reward"].astype(np.float64), hand["term"], hand["trunc"],
         hand["valid"]),
    )  # fmt: skip
    resets = ~traj.valid
    assert resets.any() and traj.truncated.any() and traj.terminated.any()

    def value_fn(obs: Any) -> jax.Array:
        return jnp.asarray(obs, jnp.float32) @ jnp.array([0.5, -1.0, 2.0, 0.25], jnp.float32)

    value = value_fn(traj.obs)
    next_value = traj.next_value(value, value_fn)
    np.testing.assert_array_equal(next_value, value_fn(hand["next_obs"]))
    out = jr.gae(traj, value=value, next_value=next_value, gamma=gamma, lam=lam)
    assert (np.asarray(out.advantages)[resets] == 0).all()
    assert (np.asarray(out.returns)[resets] == 0).all()
    args = (hand["reward"].astype(np.float32), hand["term"], hand["trunc"], hand["valid"])
    values = (np.asarray(value), np.asarray(next_value))
    expected = _gae_by_hand(*args, *values, gamma, lam)
    np.testing.assert_allclose(out.advantages, expected, rtol=1e-5, atol=1e-5)
    returns = jr.discounted_returns(traj, next_value=next_value, gamma=gamma)
    assert (np.asarray(returns)[resets] == 0).all()
    # lam = 1: the advantages plus the value telescope to the discounted returns.
    expected = np.where(hand["valid"], _gae_by_hand(*args, *values, gamma, 1.0) + values[0], 0)
    np.testing.assert_allclose(returns, expected, rtol=1e-5, atol=1e-4)


@MODES
def test_normalize_observation_counts_each_observation_envpool_gave_once(
    mlp: Callable, mode: dict
) -> None:
    """NormalizeObservation takes in every observation the policy acted on, once: in a
    default EnvPool trajectory that is every observation EnvPool returned (each
    episode's final one acted on, and counted, in its reset slot, as a normalizer over
    EnvPool by hand counts it), never a reset slot twice; checked against the mean and
    variance of the hand loop's observations."""
    n, limit, length, samples = 4, 9, 16, 3
    envs = jr.make_vec("CartPole-v1", n, backend="envpool", max_episode_steps=limit, **mode)
    policy = mlp(envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    connectors = Connectors(obs=[NormalizeObservation(clip=None)])
    with jr.EnvRunner(envs, policy, params, length, SEED, connectors=connectors) as runner:
        traj = jr.concatenate([runner.sample() for _ in range(samples)])
        stats = runner.get_connector_state().obs[0].shared.stats
    hand = _hand_steps(n, limit, traj.action)
    np.testing.assert_array_equal(traj.obs, hand["obs"])
    assert (~hand["valid"]).any()  # reset steps happened, and their obs are final ones
    seen = hand["obs"].reshape(-1, 4).astype(np.float64)
    assert int(stats.count) == len(seen) == n * length * samples
    np.testing.assert_allclose(stats.mean, seen.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats.var, seen.var(0), rtol=1e-4, atol=1e-6)


@MODES
def test_frame_stack_restarts_at_the_first_step_after_a_reset_slot(
    mlp: Callable, mode: dict
) -> None:
    """FrameStack over a default EnvPool trajectory: at every real transition the policy
    saw the episode's last frames as EnvPool by hand gave them (filled with the reset
    observation at its first step, never a frame of the episode before), and
    ``policy_next_obs`` at an episode's end stacks its final observation."""
    n, limit, length, k = 4, 7, 24, 3
    envs = jr.make_vec("CartPole-v1", n, backend="envpool", max_episode_steps=limit, **mode)
    frames = FrameStack(num_frames=k)
    policy = mlp(envs.single_action_space)
    params = policy.init(jax.random.key(1), frames.observation_space(envs.single_observation_space))
    connectors = Connectors(obs=[frames])
    with jr.EnvRunner(envs, policy, params, length, SEED, connectors=connectors) as runner:
        traj = runner.sample()
    hand = _hand_steps(n, limit, traj.action)
    np.testing.assert_array_equal(traj.valid, hand["valid"])
    assert (~hand["valid"]).any()
    seen, after = np.asarray(traj.extras["policy_obs"]), np.asarray(traj.extras["policy_next_obs"])
    for i in range(n):
        stack = None
        for t in np.flatnonzero(hand["valid"][:, i]):
            obs = hand["obs"][t, i]
            first = t == 0 or not hand["valid"][t - 1, i]
            stack = np.stack([obs] * k) if first else np.concatenate([stack[1:], obs[None]])
            np.testing.assert_array_equal(seen[t, i], stack, f"env {i} step {t}")
            if hand["term"][t, i] or hand["trunc"][t, i]:
                final = np.concatenate([stack[1:], hand["next_obs"][t, i][None]])
                np.testing.assert_array_equal(after[t, i], final, f"env {i} step {t}")
    assert not after[~hand["valid"]].any()  # no transition at a reset slot: zero

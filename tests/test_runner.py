"""EnvRunner: trajectories against hand-stepped reference envs, and the invariants."""

from __future__ import annotations

import re
import warnings

import chex
import flax.linen as nn
import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ActorCritic, short_cartpole

import jaxrunner as jr
from jaxrunner._src.core.params import _has_nan
from jaxrunner.errors import (
    ClosedError,
    InvalidArgumentError,
    InvalidStepError,
    JaxRunnerError,
    RunnerFailedError,
    SpaceMismatchError,
)
from jaxrunner.models import mlp_policy
from jaxrunner.testing import assert_trees_equal


def replay(make_env, seed: int, trajs: list[jr.Trajectory], b: int, clip=None) -> int:
    """Replays env ``b``'s actions in a fresh reference env and checks every field
    exactly; returns the number of steps replayed."""
    env = make_env()
    # The runner resets env b with the seed the one rule gives it.
    obs, _ = env.reset(seed=jr.env_seeds(seed, trajs[0].reward.shape[1])[b])
    steps = 0
    for traj in trajs:
        for t in range(traj.num_steps):
            np.testing.assert_array_equal(traj.obs[t, b], obs)
            action = traj.action[t, b]
            next_obs, reward, terminated, truncated, _ = env.step(
                action if clip is None else clip(action)
            )
            np.testing.assert_array_equal(traj.next_obs[t, b], next_obs)
            assert traj.reward[t, b] == reward
            assert traj.terminated[t, b] == terminated
            assert traj.truncated[t, b] == truncated
            obs = next_obs
            if terminated or truncated:
                obs, _ = env.reset()
            steps += 1
    return steps


def test_trajectory_fields(cartpole_runner):
    runner = cartpole_runner(num_envs=3, rollout_length=10)
    traj = runner.sample()
    assert traj.obs.shape == traj.next_obs.shape == (10, 3, 4)
    assert traj.obs.dtype == np.float32
    assert traj.action.shape == (10, 3) and traj.action.dtype == np.int64
    assert traj.reward.dtype == np.float64
    assert set(traj.extras) == {"log_prob", "value"}
    assert traj.extras["log_prob"].shape == (10, 3)
    np.testing.assert_array_equal(traj.env_id, np.broadcast_to(np.arange(3), (10, 3)))
    np.testing.assert_array_equal(traj.step[0], 0)
    np.testing.assert_array_equal(traj.episode_id[0], np.arange(3))


def test_replay_reproduces_trajectory_across_samples(cartpole_runner):
    runner = cartpole_runner(num_envs=4, rollout_length=25, seed=7)
    trajs = [runner.sample() for _ in range(3)]
    assert any(t.truncated.any() for t in trajs)  # time limit hit: truncations are covered
    for b in range(4):
        assert replay(short_cartpole, 7, trajs, b) == 75


def test_box_actions_clipped_for_env_only():
    envs = jr.make_vec("Pendulum-v1", 2)
    policy = jr.Policy.from_linen(ActorCritic(1), envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    params["log_std"] = jnp.full((1,), 1.5)  # wide: many samples outside [-2, 2]
    space = envs.single_action_space
    with jr.EnvRunner(envs, policy, params, rollout_length=40, seed=3) as runner:
        traj = runner.sample()
    assert (np.abs(traj.action) > 2).any(), "the trajectory keeps the unclipped action"
    for b in range(2):
        replay(
            lambda: gymnasium.make("Pendulum-v1"),
            3,
            [traj],
            b,
            clip=lambda a: np.clip(a, space.low, space.high),
        )


def test_exactly_once_and_step_counts(cartpole_runner):
    counts = np.zeros(3, dtype=int)

    class Counted(gymnasium.Wrapper):
        def __init__(self, index):
            super().__init__(short_cartpole())
            self.index = index

        def step(self, action):
            counts[self.index] += 1
            return super().step(action)

    made = iter(range(3))
    envs = jr.make_vec(lambda: Counted(next(made)), 3)
    policy = jr.Policy.from_linen(ActorCritic(2), envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length=30, seed=0) as runner:
        trajs = [runner.sample() for _ in range(4)]
        metrics = runner.get_metrics()
    np.testing.assert_array_equal(counts, 120)
    assert metrics["num_env_steps"] == 360 == sum(t.reward.size for t in trajs)
    joined = jr.concatenate(trajs)
    # Each step appears once: (episode_id, step) pairs are unique and contiguous.
    for b in range(3):
        for episode_id in np.unique(joined.episode_id[:, b]):
            steps = joined.step[:, b][joined.episode_id[:, b] == episode_id]
            np.testing.assert_array_equal(steps, np.arange(steps[0], steps[0] + len(steps)))
    assert len(np.unique(joined.episode_id)) == metrics["num_episodes"] + 3


def _numbered_by_hand(ended: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Episode ids and steps as a plain loop numbers them: env b starts with id b;
    after each step, every env whose episode ended (in env order) takes the next id."""
    ids, steps = np.zeros(ended.shape, np.int64), np.zeros(ended.shape, np.int64)
    current, step, next_id = list(range(ended.shape[1])), [0] * ended.shape[1], ended.shape[1]
    for t in range(ended.shape[0]):
        ids[t], steps[t] = current, step
        for b in range(ended.shape[1]):
            step[b] += 1
            if ended[t, b]:
                current[b], step[b], next_id = next_id, 0, next_id + 1
    return ids, steps


@pytest.mark.parametrize("num_splits", [1, 3])
def test_episode_ids_and_steps_match_a_hand_numbering(cartpole_runner, num_splits):
    runner = cartpole_runner(num_envs=5, rollout_length=23, num_splits=num_splits)
    joined = jr.concatenate([runner.sample() for _ in range(3)])  # episodes span samples
    ids, steps = _numbered_by_hand(joined.terminated | joined.truncated | ~joined.valid)
    np.testing.assert_array_equal(joined.episode_id, ids)
    np.testing.assert_array_equal(joined.step, steps)


def test_no_fabricated_transitions_at_episode_ends(cartpole_runner):
    traj = cartpole_runner(num_envs=4, rollout_length=60).sample()
    done = traj.done[:-1]
    assert done.any()
    # After an end the next step starts a new episode at step 0 from a reset obs ...
    assert (traj.step[1:][done] == 0).all()
    assert (traj.episode_id[1:][done] != traj.episode_id[:-1][done]).all()
    # ... and inside an episode, obs[t+1] is exactly next_obs[t].
    np.testing.assert_array_equal(traj.obs[1:][~done], traj.next_obs[:-1][~done])
    assert not np.array_equal(traj.obs[1:][done], traj.next_obs[:-1][done])


def test_same_seed_same_trajectories_and_different_seed_differs(cartpole_runner):
    a = cartpole_runner(seed=5).sample()
    b = cartpole_runner(seed=5).sample()
    c = cartpole_runner(seed=6).sample()
    jax.tree.map(np.testing.assert_array_equal, a, b)
    assert not np.array_equal(a.action, c.action)


@pytest.mark.parametrize("num_splits", [2, 3])
def test_pipelined_groups_give_identical_trajectories(cartpole_runner, num_splits):
    """Invariant 7: splitting the envs into pipelined groups changes nothing."""
    reference = cartpole_runner(num_envs=7, rollout_length=30, seed=3, num_splits=1)
    grouped = cartpole_runner(num_envs=7, rollout_length=30, seed=3, num_splits=num_splits)
    for _ in range(2):  # episodes continue across samples
        jax.tree.map(np.testing.assert_array_equal, reference.sample(), grouped.sample())
    ref_metrics, metrics = reference.get_metrics(), grouped.get_metrics()
    for key in ("num_env_steps", "num_episodes", "episode_return_mean"):
        assert metrics[key] == ref_metrics[key]


@pytest.mark.parametrize("num_splits", [2, 3])
def test_pipelined_groups_are_bitwise_equal_for_wide_policies_too(num_splits):
    """Invariant 7 where XLA's matmuls round by batch size: a 256-256 MLP on 64
    Pendulum envs gave Box actions up to 4.8e-7 apart when each group's policy ran
    at its own batch size (docs/performance.md, batch invariance)."""

    def sample(groups: int) -> jr.Trajectory:
        envs = jr.make_vec("Pendulum-v1", 64)
        policy = mlp_policy(envs.single_action_space, hidden=(256, 256))
        params = policy.init(jax.random.key(0), envs.single_observation_space)
        with jr.EnvRunner(envs, policy, params, 6, 0, num_splits=groups) as runner:
            return jr.concatenate([runner.sample(), runner.sample()])

    jax.tree.map(np.testing.assert_array_equal, sample(1), sample(num_splits))


def test_num_splits_validated(cartpole_runner):
    with pytest.raises(ValueError, match="num_splits"):
        cartpole_runner(num_envs=2, num_splits=3)


def test_policy_compiled_once_and_new_params_apply_without_retrace():
    module = ActorCritic(2)
    base = jr.Policy.from_linen(module, gymnasium.spaces.Discrete(2), deterministic=True)

    # Two traces at construction: one row for XLA's cost estimate (the policy chunk,
    # jaxrunner._src.samplers.batch_invariance), then the compiled step; none after.
    @chex.assert_max_traces(n=2)
    def counting_apply(params, obs, carry, keys):
        return base.apply_fn(params, obs, carry, keys)

    policy = jr.Policy(counting_apply, base.init_fn)
    envs = jr.make_vec(short_cartpole, 4)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length=16, seed=0) as runner:
        first = runner.sample()
        # Negated logits layer: a different greedy action wherever the logits differ.
        flipped = jax.tree.map(lambda x: x, params)
        layer = flipped["module"]["params"]["Dense_1"]
        flipped["module"]["params"]["Dense_1"] = jax.tree.map(lambda x: -x, layer)
        runner.set_params(flipped)
        second = runner.sample()
        runner.set_params(params)
        runner.sample()

    # The deterministic (greedy) actions of the second sample follow the new params.
    def greedy(p, obs):
        logits, _ = module.apply(p["module"], obs.reshape(-1, 4))
        return np.asarray(jnp.argmax(logits, axis=-1)).reshape(obs.shape[:2])

    np.testing.assert_array_equal(first.action, greedy(params, first.obs))
    np.testing.assert_array_equal(second.action, greedy(flipped, second.obs))
    assert not np.array_equal(second.action, greedy(params, second.obs))


def test_params_of_another_observation_size_are_named_when_the_runner_is_built():
    envs = jr.make_vec("CartPole-v1", 2)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    other = policy.init(jax.random.key(0), gymnasium.spaces.Box(-1, 1, (5,)))  # not (4,)
    with envs, pytest.raises(InvalidArgumentError, match="could not be applied to these params"):
        jr.EnvRunner(envs, policy, other, 4, 0)
    # Params of the env's observations where connectors change them: the connectors' space
    # is named, and how to initialise on it (this blamed a pure-JAX env's functions).
    stack = jr.connectors.Connectors(obs=[jr.connectors.FrameStack(num_frames=2)])
    params = policy.init(jax.random.key(0), gymnasium.spaces.Box(-1, 1, (4,)))
    with (
        jr.make_vec("CartPole-v1", 2) as envs,
        pytest.raises(InvalidArgumentError, match=r"sees \(Box of shape \(2, 4\);") as caught,
    ):
        jr.EnvRunner(envs, policy, params, 4, 0, connectors=stack)
    assert "connectors.observation_space(envs.single_observation_space)" in str(caught.value)
    seen = stack.observation_space(envs.single_observation_space)
    with jr.make_vec("CartPole-v1", 2) as envs:  # the fix the error gives
        fixed = policy.init(jax.random.key(0), seen)
        jr.EnvRunner(envs, policy, fixed, 4, 0, connectors=stack).close()


def test_a_policy_whose_outputs_or_code_are_wrong_is_named_not_its_params():
    def n(obs):
        return obs.shape[0]

    def two(params, obs, carry, keys):  # no carry
        return jnp.zeros(n(obs), jnp.int32), {}

    def array_extras(params, obs, carry, keys):
        return jnp.zeros(n(obs), jnp.int32), jnp.zeros(n(obs)), carry

    def branches(params, obs, carry, keys):  # Python control flow on a traced array
        return jnp.zeros(n(obs), jnp.int32) if obs.sum() > 0 else None, {}, carry

    cases = [
        (two, TypeError, r"return \(action, extras, carry\).*got a tuple of 2"),
        (array_extras, TypeError, r"extras a dict .* got extras that are an array"),
        (branches, jax.errors.TracerBoolConversionError, "boolean conversion"),
    ]
    for apply_fn, error, match in cases:
        with jr.make_vec("CartPole-v1", 2) as envs, pytest.raises(error, match=match) as caught:
            jr.EnvRunner(envs, jr.Policy(apply_fn), {}, 4, 0)
        assert "could not be applied to these params" not in str(caught.value)


@pytest.mark.parametrize("backend", ["sync", "jax"])
@pytest.mark.parametrize(
    ("initial", "returned", "expected", "got"),
    [
        (
            jnp.zeros(2),
            lambda c: jnp.zeros((c.shape[0], 3)),
            r"float32\[\d+, 2\]",
            r"float32\[\d+, 3\]",
        ),
        (jnp.zeros(2), lambda c: c.astype(jnp.int32), r"float32\[\d+, 2\]", r"int32\[\d+, 2\]"),
        (jnp.zeros(2), lambda c: None, r"float32\[\d+, 2\]", "None"),
        (jnp.zeros(2), lambda c: {"h": c}, r"float32\[\d+, 2\]", r"\{'h': float32\[\d+, 2\]\}"),
        (None, lambda c: jnp.zeros(2), "None", r"float32\[\d+\]"),
    ],
    ids=["shape", "dtype", "none", "structure", "feed_forward"],
)
def test_a_returned_carry_unlike_the_one_given_is_named_on_every_backend(
    backend, initial, returned, expected, got
):
    """The carry the policy returns is kept for its next step: its structure, shapes and
    dtypes must be those it was given (raw JAX errors, or a silent cast, before)."""

    def apply_fn(params, obs, carry, keys):
        return jnp.zeros(keys.shape[0], jnp.int32), {}, returned(carry)

    if backend == "sync":
        envs = jr.make_vec("CartPole-v1", 2)
    else:
        envs = jr.JaxVectorEnv(jr.testing.RandomWalk(), num_envs=2)
    policy = jr.Policy(apply_fn, initial_carry=initial)
    match = rf"policy apply_fn: .*carry.* expected {expected}, got {got}\. Return "
    with envs, pytest.raises(InvalidArgumentError, match=match):
        jr.EnvRunner(envs, policy, {}, 4, 0).sample()


def test_set_params_rejects_other_shapes(cartpole_runner):
    runner = cartpole_runner()
    params = runner.get_params()
    bad = jax.tree.map(lambda x: jnp.zeros((*x.shape, 2)), params)
    with pytest.raises(SpaceMismatchError, match="same pytree structure"):
        runner.set_params(bad)
    # The multi-agent runner's convention: an optional policy id, the one policy's by default.
    runner.set_params(params, "default_policy")
    assert runner.get_params("default_policy") is runner.get_params()
    with pytest.raises(InvalidArgumentError, match="no such policy"):
        runner.get_params("other")


def test_params_with_nan_are_refused_by_name_and_the_runner_keeps_its_own(cartpole_runner):
    runner = cartpole_runner()
    params = runner.get_params()
    first = runner.sample()
    leaves, treedef = jax.tree.flatten(params)
    bad = treedef.unflatten([leaves[0].at[0].set(jnp.nan), *leaves[1:]])
    path = jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(params)[0][0][0])
    with pytest.raises(InvalidArgumentError, match=r"hold NaN in .*" + re.escape(path)):
        runner.set_params(bad)
    assert runner.get_params() is params  # nothing changed: it samples on as before
    all_nan = jax.tree.map(lambda x: x * jnp.nan, params)
    count = len(leaves) - 3
    with pytest.raises(InvalidArgumentError, match=rf"\(and {count} more leaves\); refused"):
        runner.set_params(all_nan)  # the first three named
    assert runner.sample().obs.shape == first.obs.shape
    shifted = jax.tree.map(lambda x: x + 1, params)
    with jax.transfer_guard("disallow"):  # the check reads its flags back by name
        runner.set_params(shifted)
    inf = treedef.unflatten([jnp.full_like(leaves[0], jnp.inf), *leaves[1:]])
    runner.set_params(inf)  # an infinity may be meant (a mask); NaN never is
    # Off a CPU host (untested here) one compiled call flags each leaf:
    flags = _has_nan([leaves[0].at[1].set(jnp.nan), leaves[1], jnp.full(3, jnp.inf)])
    assert np.asarray(flags).tolist() == [True, False, False]
    envs = jr.make_vec("CartPole-v1", 2)
    with envs:
        with pytest.raises(InvalidArgumentError, match=r"EnvRunner\(params\), policy"):
            jr.EnvRunner(envs, runner.policy, bad, 4, 0)
        jr.EnvRunner(envs, runner.policy, params, 4, 0).sample()  # the envs are still free


def test_metrics_equal_sums_over_episodes(cartpole_runner):
    runner = cartpole_runner(
        num_envs=4, rollout_length=50, metrics=jr.MetricsConfig(episode_window=7)
    )
    trajs = [runner.sample() for _ in range(3)]
    metrics = runner.get_metrics()
    joined = jr.concatenate(trajs)
    ended = [e for e in joined.split_episodes() if e.is_done]
    assert metrics["num_env_steps"] == joined.reward.size
    assert metrics["num_episodes"] == len(ended) == joined.done.sum()
    # The window holds the 7 most recent episode ends, in time order.
    order = sorted(
        ended,
        key=lambda e: (
            np.flatnonzero(joined.episode_id[:, e.env_id] == e.episode_id)[-1],
            e.env_id,
        ),
    )
    recent = order[-7:]
    assert metrics["episode_return_mean"] == pytest.approx(
        np.mean([e.total_return for e in recent])
    )
    assert metrics["episode_length_mean"] == pytest.approx(np.mean([e.length for e in recent]))
    assert metrics["num_faulty_episodes"] == 0 and metrics["num_dropped_steps"] == 0
    assert metrics["env_steps_per_s"] > 0
    assert set(metrics["perf"]) == {
        "env_wait_ms",
        "inference_ms",
        "obs_processing_ms",
        "action_processing_ms",
    }
    assert all(v > 0 for v in metrics["perf"].values())


@pytest.mark.parametrize("num_splits", [1, 2])
def test_episode_statistics_of_episodes_spanning_many_samples(num_splits):
    """Returns and lengths of episodes longer than a sample, summed across samples:
    Pendulum's rewards differ every step, episodes last 15 steps, samples 4."""
    envs = jr.make_vec(lambda: gymnasium.make("Pendulum-v1", max_episode_steps=15), 3)
    policy = jr.Policy.from_linen(ActorCritic(1), envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    config = jr.MetricsConfig(episode_window=1000)
    with jr.EnvRunner(envs, policy, params, 4, 0, metrics=config, num_splits=num_splits) as runner:
        joined = jr.concatenate([runner.sample() for _ in range(12)])
        metrics = runner.get_metrics()
    ended = [e for e in joined.split_episodes() if e.is_done]
    assert len(ended) == metrics["num_episodes"] == 9  # 48 steps: 3 episodes per env
    returns = [float(np.sum(e.reward)) for e in ended]
    assert metrics["episode_return_mean"] == pytest.approx(np.mean(returns), rel=1e-12)
    assert metrics["episode_return_min"] == pytest.approx(min(returns), rel=1e-12)
    assert metrics["episode_return_max"] == pytest.approx(max(returns), rel=1e-12)
    assert metrics["episode_length_mean"] == 15


class ScriptedRewards(gymnasium.Env):
    """Episodes of 3 steps whose rewards follow ``SCRIPT`` (by episode, cyclically)."""

    SCRIPT = (
        (1e308, 1e308, 1.0),  # finite rewards, an overflowing return
        (1.0, 2.0, 3.0),
        (2.0**60, 0.0, 0.0),  # huge: the next episode's small rewards must not vanish
        (0.5, 0.25, 0.25),
        (-1e308, -1e308, 0.0),
        (1.0, 2.0, 4.0),
    )
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode = getattr(self, "episode", -1) + 1
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        reward = self.SCRIPT[self.episode % len(self.SCRIPT)][self.t]
        self.t += 1
        return np.zeros(1, np.float32), reward, self.t == 3, False, {}


@pytest.mark.parametrize("rollout_length", [4, 20])
def test_episode_returns_are_each_episodes_own_and_overflow_is_left_out(rollout_length):
    envs = jr.make_vec(ScriptedRewards, 2)
    policy = jr.Policy.from_linen(ActorCritic(2), envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    config = jr.MetricsConfig(episode_window=1000)
    with jr.EnvRunner(envs, policy, params, rollout_length, 0, metrics=config) as runner:
        with pytest.warns(RuntimeWarning, match="overflows float64"):
            for _ in range(60 // rollout_length):
                runner.sample()
        metrics = runner.get_metrics()
    # The reference: each env stepped by hand for as many steps, returns summed in order.
    env, returns, total = ScriptedRewards(), [], 0.0
    env.reset(seed=0)
    for _ in range(60 // rollout_length * rollout_length):
        _, reward, terminated, _, _ = env.step(0)
        total += reward
        if terminated:
            returns.append(total)
            env.reset()
            total = 0.0
    finite = [r for r in returns if np.isfinite(r)]
    assert len(finite) < len(returns)  # the overflowing episodes ended
    assert metrics["num_episodes"] == 2 * len(returns)
    assert metrics["episode_return_mean"] == pytest.approx(np.mean(finite), rel=1e-15)
    assert metrics["episode_return_min"] == min(finite) == 1.0
    assert metrics["episode_return_max"] == max(finite) == 2.0**60
    assert metrics["episode_length_mean"] == 3


class HugeReturns(ScriptedRewards):
    """Episodes of 3 steps whose finite returns are each near float64's max."""

    SCRIPT = ((1.5e308, 0.0, 0.0),)


def test_the_mean_return_of_huge_finite_returns_is_finite_and_exact():
    """Finite returns whose sum overflows: the mean is theirs (np.mean gave inf and warned
    "overflow encountered in reduce", an error where warnings are)."""
    envs = jr.make_vec(HugeReturns, 2)
    policy = jr.Policy.from_linen(ActorCritic(2), envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, 6, 0) as runner, warnings.catch_warnings():
        warnings.simplefilter("error")
        runner.sample()
        metrics = runner.get_metrics()
    assert metrics["num_episodes"] == 4
    assert metrics["episode_return_mean"] == metrics["episode_return_max"] == 1.5e308


def test_perf_timers_mean_and_ema():
    from jaxrunner._src.core.metrics import PERF_KEYS, PerfTimers

    mean, ema = PerfTimers(None), PerfTimers(0.5)
    for timers in (mean, ema):
        timers.record(dict.fromkeys(PERF_KEYS, 0.010), 10)  # 1 ms per step
        timers.record(dict.fromkeys(PERF_KEYS, 0.006), 2)  # 3 ms per step
    assert mean.summary()["env_wait_ms"] == pytest.approx(16 / 12)
    # EMA: first value 1 ms, then two updates with weight 0.5 towards 3 ms.
    assert ema.summary()["env_wait_ms"] == pytest.approx(3 - 2 * 0.25)
    with pytest.raises(ValueError, match="perf_ema"):
        jr.MetricsConfig(perf_ema=1.5)
    with pytest.raises(ValueError, match="episode_window"):
        jr.MetricsConfig(episode_window=0)
    envs = jr.make_vec("CartPole-v1", 2)
    policy = mlp_policy(envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with (
        envs,
        pytest.raises(
            TypeError, match=r"EnvRunner\(metrics=...\): expected a jaxrunner.MetricsConfig"
        ),
    ):
        jr.EnvRunner(envs, policy, params, 4, 0, metrics={"episode_window": 5})


def test_metrics_of_one_agent_are_the_multi_agent_metrics_without_agent_keys():
    """One RunnerMetrics serves both runners: a single-agent one (no agents) has the
    env-level keys and state only; with agents, the agent keys follow, and the state
    round-trips."""
    from jaxrunner._src.core.metrics import RunnerMetrics

    config = jr.MetricsConfig(episode_window=2)
    single, multi = RunnerMetrics(config), RunnerMetrics(config, {"p": ("a0", "a1")})
    ended = (np.array([1, 0, 1]), np.array([1.0, 2.0, 3.0]), np.array([4, 5, 6]))
    multi.add_group_counts("p", np.array([3, 4]), ended)
    agent_keys = ["num_agent_steps", "num_dropped_agent_steps", "unassigned_reward"]
    assert list(multi.summary()) == [*single.summary(), *agent_keys, "policies", "agents"]
    assert list(multi.get_state()) == [*single.get_state(), "agents"]
    summary = multi.summary()
    assert summary["num_agent_steps"] == summary["policies"]["p"]["num_agent_steps"] == 7
    assert summary["agents"]["a1"]["episode_return_mean"] == 2.0  # its window: [1.0, 3.0]
    assert summary["agents"]["a0"]["num_episodes"] == 1
    restored = RunnerMetrics(config, {"p": ("a0", "a1")})
    restored.set_state(multi.get_state())
    np.testing.assert_equal(restored.summary(), summary)  # NaN (no env episode) equals NaN


@pytest.mark.parametrize("num_splits", [1, 2])
def test_callbacks_see_each_episode(cartpole_runner, num_splits):
    class Recorder(jr.Callbacks):
        def __init__(self):
            self.started, self.steps, self.ended = [], 0, []

        def on_episode_start(self, runner, env_index, episode):
            assert episode.length == 0 and len(episode.obs) == 1
            self.started.append(episode.episode_id)

        def on_episode_step(self, runner, env_index, episode):
            self.steps += 1

        def on_episode_end(self, runner, env_index, episode):
            assert episode.env_id == env_index
            self.ended.append(episode.to_episode())

    recorder = Recorder()
    runner = cartpole_runner(
        num_envs=3, rollout_length=40, callbacks=recorder, num_splits=num_splits
    )
    joined = jr.concatenate([runner.sample(), runner.sample()])
    assert recorder.steps == joined.reward.size
    by_id = {e.episode_id: e for e in joined.split_episodes() if e.is_complete}
    assert recorder.ended and {e.episode_id for e in recorder.ended} == set(by_id)
    for seen in recorder.ended:
        jax.tree.map(np.testing.assert_array_equal, seen, by_id[seen.episode_id])
    assert len(recorder.started) == 3 + len(recorder.ended)


def test_kept_live_episodes_keep_no_trajectory_alive(cartpole_runner):
    # Live episodes read their rows from the sample's buffers while it runs; they must
    # copy them out when the sample (or the episode) ends, else an episode a hook keeps
    # would keep every trajectory it spanned alive.
    import gc
    import weakref

    kept = []

    class Keeper(jr.Callbacks):
        def on_episode_end(self, runner, env_index, episode):
            kept.append(episode)

    runner = cartpole_runner(num_envs=3, rollout_length=8, callbacks=Keeper())
    first = runner.sample()
    first_ref = weakref.ref(first)
    second = runner.sample()
    spanning = [e for e in kept if e.length > 1]
    assert spanning  # episodes that began in the first sample and ended in the second
    rows = [e.to_episode() for e in kept]
    del first
    gc.collect()
    assert first_ref() is None
    joined = {e.episode_id: e for e in second.split_episodes()}
    for episode in rows:  # still the same rows after the copies
        if episode.episode_id in joined and joined[episode.episode_id].start_step == 0:
            np.testing.assert_array_equal(episode.action, joined[episode.episode_id].action)


def test_sample_episodes_complete_and_nothing_lost(cartpole_runner):
    runner = cartpole_runner(num_envs=3, rollout_length=16, seed=2)
    first = runner.sample_episodes(5)
    second = runner.sample_episodes(5)
    episodes = first + second
    assert len(first) == len(second) == 5
    assert len({e.episode_id for e in episodes}) == 10
    assert all(e.is_complete and e.start_step == 0 for e in episodes)
    # In the order they started (ids in (step, env) order), across the samples of a call.
    many = cartpole_runner(num_envs=3, rollout_length=7, seed=4).sample_episodes(20)
    assert [e.episode_id for e in many] == sorted(e.episode_id for e in many)
    # Each episode is exactly what its env produced: replay it in a reference env.
    for e in episodes:
        assert e.obs.shape == (e.length + 1, 4)
        assert e.terminated or e.length == 20


def test_a_refused_sample_forgets_none_of_the_episodes_sample_episodes_assembles(
    cartpole_runner,
):
    """sample() called from a callback is refused; it used to drop the episodes under way
    before refusing, so sample_episodes skipped them."""

    class Meddle(jr.Callbacks):
        def on_episode_end(self, runner, env_index, episode):
            with pytest.raises(InvalidArgumentError, match=r"called while sample\(\) runs"):
                runner.sample()

    plain = cartpole_runner(num_envs=2, rollout_length=16, seed=0).sample_episodes(8)
    meddled = cartpole_runner(num_envs=2, rollout_length=16, seed=0, callbacks=Meddle())
    assert [e.episode_id for e in meddled.sample_episodes(8)] == [e.episode_id for e in plain]


@pytest.mark.parametrize("rollout_length", [3, 7])
def test_sample_episodes_after_plain_samples_returns_only_what_the_env_did(
    cartpole_runner, rollout_length, tmp_path
):
    # A plain sample() takes the steps of the episodes sample_episodes was assembling:
    # an episode spanning it is not seen whole and must not come back joined across it.
    runner = cartpole_runner(num_envs=2, rollout_length=rollout_length, seed=0)
    runner.sample()
    episodes = runner.sample_episodes(2)
    runner.sample()
    episodes += runner.sample_episodes(6)
    num_steps = runner.get_metrics()["num_env_steps"] // 2
    # The reference: the same run as one sample, checked against gymnasium by hand.
    reference = cartpole_runner(num_envs=2, rollout_length=num_steps, seed=0).sample()
    for b in range(2):
        replay(short_cartpole, 0, [reference], b)
    by_id = {e.episode_id: e for e in reference.split_episodes()}
    for episode in episodes:
        whole = by_id[episode.episode_id]
        assert whole.is_complete and episode.is_complete
        jax.tree.map(np.testing.assert_array_equal, episode, whole)
    # And the runner can resume from its own file after a plain sample ended episodes
    # sample_episodes had begun.
    runner.sample_episodes(6)
    for _ in range(3):
        runner.sample()
    runner.save(tmp_path / "ckpt.npz")
    resumed = cartpole_runner(num_envs=2, rollout_length=rollout_length, seed=0)
    assert resumed.restore(tmp_path / "ckpt.npz", load_env_pickles=True).envs_restored


class Recurrent(nn.Module):
    """A GRU policy: ``(carry, obs) -> (carry, (logits, value))``."""

    @nn.compact
    def __call__(self, carry, obs):
        carry, h = nn.GRUCell(features=8)(carry, obs)
        return carry, (nn.Dense(2)(h), nn.Dense(1)(h))


class OneHotPolicy(nn.Module):
    @nn.compact
    def __call__(self, obs):
        return nn.Dense(4)(jax.nn.one_hot(obs, 16))


def test_recurrent_carry_resets_at_episode_start():
    module = Recurrent()
    envs = jr.make_vec(lambda: short_cartpole(12), 3)
    policy = jr.Policy.from_linen(module, envs.single_action_space, initial_carry=jnp.zeros(8))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length=30, seed=0) as runner:
        traj = runner.sample()

    apply = jax.jit(module.apply)  # one compile, not one dispatch per op and step

    def values_from(carry, obs_seq):
        out = []
        for obs in obs_seq:
            carry, (_, value) = apply(params["module"], carry, obs[None])
            out.append(float(value[0, 0]))
        return np.array(out), carry

    checked = 0
    for episode in traj.split_episodes():
        if episode.start_step != 0 or episode.length < 3:
            continue
        fresh, _ = values_from(jnp.zeros((1, 8)), episode.obs[:-1])
        np.testing.assert_allclose(episode.extras["value"], fresh, rtol=1e-5, atol=1e-5)
        # Sanity: a carry not reset would give other values, so this can fail.
        stale, _ = values_from(jnp.ones((1, 8)), episode.obs[:-1])
        assert not np.allclose(episode.extras["value"], stale, atol=1e-4)
        checked += 1
    assert checked >= 6  # several episodes, including ones after an autoreset


def test_error_mid_sample_keeps_collected_steps(cartpole_runner):
    calls = {"n": 0}

    def poisoned():
        env = short_cartpole()

        def reward_fn(r):
            calls["n"] += 1
            return float("nan") if calls["n"] == 2 * 9 + 2 else r  # env 1 at step 9

        return gymnasium.wrappers.TransformReward(env, reward_fn)

    envs = jr.make_vec(poisoned, 2)
    policy = jr.Policy.from_linen(ActorCritic(2), envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    runner = jr.EnvRunner(envs, policy, params, rollout_length=32, seed=0)
    with pytest.raises(InvalidStepError, match="sub-env 1 returned a non-finite reward") as info:
        runner.sample()
    assert isinstance(info.value, ValueError) and isinstance(info.value, JaxRunnerError)
    partial = info.value.partial_trajectory
    assert partial.num_steps == 9
    reference = cartpole_reference_prefix(9)
    jax.tree.map(np.testing.assert_array_equal, partial, reference)
    with pytest.raises(RunnerFailedError):
        runner.sample()
    runner.stop()
    with pytest.raises(ClosedError):
        runner.sample()


def cartpole_reference_prefix(num_steps: int) -> jr.Trajectory:
    envs = jr.make_vec(short_cartpole, 2)
    policy = jr.Policy.from_linen(ActorCritic(2), envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length=num_steps, seed=0) as runner:
        return runner.sample()


def test_policy_with_wrong_action_shape_rejected_at_construction():
    envs = jr.make_vec(short_cartpole, 2)

    def apply_fn(params, obs, carry, keys):
        return jnp.zeros((obs.shape[0], 3), jnp.int32), {}, carry

    with pytest.raises(SpaceMismatchError, match=r"expected shape \(2,\)"):
        jr.EnvRunner(envs, jr.Policy(apply_fn), {}, rollout_length=4, seed=0)
    envs.close()


@pytest.mark.parametrize("hidden", [(), (8,)])
def test_a_policy_on_the_batched_action_space_is_told_to_use_the_single_one(hidden):
    envs = jr.make_vec(short_cartpole, 3)
    policy = mlp_policy(envs.action_space, hidden=hidden)  # MultiDiscrete([2 2 2])
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with pytest.raises(SpaceMismatchError, match=r"envs\.single_action_space, not envs\.action"):
        jr.EnvRunner(envs, policy, params, rollout_length=4, seed=0)
    envs.close()


def test_close_is_stop():
    envs = jr.make_vec(short_cartpole, 2)
    policy = jr.Policy.from_linen(ActorCritic(2), envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    runner = jr.EnvRunner(envs, policy, params, rollout_length=4, seed=0)
    runner.sample()
    runner.close()
    with pytest.raises(ClosedError):
        runner.sample()
    with pytest.raises(ClosedError):  # the envs are closed too
        envs.reset_batch([0, 1])
    runner.close()  # twice is fine, as stop()


def test_constructor_argument_errors():
    envs = jr.make_vec(short_cartpole, 2)
    policy = jr.Policy.from_linen(ActorCritic(2), envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with pytest.raises(ValueError, match="rollout_length"):
        jr.EnvRunner(envs, policy, params, rollout_length=0, seed=0)
    with pytest.raises(ValueError, match="seed"):
        jr.EnvRunner(envs, policy, params, rollout_length=4, seed=-1)
    with pytest.raises(TypeError, match=r"single-agent env takes a jaxrunner\.Callbacks"):
        jr.EnvRunner(envs, policy, params, rollout_length=4, seed=0, callbacks=object())
    gym_envs = gymnasium.vector.SyncVectorEnv([short_cartpole])
    with pytest.raises(TypeError, match="make_vec"):
        jr.EnvRunner(gym_envs, policy, params, rollout_length=4, seed=0)
    envs.close()


def test_spaces_reported(cartpole_runner):
    spaces = cartpole_runner(num_envs=2).get_spaces()
    assert spaces["observation_space"].shape == (4,)
    assert spaces["batched_observation_space"].shape == (2, 4)
    assert spaces["action_space"] == gymnasium.spaces.Discrete(2)


def test_discrete_observations_frozenlake():
    envs = jr.make_vec("FrozenLake-v1", 3)
    policy = jr.Policy.from_linen(OneHotPolicy(), envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length=40, seed=4) as runner:
        traj = runner.sample()
    assert traj.obs.dtype == np.int64 and traj.obs.shape == (40, 3)
    for b in range(3):
        replay(lambda: gymnasium.make("FrozenLake-v1"), 4, [traj], b)


@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_iterate_yields_what_sample_would(cartpole_runner, reuse_buffers, capsys):
    reference = cartpole_runner(rollout_length=8)
    expected = [reference.sample() for _ in range(3)]
    runner = cartpole_runner(rollout_length=8)
    rewards = set()
    for i, traj in enumerate(runner.iterate(3, progress=True, reuse_buffers=reuse_buffers)):
        assert_trees_equal(traj, expected[i])
        rewards.add(id(traj.reward))
    assert i == 2
    # Reused buffers: one set of arrays for the whole loop; else one per sample.
    assert len(rewards) == (1 if reuse_buffers else 3)
    assert "env step" in capsys.readouterr().err
    assert runner.get_metrics()["num_env_steps"] == 3 * 8 * 4


def test_iterate_checks_its_arguments_when_called(cartpole_runner):
    runner = cartpole_runner()
    with pytest.raises(InvalidArgumentError, match=r"iterate\(num_samples=-1\)"):
        runner.iterate(-1)
    with pytest.raises(TypeError, match=r"iterate\(progress='yes'\)"):
        runner.iterate(2, progress="yes")


def test_a_gymnasium_vector_env_or_wrapper_is_refused_with_what_replaces_it():
    from gymnasium.wrappers import vector as wrappers

    envs = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 2)
    policy = jr.models.mlp_policy(envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with pytest.raises(TypeError, match=r"jaxrunner.from_gymnasium\(envs\)"):
        jr.EnvRunner(envs, policy, params, 4, 0)
    wrapped = wrappers.RecordEpisodeStatistics(wrappers.NormalizeObservation(envs))
    with pytest.raises(TypeError) as info:
        jr.EnvRunner(wrapped, policy, params, 4, 0)
    message = str(info.value)
    assert "from_gymnasium(envs.unwrapped)" in message
    assert (
        "NormalizeObservation -> the connector jaxrunner.connectors.NormalizeObservation()"
        in message
    )
    assert "RecordEpisodeStatistics -> runner.get_metrics()" in message
    # from_gymnasium too: the runner would call its reset, not the wrappers' steps.
    with pytest.raises(TypeError, match=r"from_gymnasium\(vector_env=...\).*RecordEpisodeSt"):
        jr.from_gymnasium(wrapped)
    envs.close()

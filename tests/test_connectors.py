"""Connectors (issue 18): statistics against numpy, frame stacks per env and episode,
identical outputs whatever the backend and grouping, one compile, what the learner sees,
and the merge across runners."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces

import jaxrunner as jr
from jaxrunner import connectors as C
from jaxrunner._src.backends.process import ProcessConfig
from jaxrunner._src.connectors import moments
from jaxrunner._src.testing.jax_envs import RandomWalk
from jaxrunner.errors import InvalidArgumentError, SpaceMismatchError
from jaxrunner.models import mlp_policy
from jaxrunner.testing import CountingEnv, counting_env_fns
from tests.ray_helpers import kill_actor

POLICY = functools.partial(mlp_policy, hidden=(16, 16))


def short_cartpole() -> gymnasium.Env:
    return gymnasium.make("CartPole-v1", max_episode_steps=15)


def make_runner(
    envs: Any, connectors: C.Connectors, rollout_length: int = 12, seed: int = 3, **kwargs: Any
) -> jr.EnvRunner:
    policy = POLICY(envs.single_action_space)
    space = connectors.observation_space(envs.single_observation_space)
    params = policy.init(jax.random.key(0), space)
    return jr.EnvRunner(envs, policy, params, rollout_length, seed, connectors=connectors, **kwargs)


def obs_stats(state: C.ConnectorsState, i: int = 0) -> C.Moments:
    return state.obs[i].shared.stats


def assert_moments_match(moments: C.Moments, data: np.ndarray) -> None:
    data = np.asarray(data, np.float64).reshape(-1, *np.shape(moments.mean))
    assert float(moments.count) == len(data)
    np.testing.assert_allclose(moments.mean, data.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(moments.var, data.var(0), rtol=1e-4, atol=1e-7)


# -- statistics ------------------------------------------------------------------------------


def test_moments_merge_equals_numpy_whatever_the_split():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(101, 3)).astype(np.float32)
    whole = C.Moments.of(data)
    assert_moments_match(whole, data)
    parts = [C.Moments.of(chunk) for chunk in np.split(data, [7, 50, 51])]
    assert_moments_match(moments.merge_all([[p] for p in parts])[0], data)
    # Per-env Welford (one row per env per step), then merged over envs.
    per_env = C.Moments.zeros((3,), (4,))
    rows = data[:100].reshape(25, 4, 3)
    for step in rows:
        per_env = per_env.add(step)
    assert_moments_match(per_env.total(), rows)
    masked = C.Moments.of(data, jnp.arange(101) % 3 == 0)
    assert_moments_match(masked, data[::3])


@pytest.mark.parametrize("num_splits", [1, 2])
def test_normalization_statistics_equal_numpy_over_the_observations_seen(num_splits):
    conn = C.Connectors(obs=[C.NormalizeObservation(clip=None)])
    with make_runner(jr.make_vec(short_cartpole, 6), conn, num_splits=num_splits) as runner:
        assert float(obs_stats(runner.get_connector_state()).count) == 0
        first = runner.sample()
        # Before any sample ended: mean 0, variance 1, so the policy saw the raw obs.
        np.testing.assert_allclose(first.extras["policy_obs"], first.obs, rtol=1e-7)
        assert_moments_match(obs_stats(runner.get_connector_state()), first.obs)
        second = runner.sample()
        seen = np.concatenate([first.obs, second.obs])
        assert_moments_match(obs_stats(runner.get_connector_state()), seen)
        # The second sample was normalized with the first one's statistics, exactly.
        mean, std = first.obs.reshape(-1, 4).mean(0), first.obs.reshape(-1, 4).std(0)
        np.testing.assert_allclose(
            second.extras["policy_obs"], (second.obs - mean) / std, rtol=1e-3, atol=1e-4
        )


def test_statistics_merged_across_two_runners_equal_numpy_over_both():
    conn = C.Connectors(obs=[C.NormalizeObservation()])
    seen, deltas = [], []
    for seed in (1, 2):
        with make_runner(jr.make_vec(short_cartpole, 3), conn, seed=seed) as runner:
            seen += [runner.sample().obs, runner.sample().obs]
            state, delta = moments.take_deltas(runner.get_connector_state())
            deltas.append(delta)
            assert float(moments.take_deltas(state)[1][0].count) == 0  # taken once
    merged = moments.merge_all(deltas)
    assert_moments_match(merged[0], np.concatenate(seen))


def test_frozen_normalization_keeps_its_statistics():
    stats = C.Moments.of(np.array([[0.0, 1, 2, 3], [2.0, 3, 4, 5]], np.float32))
    conn = C.Connectors(obs=[C.NormalizeObservation(frozen=True, clip=None)])
    with make_runner(jr.make_vec(short_cartpole, 2), conn) as runner:
        state = runner.get_connector_state()
        runner.set_connector_state(C.set_statistics(state, [stats]))
        traj = runner.sample()
        after = obs_stats(runner.get_connector_state())
    jr.testing.assert_trees_equal(jax.device_get(after), jax.device_get(stats), "stats")
    np.testing.assert_allclose(traj.extras["policy_obs"], traj.obs - np.array([1, 2, 3, 4]), 1e-6)


def test_reward_scaling_follows_the_discounted_return_recurrence():
    conn = C.Connectors(reward=C.ScaleReward(gamma=0.9))
    with make_runner(jr.make_vec(short_cartpole, 3), conn, rollout_length=20) as runner:
        trajs = [runner.sample() for _ in range(2)]
    ret, seen = np.zeros(3), []
    for traj in trajs:
        np.testing.assert_array_equal(traj.reward, 1.0)  # the raw rewards stay
        for t in range(traj.num_steps):
            ret = 0.9 * ret + traj.reward[t]
            seen.append(ret.copy())
            var = np.var(np.concatenate(seen))
            # A zero variance (every return equal so far) scales by 1; std in [1e-6, 1e6].
            std = np.clip(np.sqrt(var + 1e-8), 1e-6, 1e6) if var > 0 else 1.0
            expected = traj.reward[t] / std
            np.testing.assert_allclose(traj.extras["scaled_reward"][t], expected, rtol=1e-4)
            ret[traj.done[t]] = 0.0
    assert np.concatenate([t.done for t in trajs]).any()


# -- frame stack ------------------------------------------------------------------------------


def test_frame_stack_unit_resets_at_episode_starts_and_keeps_envs_apart():
    stack = C.FrameStack(num_frames=3)
    space = spaces.Box(-10, 10, (1,), np.float32)
    state = stack.init(2, space)
    active = jnp.ones(2, bool)
    outs = []
    for t, start in enumerate([[1, 1], [0, 0], [0, 1], [1, 0]]):
        obs = jnp.array([[10.0 + t], [20.0 + t]])
        out, state = stack(state, obs, jnp.array(start, bool), active)
        outs.append(np.asarray(out)[..., 0])
    np.testing.assert_array_equal(outs[0], [[10, 10, 10], [20, 20, 20]])
    np.testing.assert_array_equal(outs[1], [[10, 10, 11], [20, 20, 21]])
    np.testing.assert_array_equal(outs[2], [[10, 11, 12], [22, 22, 22]])
    np.testing.assert_array_equal(outs[3], [[13, 13, 13], [22, 22, 23]])
    assert stack.observation_space(space).shape == (3, 1)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_frame_stack_in_a_runner_never_mixes_episodes_or_envs(num_splits):
    k = 3
    envs = jr.SyncVectorEnv(counting_env_fns(4, episode_length=2))
    conn = C.Connectors(obs=[C.FrameStack(num_frames=k)])
    with make_runner(envs, conn, rollout_length=9, num_splits=num_splits) as runner:
        trajs = [runner.sample() for _ in range(2)]
    traj = jr.concatenate(trajs)
    stacks = traj.extras["policy_obs"]  # [T, B, k, 5]
    for b in range(4):
        for t in range(traj.num_steps):
            start = t - traj.step[t, b]
            want = [traj.obs[max(start, t - k + 1 + j), b] for j in range(k)]
            np.testing.assert_array_equal(stacks[t, b], np.stack(want), f"t={t} b={b}")
    assert (stacks[..., CountingEnv.ENV_ID] == np.arange(4)[None, :, None]).all()
    # The stack of each next_obs: the policy's view of the true next observation.
    nxt = traj.extras["policy_next_obs"]
    np.testing.assert_array_equal(nxt[:, :, -1], traj.next_obs)
    np.testing.assert_array_equal(nxt[:, :, :-1], stacks[:, :, 1:])


# -- determinism and compiles ------------------------------------------------------------------


def full_connectors() -> C.Connectors:
    return C.Connectors(
        obs=[C.NormalizeObservation(), C.FrameStack(num_frames=2)], reward=C.ScaleReward()
    )


def sample_twice(envs: Any, **kwargs: Any) -> tuple[list[jr.Trajectory], Any]:
    with make_runner(envs, full_connectors(), rollout_length=10, seed=7, **kwargs) as runner:
        trajs = [runner.sample() for _ in range(2)]
        return trajs, runner.get_connector_state()


def test_outputs_are_identical_across_backends_and_groupings():
    expected, state = sample_twice(jr.make_vec(short_cartpole, 4, "sync"), num_splits=1)
    process = jr.make_vec(short_cartpole, 4, "process", config=ProcessConfig(num_workers=2))
    for envs, options in (
        (jr.make_vec(short_cartpole, 4, "sync"), {"num_splits": 2}),
        (process, {"num_splits": 2}),
    ):
        trajs, other = sample_twice(envs, **options)
        for actual, want in zip(trajs, expected):
            jr.testing.assert_trees_equal(jax.device_get(actual), jax.device_get(want), "traj")
        jr.testing.assert_trees_equal(other, state, "connector state")


def test_ready_first_buckets_update_statistics_from_real_rows_only():
    expected, state = sample_twice(jr.SyncVectorEnv(counting_env_fns(5, episode_length=2)))
    envs = jr.ProcessVectorEnv(
        counting_env_fns(5, episode_length=2), ProcessConfig(num_workers=3, ready_first=True)
    )
    trajs, other = sample_twice(envs)
    for actual, want in zip(trajs, expected):
        jr.testing.assert_trees_equal(actual, want, "traj")
    jr.testing.assert_trees_equal(other, state, "connector state")


@dataclasses.dataclass(frozen=True)
class CountingTraces(C.ObsConnector):
    """Adds 1 to the observations; counts how often it is traced."""

    traces: list = dataclasses.field(default_factory=list, hash=False, compare=False)

    def init(self, num_envs: int, obs_space: spaces.Space) -> C.ConnectorState:
        return C.ConnectorState(shared=jnp.zeros(()))

    def __call__(self, state, obs, episode_start, active):
        self.traces.append(obs.shape)
        return obs + 1.0, state.replace(shared=state.shared + active.sum())


@dataclasses.dataclass(frozen=True)
class SampleCounter(C.ObsConnector):
    """A user's connector written against the two-argument ``end_sample``: counts the
    observations of each sample."""

    def init(self, num_envs: int, obs_space: spaces.Space) -> C.ConnectorState:
        return C.ConnectorState(shared=jnp.zeros(()))

    def __call__(self, state, obs, episode_start, active):
        return obs, state

    def end_sample(self, state, inputs=None):  # no ``valid``: the older signature
        return state.replace(shared=state.shared + inputs.shape[0] * inputs.shape[1])


def test_a_connector_with_the_two_argument_end_sample_still_works():
    with make_runner(jr.make_vec(short_cartpole, 3), C.Connectors(obs=[SampleCounter()])) as r:
        r.sample()
        r.sample()
        assert float(r.get_connector_state().obs[0].shared) == 2 * 12 * 3


def test_one_compile_per_runner_and_new_statistics_never_retrace():
    counter = CountingTraces()
    conn = C.Connectors(obs=[C.NormalizeObservation(), counter])
    with make_runner(jr.make_vec(short_cartpole, 4), conn, num_splits=2) as runner:
        assert len(counter.traces) == 1  # one compiled step, for both groups
        for _ in range(3):
            runner.sample()
        state = runner.get_connector_state()
        with pytest.raises(InvalidArgumentError, match="has 1 running statistics, got 0"):
            C.set_statistics(state, [])  # was a bare IndexError
        with pytest.raises(InvalidArgumentError, match=r"stats\[0\] must be a Moments"):
            C.set_statistics(state, [C.Moments.of(np.ones((5, 3)))])  # was taken as it was
        runner.set_connector_state(C.set_statistics(state, [C.Moments.of(np.ones((5, 4)))]))
        runner.set_params(runner.get_params())
        runner.sample()
        state = runner.get_connector_state()
    # Only the active rows counted: 4 samples x 12 steps x 4 envs, whatever the groups.
    assert float(state.obs[1].shared) == 4 * 12 * 4
    # One more trace: the per-sample part's default follow (compiled once).
    assert len(counter.traces) == 2, counter.traces


def test_ready_first_padding_rows_are_not_counted():
    counter = CountingTraces()
    envs = jr.ProcessVectorEnv(
        counting_env_fns(5, episode_length=2), ProcessConfig(num_workers=3, ready_first=True)
    )
    with make_runner(envs, C.Connectors(obs=[counter]), rollout_length=10) as runner:
        runner.sample()
        runner.sample()
        assert float(runner.get_connector_state().obs[0].shared) == 2 * 10 * 5
        assert min(runner.sampler.block_sizes) < 5  # workers' blocks, padded to chunks


def test_transfers_stay_explicit_with_connectors():
    conn = full_connectors()
    with make_runner(jr.make_vec(short_cartpole, 4), conn, num_splits=2) as runner:
        runner.sample()
        with jax.transfer_guard("disallow"):
            traj = runner.sample()
            runner.set_connector_state(runner.get_connector_state())
    assert set(traj.extras) >= {"policy_obs", "policy_next_obs", "scaled_reward"}


def test_scan_sampler_runs_connectors_and_keeps_statistics():
    venv = jr.JaxVectorEnv(RandomWalk(), num_envs=3)
    conn = C.Connectors(obs=[C.NormalizeObservation(clip=None)], reward=C.ScaleReward())
    with make_runner(venv, conn, rollout_length=8) as runner:
        trajs = [jax.device_get(runner.sample()) for _ in range(2)]
        state = runner.get_connector_state()
    assert_moments_match(obs_stats(state), np.concatenate([t.obs for t in trajs]))
    first = trajs[0].obs.reshape(-1, 2)
    np.testing.assert_allclose(
        trajs[1].extras["policy_obs"],
        (trajs[1].obs - first.mean(0)) / first.std(0),
        rtol=1e-3,
        atol=1e-4,
    )
    assert trajs[1].extras["scaled_reward"].shape == (8, 3)


# -- actions and the learner ------------------------------------------------------------------


def test_rescale_actions_maps_the_unit_box_to_the_env_bounds():
    box = spaces.Box(np.float32([-2, 0]), np.float32([2, 10]), dtype=np.float32)
    rescale = C.RescaleActions.for_space(box)
    out = rescale(jnp.array([[-1.0, 1.0], [0.0, 0.0], [3.0, -3.0]]))
    np.testing.assert_allclose(out, [[-2, 10], [0, 5], [2, 0]])
    squash = C.RescaleActions.for_space(box, squash=True)
    np.testing.assert_allclose(squash(jnp.array([[0.0, 50.0]])), [[0, 10]], atol=1e-5)
    with pytest.raises(InvalidArgumentError, match="finite bounds"):
        C.RescaleActions.for_space(spaces.Box(-np.inf, np.inf, (1,)))
    # Bounds where low + 2 * 0.5 * (high - low) rounds past high in float32.
    box = spaces.Box(np.float32(-2.8770795), np.float32(0.049582906), (1,), np.float32)
    for squash in (False, True):
        out = C.RescaleActions.for_space(box, squash)(jnp.array([[50.0], [-50.0]]))
        assert all(box.contains(np.asarray(row)) for row in out)


def test_action_connectors_that_do_not_fit_the_env_are_refused_when_the_runner_is_built():
    envs = jr.make_vec("CartPole-v1", 2)  # Discrete actions: no Box to rescale to
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    connectors = C.Connectors(action=[C.RescaleActions((-1.0,), (1.0,))])
    with envs, pytest.raises(SpaceMismatchError) as info:
        jr.EnvRunner(envs, policy, params, 4, 0, connectors=connectors)
    assert "action connectors' outputs" in "".join(info.value.__notes__)


class RecordsActions(gymnasium.Wrapper):
    """Keeps the actions the env received."""

    def __init__(self, env: gymnasium.Env, log: list) -> None:
        super().__init__(env)
        self.log = log

    def step(self, action: Any) -> Any:
        self.log.append(np.array(action))
        return self.env.step(action)


def test_the_env_gets_rescaled_actions_and_the_trajectory_the_policy_s():
    log: list = []
    envs = jr.SyncVectorEnv([lambda: RecordsActions(gymnasium.make("Pendulum-v1"), log)])
    conn = C.Connectors(action=[C.RescaleActions.for_space(envs.single_action_space)])
    with make_runner(envs, conn, rollout_length=6) as runner:
        traj = runner.sample()
    expected = 2.0 * np.clip(traj.action[:, 0], -1, 1)
    np.testing.assert_allclose(np.stack(log), expected, rtol=1e-5, atol=1e-6)


class ActorCritic(nn.Module):
    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        hidden = nn.tanh(nn.Dense(16)(obs))
        return nn.Dense(1)(hidden), nn.Dense(1)(hidden)[..., 0]


def test_learner_recomputes_the_sampled_log_probs_bit_for_bit():
    envs = jr.make_vec("Pendulum-v1", 4)
    conn = C.Connectors(obs=[C.NormalizeObservation()], reward=C.ScaleReward())
    policy = jr.Policy.from_linen(ActorCritic(), envs.single_action_space)
    params = policy.init(jax.random.key(0), conn.observation_space(envs.single_observation_space))
    with jr.EnvRunner(envs, policy, params, 16, 0, connectors=conn) as runner:
        runner.sample()
        traj = runner.sample()  # normalized with the first sample's statistics
    evaluate = jax.jit(policy.evaluate)
    for t in range(traj.num_steps):
        out = evaluate(params, traj.extras["policy_obs"][t], traj.action[t])
        np.testing.assert_array_equal(np.asarray(out["log_prob"]), traj.extras["log_prob"][t])
    # jr.gae on the transformed inputs: values of what the policy saw and would see next.
    value = jax.vmap(policy.value, in_axes=(None, 0))
    adv = jr.gae(
        traj,
        reward=traj.extras["scaled_reward"],
        value=value(params, traj.extras["policy_obs"]),
        next_value=value(params, traj.extras["policy_next_obs"]),
    )
    assert np.isfinite(adv.advantages).all()
    # Inside an episode the next view is the view the policy had one step later.
    np.testing.assert_allclose(
        traj.extras["policy_next_obs"][:-1], traj.extras["policy_obs"][1:], rtol=1e-6
    )


def test_connectors_are_checked():
    with pytest.raises(jr.errors.InvalidArgumentTypeError, match="ObsConnector"):
        C.Connectors(obs=[lambda s, o, e, a: (o, s)])
    with pytest.raises(
        jr.errors.InvalidArgumentTypeError, match=r"wrap one in a list: obs=\[...\]"
    ):
        C.Connectors(obs=C.NormalizeObservation())  # one connector, not a list of them
    with pytest.raises(jr.errors.InvalidArgumentTypeError, match=r"Connectors\(action='x'\)"):
        C.Connectors(action="x")
    with pytest.raises(InvalidArgumentError, match="Box"):
        C.NormalizeObservation().init(2, spaces.Discrete(3))
    with pytest.raises(InvalidArgumentError, match="num_frames"):
        C.FrameStack(num_frames=0)
    with pytest.raises(InvalidArgumentError, match="must be the first"):
        C.Connectors(obs=[C.FrameStack(), C.NormalizeObservation()])
    policy = POLICY(spaces.Discrete(2))
    params = policy.init(jax.random.key(0), spaces.Box(-1, 1, (4,), np.float32))
    with (
        jr.EnvRunner(jr.make_vec(short_cartpole, 2), policy, params, 4, 0) as runner,
        pytest.raises(InvalidArgumentError, match="no connectors"),
    ):
        runner.get_connector_state()


# -- across runners (Ray) ---------------------------------------------------------------------


def test_group_merges_statistics_exactly_broadcasts_them_and_restarts_from_them(local_ray):
    ray = local_ray
    conn = C.Connectors(obs=[C.NormalizeObservation()])
    config = jr.EnvRunnerGroupConfig(
        num_runners=2,
        num_envs_per_runner=3,
        rollout_length=8,
        env_options={"max_episode_steps": 15},
        runner_options={"connectors": conn},
        num_cpus_per_runner=0.5,
    )
    policy = POLICY(spaces.Discrete(2))
    params = policy.init(jax.random.key(0), spaces.Box(-np.inf, np.inf, (4,), np.float32))
    with jr.EnvRunnerGroup("CartPole-v1", POLICY, params, config) as group:
        seen = [group.sample().obs, group.sample().obs]
        merged = group.connector_statistics
        assert_moments_match(merged[0], np.concatenate(seen))
        group.set_params(params)  # broadcasts the merged statistics with the weights
        for actor in group.runner_actors:
            state = ray.get(actor.get_connector_state.remote())
            jr.testing.assert_trees_equal(
                obs_stats(state), jax.device_get(merged[0]), "runner stats"
            )
        victim = group.runner_actors[1]
        kill_actor(victim, "get_connector_state")
        group.sample()  # runner 1 is found dead and replaced
        assert group.runner_actors[1] is not victim
        group.wait_until_healthy(120.0)
        state = ray.get(group.runner_actors[1].get_connector_state.remote())
        latest = jax.device_get(group.connector_statistics[0])
        jr.testing.assert_trees_equal(obs_stats(state), latest, "restarted runner stats")


def test_connector_state_is_part_of_the_checkpoint(tmp_path):
    path = tmp_path / "runner.npz"
    for make in (
        lambda: jr.make_vec(short_cartpole, 3, "sync"),
        lambda: jr.JaxVectorEnv(RandomWalk(), num_envs=3),
    ):
        with make_runner(make(), full_connectors(), rollout_length=10, seed=4) as runner:
            runner.sample()
            runner.save(path)
            expected = jax.device_get(runner.sample())
            state = runner.get_connector_state()
        with make_runner(make(), full_connectors(), rollout_length=10, seed=4) as resumed:
            resumed.restore(path, load_env_pickles=True)
            actual = jax.device_get(resumed.sample())
            jr.testing.assert_trees_equal(resumed.get_connector_state(), state, "state")
        jr.testing.assert_trees_equal(actual, expected, "sample after restore")


def test_a_checkpoint_with_connector_state_names_it_in_a_runner_without_connectors(tmp_path):
    path = tmp_path / "runner.npz"
    normalize = C.Connectors(obs=[C.NormalizeObservation()])  # the policy's space unchanged
    with make_runner(jr.make_vec(short_cartpole, 3, "sync"), normalize, 10, 4) as runner:
        runner.sample()
        runner.save(path)
    with (  # was refused as a damaged file ("a member that no field references")
        make_runner(jr.make_vec(short_cartpole, 3, "sync"), C.Connectors(), 10, 4) as bare,
        pytest.raises(InvalidArgumentError, match=r"holds connector state \('.*connectors/"),
    ):
        bare.restore(path)


def test_a_state_without_the_reward_connectors_state_is_refused_by_name():
    # Typed Optional and once used unchecked: the reward connector got None and failed
    # deep inside with an error naming neither the state nor the fix.
    conn = C.Connectors(reward=C.ScaleReward())
    without = C.Connectors().init(2, spaces.Box(-1.0, 1.0, (3,)))
    with pytest.raises(InvalidArgumentError, match="ScaleReward has no state"):
        conn.restart_episodes(without)
    flags = jnp.zeros((1, 2), bool)
    with pytest.raises(InvalidArgumentError, match="ScaleReward has no state"):
        conn.finish_sample(without, None, None, None, jnp.zeros((1, 2)), flags, flags, ~flags)


def test_the_extras_are_zero_at_a_slot_without_a_transition_as_for_agent_slots():
    """A slot that holds no transition (here a failed, restarted sub-env; EnvPool's reset
    steps in test_envs_envpool_services.py) has nothing to learn or bootstrap from: its
    extras are zero, as at an agent's invalid slot. ``policy_next_obs`` there mixed the
    ended episode's frames with the next one's first observation."""
    fns = jr.testing.faulty_env_fns(short_cartpole, 3, {1: [jr.testing.FaultPlan(at=(5,))]})
    envs = jr.SyncVectorEnv(fns, restart_policy=jr.RestartPolicy(backoff_s=0.0))
    conn = C.Connectors(obs=[C.FrameStack(num_frames=3)], reward=C.ScaleReward())
    with make_runner(envs, conn, rollout_length=12) as runner:
        traj = jax.device_get(runner.sample())
    invalid = ~traj.valid
    assert invalid.any() and traj.valid.any()
    for name in ("policy_next_obs", "scaled_reward"):
        assert not np.any(traj.extras[name][invalid]), name
    assert np.any(traj.extras["policy_next_obs"][traj.valid])


def test_what_the_policy_saw_is_zero_at_a_slot_without_a_transition_too():
    """docs/connectors.md: at a slot without a transition (a failed, restarted sub-env)
    every connector extra is zero, ``policy_obs`` included, as at an agent's invalid slot;
    it held what the policy saw at the failed step."""
    fns = jr.testing.faulty_env_fns(short_cartpole, 3, {1: [jr.testing.FaultPlan(at=(5,))]})
    envs = jr.SyncVectorEnv(fns, restart_policy=jr.RestartPolicy(backoff_s=0.0))
    conn = C.Connectors(obs=[C.NormalizeObservation()], reward=C.ScaleReward())
    with make_runner(envs, conn, rollout_length=12) as runner:
        traj = jax.device_get(runner.sample())
    invalid = ~traj.valid
    assert invalid.any()
    for name in ("policy_obs", "policy_next_obs", "scaled_reward"):
        assert not np.any(traj.extras[name][invalid]), name
    assert np.any(traj.extras["policy_obs"][traj.valid])

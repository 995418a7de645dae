"""JaxVectorEnv + EnvRunner's lax.scan path, against envs stepped by hand.

The key rule checked here (documented in jaxrunner._src.samplers.scan) is re-derived in this
file, not imported: with root(r) = fold_in(key(seed), 2**32 - r), env i's first reset
uses fold_in(root(3), i); at step n it steps with fold_in(fold_in(root(1), n), i) and,
where its episode ended, resets with fold_in(fold_in(root(2), n), i).
"""

from __future__ import annotations

import types

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.errors import InvalidArgumentError, SpaceMismatchError
from jaxrunner.models import mlp_policy
from jaxrunner.testing import (
    AutoResetWrapper,
    BraxPoint,
    DoneOnlyRandomWalk,
    RandomWalk,
    WalkParams,
)

SEED = 3


def root(seed: int, r: int) -> jax.Array:
    return jax.random.fold_in(jax.random.key(seed), 2**32 - r)


def first_reset_key(seed: int, env_id: int) -> jax.Array:
    return jax.random.fold_in(root(seed, 3), env_id)


def step_keys(seed: int, env_id: int, step: int) -> tuple[jax.Array, jax.Array]:
    """(step key, reset key) of env ``env_id`` at its ``step``-th step."""
    return tuple(
        jax.random.fold_in(jax.random.fold_in(root(seed, r), step), env_id) for r in (1, 2)
    )


_POLICIES: dict[str, tuple[jr.Policy, object]] = {}


def make_runner(venv: jr.JaxVectorEnv, rollout_length: int, seed: int = SEED, **kwargs):
    action_space, obs_space = venv.single_action_space, venv.single_observation_space
    key = f"{action_space!r} {obs_space!r}"
    if key not in _POLICIES:  # flax init runs op by op: slow, so once per pair of spaces
        policy = mlp_policy(action_space, hidden=(16,))
        _POLICIES[key] = policy, policy.init(jax.random.key(1), obs_space)
    policy, params = _POLICIES[key]
    return jr.EnvRunner(venv, policy, params, rollout_length, seed, **kwargs)


def samples(runner: jr.EnvRunner, count: int) -> jr.Trajectory:
    return jr.concatenate([runner.sample().to_numpy() for _ in range(count)])


def reference_functional(env, params, actions: np.ndarray, seed: int, clip=None) -> dict:
    """Steps each env of a functional (non-auto-resetting) env by hand with the key
    rule, resetting ended episodes with the step's reset key."""
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    num_steps, num_envs = actions.shape[:2]
    out = {k: [[None] * num_envs for _ in range(num_steps)] for k in ("obs", "next_obs", "rew")}
    out["term"] = np.zeros((num_steps, num_envs), bool)
    out["trunc"] = np.zeros((num_steps, num_envs), bool)
    for i in range(num_envs):
        obs, state = reset(first_reset_key(seed, i), params)
        for t in range(num_steps):
            key_step, key_reset = step_keys(seed, i, t)
            action = actions[t, i] if clip is None else clip(actions[t, i])
            result = step(key_step, state, action, params)
            next_obs, state, reward = result[:3]
            if len(result) == 6:
                terminated, truncated = bool(result[3]), bool(result[4])
            else:  # done-only: the time limit is the truncation
                truncated = bool(state.time >= params.max_steps_in_episode)
                terminated = bool(result[3]) and not truncated
            out["obs"][t][i], out["next_obs"][t][i], out["rew"][t][i] = obs, next_obs, reward
            out["term"][t, i], out["trunc"][t, i] = terminated, truncated
            obs = next_obs
            if terminated or truncated:
                obs, state = reset(key_reset, params)
    return {
        "obs": np.asarray(out["obs"]),
        "next_obs": np.asarray(out["next_obs"]),
        "reward": np.asarray(out["rew"], np.float32),
        "terminated": out["term"],
        "truncated": out["trunc"],
    }


def assert_matches(traj: jr.Trajectory, ref: dict) -> None:
    np.testing.assert_array_equal(traj.obs, ref["obs"])
    np.testing.assert_array_equal(traj.next_obs, ref["next_obs"])
    np.testing.assert_array_equal(traj.reward, ref["reward"])
    np.testing.assert_array_equal(traj.terminated, ref["terminated"])
    np.testing.assert_array_equal(traj.truncated, ref["truncated"])


def reference_ids_and_steps(done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Episode ids (0..B-1 first, then the next free id per ended episode, in env
    order within a step) and step indices, by hand."""
    num_steps, num_envs = done.shape
    ids, steps = np.zeros(done.shape, np.int64), np.zeros(done.shape, np.int64)
    current, count, next_id = list(range(num_envs)), [0] * num_envs, num_envs
    for t in range(num_steps):
        for b in range(num_envs):
            ids[t, b], steps[t, b] = current[b], count[b]
            count[b] += 1
            if done[t, b]:
                current[b], count[b], next_id = next_id, 0, next_id + 1
    return ids, steps


# -- functional envs (no optional dependency) --------------------------------------------------


@pytest.fixture(scope="module")
def walk_run():
    """A RandomWalk runner sampled twice (T=25 each), 3 envs, episodes carried across."""
    venv = jr.JaxVectorEnv(RandomWalk(), WalkParams(max_steps_in_episode=9), 3)
    runner = make_runner(venv, 25, metrics=jr.MetricsConfig(episode_window=10_000))
    traj = samples(runner, 2)
    metrics = runner.get_metrics()
    yield runner, traj, venv, metrics
    runner.stop()


def test_functional_env_matches_hand_stepping(walk_run):
    _, traj, venv, _ = walk_run
    ref = reference_functional(venv.env, venv.params, traj.action, SEED)
    assert_matches(traj, ref)
    assert traj.terminated.any() and traj.truncated.any()


def test_a_build_failure_names_the_policy_params_only_where_they_are_at_fault():
    """Policy params of another structure are refused as such; env params of another
    type fail in the env's own code, with a note that the policy was not at fault."""

    class OtherParams(flax.struct.PyTreeNode):  # no threshold: not RandomWalk's
        max_steps_in_episode: int = 10

    envs = jr.JaxVectorEnv(RandomWalk(), WalkParams(), 2)
    policy = mlp_policy(envs.single_action_space, hidden=(4,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with pytest.raises(InvalidArgumentError, match="could not be applied to these params"):
        jr.EnvRunner(envs, policy, {"other": params}, 4, SEED)
    envs = jr.JaxVectorEnv(RandomWalk(), OtherParams(), 2)
    with pytest.raises(AttributeError, match="threshold") as caught:
        jr.EnvRunner(envs, policy, params, 4, SEED)
    assert any("the policy applies to these params" in n for n in caught.value.__notes__)


def test_schema_and_device_arrays(walk_run):
    runner = walk_run[0]
    traj = runner.sample()
    for leaf in jax.tree.leaves(traj):
        assert isinstance(leaf, jax.Array), "the scan path returns device arrays"
    num_steps, num_envs = 25, 3
    assert set(traj.__dataclass_fields__) >= {
        "obs", "action", "reward", "terminated", "truncated", "next_obs_store", "extras",
        "env_id", "episode_id", "step",
    }  # fmt: skip
    assert not traj.is_compact  # the scan keeps next_obs in full
    assert traj.obs.shape == traj.next_obs.shape == (num_steps, num_envs, 2)
    assert traj.obs.dtype == np.float32
    for name in ("action", "reward", "terminated", "truncated", "env_id", "episode_id", "step"):
        assert getattr(traj, name).shape == (num_steps, num_envs), name
    assert traj.terminated.dtype == traj.truncated.dtype == np.bool_
    assert traj.reward.dtype == jax.dtypes.canonicalize_dtype(np.float64)
    assert traj.extras["log_prob"].shape == (num_steps, num_envs)
    np.testing.assert_array_equal(traj.env_id, np.broadcast_to(np.arange(num_envs), (25, 3)))
    host = traj.to_numpy()
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(host))


def test_episode_ids_and_steps_against_reference(walk_run):
    _, traj, _, _ = walk_run
    ids, steps = reference_ids_and_steps(traj.done)
    np.testing.assert_array_equal(traj.episode_id, ids)
    np.testing.assert_array_equal(traj.step, steps)


def episodes_by_hand(traj: jr.Trajectory) -> tuple[list[float], list[int]]:
    """Returns and lengths of the episodes that ended, in (step, env) order."""
    ends, total, length = [], np.zeros(traj.num_envs), np.zeros(traj.num_envs, np.int64)
    for t in range(traj.num_steps):
        for b in range(traj.num_envs):
            total[b] += float(traj.reward[t, b])
            length[b] += 1
            if traj.done[t, b]:
                ends.append((float(total[b]), int(length[b])))
                total[b], length[b] = 0.0, 0
    return [r for r, _ in ends], [n for _, n in ends]


def test_metrics_are_sums_over_episodes(walk_run):
    _, traj, _, metrics = walk_run
    returns, lengths = episodes_by_hand(traj)
    assert metrics["num_env_steps"] == traj.reward.size
    assert metrics["num_episodes"] == len(returns) == int(traj.done.sum())
    assert metrics["episode_return_mean"] == pytest.approx(np.mean(returns), rel=1e-5)
    assert metrics["episode_length_mean"] == pytest.approx(np.mean(lengths))
    assert metrics["episode_return_min"] == pytest.approx(min(returns), rel=1e-5)
    assert set(metrics["perf"]) >= {
        "env_wait_ms", "inference_ms", "obs_processing_ms", "action_processing_ms"
    }  # fmt: skip
    assert metrics["env_steps_per_s"] > 0


@pytest.mark.parametrize("window", [1, 4, 7])
def test_metrics_window_holds_the_latest_episodes(window):
    # The sampler reads only the last steps that fill the window; a window across
    # steps and samples must still hold exactly the latest episodes.
    venv = jr.JaxVectorEnv(RandomWalk(), WalkParams(max_steps_in_episode=5), 3)
    metrics_config = jr.MetricsConfig(episode_window=window)
    with make_runner(venv, 6, metrics=metrics_config) as runner:
        traj = samples(runner, 3)
        metrics = runner.get_metrics()
    returns, lengths = episodes_by_hand(traj)
    assert metrics["num_episodes"] == len(returns) > window
    latest_returns, latest_lengths = returns[-window:], lengths[-window:]
    assert metrics["episode_return_mean"] == pytest.approx(np.mean(latest_returns), rel=1e-5)
    assert metrics["episode_return_min"] == pytest.approx(min(latest_returns), rel=1e-5)
    assert metrics["episode_return_max"] == pytest.approx(max(latest_returns), rel=1e-5)
    assert metrics["episode_length_mean"] == pytest.approx(np.mean(latest_lengths))


def test_actions_follow_the_host_loop_key_rule(walk_run):
    runner, traj, _, _ = walk_run
    policy, params = runner.policy, runner.get_params()

    def act(obs: jax.Array, env_id: jax.Array, step: jax.Array) -> jax.Array:
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(SEED), env_id), step)
        return policy.apply_fn(params, obs[None], None, key[None])[0][0]

    t, b = np.meshgrid(np.arange(traj.num_steps), np.arange(traj.num_envs), indexing="ij")
    expected = jax.jit(jax.vmap(act))(
        traj.obs.reshape(-1, 2), b.reshape(-1).astype(np.uint32), t.reshape(-1).astype(np.uint32)
    )
    np.testing.assert_array_equal(traj.action, np.asarray(expected).reshape(traj.action.shape))


def test_resets_are_fresh_random_states(walk_run):
    _, traj, _, _ = walk_run
    first_obs = traj.obs[traj.step == 0]
    assert len(first_obs) >= 6
    # Each episode starts from its own random position, never one cached start.
    assert len(np.unique(first_obs[:, 0])) == len(first_obs)
    np.testing.assert_array_equal(first_obs[:, 1], 0.0)


def sample_matching_hand_stepping(venv: jr.JaxVectorEnv, rollout_length: int) -> jr.Trajectory:
    """One sample of ``venv``, checked against the env stepped by hand."""
    with make_runner(venv, rollout_length) as runner:
        traj = runner.sample().to_numpy()
    assert_matches(traj, reference_functional(venv.env, venv.params, traj.action, SEED))
    return traj


def test_done_only_form_reads_the_time_limit():
    venv = jr.JaxVectorEnv(DoneOnlyRandomWalk(), WalkParams(max_steps_in_episode=7), 2)
    traj = sample_matching_hand_stepping(venv, 30)
    assert traj.truncated.any() and traj.terminated.any()
    assert not (traj.terminated & traj.truncated).any()


class ReportsTruncation(DoneOnlyRandomWalk):
    """Done-only steps that always end, reported as truncations by info only."""

    def step(self, key, state, action, params):
        obs, state, reward, *_ = RandomWalk.step(self, key, state, action, params)
        return obs, state, reward, jnp.asarray(True), {"truncation": jnp.asarray(True)}


def test_done_only_form_prefers_info_truncation():
    params = WalkParams(max_steps_in_episode=100, threshold=1e9)  # no limit, no fall
    functions = jr.JaxVectorEnv(ReportsTruncation(), params, 1).functions
    _, state = functions.reset(jax.random.key(0), params)
    out = jax.jit(functions.step)(jax.random.key(1), state, jnp.int32(1), params)
    assert (bool(out.terminated), bool(out.truncated)) == (False, True)
    # Without the report, the time limit decides: a done before it is a termination.
    functions = jr.JaxVectorEnv(DoneOnlyRandomWalk(), params, 1).functions
    done_params = WalkParams(max_steps_in_episode=100, threshold=0.0)  # falls at once
    out = jax.jit(functions.step)(jax.random.key(1), state, jnp.int32(1), done_params)
    assert (bool(out.terminated), bool(out.truncated)) == (True, False)


def test_resets_of_none_some_or_all_envs_match_hand_stepping():
    # The scan resets no env, a gathered few (up to B // 8) or all of them, by how many
    # ended: every case must be the reference's reset, with the same keys.
    venv = jr.JaxVectorEnv(RandomWalk(), WalkParams(max_steps_in_episode=6), 16)
    traj = sample_matching_hand_stepping(venv, 40)
    ended = traj.done.sum(axis=1)
    few = 16 // 8
    assert (ended == 0).any() and ((ended > 0) & (ended <= few)).any() and (ended > few).any()


def test_trajectories_do_not_depend_on_the_batch_size(walk_run):
    _, traj, venv, _ = walk_run
    narrow = jr.JaxVectorEnv(RandomWalk(), venv.params, 2)
    with make_runner(narrow, 50) as runner:
        small = runner.sample().to_numpy()
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "step"):
        np.testing.assert_array_equal(getattr(small, name), getattr(traj, name)[:, :2], name)


def test_one_compile_whatever_the_params():
    venv = jr.JaxVectorEnv(RandomWalk(), None, 2)
    base = mlp_policy(venv.single_action_space, hidden=(8,))

    @chex.assert_max_traces(n=1)
    def apply_fn(params, obs, carry, keys):
        return base.apply_fn(params, obs, carry, keys)

    policy = jr.Policy(apply_fn=apply_fn, init_fn=base.init_fn)
    params = policy.init(jax.random.key(0), venv.single_observation_space)
    with jr.EnvRunner(venv, policy, params, 5, 0) as runner:
        first = runner.sample().to_numpy()
        runner.sample()
        runner.set_params(jax.tree.map(lambda p: p + 0.5, params))
        runner.sample()
        runner.sample_episodes(2)
    assert first.num_steps == 5


def test_sample_episodes_are_complete(walk_run):
    runner = walk_run[0]  # carries on from the fixture's samples
    episodes = runner.sample_episodes(5)
    assert len(episodes) == 5
    ids = [e.episode_id for e in episodes]
    assert ids == sorted(ids) and len(set(ids)) == 5
    for episode in episodes:
        assert episode.is_complete
        assert episode.obs.shape == (episode.length + 1, 2)
        np.testing.assert_array_equal(episode.obs[:, 1], np.arange(episode.length + 1))
        # The last observation is the true final one: past the threshold or at the limit.
        final_pos, final_time = episode.obs[-1]
        assert episode.truncated == (final_time >= 9)
        assert episode.terminated == (abs(final_pos) > 1.5)


# -- brax-style envs -------------------------------------------------------------------------


def test_brax_adapter_matches_hand_stepping():
    env = BraxPoint(episode_length=6)
    venv = jr.JaxVectorEnv.from_brax(env, 3)
    assert venv.single_action_space.shape == (2,)
    with make_runner(venv, 20) as runner:
        traj = runner.sample().to_numpy()
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    for i in range(3):
        state = reset(first_reset_key(SEED, i))
        for t in range(20):
            _, key_reset = step_keys(SEED, i, t)
            np.testing.assert_array_equal(traj.obs[t, i], state.obs)
            # The env gets the action clipped to the Box; the trajectory keeps it as sampled.
            state = step(state, np.clip(traj.action[t, i], -1.0, 1.0))
            truncated = bool(state.info["truncation"])
            terminated = bool(state.done) and not truncated
            np.testing.assert_array_equal(traj.next_obs[t, i], state.obs)
            assert traj.reward[t, i] == state.reward
            assert (traj.terminated[t, i], traj.truncated[t, i]) == (terminated, truncated)
            if state.done:
                state = reset(key_reset)
    assert traj.truncated.any() and traj.terminated.any()
    assert (np.abs(traj.action) > 1).any(), "some sampled actions needed clipping"


def test_brax_auto_reset_wrapper_is_refused():
    with pytest.raises(InvalidArgumentError, match="AutoResetWrapper"):
        jr.JaxVectorEnv.from_brax(AutoResetWrapper(BraxPoint()), 2)


@pytest.mark.parametrize("num_envs", [0, -1, 2.5])
def test_from_brax_names_itself_for_a_bad_num_envs(num_envs):
    with pytest.raises(InvalidArgumentError, match=r"JaxVectorEnv\.from_brax\(num_envs="):
        jr.JaxVectorEnv.from_brax(BraxPoint(), num_envs)


# -- errors ------------------------------------------------------------------------------------


def test_bad_input_errors():
    from gymnasium import spaces

    with pytest.raises(SpaceMismatchError, match="shape"):
        jr.JaxVectorEnv(RandomWalk(), None, 2, observation_space=spaces.Box(0, 1, (3,)))
    with pytest.raises(SpaceMismatchError, match="dtype"):
        jr.JaxVectorEnv(RandomWalk(), None, 2, observation_space=spaces.Box(0, 1, (2,), np.int32))
    with pytest.raises(InvalidArgumentError, match="num_envs"):
        jr.JaxVectorEnv(RandomWalk(), None, 0)
    with pytest.raises(TypeError, match="reset"):
        jr.JaxVectorEnv(object(), None, 2)
    with pytest.raises(TypeError, match=r"got the class RandomWalk; pass an instance"):
        jr.JaxVectorEnv(RandomWalk, None, 2)
    with pytest.raises(InvalidArgumentError, match=r"pass num_envs by keyword \(num_envs=8\)"):
        jr.JaxVectorEnv(RandomWalk(), 8)
    with pytest.raises(InvalidArgumentError, match=r"JaxVectorEnv\(env_params=3\): expected"):
        jr.JaxVectorEnv(RandomWalk(), num_envs=2, env_params=3)  # by keyword: an int still

    class Sized(RandomWalk):  # its space reads its params
        def observation_space(self, params):
            return spaces.Box(-np.inf, np.inf, (params.size,), np.float32)

    with pytest.raises(InvalidArgumentError, match=r"Sized.observation_space\(env_params\)"):
        jr.JaxVectorEnv(Sized(), WalkParams(), 2)

    class Unconvertible(RandomWalk):  # neither a Discrete nor a Box
        def observation_space(self, params):
            return object()

    with pytest.raises(TypeError, match=r"^JaxVectorEnv: cannot convert observation_space \("):
        jr.JaxVectorEnv(Unconvertible(), None, 2)
    # Called by hand, the refusal names the function, not a class that was not used.
    with pytest.raises(TypeError, match=r"^to_gymnasium_space: cannot convert space \(3\)"):
        jr.multi_agent.to_gymnasium_space(3)
    # An integer Box whose bounds its dtype cannot hold (JaxMARL's storm_np: uint8 up to
    # 1e9) is refused by name: a Python int bound raised numpy's OverflowError, a numpy
    # float one wrapped silently into another space.
    for high in (10**9, np.float32(1e9)):
        box = types.SimpleNamespace(low=0, high=high, shape=(2,), dtype=np.uint8)
        with pytest.raises(InvalidArgumentError, match=r"dtype uint8, which holds \[0, 255\]"):
            jr.multi_agent.to_gymnasium_space(box)
    fits = types.SimpleNamespace(low=0, high=255, shape=(2,), dtype=np.uint8)
    assert jr.multi_agent.to_gymnasium_space(fits) == spaces.Box(0, 255, (2,), np.uint8)
    venv = jr.JaxVectorEnv(RandomWalk(), None, 2)
    with pytest.raises(InvalidArgumentError, match="no per-env objects"):
        venv.get_sub_environments()
    with pytest.raises(InvalidArgumentError, match="callbacks"):
        make_runner(venv, 4, callbacks=jr.Callbacks())
    with pytest.raises(InvalidArgumentError, match="num_splits"):
        make_runner(venv, 4, num_splits=2)
    box_policy = mlp_policy(spaces.Box(-1, 1, (3,)), hidden=(4,))
    params = box_policy.init(jax.random.key(0), venv.single_observation_space)
    with pytest.raises(SpaceMismatchError, match="action"):
        jr.EnvRunner(venv, box_policy, params, 4, 0)


def test_an_action_outside_the_space_fails_the_sample_at_its_step():
    """The host loop refuses such an action before the env steps; the compiled scan cannot
    stop, so the sample is refused after it, with the steps before the action."""

    def two_at_step_3(params, obs, carry, keys):  # obs[:, 1] is the episode's step
        return jnp.where(obs[:, 1] == 3, 2, 0), {}, carry

    venv = jr.JaxVectorEnv(RandomWalk(), WalkParams(threshold=1e9, max_steps_in_episode=99), 2)
    with jr.EnvRunner(venv, jr.Policy(two_at_step_3), {}, 8, seed=0) as runner:
        with pytest.raises(
            jr.errors.InvalidActionError,
            match=r"sub-env 0's action 2 at step 3 of this sample is outside Discrete\(2\)",
        ) as caught:
            runner.sample()
        partial = caught.value.partial_trajectory.to_numpy()
        assert partial.num_steps == 3 and not partial.action.any()
        np.testing.assert_array_equal(partial.step, [[0, 0], [1, 1], [2, 2]])
        with pytest.raises(jr.errors.RunnerFailedError):
            runner.sample()
    # At the first step: no step before it.
    with (
        jr.EnvRunner(
            jr.JaxVectorEnv(RandomWalk(), num_envs=2),
            jr.Policy(lambda params, obs, carry, keys: (jnp.full(len(obs), -1), {}, carry)),
            {},
            4,
            seed=0,
        ) as runner,
        pytest.raises(jr.errors.InvalidActionError) as caught,
    ):
        runner.sample()
    assert caught.value.partial_trajectory is None


# -- gymnax -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gymnax_run():
    gymnax = pytest.importorskip("gymnax")
    env, params = gymnax.make("CartPole-v1")
    params = params.replace(max_steps_in_episode=30)  # truncations within the test
    venv = jr.JaxVectorEnv(env, params, 3)
    runner = make_runner(venv, 40, metrics=jr.MetricsConfig(episode_window=10_000))
    traj = samples(runner, 2)
    metrics = runner.get_metrics()
    yield runner, traj, env, params, metrics
    runner.stop()


def test_gymnax_cartpole_matches_gymnax_stepped_by_hand(gymnax_run):
    """gymnax's own public reset and (auto-resetting) step, with the same keys, give
    the same transitions: its info["final_observation"] is our next_obs; where an
    episode ended we reset with gymnax's reset and the reset key (CartPole's step uses
    no randomness, so the step key only picks gymnax's own reset, which we discard)."""
    _, traj, env, params, _ = gymnax_run
    for i in range(traj.num_envs):
        obs, state = env.reset(first_reset_key(SEED, i), params)
        for t in range(traj.num_steps):
            np.testing.assert_array_equal(traj.obs[t, i], obs, f"obs[{t}, {i}]")
            key_step, key_reset = step_keys(SEED, i, t)
            obs, state, reward, terminated, truncated, info = env.step(
                key_step, state, traj.action[t, i], params
            )
            np.testing.assert_array_equal(traj.next_obs[t, i], info["final_observation"])
            assert traj.reward[t, i] == reward
            assert traj.terminated[t, i] == terminated and traj.truncated[t, i] == truncated
            if terminated or truncated:
                obs, state = env.reset(key_reset, params)
    assert traj.terminated.any() and traj.truncated.any()
    # Where an episode ended, next_obs is the final observation, not the reset one.
    ended = traj.done[:-1]
    assert not np.array_equal(traj.next_obs[:-1][ended], traj.obs[1:][ended])


def test_gymnax_final_obs_and_fresh_resets(gymnax_run):
    traj = gymnax_run[1]
    x, theta = traj.next_obs[..., 0], traj.next_obs[..., 2]
    fell = (np.abs(x) > 2.4) | (np.abs(theta) > 12 * 2 * np.pi / 360)
    np.testing.assert_array_equal(traj.terminated, fell)
    # gymnax >= 1.0 reports the time limit whether or not the pole fell on that step.
    np.testing.assert_array_equal(traj.truncated, traj.step + 1 >= 30)
    starts = traj.obs[traj.step == 0]
    assert len(starts) >= 6 and len(np.unique(starts, axis=0)) == len(starts)
    assert np.all(np.abs(starts) <= 0.05)
    ids, steps = reference_ids_and_steps(traj.done)
    np.testing.assert_array_equal(traj.episode_id, ids)
    np.testing.assert_array_equal(traj.step, steps)


def test_gymnax_wrappers_are_refused():
    gymnax = pytest.importorskip("gymnax")
    from gymnax.wrappers.purerl import LogWrapper

    env, params = gymnax.make("CartPole-v1")
    with pytest.raises(InvalidArgumentError, match="wrapper"):
        jr.JaxVectorEnv(LogWrapper(env), params, 2)


def test_gymnax_metrics_match_episodes(gymnax_run):
    _, traj, _, _, metrics = gymnax_run
    lengths = traj.step[traj.done] + 1  # CartPole: reward 1 per step, return == length
    assert metrics["num_episodes"] == len(lengths)
    assert metrics["episode_length_mean"] == pytest.approx(lengths.mean())
    assert metrics["episode_return_mean"] == pytest.approx(lengths.mean())
    np.testing.assert_array_equal(traj.reward, 1.0)


def test_recurrent_carry_restarts_with_each_episode():
    """A policy whose carry counts its calls: reset to 0 at each episode start, so the
    count it reports equals the step index within the episode."""

    def apply_fn(params, obs, carry, keys):
        action = jnp.zeros(obs.shape[0], jnp.int32)
        return action, {"count": carry}, carry + 1

    policy = jr.Policy(apply_fn=apply_fn, initial_carry=jnp.zeros((), jnp.int32))
    venv = jr.JaxVectorEnv(RandomWalk(), WalkParams(max_steps_in_episode=5), 2)
    with jr.EnvRunner(venv, policy, {}, 12, 0) as runner:
        traj = jr.concatenate([runner.sample().to_numpy() for _ in range(2)])
    assert traj.done.sum() >= 4
    np.testing.assert_array_equal(traj.extras["count"], traj.step)


def test_extras_without_a_row_per_env_are_refused_as_on_the_host():
    """As the host samplers' check: every output leaf has one row per observation."""

    def apply_fn(params, obs, carry, keys):
        extras = {"x": jnp.zeros(keys.shape[0] + 1)}
        return jnp.zeros(keys.shape[0], jnp.int32), extras, carry

    venv = jr.JaxVectorEnv(RandomWalk(), num_envs=2)
    match = r"every output leaf must have one row per observation \(\[2, \.\.\.\] for 2 rows\)"
    with venv, pytest.raises(InvalidArgumentError, match=match + r", got shape \(3,\)"):
        jr.EnvRunner(venv, jr.Policy(apply_fn), {}, 3, 0).sample()

"""Connectors as brax, CleanRL and RLlib users expect them (issue 29): non-finite env
outputs, checked state and arguments, statistics that never blow up, run-time
freezing, priming, denormalization, state by name, restores that restart episodes."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces

import jaxrunner as jr
from jaxrunner import connectors as C
from jaxrunner._src import space_arrays
from jaxrunner._src.backends.process import ProcessConfig
from jaxrunner._src.space_arrays.checks import nonfinite_observations
from jaxrunner.errors import (
    EnvError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidStepError,
    SpaceMismatchError,
)
from tests.test_connectors import make_runner, short_cartpole


class NaNObservation(gymnasium.Wrapper):
    """CartPole whose ``at``-th step (counted per instance) puts NaN in feature 1."""

    def __init__(self, at: int, call: str = "step") -> None:
        super().__init__(short_cartpole())
        self.at, self.call, self.calls = at, call, 0

    def _spoil(self, obs: np.ndarray, call: str) -> np.ndarray:
        self.calls += call == self.call
        if call == self.call and self.calls == self.at:
            obs = obs.copy()
            obs[1] = np.nan
        return obs

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        return self._spoil(obs, "reset"), info

    def step(self, action: Any) -> Any:
        obs, *rest = self.env.step(action)
        return (self._spoil(obs, "step"), *rest)


def nan_fns(num_envs: int, bad: int, at: int, call: str = "step") -> list:
    return [
        functools.partial(NaNObservation, at, call) if i == bad else short_cartpole
        for i in range(num_envs)
    ]


# -- defect 1: non-finite env outputs --------------------------------------------------------


def test_statistics_never_take_in_a_row_with_a_nan_or_an_infinity():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    spoiled = x.copy()
    spoiled[1, 0], spoiled[2, 2] = np.nan, np.inf
    got = C.Moments.of(spoiled)
    want = C.Moments.of(x[[0, 3]])
    jr.testing.assert_trees_equal(jax.device_get(got), jax.device_get(want), "moments")
    running = C.RunningMoments.zeros((3,)).add(got)
    assert np.isfinite(running.stats.mean).all() and float(running.stats.count) == 2


def test_non_finite_rows_of_a_structured_observation_are_named_by_path():
    space = spaces.Dict(
        {
            "a": spaces.Discrete(3),
            "b": spaces.Tuple((spaces.Box(0, 1, (2,), np.float64), spaces.MultiBinary(2))),
        }
    )
    buffer = space_arrays.allocate(space, (4,))
    assert nonfinite_observations(space, buffer, 0, 4, "step") == {}
    buffer["b"][0][2, 1], buffer["b"][0][3, 0] = np.inf, np.nan
    bad = nonfinite_observations(space, buffer, 0, 4, "step", skip=(3,))
    assert list(bad) == [2]
    assert "sub-env 2 returned a non-finite observation from step() at obs['b'][0]" in str(bad[2])


@pytest.mark.parametrize("call", ["step", "reset"])
def test_a_nan_observation_raises_an_invalid_step_naming_the_sub_env_and_field(call):
    fns = nan_fns(3, bad=1, at=2 if call == "step" else 1, call=call)
    conn = C.Connectors(obs=[C.NormalizeObservation()])
    match = rf"sub-env 1 .*non-finite observation from {call}\(\) at obs"
    with (
        pytest.raises(InvalidStepError, match=match),
        make_runner(jr.SyncVectorEnv(fns), conn) as runner,
    ):
        runner.sample()


@pytest.mark.parametrize("call", ["step", "reset"])
def test_a_wrapped_gymnasium_vector_env_refuses_a_nan_observation_too(call):
    fns = nan_fns(3, bad=2, at=2 if call == "step" else 1, call=call)
    match = rf"sub-env 2 .*non-finite observation from {call}\(\) at obs"
    with pytest.raises(InvalidStepError, match=match):
        envs = jr.from_gymnasium(gymnasium.vector.SyncVectorEnv(fns))
        with make_runner(envs, C.Connectors(obs=[C.NormalizeObservation()])) as runner:
            runner.sample()


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_a_nan_observation_is_a_fault_restarted_under_a_restart_policy(backend):
    fns = nan_fns(3, bad=1, at=5)
    policy = jr.RestartPolicy()
    if backend == "sync":
        envs = jr.SyncVectorEnv(fns, restart_policy=policy)
    else:
        envs = jr.ProcessVectorEnv(fns, ProcessConfig(num_workers=1), restart_policy=policy)
    conn = C.Connectors(obs=[C.NormalizeObservation()])
    with make_runner(envs, conn) as runner:
        traj = runner.sample()
        stats = runner.get_connector_state().obs[0].shared.stats
        metrics = runner.get_metrics()
    assert np.isfinite(traj.obs).all() and np.isfinite(traj.next_obs).all()
    assert np.isfinite(traj.extras["policy_obs"]).all()
    assert not traj.valid[:, 1].all()  # the spoiled step holds no transition
    assert np.isfinite(stats.mean).all() and np.isfinite(stats.m2).all()
    np.testing.assert_allclose(stats.mean, traj.obs.reshape(-1, 4).mean(0), rtol=1e-5, atol=1e-8)
    assert metrics["num_faulty_episodes"] >= 1


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_a_restarted_sub_env_whose_reset_gives_a_nan_observation_is_refused(backend):
    made = itertools.count()

    def spoiled() -> gymnasium.Env:  # the first breaks at a step, every new one at reset
        return NaNObservation(3, "step") if next(made) == 0 else NaNObservation(1, "reset")

    fns = [short_cartpole, spoiled]
    policy = jr.RestartPolicy(max_attempts=2, backoff_s=0.0)
    if backend == "sync":
        envs = jr.SyncVectorEnv(fns, restart_policy=policy)
    else:
        envs = jr.ProcessVectorEnv(fns, ProcessConfig(num_workers=1), restart_policy=policy)
    conn = C.Connectors(obs=[C.NormalizeObservation()])
    match = r"sub-env 1 failed .*could not be recreated: 2 attempts .*observation from reset\(\)"
    with pytest.raises(EnvError, match=match), make_runner(envs, conn) as runner:
        runner.sample()


# -- defect 2: set_connector_state checks dtypes and names the field --------------------------


@pytest.mark.parametrize(
    ("mean", "error", "match"),
    [
        (np.array(["a", "b", "c", "d"]), SpaceMismatchError, "dtype <U1"),
        (np.zeros(4, np.complex64), SpaceMismatchError, "dtype complex64"),
        (np.array([None] * 4, object), SpaceMismatchError, "dtype object"),
        (np.zeros(4, np.float64), SpaceMismatchError, "dtype float64"),
        (np.zeros(5, np.float32), SpaceMismatchError, r"shape \(5,\)"),
        (np.full(4, np.nan, np.float32), SpaceMismatchError, "NaN or infinity"),
        ([0.0] * 4, SpaceMismatchError, "a list"),
    ],
)
def test_set_connector_state_checks_dtypes_and_names_the_connector_and_field(mean, error, match):
    conn = C.Connectors(obs=[C.NormalizeObservation()])
    with make_runner(jr.make_vec(short_cartpole, 2), conn) as runner:
        state = runner.get_connector_state()
        before = jax.device_get(state)
        shared = state.obs[0].shared
        spoiled = shared.replace(stats=shared.stats.replace(mean=mean))
        bad = state.replace(obs=(state.obs[0].replace(shared=spoiled),))
        with pytest.raises(error, match=match) as info:
            runner.set_connector_state(bad)
        assert "normalize_observation.shared.stats.mean" in str(info.value)
        jr.testing.assert_trees_equal(runner.get_connector_state(), before, "untouched")


# -- defect 3: constructor arguments -----------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: C.NormalizeObservation(clip=-1), InvalidArgumentError, r"clip=-1"),
        (lambda: C.NormalizeObservation(epsilon=-1), InvalidArgumentError, r"epsilon=-1"),
        (lambda: C.NormalizeObservation(min_std=0.0), InvalidArgumentError, r"min_std=0.0"),
        (lambda: C.NormalizeObservation(min_std=2, max_std=1), InvalidArgumentError, "<="),
        (lambda: C.NormalizeObservation(frozen="no"), InvalidArgumentTypeError, "frozen"),
        (lambda: C.NormalizeObservation(count_dtype="int8"), InvalidArgumentError, "int8"),
        (lambda: C.ScaleReward(gamma=1.5), InvalidArgumentError, r"gamma=1.5"),
        (lambda: C.ScaleReward(gamma="0.9"), InvalidArgumentError, r"gamma='0.9'.*got str"),
        (lambda: C.ScaleReward(clip=-2), InvalidArgumentError, r"clip=-2"),
        (lambda: C.ScaleReward(epsilon=float("nan")), InvalidArgumentError, "epsilon"),
        (lambda: C.RescaleActions((0.0,), (1.0, 2.0)), InvalidArgumentError, "same length"),
        (lambda: C.RescaleActions((1.0,), (0.0,)), InvalidArgumentError, "low <= high"),
    ],
)
def test_constructor_arguments_are_checked(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_a_64_bit_count_needs_x64():
    if jax.config.jax_enable_x64:
        pytest.skip("x64 is on")
    with pytest.raises(InvalidArgumentError, match="jax_enable_x64"):
        C.NormalizeObservation(count_dtype="int64")


# -- defect 4: a restore that restarts episodes restarts the running returns --------------------


def test_a_restore_that_restarts_episodes_restarts_scale_reward_returns(tmp_path):
    path = tmp_path / "runner.npz"
    conn = C.Connectors(reward=C.ScaleReward())
    with make_runner(jr.make_vec(short_cartpole, 3), conn, rollout_length=7) as runner:
        runner.sample()
        saved = runner.get_connector_state()
        runner.save(path)
    assert (saved.reward.per_env > 0).all()  # mid-episode returns
    with make_runner(jr.make_vec(short_cartpole, 3), conn, rollout_length=7) as resumed:
        with pytest.warns(UserWarning, match="started a new episode"):
            report = resumed.restore(path)  # the env pickles are not loaded
        state = resumed.get_connector_state()
    assert not report.envs_restored
    np.testing.assert_array_equal(state.reward.per_env, 0.0)
    jr.testing.assert_trees_equal(state.reward.shared, saved.reward.shared, "statistics kept")


def test_a_checkpoint_of_the_older_connector_layout_is_refused_clearly(tmp_path):
    """Before issue 29 the statistics had no frozen flag (no bool buffer in the packed
    state): such a checkpoint is refused with an error that says so."""
    path, old = tmp_path / "runner.npz", tmp_path / "old.npz"
    conn = C.Connectors(obs=[C.NormalizeObservation()])
    with make_runner(jr.make_vec(short_cartpole, 2), conn, rollout_length=4) as runner:
        runner.sample()
        runner.save(path)
    with np.load(path) as data:
        arrays = dict(data)
    bools = [
        k for k in arrays if k.startswith("sampler/actor/connectors/") and arrays[k].dtype == bool
    ]
    assert len(bools) == 1  # the frozen flags
    del arrays[bools[0]]
    np.savez(old, **arrays)
    with (
        make_runner(jr.make_vec(short_cartpole, 2), conn, rollout_length=4) as runner,
        pytest.raises(InvalidArgumentError, match="older jaxrunner"),
    ):
        runner.restore(old)


# -- statistics that never explode --------------------------------------------------------------


def test_first_scaled_rewards_of_equal_returns_are_not_blown_up():
    conn = C.Connectors(reward=C.ScaleReward())
    with make_runner(jr.make_vec(short_cartpole, 4), conn, rollout_length=4) as runner:
        scaled = runner.sample().extras["scaled_reward"]
    # Step 0: four equal returns, variance 0: scaled by 1 (not by 1 / sqrt(1e-8) = 1e4).
    np.testing.assert_array_equal(scaled[0], 1.0)
    assert np.abs(scaled).max() < 10.0


def test_std_is_clamped_like_brax():
    stats = C.Moments(jnp.float32(10), jnp.zeros(2), jnp.array([1e-29, 1e31], jnp.float32))
    out = C.NormalizeObservation(clip=None, epsilon=0.0).normalize(stats, jnp.ones((1, 2)))
    np.testing.assert_allclose(out, [[1e6, 1e-6]], rtol=1e-6)
    loose = C.NormalizeObservation(clip=None, epsilon=0.0, min_std=1e-12, max_std=1e12)
    np.testing.assert_allclose(loose.normalize(stats, jnp.ones((1, 2))), [[1e12, 1e-12]], rtol=1e-5)


def test_an_int32_count_counts_exactly_past_2_to_the_24():
    big = 2.0**24
    for count_dtype, exact in (("float32", False), ("int32", True)):
        full = C.Moments(jnp.asarray(big, count_dtype), jnp.zeros(()), jnp.zeros(()))
        one = C.Moments.of(jnp.ones((1,)), count_dtype=count_dtype)
        assert (int(full.merge(one).count) == big + 1) is exact
    conn = C.Connectors(obs=[C.NormalizeObservation(count_dtype="int32")])
    with make_runner(jr.make_vec(short_cartpole, 2), conn, rollout_length=5) as runner:
        runner.sample()
        count = runner.get_connector_state().obs[0].shared.stats.count
    assert count.dtype == np.int32 and int(count) == 10


# -- updates: priming, freezing at run time, denormalize --------------------------------------


def test_prime_makes_the_first_sample_normalized():
    rng = np.random.default_rng(0)
    primer = rng.normal(3.0, 2.0, (64, 4)).astype(np.float32)
    conn = C.Connectors(obs=[C.NormalizeObservation(clip=None)])
    with make_runner(jr.make_vec(short_cartpole, 2), conn, rollout_length=5) as runner:
        runner.set_connector_state(conn.prime(runner.get_connector_state(), primer))
        traj = runner.sample()
        stats = runner.get_connector_state().obs[0].shared.stats
    np.testing.assert_allclose(
        traj.extras["policy_obs"],
        (traj.obs - primer.mean(0)) / np.sqrt(primer.var(0) + 1e-8),
        rtol=1e-4,
        atol=1e-5,
    )
    seen = np.concatenate([primer, traj.obs.reshape(-1, 4)])
    assert float(stats.count) == len(seen)
    np.testing.assert_allclose(stats.mean, seen.mean(0), rtol=1e-5, atol=1e-6)
    with pytest.raises(InvalidArgumentError, match="Nothing to prime"):
        C.Connectors(obs=[C.FrameStack()]).prime(C.ConnectorsState(), primer)
    state = conn.init(2, jr.make_vec(short_cartpole, 1).single_observation_space)
    for wrong in (primer[0], primer[:, :3], primer[None]):  # no batch axis, a wrong shape
        with pytest.raises(InvalidArgumentError, match=r"expected N observations of shape \(4,\)"):
            conn.prime(state, wrong)
    with pytest.raises(InvalidArgumentError, match="structured as the observation space"):
        conn.prime(state, {"x": primer})


@dataclasses.dataclass(frozen=True)
class Traces(C.ObsConnector):
    """Passes observations through; records each trace of the step and sample end."""

    traces: list = dataclasses.field(default_factory=list, hash=False, compare=False)

    def init(self, num_envs: int, obs_space: spaces.Space) -> C.ConnectorState:
        return C.ConnectorState()

    def __call__(self, state, obs, episode_start, active):
        self.traces.append("step")
        return obs, state

    def end_sample(self, state, inputs=None, valid=None):
        self.traces.append("end")
        return state


def test_freeze_and_unfreeze_at_run_time_without_recompiling():
    traces = Traces()
    conn = C.Connectors(obs=[C.NormalizeObservation(), traces], reward=C.ScaleReward())
    with make_runner(jr.make_vec(short_cartpole, 2), conn, rollout_length=5) as runner:
        runner.sample()
        compiled = len(traces.traces)
        frozen = C.freeze(runner.get_connector_state())
        runner.set_connector_state(frozen)
        for _ in range(2):
            runner.sample()
        after = runner.get_connector_state()
        jr.testing.assert_trees_equal(after.obs[0].shared, frozen.obs[0].shared, "obs stats")
        jr.testing.assert_trees_equal(after.reward.shared, frozen.reward.shared, "reward stats")
        runner.set_connector_state(C.unfreeze(after))
        runner.sample()
        count = runner.get_connector_state().obs[0].shared.stats.count
    assert float(count) == float(frozen.obs[0].shared.stats.count) + 10
    assert len(traces.traces) == compiled  # data, not a recompile


def test_denormalize_inverts_normalize():
    connector = C.NormalizeObservation(clip=None)
    stats = C.Moments.of(np.random.default_rng(1).normal(5.0, 3.0, (50, 4)).astype(np.float32))
    x = np.random.default_rng(2).normal(5.0, 3.0, (7, 4)).astype(np.float32)
    back = connector.denormalize(stats, connector.normalize(stats, x))
    np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-5)
    state = C.ConnectorState(shared=C.RunningMoments.zeros((4,)).add(stats))
    np.testing.assert_allclose(connector.invert(state, connector.normalize(stats, x)), x, 1e-5)


# -- state by name -------------------------------------------------------------------------------


def test_state_by_name_survives_adding_a_connector():
    old = C.Connectors(obs=[C.NormalizeObservation()], reward=C.ScaleReward())
    with make_runner(jr.make_vec(short_cartpole, 2), old, rollout_length=6) as runner:
        runner.sample()
        saved = old.state_dict(runner.get_connector_state())
        positional = runner.get_connector_state()
    assert list(saved) == ["normalize_observation", "scale_reward"]
    new = C.Connectors(
        obs={"normalize_observation": C.NormalizeObservation(), "stack": C.FrameStack()},
        reward=C.ScaleReward(),
    )
    with make_runner(jr.make_vec(short_cartpole, 2), new, rollout_length=6) as runner:
        fresh = runner.get_connector_state()
        runner.set_connector_state(saved)
        state = new.state_dict(runner.get_connector_state())
        jr.testing.assert_trees_equal(
            state["normalize_observation"], saved["normalize_observation"], "norm"
        )
        jr.testing.assert_trees_equal(state["scale_reward"], saved["scale_reward"], "reward")
        jr.testing.assert_trees_equal(state["stack"], new.state_dict(fresh)["stack"], "new one")
        with pytest.raises(InvalidArgumentError, match="state_dict"):
            runner.set_connector_state(positional)  # positional, of other connectors
        with pytest.raises(InvalidArgumentError, match=r"no connector is named \['norm'\]"):
            runner.set_connector_state({"norm": saved["normalize_observation"]})
        runner.sample()


def test_connector_names_are_unique():
    conn = C.Connectors(obs=[C.NormalizeObservation(), C.FrameStack(), C.FrameStack()])
    assert conn.names == ("normalize_observation", "frame_stack", "frame_stack_1")
    assert dataclasses.replace(conn, reward=C.ScaleReward()).names[-1] == "scale_reward"
    with pytest.raises(InvalidArgumentError, match="unique"):
        C.Connectors(obs=[C.FrameStack()], obs_names=("a", "b"))
    with pytest.raises(InvalidArgumentError, match="unique"):
        C.Connectors(obs={"scale_reward": C.FrameStack()}, reward=C.ScaleReward())


# -- presets --------------------------------------------------------------------------------------


def test_cleanrl_preset_clips_observations_and_scaled_rewards_to_10():
    conn = C.Connectors.cleanrl(gamma=0.95)
    assert conn.obs == (C.NormalizeObservation(clip=10.0),)
    assert conn.reward == C.ScaleReward(gamma=0.95, clip=10.0) == C.ScaleReward.cleanrl(0.95)
    state = C.freeze(conn.reward.init(1))  # statistics of std 1, kept as they are
    stats = C.Moments(jnp.float32(100), jnp.zeros(()), jnp.float32(100))
    state = state.replace(shared=state.shared.replace(stats=stats))
    reward = jnp.array([[3.0], [-1e6]])
    flags = jnp.zeros((2, 1), bool)
    scaled, _ = conn.reward(state, reward, flags, flags, jnp.ones((2, 1), bool))
    np.testing.assert_allclose(scaled[:, 0], [3.0, -10.0], rtol=1e-6)


def test_scale_reward_matches_gymnasium_normalize_reward_by_hand():
    """gymnasium's NormalizeReward stepped by hand, without its prior (count 1e-4, var
    1): once the variance is positive the scaled rewards agree step by step (within
    an episode; gymnasium carries the return over a truncation, we restart it)."""
    from gymnasium.wrappers.utils import RunningMeanStd

    env = gymnasium.wrappers.NormalizeReward(short_cartpole(), gamma=0.9)
    env.return_rms = RunningMeanStd(epsilon=1e-300, shape=())
    env.reset(seed=0)
    env.action_space.seed(0)
    theirs, terms = [], []
    for _ in range(12):
        _, r, term, trunc, _ = env.step(env.action_space.sample())
        theirs.append(r)
        terms.append(term)
        if term or trunc:
            break
    n = len(theirs)
    connector = C.ScaleReward(gamma=0.9)
    flags = jnp.array(terms)[:, None]
    scaled, _ = connector(
        connector.init(1),
        jnp.ones((n, 1)),  # CartPole's raw rewards
        flags,
        jnp.zeros_like(flags),
        jnp.ones_like(flags),
    )
    np.testing.assert_allclose(np.asarray(scaled)[1:, 0], np.asarray(theirs)[1:], rtol=1e-5)
    assert float(scaled[0, 0]) == 1.0 and theirs[0] > 1e3  # gymnasium's blows up at step 0

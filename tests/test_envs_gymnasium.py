"""Tests for jaxrunner._src.backends.gymnasium_adapter and .masked_reset: backend="gymnasium" and
jr.from_gymnasium.

Whatever the wrapped env's autoreset mode, the adopted env must equal gymnasium's own
SyncVectorEnv in SAME_STEP mode step for step (so no reset step is ever emitted and every
final observation is the true one), and natively vectorized CartPole must give exactly
the transitions of gymnasium's CartPoleVectorEnv, its reset steps left out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any, ClassVar

import gymnasium
import jax
import numpy as np
import pytest
from conftest import sample_checked_then_flagged
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode

import jaxrunner as jr
from jaxrunner._src.backends.masked_reset import reset_with_mask
from jaxrunner._src.backends.vector_infos import SplitInfos, split_info
from jaxrunner.errors import (
    ClosedError,
    EnvError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidStepError,
    SpaceMismatchError,
)
from jaxrunner.testing import (
    CountingEnv,
    VectorEnvContract,
    assert_trees_equal,
    counting_env_fns,
    gymnasium_reference,
)

SEED = 7
EnvFns = Sequence[Callable[[], gymnasium.Env]]


# -- the contract, for every autoreset mode of the wrapped env ----------------------------------


class _AdoptedSyncContract(VectorEnvContract):
    """gymnasium's SyncVectorEnv in ``mode``, adopted: it must keep jaxrunner's contract,
    parity with gymnasium's SAME_STEP SyncVectorEnv included."""

    mode: ClassVar[AutoresetMode]

    def make_vec(self, env_fns: EnvFns) -> jr.VectorEnv:
        return jr.from_gymnasium(gymnasium.vector.SyncVectorEnv(env_fns, autoreset_mode=self.mode))

    def test_a_restart_touches_no_other_env(self, kind: str) -> None:
        pytest.skip("an adopted gymnasium vector env has no restarts (no restart_policy)")

    def test_step_batch_rows_steps_only_those_envs(self, kind: str) -> None:
        """A gymnasium vector env cannot step a subset: ``rows`` other than all of them is
        refused before anything steps, and all rows work."""
        n = self.num_envs
        fns = counting_env_fns(n)
        with closing(self.make_vec(fns)) as vec, closing(gymnasium_reference(fns)) as ref:
            vec.reset(seed=self.seed)
            ref.reset(seed=self.seed)
            actions = np.ones(n, dtype=np.int64)
            with pytest.raises(InvalidArgumentError, match=r"num_splits=1"):
                vec.step_batch(actions[:1], slice(0, 1))
            out = vec.step_batch(actions, slice(0, n))
            obs, reward, *_ = ref.step(actions)
            assert_trees_equal((out.obs, out.reward), (obs, reward))


class TestAdoptedNextStep(_AdoptedSyncContract):
    mode = AutoresetMode.NEXT_STEP


class TestAdoptedSameStep(_AdoptedSyncContract):
    mode = AutoresetMode.SAME_STEP


class TestAdoptedDisabled(_AdoptedSyncContract):
    mode = AutoresetMode.DISABLED


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_adopted_async_vector_env_equals_gymnasium(mode: AutoresetMode) -> None:
    # Factories that import gymnasium only, so the spawned workers start fast.
    fns = [functools.partial(gymnasium.make, "CartPole-v1", max_episode_steps=4)] * 3
    env = gymnasium.vector.AsyncVectorEnv(fns, autoreset_mode=mode, context="spawn")
    with closing(jr.from_gymnasium(env)) as vec, closing(gymnasium_reference(fns)) as ref:
        assert_trees_equal(vec.reset(seed=SEED), ref.reset(seed=SEED), "reset")
        ref.action_space.seed(SEED)
        for t in range(12):
            actions = ref.action_space.sample()
            assert_trees_equal(vec.step(actions), ref.step(actions), f"step {t}")


def test_adopted_async_vector_env_gives_a_handle_per_sub_env() -> None:
    """Each handle's requests go down its own worker's pipe: it reads and sets its own
    sub-env only, the env steps on after them, a sub-env's error comes home (and
    gymnasium ends that worker), and the handles close with the vector env."""
    fns = [functools.partial(gymnasium.make, "CartPole-v1", max_episode_steps=4)] * 2
    env = gymnasium.vector.AsyncVectorEnv(fns, context="spawn")
    with closing(jr.from_gymnasium(env)) as vec:
        vec.reset(seed=SEED)
        handles = vec.get_sub_environments()
        assert [h.index for h in handles] == [0, 1]
        assert tuple(h.get_attr("length") for h in handles) == vec.get_attr("length")
        handles[1].set_attr("length", 0.75)
        assert vec.get_attr("length") == (0.5, 0.75)
        assert handles[1].call("get_wrapper_attr", "length") == 0.75
        vec.step(np.zeros(2, np.int64))
        with pytest.raises(AttributeError, match="no_such_attribute"):
            handles[0].get_attr("no_such_attribute")
        with pytest.raises(InvalidArgumentError, match=r"worker of sub-env 0 has ended"):
            handles[0].get_attr("length")
    with pytest.raises(ClosedError):
        handles[1].get_attr("length")


# -- natively vectorized CartPole ------------------------------------------------------------------


def _cartpole(num_envs: int, max_episode_steps: int = 12) -> jr.VectorEnv:
    return jr.make_vec(
        "CartPole-v1", num_envs, backend="gymnasium", max_episode_steps=max_episode_steps
    )


def test_make_vec_uses_the_vector_entry_point() -> None:
    with closing(_cartpole(4)) as vec:
        assert isinstance(vec, jr.GymnasiumVectorEnv)
        assert isinstance(vec.env.unwrapped, CartPoleVectorEnv)
        assert vec.wrapped_autoreset_mode == AutoresetMode.NEXT_STEP
        assert vec.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        # One batch of states: there is no sub-env object to return.
        with pytest.raises(InvalidArgumentError, match=r"CartPoleVectorEnv steps its envs as"):
            vec.get_sub_environments()


def test_cartpole_equals_gymnasium_vector_env_without_its_reset_steps() -> None:
    """One env, so both sides draw their resets from one generator in the same order:
    our transitions must be exactly the reference's real ones (its reset steps, with the
    ignored action and reward 0, left out), true final observations included."""
    num_transitions = 150
    actions = np.random.default_rng(SEED).integers(0, 2, size=num_transitions)
    ref = gymnasium.make_vec("CartPole-v1", 1, vectorization_mode="vector_entry_point")
    ref.unwrapped.max_episode_steps = 12
    expected = []
    with closing(ref):
        obs, _ = ref.reset(seed=SEED)
        pending_reset, k = False, 0
        while len(expected) < num_transitions:
            if pending_reset:  # the reference's reset step: not a transition
                obs, reward, terminated, truncated, _ = ref.step(np.array([1]))
                assert (reward[0], terminated[0], truncated[0]) == (0.0, False, False)
                pending_reset = False
                continue
            next_obs, reward, terminated, truncated, _ = ref.step(actions[k : k + 1])
            expected.append(
                (obs[0], actions[k], reward[0], terminated[0], truncated[0], next_obs[0])
            )
            obs, pending_reset, k = next_obs, bool(terminated[0] or truncated[0]), k + 1
    got = []
    with closing(_cartpole(1)) as vec:
        obs = vec.reset_batch([SEED])[0].copy()
        for k in range(num_transitions):
            out = vec.step_batch(actions[k : k + 1])
            got.append(
                (
                    obs[0],
                    actions[k],
                    out.reward[0],
                    out.terminated[0],
                    out.truncated[0],
                    out.next_obs[0].copy(),
                )
            )
            obs = out.obs.copy()
    ends = [t for t in expected if t[3] or t[4]]
    assert any(t[3] for t in ends) and any(t[4] for t in ends)  # both kinds of end covered
    for k, (a, e) in enumerate(zip(got, expected)):
        assert_trees_equal(
            (a[0], a[1], float(a[2]), a[3], a[4], a[5]),
            (e[0], e[1], float(e[2]), e[3], e[4], e[5]),
            f"transition {k}",
        )


def test_cartpole_resets_draw_what_the_env_would_draw() -> None:
    """Many envs: each reset state comes from the env's one generator, drawn for the ended
    envs in index order right after their last step, as its own reset step draws them."""
    n = 8
    rng, _ = seeding.np_random(SEED)
    with closing(_cartpole(n)) as vec:
        obs, _ = vec.reset_batch([SEED + i for i in range(n)])  # seed, seed+1, ... -> seed
        np.testing.assert_array_equal(
            obs, rng.uniform(-0.05, 0.05, size=(4, n)).T.astype(np.float32)
        )
        actions = np.random.default_rng(SEED).integers(0, 2, size=(60, n))
        resets = 0
        for t in range(60):
            out = vec.step_batch(actions[t])
            done = out.terminated | out.truncated
            np.testing.assert_array_equal(out.reward, np.ones(n))  # never a reset step
            np.testing.assert_array_equal(out.obs[~done], out.next_obs[~done])
            if done.any():
                draws = rng.uniform(-0.05, 0.05, size=(4, int(done.sum())))
                np.testing.assert_array_equal(out.obs[done], draws.T.astype(np.float32))
                assert sorted(out.reset_infos) == np.flatnonzero(done).tolist()
                assert all(out.reset_infos[i] == {} for i in out.reset_infos)
                resets += int(done.sum())
        assert resets > n


def test_cartpole_per_env_seeds_are_refused() -> None:
    with closing(_cartpole(3)) as vec:
        with pytest.raises(InvalidArgumentError, match=r"one generator"):
            vec.reset_at(1, seed=3)
        with pytest.raises(EnvError, match=r"CartPoleVectorEnv"):
            vec.reset(seed=[5, 1, 9])  # not seed, seed+1, ...: the env cannot take a list


# -- make_vec(backend="gymnasium") -----------------------------------------------------------------


def test_sync_vectorization_equals_the_sync_backend() -> None:
    kwargs = {"max_episode_steps": 15}
    with (
        closing(
            jr.make_vec("CartPole-v1", 4, backend="gymnasium", vectorization_mode="sync", **kwargs)
        ) as vec,
        closing(jr.make_vec("CartPole-v1", 4, backend="sync", **kwargs)) as ref,
    ):
        assert isinstance(vec.env, gymnasium.vector.SyncVectorEnv)
        assert vec.wrapped_autoreset_mode == AutoresetMode.DISABLED
        assert_trees_equal(vec.reset(seed=SEED), ref.reset(seed=SEED), "reset")
        rng = np.random.default_rng(SEED)
        for t in range(40):
            actions = rng.integers(0, 2, size=4)
            assert_trees_equal(vec.step(actions), ref.step(actions), f"step {t}")


@pytest.mark.parametrize("mode", [None, AutoresetMode.SAME_STEP])
def test_sync_vectorization_keeps_each_sub_envs_info_values(mode) -> None:
    # FrozenLake's reset info {"prob": 1} beside step infos {"prob": 0.33}: gymnasium's
    # SAME_STEP merge casts the step values to the reset's int (0), the default does not.
    kwargs = {"vector_kwargs": {"autoreset_mode": mode}} if mode else {}
    vec = jr.make_vec("FrozenLake-v1", 4, "gymnasium", vectorization_mode="sync", **kwargs)
    with closing(vec), closing(jr.make_vec("FrozenLake-v1", 4)) as ref:
        vec.reset(seed=SEED), ref.reset(seed=SEED)
        rng, same = np.random.default_rng(SEED), []
        for _ in range(30):
            actions = rng.integers(0, 4, size=4)
            got, want = vec.step_batch(actions), ref.step_batch(actions)
            same.append([a.get("prob") == b.get("prob") for a, b in zip(got.infos, want.infos)])
    assert np.all(same) == (mode is None)


def test_an_async_next_step_env_without_shared_memory_is_refused() -> None:
    fns = [functools.partial(gymnasium.make, "CartPole-v1")] * 2
    env = gymnasium.vector.AsyncVectorEnv(
        fns, autoreset_mode=AutoresetMode.NEXT_STEP, context="spawn", shared_memory=False
    )
    with pytest.raises(InvalidArgumentError, match=r"shared_memory=True"):
        jr.from_gymnasium(env)
    assert env.closed


def test_a_closed_vector_env_is_refused() -> None:
    env = gymnasium.vector.SyncVectorEnv([functools.partial(gymnasium.make, "CartPole-v1")])
    env.close()  # its CartPoles would still step: sampling went on silently
    with pytest.raises(InvalidArgumentError, match=r"this SyncVectorEnv is closed; pass a new"):
        jr.from_gymnasium(env)


def test_a_reset_drops_the_sends_not_yet_received() -> None:
    """``reset_batch`` drops the results of sends not yet received, as on every backend
    (docs/concepts.md): the adopted env kept the queued actions and stepped them after
    the reset, at the next ``recv`` (a ``step`` answered with that stale step)."""
    fns = counting_env_fns(3)
    env = gymnasium.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    with closing(jr.from_gymnasium(env)) as vec, closing(gymnasium_reference(fns)) as ref:
        vec.reset(seed=SEED), ref.reset(seed=SEED)
        vec.send(np.full(3, 2, dtype=np.int64))
        assert_trees_equal(vec.reset(seed=SEED), ref.reset(seed=SEED), "reset")
        with pytest.raises(InvalidArgumentError, match=r"no send\(\) is waiting"):
            vec.recv()
        actions = np.ones(3, dtype=np.int64)
        assert_trees_equal(vec.step(actions), ref.step(actions), "the step after the reset")


def test_make_vec_gymnasium_needs_an_id() -> None:
    refusal = r"registered gymnasium id.*build each sub-env themselves: 'sync'"
    with pytest.raises(InvalidArgumentTypeError, match=refusal):
        jr.make_vec(CountingEnv, 2, backend="gymnasium")


def test_make_vec_gymnasium_rejects_bad_vectorization_mode() -> None:
    with pytest.raises(InvalidArgumentError, match=r"vectorization_mode='nope'.*'sync'"):
        jr.make_vec("CartPole-v1", 2, backend="gymnasium", vectorization_mode="nope")


# -- EnvRunner -----------------------------------------------------------------------------------


def _runner(backend: str, num_envs: int, mlp: Callable, **kwargs: Any) -> jr.EnvRunner:
    envs = jr.make_vec("CartPole-v1", num_envs, backend=backend, max_episode_steps=20, **kwargs)
    policy = mlp(envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    return jr.EnvRunner(envs, policy, params, rollout_length=32, seed=SEED, num_splits=1)


def _cartpole_step(env: Any, obs: np.ndarray, action: int) -> np.ndarray:
    """gymnasium's single-env CartPole dynamics (``env``, unwrapped), from an observation."""
    env.state, env.steps_beyond_terminated = obs.astype(np.float64), None
    return env.step(int(action))[0]


def test_runner_on_native_cartpole_gives_a_valid_trajectory(mlp: Callable) -> None:
    """The vector entry point draws other start states than the sync backend, so the
    trajectories differ; what must hold: every transition is CartPole's physics for its
    own obs and action, episodes are contiguous, and no reset step shows up."""
    with _runner("gymnasium", 8, mlp) as runner:
        traj = runner.sample()
        traj2 = runner.sample()
    both = jr.concatenate([traj, traj2])
    done = both.terminated | both.truncated
    assert done.sum() > 8 and both.truncated.any()
    np.testing.assert_array_equal(both.reward, 1.0)  # a reset step would have reward 0
    single = gymnasium.make("CartPole-v1").unwrapped
    single.reset(seed=0)
    for t in range(both.num_steps):
        for i in range(both.num_envs):
            np.testing.assert_allclose(
                both.next_obs[t, i],
                _cartpole_step(single, both.obs[t, i], both.action[t, i]),
                atol=1e-5,
            )
    x, theta = both.next_obs[..., 0], both.next_obs[..., 2]
    out_of_bounds = (np.abs(x) > 2.4) | (np.abs(theta) > 12 * 2 * np.pi / 360)
    np.testing.assert_array_equal(both.terminated, out_of_bounds)
    np.testing.assert_array_equal(both.truncated, both.step == 19)
    # Contiguity: the next obs is the following step's obs unless the episode ended.
    cont = ~done[:-1]
    np.testing.assert_array_equal(both.obs[1:][cont], both.next_obs[:-1][cont])
    np.testing.assert_array_equal(both.step[1:][cont], both.step[:-1][cont] + 1)
    np.testing.assert_array_equal(both.step[1:][~cont], 0)
    assert np.all(np.abs(both.obs[1:][~cont]) <= 0.05)  # fresh reset states
    assert len(np.unique(both.episode_id[1:][~cont])) == int((~cont).sum())


def test_runner_gymnasium_sync_equals_runner_sync(mlp: Callable) -> None:
    with _runner("gymnasium", 4, mlp, vectorization_mode="sync") as a, _runner("sync", 4, mlp) as b:
        for _ in range(2):
            assert_trees_equal(vars(a.sample()), vars(b.sample()), "trajectory")


def test_runner_uses_one_group_by_default(mlp: Callable) -> None:
    envs = _cartpole(4)
    policy = mlp(envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length=4, seed=0) as runner:
        assert runner.sample().reward.shape == (4, 4)


def test_runner_with_two_splits_is_refused_when_built(mlp: Callable) -> None:
    # The wrapped env steps its whole batch at once: refused before anything runs (the
    # first sample() used to fail in step_batch and leave the runner unusable).
    envs = _cartpole(4)
    policy = mlp(envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    with pytest.raises(InvalidArgumentError, match=r"num_splits=2\): GymnasiumVectorEnv steps all"):
        jr.EnvRunner(envs, policy, params, rollout_length=4, seed=0, num_splits=2)
    with jr.EnvRunner(envs, policy, params, rollout_length=4, seed=0, num_splits=1) as runner:
        assert runner.sample().reward.shape == (4, 4)


# -- adoption errors -------------------------------------------------------------------------------


class _NextStepVectorEnv(gymnasium.vector.VectorEnv):
    """A NEXT_STEP vector env jaxrunner knows no masked reset for."""

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int = 2, bad: str = "") -> None:
        self.num_envs, self.bad = num_envs, bad
        self.single_observation_space = gymnasium.spaces.Box(-1, 1, (2,), np.float32)
        self.single_action_space = gymnasium.spaces.Discrete(2)
        self.observation_space = gymnasium.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space, num_envs)
        self.closed_by_adapter = False

    def reset(self, *, seed: Any = None, options: Any = None) -> tuple[np.ndarray, dict]:
        return np.zeros((self.num_envs, 2), np.float32), {}

    def step(self, actions: Any) -> tuple:
        n = self.num_envs
        obs = np.zeros((n, 2), np.float64 if self.bad == "obs" else np.float32)
        reward = np.full(n, np.nan if self.bad == "reward" else 1.0)
        flags = np.zeros(n, np.int8 if self.bad == "flags" else np.bool_)
        return obs, reward, flags, np.zeros(n, np.bool_), {}

    def close_extras(self, **kwargs: Any) -> None:
        self.closed_by_adapter = True


def test_next_step_env_without_masked_reset_is_refused() -> None:
    env = _NextStepVectorEnv()
    with pytest.raises(InvalidArgumentError, match=r"NEXT_STEP.*masked_reset"):
        jr.from_gymnasium(env)
    assert env.closed_by_adapter  # the adapter owned it, so it closed it


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ("obs", SpaceMismatchError, r"dtype float32"),
        ("reward", InvalidStepError, r"non-finite reward"),
        ("flags", InvalidStepError, r"terminated as an array of dtype int8"),
    ],
)
def test_bad_steps_of_the_wrapped_env_raise(bad: str, error: type, match: str) -> None:
    with closing(
        jr.from_gymnasium(_NextStepVectorEnv(bad=bad), masked_reset=reset_with_mask)
    ) as vec:
        vec.reset(seed=0)
        with pytest.raises(error, match=match):
            vec.step_batch(np.zeros(2, np.int64))


def test_from_gymnasium_needs_a_vector_env() -> None:
    with pytest.raises(InvalidArgumentTypeError, match=r"SyncVectorEnv"):
        jr.from_gymnasium(gymnasium.make("CartPole-v1"))


# -- per-env infos ---------------------------------------------------------------------------------


def test_split_infos_invert_gymnasium_merging() -> None:
    n = 3
    infos = [
        {"i": 1, "f": 0.5, "b": True, "f32": np.float32(2), "arr": np.arange(2), "obj": "x"},
        {},
        {"i": 3, "nested": {"b": False, "deep": {"v": 1.5}}, "npbool": np.bool_(True)},
    ]
    merger = gymnasium.vector.SyncVectorEnv([functools.partial(CountingEnv)] * n)
    merged: dict[str, Any] = {}
    for i, info in enumerate(infos):
        merged = merger._add_info(merged, info, i)
    split = SplitInfos(merged, n)
    assert len(split) == n
    for i, info in enumerate(infos):
        assert_trees_equal(split[i], info, f"env {i}")
        assert type(split[i].get("b", True)) is bool
    again: dict[str, Any] = {}
    for i in range(n):
        again = merger._add_info(again, split[i], i)
    assert_trees_equal(again, merged, "merged again")
    assert split_info({"k": np.arange(3)}, 1) == {"k": 1}  # EnvPool-style, no masks
    merger.close()


def test_the_runners_checked_actions_skip_the_adapters_check(monkeypatch) -> None:
    """The actions the runner's policy step checked go to the wrapped vector env as they
    are (``send_checked``, the adapter's check skipped); a batch the step flags goes
    through the check, which refuses it before any sub-env steps, naming the sub-env and
    the value."""
    from jaxrunner._src.backends.gymnasium_adapter import GymnasiumVectorEnv

    checks = []
    real = GymnasiumVectorEnv._check_actions

    def counted(self, actions):
        checks.append(len(actions))
        return real(self, actions)

    monkeypatch.setattr(GymnasiumVectorEnv, "_check_actions", counted)
    envs = jr.make_vec("CartPole-v1", 3, "gymnasium")
    traj = sample_checked_then_flagged(envs, checks, 1, 2, r"sub-env 0's action 2 \(row 0")
    assert (traj.action == 1).all() and checks == [3]

"""Tests for backend="envpool" (jaxrunner._src.backends.envpool); skipped without EnvPool.

EnvPool autoresets on the NEXT_STEP; by default the adapter gives EnvPool's own steps,
its reset steps as invalid rows; with ``keep_reset_steps=False``, exactly its real
transitions (reset steps left out, true final observations kept). Both keep gymnasium's
seeding semantics.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import closing

import gymnasium
import jax
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.testing import assert_trees_equal

envpool = pytest.importorskip("envpool")
pytestmark = pytest.mark.filterwarnings("ignore:.*precision lowered:UserWarning")

SEED = 3


def _envpool(num_envs: int, max_episode_steps: int = 12, **kwargs: object) -> jr.VectorEnv:
    return jr.make_vec(
        "CartPole-v1", num_envs, backend="envpool", max_episode_steps=max_episode_steps, **kwargs
    )


def test_same_step_mode_equals_envpool_without_its_reset_steps() -> None:
    """keep_reset_steps=False: per sub-env, the transitions are EnvPool's own real ones,
    in order."""
    n, per_env, limit = 3, 100, 25
    actions = np.random.default_rng(SEED).integers(0, 2, size=(n, per_env))
    ref = envpool.make_gymnasium("CartPole-v1", num_envs=n, seed=SEED, max_episode_steps=limit)
    expected: list[list[tuple]] = [[] for _ in range(n)]
    with closing(ref):
        obs, _ = ref.reset()
        pending, k = np.zeros(n, bool), np.zeros(n, int)
        while min(len(e) for e in expected) < per_env:
            a = np.array([actions[i, min(k[i], per_env - 1)] for i in range(n)], np.int32)
            next_obs, reward, terminated, truncated, _ = ref.step(a)
            for i in range(n):
                if pending[i]:  # EnvPool's reset step: action ignored, not a transition
                    assert reward[i] == 0 and not terminated[i] and not truncated[i]
                elif k[i] < per_env:
                    expected[i].append(
                        (obs[i], a[i], reward[i], terminated[i], truncated[i], next_obs[i])
                    )
                    k[i] += 1
            pending = (terminated | truncated) & ~pending
            obs = next_obs
    with closing(_envpool(n, limit, seed=SEED, keep_reset_steps=False)) as vec:
        obs = vec.reset_batch([SEED + i for i in range(n)])[0].copy()
        for t in range(per_env):
            out = vec.step_batch(actions[:, t])
            for i in range(n):
                got = (obs[i], actions[i, t], out.reward[i], out.terminated[i], out.truncated[i])
                e = expected[i][t]
                assert_trees_equal(
                    (*got[:2], float(got[2]), *got[3:], out.next_obs[i]),
                    (e[0], np.int64(e[1]), float(e[2]), *e[3:]),
                    f"env {i} transition {t}",
                )
            obs = out.obs.copy()
    assert any(e[4] for e in expected[0]) and any(e[3] for es in expected for e in es)


def test_seeded_reset_gives_the_same_episodes() -> None:
    with closing(_envpool(4)) as vec:
        first, _ = vec.reset(seed=SEED)
        np.testing.assert_array_equal(
            first, envpool.make_gymnasium("CartPole-v1", num_envs=4, seed=SEED).reset()[0]
        )
        rollout = [vec.step(np.ones(4, np.int64))[0] for _ in range(15)]
        again, _ = vec.reset(seed=SEED)
        np.testing.assert_array_equal(again, first)
        for t in range(15):
            np.testing.assert_array_equal(vec.step(np.ones(4, np.int64))[0], rollout[t])
        listed, _ = vec.reset(seed=[SEED + 1, SEED, 9, 2])  # env_seed
        np.testing.assert_array_equal(listed[1], first[0])


@pytest.mark.parametrize("keep_reset_steps", [True, False])
def test_sync_mode_refuses_pipelining_splits_when_the_runner_is_built(
    mlp: Callable, keep_reset_steps: bool
) -> None:
    envs = _envpool(4, keep_reset_steps=keep_reset_steps)
    policy = mlp(envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    with pytest.raises(InvalidArgumentError, match=r"num_splits=2\): EnvPoolVectorEnv steps all"):
        jr.EnvRunner(envs, policy, params, rollout_length=4, seed=SEED, num_splits=2)


def test_runner_on_same_step_mode_gives_real_transitions(mlp: Callable) -> None:
    """keep_reset_steps=False: every slot a transition, each one CartPole's own."""
    envs = _envpool(4, keep_reset_steps=False)
    policy = mlp(envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length=40, seed=SEED, num_splits=1) as r:
        traj = r.sample()
    done = traj.terminated | traj.truncated
    assert done.sum() >= 4
    np.testing.assert_array_equal(traj.reward, 1.0)  # EnvPool's reset steps have reward 0
    cont = ~done[:-1]
    np.testing.assert_array_equal(traj.obs[1:][cont], traj.next_obs[:-1][cont])
    np.testing.assert_array_equal(traj.step[1:][~cont], 0)
    single = gymnasium.make("CartPole-v1").unwrapped
    single.reset(seed=0)
    for t in range(traj.num_steps):
        for i in range(traj.num_envs):
            single.state, single.steps_beyond_terminated = traj.obs[t, i].astype(np.float64), None
            expected = single.step(int(traj.action[t, i]))[0]
            np.testing.assert_allclose(traj.next_obs[t, i], expected, atol=1e-4)


def test_async_same_step_mode_samples_ready_first_and_replays_exactly(mlp: Callable) -> None:
    """EnvPool's async mode (batch_size < num_envs) with keep_reset_steps=False, through
    the ready-first sampler:
    every env records exactly T steps per sample, obs and next_obs line up, ended
    episodes keep their true final observation, and each env's trajectory replays
    step for step in a fresh (sync) EnvPool env of the same seed."""
    n, length, samples = 8, 20, 3
    envs = _envpool(n, batch_size=2, keep_reset_steps=False)
    policy = mlp(envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length=length, seed=SEED) as runner:
        assert runner.sampler.ready_first.merging
        traj = jr.concatenate([runner.sample() for _ in range(samples)])
        assert runner.get_metrics()["num_env_steps"] == n * length * samples
        # The envs answered in batches, not in lockstep.
        assert any(count < n for count in runner.sampler.ready_first.ready_counts)
    done = traj.terminated | traj.truncated
    assert done.sum() >= n
    np.testing.assert_array_equal(traj.reward, 1.0)  # no reset step emitted
    cont = ~done[:-1]
    np.testing.assert_array_equal(traj.obs[1:][cont], traj.next_obs[:-1][cont])
    with closing(_envpool(n, keep_reset_steps=False)) as replay:
        obs = replay.reset_batch(jr.env_seeds(SEED, n))[0].copy()  # as the runner seeds it
        for t in range(length * samples):
            np.testing.assert_array_equal(traj.obs[t], obs)
            out = replay.step_batch(traj.action[t])
            np.testing.assert_array_equal(traj.next_obs[t], out.next_obs)
            np.testing.assert_array_equal(traj.reward[t], out.reward)
            np.testing.assert_array_equal(traj.terminated[t], out.terminated)
            np.testing.assert_array_equal(traj.truncated[t], out.truncated)
            obs = out.obs.copy()


def test_async_mode_steps_every_env_in_lockstep_as_sync_mode() -> None:
    """gymnasium's ``step`` (``step_batch`` of every env) on async mode: each of
    EnvPool's answers in env order, as sync mode steps the same envs; whole batches
    only, with none in flight, and EnvPool's reset steps kept."""
    n, ended = 4, 0
    actions = np.random.default_rng(SEED).integers(0, 2, size=(40, n))
    with closing(_envpool(n, seed=SEED)) as sync, closing(_envpool(n, batch_size=2)) as env:
        assert_trees_equal(env.reset(seed=SEED)[0], sync.reset(seed=SEED)[0], "reset obs")
        for a in actions:
            got, expected = env.step(a), sync.step(a)
            assert_trees_equal(got[:4], expected[:4], "step")
            np.testing.assert_array_equal(got[4]["elapsed_step"], expected[4]["elapsed_step"])
            ended += int((expected[2] | expected[3]).sum())
        assert ended >= n  # every env's episode ended at least once (12 steps at most)
        with pytest.raises(InvalidArgumentError, match="whole batches of batch_size=2"):
            env.step_batch(actions[0][:1], slice(0, 1))
        env.send(actions[0][:2], np.arange(2))
        with pytest.raises(InvalidArgumentError, match="none in flight"):
            env.step(actions[0])
    with closing(_envpool(n, batch_size=2, keep_reset_steps=False)) as env:
        env.reset(seed=SEED)
        with pytest.raises(InvalidArgumentError, match="no lockstep step can finish"):
            env.step(actions[0])


def test_async_mode_batch_size_and_envpools_arguments_checked() -> None:
    with pytest.raises(InvalidArgumentError, match=r"1 <= batch_size < num_envs=4"):
        jr.make_vec("CartPole-v1", 4, backend="envpool", batch_size=3)
    for name, value in (("batch_size", 0), ("batch_size", "2"), ("num_threads", -1)):
        # num_threads=-1: EnvPool's C++ aborted the whole process (std::terminate).
        with pytest.raises(InvalidArgumentError, match=rf"make_vec\({name}={value!r}\): expected"):
            jr.make_vec("CartPole-v1", 4, backend="envpool", **{name: value})
    with pytest.raises(TypeError, match=r"make_vec\(keep_reset_steps='y'\): expected True"):
        jr.make_vec("CartPole-v1", 4, backend="envpool", keep_reset_steps="y")
    with pytest.raises(InvalidArgumentError, match=r"'NoSuch-v0'\): not an EnvPool task"):
        jr.make_vec("NoSuch-v0", 4, backend="envpool")  # EnvPool's own: a bare assert


@pytest.mark.parametrize("batch_size", [None, 2], ids=["sync", "async"])
def test_both_modes_refuse_the_arguments_jaxrunner_sets(batch_size: int | None) -> None:
    with pytest.raises(InvalidArgumentError, match=r"env_seed=\.\.\.\): set by jaxrunner"):
        jr.make_vec("CartPole-v1", 4, backend="envpool", batch_size=batch_size, env_seed=[1] * 4)
    # Seeds: one per sub-env, each an int32 (EnvPool's own checks are bare asserts).
    with closing(jr.make_vec("CartPole-v1", 4, backend="envpool", batch_size=batch_size)) as env:
        for seeds in ([5, 6], [5, 9], list(range(6))):
            with pytest.raises(InvalidArgumentError, match=r"one seed per sub-env \(num_envs=4\)"):
                env.reset_batch(seeds)
        with pytest.raises(InvalidArgumentError, match=r"seeds reach 2147483649 \(sub-env i"):
            env.reset(seed=2**31 - 2)
        env.reset(seed=2**31 - 4)  # the last sub-env's seed is 2**31 - 1
    if batch_size is None:  # sync mode's class takes no batch_size (async's is an argument)
        with pytest.raises(InvalidArgumentError, match=r"\(batch_size=\.\.\.\): set by"):
            jr.EnvPoolVectorEnv("CartPole-v1", 4, batch_size=2)


@pytest.mark.parametrize("keep_reset_steps", [True, False])
def test_sync_mode_refuses_per_sub_env_access_by_name_as_async_mode(keep_reset_steps: bool) -> None:
    """EnvPool's sub-envs live in its C++ threads in either mode: sync mode's ``call``,
    ``get_attr`` and ``set_attr`` are refused with the fix, as async mode's are (they
    raised AttributeError: EnvPool's pool has no such methods to forward them to)."""
    with closing(_envpool(2, keep_reset_steps=keep_reset_steps)) as envs:
        calls = {
            "call": lambda: envs.call("render"),
            "get_attr": lambda: envs.get_attr("spec"),
            "set_attr": lambda: envs.set_attr("spec", None),
        }
        for what, call in calls.items():
            with pytest.raises(
                InvalidArgumentError, match=rf"EnvPoolVectorEnv\.{what}\(\): EnvPool's sub-envs"
            ):
                call()


class _EpisodeLog(jr.Callbacks):
    """Every episode a callback sees end: its id, first observation and length."""

    def __init__(self) -> None:
        self.ended: list[tuple[int, np.ndarray, int]] = []

    def on_episode_end(self, runner: object, env_index: int, episode: jr.LiveEpisode) -> None:
        first = np.asarray(episode.obs[0]).copy()
        self.ended.append((episode.episode_id, first, episode.length))


@pytest.mark.parametrize("compact", [False, True])
def test_default_records_envpool_as_stepped_by_hand(mlp: Callable, compact: bool) -> None:
    """By default (keep_reset_steps=True) the runner records EnvPool's own steps, its reset steps
    included, exactly as a hand loop over the same actions sees them; the reset slots
    are exactly the steps after an episode ended (valid False, step -1, the next
    episode's id) and count in no metric; everything else is as keep_reset_steps=False.
    With ``compact_next_obs``, ``next_obs`` built from the stored rows is the same."""
    n, length, samples, limit = 5, 16, 3, 12
    envs = _envpool(n, limit)  # the default
    assert envs.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.NEXT_STEP
    policy = mlp(envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    log = _EpisodeLog()
    with jr.EnvRunner(
        envs, policy, params, length, SEED, callbacks=log, compact_next_obs=compact
    ) as runner:
        traj = jr.concatenate([runner.sample() for _ in range(samples)])
        assert traj.is_compact == compact
        metrics = runner.get_metrics()
    seeds = jr.env_seeds(SEED, n)
    ref = envpool.make_gymnasium("CartPole-v1", num_envs=n, env_seed=seeds, max_episode_steps=limit)
    ended = np.zeros(n, bool)
    with closing(ref):
        obs = ref.reset()[0]
        for t in range(traj.num_steps):
            next_obs, reward, terminated, truncated, _ = ref.step(traj.action[t].astype(np.int32))
            got = (traj.obs[t], traj.next_obs[t], traj.reward[t], traj.terminated[t])
            assert_trees_equal(got, (obs, next_obs, reward.astype(np.float64), terminated))
            np.testing.assert_array_equal(traj.truncated[t], truncated)
            np.testing.assert_array_equal(traj.valid[t], ~ended, f"step {t}")
            obs, ended = next_obs, terminated | truncated
    done = traj.terminated | traj.truncated
    resets = ~traj.valid
    assert done.sum() >= 2 * n and traj.truncated.any() and traj.terminated.any()
    # Reset slots: right after each end, step -1 and the id of the episode that follows.
    np.testing.assert_array_equal(resets[1:], done[:-1])
    np.testing.assert_array_equal(traj.step[resets], -1)
    np.testing.assert_array_equal(traj.reward[resets], 0.0)
    np.testing.assert_array_equal(traj.step[1:][resets[:-1]], 0)  # then the first step
    after = resets[:-1]  # the reset slot and its episode's first step share the id
    np.testing.assert_array_equal(traj.episode_id[1:][after], traj.episode_id[:-1][after])
    assert (traj.episode_id[resets] != traj.episode_id[:-1][resets[1:]]).all()
    # Metrics: real transitions only, no faults, lengths in transitions.
    num_real = traj.reward.size - int(done[:-1].sum())
    assert metrics["num_env_steps"] == int(traj.valid.sum()) == num_real
    assert metrics["num_faulty_episodes"] == metrics["num_dropped_steps"] == 0
    assert metrics["num_episodes"] == int(done.sum())
    episodes = traj.split_episodes()
    finished = [e for e in episodes if e.is_done]
    assert len(finished) == int(done.sum()) and not any(e.faulty for e in episodes)
    real_lengths = [len(e.reward) for e in finished]
    assert metrics["episode_length_mean"] == pytest.approx(np.mean(real_lengths))
    for e in episodes:  # no reset step inside an episode: every reward is CartPole's 1
        np.testing.assert_array_equal(e.reward, 1.0)
    # Callbacks see the same episodes: ids, lengths, the reset observation first.
    by_id = {e.episode_id: e for e in finished}
    assert len(log.ended) == len(finished)
    for episode_id, first, steps in log.ended:
        e = by_id[episode_id]
        assert steps == len(e.reward)
        if e.start_step == 0:
            np.testing.assert_array_equal(first, e.obs[0])


@pytest.mark.parametrize("compact", [False, True])
def test_async_default_replays_envpool_by_hand(mlp: Callable, compact: bool) -> None:
    """Async mode at its default (keep_reset_steps=True): each env's rows, in time order, are what
    EnvPool stepped by hand gives for the same actions, its reset steps included; the
    reset slots are exactly the steps after an end, and count in no metric (also with
    ``compact_next_obs``)."""
    n, length, samples, limit = 16, 20, 3, 12  # more envs than a chunk (8): part calls
    envs = _envpool(n, limit, batch_size=2)  # the default
    assert envs.capabilities.reset_steps and envs.capabilities.ready_first
    policy = mlp(envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, length, SEED, compact_next_obs=compact) as runner:
        traj = jr.concatenate([runner.sample() for _ in range(samples)])
        metrics = runner.get_metrics()
        assert any(count < n for count in runner.sampler.ready_first.ready_counts)
        assert traj.is_compact == compact
    done = traj.terminated | traj.truncated
    resets = ~traj.valid
    assert done.sum() >= n and traj.truncated.any()
    np.testing.assert_array_equal(resets[1:], done[:-1])
    assert not resets[0].any()  # the first sample starts from the pool's reset
    np.testing.assert_array_equal(traj.step[resets], -1)
    np.testing.assert_array_equal(traj.step[1:][resets[:-1]], 0)
    assert metrics["num_env_steps"] == int(traj.valid.sum())
    assert metrics["num_faulty_episodes"] == metrics["num_dropped_steps"] == 0
    assert metrics["num_episodes"] == int(done.sum())
    ref = envpool.make_gymnasium(
        "CartPole-v1", num_envs=n, env_seed=jr.env_seeds(SEED, n), max_episode_steps=limit
    )
    with closing(ref):
        obs = ref.reset()[0]
        for t in range(traj.num_steps):  # each env's t-th step, all envs in one call
            next_obs, reward, terminated, truncated, _ = ref.step(traj.action[t].astype(np.int32))
            got = (traj.obs[t], traj.next_obs[t], traj.reward[t], traj.terminated[t])
            assert_trees_equal(got, (obs, next_obs, reward.astype(np.float64), terminated))
            np.testing.assert_array_equal(traj.truncated[t], truncated)
            obs = next_obs


@pytest.mark.parametrize(
    ("task", "kwargs"),
    [
        ("CartPole-v1", {"max_episode_steps": 6}),
        ("Pong-v5", {"max_episode_steps": 6}),
        ("HalfCheetah-v4", {"max_episode_steps": 6}),
    ],
)
@pytest.mark.parametrize("direct", [True, False])
def test_calls_give_what_envpools_public_api_gives(task: str, kwargs: dict, direct: bool) -> None:
    """EnvPoolCalls (the C++ calls driven directly, or its public-API fallback) against
    a twin pool stepped by EnvPool's own step/reset: the same arrays, bit for bit, and
    the same info, through episode ends and a masked reset."""
    from jaxrunner._src.backends.envpool_calls import EnvPoolCalls

    n = 3
    pools = [envpool.make_gymnasium(task, num_envs=n, seed=SEED, **kwargs) for _ in range(2)]
    mine, ref = pools
    with closing(mine), closing(ref):
        calls = EnvPoolCalls(mine)
        assert calls.direct  # every single-array task has the direct layout
        calls.direct = direct
        assert_trees_equal(mine.reset()[0], ref.reset()[0])
        rng = np.random.default_rng(SEED)
        ended = 0
        for t in range(14):
            action = np.stack([mine.action_space.sample() for _ in range(n)])
            if isinstance(mine.action_space, gymnasium.spaces.Box):
                action = rng.uniform(-1, 1, action.shape).astype(np.float32)  # cast on send
            got = calls.step(action)
            obs, reward, terminated, truncated, info = ref.step(action)
            assert_trees_equal(
                (got.env_id, got.obs, got.reward, got.terminated, got.truncated, dict(got.info)),
                (info["env_id"], obs, reward, terminated, truncated, info),
                f"{task} step {t}",
            )
            ended += int((terminated | truncated).sum())
            if t == 7:  # a masked reset of two sub-envs, answered in their order
                ids = np.array([0, 2], np.int32)
                got_ids, got_obs, got_info = calls.reset(ids)
                ref_obs, ref_info = ref.reset(ids)
                assert_trees_equal(
                    (got_ids, got_obs, dict(got_info)), (ref_info["env_id"], ref_obs, ref_info)
                )
        assert ended > 0  # episodes ended (max_episode_steps) and were reset by EnvPool


@pytest.mark.parametrize("what", ["reward", "obs", "huge obs"])
@pytest.mark.parametrize(
    "mode",
    [{}, {"batch_size": 2}, {"batch_size": 2, "keep_reset_steps": False}],
    ids=["sync", "async", "async-same-step"],
)
def test_a_non_finite_value_raises_naming_its_sub_env_in_every_mode(
    monkeypatch, mlp: Callable, mode: dict, what: str
) -> None:
    # EnvPool cannot restart one sub-env, so a NaN reward or an infinite observation
    # raises (async mode recorded both silently); the steps before it are kept. A huge
    # finite observation (its square overflows) is recorded as it came.
    from jaxrunner._src.backends.envpool_calls import EnvPoolCalls

    recv, calls = EnvPoolCalls.recv, []

    def spoiled_recv(self):
        out = recv(self)
        calls.append(out.env_id.tolist())
        if len(calls) == 6:  # its second row's value
            if what == "reward":
                reward = np.array(out.reward, np.float64)
                reward[1] = np.nan
                return out._replace(reward=reward)
            obs = np.array(out.obs)
            obs[1, 2] = np.inf if what == "obs" else 3e38
            return out._replace(obs=obs)
        return out

    monkeypatch.setattr(EnvPoolCalls, "recv", spoiled_recv)
    envs = _envpool(4, **mode)
    policy = mlp(envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, 8, seed=SEED) as runner:
        if what == "huge obs":
            traj = runner.sample()
            assert (traj.next_obs == np.float32(3e38)).sum() == 1
            return
        with pytest.raises(jr.errors.InvalidStepError, match="non-finite") as caught:
            runner.sample()
    assert f"sub-env {calls[5][1]}" in str(caught.value)
    partial = caught.value.partial_trajectory
    assert partial is not None and np.isfinite(partial.reward).all()
    assert np.isfinite(partial.obs).all() and np.isfinite(partial.next_obs).all()


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_huge_finite_observation_steps_without_a_warning(monkeypatch) -> None:
    # The finite test of EnvPool's sync steps must not overflow on finite values: numpy's
    # "overflow encountered in dot" was a RuntimeWarning (an error where warnings are).
    from jaxrunner._src.backends.envpool_calls import EnvPoolCalls

    recv = EnvPoolCalls.recv

    def huge_recv(self):
        out = recv(self)
        obs = np.array(out.obs)
        obs[1, 2] = 3e38
        return out._replace(obs=obs)

    with closing(_envpool(4)) as envs:
        envs.reset(seed=SEED)
        monkeypatch.setattr(EnvPoolCalls, "recv", huge_recv)
        out = envs.step_batch(np.zeros(4, np.int64))
        assert out.next_obs[1, 2] == np.float32(3e38)


@pytest.mark.parametrize("keep_reset_steps", [True, False])
def test_reset_at_resets_one_sub_env_as_envpool_does(keep_reset_steps) -> None:
    """``reset_at(i)`` is EnvPool's own ``reset(env_id=[i])``: the same first observation
    and the same steps after it as a pool driven by hand (its seeds fixed when built, so
    ``seed=`` and ``options=`` are refused, naming the call); with EnvPool's reset steps
    kept, a sub-env whose episode had just ended is not reset again by the next step."""
    n, limit = 3, 6
    ref = envpool.make_gymnasium("CartPole-v1", num_envs=n, seed=SEED, max_episode_steps=limit)
    mine = _envpool(n, limit, seed=SEED, keep_reset_steps=keep_reset_steps)
    ones = np.ones(n, np.int32)

    def both_step(steps: int) -> tuple:
        for _ in range(steps):
            expected, got = ref.step(ones), mine.step_batch(ones.astype(np.int64))
            np.testing.assert_array_equal(got.next_obs, expected[0])
            np.testing.assert_array_equal(got.reward, expected[1])
        return expected, got

    def both_reset_at(index: int) -> None:
        ref_obs, _ = ref.reset(np.array([index], np.int32))
        obs, info = mine.reset_at(index)
        np.testing.assert_array_equal(obs, ref_obs[0])
        assert isinstance(info, dict)

    with closing(ref), closing(mine):
        ref.reset()
        mine.reset_batch([SEED + i for i in range(n)])  # (EnvPool's seed + i, as ref's)
        both_step(2)  # no episode ends yet
        both_reset_at(1)
        _, got = both_step(1)
        assert got.reset_rows is None and not (got.terminated | got.truncated).any()
        if keep_reset_steps:  # sub-envs 0 and 2 reach the limit: the next step resets them
            expected, _ = both_step(limit - 3)
            assert (expected[2] | expected[3]).tolist() == [True, False, True]
            both_reset_at(0)  # before that step: it steps on from its new episode
            expected, got = both_step(1)
            assert got.reset_rows is not None and got.reset_rows.tolist() == [False, False, True]
            assert expected[1][0] == got.reward[0] == 1.0  # a real transition
        for name, kwargs in (("seed", {"seed": 7}), ("options", {"options": {"a": 1}})):
            with pytest.raises(InvalidArgumentError, match=f"reset_at.*{name}") as caught:
                mine.reset_at(0, **kwargs)
            assert "reset(seed=...)" in str(caught.value)


def test_default_sends_in_the_background() -> None:
    """By default (keep_reset_steps), send hands EnvPool the actions at once (the runner records
    them while EnvPool steps) and recv answers them: the same steps as step_batch on a
    twin pool; calls out of order are refused with what to do, and lose nothing."""
    n = 3
    mine, twin = (_envpool(n, 5) for _ in range(2))
    with closing(mine), closing(twin):
        assert mine.capabilities.steps_in_background
        for vec in (mine, twin):
            vec.reset_batch([SEED + i for i in range(n)])
        with pytest.raises(InvalidArgumentError, match="send"):
            mine.recv()
        resets = 0
        for t in range(8):
            actions = np.full(n, t % 2, np.int64)
            mine.send(actions)
            if t == 2:
                with pytest.raises(InvalidArgumentError, match="recv"):
                    mine.send(actions)
                with pytest.raises(InvalidArgumentError, match="recv"):
                    mine.reset_batch([None] * n)
            got, expected = mine.recv(), twin.step_batch(actions)
            assert_trees_equal(got[:5], expected[:5], f"step {t}")
            assert_trees_equal(got.reset_rows, expected.reset_rows, f"step {t}")
            resets += got.reset_rows is not None
        assert resets  # the episodes (5 steps) ended and EnvPool's reset steps came back
        with pytest.raises(InvalidArgumentError, match="all 3 sub-envs"):
            mine.send(np.zeros(2, np.int64), slice(0, 2))


@pytest.mark.parametrize(
    "winner", ["envpool", "envpool_one_thread", "envpool_async", "envpool_pools", 0]
)
def test_from_env_tries_envpool_and_builds_what_it_chose(monkeypatch, winner) -> None:
    """Where EnvPool has the id, ``from_env``'s trial times its backend too, at its
    defaults, on one thread and in async mode (the rule keeps these cheap envs in sync,
    so nothing else is tried); the runner built is the one a user builds by hand on the
    chosen backend with those options (async: the same trajectories, ready-first)."""
    from jaxrunner._src.runner import auto_layout, trial_layouts

    picked: list[dict] = []
    real_pick = auto_layout.pick_layout
    variants = trial_layouts.ENVPOOL_VARIANTS

    def rigged(rule, rates, *, policy_step_us):  # the real rates, then a set winner
        picked.append(dict(rates))
        rigged_rates = {0: 1.0, "envpool": 1.0, **dict.fromkeys(variants, 1.0), winner: 2.0}
        return real_pick(rule, rigged_rates, policy_step_us=5.0)

    monkeypatch.setattr(auto_layout, "pick_layout", rigged)
    env = gymnasium.make("CartPole-v1")
    policy = jr.models.mlp_policy(env.action_space)
    params = policy.init(jax.random.key(0), env.observation_space)
    with jr.EnvRunner.from_env("CartPole-v1", 4, policy, params, 8, SEED) as runner:
        got = runner.sample()
        choice = runner.envs.layout_choice
        pools = getattr(runner.envs, "pools", [runner.envs])  # (EnvPool pools stepped in turn)
        configs = [pool.env.config for pool in pools] if winner else []
    assert len(picked) == 1 and set(picked[0]) == {0, "envpool", *variants}
    assert min(picked[0].values()) > 0
    backend = "envpool" if winner else "sync"
    assert choice is not None and choice.backend == backend
    by_hand = trial_layouts.envpool_options(winner, 4, choice.cpus) if winner else {}
    assert dict(choice.envpool_options) == (by_hand if winner != "envpool" else {})
    assert len(configs) == (by_hand.get("num_pools", 1) if winner else 0)
    for config in configs:  # each pool built as asked (0: EnvPool's own thread count)
        assert config["num_threads"] == by_hand.get("num_threads", 0)
        assert config["batch_size"] == by_hand.get("batch_size", config["num_envs"])
    envs = jr.make_vec("CartPole-v1", 4, backend, **by_hand)
    with jr.EnvRunner(envs, policy, params, 8, SEED) as ref:
        assert_trees_equal(got, ref.sample(), f"from_env(auto -> {backend}) vs by hand")


@pytest.mark.parametrize("num_envs, with_callbacks", [(4, True), (5, False)])
def test_from_env_times_envpool_async_only_where_it_builds_and_runs(
    monkeypatch, num_envs: int, with_callbacks: bool
) -> None:
    """Async mode's ready-first loop refuses per-step callbacks, which the trial's
    runners leave out (chosen, the runner built with them raised), and EnvPool answers
    whole batches (5 envs in batches of 2 failed to build, warned of as a failed
    layout): from_env times async mode only where it can build and run it."""
    from jaxrunner._src.backends import auto
    from jaxrunner._src.runner import auto_layout

    tried: list[set] = []
    real_pick = auto_layout.pick_layout

    def rigged(rule, rates, *, policy_step_us):  # async wins wherever it was timed
        tried.append(set(rates))
        won = {"envpool_async": 1e12} if "envpool_async" in rates else {}
        return real_pick(rule, {**rates, **won}, policy_step_us=policy_step_us)

    monkeypatch.setattr(auto_layout, "pick_layout", rigged)
    monkeypatch.setattr(auto, "available_cpus", lambda: 4)  # the variants are timed
    ends: list[int] = []

    class Count(jr.Callbacks):
        def on_episode_end(self, runner, env_index, episode):
            ends.append(env_index)

    env = gymnasium.make("CartPole-v1")
    policy = jr.models.mlp_policy(env.action_space)
    params = policy.init(jax.random.key(0), env.observation_space)
    callbacks = Count() if with_callbacks else None
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no layout of the trial failed
        runner = jr.EnvRunner.from_env("CartPole-v1", num_envs, policy, params, 8, SEED, callbacks)
    with runner:
        for _ in range(20):
            runner.sample()
    # (two pools step in lockstep: per-step callbacks and 5 envs, 2 + 3, are theirs)
    assert tried == [{0, "envpool", "envpool_one_thread", "envpool_pools"}]
    assert bool(ends) == with_callbacks  # the runner's callbacks ran


def test_from_env_times_envpool_where_the_probe_measured_nothing(monkeypatch) -> None:
    """A probe past its deadline leaves the env step's cost unmeasured (NaN): the trial
    of EnvPool then raised ValueError (NaN steps per timing); it times the fewest."""
    import time

    from jaxrunner._src.backends import auto

    def slow(probe, seed, **_):  # a first reset past the probe's deadline
        time.sleep(1.0)
        return 5.0

    monkeypatch.setattr(auto, "measure_env_step_us", slow)
    monkeypatch.setattr(auto, "PROBE_DEADLINE_S", 0.05)
    env = gymnasium.make("CartPole-v1")
    policy = jr.models.mlp_policy(env.action_space)
    params = policy.init(jax.random.key(0), env.observation_space)
    with pytest.warns(RuntimeWarning, match="falls back to"):
        runner = jr.EnvRunner.from_env("CartPole-v1", 4, policy, params, 2, SEED)
    with runner:
        choice = runner.envs.layout_choice
        assert choice is not None and np.isnan(choice.env_step_us)
        assert choice.tried and choice.tried_envpool is not None  # the trial ran
        assert runner.sample().reward.shape == (2, 4)


def test_from_env_times_envpool_async_on_the_second_of_two_samples(monkeypatch) -> None:
    """A ready-first sample's envs run into the next one: the trial times the async
    pool's samples after an untimed one (a sample right after other layouts' starts
    ahead), the others' samples alone; each timing is whole samples (here 2 of 8 steps)."""
    from jaxrunner._src.backends.envpool_async import EnvPoolAsyncVectorEnv
    from jaxrunner._src.runner import auto_layout

    monkeypatch.setattr(auto_layout, "TRIAL_STEPS", (16, 16))  # 2 samples of 8 per timing
    monkeypatch.setattr(auto_layout, "DROP_AFTER", 100)  # every layout timed every round

    calls: dict[int, list[bool]] = {}  # runner -> on async envs, per sample
    real = jr.EnvRunner.sample

    def counted(self, *args, **kwargs):
        is_async = isinstance(self.envs, EnvPoolAsyncVectorEnv)
        calls.setdefault(id(self), []).append(is_async)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(jr.EnvRunner, "sample", counted)
    env = gymnasium.make("CartPole-v1")
    policy = jr.models.mlp_policy(env.action_space)
    params = policy.init(jax.random.key(0), env.observation_space)
    with jr.EnvRunner.from_env("CartPole-v1", 4, policy, params, 8, SEED):
        pass
    single = {len(c) for c in calls.values() if not c[0]}
    paired = [len(c) for c in calls.values() if c[0]]
    (each,) = single  # each other layout's runner: 2 samples per timing
    assert each % 2 == 0 and paired == [each // 2 * 3]  # async: 1 untimed + 2 per timing


def test_auto_builds_an_id_only_envpool_has_on_envpool_with_its_kwargs() -> None:
    """``"Pendulum-v0"`` is EnvPool's (gymnasium has v1 only): ``"auto"`` builds it on
    the one backend that can, untimed, in ``make_vec`` and ``from_env`` alike, its kwargs
    passed on; the trajectories are those of the envpool backend built by hand. With a
    restart policy, which EnvPool does not take, it is refused as before."""
    kwargs = {"max_episode_steps": 5}
    env = envpool.make_gymnasium("Pendulum-v0")
    policy = jr.models.mlp_policy(env.action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), env.observation_space)
    samples, choices = {}, {}
    builders = {
        "make_vec": lambda: jr.EnvRunner(
            jr.make_vec("Pendulum-v0", 2, "auto", **kwargs), policy, params, 8, SEED
        ),
        "from_env": lambda: jr.EnvRunner.from_env(
            "Pendulum-v0", 2, policy, params, 8, SEED, env_kwargs=kwargs
        ),
        "by hand": lambda: jr.EnvRunner(
            jr.make_vec("Pendulum-v0", 2, "envpool", **kwargs), policy, params, 8, SEED
        ),
    }
    for name, build in builders.items():
        with build() as runner:
            samples[name], choices[name] = runner.sample(), runner.envs.layout_choice
    for name in ("make_vec", "from_env"):
        choice = choices[name]
        assert choice.backend == "envpool" and np.isnan(choice.env_step_us), name
        assert "EnvPool task id" in choice.reason, name
        assert_trees_equal(samples[name], samples["by hand"], f"{name}(auto) vs envpool")
    assert not samples["by hand"].valid.all()  # the 5-step episodes' reset slots
    with pytest.raises(InvalidArgumentError, match="backend='envpool'"):
        jr.make_vec("Pendulum-v0", 2, "auto", restart_policy=jr.RestartPolicy())


def test_bench_builds_a_workloads_envpool_port() -> None:
    """``jaxrunner bench --workload W --backend envpool`` runs EnvPool's port of W's
    env (its ``envpool_id``): the workload's gymnasium factory is for the backends
    that build each sub-env."""
    from jaxrunner._src.bench import systems

    spec = systems.Spec(
        system="jaxrunner",
        backend="envpool",
        env="CartPole-v1",
        num_envs=2,
        rollout_length=8,
        workload="cartpole",
    )
    system = systems.build(spec)
    try:
        assert system.measure(0.05)["steps_per_s"] > 0
    finally:
        system.close()


@pytest.mark.parametrize("keep_reset_steps", [True, False])
def test_async_envs_are_free_for_the_next_runner_after_evaluate_and_stop(
    keep_reset_steps: bool,
) -> None:
    """``evaluate`` leaves its envs open, free for the next evaluation, and
    ``stop(close_envs=False)`` frees them for another runner: in async mode too, where
    the runner steps envs up to a sample ahead (they were left in flight, so the next
    runner's reset was refused, "envs [...] are still stepping"). The second evaluation
    gives the first one's episodes, and a runner after ``stop(close_envs=False)`` samples
    what one on fresh envs samples."""

    def apply_fn(params: object, obs: jax.Array, carry: object, keys: jax.Array) -> tuple:
        return (obs[:, 2] > 0).astype(np.int32), {}, carry

    policy = jr.Policy(apply_fn)
    mode = {"batch_size": 2, "keep_reset_steps": keep_reset_steps}
    with closing(_envpool(4, 9, **mode)) as envs:
        first, again = (
            jr.evaluate(envs, policy, {}, 6, deterministic=False, seed=SEED, rollout_length=4)
            for _ in range(2)
        )
        np.testing.assert_array_equal(again.returns, first.returns)
        np.testing.assert_array_equal(again.lengths, first.lengths)
        runner = jr.EnvRunner(envs, policy, {}, rollout_length=6, seed=SEED)
        runner.sample()
        runner.stop(close_envs=False)
        with jr.EnvRunner(envs, policy, {}, rollout_length=6, seed=SEED) as runner:
            traj = runner.sample()
    with jr.EnvRunner(_envpool(4, 9, **mode), policy, {}, rollout_length=6, seed=SEED) as fresh:
        expected = fresh.sample()
    assert_trees_equal(
        (traj.obs, traj.action, traj.next_obs, traj.valid),
        (expected.obs, expected.action, expected.next_obs, expected.valid),
    )


def test_async_reset_gives_envpools_infos_as_sync_mode() -> None:
    """The infos are EnvPool's in every mode: gymnasium's ``reset`` of async mode gives
    each sub-env's reset info as sync mode does (it gave ``{}`` for every env)."""
    with closing(_envpool(4, seed=SEED)) as sync, closing(_envpool(4, batch_size=2)) as env:
        expected, got = sync.reset(seed=SEED)[1], env.reset(seed=SEED)[1]
    assert "env_id" in expected and sorted(got) == sorted(expected)
    for key in ("env_id", "elapsed_step", "_env_id", "_elapsed_step"):
        np.testing.assert_array_equal(got[key], expected[key], key)


def test_a_pool_raises_glibcs_arena_limit_before_its_threads_allocate() -> None:
    """Each pool's buffer thread allocates while the sampling thread frees; at glibc's own
    limit a later pool's thread shared the sampling thread's arena
    (docs/performance.md, "A later EnvPool pool's malloc arena")."""
    from jaxrunner._src.backends import malloc_arenas

    malloc_arenas.allow_an_arena_per_thread.cache_clear()
    with closing(jr.make_vec("CartPole-v1", 2, "envpool", batch_size=1)):
        assert malloc_arenas.allow_an_arena_per_thread.cache_info().currsize == 1


def test_a_step_recorded_while_the_next_one_runs_is_the_step_recorded_before_it() -> None:
    """EnvPool's answers hold until the next recv, so the lockstep loop records step t
    after sending step t + 1's actions; where per-step callbacks read each step, it
    records first. Both orders sample the same trajectories, sample after sample."""
    envs = _envpool(4)
    assert envs.capabilities.answers_held and envs.capabilities.steps_in_background
    policy = jr.models.mlp_policy(envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)

    class Steps(jr.Callbacks):  # a per-step hook: the loop records each step first
        def on_episode_step(self, runner, env_index, live):
            pass

    got = {}
    for name, callbacks in (("late", None), ("first", Steps())):
        with jr.EnvRunner(_envpool(4), policy, params, 8, seed=SEED, callbacks=callbacks) as r:
            got[name] = [r.sample() for _ in range(3)]
    envs.close()
    for late, first in zip(got["late"], got["first"]):
        assert_trees_equal(late, first, "recorded while the next step runs")


def test_a_send_that_fails_after_a_step_keeps_that_step(monkeypatch) -> None:
    """The 4th send (step 3's actions) raises: steps 0 to 2 were recorded, step 2 after
    that send was tried, and come back as the error's partial trajectory, equal to a
    clean sample's first 3 steps."""
    from jaxrunner._src.backends.envpool import EnvPoolVectorEnv

    policy = jr.models.mlp_policy(gymnasium.spaces.Discrete(2))
    params = policy.init(jax.random.key(0), gymnasium.spaces.Box(-np.inf, np.inf, (4,)))
    with jr.EnvRunner(_envpool(4), policy, params, 8, seed=SEED) as runner:
        clean = runner.sample()
    sends = []
    real = EnvPoolVectorEnv._send_actions

    def failing(self, actions, env_ids, checked):
        sends.append(1)
        if len(sends) == 4:
            raise InvalidArgumentError("step 3's actions refused (the test's)")
        return real(self, actions, env_ids, checked)

    monkeypatch.setattr(EnvPoolVectorEnv, "_send_actions", failing)
    runner = jr.EnvRunner(_envpool(4), policy, params, 8, seed=SEED)
    with runner, pytest.raises(InvalidArgumentError, match="the test's") as caught:
        runner.sample()
    partial = caught.value.partial_trajectory
    assert partial is not None and partial.reward.shape == (3, 4)
    assert_trees_equal(partial, jax.tree.map(lambda x: x[:3], clean), "the steps before it")


@pytest.mark.parametrize("pools", [1, 2])
def test_an_answer_holds_while_the_next_step_runs(pools: int) -> None:
    """``answers_held``: a recv's arrays stay as they were while the next send steps,
    until the next recv (EnvPool writes each step into the adapter's buffers at recv)."""
    import time

    envs = _envpool(4, max_episode_steps=3, **({"num_pools": pools} if pools > 1 else {}))
    assert envs.capabilities.answers_held
    with closing(envs):
        envs.reset_batch([SEED + i for i in range(4)])
        rng = np.random.default_rng(SEED)
        envs.send(rng.integers(0, 2, 4))
        for t in range(8):
            out = envs.recv()
            fields = (out.obs, out.reward, out.terminated, out.truncated, out.reset_rows)
            held = [None if x is None else np.array(x) for x in fields]
            envs.send(rng.integers(0, 2, 4))
            time.sleep(0.005)  # EnvPool's threads step meanwhile
            for x, copy in zip(fields, held):
                np.testing.assert_array_equal(x, copy, f"step {t}: an answer changed")
        envs.recv()


def test_a_stopped_async_runner_lets_go_of_its_last_sample_and_the_one_begun_early(
    mlp: Callable,
) -> None:
    """Async mode begins the next sample's rollout before a sample returns; ``stop()``
    lets go of it and of the last sample's memory (the loop's own views of both)."""
    import weakref

    envs = _envpool(4, batch_size=2)
    policy = mlp(envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    runner = jr.EnvRunner(envs, policy, params, rollout_length=8, seed=SEED)
    runner.sample()
    last = runner.sample()
    (ahead,) = runner.sampler.ready_first.bufs
    blocks = [weakref.ref(last.reward.base), weakref.ref(ahead.traj.env_done.base)]
    assert blocks[0]() is not blocks[1]()
    del last, ahead
    runner.stop()
    assert blocks[0]() is None, "the last sample's memory is still held"
    assert blocks[1]() is None, "the rollout begun early is still held"

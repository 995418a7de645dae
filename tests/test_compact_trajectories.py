"""Compact trajectories (``EnvRunner(compact_next_obs=True)``) and buffer reuse
(``EnvRunner.release``): the same transitions, bit for bit, as the dense buffers of a
runner without them, on every host sampler, with restarts, reset steps, callbacks, a
CNN on images and a Box-action MLP."""

from __future__ import annotations

import weakref
from typing import Any

import chex
import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import short_cartpole
from shuffled_sync import ShuffledSync
from test_batch_invariance import CASES

import jaxrunner as jr
from jaxrunner._src.core.time_major import concatenate_envs
from jaxrunner.errors import InvalidArgumentError, JaxRunnerError
from jaxrunner.models import mlp_policy
from jaxrunner.testing import FaultPlan, InjectedError, faulty_env_fns

SEED, NUM_ENVS = 5, 4


def _runner(envs: Any, case: str = "cartpole", steps: int = 13, **kwargs: Any) -> jr.EnvRunner:
    if case == "cartpole":
        policy = mlp_policy(envs.single_action_space, hidden=(8,))
        params = policy.init(jax.random.key(0), envs.single_observation_space)
    else:
        policy, params = CASES[case][1]()
        steps = CASES[case][2]
    return jr.EnvRunner(envs, policy, params, steps, SEED, **kwargs)


def _samples(make_envs: Any, num: int = 3, case: str = "cartpole", **kwargs: Any) -> list:
    with _runner(make_envs(), case, **kwargs) as runner:
        return [runner.sample() for _ in range(num)]


def _counted_cartpole() -> gymnasium.Env:
    """Short CartPole whose infos report each episode at its end (``"episode.l"``)."""
    return gymnasium.wrappers.RecordEpisodeStatistics(short_cartpole())


def _faulty_envs() -> jr.SyncVectorEnv:
    faults = {1: [FaultPlan(kind="raise", at=(4,))], 2: [FaultPlan(kind="bad_obs", at=(6, 20))]}
    fns = faulty_env_fns(_counted_cartpole, NUM_ENVS, faults, seed=1)
    return jr.SyncVectorEnv(fns, restart_policy=jr.RestartPolicy())


BACKENDS = {
    "sync": lambda: jr.make_vec(short_cartpole, NUM_ENVS),
    "sync-restarts": _faulty_envs,
    "ready-first": lambda: ShuffledSync([_counted_cartpole] * NUM_ENVS, 2, buckets=(NUM_ENVS,)),
    "process": lambda: jr.make_vec(
        short_cartpole, NUM_ENVS, "process", config=jr.ProcessConfig(num_workers=2)
    ),
    "process-ready-first": lambda: jr.make_vec(
        short_cartpole,
        NUM_ENVS,
        "process",
        config=jr.ProcessConfig(num_workers=2, ready_first=True),
    ),
}


def _check_compact(compact: jr.Trajectory, dense: jr.Trajectory) -> None:
    assert compact.is_compact and not dense.is_compact
    chex.assert_trees_all_equal(compact.dense(), dense)
    stored = np.zeros(dense.reward.shape, bool).reshape(-1)
    stored[compact.next_obs_store.index] = True
    stored = stored.reshape(dense.reward.shape)
    # What is stored: the last step, and where the next step acts on another observation.
    assert stored[-1].all()
    needed = dense.done | ~dense.valid
    assert (stored[:-1] == needed[:-1]).all()
    assert stored.sum() < stored.size  # it is compact


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_compact_next_obs_equals_the_dense_one(backend: str) -> None:
    dense = _samples(BACKENDS[backend])
    compact = _samples(BACKENDS[backend], compact_next_obs=True)
    for c, d in zip(compact, dense):
        _check_compact(c, d)
    if backend == "sync-restarts":  # restarts did happen
        assert not all(d.valid.all() for d in dense)


@pytest.mark.parametrize("case", ["cnn", "pendulum"])
def test_compact_next_obs_with_a_cnn_and_box_actions(case: str) -> None:
    make_envs = lambda: jr.make_vec(CASES[case][0], NUM_ENVS)  # noqa: E731
    dense = _samples(make_envs, 2, case)
    compact = _samples(make_envs, 2, case, compact_next_obs=True)
    for c, d in zip(compact, dense):
        _check_compact(c, d)
    obs = dense[0].obs
    assert compact[0].next_obs_store.obs.nbytes < obs.nbytes / 2  # the memory saved


def test_compact_slices_joins_episodes_and_files(tmp_path: Any) -> None:
    make_envs = BACKENDS["sync-restarts"]
    (c1, c2), (d1, d2) = _samples(make_envs, 2, compact_next_obs=True), _samples(make_envs, 2)
    for start, stop in [(0, 1), (2, 9), (0, 13), (12, 13), (5, 5)]:
        chex.assert_trees_all_equal(c1.time_slice(start, stop).dense(), d1.time_slice(start, stop))
    joined = jr.concatenate([c1, c2])
    assert joined.is_compact
    chex.assert_trees_all_equal(joined.dense(), jr.concatenate([d1, d2]))
    chex.assert_trees_all_equal(jr.concatenate([c1, d2]), jr.concatenate([d1, d2]))
    for ce, de in zip(c1.split_episodes(), d1.split_episodes(), strict=True):
        chex.assert_trees_all_equal(ce, de)
    c1.save(tmp_path / "c.npz")
    chex.assert_trees_all_equal(jr.Trajectory.load(tmp_path / "c.npz"), d1)


def test_replacing_the_obs_of_a_compact_trajectory_keeps_its_next_obs() -> None:
    make_envs = BACKENDS["sync-restarts"]
    compact, dense = _samples(make_envs, 1, compact_next_obs=True)[0], _samples(make_envs, 1)[0]
    obs = dense.obs + 1.0
    chex.assert_trees_all_equal(compact.replace(obs=obs).dense(), dense.replace(obs=obs))
    chex.assert_trees_all_equal(compact.replace(reward=dense.reward).dense(), dense)


def test_next_value_evaluates_only_the_stored_rows() -> None:
    compact, dense = (
        _samples(BACKENDS["sync"], 1, compact_next_obs=True)[0],
        _samples(BACKENDS["sync"], 1)[0],
    )
    weights = jnp.arange(1.0, 5.0)
    seen: list[int] = []

    def value_fn(obs: Any) -> jax.Array:
        seen.append(len(obs))
        return jnp.asarray(obs, jnp.float32) @ weights

    expected = value_fn(dense.next_obs.reshape(-1, 4)).reshape(dense.reward.shape)
    seen.clear()
    value = value_fn(dense.obs.reshape(-1, 4)).reshape(dense.reward.shape)
    got = compact.next_value(value, value_fn)
    np.testing.assert_array_equal(got, expected)
    rows = len(compact.next_obs_store.index)
    assert seen[-1] == min(max(16, 1 << (rows - 1).bit_length()), dense.reward.size)
    assert rows < dense.reward.size
    np.testing.assert_array_equal(dense.next_value(value, value_fn), expected)
    # A value or a value_fn of another shape is named, on either kind of trajectory (a
    # dense one used to ignore the value, a compact one to fail inside a reshape).
    for traj in (compact, dense):
        with pytest.raises(InvalidArgumentError, match=r"next_value\(value=...\): expected"):
            traj.next_value(value[1:], value_fn)
        with pytest.raises(InvalidArgumentError, match=r"next_value\(value_fn=...\): returned"):
            traj.next_value(value, lambda obs: jnp.zeros(2))
        column = traj.next_value(value, lambda obs: value_fn(obs)[:, None])  # [N, 1]: fine
        np.testing.assert_array_equal(column, expected)


def test_a_jitted_critic_compiles_for_a_few_shapes_only() -> None:
    """The stored rows are padded to powers of two: a learner's jit sees a few shapes, not
    one per number of episode ends."""
    samples = _samples(BACKENDS["sync-restarts"], 12, compact_next_obs=True)
    traces: list[int] = []

    @jax.jit
    def value_fn(obs: Any) -> jax.Array:
        traces.append(obs.shape[0])
        return jnp.asarray(obs, jnp.float32).sum(-1)

    rows = set()
    for traj in samples:
        rows.add(len(traj.next_obs_store.index))
        value = jnp.zeros(traj.reward.shape)
        got = traj.next_value(value, value_fn)
        want = jnp.asarray(traj.dense().next_obs, jnp.float32).sum(-1)
        stored = traj.next_obs_store.index
        np.testing.assert_array_equal(
            np.asarray(got).reshape(-1)[stored], np.asarray(want).reshape(-1)[stored]
        )
    assert len(rows) > len(traces) >= 1, (rows, traces)


class _Recorder(jr.Callbacks):
    def __init__(self) -> None:
        self.episodes: list[Any] = []
        self.last_obs: list[Any] = []

    def on_episode_step(self, runner: Any, env_index: int, episode: Any) -> None:
        self.last_obs.append(np.array(episode.obs[-1]))  # read while the sample runs

    def on_episode_end(self, runner: Any, env_index: int, episode: Any) -> None:
        self.episodes.append(episode.to_episode())


def test_callbacks_see_the_same_episodes_with_compact_buffers() -> None:
    seen = {}
    for compact in (False, True):
        callbacks = _Recorder()
        _samples(BACKENDS["sync-restarts"], 3, callbacks=callbacks, compact_next_obs=compact)
        seen[compact] = callbacks
    assert seen[True].episodes
    for a, b in zip(seen[True].episodes, seen[False].episodes, strict=True):
        chex.assert_trees_all_equal(a, b)
    np.testing.assert_array_equal(seen[True].last_obs, seen[False].last_obs)


def test_a_failed_compact_sample_keeps_its_steps() -> None:
    def broken() -> Any:
        fns = faulty_env_fns(short_cartpole, NUM_ENVS, {2: [FaultPlan(kind="raise", at=(9,))]})
        return jr.SyncVectorEnv(fns)

    partial = {}
    for compact in (False, True):
        with _runner(broken(), compact_next_obs=compact) as runner:
            with pytest.raises(JaxRunnerError) as info:
                runner.sample()
            assert isinstance(info.value.__cause__, InjectedError)
            partial[compact] = info.value.partial_trajectory
    assert partial[True].is_compact and partial[True].num_steps == partial[False].num_steps > 0
    chex.assert_trees_all_equal(partial[True].dense(), partial[False])


# -- buffer reuse -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sync-restarts", "ready-first"])
@pytest.mark.parametrize("compact", [False, True])
def test_released_buffers_are_reused_and_change_nothing(backend: str, compact: bool) -> None:
    keys = ("episode.l",)
    reference = [t.dense() for t in _samples(BACKENDS[backend], 4, info_keys=keys)]
    with _runner(BACKENDS[backend](), info_keys=keys, compact_next_obs=compact) as runner:
        got, arrays = [], set()
        for _ in range(4):
            traj = runner.sample()
            arrays.add(id(traj.obs))
            got.append(jax.tree.map(np.copy, traj.dense()))
            runner.release(traj)
    for g, r in zip(got, reference):
        chex.assert_trees_all_equal(g, r)
    assert any(g.extras["infos_present"]["episode.l"].any() for g in got)
    assert len(arrays) <= 2  # the same memory, sample after sample (two: ready-first's)


@pytest.mark.parametrize("backend", ["sync", "sync-restarts", "ready-first"])
@pytest.mark.parametrize("compact", [False, True])
def test_dropped_samples_are_reused_and_change_nothing(backend: str, compact: bool) -> None:
    # A sample the caller drops (and every array of it) is written again, with no
    # release(): a later sample's arrays view an earlier one's block of memory.
    reference = [t.dense() for t in _samples(BACKENDS[backend], 6)]  # all held: fresh ones
    with _runner(BACKENDS[backend](), compact_next_obs=compact) as runner:
        got, blocks, reused = [], [], 0
        for _ in range(6):
            traj = runner.sample()
            reused += any(ref() is traj.reward.base for ref in blocks)
            blocks.append(weakref.ref(traj.reward.base))
            got.append(jax.tree.map(np.copy, traj.dense()))
            del traj
    for g, r in zip(got, reference, strict=True):
        chex.assert_trees_all_equal(g, r)
    # (fewer where a fault's traceback holds a sample until Python's garbage collector runs)
    assert reused >= (1 if backend == "sync-restarts" else 3), reused


_HOLDERS = {
    "a view": lambda t: t.obs[3:7, 1],
    "one array": lambda t: t.reward,
    "a time slice": lambda t: t.time_slice(2, 5),
    "a JAX array on its memory": lambda t: jax.device_put(t.obs, jax.devices("cpu")[0]),
}


@pytest.mark.parametrize("holder", list(_HOLDERS))
def test_what_the_caller_holds_of_a_sample_is_never_written_again(holder: str) -> None:
    with _runner(BACKENDS["sync"]()) as runner:
        traj = runner.sample()
        held = _HOLDERS[holder](traj)
        if holder.startswith("a JAX"):  # JAX on a CPU reads the sample's memory in place
            assert held.unsafe_buffer_pointer() == traj.obs.ctypes.data
        before = jax.tree.map(np.array, held)
        block = weakref.ref(traj.reward.base)
        del traj
        for _ in range(4):
            assert runner.sample().reward.base is not block()
        chex.assert_trees_all_equal(jax.tree.map(np.asarray, held), before)


def test_a_sample_written_into_a_released_one_is_reused_once_dropped() -> None:
    with _runner(BACKENDS["sync"]()) as runner:
        runner.release(runner.sample())
        second = runner.sample()  # into the released one's memory
        block = weakref.ref(second.reward.base)
        del second
        assert any(runner.sample().reward.base is block() for _ in range(3))


@pytest.mark.parametrize("how", ["dropped", "released"])
def test_a_stopped_runner_lets_go_of_what_it_kept_for_reuse(how: str) -> None:
    runner = _runner(BACKENDS["sync"]())
    first = runner.sample()
    block = weakref.ref(first.reward.base)
    runner.sample()  # the latest sample's memory is the loop's too; the first's is not
    if how == "released":
        runner.release(first)
    del first
    assert block() is not None  # kept for a later sample
    runner.stop()
    assert block() is None


@pytest.mark.parametrize("backend", ["sync", "ready-first"])
def test_a_stopped_runner_lets_go_of_its_last_sample_too(backend: str) -> None:
    # The loop keeps views of the latest sample (the rows its episodes read, the leaves
    # its steps write) until the next one: stop() drops them.
    runner = _runner(BACKENDS[backend]())
    runner.sample()
    last = runner.sample()
    block = weakref.ref(last.reward.base)
    del last
    runner.stop()
    assert block() is None


def test_release_refuses_what_it_did_not_hand_out() -> None:
    with _runner(BACKENDS["sync"]()) as runner, _runner(BACKENDS["sync"]()) as other:
        traj = runner.sample()
        for wrong in (traj.time_slice(0, 2), jax.tree.map(np.copy, traj), other.sample(), None):
            with pytest.raises(InvalidArgumentError, match="release"):
                runner.release(wrong)  # type: ignore[arg-type]
        runner.release(traj)
        with pytest.raises(InvalidArgumentError, match="released already"):
            runner.release(traj)


def test_release_of_a_trajectory_whose_buffers_were_reused_is_refused() -> None:
    reference = _samples(BACKENDS["sync"], 3)
    with _runner(BACKENDS["sync"]()) as runner:
        first = runner.sample()
        runner.release(first)
        second = runner.sample()  # in first's arrays
        with pytest.raises(InvalidArgumentError, match="released already"):
            runner.release(first)
        kept = jax.tree.map(np.copy, second)
        third = runner.sample()
        chex.assert_trees_all_equal(second, kept)  # not overwritten by the third
        chex.assert_trees_all_equal(second, reference[1])
        chex.assert_trees_all_equal(third, reference[2])


_NOT_THE_RUNNERS = {
    "device obs": lambda t: t.replace(obs=jnp.asarray(t.obs)),
    "wrong-shaped obs": lambda t: t.replace(obs=np.zeros((2, 2, 4), t.obs.dtype)),
    "read-only obs": lambda t: t.replace(obs=np.broadcast_to(t.obs[:1], t.obs.shape)),
    "list obs": lambda t: t.replace(obs=t.obs.tolist()),
    "caller's own obs": lambda t: t.replace(obs=np.zeros_like(t.obs)),
    "extras entry replaced": lambda t: t.extras.update(log_prob=np.zeros(t.reward.shape)),
    "reward made read-only": lambda t: t.reward.setflags(write=False),
}


@pytest.mark.parametrize("change", list(_NOT_THE_RUNNERS))
def test_release_refuses_arrays_that_are_not_the_runners_and_keeps_working(change: str) -> None:
    reference = _samples(BACKENDS["sync"], 2)
    with _runner(BACKENDS["sync"]()) as runner:
        traj = runner.sample()
        changed = _NOT_THE_RUNNERS[change](traj) or traj  # a new trajectory, or traj changed
        before = jax.tree.map(np.array, changed)
        with pytest.raises(InvalidArgumentError, match=r"release\(traj\)"):
            runner.release(changed)
        chex.assert_trees_all_equal(runner.sample(), reference[1])
        chex.assert_trees_all_equal(changed, before)  # the caller's arrays left alone


def test_reused_buffers_rewrite_the_env_ids() -> None:
    reference = _samples(BACKENDS["sync"], 3)
    with _runner(BACKENDS["sync"]()) as runner:
        for expected in reference:
            traj = runner.sample()
            chex.assert_trees_all_equal(traj, expected)
            traj.env_id[:] += 100
            traj.valid[:] = False
            runner.release(traj)


def test_pure_jax_envs_refuse_compact_buffers_and_release() -> None:
    venv = jr.JaxVectorEnv(jr.testing.RandomWalk(), num_envs=2)
    policy = mlp_policy(venv.single_action_space, hidden=(4,))
    params = policy.init(jax.random.key(0), venv.single_observation_space)
    with pytest.raises(InvalidArgumentError, match="compact_next_obs"):
        jr.EnvRunner(venv, policy, params, 4, 0, compact_next_obs=True)
    with (
        jr.EnvRunner(venv, policy, params, 4, 0) as runner,
        pytest.raises(InvalidArgumentError, match="device"),
    ):
        runner.release(runner.sample())


def test_runner_groups_join_compact_samples_along_envs() -> None:
    """EnvRunnerGroup joins its runners' samples along the env axis
    (``concatenate_envs``): compact ones stay compact and equal the dense join."""
    widths = (2, 3)
    make = [lambda b=b: jr.make_vec(short_cartpole, b) for b in widths]
    compact = [_samples(m, 1, compact_next_obs=True)[0] for m in make]
    dense = [_samples(m, 1)[0] for m in make]
    joined = concatenate_envs(compact)
    assert joined.is_compact and joined.num_envs == sum(widths)
    chex.assert_trees_all_equal(joined.dense(), concatenate_envs(dense))


def test_compact_samples_hold_no_dense_next_obs_and_a_released_one_is_written_again() -> None:
    """Each sample held has memory of its own (a block its arrays view), which holds a
    dense ``next_obs`` where the runner is not compact (a compact one writes it into one
    scratch for all its samples); a released sample's memory is the next one's."""
    block_bytes = {}
    for compact in (False, True):
        with _runner(BACKENDS["sync"](), compact_next_obs=compact) as runner:
            held = [runner.sample() for _ in range(3)]
            released = held[-1].obs.base
            runner.release(held.pop())
            held.append(runner.sample())
            assert held[-1].obs.base is released
            assert len({id(t.obs.base) for t in held}) == 3
            block_bytes[compact] = held[0].obs.base.nbytes
    # [T, B] float32 CartPole observations, 832 bytes (a multiple of the 64-byte alignment)
    assert block_bytes[False] - block_bytes[True] == 13 * NUM_ENVS * 4 * 4


# -- multi-agent envs: each group's next_obs stored only where it is not the obs at the
# slot's next valid row (its next turn) -------------------------------------------------------


def _ma_envs(name: str) -> Any:
    from tests import multi_agent_envs as ma

    factory = {
        "mpe": ma.simple_spread,
        "coming-and-going": ma.coming_and_going,
        "aec": ma.relay,
        "aec-masked": ma.tictactoe,
    }.get(name)
    if name == "restarts":
        fault = FaultPlan(kind="raise", at=(4,))
        fns = faulty_env_fns(ma.coming_and_going, 3, {1: [fault]}, agent="a1")
        return jr.make_vec(fns, 3, restart_policy=jr.RestartPolicy())
    if name == "process":
        return jr.make_vec(ma.relay, 3, "process", config=jr.ProcessConfig(num_workers=2))
    return jr.make_vec(factory, 3)


def _ma_samples(name: str, num: int = 3, **kwargs: Any) -> list[jr.MultiAgentTrajectory]:
    from tests.test_multi_agent import random_policy, zero_params

    envs = _ma_envs(name)
    (n,) = {int(g.action_space.n) for g in envs.groups}
    params = {g.policy_id: zero_params(n) for g in envs.groups}
    policy = random_policy(n, masked=name == "aec-masked")
    with jr.EnvRunner(envs, policy, params, 11, SEED, **kwargs) as runner:
        return [runner.sample() for _ in range(num)]


MA_CASES = ["mpe", "coming-and-going", "aec", "aec-masked", "restarts", "process"]


@pytest.mark.parametrize("name", MA_CASES)
def test_multi_agent_compact_next_obs_equals_the_dense_one(name: str) -> None:
    pytest.importorskip("pettingzoo")
    dense, compact = _ma_samples(name), _ma_samples(name, compact_next_obs=True)
    for c, d in zip(compact, dense, strict=True):
        assert c.is_compact and not d.is_compact
        chex.assert_trees_all_equal(c.dense(), d)
        for pid, group in d.groups.items():
            stored = np.zeros(group.reward.size, bool)
            stored[c.groups[pid].next_obs_store.index] = True
            stored = stored.reshape(group.reward.shape)
            # Every slot whose agent does not act again in the sample is stored; an agent
            # that goes on acts next on the next_obs it was given, which is not stored.
            later = np.flip(np.logical_or.accumulate(np.flip(group.valid, 0), 0), 0)
            last_turn = group.valid & ~np.concatenate([later[1:], later[:1] & False])
            assert stored[last_turn].all()
            goes_on = group.valid & ~group.done & ~last_turn
            if name not in ("restarts", "aec", "process"):  # no fault, no dead step
                assert not stored[goes_on].any()
            assert stored.sum() < group.valid.sum()  # it is compact
    if name == "restarts":  # a restart did happen
        assert any(d.valid is not None and not d.valid.all() for d in dense)


@pytest.mark.parametrize("name", ["coming-and-going", "aec", "restarts"])
def test_multi_agent_compact_slices_joins_episodes_files_and_values(
    name: str, tmp_path: Any
) -> None:
    pytest.importorskip("pettingzoo")
    dense, compact = _ma_samples(name), _ma_samples(name, compact_next_obs=True)
    d, c = jr.concatenate(dense), jr.concatenate(compact)
    assert c.is_compact
    chex.assert_trees_all_equal(c.dense(), d)
    chex.assert_trees_all_equal(jr.concatenate([compact[0], dense[1]]), jr.concatenate(dense[:2]))
    # A sample without an env-level valid (a scan's with no failed step) first: filled in.
    joined = jr.concatenate([dense[1].replace(valid=None), dense[0]])
    np.testing.assert_array_equal(
        joined.valid, np.concatenate([np.ones_like(dense[0].valid), dense[0].valid])
    )
    for start, stop in [(0, 1), (2, 9), (0, 33), (10, 24), (32, 33), (5, 5)]:
        part = c.time_slice(start, stop)
        assert part.is_compact or start == stop
        chex.assert_trees_all_equal(part.dense(), d.time_slice(start, stop))
    joined = concatenate_envs(compact)  # an EnvRunnerGroup's join
    assert joined.is_compact
    chex.assert_trees_all_equal(joined.dense(), concatenate_envs(dense))
    for ce, de in zip(c.split_episodes(), d.split_episodes(), strict=True):
        chex.assert_trees_all_equal(ce, de)
    c.save(tmp_path / "c.npz")
    chex.assert_trees_all_equal(jr.MultiAgentTrajectory.load(tmp_path / "c.npz"), d)
    seen: list[int] = []

    def value_fn(obs: Any) -> jax.Array:
        seen.append(len(obs))
        return jnp.asarray(obs, jnp.float32).sum(-1) * 0.5 + 1.0

    for pid, group in d.groups.items():
        lead = group.reward.shape
        value = value_fn(group.obs.reshape(-1, *group.obs.shape[3:])).reshape(lead)
        expected = value_fn(group.next_obs.reshape(-1, *group.obs.shape[3:])).reshape(lead)
        got = c.groups[pid].next_value(value, value_fn)
        # Equal where there is a transition; elsewhere both are meaningless.
        np.testing.assert_array_equal(np.asarray(got)[group.valid], expected[group.valid])
        assert seen[-1] < group.reward.size  # the stored rows only, padded


def test_multi_agent_compact_buffers_are_released_and_a_failed_sample_keeps_its_steps() -> None:
    pytest.importorskip("pettingzoo")
    from tests import multi_agent_envs as ma
    from tests.test_multi_agent import random_policy, zero_params

    reference = _ma_samples("restarts", 4)
    envs = _ma_envs("restarts")
    params = {g.policy_id: zero_params(3) for g in envs.groups}
    with jr.EnvRunner(envs, random_policy(3), params, 11, SEED, compact_next_obs=True) as runner:
        for expected in reference:
            traj = runner.sample()
            chex.assert_trees_all_equal(traj.dense(), expected)
            runner.release(traj)  # the next sample reuses its arrays, not its store
    partial = {}
    for compact in (False, True):
        fns = faulty_env_fns(ma.coming_and_going, 2, {1: [FaultPlan(kind="raise", at=(6,))]})
        envs = jr.make_vec(fns, 2)
        with jr.EnvRunner(
            envs, random_policy(3), params, 11, SEED, compact_next_obs=compact
        ) as runner:
            with pytest.raises(JaxRunnerError) as info:
                runner.sample()
            partial[compact] = info.value.partial_trajectory
    assert partial[True].is_compact and partial[True].num_steps == partial[False].num_steps > 0
    chex.assert_trees_all_equal(partial[True].dense(), partial[False])


def test_pure_jax_multi_agent_envs_refuse_compact_buffers() -> None:
    from tests.test_multi_agent_jax import Drift, random_policy

    envs = jr.multi_agent.JaxMultiAgentVectorEnv(Drift(), 2)
    params = {"w": jnp.zeros(3)}
    with pytest.raises(InvalidArgumentError, match="compact_next_obs"):
        jr.EnvRunner(envs, random_policy(3), params, 4, 0, compact_next_obs=True)

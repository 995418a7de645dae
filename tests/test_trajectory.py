"""Tests for jaxrunner._src.core.trajectory: save/load, split_episodes, concatenate."""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from typing import Any

import jax
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxrunner as jr
from jaxrunner._src import space_arrays
from jaxrunner._src.core.episode import Episode
from jaxrunner._src.core.trajectory import Trajectory
from tests.special_files import refusal_and_peak, special_path

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- strategies ------------------------------------------------------------------------------

FLOAT_DTYPES = (np.float32, np.float64)
INT_DTYPES = (np.int8, np.uint8, np.int32, np.int64)
SHAPES = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)
KEYS = st.sampled_from(["a", "b", "obs", "pos", "image", "z"])


@st.composite
def box_spaces(draw: st.DrawFn) -> spaces.Box:
    shape = draw(SHAPES)
    dtype = draw(st.sampled_from(FLOAT_DTYPES + INT_DTYPES))
    if np.issubdtype(dtype, np.floating):
        if draw(st.booleans()):
            return spaces.Box(-np.inf, np.inf, shape=shape, dtype=dtype)
        return spaces.Box(-2.0, 3.0, shape=shape, dtype=dtype)
    if np.issubdtype(dtype, np.unsignedinteger):
        return spaces.Box(0, 255, shape=shape, dtype=dtype)
    return spaces.Box(-5, 7, shape=shape, dtype=dtype)


@st.composite
def discrete_spaces(draw: st.DrawFn) -> spaces.Discrete:
    return spaces.Discrete(draw(st.integers(1, 5)), start=draw(st.integers(-3, 3)))


@st.composite
def multi_discrete_spaces(draw: st.DrawFn) -> spaces.MultiDiscrete:
    shape = draw(st.sampled_from([(1,), (3,), (2, 2)]))
    size = int(np.prod(shape))
    nvec = np.array(draw(st.lists(st.integers(1, 4), min_size=size, max_size=size)))
    start = np.array(draw(st.lists(st.integers(-2, 2), min_size=size, max_size=size)))
    return spaces.MultiDiscrete(nvec.reshape(shape), start=start.reshape(shape))


@st.composite
def multi_binary_spaces(draw: st.DrawFn) -> spaces.MultiBinary:
    if draw(st.booleans()):
        return spaces.MultiBinary(draw(st.integers(1, 4)))
    return spaces.MultiBinary(list(draw(st.sampled_from([(2, 3), (1, 2)]))))


LEAF_SPACES = st.one_of(
    box_spaces(), discrete_spaces(), multi_discrete_spaces(), multi_binary_spaces()
)


def composite_spaces(children: st.SearchStrategy[spaces.Space]) -> st.SearchStrategy:
    dicts = st.dictionaries(KEYS, children, min_size=1, max_size=3).map(spaces.Dict)
    tuples = st.lists(children, min_size=1, max_size=3).map(lambda xs: spaces.Tuple(xs))
    return st.one_of(dicts, tuples)


DEPTH_1 = composite_spaces(LEAF_SPACES)
DEPTH_2 = composite_spaces(st.one_of(LEAF_SPACES, DEPTH_1))
SPACES = st.one_of(LEAF_SPACES, DEPTH_1, DEPTH_2)


def fill(space: spaces.Space, buffer: Any, index: tuple[int, int]) -> None:
    """Writes one sample of ``space`` (seeded beforehand) into ``buffer[index]``."""
    space_arrays.copy_into(space, buffer, space.sample(), index)


@st.composite
def trajectories(
    draw: st.DrawFn,
    obs_space: spaces.Space | None = None,
    action_space: spaces.Space | None = None,
    num_envs: int | None = None,
    with_value: bool | None = None,
    min_steps: int = 1,
) -> Trajectory:
    """A consistent trajectory: per env, next_obs[t] == obs[t + 1] unless the episode
    ended at t; a new episode id (runner-wide counter) and step 0 after each end."""
    obs_space = draw(SPACES) if obs_space is None else obs_space
    action_space = draw(SPACES) if action_space is None else action_space
    T = draw(st.integers(min_steps, 6))
    B = draw(st.integers(1, 4)) if num_envs is None else num_envs
    with_value = draw(st.booleans()) if with_value is None else with_value
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    obs_space.seed(seed)
    action_space.seed(seed + 1)

    terminated = np.array(draw(st.lists(st.booleans(), min_size=T * B, max_size=T * B)))
    truncated = np.array(draw(st.lists(st.booleans(), min_size=T * B, max_size=T * B)))
    terminated, truncated = terminated.reshape(T, B), truncated.reshape(T, B)
    first_steps = np.array(draw(st.lists(st.integers(0, 5), min_size=B, max_size=B)))
    env_offset = draw(st.integers(0, 3))

    obs = space_arrays.allocate(obs_space, (T, B))
    next_obs = space_arrays.allocate(obs_space, (T, B))
    action = space_arrays.allocate(action_space, (T, B))
    episode_id = np.zeros((T, B), np.int64)
    step = np.zeros((T, B), np.int64)

    current_id = np.arange(B, dtype=np.int64)
    current_step = first_steps.astype(np.int64)
    next_id = B
    current_obs = [obs_space.sample() for _ in range(B)]
    for t in range(T):
        for b in range(B):
            space_arrays.copy_into(obs_space, obs, current_obs[b], (t, b))
            fill(action_space, action, (t, b))
            final = obs_space.sample()
            space_arrays.copy_into(obs_space, next_obs, final, (t, b))
            episode_id[t, b] = current_id[b]
            step[t, b] = current_step[b]
            current_obs[b] = final
        for b in range(B):
            if terminated[t, b] or truncated[t, b]:
                current_id[b], next_id = next_id, next_id + 1
                current_step[b] = 0
                current_obs[b] = obs_space.sample()  # the reset observation
            else:
                current_step[b] += 1

    extras = {"log_prob": rng.normal(size=(T, B)).astype(np.float32)}
    if with_value:
        extras["value"] = rng.normal(size=(T, B)).astype(np.float32)
    return Trajectory(
        obs=obs,
        action=action,
        reward=rng.normal(size=(T, B)),
        terminated=terminated,
        truncated=truncated,
        next_obs=next_obs,
        extras=extras,
        env_id=np.broadcast_to(np.arange(B, dtype=np.int64) + env_offset, (T, B)).copy(),
        episode_id=episode_id,
        step=step,
    )


@st.composite
def trajectory_pairs(draw: st.DrawFn) -> tuple[Trajectory, Trajectory]:
    """Two trajectories of the same spaces and envs."""
    obs_space, action_space = draw(SPACES), draw(SPACES)
    B, with_value = draw(st.integers(1, 4)), draw(st.booleans())
    make = trajectories(obs_space, action_space, num_envs=B, with_value=with_value)
    return draw(make), draw(make)


# -- helpers ---------------------------------------------------------------------------------


def assert_trees_equal(got: Any, want: Any) -> None:
    """Same pytree structure; every leaf a numpy array of the same dtype, shape, values."""
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert isinstance(g, np.ndarray), type(g)
        assert g.dtype == np.asarray(w).dtype
        assert g.shape == np.shape(w)
        np.testing.assert_array_equal(g, w)


def rows(tree: Any, index: Any) -> Any:
    return jax.tree.map(lambda x: x[index], tree)


def assert_episodes_equal(got: Episode, want: Episode) -> None:
    assert_trees_equal(got, want)  # obs, action, reward, extras
    for field in ("terminated", "truncated", "episode_id", "env_id", "start_step"):
        assert getattr(got, field) == getattr(want, field), field


# -- save / load -----------------------------------------------------------------------------


@SETTINGS
@given(traj=trajectories())
def test_save_load_round_trip(traj: Trajectory) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "traj.npz")
        traj.save(path)
        loaded = Trajectory.load(path)
        assert isinstance(loaded, Trajectory)
        assert_trees_equal(loaded, traj)
        # Plain arrays only: the file loads without pickle.
        with np.load(path, allow_pickle=False) as data:
            for name in data.files:
                assert data[name].dtype != object


def test_save_load_empty_extras_and_zero_steps(tmp_path: Any) -> None:
    traj = _hand_trajectory().time_slice(2, 2).replace(extras={})
    traj.save(tmp_path / "empty.npz")
    loaded = Trajectory.load(tmp_path / "empty.npz")
    assert loaded.extras == {}
    assert_trees_equal(loaded, traj)


def test_save_load_path_without_npz_suffix(tmp_path: Any) -> None:
    traj = _hand_trajectory()
    traj.save(tmp_path / "traj")
    assert_trees_equal(Trajectory.load(tmp_path / "traj"), traj)


def test_save_and_load_take_paths_only_and_a_failed_save_leaves_nothing(tmp_path: Any) -> None:
    traj = _hand_trajectory()
    read, write = os.pipe()  # an int is a file descriptor to open(): never written to
    try:
        with pytest.raises(TypeError, match=r"Trajectory.save\(path=\d+\): expected a file path"):
            traj.save(write)
        with pytest.raises(TypeError, match=r"Trajectory.load\(path=\d+\): expected a file path"):
            Trajectory.load(read)
        os.write(write, b"still open")
    finally:
        os.close(read), os.close(write)
    with pytest.raises(ValueError, match=r"Trajectory.save\('.*nowhere.*'\): the folder"):
        traj.save(tmp_path / "nowhere" / "t.npz")
    (tmp_path / "a_folder").mkdir()
    with pytest.raises(ValueError, match=r"a_folder'\): that is a folder; give a file's path"):
        traj.save(tmp_path / "a_folder")  # before anything is written aside
    with pytest.MonkeyPatch.context() as patch:  # written aside, then the rename fails
        patch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk")))
        with pytest.raises(OSError, match="disk"):
            traj.save(tmp_path / "t.npz")
    assert [p.name for p in tmp_path.iterdir()] == ["a_folder"]


def test_load_rejects_foreign_npz(tmp_path: Any) -> None:
    path = tmp_path / "other.npz"
    np.savez(path, x=np.arange(3))
    with pytest.raises(ValueError, match="not a jaxrunner trajectory"):
        Trajectory.load(path)


def test_load_rejects_wrong_format_or_version(tmp_path: Any) -> None:
    path = tmp_path / "other.npz"
    spec = {"format": "someone.Else", "version": 1, "fields": {}}
    np.savez(path, __spec__=np.array(json.dumps(spec)))
    with pytest.raises(ValueError, match="expected format"):
        Trajectory.load(path)

    traj = _hand_trajectory()
    traj.save(tmp_path / "ok.npz")
    with np.load(tmp_path / "ok.npz", allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    spec = json.loads(str(arrays.pop("__spec__")))
    spec["version"] = 999
    np.savez(tmp_path / "future.npz", __spec__=np.array(json.dumps(spec)), **arrays)
    with pytest.raises(ValueError, match="version"):
        Trajectory.load(tmp_path / "future.npz")


def test_saved_file_loads_without_pickle(tmp_path: Any) -> None:
    traj = _hand_trajectory()
    path = tmp_path / "traj.npz"
    traj.save(path)
    with np.load(path, allow_pickle=False) as data:
        assert "__spec__" in data.files
        for name in data.files:
            data[name]  # raises if an array needed pickle


# -- split_episodes --------------------------------------------------------------------------


@SETTINGS
@given(traj=trajectories())
def test_split_episodes_partitions(traj: Trajectory) -> None:
    episodes = traj.split_episodes()
    seen = np.zeros((traj.num_steps, traj.num_envs), np.int64)
    done = traj.done
    order = []
    for ep in episodes:
        assert isinstance(ep, Episode)
        where = np.argwhere(traj.episode_id == ep.episode_id)
        ts, bs = where[:, 0], where[:, 1]
        assert np.all(bs == bs[0]), "an episode id spans two envs"
        b = int(bs[0])
        np.testing.assert_array_equal(ts, np.arange(ts[0], ts[0] + ep.length))
        first, last = int(ts[0]), int(ts[-1])
        order.append((b, first))
        seen[ts, b] += 1

        assert ep.env_id == traj.env_id[first, b]
        assert ep.start_step == traj.step[first, b]
        assert ep.terminated == traj.terminated[last, b]
        assert ep.truncated == traj.truncated[last, b]
        assert ep.is_done == done[last, b]
        assert ep.is_complete == (done[last, b] and traj.step[first, b] == 0)
        # Only the last episode of an env may still be running.
        assert ep.is_done or last == traj.num_steps - 1

        assert_trees_equal(rows(ep.obs, slice(None, -1)), rows(traj.obs, (ts, b)))
        assert_trees_equal(rows(ep.obs, slice(-1, None)), rows(traj.next_obs, (ts[-1:], b)))
        assert_trees_equal(ep.action, rows(traj.action, (ts, b)))
        assert_trees_equal(ep.reward, traj.reward[ts, b])
        assert_trees_equal(ep.extras, rows(traj.extras, (ts, b)))
        assert ep.total_return == pytest.approx(float(np.sum(traj.reward[ts, b])))

    np.testing.assert_array_equal(seen, 1)
    assert order == sorted(order), "episodes must come env by env, in time order"


def _hand_trajectory() -> Trajectory:
    """T=5, B=2 by hand.

    env 0: episode 0 (steps 0-1, terminated at t=1), episode 2 (t=2..4, truncated at t=4)
    env 1: episode 1 continued from step 7 (t=0..2, terminated at t=2), then episode 3
           (t=3..4, still running)
    obs[t, b] = 10 t + b; a final observation (where done) is 100 + 10 t + b; otherwise
    next_obs[t] = obs[t + 1]. reward[t, b] = t + 0.5 b.
    """
    t = np.arange(5)[:, None]
    b = np.arange(2)[None, :]
    obs = (10 * t + b).astype(np.float32)
    terminated = np.array([[0, 0], [1, 0], [0, 1], [0, 0], [0, 0]], bool)
    truncated = np.array([[0, 0], [0, 0], [0, 0], [0, 0], [1, 0]], bool)
    next_obs = np.where(terminated | truncated, 100 + obs, obs + 10).astype(np.float32)
    return Trajectory(
        obs={"x": obs},
        action=(t * 2 + b).astype(np.int64),
        reward=(t + 0.5 * b).astype(np.float64),
        terminated=terminated,
        truncated=truncated,
        next_obs={"x": next_obs},
        extras={"log_prob": -(t + b).astype(np.float32)},
        env_id=np.array([[0, 1]] * 5, np.int64),
        episode_id=np.array([[0, 1], [0, 1], [2, 1], [2, 3], [2, 3]], np.int64),
        step=np.array([[0, 7], [1, 8], [0, 9], [1, 0], [2, 1]], np.int64),
    )


def test_split_episodes_hand_computed() -> None:
    episodes = _hand_trajectory().split_episodes()
    contents = [
        (ep.env_id, ep.episode_id, ep.obs["x"].tolist(), ep.action.tolist(), ep.reward.tolist())
        for ep in episodes
    ]
    assert contents == [
        (0, 0, [0, 10, 110], [0, 2], [0.0, 1.0]),
        (0, 2, [20, 30, 40, 140], [4, 6, 8], [2.0, 3.0, 4.0]),
        (1, 1, [1, 11, 21, 121], [1, 3, 5], [0.5, 1.5, 2.5]),
        (1, 3, [31, 41, 51], [7, 9], [3.5, 4.5]),
    ]
    assert [ep.extras["log_prob"].tolist() for ep in episodes] == [
        [0, -1],
        [-2, -3, -4],
        [-1, -2, -3],
        [-4, -5],
    ]
    flags = [
        (ep.terminated, ep.truncated, ep.start_step, ep.is_done, ep.is_complete) for ep in episodes
    ]
    assert flags == [
        (True, False, 0, True, True),
        (False, True, 0, True, True),
        (True, False, 7, True, False),  # began before the trajectory
        (False, False, 0, False, False),  # still running
    ]
    assert [ep.length for ep in episodes] == [2, 3, 3, 2]
    assert [ep.total_return for ep in episodes] == [1.0, 9.0, 4.5, 8.0]
    assert episodes[0].obs["x"].dtype == np.float32
    assert episodes[0].action.dtype == np.int64


def test_split_episodes_accepts_device_arrays() -> None:
    # (device_put narrows 64-bit dtypes without jax_enable_x64: compare values only.)
    host = _hand_trajectory()
    got_eps, want_eps = jax.device_put(host).split_episodes(), host.split_episodes()
    assert len(got_eps) == len(want_eps)
    for got, want in zip(got_eps, want_eps):
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert isinstance(g, np.ndarray)
            np.testing.assert_array_equal(g, w)


def test_time_slice_takes_python_slice_ints_and_refuses_others() -> None:
    traj = _hand_trajectory()
    assert_trees_equal(traj.time_slice(-2, 5), traj.time_slice(3, 5))
    assert traj.time_slice(np.int64(1), 3).num_steps == 2
    for start, stop, name in ((1.5, 3, "start"), (0, "3", "stop"), (True, 3, "start")):
        refused = rf"Trajectory.time_slice\({name}="
        with pytest.raises(jr.errors.InvalidArgumentError, match=refused):
            traj.time_slice(start, stop)


def test_split_episodes_of_empty_trajectory() -> None:
    assert _hand_trajectory().time_slice(3, 3).split_episodes() == []


# -- concatenate -----------------------------------------------------------------------------


@SETTINGS
@given(pair=trajectory_pairs())
def test_concatenate_then_time_slice_round_trip(pair: tuple[Trajectory, Trajectory]) -> None:
    a, b = pair
    joined = jr.concatenate([a, b])
    assert isinstance(joined, Trajectory)
    assert joined.num_steps == a.num_steps + b.num_steps
    assert joined.num_envs == a.num_envs
    assert_trees_equal(joined.time_slice(0, a.num_steps), a)
    assert_trees_equal(joined.time_slice(a.num_steps, joined.num_steps), b)


@SETTINGS
@given(traj=trajectories(), data=st.data())
def test_time_slice_then_concatenate_is_identity(traj: Trajectory, data: st.DataObject) -> None:
    cut = sorted(data.draw(st.lists(st.integers(0, traj.num_steps), min_size=2, max_size=2)))
    pieces = [
        traj.time_slice(0, cut[0]),
        traj.time_slice(cut[0], cut[1]),
        traj.time_slice(cut[1], traj.num_steps),
    ]
    assert_trees_equal(jr.concatenate(pieces), traj)
    assert_trees_equal(jr.concatenate([traj]), traj)


def test_concatenate_errors() -> None:
    traj = _hand_trajectory()
    with pytest.raises(ValueError, match="got none"):
        jr.concatenate([])
    with pytest.raises(ValueError, match=r"takes a list of trajectories, got one Trajectory"):
        jr.concatenate(traj)
    with pytest.raises(ValueError, match="got item 1 a NoneType"):
        jr.concatenate([traj, None])
    # Any iterable: a generator's first item is not lost.
    assert_trees_equal(jr.concatenate(t for t in (traj, traj)), jr.concatenate([traj, traj]))
    one_env = jax.tree.map(lambda x: x[:, :1], traj)
    with pytest.raises(ValueError, match="1 envs, trajectory 0 has 2"):
        jr.concatenate([traj, one_env])
    with_value = traj.replace(extras={**traj.extras, "value": traj.extras["log_prob"]})
    with pytest.raises(ValueError, match=r"different structure.*Only in trajectory 1: .*'value'"):
        jr.concatenate([traj, with_value])
    # An info entry first reported in a later sample (info_keys="all") is named, with the fix.
    first = traj.replace(extras={**traj.extras, "infos": {"a": traj.reward}})
    later = traj.replace(extras={**traj.extras, "infos": {"a": traj.reward, "b": traj.reward}})
    with pytest.raises(ValueError, match=r"Only in trajectory 1: .*'b'.*list the entries"):
        jr.concatenate([first, later])
    other_obs = traj.replace(obs=traj.obs["x"], next_obs=traj.next_obs["x"])
    with pytest.raises(ValueError, match="different structure"):
        jr.concatenate([traj, other_obs])


# -- concatenate_episodes --------------------------------------------------------------------


@SETTINGS
@given(traj=trajectories(min_steps=2), data=st.data())
def test_concatenate_episodes_rejoins_split(traj: Trajectory, data: st.DataObject) -> None:
    """Splitting [0:k] and [k:T] separately and joining the pieces gives the same
    episodes as splitting the whole."""
    k = data.draw(st.integers(1, traj.num_steps - 1))
    head_eps = traj.time_slice(0, k).split_episodes()
    tail_eps = traj.time_slice(k, traj.num_steps).split_episodes()
    open_heads = {ep.env_id: ep for ep in head_eps if not ep.is_done}
    rejoined = [ep for ep in head_eps if ep.is_done]
    for ep in tail_eps:
        head = open_heads.pop(ep.env_id, None)
        if head is not None and head.episode_id == ep.episode_id:
            ep = jr.concatenate_episodes(head, ep)
        rejoined.append(ep)
    assert not open_heads
    rejoined.sort(key=lambda e: e.episode_id)
    want = sorted(traj.split_episodes(), key=lambda e: e.episode_id)
    assert len(rejoined) == len(want)
    for got, exp in zip(rejoined, want):
        assert_episodes_equal(got, exp)


def test_concatenate_episodes_hand_computed() -> None:
    traj = _hand_trajectory()
    head = traj.time_slice(0, 3).split_episodes()[1]  # env 0, episode 2, t=2
    tail = traj.time_slice(3, 5).split_episodes()[0]  # env 0, episode 2, t=3..4
    assert (head.episode_id, head.is_done, tail.episode_id, tail.start_step) == (2, False, 2, 1)
    joined = jr.concatenate_episodes(head, tail)
    assert joined.obs["x"].tolist() == [20, 30, 40, 140]
    assert joined.action.tolist() == [4, 6, 8]
    assert joined.reward.tolist() == [2.0, 3.0, 4.0]
    assert (joined.truncated, joined.terminated, joined.start_step) == (True, False, 0)
    assert joined.is_complete


def test_concatenate_episodes_rejects_mismatch() -> None:
    traj = _hand_trajectory()
    first = traj.time_slice(0, 3).split_episodes()
    second = traj.time_slice(3, 5).split_episodes()
    env0_done, env0_open = first[0], first[1]
    assert env0_done.is_done and not env0_open.is_done
    env0_tail, env1_tail = second[0], second[1]
    with pytest.raises(ValueError, match="does not continue"):
        jr.concatenate_episodes(env0_open, env1_tail)  # other env, other episode
    with pytest.raises(ValueError, match="does not continue"):
        jr.concatenate_episodes(env0_done, env0_tail)  # head already ended
    with pytest.raises(ValueError, match="does not continue"):
        jr.concatenate_episodes(env0_open, env0_tail.replace(env_id=1))
    with pytest.raises(ValueError, match="does not continue"):
        jr.concatenate_episodes(env0_open, env0_tail.replace(episode_id=99))


# -- load trusts nothing in the file (issue 16, defect 7) -----------------------------------


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _rewrite(path: Any, edit_spec: Any = None, members: dict[str, bytes] | None = None) -> None:
    """Rewrites the saved file at ``path``: ``edit_spec(spec)`` changes its spec in
    place, ``members`` replace or add raw zip members."""
    with zipfile.ZipFile(path) as zf:
        raw = {name: zf.read(name) for name in zf.namelist()}
    if edit_spec is not None:
        spec = json.loads(str(np.load(io.BytesIO(raw["__spec__.npy"]))))
        edit_spec(spec)
        raw["__spec__.npy"] = _npy(np.array(json.dumps(spec)))
    raw.update(members or {})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in raw.items():
            zf.writestr(name, data)


def _array_of(spec: dict[str, Any], field: str) -> str:
    return spec["fields"][field]["array"]


def test_load_reads_only_the_members_the_spec_names(tmp_path: Any) -> None:
    path = tmp_path / "traj.npz"
    traj = _hand_trajectory()
    traj.save(path)
    # An unreferenced member whose header promises 8 TiB, and one that is no .npy at all.
    huge = _npy(np.zeros(2, np.float64)).replace(b"(2,)", b"(1099511627776,)")
    _rewrite(path, members={"junk.npy": huge, "noise.npy": b"\x00" * 100})
    assert_trees_equal(Trajectory.load(path), traj)


def test_load_refuses_fields_whose_shapes_disagree(tmp_path: Any) -> None:
    path = tmp_path / "traj.npz"
    _hand_trajectory().replace(reward=np.zeros((3, 7))).save(path)  # beside [5, 2] fields
    with pytest.raises(jr.errors.InvalidArgumentError, match=r"reward's"):
        Trajectory.load(path)


def _deep(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"none": True}
    for _ in range(depth):
        node = {"dict": {"a": node}}
    return node


BAD_FILES = {
    "not valid JSON": lambda spec: None,  # the spec member is replaced below
    "deeper than": lambda spec: spec["fields"].update(extras=_deep(40)),
    "missing \\['step'\\]": lambda spec: spec["fields"].pop("step"),
    "unknown \\['spare'\\]": lambda spec: spec["fields"].update(spare={"none": True}),
    "field obs.x with": lambda spec: spec["fields"]["obs"]["dict"].update(x={"array": "nope"}),
    "field action with": lambda spec: spec["fields"].update(action=[1, 2]),
    "field terminated of dtype float": lambda spec: spec["fields"].update(
        terminated=spec["fields"]["extras"]["dict"]["log_prob"], extras={"dict": {}}
    ),
    "next_obs shaped unlike obs": lambda spec: spec["fields"].update(
        next_obs={"tuple": [spec["fields"]["next_obs"]["dict"]["x"]]}
    ),
    "field extras that is not an object of named arrays": lambda spec: spec["fields"].update(
        extras=spec["fields"]["extras"]["dict"]["log_prob"]
    ),
}


@pytest.mark.parametrize("match", list(BAD_FILES))
def test_load_names_what_is_wrong_with_a_bad_spec(tmp_path: Any, match: str) -> None:
    path = tmp_path / "traj.npz"
    _hand_trajectory().save(path)
    if match == "not valid JSON":
        _rewrite(path, members={"__spec__.npy": _npy(np.array("[" * 100_000))})
    else:
        _rewrite(path, BAD_FILES[match])
    with pytest.raises(jr.errors.InvalidArgumentError, match=match):
        Trajectory.load(path)


def test_load_names_what_is_wrong_with_a_bad_member(tmp_path: Any) -> None:
    path = tmp_path / "traj.npz"
    _hand_trajectory().save(path)
    with zipfile.ZipFile(path) as zf:
        spec = json.loads(str(np.load(io.BytesIO(zf.read("__spec__.npy")))))
    reward = _array_of(spec, "reward")
    cases = {
        # a pickled object array: never unpickled
        "field reward as object": _npy(np.array([[{"x": 1}] * 2] * 5, dtype=object)),
        # a header promising more than the member holds
        "field reward whose size": _npy(np.zeros((5, 2))).replace(b"(5, 2)", b"(50, 2)"),
        "field reward \\(": b"not an npy member",
    }
    for match, member in cases.items():
        _hand_trajectory().save(path)
        _rewrite(path, members={f"{reward}.npy": member})
        with pytest.raises(jr.errors.InvalidArgumentError, match=match):
            Trajectory.load(path)
    _hand_trajectory().save(path)
    with pytest.raises(jr.errors.InvalidArgumentError, match="max_bytes"):
        Trajectory.load(path, max_bytes=100)
    path.write_bytes(b"not a zip")
    with pytest.raises(jr.errors.InvalidArgumentError, match="cannot be opened"):
        Trajectory.load(path)
    _hand_trajectory().save(path)  # a damaged "version needed" of the central directory
    raw = bytearray(path.read_bytes())
    raw[raw.index(b"PK\x01\x02") + 6] ^= 0x80  # zipfile's NotImplementedError
    path.write_bytes(bytes(raw))
    with pytest.raises(jr.errors.InvalidArgumentError, match="cannot be opened"):
        Trajectory.load(path)


# -- load allocates no more than the file justifies (issue 30, item 5) ---------------------------


def test_what_save_writes_load_reads_back(tmp_path: Any) -> None:
    """A Trajectory built without ids (None) round-trips; an array a load could not read
    back (bfloat16) is refused by save, before anything is written."""
    bare = _hand_trajectory().replace(env_id=None, episode_id=None, step=None)
    bare.save(tmp_path / "bare.npz")
    loaded = Trajectory.load(tmp_path / "bare.npz")
    assert (loaded.env_id, loaded.episode_id, loaded.step) == (None, None, None)
    assert_trees_equal(loaded, bare)
    value = jax.numpy.zeros(bare.reward.shape, jax.numpy.bfloat16)
    with pytest.raises(jr.errors.InvalidArgumentTypeError, match="dtype bfloat16; cast it"):
        bare.replace(extras={"value": value}).save(tmp_path / "bf16.npz")
    assert not (tmp_path / "bf16.npz").exists()


def test_load_refuses_one_member_named_for_many_fields(tmp_path: Any) -> None:
    """A spec naming one deflated member 60 times (extras leaves, next_obs) would turn a
    small file into 60 allocations of the member: one member backs one field."""
    path = tmp_path / "traj.npz"
    _hand_trajectory().save(path)

    def alias(spec: dict[str, Any]) -> None:
        reward = {"array": _array_of(spec, "reward")}
        spec["fields"]["extras"] = {"dict": {f"k{i}": reward for i in range(60)}}

    _rewrite(path, alias)
    with pytest.raises(jr.errors.InvalidArgumentError, match=r"again for field extras\.k0"):
        Trajectory.load(path)


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "fifo"])
@pytest.mark.parametrize("cls", [Trajectory, jr.MultiAgentTrajectory])
def test_load_refuses_what_is_not_a_regular_file_before_reading(tmp_path: Any, special, cls):
    """zipfile searches a device or a pipe for the end of the archive without end (and
    a pipe's open waits for a writer): refused before anything is read."""
    path = special_path(special, tmp_path)
    error, peak = refusal_and_peak(lambda: cls.load(path), f"load({special!r})")
    assert isinstance(error, jr.errors.InvalidArgumentError), error
    assert "is not a regular file" in str(error)
    assert peak < (1 << 20), peak


@pytest.mark.parametrize("max_bytes", [True, 1.5, -1])
def test_load_refuses_a_max_bytes_that_is_no_byte_count(tmp_path: Any, max_bytes) -> None:
    path = tmp_path / "traj.npz"
    _hand_trajectory().save(path)
    with pytest.raises(jr.errors.JaxRunnerError, match=r"Trajectory\.load\(max_bytes="):
        Trajectory.load(path, max_bytes=max_bytes)

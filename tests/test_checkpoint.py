"""Checkpoints: one long run split at a sample boundary equals the unbroken run."""

from __future__ import annotations

import io
import json
import pathlib
import pickle
import shutil
import threading
import tracemalloc
import warnings
import zipfile

import flax.linen as nn
import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner._src.testing.jax_envs import RandomWalk, WalkParams
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.models import mlp_policy
from jaxrunner.testing import assert_trees_equal
from tests.special_files import refusal_and_peak, special_path

SEED = 3


def short_cartpole() -> gymnasium.Env:
    return gymnasium.make("CartPole-v1", max_episode_steps=13)


class Recurrent(nn.Module):
    """A GRU policy, so the carries are part of what must resume."""

    @nn.compact
    def __call__(self, carry, obs):
        carry, h = nn.GRUCell(features=8)(carry, obs)
        return carry, (nn.Dense(2)(h), nn.Dense(1)(h))


@pytest.fixture(scope="module")
def gru():
    envs = jr.make_vec(short_cartpole, 1)
    policy = jr.Policy.from_linen(Recurrent(), envs.single_action_space, initial_carry=jnp.zeros(8))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    envs.close()
    return policy, params


def cartpole_runner(gru, env_fn=short_cartpole, num_envs: int = 5, **kwargs) -> jr.EnvRunner:
    policy, params = gru
    envs = jr.make_vec(env_fn, num_envs)
    return jr.EnvRunner(envs, policy, params, rollout_length=11, seed=SEED, **kwargs)


def walk_runner(num_envs: int = 3) -> jr.EnvRunner:
    venv = jr.JaxVectorEnv(RandomWalk(), WalkParams(max_steps_in_episode=9), num_envs)
    policy = mlp_policy(venv.single_action_space, hidden=(16,))
    params = policy.init(jax.random.key(1), venv.single_observation_space)
    return jr.EnvRunner(venv, policy, params, rollout_length=7, seed=SEED)


def samples(runner: jr.EnvRunner, count: int) -> list[jr.Trajectory]:
    return [runner.sample().to_numpy() for _ in range(count)]


def counters(runner: jr.EnvRunner) -> dict:
    """The metrics that do not depend on timing."""
    m = runner.get_metrics()
    keys = ("num_env_steps", "num_episodes", "episode_return_mean", "episode_length_mean")
    return {k: None if m[k] != m[k] else m[k] for k in keys}  # NaN (no episode yet): None


def split_run(make, tmp_path, before: int, after: int, **restore_kwargs):
    """``before`` samples, a save, a new runner (new envs) restored, ``after`` samples."""
    path = tmp_path / "runner.ckpt"
    with make() as runner:
        head = samples(runner, before)
        runner.save(path)
    with make() as resumed:
        report = resumed.restore(path, **restore_kwargs)
        tail = samples(resumed, after)
        metrics = counters(resumed)
    return jr.concatenate(head + tail), report, metrics


def test_restarted_sub_envs_resume_with_their_restart_seeds(gru, tmp_path):
    """Under a restart_policy a restarted sub-env is reset with a seed drawn from its
    restarts so far: the sub-env pickles keep that count, so a resumed run restarts
    into the episodes the unbroken run does (every env fails at its 4th step call, so
    each restarts several times on both sides of the save)."""
    from jaxrunner.testing import FaultPlan, faulty_env_fns

    def make():
        policy, params = gru
        fns = faulty_env_fns(short_cartpole, 5, faults=[FaultPlan(at=(4,))])
        envs = jr.SyncVectorEnv(fns, restart_policy=jr.RestartPolicy())
        return jr.EnvRunner(envs, policy, params, rollout_length=11, seed=SEED)

    with make() as runner:
        whole = jr.concatenate(samples(runner, 4))
        assert runner.envs.num_restarts >= 10
    split, report, _ = split_run(make, tmp_path, 2, 2, load_env_pickles=True)
    assert report.envs_restored
    assert_trees_equal(split, whole, "trajectory")


def test_a_faulty_episode_is_saved_and_restored_faulty(gru, tmp_path):
    """As a MultiAgentRunner's agent episodes: finished episodes cut by a fault, kept for
    the next sample_episodes(include_faulty=True), restore faulty, and the resumed
    runner returns what the unbroken one does."""
    from jaxrunner.testing import FaultPlan, faulty_env_fns

    def make():
        policy, params = gru
        fns = faulty_env_fns(short_cartpole, 5, faults=[FaultPlan(at=(6,))])
        envs = jr.SyncVectorEnv(fns, restart_policy=jr.RestartPolicy())
        return jr.EnvRunner(envs, policy, params, rollout_length=11, seed=SEED)

    path = tmp_path / "faulty.ckpt"
    with make() as runner:
        while not any(e.faulty for e in runner.state.finished):
            runner.sample_episodes(len(runner.state.finished) + 1, include_faulty=True)
        kept = list(runner.state.finished)
        runner.save(path)
        want = runner.sample_episodes(len(kept) + 3, include_faulty=True)
    with make() as runner:
        assert runner.restore(path, load_env_pickles=True).envs_restored
        assert [e.faulty for e in runner.state.finished] == [e.faulty for e in kept]
        got = runner.sample_episodes(len(kept) + 3, include_faulty=True)
    assert_trees_equal(got, want, "episodes")
    assert [e.faulty for e in got] == [e.faulty for e in want]


OLD_FILES = pathlib.Path(__file__).parent / "data" / "checkpoints"
"""Checkpoints written by the earlier formats (see write_old_versions.py there)."""


def bare_snapshots(path) -> dict[str, bytes]:
    """The sub-env pickle members of a version 2 file, as version 1 wrote them (bare
    envs, without their restart state)."""
    from jaxrunner._src.backends.snapshots import snapshot_dumps

    def bare(blob: bytes) -> bytes:
        snapshot = pickle.loads(np.load(io.BytesIO(blob)).tobytes())
        return _npy(np.frombuffer(snapshot_dumps(snapshot["env"]), np.uint8))

    with zipfile.ZipFile(path) as zf:
        return {n: bare(zf.read(n)) for n in zf.namelist() if n.startswith("envs/")}


def resumed_run(make, path, **restore_kwargs) -> tuple:
    """What a new runner restored from ``path`` does next: two samples, the counters,
    a sample_episodes call (which takes the kept episodes)."""
    with make() as runner:
        assert runner.restore(path, **restore_kwargs).envs_restored
        trajs = samples(runner, 2)
        return trajs, counters(runner), runner.sample_episodes(3)


def test_checkpoints_of_earlier_versions_resume_exactly(gru, saved, tmp_path):
    """Version 2 files (written by the earlier code, at the point the ``saved`` fixture
    saves) and version 1 files (their sub-env pickles bare) restore as this version's
    file of the same run does: the same samples, counters and kept episodes."""
    v2 = OLD_FILES / "env_runner_v2_sync.ckpt"
    v1 = tmp_path / "version1.ckpt"
    rewrite(v2, v1, meta=lambda m: m.update(version=1), members=bare_snapshots(v2))
    with np.load(saved) as data:
        assert json.loads(str(data["__meta__"]))["version"] == 3
    want = resumed_run(lambda: cartpole_runner(gru), saved, load_env_pickles=True)
    for path in (v2, v1):
        got = resumed_run(lambda: cartpole_runner(gru), path, load_env_pickles=True)
        assert_trees_equal(got[0], want[0], f"{path.name}: trajectories")
        assert got[1] == want[1], path.name
        assert_trees_equal(got[2], want[2], f"{path.name}: episodes")


def test_a_jax_env_checkpoint_of_version_2_resumes_exactly(tmp_path):
    path = tmp_path / "runner.ckpt"
    with walk_runner() as runner:
        runner.sample_episodes(3)
        runner.save(path)
    want = resumed_run(walk_runner, path)
    got = resumed_run(walk_runner, OLD_FILES / "env_runner_v2_jax.ckpt")
    assert_trees_equal(got[0], want[0], "trajectories")
    assert got[1] == want[1]
    assert_trees_equal(got[2], want[2], "episodes")


@pytest.mark.parametrize("num_splits", [1, 2])
def test_sync_cartpole_resumes_bit_for_bit(gru, tmp_path, num_splits):
    def make():
        return cartpole_runner(gru, num_splits=num_splits)

    with make() as runner:
        whole = jr.concatenate(samples(runner, 4))
        expected_metrics = counters(runner)
    split, report, metrics = split_run(make, tmp_path, 2, 2, load_env_pickles=True)
    assert report.envs_restored
    assert whole.terminated.any() and whole.truncated.any()  # episodes cross the split
    assert_trees_equal(split, whole, "trajectory")
    assert metrics == expected_metrics


def test_jax_env_resumes_bit_for_bit(tmp_path):
    with walk_runner() as runner:
        whole = jr.concatenate(samples(runner, 4))
        expected_metrics = counters(runner)
    split, report, metrics = split_run(walk_runner, tmp_path, 2, 2)
    assert report.envs_restored
    assert (whole.terminated | whole.truncated).any()
    assert_trees_equal(split, whole, "trajectory")
    assert metrics == expected_metrics


def test_sample_episodes_resumes_with_its_fragments(gru, tmp_path):
    with cartpole_runner(gru) as runner:
        whole = runner.sample_episodes(4) + runner.sample_episodes(6)
    path = tmp_path / "runner.ckpt"
    with cartpole_runner(gru) as runner:
        head = runner.sample_episodes(4)
        # both kinds of kept episodes are saved
        assert runner.state.episodes.fragments and runner.state.finished
        runner.save(path)
    with cartpole_runner(gru) as resumed:
        resumed.restore(path, load_env_pickles=True)
        tail = resumed.sample_episodes(6)
    assert [e.episode_id for e in head + tail] == [e.episode_id for e in whole]
    for got, want in zip(head + tail, whole):
        assert_trees_equal(got, want, f"episode {want.episode_id}")


def test_jax_env_sample_episodes_resumes(tmp_path):
    """Episodes kept by a scan runner (float32 rewards, int32 actions) restore too."""
    path = tmp_path / "runner.ckpt"
    with walk_runner() as runner:
        runner.sample_episodes(3)
        assert runner.state.episodes.fragments
        runner.save(path)
        whole = runner.sample_episodes(3)
    with walk_runner() as resumed:
        resumed.restore(path)
        tail = resumed.sample_episodes(3)
    for got, want in zip(tail, whole, strict=True):
        assert_trees_equal(got, want, f"episode {want.episode_id}")


def test_the_file_loads_without_pickle(gru, tmp_path):
    path = tmp_path / "runner.ckpt"
    with cartpole_runner(gru) as runner:
        runner.sample()
        runner.save(path)
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["__meta__"]))
        assert meta["envs"] == "pickle" and meta["num_envs"] == 5
        # The one layout of both runners: an EnvRunner is one policy of one agent.
        assert meta["policy_ids"] == ["default_policy"] and meta["possible_agents"] == ["agent_0"]
        assert data[GRU_KERNEL].dtype == np.float32
        assert data["envs/0"].dtype == np.uint8  # the pickles are bytes, loaded on request


def test_without_env_pickles_episodes_restart_and_say_so(gru, tmp_path):
    path = tmp_path / "runner.ckpt"
    with cartpole_runner(gru) as runner:
        head = jr.concatenate(samples(runner, 2))
        runner.save(path)
        saved = counters(runner)
        assert saved["num_episodes"] > 0
        next_id = int(runner.sampler._book.next_episode_id)
    with cartpole_runner(gru) as resumed:
        with pytest.warns(UserWarning, match="new episode"):
            report = resumed.restore(path)
        assert not report.envs_restored and "load_env_pickles" in report.note
        assert counters(resumed) == saved
        traj = resumed.sample()
    np.testing.assert_array_equal(traj.step[0], 0)
    np.testing.assert_array_equal(traj.episode_id[0], next_id + np.arange(5))
    assert traj.episode_id.min() > head.episode_id.max()
    # Fresh reset seeds: not the starts of the first run.
    assert not np.array_equal(traj.obs[0], head.obs[0])


class Unpicklable(gymnasium.Wrapper):
    """Holds a lock, which does not pickle."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.lock = threading.Lock()


def test_envs_that_cannot_be_snapshot_restart_cleanly(gru, tmp_path):
    def make():
        return cartpole_runner(gru, env_fn=lambda: Unpicklable(short_cartpole()))

    path = tmp_path / "runner.ckpt"
    with make() as runner:
        runner.sample()
        runner.save(path)
    with make() as resumed:
        with pytest.warns(UserWarning, match="could not be pickled"):
            report = resumed.restore(path, load_env_pickles=True)
        assert not report.envs_restored
        traj = resumed.sample()
    np.testing.assert_array_equal(traj.step[0], 0)


def test_restore_refuses_another_shape_of_runner(gru, tmp_path):
    path = tmp_path / "runner.ckpt"
    with cartpole_runner(gru) as runner:
        runner.save(path)
    with (
        cartpole_runner(gru, num_envs=4) as other,
        pytest.raises(InvalidArgumentError, match="num_envs=5"),
    ):
        other.restore(path)
    with walk_runner() as other, pytest.raises(InvalidArgumentError, match="sampler="):
        other.restore(path)


def test_restore_refuses_other_params(gru, tmp_path):
    path = tmp_path / "runner.ckpt"
    with cartpole_runner(gru) as runner:
        runner.save(path)
    envs = jr.make_vec(short_cartpole, 5)
    policy = mlp_policy(envs.single_action_space, hidden=(16,))
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    with (
        jr.EnvRunner(envs, policy, params, rollout_length=11, seed=SEED) as other,
        pytest.raises(InvalidArgumentError, match="params"),
    ):
        other.restore(path)


def test_sample_episodes_progress_line(gru, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name.startswith("tqdm"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    with cartpole_runner(gru) as runner, warnings.catch_warnings():
        warnings.simplefilter("error")
        runner.sample_episodes(3, progress=True)
        assert capsys.readouterr().err.strip().endswith("3/3 episodes")
        runner.sample_episodes(1)
        assert capsys.readouterr().err == ""


@pytest.mark.parametrize("ready_first", [False, True])
def test_process_backend_restarts_episodes_cleanly(gru, tmp_path, ready_first):
    """Sub-envs in other processes cannot be snapshot: the resumed runner starts new
    episodes, and the rest (ids, metrics, policy step counts) goes on."""
    policy, params = gru
    config = jr.ProcessConfig(num_workers=2, ready_first=ready_first)

    def make():
        envs = jr.make_vec(short_cartpole, 4, backend="process", config=config)
        return jr.EnvRunner(envs, policy, params, rollout_length=11, seed=SEED)

    path = tmp_path / "runner.ckpt"
    with make() as runner:
        runner.sample()
        runner.save(path)
        saved = counters(runner)
        next_id = int(runner.sampler._book.next_episode_id)
    with make() as resumed:
        with pytest.warns(UserWarning, match="cannot snapshot"):
            report = resumed.restore(path, load_env_pickles=True)
        assert not report.envs_restored
        traj = resumed.sample()
        assert counters(resumed)["num_env_steps"] == saved["num_env_steps"] + 44
    np.testing.assert_array_equal(traj.step[0], 0)
    np.testing.assert_array_equal(traj.episode_id[0], next_id + np.arange(4))


def test_sync_checkpoint_on_the_process_backend_starts_new_episodes(gru, saved):
    """A backend that cannot take the sync backend's sub-env pickles starts new
    episodes and says why (as a EnvRunner's does)."""
    policy, params = gru
    config = jr.ProcessConfig(num_workers=2)
    envs = jr.make_vec(short_cartpole, 5, backend="process", config=config)
    with jr.EnvRunner(envs, policy, params, rollout_length=11, seed=SEED) as other:
        with pytest.warns(UserWarning, match="cannot restore sub-env snapshots"):
            report = other.restore(saved, load_env_pickles=True)
        assert not report.envs_restored
        traj = other.sample()
    np.testing.assert_array_equal(traj.step[0], 0)


# -- damaged and hostile checkpoints (issue 30, items 3, 4 and 13) ------------------------------


@pytest.fixture(scope="module")
def saved(gru, tmp_path_factory) -> pathlib.Path:
    """A checkpoint with pickled sub-envs, fragments and a finished episode."""
    path = tmp_path_factory.mktemp("saved") / "runner.ckpt"
    with cartpole_runner(gru) as runner:
        runner.sample_episodes(4)
        assert runner.state.episodes.fragments and runner.state.finished
        runner.save(path)
    return path


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def rewrite(src, dst, meta=None, members=None) -> None:
    """``src`` copied to ``dst``: ``meta(m)`` edits the metadata in place, ``members``
    replace or add raw members (``None`` drops one)."""
    with zipfile.ZipFile(src) as zf:
        raw = {name: zf.read(name) for name in zf.namelist()}
    if meta is not None:
        doc = json.loads(str(np.load(io.BytesIO(raw["__meta__.npy"]))))
        meta(doc)
        raw["__meta__.npy"] = _npy(np.array(json.dumps(doc)))
    for name, data in (members or {}).items():
        if data is None:
            raw.pop(name)
        else:
            raw[name] = data
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in raw.items():
            zf.writestr(name, data)


def meta(edit):
    return lambda src, dst: rewrite(src, dst, meta=edit)


def member(name, array):
    """Member ``name`` replaced by ``array`` (raw bytes as they are; None: dropped)."""
    data = array if array is None or isinstance(array, bytes) else _npy(np.asarray(array))
    return lambda src, dst: rewrite(src, dst, members={f"{name}.npy": data})


def edited(name, edit):
    """Member ``name`` replaced by ``edit(its array)``."""

    def damage(src, dst) -> None:
        with np.load(src, allow_pickle=False) as data:
            array = data[name].copy()
        member(name, edit(array))(src, dst)

    return damage


def nan_at_end(array: np.ndarray) -> np.ndarray:
    array[-1] = np.nan
    return array


def infinite(array: np.ndarray) -> np.ndarray:
    return np.full_like(array, np.inf)


def truncated(src, dst) -> None:
    data = src.read_bytes()
    dst.write_bytes(data[: len(data) // 2])


def finished_twice(src, dst) -> None:
    """A second finished episode with the first one's id (and arrays)."""
    with zipfile.ZipFile(src) as zf:
        copies = {
            name.replace("finished/0/", "finished/1/"): zf.read(name)
            for name in zf.namelist()
            if name.startswith("finished/0/")
        }
    rewrite(src, dst, meta=lambda m: m["finished"].append(dict(m["finished"][0])), members=copies)


def set_key(where: str, key: str, value) -> object:
    def edit(m: dict) -> None:
        field, k = where.split(".")
        m[field][int(k)][key] = value

    return meta(edit)


GRU_KERNEL = "params/default_policy/module/params/GRUCell_0/hn/kernel"
CLAIMS_800_GB = b"(100000000000, 2)"
"""A float32 header shape of 800 GB."""
# id -> (how the file is damaged, what the error must name)
HOSTILE = {
    "truncated zip": (truncated, "cannot be opened"),
    "not a zip": (lambda src, dst: dst.write_bytes(b"PK\x03\x04 junk"), "cannot be opened"),
    "bad JSON": (member("__meta__", np.array("{" * 100_000)), "not valid JSON"),
    "deep JSON": (member("__meta__", np.array("[" * 100_000)), "not valid JSON"),
    "JSON list": (member("__meta__", np.array("[1, 2]")), "not a JSON object"),
    "meta as numbers": (member("__meta__", np.zeros(3)), "metadata"),
    "string seed": (meta(lambda m: m.update(seed="3")), "seed"),
    "negative seed": (meta(lambda m: m.update(seed=-1)), "seed"),
    "seed no runner takes": (meta(lambda m: m.update(seed=2**63)), "seed=9223372036854775808"),
    "float num_envs": (meta(lambda m: m.update(num_envs=5.0)), "num_envs"),
    "zero rollout_length": (meta(lambda m: m.update(rollout_length=0)), "rollout_length"),
    "unknown envs kind": (meta(lambda m: m.update(envs="magic")), "envs="),
    "envs_note a list": (meta(lambda m: m.update(envs_note=[])), "envs_note"),
    "metrics paths": (meta(lambda m: m.update(metrics=[["counters"]])), "metrics"),
    "finished not a list": (meta(lambda m: m.update(finished={})), "finished"),
    "episode id a string": (set_key("finished.0", "episode_id", "4"), r"finished\[0\]\.episode_id"),
    "episode id too big": (
        set_key("finished.0", "episode_id", 10**6),
        r"finished\[0\]\.episode_id",
    ),
    "flag an int": (set_key("finished.0", "truncated", 1), r"finished\[0\]\.truncated"),
    "env id out of range": (set_key("fragments.0", "env_id", 5), r"fragments\[0\]\.env_id"),
    "fragment of env 99": (set_key("fragments.0", "env_id", 99), r"fragments\[0\]\.env_id=99"),
    "negative start_step": (set_key("finished.0", "start_step", -2), r"finished\[0\]\.start_step"),
    "extra episode key": (set_key("finished.0", "spare", 1), r"finished\[0\]"),
    "paths miss obs": (set_key("finished.0", "paths", [["action"], ["reward"]]), "paths"),
    "paths not lists": (set_key("finished.0", "paths", "obs"), "paths"),
    "extras path an int": (set_key("finished.0", "extras", [[0]]), "extras"),
    "extras unknown member": (set_key("finished.0", "extras", [["nope"]]), "nope"),
    "finished incomplete": (set_key("finished.0", "start_step", 3), r"finished\[0\]"),
    "fragment finished": (set_key("fragments.0", "terminated", True), r"fragments\[0\]"),
    "fragment of another episode": (set_key("fragments.0", "episode_id", 4), "fragments"),
    "finished id twice": (finished_twice, "repeated id"),
    "negative steps_done": (member("sampler/book/steps_done", np.int64(-1)), "steps_done"),
    "rewound next id": (member("sampler/book/next_episode_id", np.int64(2)), "next_episode_id"),
    "repeated episode ids": (
        member("sampler/book/episode_id", np.zeros(5, np.int64)),
        "episode_id",
    ),
    "begin after steps_done": (
        member("sampler/book/episode_begin", np.full(5, 10**9, np.int64)),
        "episode_begin",
    ),
    "NaN episode return": (
        member("sampler/book/episode_return", np.full(5, np.nan)),
        "episode_return",
    ),
    "steps_done a string": (member("sampler/book/steps_done", np.array("7")), "steps_done"),
    "counters of length 6": (member("metrics/counters", np.zeros(6, np.int64)), "metrics/counters"),
    "negative counter": (member("metrics/counters", -np.ones(5, np.int64)), "metrics/counters"),
    "returns as strings": (member("metrics/returns", np.array(["1.0"])), "metrics/returns"),
    "NaN returns": (edited("metrics/returns", nan_at_end), "metrics/returns not finite"),
    "short perf": (member("metrics/perf", np.zeros(2)), "metrics/perf"),
    "negative perf": (member("metrics/perf", -np.ones(4)), "metrics/perf"),
    "returns unlike lengths": (member("metrics/lengths", np.ones(7, np.int64)), "metrics/returns"),
    "params shape": (member(GRU_KERNEL, np.zeros((3, 3), np.float32)), GRU_KERNEL),
    "params as objects": (member(GRU_KERNEL, np.array([{}] * 64, object)), GRU_KERNEL),
    "NaN params": (edited(GRU_KERNEL, nan_at_end), f"{GRU_KERNEL} not finite"),
    "infinite params": (edited(GRU_KERNEL, infinite), f"{GRU_KERNEL} not finite"),
    "NaN sampler observations": (edited("sampler/obs", nan_at_end), "sampler/obs not finite"),
    "NaN kept observation": (edited("finished/0/obs", nan_at_end), "finished/0/obs not finite"),
    "kept action outside the space": (
        edited("finished/0/action", lambda a: np.full_like(a, 2)),
        r"finished/0/action row 0 \(2\) outside the runner's space Discrete\(2\)",
    ),
    "header claims 800 GB": (
        member(GRU_KERNEL, _npy(np.zeros((8, 8), np.float32)).replace(b"(8, 8)", CLAIMS_800_GB)),
        GRU_KERNEL,
    ),
    "params size lies": (
        member(GRU_KERNEL, _npy(np.zeros((8, 8), np.float32)).replace(b"(8, 8)", b"(80, 8)")),
        "size",
    ),
    "obs missing": (member("sampler/obs", None), "sampler/obs"),
    "NaN finished reward": (edited("finished/0/reward", nan_at_end), "finished/0/reward not"),
    "short finished obs": (
        member("finished/0/obs", np.zeros((1, 4), np.float32)),
        "finished/0/obs",
    ),
    "action of another shape": (
        member("finished/0/action", np.zeros((3, 2), np.int64)),
        "finished/0/",
    ),
    "pickle as floats": (member("envs/0", np.zeros(8)), "envs/0"),
    "an unread object member": (member("junk", np.array([{}], object)), "member 'junk'"),
    "an unread structured member": (
        member("spare", np.zeros(2, [("a", "f4"), ("b", object)])),
        "member 'spare'",
    ),
    "a pickle where none belongs": (meta(lambda m: m.update(envs="none")), "member 'envs/0'"),
    "a MultiAgentRunner's checkpoint": (
        lambda src, dst: shutil.copyfile(OLD_FILES / "multi_agent_runner_v1_sync.ckpt", dst),
        "expected a jaxrunner.EnvRunner checkpoint version 1 or 2 or 3",
    ),
    "version 3 params as version 2's": (
        meta(lambda m: m.update(version=2)),
        "no 'params/module/params/Dense_0/bias'",
    ),
}
PICKLES_ONLY = {"pickle as floats"}
"""Cases about the sub-env pickles, which are read only with load_env_pickles=True."""


def runner_state(runner: jr.EnvRunner) -> dict:
    """Everything a restore may change, as host values (envs by identity)."""
    return {
        "params": jax.device_get(runner.get_params()),
        "sampler": jax.device_get(runner.sampler.get_state()),
        "metrics": runner.state.metrics.get_state(),
        "seed": runner.seed,
        "finished": list(runner.state.finished),
        "fragments": dict(runner.state.episodes.fragments),
        "envs": [id(env) for env in runner.envs.envs],
    }


@pytest.mark.parametrize("load_env_pickles", [True, False])
def test_restore_refuses_damaged_and_hostile_files_and_changes_nothing(
    gru, saved, tmp_path, load_env_pickles
):
    """Every rejection is a JaxRunnerError naming the field, raised before the runner
    changes, with or without the sub-env pickles; afterwards the runner samples exactly
    as an untouched one, and a new one restores the intact file."""
    with cartpole_runner(gru) as runner:
        before = runner_state(runner)
        for case, (damage, match) in HOSTILE.items():
            if case in PICKLES_ONLY and not load_env_pickles:
                continue
            path = tmp_path / f"{case}.ckpt"
            damage(saved, path)
            with pytest.raises(jr.errors.JaxRunnerError, match=match) as info:
                runner.restore(path, load_env_pickles=load_env_pickles)
            assert isinstance(info.value, InvalidArgumentError), case
            assert_trees_equal(runner_state(runner), before, case)
            assert runner.get_metrics()["num_env_steps"] == 0, case
        after_attacks = runner.sample()
    with cartpole_runner(gru) as untouched:
        assert_trees_equal(after_attacks, untouched.sample(), "trajectory")
    with cartpole_runner(gru) as runner:
        assert runner.restore(saved, load_env_pickles=True).envs_restored
        runner.sample()


def test_a_jax_env_checkpoint_refuses_nan_observations_but_not_env_state(tmp_path):
    """The scan sampler's latest observations must be finite; the pure-JAX env's own
    state is the env's (an infinity there may be its sentinel)."""
    path, damaged = tmp_path / "walk.ckpt", tmp_path / "damaged.ckpt"
    with walk_runner() as runner:
        runner.sample()
        runner.save(path)
    edited("sampler/rollout/obs", nan_at_end)(path, damaged)
    with walk_runner() as runner, pytest.raises(InvalidArgumentError, match="rollout/obs not"):
        runner.restore(damaged)
    edited("sampler/rollout/env_state/pos", infinite)(path, damaged)
    with walk_runner() as runner:
        assert runner.restore(damaged).envs_restored


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_bytes": True}, r"max_bytes=True\): expected an int >= 0"),
        ({"max_bytes": 1.5}, r"max_bytes=1\.5\): expected an int >= 0"),
        ({"max_bytes": -1}, r"max_bytes=-1\): expected an int >= 0"),
        ({"load_env_pickles": "yes"}, r"load_env_pickles='yes'\): expected True or False"),
    ],
)
def test_restore_refuses_bad_arguments(gru, saved, kwargs, match):
    with cartpole_runner(gru) as runner:
        with pytest.raises(jr.errors.JaxRunnerError, match=r"EnvRunner\.restore\(" + match):
            runner.restore(saved, **kwargs)
        assert runner.get_metrics()["num_env_steps"] == 0


def test_a_seed_no_runner_takes_is_refused_at_construction(gru):
    """The bound a checkpoint's seed is held to: what a runner takes (an int64)."""
    policy, params = gru
    with (
        jr.make_vec(short_cartpole, 1) as envs,
        pytest.raises(InvalidArgumentError, match=r"seed=9223372036854775808"),
    ):
        jr.EnvRunner(envs, policy, params, rollout_length=3, seed=2**63)


def test_restore_refuses_unreferenced_members_unread(gru, saved, tmp_path):
    """A member no field references is refused by its name, never read (a header
    promising 8 TiB, bytes that are no .npy, an unused episode's arrays); the sub-env
    pickles of a checkpoint that holds them are referenced, and read only on request."""
    huge = _npy(np.zeros(2)).replace(b"(2,)", b"(1099511627776,)")
    junk = {"junk.npy": huge, "noise.npy": b"\x00" * 100, "finished/7/reward.npy": huge}
    with cartpole_runner(gru) as runner:
        for name, data in junk.items():
            path = tmp_path / "padded.ckpt"
            rewrite(saved, path, members={name: data})
            with pytest.raises(InvalidArgumentError, match=f"member '{name[:-4]}' that no field"):
                runner.restore(path)
        rewrite(saved, path, members={"envs/0.npy": b"not read without load_env_pickles"})
        with pytest.warns(UserWarning, match="only loaded with restore"):
            report = runner.restore(path)
    assert not report.envs_restored


def deflated_member(path, name: str, dtype: str, length: int) -> None:
    """Adds member ``name`` to the zip at ``path``: ``length`` ones of ``dtype``,
    deflated, written a chunk at a time (the test never holds it whole)."""
    header = io.BytesIO()
    fields = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": (length,)}
    np.lib.format.write_array_header_1_0(header, fields)
    chunk = np.ones(1 << 20, dtype).tobytes()
    with (
        zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as zf,
        zf.open(name, "w", force_zip64=True) as out,
    ):
        out.write(header.getvalue())
        for _ in range(length >> 20):
            out.write(chunk)


def test_restore_refuses_an_oversized_window_before_reading_it(gru, saved, tmp_path):
    """A metrics window of 2**24 episodes (128 MiB once inflated, well within max_bytes)
    in a small file is refused from its header, longer than the runner's episode
    window: the restore allocates next to nothing (tracemalloc counts numpy's arrays)."""
    path = tmp_path / "window.ckpt"
    rewrite(saved, path, members={"metrics/lengths.npy": None})
    deflated_member(path, "metrics/lengths.npy", "<i8", 1 << 24)
    assert path.stat().st_size < (1 << 20)
    with cartpole_runner(gru) as runner:
        tracemalloc.start()
        try:
            with pytest.raises(InvalidArgumentError, match=r"metrics/lengths.*at most 100 entries"):
                runner.restore(path, load_env_pickles=True)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < (4 << 20), peak


def test_restore_refuses_kept_episodes_longer_than_the_steps_counted(gru, saved, tmp_path):
    """A kept episode's length is bounded, from its reward's header, by the steps the
    checkpoint's metrics count."""
    path = tmp_path / "long.ckpt"
    rewrite(saved, path, members={"finished/0/reward.npy": None})
    deflated_member(path, "finished/0/reward.npy", "<f8", 1 << 20)
    with (
        cartpole_runner(gru) as runner,
        pytest.raises(InvalidArgumentError, match=r"finished/0/reward.*steps the check"),
    ):
        runner.restore(path)


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "fifo", "directory"])
def test_restore_refuses_what_is_not_a_regular_file_before_reading(gru, tmp_path, special):
    """zipfile reads a device or a pipe without end looking for the end of the archive
    (and a pipe's open waits for a writer): refused before anything is read."""
    path = special_path(special, tmp_path)
    with cartpole_runner(gru) as runner:
        error, peak = refusal_and_peak(lambda: runner.restore(path), f"restore({special!r})")
    assert isinstance(error, InvalidArgumentError), error
    assert "is not a regular file" in str(error)
    assert peak < (4 << 20), peak


class NotAnEnv:
    """What a tampered pickle may hold instead of a sub-env."""


@pytest.mark.parametrize("thing", [None, NotAnEnv()])
def test_restore_refuses_pickles_that_are_not_envs(gru, saved, tmp_path, thing):
    path = tmp_path / "tampered.ckpt"
    blob = np.frombuffer(pickle.dumps(thing), np.uint8)
    rewrite(saved, path, members={"envs/2.npy": _npy(blob)})
    with cartpole_runner(gru) as runner:
        before = runner_state(runner)
        with pytest.raises(InvalidArgumentError, match="pickle envs/2 unpickled to a") as info:
            runner.restore(path, load_env_pickles=True)
        assert "snapshot 2" not in str(info.value) and "envs/0" not in str(info.value)
        assert_trees_equal(runner_state(runner), before, "runner")
        traj = runner.sample()  # the original sub-envs still step
    assert traj.valid.all()


class FailingReset(gymnasium.Wrapper):
    """Resets once (the runner's own first reset); every later reset raises."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.resets = 0

    def reset(self, **kwargs):
        self.resets += 1
        if self.resets > 1:
            raise RuntimeError("this env resets once")
        return self.env.reset(**kwargs)


def test_restore_undoes_the_sampler_state_when_the_fresh_resets_fail(gru, saved):
    """Without the pickles every env restarts; when that fails, the sampler keeps the
    state it had and nothing else is applied."""
    with cartpole_runner(gru, env_fn=lambda: FailingReset(short_cartpole())) as runner:
        before = runner_state(runner)
        with pytest.raises(jr.errors.EnvError):
            runner.restore(saved)
        assert_trees_equal(runner_state(runner), before, "runner")

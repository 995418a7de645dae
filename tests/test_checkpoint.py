"""Checkpoints, for both kinds of env (gymnasium and PettingZoo, parallel and AEC): a run
split at a save equals the unbroken run; otherwise new episodes with the documented
seeds; damaged and hostile files refused, leaving the runner as it was."""

from __future__ import annotations

import functools
import io
import json
import os
import pathlib
import pickle
import shutil
import threading
import tracemalloc
import warnings
import zipfile
from typing import Any

import flax.linen as nn
import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner import connectors as C
from jaxrunner._src.testing.jax_envs import RandomWalk, WalkParams
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.models import mlp_policy
from jaxrunner.testing import assert_trees_equal
from tests import multi_agent_envs as envs_mod
from tests.special_files import refusal_and_peak, special_path

SEED = 3
"""The gymnasium runners' seed; MA_SEED the PettingZoo runners' (the files in
data/checkpoints were written with them)."""
MA_SEED = 4
MA_NUM_ENVS = 3
MA_T = 7


def short_cartpole() -> gymnasium.Env:
    return gymnasium.make("CartPole-v1", max_episode_steps=13)


class Recurrent(nn.Module):
    """A GRU policy, so the carries are part of what must resume."""

    @nn.compact
    def __call__(self, carry, obs):
        carry, h = nn.GRUCell(features=8)(carry, obs)
        return carry, (nn.Dense(2)(h), nn.Dense(1)(h))


@functools.cache
def gru() -> tuple[jr.Policy, Any]:
    envs = jr.make_vec(short_cartpole, 1)
    policy = jr.Policy.from_linen(Recurrent(), envs.single_action_space, initial_carry=jnp.zeros(8))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    envs.close()
    return policy, params


@functools.cache  # one policy object: runners built again reuse its compiled step
def recurrent_policy(num_actions: int, masked: bool = False) -> jr.Policy:
    """Random actions whose logits drift with a per-agent carry (the sum of the agent's
    observations this episode), so the carries are part of what must resume."""

    def apply_fn(params, obs, carry, keys):
        if masked:
            x = obs["observation"].reshape(obs["observation"].shape[0], -1).astype(jnp.float32)
            logits = jnp.where(obs["action_mask"] > 0, 0.0, -jnp.inf)
        else:
            x, logits = obs.reshape(obs.shape[0], -1), jnp.zeros((obs.shape[0], num_actions))
        carry = carry + x.sum(-1)
        logits = logits + params["w"] + jnp.sin(carry)[:, None] * jnp.arange(num_actions)
        action = jax.vmap(jax.random.categorical)(keys, logits)
        return action, {"carry": carry}, carry

    return jr.Policy(apply_fn, initial_carry=jnp.zeros(()))


class Recorder(jr.multi_agent.AgentCallbacks):
    """Records each agent episode's end (on a gymnasium env, its one agent ``agent_0``'s
    episodes). The per-step hooks' live episodes: ``StepCounter``, below."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def on_agent_episode_end(self, runner, episode) -> None:
        self.seen.append(
            (episode.episode_id, episode.agent_id, episode.total_reward, episode.length)
        )


# name -> (factory, actions, masked, connectors); "cartpole" is the gymnasium env
ENVS = {
    "cartpole": (short_cartpole, 2, False, False),
    "coming_and_going": (envs_mod.coming_and_going, 3, False, True),  # PettingZoo parallel
    "relay": (envs_mod.relay, 4, False, False),  # PettingZoo AEC
    "tictactoe": (envs_mod.tictactoe, 9, True, False),
    # MPE: EzPickle envs holding pygame render resources.
    "simple_spread": (envs_mod.simple_spread, 5, False, False),
}
KINDS = ["cartpole", "coming_and_going", "relay"]
"""A gymnasium env, a PettingZoo parallel env and a PettingZoo AEC env."""
TWO_KINDS = ["cartpole", "coming_and_going"]
"""One env of each kind, for what the AEC driver changes nothing in."""


def needs(name: str) -> None:
    """Skips where the env's package is not installed."""
    if name != "cartpole":
        pytest.importorskip("pettingzoo")
    if name == "simple_spread":
        pytest.importorskip("mpe2")


def make(
    name: str = "cartpole",
    backend: str = "sync",
    num_envs: int | None = None,
    callbacks: Any = None,
    env_fn: Any = None,
    runner_kwargs: dict | None = None,
    **kwargs: Any,
) -> jr.EnvRunner:
    """A runner on env ``name`` (``env_fn`` instead of its factory where given):
    CartPole under a GRU policy (seed 3, 5 envs, T=11), a PettingZoo env under
    ``recurrent_policy`` (seed 4, 3 envs, T=7); ``kwargs`` go to ``make_vec``."""
    factory, n, masked, with_connectors = ENVS[name]
    if name == "cartpole":
        policy, params = gru()
        envs = jr.make_vec(env_fn or factory, num_envs or 5, backend, **kwargs)
        return jr.EnvRunner(
            envs, policy, params, 11, seed=SEED, callbacks=callbacks, **(runner_kwargs or {})
        )
    envs = jr.make_vec(env_fn or factory, num_envs or MA_NUM_ENVS, backend, **kwargs)
    connectors = None
    if with_connectors:
        connectors = ma_connectors()
    params = {g.policy_id: {"w": jnp.zeros(n)} for g in envs.groups}
    return jr.EnvRunner(
        envs,
        recurrent_policy(n, masked),
        params,
        MA_T,
        seed=MA_SEED,
        connectors=connectors,
        callbacks=callbacks,
        **(runner_kwargs or {}),
    )


@functools.cache
def ma_connectors() -> C.Connectors:
    return C.Connectors(
        obs=[C.NormalizeObservation(), C.FrameStack(num_frames=2)], reward=C.ScaleReward()
    )


def walk_runner(num_envs: int = 3, callbacks: Any = None) -> jr.EnvRunner:
    venv = jr.JaxVectorEnv(RandomWalk(), WalkParams(max_steps_in_episode=9), num_envs)
    policy = mlp_policy(venv.single_action_space, hidden=(16,))
    params = policy.init(jax.random.key(1), venv.single_observation_space)
    return jr.EnvRunner(venv, policy, params, rollout_length=7, seed=SEED, callbacks=callbacks)


def drift_runner(callbacks: Any = None) -> jr.EnvRunner:
    """A pure-JAX multi-agent env (JaxMARL style)."""
    from tests.test_multi_agent_jax import Drift
    from tests.test_multi_agent_jax import random_policy as scan_policy

    envs = jr.multi_agent.JaxMultiAgentVectorEnv(Drift(), MA_NUM_ENVS)
    params = {"w": jnp.array([0.1, 0.0, -0.2])}
    return jr.EnvRunner(envs, scan_policy(3), params, MA_T, seed=MA_SEED, callbacks=callbacks)


def samples(runner: jr.EnvRunner, count: int) -> list[Any]:
    return [runner.sample().to_numpy() for _ in range(count)]


def steady_metrics(runner: jr.EnvRunner) -> Any:
    """The metrics that do not depend on timing (NaN as None, for equality)."""

    def clean(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in ("perf", "env_steps_per_s")}
        return None if isinstance(x, float) and x != x else x

    return clean(runner.get_metrics())


def split_run(make_runner, tmp_path, before: int, after: int, **restore_kwargs):
    """``before`` samples, a save, a new runner (new envs) restored, ``after`` samples:
    the samples, the restore's report, the metrics and what the callbacks saw."""
    path = tmp_path / "runner.ckpt"
    with make_runner() as runner:
        head = samples(runner, before)
        seen = list(getattr(runner.callbacks, "seen", []))
        runner.save(path)
    with make_runner() as resumed:
        report = resumed.restore(path, **restore_kwargs)
        tail = samples(resumed, after)
        metrics = steady_metrics(resumed)
        seen += getattr(resumed.callbacks, "seen", [])
    return jr.concatenate(head + tail), report, metrics, seen


def whole_run(make_runner, count: int):
    """``count`` samples of one runner: the samples, metrics and what callbacks saw."""
    with make_runner() as runner:
        whole = jr.concatenate(samples(runner, count))
        return whole, steady_metrics(runner), list(getattr(runner.callbacks, "seen", []))


def env_ended(traj) -> np.ndarray:
    """[T, B]: where an env's episode ended."""
    return traj.terminated | traj.truncated if isinstance(traj, jr.Trajectory) else traj.env_done


# -- exact resume --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, num_splits",
    [("cartpole", 1), ("cartpole", 2)] + [(n, 1) for n in ENVS if n != "cartpole"],
)
def test_sync_backend_resumes_bit_for_bit(name, num_splits, tmp_path):
    """k samples, a save, a NEW runner on new envs restored: its samples, metrics and
    callbacks are exactly those the original run produces by going on."""
    needs(name)

    def make_runner():
        splits = {"num_splits": num_splits} if num_splits > 1 else None
        return make(name, callbacks=Recorder(), runner_kwargs=splits)

    whole, want_metrics, want_seen = whole_run(make_runner, 5)
    split, report, metrics, seen = split_run(make_runner, tmp_path, 2, 3, load_env_pickles=True)
    assert report.envs_restored and "unpickled" in report.note
    T = 11 if name == "cartpole" else MA_T
    ended = env_ended(whole)
    assert ended[: 2 * T].any() and ended[2 * T :].any()  # episodes cross the save
    if isinstance(whole, jr.Trajectory):
        assert whole.terminated.any() and whole.truncated.any()
    else:
        group = next(iter(whole.groups.values()))
        # Agent turns cross the save: their state had to resume.
        assert group.valid[2 * T].any() and (group.agent_step[2 * T][group.valid[2 * T]] > 0).any()
        assert metrics["num_agent_steps"] > 0
    assert_trees_equal(split, whole, "trajectory")
    assert metrics == want_metrics and metrics["num_episodes"] > 0
    assert seen == want_seen and len(want_seen) > 5  # episodes under way at the save too


@pytest.mark.parametrize("name", TWO_KINDS)
def test_a_runner_that_has_sampled_restores_as_a_new_one_does(name, tmp_path):
    """``restore`` into a runner that has sampled already replaces all it sampled: its
    samples, metrics and callbacks then go on exactly as the saved run's do."""
    needs(name)

    def make_runner():
        return make(name, callbacks=Recorder())

    whole, want_metrics, want_seen = whole_run(make_runner, 4)
    path = tmp_path / "runner.ckpt"
    with make_runner() as runner:
        head = samples(runner, 2)
        seen = list(runner.callbacks.seen)
        runner.save(path)
    with make_runner() as used:
        samples(used, 3)  # its own episodes under way, its own metrics
        own = len(used.callbacks.seen)
        assert used.restore(path, load_env_pickles=True).envs_restored
        tail = samples(used, 2)
        metrics = steady_metrics(used)
        seen += used.callbacks.seen[own:]
    assert_trees_equal(jr.concatenate(head + tail), whole, "trajectory")
    assert metrics == want_metrics and seen == want_seen and want_seen


@pytest.mark.parametrize("name", ["walk", "drift"])  # pure-JAX: single- and multi-agent
def test_a_pure_jax_env_resumes_bit_for_bit(name, tmp_path):
    """The env states are in the sampler state."""
    if name == "drift":
        pytest.importorskip("pettingzoo")

    def make_runner():
        return walk_runner(callbacks=Recorder()) if name == "walk" else drift_runner(Recorder())

    whole, want_metrics, want_seen = whole_run(make_runner, 4)
    split, report, metrics, seen = split_run(make_runner, tmp_path, 2, 2)
    assert report.envs_restored and "sampler's state" in report.note
    assert env_ended(whole).any()
    if name == "drift":
        group = whole.groups["policy_0"]
        # Env and agent episodes cross the save: their state had to resume.
        assert env_ended(whole)[: 2 * MA_T].any()
        assert (group.agent_step[2 * MA_T][group.valid[2 * MA_T]] > 0).any()
        assert metrics["num_agent_steps"] > 0
    assert len(want_seen) > 3
    assert_trees_equal(split, whole, "trajectory")
    assert metrics == want_metrics
    assert seen == want_seen


@pytest.mark.parametrize("name", KINDS)
def test_restarted_sub_envs_resume_with_their_restart_seeds(name, tmp_path):
    """Under a restart_policy a restarted sub-env is reset with a seed drawn from its
    restarts so far: the sub-env pickles keep that count, so a resumed run restarts
    into the episodes the unbroken run does (every env fails at its 4th step call, so
    each restarts several times on both sides of the save)."""
    from jaxrunner.testing import FaultPlan, faulty_env_fns

    needs(name)
    num_envs = 5 if name == "cartpole" else MA_NUM_ENVS

    def make_faulty():
        fns = faulty_env_fns(ENVS[name][0], num_envs, faults=[FaultPlan(at=(4,))])
        return make(name, env_fn=fns, restart_policy=jr.RestartPolicy())

    with make_faulty() as runner:
        whole = jr.concatenate(samples(runner, 4))
        assert runner.envs.num_restarts >= 10
    split, report, _, _ = split_run(make_faulty, tmp_path, 2, 2, load_env_pickles=True)
    assert report.envs_restored
    assert_trees_equal(split, whole, "trajectory")


def faulty_runner(name: str) -> jr.EnvRunner:
    """A sync runner under a restart policy whose episodes fault: CartPole's sub-envs
    fail at their 6th step call, coming_and_going's sub-env 1 returns a NaN observation
    once (its episode ends as a fault; the restart policy recreates it)."""
    from jaxrunner.testing import FaultPlan, faulty_env_fns

    if name == "cartpole":
        fns = faulty_env_fns(short_cartpole, 5, faults=[FaultPlan(at=(6,))])
    else:
        fns = [envs_mod.coming_and_going] * MA_NUM_ENVS
        arm_seed = jr.env_seeds(MA_SEED, MA_NUM_ENVS)[1]
        fns[1] = functools.partial(envs_mod.BadOutputs, "nan_obs", arm_seed)
    return make(name, env_fn=fns, restart_policy=jr.RestartPolicy())


@pytest.mark.parametrize("name", TWO_KINDS)
def test_a_faulty_episode_is_saved_and_restored_faulty(name, tmp_path):
    """sample_episodes(include_faulty=True) keeps episodes cut by their env's failure;
    saved and restored (the sub-envs unpickled), they are faulty still, and the resumed
    runner returns what the unbroken one does. A file without the ``faulty`` key
    (written before it was saved) restores them as not faulty."""
    needs(name)
    path = tmp_path / "faulty.ckpt"
    with faulty_runner(name) as runner:
        while not any(e.faulty for e in runner.state.finished):
            runner.sample_episodes(len(runner.state.finished) + 1, include_faulty=True)
        kept = list(runner.state.finished)
        runner.save(path)
        want = runner.sample_episodes(len(kept) + 3, include_faulty=True)
    faulty = [e.faulty for e in kept]
    assert any(faulty) and all(e.truncated for e in kept if e.faulty)
    if name != "cartpole":
        assert not all(faulty)
    with faulty_runner(name) as runner:
        assert runner.restore(path, load_env_pickles=True).envs_restored
        assert [e.faulty for e in runner.state.finished] == faulty
        assert_trees_equal(runner.state.finished, kept, "kept episodes")
        got = runner.sample_episodes(len(kept) + 3, include_faulty=True)
    assert_trees_equal(got, want, "episodes")
    assert [e.faulty for e in got] == [e.faulty for e in want]

    older = tmp_path / "without_faulty.ckpt"
    rewrite(path, older, meta=lambda m: [e.pop("faulty") for e in m["finished"]])
    with faulty_runner(name) as runner:
        assert runner.restore(older, load_env_pickles=True).envs_restored
        assert not any(e.faulty for e in runner.state.finished)
        assert [e.episode_id for e in runner.state.finished] == [e.episode_id for e in kept]


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


def saved_callbacks(name: str) -> Recorder | None:
    """The callbacks of the runner that wrote ``saved(name)`` and the files of
    OLD_FILES: a Recorder on a PettingZoo env, none on CartPole."""
    return None if name == "cartpole" else Recorder()


def resumed_run(make_runner, path, **restore_kwargs) -> tuple:
    """What a new runner restored from ``path`` does next: two samples, the metrics,
    a sample_episodes call (which takes the kept episodes), what its callbacks saw."""
    with make_runner() as runner:
        assert runner.restore(path, **restore_kwargs).envs_restored
        trajs = samples(runner, 2)
        episodes = runner.sample_episodes(4)
        return trajs, steady_metrics(runner), episodes, getattr(runner.callbacks, "seen", None)


def assert_equal_but_policy_floats(got: Any, want: Any, where: str) -> None:
    """Exactly equal trees, except the policy's float outputs (``extras``), which may
    differ in the last bit: the stored files' params and recurrent state come from
    another CPU, whose XLA may round differently (GRU's orthogonal init does)."""
    got_leaves, got_def = jax.tree_util.tree_flatten_with_path(got)
    want_leaves, want_def = jax.tree_util.tree_flatten_with_path(want)
    assert got_def == want_def, where
    for (path, a), (_, b) in zip(got_leaves, want_leaves):
        name = f"{where}: {jax.tree_util.keystr(path)}"
        if "extras" in name and np.asarray(a).dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=name)
        else:
            assert_trees_equal(a, b, name)


@pytest.mark.parametrize("name", TWO_KINDS)
def test_checkpoints_of_earlier_versions_resume_exactly(name, saved, tmp_path):
    """Files of the earlier versions (written by the earlier code, at the point the
    ``saved`` fixture saves) restore as this version's file of the same run does: the
    same samples, metrics, kept episodes and callbacks. CartPole's: version 2, and
    version 1 (version 2's with its sub-env pickles bare); coming_and_going's: a
    MultiAgentRunner's version 1. Both: version 3 (version 4's layout under the format
    name of its runner)."""
    needs(name)
    v3 = tmp_path / "version3.ckpt"
    if name == "cartpole":
        v2 = OLD_FILES / "env_runner_v2_sync.ckpt"
        v1 = tmp_path / "version1.ckpt"
        rewrite(v2, v1, meta=lambda m: m.update(version=1), members=bare_snapshots(v2))
        old_files = [v2, v1, v3]
        legacy = "jaxrunner.EnvRunner checkpoint"
    else:
        old_files = [OLD_FILES / "multi_agent_runner_v1_sync.ckpt", v3]
        legacy = "jaxrunner.MultiAgentRunner checkpoint"
    with np.load(saved(name)) as data:
        saved_meta = json.loads(str(data["__meta__"]))
        assert (saved_meta["format"], saved_meta["version"]) == ("jaxrunner checkpoint", 4)
    rewrite(saved(name), v3, meta=lambda m: m.update(format=legacy, version=3))

    def make_runner():
        return make(name, callbacks=saved_callbacks(name))

    want = resumed_run(make_runner, saved(name), load_env_pickles=True)
    for path in old_files:
        got = resumed_run(make_runner, path, load_env_pickles=True)
        assert_equal_but_policy_floats(got[0], want[0], f"{path.name}: trajectories")
        assert got[1] == want[1], path.name
        assert_equal_but_policy_floats(got[2], want[2], f"{path.name}: episodes")
        assert got[3] == want[3], path.name
    if name != "cartpole":
        assert len(want[3]) > 3


def test_single_agent_files_without_callback_fragments_restore_with_none(saved, tmp_path):
    """A single-agent runner's files written before it kept the callbacks' fragments
    (version 2, and version 4 of then) restore with none: the hook sees the episodes
    that end after the restore, but those under way at the save (seen in part)."""
    then = tmp_path / "version4_then.ckpt"
    rewrite(saved("cartpole"), then, meta=lambda m: m.pop("callback_fragments"))
    for path in (OLD_FILES / "env_runner_v2_sync.ckpt", then):
        with make("cartpole", callbacks=Recorder()) as runner:
            assert runner.restore(path, load_env_pickles=True).envs_restored
            assert runner.state.callback_episodes.fragments == {}
            first, *_ = samples(runner, 3)
            under_way = {e.episode_id for e in first.split_episodes() if e.start_step > 0}
            ids = {episode_id for episode_id, *_ in runner.callbacks.seen}
            assert under_way and ids and not ids & under_way, path.name


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


@pytest.mark.parametrize("name", KINDS)
def test_sample_episodes_resumes_with_its_fragments(name, tmp_path):
    needs(name)
    head_n, tail_n = (4, 6) if name == "cartpole" else (5, 9)
    with make(name) as runner:
        whole = runner.sample_episodes(head_n) + runner.sample_episodes(tail_n)
    path = tmp_path / "runner.ckpt"
    with make(name) as runner:
        head = runner.sample_episodes(head_n)
        assert runner.state.episodes.fragments and runner.state.finished  # both kinds are saved
        runner.save(path)
    with make(name) as resumed:
        resumed.restore(path, load_env_pickles=True)
        tail = resumed.sample_episodes(tail_n)

    def key(e):  # an agent episode is an env episode's and an agent's
        return (e.episode_id, getattr(e, "agent_id", None))

    assert [key(e) for e in head + tail] == [key(e) for e in whole]
    for got, want in zip(head + tail, whole, strict=True):
        assert_trees_equal(got, want, f"episode {key(want)}")


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


GRU_KERNEL = "params/default_policy/module/params/GRUCell_0/hn/kernel"


@pytest.mark.parametrize(
    "name, policy_ids, agents, params_member",
    [
        ("cartpole", ["default_policy"], ["agent_0"], GRU_KERNEL),
        ("coming_and_going", ["policy_0"], None, "params/policy_0/w"),
    ],
)
def test_the_file_loads_without_pickle(name, policy_ids, agents, params_member, tmp_path):
    needs(name)
    path = tmp_path / "runner.ckpt"
    with make(name) as runner:
        runner.sample()
        runner.save(path)
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["__meta__"]))
        assert (meta["format"], meta["version"]) == ("jaxrunner checkpoint", 4)  # either kind
        assert meta["envs"] == "pickle" and meta["num_envs"] == runner.envs.num_envs
        # The one layout of both runners: an EnvRunner is one policy of one agent.
        assert meta["policy_ids"] == policy_ids
        if agents is not None:
            assert meta["possible_agents"] == agents
        assert data[params_member].dtype == np.float32
        assert data["envs/0"].dtype == np.uint8  # the pickles are bytes, loaded on request


def first_obs_by_hand(factory, seed: int, steps_done: int, num_envs: int) -> list[Any]:
    """Each sub-env's first observations after a reset with the documented seeds."""
    out = []
    for seed_b in jr.env_seeds((seed, steps_done), num_envs):
        env = factory()
        obs, _ = env.reset(seed=seed_b)
        out.append(obs)
    return out


@pytest.mark.parametrize("name", TWO_KINDS)
def test_without_the_opt_in_episodes_restart_with_documented_seeds(name, tmp_path):
    needs(name)
    path = tmp_path / "runner.ckpt"
    with make(name) as runner:
        head = runner.sample()
        policy_id = runner.policy_ids[0]
        trained = jax.tree.map(lambda x: x + 0.5, runner.get_params(policy_id))
        runner.set_params(trained, policy_id)
        runner.sample()
        runner.save(path)
        saved = steady_metrics(runner)
        assert saved["num_episodes"] > 0
        book = runner.sampler._book
        next_id, steps_done = int(book.next_episode_id), int(book.steps_done)
        num_envs, T = runner.envs.num_envs, runner.rollout_length
    with make(name) as resumed:
        with pytest.warns(UserWarning, match="new episode"):
            report = resumed.restore(path)
        assert not report.envs_restored and "load_env_pickles" in report.note
        assert steady_metrics(resumed) == saved
        got_params = jax.device_get(resumed.get_params(policy_id))
        assert_trees_equal(got_params, jax.device_get(trained), "params")
        traj = resumed.sample()
        after = resumed.get_metrics()
    np.testing.assert_array_equal(traj.step[0], 0)
    np.testing.assert_array_equal(traj.episode_id[0], next_id + np.arange(num_envs))
    assert traj.episode_id.min() > head.episode_id.max()
    assert after["num_env_steps"] == saved["num_env_steps"] + T * num_envs
    seed = SEED if name == "cartpole" else MA_SEED
    starts = first_obs_by_hand(ENVS[name][0], seed, steps_done, num_envs)
    if name == "cartpole":
        np.testing.assert_array_equal(traj.obs[0], np.stack(starts))
        # Fresh reset seeds: not the starts of the first run.
        assert not np.array_equal(traj.obs[0], head.obs[0])
        return
    group, agents = traj.groups[policy_id], traj.agents[policy_id]
    for b, obs in enumerate(starts):
        assert sorted(agents[a] for a in np.flatnonzero(group.valid[0, b])) == sorted(obs)
        np.testing.assert_array_equal(group.agent_step[0, b][group.valid[0, b]], 0)
        for agent, value in obs.items():
            np.testing.assert_array_equal(group.obs[0, b, agents.index(agent)], value)


class Unpicklable(gymnasium.Wrapper):
    """Holds a lock, which does not pickle."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.lock = threading.Lock()


def test_bfloat16_params_restore_exactly(tmp_path):
    envs = jr.make_vec(short_cartpole, 2)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    with jr.EnvRunner(envs, policy, params, 4, SEED) as runner:
        runner.save(tmp_path / "bf16.ckpt")
        runner.set_params(jax.tree.map(jnp.zeros_like, params))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the envs restart: not this test's point
            runner.restore(tmp_path / "bf16.ckpt")
        restored = runner.get_params()
    assert jax.tree.map(lambda x: x.dtype, restored) == jax.tree.map(lambda x: x.dtype, params)
    assert_trees_equal(restored, params)


def test_envs_that_cannot_be_snapshot_restart_cleanly(tmp_path):
    def make_runner():
        return make(env_fn=lambda: Unpicklable(short_cartpole()))

    path = tmp_path / "runner.ckpt"
    with make_runner() as runner:
        runner.sample()
        with pytest.warns(UserWarning, match="could not be pickled.*a restore starts new"):
            runner.save(path)  # said at once, as at the restore
    with make_runner() as resumed:
        with pytest.warns(UserWarning, match="could not be pickled"):
            report = resumed.restore(path, load_env_pickles=True)
        assert not report.envs_restored
        traj = resumed.sample()
    np.testing.assert_array_equal(traj.step[0], 0)


class FirstStepInfo(gymnasium.Wrapper):
    """Reports info entry ``first`` at its first step only (its count is pickled)."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.steps = 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps == 1:
            info = {**info, "first": 1.0}
        return obs, reward, terminated, truncated, info


def first_step_info_cartpole() -> gymnasium.Env:
    return FirstStepInfo(short_cartpole())


@pytest.mark.parametrize("info_keys", ["all", ("first",)])
def test_the_info_names_reported_before_a_save_are_known_after_it(info_keys, tmp_path):
    """``"all"`` keeps every name reported so far in later samples, and a named entry
    seen before the save is not refused as unseen after it: the resumed run equals the
    unbroken one."""

    def make_runner():
        return make(env_fn=first_step_info_cartpole, runner_kwargs={"info_keys": info_keys})

    path = tmp_path / "runner.ckpt"
    with make_runner() as runner:
        runner.sample()  # the entry's one report
        runner.save(path)
        unbroken = [runner.sample() for _ in range(3)]  # episodes end (13 steps at most)
    with make_runner() as resumed:
        assert resumed.restore(path, load_env_pickles=True).envs_restored
        for expected in unbroken:
            assert_trees_equal(resumed.sample(), expected, "trajectory")


def test_a_pure_jax_runner_ignores_info_names_it_has_no_recorder_for(tmp_path):
    """A pure-JAX runner records no infos: a file's (well-formed) info_names change
    nothing, and the restore goes through."""
    src, dst = tmp_path / "saved.ckpt", tmp_path / "named.ckpt"
    with walk_runner() as runner:
        runner.sample()
        runner.save(src)
        expected = runner.sample()
    names = {"every": False, "keys": ["x"], "unseen": ["x"], "reported": []}
    rewrite(src, dst, meta=lambda m: m.update(info_names=names))
    with walk_runner() as resumed:
        assert resumed.restore(dst).envs_restored
        assert_trees_equal(resumed.sample(), expected, "trajectory")


def test_a_save_that_fails_leaves_no_file_behind(tmp_path, monkeypatch):
    (tmp_path / "a_folder").mkdir()
    with make() as runner:
        with monkeypatch.context() as patch:  # written whole, then the rename fails
            patch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk")))
            with pytest.raises(OSError, match="disk"):
                runner.save(tmp_path / "c.ckpt")
        assert [p.name for p in tmp_path.iterdir()] == ["a_folder"]
        with pytest.raises(InvalidArgumentError, match=r"'.*a_folder'\): that is a folder"):
            runner.save(tmp_path / "a_folder")  # refused before anything is written
    assert [p.name for p in tmp_path.iterdir()] == ["a_folder"]
    with make() as runner:  # refused before anything is written, naming the path
        with pytest.raises(InvalidArgumentError, match=r"folder '.*nowhere' does not exist"):
            runner.save(tmp_path / "nowhere" / "c.ckpt")
        with pytest.raises(TypeError, match=r"save\(path=None\): expected a file path"):
            runner.save(None)
        with pytest.raises(TypeError, match=r"restore\(path=3\): expected a file path"):
            runner.restore(3)  # an int would be a file descriptor to open()


def test_restore_refuses_another_shape_of_runner(tmp_path):
    path = tmp_path / "runner.ckpt"
    with make() as runner:
        runner.save(path)
    with make(num_envs=4) as other, pytest.raises(InvalidArgumentError, match="num_envs=5"):
        other.restore(path)
    with walk_runner() as other, pytest.raises(InvalidArgumentError, match="sampler="):
        other.restore(path)


def test_a_pure_jax_env_checkpoint_is_not_a_host_runners(tmp_path):
    pytest.importorskip("pettingzoo")
    path = tmp_path / "runner.ckpt"
    with drift_runner() as runner:
        runner.sample()
        runner.save(path)
    with make("coming_and_going") as host, pytest.raises(InvalidArgumentError, match="sampler"):
        host.restore(path)


def test_restore_refuses_other_params(tmp_path):
    path = tmp_path / "runner.ckpt"
    with make() as runner:
        runner.save(path)
    envs = jr.make_vec(short_cartpole, 5)
    policy = mlp_policy(envs.single_action_space, hidden=(16,))
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    with (
        jr.EnvRunner(envs, policy, params, rollout_length=11, seed=SEED) as other,
        pytest.raises(InvalidArgumentError, match="params"),
    ):
        other.restore(path)


@pytest.mark.parametrize("name", TWO_KINDS)
def test_sample_episodes_progress_line(name, capsys, monkeypatch):
    import builtins

    needs(name)
    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name.startswith("tqdm"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    with make(name) as runner, warnings.catch_warnings():
        warnings.simplefilter("error")
        runner.sample_episodes(3, progress=True)
        assert capsys.readouterr().err.strip().endswith("3/3 episodes")
        runner.sample_episodes(1)
        assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "name, ready_first",
    [("cartpole", False), ("cartpole", True), ("coming_and_going", False), ("relay", False)],
)
def test_process_backend_restarts_episodes_and_says_so(name, ready_first, tmp_path):
    """Sub-envs in other processes cannot be snapshot: the resumed runner starts new
    episodes (those the sync backend starts without the opt-in), and the rest (ids,
    metrics, policy step counts) goes on."""
    needs(name)
    config = jr.ProcessConfig(num_workers=2, ready_first=ready_first)
    num_envs = 4 if name == "cartpole" else MA_NUM_ENVS
    path = tmp_path / "runner.ckpt"
    with make(name, "process", num_envs, config=config) as runner:
        runner.sample()
        runner.save(path)
        saved = steady_metrics(runner)
        next_id = int(runner.sampler._book.next_episode_id)
        T = runner.rollout_length
    with make(name, "process", num_envs, config=config) as resumed:
        with pytest.warns(UserWarning, match="cannot snapshot"):
            report = resumed.restore(path, load_env_pickles=True)
        assert not report.envs_restored and type(resumed.envs).__name__ in report.note
        traj = resumed.sample().to_numpy()
        after = steady_metrics(resumed)
    np.testing.assert_array_equal(traj.step[0], 0)
    np.testing.assert_array_equal(traj.episode_id[0], next_id + np.arange(num_envs))
    assert after["num_env_steps"] == saved["num_env_steps"] + T * num_envs
    if ready_first:
        return  # which envs answer first is the machine's: no sync twin
    # The same restart on the sync backend (no opt-in) gives the same trajectory.
    with make(name, num_envs=num_envs) as sync:
        with pytest.warns(UserWarning, match="new episode"):
            sync.restore(path)
        assert_trees_equal(sync.sample().to_numpy(), traj, "trajectory")


@pytest.mark.parametrize("name", TWO_KINDS)
def test_sync_checkpoint_on_the_process_backend_starts_new_episodes(name, saved):
    """A backend that cannot take the sync backend's sub-env pickles starts new
    episodes and says why."""
    needs(name)
    with make(name, "process", config=jr.ProcessConfig(num_workers=2)) as other:
        with pytest.warns(UserWarning, match="cannot restore sub-env snapshots"):
            report = other.restore(saved(name), load_env_pickles=True)
        assert not report.envs_restored
        traj = other.sample()
    np.testing.assert_array_equal(traj.step[0], 0)


# -- damaged and hostile checkpoints (issue 30, items 3, 4 and 13) ------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``saved(name)``: a checkpoint of a runner on env ``name`` mid-run: pickled sub-envs,
    sample_episodes' fragments and finished episodes (and on a PettingZoo env the
    callbacks' fragments); written once per module."""
    files: dict[str, pathlib.Path] = {}

    def get(name: str) -> pathlib.Path:
        if name not in files:
            path = tmp_path_factory.mktemp("saved") / f"{name}.ckpt"
            with make(name, callbacks=saved_callbacks(name)) as runner:
                runner.sample_episodes(4 if name == "cartpole" else 3)
                assert runner.state.episodes.fragments and runner.state.finished
                if name != "cartpole":
                    assert runner.state.callback_episodes.fragments
                runner.save(path)
            files[name] = path
        return files[name]

    return get


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


def negate(array: np.ndarray) -> np.ndarray:
    return -np.abs(array) - 1


def truncated(src, dst) -> None:
    data = src.read_bytes()
    dst.write_bytes(data[: len(data) // 2])


def finished_twice(src, dst) -> None:
    """One more finished episode, a copy of the first (same id; same agent)."""
    with np.load(src) as data:
        n = len(json.loads(str(data["__meta__"]))["finished"])
    with zipfile.ZipFile(src) as zf:
        copies = {
            name.replace("finished/0/", f"finished/{n}/"): zf.read(name)
            for name in zf.namelist()
            if name.startswith("finished/0/")
        }
    rewrite(src, dst, meta=lambda m: m["finished"].append(dict(m["finished"][0])), members=copies)


def set_key(field: str, key: str, value: Any):
    """Key ``key`` of the first entry of the metadata's list ``field`` set to ``value``."""

    def edit(m: dict) -> None:
        m[field][0][key] = value

    return meta(edit)


def snapshot_of(thing: Any):
    """Member envs/1 replaced by a pickle of ``thing``."""
    return member("envs/1", np.frombuffer(pickle.dumps(thing), np.uint8))


def huge_referenced(src, dst) -> None:
    """A finished episode's reward whose header promises 8 TiB."""
    huge = _npy(np.zeros(2)).replace(b"(2,)", b"(1099511627776,)")
    rewrite(src, dst, members={"finished/0/reward.npy": huge})


CLAIMS_800_GB = b"(100000000000, 2)"
"""A float32 header shape of 800 GB."""
MA_GROUP = "sampler/groups/policy_0"


UNSEEN_WITHOUT_KEY = {"every": False, "keys": [], "unseen": ["x"], "reported": []}
"""An info_keys recorder's names that no recorder has: an unseen name it does not record."""


def hostile(name: str, saved) -> dict[str, tuple]:
    """id -> (how ``saved(name)`` is damaged, what the error must name): the cases of
    every kind, then the kind's own."""
    if name == "cartpole":
        n, actions, W, w_shape, obs = 5, 2, GRU_KERNEL, (8, 8), "sampler/obs"
        repeated, other_kind = "repeated id", OLD_FILES / "multi_agent_runner_v1_sync.ckpt"
        expected = (
            r"expected a jaxrunner checkpoint version 4 \(or a jaxrunner.EnvRunner checkpoint "
            r"version 1 or 2 or 3, written before\), got 'jaxrunner.MultiAgentRunner checkpoint'"
        )
    else:
        n, actions, W, w_shape, obs = MA_NUM_ENVS, 3, "params/policy_0/w", (3,), f"{MA_GROUP}/obs"
        repeated, other_kind = r"repeated \(episode id, agent\)", saved("cartpole")
        expected = r"saved by a runner with sampler='LockstepSampler'"
    w_npy = _npy(np.zeros(w_shape, np.float32))
    w_header = str(w_shape).encode()
    cases = {
        "truncated zip": (truncated, "cannot be opened"),
        "not a zip": (lambda src, dst: dst.write_bytes(b"PK\x03\x04 junk"), "cannot be opened"),
        "bad JSON": (member("__meta__", np.array("{" * 100_000)), "not valid JSON"),
        "deep JSON": (member("__meta__", np.array("[" * 100_000)), "not valid JSON"),
        "JSON list": (member("__meta__", np.array("[1, 2]")), "not a JSON object"),
        "meta as numbers": (member("__meta__", np.zeros(3)), "metadata"),
        "another kind of runner's": (lambda src, dst: shutil.copyfile(other_kind, dst), expected),
        "wrong policy ids": (meta(lambda m: m.update(policy_ids=["hero"])), "policy_ids"),
        "wrong agents": (meta(lambda m: m.update(possible_agents=["a0"])), "possible_agents"),
        "other num_envs": (meta(lambda m: m.update(num_envs=n - 1)), "num_envs"),
        "string seed": (meta(lambda m: m.update(seed="3")), "seed"),
        "negative seed": (meta(lambda m: m.update(seed=-1)), "seed"),
        "seed no runner takes": (meta(lambda m: m.update(seed=2**63)), "seed=9223372036854775808"),
        "seed of 2**64": (meta(lambda m: m.update(seed=2**64)), "seed=18446744073709551616"),
        "float num_envs": (meta(lambda m: m.update(num_envs=float(n))), "num_envs"),
        "zero rollout_length": (meta(lambda m: m.update(rollout_length=0)), "rollout_length"),
        "unknown envs kind": (meta(lambda m: m.update(envs="magic")), "envs="),
        "info_names a list": (meta(lambda m: m.update(info_names=[])), "info_names"),
        "info_names unseen but no key": (
            meta(lambda m: m.update(info_names=UNSEEN_WITHOUT_KEY)),
            "info_names",
        ),
        "envs_note a list": (meta(lambda m: m.update(envs_note=[])), "envs_note"),
        "metrics paths": (meta(lambda m: m.update(metrics=[["counters"]])), "metrics"),
        "finished not a list": (meta(lambda m: m.update(finished={})), "finished"),
        "episode id a string": (
            set_key("finished", "episode_id", "4"),
            r"finished\[0\]\.episode_id",
        ),
        "episode id too big": (
            set_key("finished", "episode_id", 10**6),
            r"finished\[0\]\.episode_id",
        ),
        "truncated an int": (set_key("finished", "truncated", 1), r"finished\[0\]\.truncated"),
        "terminated an int": (set_key("finished", "terminated", 1), r"finished\[0\]\.terminated"),
        "env id out of range": (set_key("fragments", "env_id", n), r"fragments\[0\]\.env_id"),
        "fragment of env 99": (set_key("fragments", "env_id", 99), r"fragments\[0\]\.env_id=99"),
        "negative start_step": (
            set_key("finished", "start_step", -2),
            r"finished\[0\]\.start_step",
        ),
        "extra episode key": (set_key("finished", "spare", 1), r"finished\[0\]"),
        "paths miss obs": (set_key("finished", "paths", [["action"], ["reward"]]), "paths"),
        "paths not lists": (set_key("finished", "paths", "obs"), "paths"),
        "extras path an int": (set_key("finished", "extras", [[0]]), "extras"),
        "extras unknown member": (set_key("finished", "extras", [["nope"]]), "nope"),
        "fragment terminated": (set_key("fragments", "terminated", True), r"fragments\[0\]"),
        "fragment truncated": (set_key("fragments", "truncated", True), r"fragments\[0\]"),
        "finished twice": (finished_twice, repeated),
        "faulty a string": (set_key("finished", "faulty", "yes"), r"finished\[0\]\.faulty='yes'"),
        "faulty but not truncated": (
            meta(lambda m: m["finished"][0].update(faulty=True, terminated=True, truncated=False)),
            r"finished\[0\]\.faulty=true but truncated=false",
        ),
        "negative steps_done": (member("sampler/book/steps_done", np.int64(-1)), "steps_done"),
        "steps_done a string": (member("sampler/book/steps_done", np.array("7")), "steps_done"),
        "rewound next id": (member("sampler/book/next_episode_id", np.int64(1)), "next_episode_id"),
        "repeated episode ids": (
            member("sampler/book/episode_id", np.zeros(n, np.int64)),
            "sampler/book/episode_id",
        ),
        "begin after steps_done": (
            member("sampler/book/episode_begin", np.full(n, 10**9, np.int64)),
            "episode_begin",
        ),
        "NaN episode return": (
            member("sampler/book/episode_return", np.full(n, np.nan)),
            "episode_return",
        ),
        "counters of length 6": (
            member("metrics/counters", np.zeros(6, np.int64)),
            "metrics/counters",
        ),
        "negative counter": (edited("metrics/counters", negate), "metrics/counters"),
        "returns as strings": (member("metrics/returns", np.array(["1.0"])), "metrics/returns"),
        "NaN returns": (edited("metrics/returns", nan_at_end), "metrics/returns not finite"),
        "returns unlike lengths": (
            member("metrics/lengths", np.ones(7, np.int64)),
            "metrics/returns",
        ),
        "short perf": (member("metrics/perf", np.zeros(2)), "metrics/perf"),
        "negative perf": (member("metrics/perf", -np.ones(4)), "metrics/perf"),
        "params shape": (member(W, np.zeros((3, 3), np.float32)), W),
        "params dtype": (member(W, np.zeros(w_shape, np.float64)), W),
        "params as objects": (member(W, np.array([{}] * 3, object)), W),
        "NaN params": (edited(W, nan_at_end), f"{W} not finite"),
        "infinite params": (edited(W, infinite), f"{W} not finite"),
        "header claims 800 GB": (member(W, w_npy.replace(w_header, CLAIMS_800_GB)), W),
        "params size lies": (member(W, w_npy.replace(w_header, b"(30, 8)")), "size"),
        "NaN latest observations": (edited(obs, nan_at_end), f"{obs} not finite"),
        "latest observations missing": (member(obs, None), obs),
        "NaN kept obs": (edited("finished/0/obs", nan_at_end), "finished/0/obs not finite"),
        "infinite kept obs": (edited("finished/0/obs", infinite), "finished/0/obs not finite"),
        "NaN fragment obs": (edited("fragments/0/obs", nan_at_end), "fragments/0/obs not finite"),
        "short kept obs": (
            edited("finished/0/obs", lambda a: a[:1]),
            "finished/0/obs",
        ),
        "NaN kept reward": (edited("finished/0/reward", nan_at_end), "finished/0/reward not"),
        "kept action outside the space": (
            edited("finished/0/action", lambda a: np.full_like(a, actions)),
            rf"finished/0/action row 0 \({actions}\) outside the runner's space "
            rf"Discrete\({actions}\)",
        ),
        "fragment action outside the space": (
            edited("fragments/0/action", lambda a: np.full_like(a, actions)),
            rf"fragments/0/action row 0 \({actions}\) outside the runner's space "
            rf"Discrete\({actions}\)",
        ),
        "huge referenced member": (huge_referenced, "finished/0/reward"),
        "an unread object member": (member("junk", np.array([{}], object)), "member 'junk'"),
        "an unread structured member": (
            member("spare", np.zeros(2, [("a", "f4"), ("b", object)])),
            "member 'spare'",
        ),
        "an env pickle where none belongs": (
            meta(lambda m: m.update(envs="none")),
            "member 'envs/0'",
        ),
        "pickle as floats": (member("envs/0", np.zeros(8)), "envs/0"),
        "pickle of None": (snapshot_of(None), "pickle envs/1 unpickled to a NoneType"),
    }
    if name == "cartpole":
        return cases | {
            "finished incomplete": (set_key("finished", "start_step", 3), r"finished\[0\]"),
            "fragment of another episode": (set_key("fragments", "episode_id", 4), "fragments"),
            "callback fragments not a list": (
                meta(lambda m: m.update(callback_fragments={})),
                "callback_fragments",
            ),
            "action of another shape": (
                member("finished/0/action", np.zeros((3, 2), np.int64)),
                "finished/0/",
            ),
            "version 4 params as version 2's": (
                meta(lambda m: m.update(version=2, format="jaxrunner.EnvRunner checkpoint")),
                "no 'params/module/params/Dense_0/bias'",
            ),
        }
    return cases | {
        "an older version": (
            meta(lambda m: m.update(version=2)),
            r"version 1 or 3, written before\), got 'jaxrunner checkpoint' version 2",
        ),
        "a version 2 under the old name": (
            meta(lambda m: m.update(version=2, format="jaxrunner.MultiAgentRunner checkpoint")),
            r"MultiAgentRunner checkpoint' version 2\.",
        ),
        "finished incomplete": (set_key("finished", "start_step", 2), r"finished\[0\]"),
        "kept not a list": (meta(lambda m: m.update(callback_fragments={})), "callback_fragments"),
        "carry shape": (member(f"{MA_GROUP}/actor/carry", np.zeros(3, np.float32)), "actor/carry"),
        "acting dtype": (
            member(f"{MA_GROUP}/acting", np.zeros((3, 4), np.int8)),
            f"{MA_GROUP}/acting",
        ),
        "group missing": (member(f"{MA_GROUP}/awaiting", None), f"{MA_GROUP}/awaiting"),
        "negative running length": (
            edited(f"{MA_GROUP}/running_length", negate),
            "running_length",
        ),
        "NaN running return": (
            edited(f"{MA_GROUP}/running_return", nan_at_end),
            "running_return",
        ),
        "negative agent counter": (
            edited("metrics/agents/counters", negate),
            "metrics/agents/counters",
        ),
        "agent steps do not add up": (
            edited("metrics/agents/counters", lambda a: a + 1),
            "metrics/agents/counters",
        ),
        "negative per-agent count": (
            edited("metrics/agents/agents/a1/counters", negate),
            "metrics/agents/agents/a1/counters",
        ),
        "NaN per-policy return": (
            edited("metrics/agents/policies/policy_0/returns", nan_at_end),
            "metrics/agents/policies/policy_0/returns",
        ),
        "NaN unassigned reward": (
            member("metrics/agents/unassigned_reward", np.float64(np.nan)),
            "unassigned_reward",
        ),
        "unknown policy": (set_key("finished", "policy_id", "hero"), r"finished\[0\]\.policy_id"),
        "agent of no policy": (set_key("finished", "agent_id", "zed"), r"finished\[0\]\.agent_id"),
        "callback fragment of env 99": (
            set_key("callback_fragments", "env_id", 99),
            r"callback_fragments\[0\]\.env_id=99",
        ),
        "callback fragment finished": (
            set_key("callback_fragments", "truncated", True),
            r"callback_fragments\[0\]",
        ),
        "negative env_step": (edited("fragments/0/env_step", negate), "fragments/0/env_step"),
        "callback fragment action outside the space": (
            edited("callback_fragments/0/action", lambda a: np.full_like(a, -1)),
            r"callback_fragments/0/action row 0 \(-1\) outside",
        ),
        "pickle of a gymnasium env": (
            snapshot_of({"env": gymnasium.make("CartPole-v1"), "driver": {}}),
            "envs/1 holds a TimeLimit, not a PettingZoo env",
        ),
        "pickle of a turn-based env": (
            snapshot_of({"env": envs_mod.relay(), "driver": {}}),
            "envs/1 holds a Relay, not stepped as a ParallelDriver",
        ),
        "pickle with an unknown live agent": (
            snapshot_of(
                {
                    "env": envs_mod.coming_and_going(),
                    "driver": {
                        "pending_reward": {},
                        "acted": [],
                        "started": [],
                        "live": ["zed"],
                        "newcomers": False,
                    },
                }
            ),
            "driver state's live is not a list of agent ids",
        ),
        "pickle with a bad driver state": (
            snapshot_of({"env": envs_mod.coming_and_going(), "driver": {"live": ["zed"]}}),
            "envs/1 holds a driver state that is refused",
        ),
    }


def runner_state(runner: jr.EnvRunner) -> dict:
    """Everything a restore may change, as host values (sub-envs by identity)."""
    return {
        "params": jax.device_get(dict(runner.state.params)),
        "sampler": jax.device_get(runner.sampler.get_state()),
        "metrics": runner.state.metrics.get_state(),
        "seed": runner.seed,
        "finished": list(runner.state.finished),
        "fragments": dict(runner.state.episodes.fragments),
        "callback_fragments": dict(getattr(runner.state.callback_episodes, "fragments", {})),
        "envs": [id(env) for env in runner.envs.get_sub_environments()],
    }


@pytest.mark.parametrize("load_env_pickles", [True, False])
@pytest.mark.parametrize("name", TWO_KINDS)
def test_restore_refuses_damaged_and_hostile_files_and_changes_nothing(
    name, saved, tmp_path, load_env_pickles
):
    """Every rejection is an InvalidArgumentError naming the field, raised before the
    runner changes, with or without the sub-env pickles (cases about the pickles only
    with); afterwards the runner samples exactly as an untouched one, and a new one
    restores the intact file."""
    needs(name)
    pytest.importorskip("pettingzoo")  # a case of each kind is the other kind's file
    with make(name, callbacks=Recorder()) as runner:
        runner.sample()
        before = runner_state(runner)
        for case, (damage, match) in hostile(name, saved).items():
            if case.startswith("pickle") and not load_env_pickles:
                continue
            path = tmp_path / f"{case}.ckpt"
            damage(saved(name), path)
            with pytest.raises(jr.errors.JaxRunnerError, match=match) as info:
                runner.restore(path, load_env_pickles=load_env_pickles)
            assert isinstance(info.value, InvalidArgumentError), case
            assert "snapshot 1" not in str(info.value), case
            assert_trees_equal(runner_state(runner), before, case)
        after_attacks = runner.sample()
        seen = runner.callbacks.seen
    with make(name, callbacks=Recorder()) as untouched:
        untouched.sample()
        assert_trees_equal(after_attacks, untouched.sample(), "trajectory")
        assert seen == untouched.callbacks.seen
    with make(name, callbacks=saved_callbacks(name)) as runner:
        assert runner.restore(saved(name), load_env_pickles=True).envs_restored
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


def test_a_jax_env_checkpoint_refuses_episodes_longer_than_the_steps_taken(tmp_path):
    """An episode step beyond the steps every env took (7 here) was restored, and the
    next sample recorded steps 1000007, ... (the host samplers refuse the like)."""
    path, damaged = tmp_path / "walk.ckpt", tmp_path / "damaged.ckpt"
    with walk_runner() as runner:
        runner.sample()
        runner.save(path)
    edited("sampler/rollout/episode_step", lambda step: step + 10**6)(path, damaged)
    with (
        walk_runner() as runner,
        pytest.raises(InvalidArgumentError, match=r"rollout/episode_step outside \[0, 7\]"),
    ):
        runner.restore(damaged)


@pytest.mark.parametrize(
    "make, name",
    [
        (walk_runner, "actor/env_steps"),
        (drift_runner, "actor/actors/policy_0/env_steps"),  # (agents act on their turns)
    ],
)
def test_a_jax_env_checkpoint_refuses_policy_steps_beyond_the_steps_taken(tmp_path, make, name):
    """A policy row's step count (which seeds its action keys) beyond the steps every env
    took (7 here) was restored silently: the next samples drew other actions."""
    path, damaged = tmp_path / "scan.ckpt", tmp_path / "damaged.ckpt"
    with make() as runner:
        runner.sample()
        runner.save(path)
    edited(f"sampler/rollout/{name}", lambda steps: steps + 10**6)(path, damaged)
    match = rf"rollout/{name} outside \[0, 7\]"
    with make() as runner, pytest.raises(InvalidArgumentError, match=match):
        runner.restore(damaged)
    with make() as runner:  # the steps as saved still restore
        assert runner.restore(path).envs_restored


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_bytes": True}, r"max_bytes=True\): expected an int >= 0"),
        ({"max_bytes": 1.5}, r"max_bytes=1\.5\): expected an int >= 0"),
        ({"max_bytes": -1}, r"max_bytes=-1\): expected an int >= 0"),
        ({"max_bytes": None}, r"max_bytes=None\): expected an int >= 0"),
        ({"load_env_pickles": "yes"}, r"load_env_pickles='yes'\): expected True or False"),
    ],
)
@pytest.mark.parametrize("name", TWO_KINDS)
def test_restore_refuses_bad_arguments(name, saved, kwargs, match):
    needs(name)
    with make(name) as runner:
        before = runner_state(runner)
        with pytest.raises(jr.errors.JaxRunnerError, match=r"EnvRunner\.restore\(" + match):
            runner.restore(saved(name), **kwargs)
        assert_trees_equal(runner_state(runner), before, "runner")
        assert runner.get_metrics()["num_env_steps"] == 0


@pytest.mark.parametrize("name", TWO_KINDS)
def test_restore_keeps_within_the_memory_limit(name, saved):
    """One limit for every runner's checkpoint: restore(..., max_bytes=...)."""
    needs(name)
    with make(name, callbacks=saved_callbacks(name)) as runner:
        before = runner_state(runner)
        with pytest.raises(
            InvalidArgumentError, match=r"max_bytes=64 \(restore\(\.\.\., max_bytes"
        ):
            runner.restore(saved(name), load_env_pickles=True, max_bytes=64)
        assert_trees_equal(runner_state(runner), before, "runner")
        assert runner.restore(saved(name), load_env_pickles=True).envs_restored  # the default fits


def test_a_seed_no_runner_takes_is_refused_at_construction():
    """The bound a checkpoint's seed is held to: what a runner takes (an int64)."""
    policy, params = gru()
    with (
        jr.make_vec(short_cartpole, 1) as envs,
        pytest.raises(InvalidArgumentError, match=r"seed=9223372036854775808"),
    ):
        jr.EnvRunner(envs, policy, params, rollout_length=3, seed=2**63)


@pytest.mark.parametrize("name", TWO_KINDS)
def test_restore_refuses_unreferenced_members_unread(name, saved, tmp_path):
    """A member no field references is refused by its name, never read (a header
    promising 8 TiB, bytes that are no .npy, an unused episode's arrays); the sub-env
    pickles of a checkpoint that holds them are referenced, and read only on request."""
    needs(name)
    huge = _npy(np.zeros(2)).replace(b"(2,)", b"(1099511627776,)")
    junk = {"junk.npy": huge, "noise.npy": b"\x00" * 100, "finished/9/reward.npy": huge}
    path = tmp_path / "padded.ckpt"
    with make(name) as runner:
        for member_name, data in junk.items():
            rewrite(saved(name), path, members={member_name: data})
            match = f"member '{member_name[:-4]}' that no field"
            with pytest.raises(InvalidArgumentError, match=match):
                runner.restore(path)
        rewrite(saved(name), path, members={"envs/0.npy": b"not read without load_env_pickles"})
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


@pytest.mark.parametrize("name", TWO_KINDS)
def test_restore_refuses_an_oversized_window_before_reading_it(name, saved, tmp_path):
    """A metrics window of 2**24 episodes (128 MiB once inflated, well within max_bytes)
    in a small file is refused from its header, longer than the runner's episode
    window: the restore allocates next to nothing (tracemalloc counts numpy's arrays)."""
    needs(name)
    path = tmp_path / "window.ckpt"
    rewrite(saved(name), path, members={"metrics/lengths.npy": None})
    deflated_member(path, "metrics/lengths.npy", "<i8", 1 << 24)
    assert path.stat().st_size < (1 << 20)
    with make(name) as runner:
        tracemalloc.start()
        try:
            with pytest.raises(InvalidArgumentError, match=r"metrics/lengths.*at most 100 entries"):
                runner.restore(path, load_env_pickles=True)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < (4 << 20), peak


@pytest.mark.parametrize("name", TWO_KINDS)
def test_restore_refuses_kept_episodes_longer_than_the_steps_counted(name, saved, tmp_path):
    """A kept episode's length is bounded, from its reward's header, by the steps the
    checkpoint's metrics count."""
    needs(name)
    path = tmp_path / "long.ckpt"
    rewrite(saved(name), path, members={"finished/0/reward.npy": None})
    deflated_member(path, "finished/0/reward.npy", "<f8", 1 << 20)
    with (
        make(name) as runner,
        pytest.raises(InvalidArgumentError, match=r"finished/0/reward.*steps the check"),
    ):
        runner.restore(path)


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "fifo", "directory"])
@pytest.mark.parametrize("name", TWO_KINDS)
def test_restore_refuses_what_is_not_a_regular_file_before_reading(name, tmp_path, special):
    """zipfile reads a device or a pipe without end looking for the end of the archive
    (and a pipe's open waits for a writer): refused before anything is read."""
    needs(name)
    path = special_path(special, tmp_path)
    with make(name) as runner:
        error, peak = refusal_and_peak(lambda: runner.restore(path), f"restore({special!r})")
    assert isinstance(error, InvalidArgumentError), error
    assert "is not a regular file" in str(error)
    assert peak < (4 << 20), peak


class NotAnEnv:
    """What a tampered pickle may hold instead of a sub-env."""


@pytest.mark.parametrize("thing", [None, NotAnEnv()])
@pytest.mark.parametrize("name", TWO_KINDS)
def test_restore_refuses_pickles_that_are_not_envs(name, saved, tmp_path, thing):
    needs(name)
    path = tmp_path / "tampered.ckpt"
    blob = np.frombuffer(pickle.dumps(thing), np.uint8)
    rewrite(saved(name), path, members={"envs/2.npy": _npy(blob)})
    with make(name, callbacks=saved_callbacks(name)) as runner:
        before = runner_state(runner)
        with pytest.raises(InvalidArgumentError, match="pickle envs/2 unpickled to a") as info:
            runner.restore(path, load_env_pickles=True)
        assert "snapshot 2" not in str(info.value) and "envs/0" not in str(info.value)
        assert_trees_equal(runner_state(runner), before, "runner")
        traj = runner.sample().to_numpy()  # the original sub-envs still step
    valid = traj.valid if isinstance(traj, jr.Trajectory) else traj.groups["policy_0"].valid
    assert valid.any() if name != "cartpole" else valid.all()


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


class FailingParallelReset(envs_mod.BaseParallelWrapper):
    """FailingReset's PettingZoo parallel twin."""

    def __init__(self, env) -> None:
        super().__init__(env)
        self.resets = 0

    def reset(self, seed=None, options=None):
        self.resets += 1
        if self.resets > 1:
            raise RuntimeError("this env resets once")
        return self.env.reset(seed=seed, options=options)


@pytest.mark.parametrize("name", TWO_KINDS)
def test_restore_undoes_the_sampler_state_when_the_fresh_resets_fail(name, saved):
    """Without the pickles every env restarts; when that fails, the runner keeps the
    state it had and nothing else is applied."""
    needs(name)
    wrapper = FailingReset if name == "cartpole" else FailingParallelReset
    factory = ENVS[name][0]
    with make(name, env_fn=lambda: wrapper(factory()), callbacks=saved_callbacks(name)) as runner:
        before = runner_state(runner)
        with pytest.raises(jr.errors.EnvError):
            runner.restore(saved(name))
        assert_trees_equal(runner_state(runner), before, "runner")


def test_restore_takes_kept_observations_outside_a_box_as_sampling_does(tmp_path):
    """Tic-tac-toe's observations are Box(0, 1) boards and masks. Sampling records an
    observation outside its Box's bounds (gymnasium's envs may leave them), so a kept
    agent episode holding a 2 or a -1 restores: a runner restores its own file. A
    kept action outside its Discrete space is refused, naming the member and the row."""
    needs("tictactoe")
    path = tmp_path / "tictactoe.ckpt"
    with make("tictactoe", callbacks=Recorder()) as runner:
        runner.sample_episodes(3)
        runner.save(path)

    def last_row(value: int):
        def edit(array: np.ndarray) -> np.ndarray:
            array[-1] = value
            return array

        return edit

    cases = {
        "fragments/0/obs/observation": 2,
        "fragments/0/obs/action_mask": -1,
        "callback_fragments/1/obs/observation": -1,
        "finished/0/obs/action_mask": 2,
    }
    with make("tictactoe", callbacks=Recorder()) as runner:
        for name, value in cases.items():
            damaged = tmp_path / "damaged.ckpt"
            edited(name, last_row(value))(path, damaged)
            assert runner.restore(damaged, load_env_pickles=True).envs_restored, name
        before = runner_state(runner)
        damaged = tmp_path / "damaged.ckpt"
        edited("finished/0/action", last_row(9))(path, damaged)
        match = r"finished/0/action row \d+ \(9\) outside the runner's space Discrete\(9\)"
        with pytest.raises(InvalidArgumentError, match=match):
            runner.restore(damaged, load_env_pickles=True)
        assert_trees_equal(runner_state(runner), before, "runner")


class StepCounter(jr.multi_agent.AgentCallbacks):
    """Per-step hooks (either kind of env): each env episode's length, return, first
    observation and the steps counted in ``user_data``, as it ends."""

    def __init__(self) -> None:
        self.ended: list[tuple] = []
        self.current: dict[int, int] = {}

    def on_episode_start(self, runner, env_index, episode) -> None:
        episode.user_data["steps"] = 0
        self.current[env_index] = 0

    def on_episode_step(self, runner, env_index, episode) -> None:
        episode.user_data["steps"] += 1
        self.current[env_index] = episode.length

    def on_episode_end(self, runner, env_index, episode) -> None:
        first = jax.tree.leaves(episode.obs[0])[0].tolist()
        self.ended.append(
            (env_index, episode.episode_id, episode.length, episode.total_return,
             episode.user_data["steps"], first)
        )  # fmt: skip


@pytest.mark.parametrize("name", TWO_KINDS)
def test_callbacks_live_episodes_resume_with_the_sub_envs(name, tmp_path):
    """The per-step callbacks' episodes under way at a save go on after a restore that
    loads the sub-envs: the episodes they report end as in the unbroken run (their
    steps before the save, user_data and first observation included). A file whose
    live episodes are not the sampler state's is refused, the runner unchanged."""
    needs(name)
    path = tmp_path / "live.ckpt"
    with make(name, callbacks=StepCounter()) as runner:
        samples(runner, 1)
        assert any(n > 0 for n in runner.callbacks.current.values())  # mid-episode
        runner.save(path)
        before = len(runner.callbacks.ended)
        samples(runner, 3)
        unbroken = runner.callbacks.ended[before:]
    assert unbroken
    with make(name, callbacks=StepCounter()) as runner:
        assert runner.restore(path, load_env_pickles=True).envs_restored
        samples(runner, 3)
        assert runner.callbacks.ended == unbroken
    with np.load(path) as data:
        live = pickle.loads(data["live_episodes"].tobytes())
    swapped = tmp_path / "swapped.ckpt"
    rewrite(path, swapped, members={"live_episodes.npy": _npy(_bytes(live[::-1]))})
    with (
        make(name, callbacks=StepCounter()) as runner,
        make(name, callbacks=StepCounter()) as twin,
    ):
        samples(runner, 1)
        with pytest.raises(InvalidArgumentError, match=r"live_episodes\[0\] that is not env 0"):
            runner.restore(swapped, load_env_pickles=True)
        assert_trees_equal(samples(runner, 1), samples(twin, 2)[1:], "the runner is unchanged")


def _bytes(value: Any) -> np.ndarray:
    return np.frombuffer(pickle.dumps(value), np.uint8)

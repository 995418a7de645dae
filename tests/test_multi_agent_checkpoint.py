"""Multi-agent EnvRunner checkpoints: a run split at a save equals the unbroken run (sync
backend, sub-envs unpickled on request); otherwise new episodes with the documented
seeds; damaged and hostile files refused, leaving the runner as it was."""

from __future__ import annotations

import functools
import json
import pickle
from typing import Any

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("pettingzoo")

import jaxrunner as jr
from jaxrunner import connectors as C
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.testing import assert_trees_equal
from tests import multi_agent_envs as envs_mod
from tests.special_files import refusal_and_peak, special_path
from tests.test_checkpoint import (
    CLAIMS_800_GB,
    OLD_FILES,
    _npy,
    deflated_member,
    edited,
    infinite,
    member,
    meta,
    nan_at_end,
    rewrite,
    truncated,
)

SEED = 4
NUM_ENVS = 3
T = 7


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
    def __init__(self) -> None:
        self.seen: list[tuple[int, str, float, int]] = []

    def on_agent_episode_end(self, runner, episode) -> None:
        self.seen.append(
            (episode.episode_id, episode.agent_id, episode.total_reward, episode.length)
        )


# name -> (factory, actions, masked, connectors)
ENVS = {
    "coming_and_going": (envs_mod.coming_and_going, 3, False, True),
    "relay": (envs_mod.relay, 4, False, False),
    "tictactoe": (envs_mod.tictactoe, 9, True, False),
    # MPE: EzPickle envs holding pygame render resources.
    "simple_spread": (envs_mod.simple_spread, 5, False, False),
}


def make(
    name: str = "coming_and_going",
    backend: str = "sync",
    num_envs: int = NUM_ENVS,
    callbacks: Any = None,
    **kwargs: Any,
) -> jr.EnvRunner:
    factory, n, masked, with_connectors = ENVS[name]
    envs = jr.make_multi_agent_vec(factory, num_envs, backend, **kwargs)
    connectors = None
    if with_connectors:
        connectors = C.Connectors(
            obs=[C.NormalizeObservation(), C.FrameStack(num_frames=2)], reward=C.ScaleReward()
        )
    params = {g.policy_id: {"w": jnp.zeros(n)} for g in envs.groups}
    return jr.EnvRunner(
        envs,
        recurrent_policy(n, masked),
        params,
        T,
        seed=SEED,
        connectors=connectors,
        callbacks=callbacks,
    )


def steady_metrics(runner: jr.EnvRunner) -> Any:
    """The metrics that do not depend on timing (NaN as None, for equality)."""

    def clean(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in ("perf", "env_steps_per_s")}
        return None if isinstance(x, float) and x != x else x

    return clean(runner.get_metrics())


def concatenate(trajs: list[jr.MultiAgentTrajectory]) -> jr.MultiAgentTrajectory:
    return jax.tree.map(lambda *x: np.concatenate(x), *trajs)


# -- exact resume --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ENVS))
def test_sync_backend_resumes_bit_for_bit(name, tmp_path):
    """k samples, a save, a NEW runner on new envs restored: its samples, metrics and
    callbacks are exactly those the original run produces by going on."""
    if name == "simple_spread":
        pytest.importorskip("mpe2")
    with make(name, callbacks=Recorder()) as runner:
        whole = concatenate([runner.sample() for _ in range(5)])
        want_metrics, want_seen = steady_metrics(runner), runner.callbacks.seen
    path = tmp_path / "runner.ckpt"
    with make(name, callbacks=Recorder()) as runner:
        head = [runner.sample() for _ in range(2)]
        seen = runner.callbacks.seen
        runner.save(path)
    with make(name, callbacks=Recorder()) as resumed:
        report = resumed.restore(path, load_env_pickles=True)
        tail = [resumed.sample() for _ in range(3)]
        metrics = steady_metrics(resumed)
        seen = seen + resumed.callbacks.seen
    assert report.envs_restored and "unpickled" in report.note
    assert whole.env_done[: 2 * T].any() and whole.env_done[2 * T :].any()
    group = next(iter(whole.groups.values()))
    # Episodes and agent turns cross the save: the state of both had to resume.
    assert group.valid[2 * T].any() and (group.agent_step[2 * T][group.valid[2 * T]] > 0).any()
    assert_trees_equal(concatenate(head + tail), whole, "trajectory")
    assert metrics == want_metrics
    assert metrics["num_agent_steps"] > 0 and metrics["num_episodes"] > 0
    assert seen == want_seen and len(want_seen) > 5


def test_restarted_sub_envs_resume_with_their_restart_seeds(tmp_path):
    """As an EnvRunner's: under a restart_policy a restarted sub-env is reset with a seed
    drawn from its restarts so far, which the sub-env pickles keep, so a resumed run
    restarts into the episodes the unbroken run does (every env fails at its 4th step
    call, so each restarts several times on both sides of the save)."""
    from jaxrunner.testing import FaultPlan, faulty_env_fns

    def make_faulty():
        fns = faulty_env_fns(envs_mod.coming_and_going, NUM_ENVS, faults=[FaultPlan(at=(4,))])
        envs = jr.make_vec(fns, NUM_ENVS, restart_policy=jr.RestartPolicy())
        params = {"w": jnp.zeros(3)}
        return jr.EnvRunner(envs, recurrent_policy(3), params, T, seed=SEED)

    with make_faulty() as runner:
        whole = concatenate([runner.sample() for _ in range(4)])
        assert runner.envs.num_restarts >= 10
    path = tmp_path / "runner.ckpt"
    with make_faulty() as runner:
        head = [runner.sample() for _ in range(2)]
        runner.save(path)
    with make_faulty() as resumed:
        assert resumed.restore(path, load_env_pickles=True).envs_restored
        tail = [resumed.sample() for _ in range(2)]
    assert_trees_equal(concatenate(head + tail), whole, "trajectory")


@pytest.mark.parametrize("name", ["coming_and_going", "relay"])
def test_sample_episodes_resumes_with_its_fragments(name, tmp_path):
    with make(name) as runner:
        whole = runner.sample_episodes(5) + runner.sample_episodes(9)
    path = tmp_path / "runner.ckpt"
    with make(name) as runner:
        head = runner.sample_episodes(5)
        assert runner.state.episodes.fragments and runner.state.finished  # both kinds are saved
        runner.save(path)
    with make(name) as resumed:
        resumed.restore(path, load_env_pickles=True)
        tail = resumed.sample_episodes(9)
    keys = [(e.episode_id, e.agent_id) for e in head + tail]
    assert keys == [(e.episode_id, e.agent_id) for e in whole]
    for got, want in zip(head + tail, whole, strict=True):
        assert_trees_equal(got, want, f"agent episode {want.episode_id, want.agent_id}")


def test_the_file_loads_without_pickle(tmp_path):
    path = tmp_path / "runner.ckpt"
    with make() as runner:
        runner.sample()
        runner.save(path)
    with np.load(path, allow_pickle=False) as data:
        doc = json.loads(str(data["__meta__"]))
        assert doc["format"] == "jaxrunner.MultiAgentRunner checkpoint"
        assert doc["envs"] == "pickle" and doc["policy_ids"] == ["policy_0"]
        assert data["envs/0"].dtype == np.uint8  # loaded on request only


def test_a_version_1_checkpoint_resumes_exactly(saved):
    """A file of version 1 (written by the earlier code at the point the ``saved``
    fixture saves) restores as this version's file of the same run does: the same
    samples, metrics, kept episodes and callbacks."""
    runs = []
    for path in (OLD_FILES / "multi_agent_runner_v1_sync.ckpt", saved):
        with make(callbacks=Recorder()) as runner:
            assert runner.restore(path, load_env_pickles=True).envs_restored
            trajs = [runner.sample() for _ in range(2)]
            episodes = runner.sample_episodes(4)
            runs.append((trajs, steady_metrics(runner), episodes, runner.callbacks.seen))
    (old, old_metrics, old_episodes, old_seen), (new, metrics, episodes, seen) = runs
    with np.load(saved) as data:
        assert json.loads(str(data["__meta__"]))["version"] == 3
    assert_trees_equal(concatenate(old), concatenate(new), "trajectory")
    assert old_metrics == metrics and old_seen == seen and len(seen) > 3
    assert_trees_equal(old_episodes, episodes, "agent episodes")


def faulty_runner() -> jr.EnvRunner:
    """coming_and_going on the sync backend whose sub-env 1 returns a NaN observation
    once (its episode ends as a fault; the restart policy recreates it)."""
    fns = [envs_mod.coming_and_going] * NUM_ENVS
    arm_seed = jr.env_seeds(SEED, NUM_ENVS)[1]
    fns[1] = functools.partial(envs_mod.BadOutputs, "nan_obs", arm_seed)
    envs = jr.make_multi_agent_vec(fns, NUM_ENVS, restart_policy=jr.RestartPolicy())
    params = {g.policy_id: {"w": jnp.zeros(3)} for g in envs.groups}
    return jr.EnvRunner(envs, recurrent_policy(3), params, T, seed=SEED)


def test_a_faulty_agent_episode_is_saved_and_restored_faulty(tmp_path):
    """sample_episodes(include_faulty=True) keeps agent episodes cut by their env's
    failure; saved and restored (the sub-envs unpickled), they are faulty still, and the
    resumed runner returns what the unbroken one does. A file without the ``faulty`` key
    (written before it was saved) restores them as not faulty."""
    path = tmp_path / "faulty.ckpt"
    with faulty_runner() as runner:
        while not any(e.faulty for e in runner.state.finished):
            runner.sample_episodes(len(runner.state.finished) + 1, include_faulty=True)
        kept = list(runner.state.finished)
        runner.save(path)
        want = runner.sample_episodes(len(kept) + 4, include_faulty=True)
    faulty = [e.faulty for e in kept]
    assert any(faulty) and not all(faulty)
    assert all(e.truncated for e in kept if e.faulty)
    with faulty_runner() as runner:
        assert runner.restore(path, load_env_pickles=True).envs_restored
        assert [e.faulty for e in runner.state.finished] == faulty
        assert_trees_equal(runner.state.finished, kept, "kept episodes")
        got = runner.sample_episodes(len(kept) + 4, include_faulty=True)
    assert_trees_equal(got, want, "agent episodes")
    assert [e.faulty for e in got] == [e.faulty for e in want]

    older = tmp_path / "without_faulty.ckpt"
    rewrite(path, older, meta=lambda m: [e.pop("faulty") for e in m["finished"]])
    with faulty_runner() as runner:
        assert runner.restore(older, load_env_pickles=True).envs_restored
        assert not any(e.faulty for e in runner.state.finished)
        assert [e.episode_id for e in runner.state.finished] == [e.episode_id for e in kept]


# -- new episodes --------------------------------------------------------------------------


def first_obs_by_hand(factory, seed: int, steps_done: int, num_envs: int) -> list[dict]:
    """Each sub-env's first observations after a reset with the documented seeds."""
    out = []
    for seed_b in jr.env_seeds((seed, steps_done), num_envs):
        env = factory()
        obs, _ = env.reset(seed=seed_b)
        out.append(obs)
    return out


def test_without_the_opt_in_episodes_restart_with_documented_seeds(tmp_path):
    path = tmp_path / "runner.ckpt"
    trained = {"w": jnp.asarray([0.0, 0.0, 3.0])}
    with make() as runner:
        runner.sample()
        runner.set_params(trained, "policy_0")
        runner.sample()
        runner.save(path)
        saved = steady_metrics(runner)
        book = runner.sampler._book
        next_id, steps_done = int(book.next_episode_id), int(book.steps_done)
    with make() as resumed:
        with pytest.warns(UserWarning, match="new episode"):
            report = resumed.restore(path)
        assert not report.envs_restored and "load_env_pickles" in report.note
        assert steady_metrics(resumed) == saved
        assert_trees_equal(jax.device_get(resumed.get_params("policy_0")), trained, "params")
        traj = resumed.sample()
        after = resumed.get_metrics()
    np.testing.assert_array_equal(traj.step[0], 0)
    np.testing.assert_array_equal(traj.episode_id[0], next_id + np.arange(NUM_ENVS))
    assert after["num_env_steps"] == saved["num_env_steps"] + T * NUM_ENVS
    group, agents = traj.groups["policy_0"], traj.agents["policy_0"]
    starts = first_obs_by_hand(envs_mod.coming_and_going, SEED, steps_done, NUM_ENVS)
    for b, obs in enumerate(starts):
        assert sorted(agents[a] for a in np.flatnonzero(group.valid[0, b])) == sorted(obs)
        np.testing.assert_array_equal(group.agent_step[0, b][group.valid[0, b]], 0)
        for agent, value in obs.items():
            np.testing.assert_array_equal(group.obs[0, b, agents.index(agent)], value)


@pytest.mark.parametrize("name", ["coming_and_going", "relay"])
def test_process_backend_restarts_episodes_and_says_so(name, tmp_path):
    config = jr.ProcessConfig(num_workers=2)
    path = tmp_path / "runner.ckpt"
    with make(name, "process", config=config) as runner:
        runner.sample()
        runner.save(path)
        saved = steady_metrics(runner)
        next_id = int(runner.sampler._book.next_episode_id)
    with make(name, "process", config=config) as resumed:
        with pytest.warns(UserWarning, match="cannot snapshot"):
            report = resumed.restore(path, load_env_pickles=True)
        assert not report.envs_restored and "ProcessMultiAgentVectorEnv" in report.note
        traj = resumed.sample()
        after = steady_metrics(resumed)
    np.testing.assert_array_equal(traj.step[0], 0)
    np.testing.assert_array_equal(traj.episode_id[0], next_id + np.arange(NUM_ENVS))
    assert after["num_env_steps"] == saved["num_env_steps"] + T * NUM_ENVS
    # The same restart on the sync backend (no opt-in) gives the same trajectory.
    with make(name) as sync:
        with pytest.warns(UserWarning, match="new episode"):
            sync.restore(path)
        assert_trees_equal(sync.sample(), traj, "trajectory")


def test_sync_checkpoint_on_the_process_backend_starts_new_episodes(tmp_path):
    path = tmp_path / "runner.ckpt"
    with make() as runner:
        runner.sample()
        runner.save(path)
    with make("coming_and_going", "process", config=jr.ProcessConfig(num_workers=2)) as other:
        with pytest.warns(UserWarning, match="cannot restore sub-env snapshots"):
            report = other.restore(path, load_env_pickles=True)
        assert not report.envs_restored
        traj = other.sample()
    np.testing.assert_array_equal(traj.step[0], 0)


def test_a_pure_jax_env_resumes_bit_for_bit(tmp_path):
    # As an EnvRunner on a JaxVectorEnv: the env states are in the sampler state.
    from tests.test_multi_agent_jax import Drift
    from tests.test_multi_agent_jax import random_policy as scan_policy

    def make_jax(callbacks=None):
        envs = jr.multi_agent.JaxMultiAgentVectorEnv(Drift(), NUM_ENVS)
        params = {"w": jnp.array([0.1, 0.0, -0.2])}
        return jr.EnvRunner(envs, scan_policy(3), params, T, seed=SEED, callbacks=callbacks)

    with make_jax(Recorder()) as runner:
        whole = concatenate([runner.sample().to_numpy() for _ in range(4)])
        want_metrics, want_seen = steady_metrics(runner), runner.callbacks.seen
    path = tmp_path / "runner.ckpt"
    with make_jax(Recorder()) as runner:
        head = [runner.sample().to_numpy() for _ in range(2)]
        seen = runner.callbacks.seen
        runner.save(path)
    with make_jax(Recorder()) as resumed:
        report = resumed.restore(path)
        tail = [resumed.sample().to_numpy() for _ in range(2)]
        metrics, seen = steady_metrics(resumed), seen + resumed.callbacks.seen
    assert report.envs_restored and "sampler's state" in report.note
    group = whole.groups["policy_0"]
    # Env and agent episodes cross the save: their state had to resume.
    assert whole.env_done[: 2 * T].any() and (group.agent_step[2 * T][group.valid[2 * T]] > 0).any()
    assert_trees_equal(concatenate(head + tail), whole, "trajectory")
    assert metrics == want_metrics and metrics["num_agent_steps"] > 0
    assert seen == want_seen and len(want_seen) > 3
    with make("coming_and_going") as host, pytest.raises(InvalidArgumentError, match="sampler"):
        host.restore(path)  # a pure-JAX env's checkpoint is not a host runner's


# -- damaged and hostile checkpoints -------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint of a runner mid-run: pickled sub-envs, sample_episodes' fragments
    and finished episodes, the callbacks' fragments."""
    path = tmp_path_factory.mktemp("saved") / "runner.ckpt"
    with make(callbacks=Recorder()) as runner:
        runner.sample_episodes(3)
        assert runner.state.episodes.fragments and runner.state.finished
        assert runner.state.callback_episodes.fragments
        runner.save(path)
    return path


@pytest.fixture(scope="module")
def env_runner_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("single") / "runner.ckpt"
    from jaxrunner.models import mlp_policy

    envs = jr.make_vec("CartPole-v1", 2)
    policy = mlp_policy(envs.single_action_space, hidden=(4,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length=3, seed=0) as runner:
        runner.save(path)
    return path


def snapshot_of(thing: Any):
    """Member envs/1 replaced by a pickle of ``thing``."""
    blob = np.frombuffer(pickle.dumps(thing), np.uint8)
    return member("envs/1", blob)


def huge_referenced(src, dst) -> None:
    """A finished episode's reward whose header promises 8 TiB."""
    huge = _npy(np.zeros(2)).replace(b"(2,)", b"(1099511627776,)")
    rewrite(src, dst, members={"finished/0/reward.npy": huge})


def finished_twice(src, dst) -> None:
    """One more finished agent episode, a copy of the first (same episode and agent)."""
    import zipfile

    with np.load(src) as data:
        n = len(json.loads(str(data["__meta__"]))["finished"])
    with zipfile.ZipFile(src) as zf:
        copies = {
            name.replace("finished/0/", f"finished/{n}/"): zf.read(name)
            for name in zf.namelist()
            if name.startswith("finished/0/")
        }
    rewrite(src, dst, meta=lambda m: m["finished"].append(dict(m["finished"][0])), members=copies)


def set_key(kind: str, key: str, value: Any):
    def edit(m: dict) -> None:
        m[kind][0][key] = value

    return meta(edit)


def negate(array: np.ndarray) -> np.ndarray:
    return -np.abs(array) - 1


GROUP = "sampler/groups/policy_0"
W = "params/policy_0/w"
# id -> (how the file is damaged, what the error must name)
HOSTILE = {
    "truncated file": (truncated, "cannot be opened"),
    "not a zip": (lambda src, dst: dst.write_bytes(b"PK\x03\x04 junk"), "cannot be opened"),
    "bad JSON": (member("__meta__", np.array("{" * 1000)), "not valid JSON"),
    "deep JSON": (member("__meta__", np.array("[" * 100_000)), "not valid JSON"),
    "JSON list": (member("__meta__", np.array("[1]")), "not a JSON object"),
    "wrong runner kind": (None, "expected a jaxrunner.MultiAgentRunner checkpoint"),
    "wrong policy ids": (meta(lambda m: m.update(policy_ids=["hero"])), "policy_ids"),
    "wrong agents": (meta(lambda m: m.update(possible_agents=["a0"])), "possible_agents"),
    "other num_envs": (meta(lambda m: m.update(num_envs=4)), "num_envs"),
    "string seed": (meta(lambda m: m.update(seed="4")), "seed"),
    "seed no runner takes": (meta(lambda m: m.update(seed=2**64)), "seed=18446744073709551616"),
    "metrics paths": (meta(lambda m: m.update(metrics=[["counters"]])), "metrics"),
    "kept not a list": (meta(lambda m: m.update(callback_fragments={})), "callback_fragments"),
    "params shape": (member(W, np.zeros(4, np.float32)), W),
    "params dtype": (member(W, np.zeros(3, np.float64)), W),
    "params as objects": (member(W, np.array([{}] * 3, object)), W),
    "infinite params": (edited(W, lambda a: np.full_like(a, np.inf)), f"{W} not finite"),
    "NaN latest observations": (edited(f"{GROUP}/obs", nan_at_end), f"{GROUP}/obs not finite"),
    "carry shape": (member(f"{GROUP}/actor/carry", np.zeros(3, np.float32)), "actor/carry"),
    "acting dtype": (member(f"{GROUP}/acting", np.zeros((3, 4), np.int8)), f"{GROUP}/acting"),
    "group missing": (member(f"{GROUP}/awaiting", None), f"{GROUP}/awaiting"),
    "negative running length": (edited(f"{GROUP}/running_length", negate), "running_length"),
    "NaN running return": (edited(f"{GROUP}/running_return", nan_at_end), "running_return"),
    "negative steps_done": (member("sampler/book/steps_done", np.int64(-1)), "steps_done"),
    "rewound next id": (member("sampler/book/next_episode_id", np.int64(1)), "next_episode_id"),
    "repeated episode ids": (
        member("sampler/book/episode_id", np.zeros(3, np.int64)),
        "sampler/book/episode_id",
    ),
    "negative counter": (edited("metrics/counters", negate), "metrics/counters"),
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
    "short perf": (member("metrics/perf", np.zeros(2)), "metrics/perf"),
    "negative perf": (member("metrics/perf", -np.ones(4)), "metrics/perf"),
    "NaN returns": (edited("metrics/returns", nan_at_end), "metrics/returns not finite"),
    "returns unlike lengths": (member("metrics/lengths", np.ones(7, np.int64)), "metrics/returns"),
    "counters of length 6": (member("metrics/counters", np.zeros(6, np.int64)), "metrics/counters"),
    "negative seed": (meta(lambda m: m.update(seed=-1)), "seed"),
    "float num_envs": (meta(lambda m: m.update(num_envs=3.0)), "num_envs"),
    "zero rollout_length": (meta(lambda m: m.update(rollout_length=0)), "rollout_length"),
    "unknown envs kind": (meta(lambda m: m.update(envs="magic")), "envs="),
    "envs_note a list": (meta(lambda m: m.update(envs_note=[])), "envs_note"),
    "an older version": (meta(lambda m: m.update(version=2)), "version 1 or 3, got"),
    "episode id a string": (set_key("finished", "episode_id", "4"), r"finished\[0\]\.episode_id"),
    "negative start_step": (set_key("finished", "start_step", -2), r"finished\[0\]\.start_step"),
    "extra episode key": (set_key("finished", "spare", 1), r"finished\[0\]"),
    "paths miss obs": (set_key("finished", "paths", [["action"], ["reward"]]), "paths"),
    "extras path an int": (set_key("finished", "extras", [[0]]), "extras"),
    "finished twice": (finished_twice, r"repeated \(episode id, agent\)"),
    "begin after steps_done": (
        member("sampler/book/episode_begin", np.full(3, 10**9, np.int64)),
        "episode_begin",
    ),
    "NaN episode return": (
        member("sampler/book/episode_return", np.full(3, np.nan)),
        "episode_return",
    ),
    "NaN params": (edited(W, nan_at_end), f"{W} not finite"),
    "header claims 800 GB": (
        member(W, _npy(np.zeros(3, np.float32)).replace(b"(3,)", CLAIMS_800_GB)),
        W,
    ),
    "params size lies": (
        member(W, _npy(np.zeros(3, np.float32)).replace(b"(3,)", b"(30,)")),
        "size",
    ),
    "infinite kept obs": (edited("finished/0/obs", infinite), "finished/0/obs not finite"),
    "unknown policy": (set_key("finished", "policy_id", "hero"), r"finished\[0\]\.policy_id"),
    "agent of no policy": (set_key("finished", "agent_id", "zed"), r"finished\[0\]\.agent_id"),
    "episode id too big": (set_key("finished", "episode_id", 10**6), r"finished\[0\]\.episode_id"),
    "env id out of range": (set_key("fragments", "env_id", 3), r"fragments\[0\]\.env_id"),
    "fragment of env 99": (set_key("fragments", "env_id", 99), r"fragments\[0\]\.env_id=99"),
    "callback fragment of env 99": (
        set_key("callback_fragments", "env_id", 99),
        r"callback_fragments\[0\]\.env_id=99",
    ),
    "flag an int": (set_key("finished", "terminated", 1), r"finished\[0\]\.terminated"),
    "finished incomplete": (set_key("finished", "start_step", 2), r"finished\[0\]"),
    "fragment finished": (set_key("fragments", "truncated", True), r"fragments\[0\]"),
    "callback fragment finished": (
        set_key("callback_fragments", "truncated", True),
        r"callback_fragments\[0\]",
    ),
    "negative env_step": (edited("fragments/0/env_step", negate), "fragments/0/env_step"),
    "NaN kept reward": (edited("finished/0/reward", nan_at_end), "finished/0/reward"),
    "short kept obs": (member("finished/0/obs", np.zeros((1, 3), np.float32)), "finished/0/obs"),
    "NaN kept obs": (edited("finished/0/obs", nan_at_end), "finished/0/obs not finite"),
    "NaN fragment obs": (edited("fragments/0/obs", nan_at_end), "fragments/0/obs not finite"),
    "fragment action outside the space": (
        edited("fragments/0/action", lambda a: np.full_like(a, 3)),
        r"fragments/0/action row 0 \(3\) outside the runner's space Discrete\(3\)",
    ),
    "callback fragment action outside the space": (
        edited("callback_fragments/0/action", lambda a: np.full_like(a, -1)),
        r"callback_fragments/0/action row 0 \(-1\) outside",
    ),
    "finished action outside the space": (
        edited("finished/0/action", lambda a: np.full_like(a, 99)),
        r"finished/0/action row 0 \(99\) outside",
    ),
    "faulty a string": (set_key("finished", "faulty", "yes"), r"finished\[0\]\.faulty='yes'"),
    "faulty but not truncated": (
        set_key("finished", "faulty", True),
        r"finished\[0\]\.faulty=true but truncated=false",
    ),
    "an unread object member": (member("junk", np.array([{}], object)), "member 'junk'"),
    "an unread structured member": (
        member("spare", np.zeros(2, [("a", "f4"), ("b", object)])),
        "member 'spare'",
    ),
    "an env pickle where none belongs": (
        meta(lambda m: m.update(envs="none")),
        "member 'envs/0'",
    ),
    "huge referenced member": (huge_referenced, "finished/0/reward"),
    "pickle as floats": (member("envs/0", np.zeros(8)), "envs/0"),
    "pickle of None": (snapshot_of(None), "pickle envs/1 unpickled to a NoneType"),
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
        "callback_fragments": dict(runner.state.callback_episodes.fragments),
        "envs": [id(env) for env in runner.envs.get_sub_environments()],
    }


@pytest.mark.parametrize("load_env_pickles", [True, False])
def test_restore_refuses_damaged_and_hostile_files_and_changes_nothing(
    saved, env_runner_checkpoint, tmp_path, load_env_pickles
):
    """Each rejection is an InvalidArgumentError naming the field, raised before the
    runner changes, with or without the sub-env pickles (cases about the pickles only
    with); afterwards it samples exactly as an untouched runner does."""
    with make(callbacks=Recorder()) as runner:
        runner.sample()
        before = runner_state(runner)
        for case, (damage, match) in HOSTILE.items():
            if case.startswith("pickle") and not load_env_pickles:
                continue
            path = tmp_path / f"{case}.ckpt"
            if damage is None:
                path = env_runner_checkpoint
            else:
                damage(saved, path)
            with pytest.raises(InvalidArgumentError, match=match) as info:
                runner.restore(path, load_env_pickles=load_env_pickles)
            assert "snapshot 1" not in str(info.value), case
            assert_trees_equal(runner_state(runner), before, case)
        after_attacks = runner.sample()
        seen = runner.callbacks.seen
    with make(callbacks=Recorder()) as untouched:
        untouched.sample()
        assert_trees_equal(after_attacks, untouched.sample(), "trajectory")
        assert seen == untouched.callbacks.seen


def test_restore_refuses_unreferenced_members_unread(saved, tmp_path):
    """A member no field references (a junk header promising 8 TiB, an unused
    episode's arrays) is refused by its name, never read; the sub-env pickles of a
    checkpoint that holds them are read only on request."""
    huge = _npy(np.zeros(2)).replace(b"(2,)", b"(1099511627776,)")
    path = tmp_path / "padded.ckpt"
    with make() as runner:
        for name in ("junk", "finished/9/reward"):
            rewrite(saved, path, members={f"{name}.npy": huge})
            with pytest.raises(InvalidArgumentError, match=f"member '{name}' that no field"):
                runner.restore(path)
        rewrite(saved, path, members={"envs/0.npy": b"not read without load_env_pickles"})
        with pytest.warns(UserWarning, match="new episode"):
            report = runner.restore(path)
    assert not report.envs_restored


def test_restore_takes_kept_observations_outside_a_box_as_sampling_does(tmp_path):
    """Tic-tac-toe's observations are Box(0, 1) boards and masks. Sampling records an
    observation outside its Box's bounds (gymnasium's envs may leave them), so a kept
    agent episode holding a 2 or a -1 restores: a runner restores its own file. A
    kept action outside its Discrete space is refused, naming the member and the row."""
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


@pytest.mark.parametrize("max_bytes", [True, 1.5, -1, None])
def test_restore_refuses_a_max_bytes_that_is_no_byte_count(saved, max_bytes):
    with make() as runner:
        before = runner_state(runner)
        with pytest.raises(
            jr.errors.JaxRunnerError,
            match=rf"EnvRunner\.restore\(max_bytes={max_bytes!r}\): expected an int >= 0",
        ):
            runner.restore(saved, max_bytes=max_bytes)
        assert_trees_equal(runner_state(runner), before, "runner")


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "directory"])
def test_restore_refuses_what_is_not_a_regular_file_before_reading(tmp_path, special):
    path = special_path(special, tmp_path)
    with make() as runner:
        error, peak = refusal_and_peak(lambda: runner.restore(path), f"restore({special!r})")
    assert isinstance(error, InvalidArgumentError), error
    assert "is not a regular file" in str(error)
    assert peak < (4 << 20), peak


def test_restore_refuses_an_oversized_window_before_reading_it(saved, tmp_path):
    """As an EnvRunner's: refused from the header, next to nothing allocated."""
    import tracemalloc

    path = tmp_path / "window.ckpt"
    rewrite(saved, path, members={"metrics/lengths.npy": None})
    deflated_member(path, "metrics/lengths.npy", "<i8", 1 << 24)
    with make() as runner:
        tracemalloc.start()
        try:
            with pytest.raises(InvalidArgumentError, match=r"metrics/lengths.*at most 100 entries"):
                runner.restore(path, load_env_pickles=True)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < (4 << 20), peak


def test_restore_refuses_kept_episodes_longer_than_the_steps_counted(saved, tmp_path):
    path = tmp_path / "long.ckpt"
    rewrite(saved, path, members={"finished/0/reward.npy": None})
    deflated_member(path, "finished/0/reward.npy", "<f8", 1 << 20)
    with make() as runner, pytest.raises(InvalidArgumentError, match=r"finished/0/reward.*steps"):
        runner.restore(path)


def test_restore_refuses_a_load_env_pickles_that_is_no_bool(saved):
    with (
        make() as runner,
        pytest.raises(
            jr.errors.JaxRunnerError,
            match=r"EnvRunner\.restore\(load_env_pickles='yes'\): expected True or False",
        ),
    ):
        runner.restore(saved, load_env_pickles="yes")


def test_restore_undoes_the_sampler_state_when_the_fresh_resets_fail(saved):
    """Without the pickles every env restarts; when that fails, the runner keeps the
    state it had."""
    with make() as runner:
        before = runner_state(runner)

        def failing_reset(*args, **kwargs):
            raise jr.errors.EnvError("reset refused", 0)

        runner.envs.reset_batch = failing_reset
        with pytest.raises(jr.errors.EnvError, match="reset refused"):
            runner.restore(saved)
        assert_trees_equal(runner_state(runner), before, "runner")


def test_restore_keeps_within_the_memory_limit(saved):
    """One limit for every runner's checkpoint: restore(..., max_bytes=...)."""
    with make() as runner:
        before = runner_state(runner)
        with pytest.raises(
            InvalidArgumentError, match=r"max_bytes=64 \(restore\(\.\.\., max_bytes"
        ):
            runner.restore(saved, load_env_pickles=True, max_bytes=64)
        assert_trees_equal(runner_state(runner), before, "runner")
        assert runner.restore(saved, load_env_pickles=True).envs_restored  # the default fits

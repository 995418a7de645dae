"""jaxrunner.testing's fault vocabulary on multi-agent sub-envs (FaultyEnv):
every kind on the sync, process and Ray backends, with and without a restart policy;
accounting exact per agent. Where a kind cannot apply to a backend, a comment says why
(a sync sub-env shares the sampler's process: it has no step timeout, and its death is
the sampler's)."""

from __future__ import annotations

import dataclasses
import functools
import pickle
import subprocess
import sys
import textwrap

import chex
import numpy as np
import pytest

pytest.importorskip("pettingzoo")

import jaxrunner as jr
from jaxrunner._src.backends.process.vector_env import ProcessMultiAgentVectorEnv
from jaxrunner._src.backends.sync import SyncMultiAgentVectorEnv
from jaxrunner.errors import (
    EnvError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidStepError,
    RemoteTimeoutError,
    SpaceMismatchError,
    WorkerError,
    WorkerTimeoutError,
)
from jaxrunner.testing import (
    CallLog,
    ComingAndGoing,
    FaultPlan,
    FaultyAECEnv,
    FaultyEnv,
    FaultyParallelEnv,
    InjectedError,
    Relay,
    break_returns,
    coming_and_going,
    faulty_env_fns,
    tictactoe,
)
from tests.test_multi_agent import random_policy, zero_params

SEED, NUM_ENVS, T = 5, 3, 6
FAILING_ENV, AT = 1, 4  # env 1's 4th step (slot t=3) misbehaves; a recreated env's at t=7
AGENT = "a1"  # whose returns garbage faults break (live at step 4 of ComingAndGoing)
HANG_S = 0.3  # a hang the sync backend sits out
GARBAGE = {  # each garbage kind, and what the backends must raise for it
    "nan_reward": InvalidStepError,
    "inf_reward": InvalidStepError,
    "array_reward": InvalidStepError,
    "list_reward": InvalidStepError,
    "flag_not_bool": InvalidStepError,
    "bad_obs": SpaceMismatchError,
    "obs_dtype": SpaceMismatchError,
    "info_not_dict": InvalidStepError,
}
DEATHS = ("exit", "kill", "segfault")


def make_envs(backend, fns, restart, step_timeout_s=None):
    # Process: sub-envs 0 and 1 in worker 0, sub-env 2 in worker 1. Ray: the same where a
    # step timeout is set (the tests of an actor's death or hang); elsewhere the fault is
    # inside an actor's own sub-env loop, which one actor of every sub-env runs as well,
    # and each actor start costs seconds of CPU (its process imports Ray and jaxrunner).
    policy = jr.RestartPolicy() if restart else None
    if backend == "sync":
        return SyncMultiAgentVectorEnv(fns, restart_policy=policy)
    if backend.startswith("ray"):
        from jaxrunner._src.backends.ray.vector_env import RayMultiAgentVectorEnv

        per_actor = len(fns) if step_timeout_s is None else 2
        config = jr.RayConfig(
            envs_per_actor=per_actor, num_cpus_per_actor=0.1, step_timeout_s=step_timeout_s
        )
        if backend == "ray-buckets":  # ready-first, each actor's answer in a bucket call
            config = dataclasses.replace(
                config, envs_per_actor=1, ready_first=True, batch_buckets=(1, len(fns))
            )
        return RayMultiAgentVectorEnv(fns, config=config, restart_policy=policy)
    config = jr.ProcessConfig(num_workers=2, step_timeout_s=step_timeout_s)
    return ProcessMultiAgentVectorEnv(fns, config=config, restart_policy=policy)


@pytest.fixture(autouse=True)
def ray_for_the_ray_backend(request):
    """Starts Ray (the shared instance, conftest.py) for the tests on backend "ray" only."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and str(callspec.params.get("backend")).startswith("ray"):
        request.getfixturevalue("local_ray")


def sample(fns, backend="sync", restart=False, num_actions=3, masked=False, **kwargs):
    """One T-step sample: (trajectory, metrics, restarts)."""
    envs = make_envs(backend, fns, restart, **kwargs)
    policy, params = random_policy(num_actions, masked), zero_params(num_actions)
    with jr.EnvRunner(envs, policy, params, T, seed=SEED) as runner:
        return runner.sample(), runner.get_metrics(), envs.get_num_restarts()


def faulty_fns(kind, log=None, base=coming_and_going, agent=AGENT, **plan):
    fault = FaultPlan(kind=kind, at=(AT,), hang_s=plan.pop("hang_s", HANG_S), **plan)
    return faulty_env_fns(base, NUM_ENVS, {FAILING_ENV: [fault]}, log, agent=agent)


@pytest.fixture(scope="module")
def clean():
    """The fault-free run (same runner, plain sub-envs)."""
    return sample([coming_and_going] * NUM_ENVS)


def assert_restarted_and_accounted(got, clean, log):
    """Sampling went on past env 1's failed step (slot t = AT-1): it holds no transition,
    the other envs equal the fault-free run, and every count is exact per agent."""
    traj, metrics, restarts = got
    (pid,) = traj.groups
    g, ref = traj.groups[pid], clean[0].groups[pid]
    t = AT - 1
    assert restarts == 1 and log.count("made") == NUM_ENVS + 1
    assert not g.valid[t, FAILING_ENV].any()
    others = [b for b in range(NUM_ENVS) if b != FAILING_ENV]
    for field in ("valid", "reward", "terminated", "truncated", "obs", "action", "next_obs"):
        a, b = getattr(g, field), getattr(ref, field)
        np.testing.assert_array_equal(a[:t], b[:t], err_msg=field)
        np.testing.assert_array_equal(a[:, others], b[:, others], err_msg=field)
    assert metrics["num_agent_steps"] == int(g.valid.sum())
    assert metrics["num_dropped_steps"] == log.count("step_failed") == 1
    assert metrics["num_dropped_agent_steps"] == int(ref.valid[t, FAILING_ENV].sum()) > 0
    assert metrics["num_env_steps"] == log.count("step_ok") == NUM_ENVS * T - 1
    assert metrics["num_faulty_episodes"] == 1


# -- without a restart policy: the right error, naming the sub-env ----------------------------

BACKENDS = ["sync", "process", "ray"]
REMOTE = ["process", "ray"]  # where a sub-env's death or hang is not the sampler's
GARBAGE_CASES = list(GARBAGE)
# A Ray actor checks its sub-envs' returns with the sync backend's own loop (AgentBlock),
# and each Ray test starts actors (seconds each): Ray runs one kind per error type, which
# covers what it adds, carrying the error (type, sub-env, agent) or the restart back.
ON_RAY = ("raise", "nan_reward", "bad_obs")


def backends_and(kinds, backends=BACKENDS, on_ray=ON_RAY):
    """(backend, kind) for every backend and kind, Ray's kinds those of ``on_ray``."""
    return [(b, k) for b in backends for k in kinds if b != "ray" or k in on_ray]


# Every death of an actor is one RayActorError to jaxrunner (a WorkerError, the actor
# replaced), whatever killed it: Ray runs one death and the hang; the process backend,
# whose errors name each death's exit code or signal, runs all. Actors killed from
# outside (ray.kill): test_ray.py, test_multi_agent_pipeline.py.
REMOTE_FAULTS = backends_and([*DEATHS, "hang"], REMOTE, on_ray=("segfault", "hang"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_raise_is_an_env_error_naming_the_sub_env_with_the_cause(backend):
    with pytest.raises(EnvError, match=f"sub-env {FAILING_ENV} raised in step") as info:
        sample(faulty_fns("raise"), backend)
    assert info.value.env_index == FAILING_ENV
    assert isinstance(info.value.__cause__, InjectedError)
    assert info.value.partial_trajectory.num_steps == AT - 1


@pytest.mark.parametrize(("backend", "kind"), backends_and(GARBAGE_CASES))
def test_a_bad_return_is_the_right_error_naming_the_sub_env_and_agent(backend, kind):
    with pytest.raises(GARBAGE[kind], match=f"sub-env {FAILING_ENV}, agent '{AGENT}'") as info:
        sample(faulty_fns(kind), backend)
    assert info.value.env_index == FAILING_ENV
    assert info.value.partial_trajectory.num_steps == AT - 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_missing_dict_key_is_a_space_mismatch_naming_the_sub_env_and_agent(backend):
    # tictactoe's observations are dicts; its player_1 is to act after the 4th move.
    fns = faulty_fns("obs_missing_key", base=tictactoe, agent="player_1")
    with pytest.raises(SpaceMismatchError, match="sub-env 1, agent 'player_1'") as info:
        sample(fns, backend, num_actions=9, masked=True)
    assert info.value.env_index == FAILING_ENV


def test_a_sync_hang_that_ends_is_an_env_error():
    # The sync backend has no step timeout: a hang lasts as long as the env sleeps.
    with pytest.raises(EnvError, match=f"sub-env {FAILING_ENV} raised in step") as info:
        sample(faulty_fns("hang"))
    assert "hung" in str(info.value.__cause__)


@pytest.mark.parametrize(("backend", "kind"), REMOTE_FAULTS)
def test_a_worker_that_dies_or_hangs_is_a_worker_error_naming_its_sub_envs(backend, kind):
    if backend == "process":
        error = WorkerTimeoutError if kind == "hang" else WorkerError
        where = r"worker 0 \(pid \d+, sub-envs 0..1\)"
    else:
        error = RemoteTimeoutError if kind == "hang" else WorkerError
        where = r"Ray env actor 0 \(sub-envs 0..1\)"
    fns = faulty_fns(kind, hang_s=60.0)
    with pytest.raises(error, match=where) as info:
        sample(fns, backend, step_timeout_s=1.5)
    assert info.value.env_indices == range(2)
    assert info.value.partial_trajectory.num_steps == AT - 1


@pytest.mark.parametrize(("kind", "returncode"), [("exit", 13), ("kill", -9), ("segfault", -11)])
def test_a_sync_sub_env_that_kills_its_process_takes_the_sampler_with_it(kind, returncode):
    # In-process sub-envs share the sampler's process: no restart policy can help; the
    # process dies at the planned step, as the plan says.
    code = textwrap.dedent(f"""
        import numpy as np
        import jaxrunner as jr
        from jaxrunner._src.backends.sync import SyncMultiAgentVectorEnv
        from jaxrunner.testing import FaultPlan, coming_and_going, faulty_env_fns
        fault = FaultPlan(kind={kind!r}, at=({AT},))
        fns = faulty_env_fns(coming_and_going, 2, {{1: [fault]}})
        envs = SyncMultiAgentVectorEnv(fns, restart_policy=jr.RestartPolicy())
        out = envs.reset_batch([0, 1])
        for n in range(1, {AT + 2}):
            out = envs.step_batch([np.zeros(out.groups["policy_0"].acting.shape, np.int64)])
            print("survived", n, flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == returncode, done.stderr
    assert done.stdout.split("\n")[:-1] == [f"survived {n}" for n in range(1, AT)]


# -- with a restart policy: sampling goes on, accounting exact per agent ----------------------

RESTARTED = ["raise", *GARBAGE_CASES]


@pytest.mark.parametrize(("backend", "kind"), backends_and(RESTARTED))
def test_with_a_restart_policy_sampling_goes_on_and_accounting_is_exact(
    backend, kind, clean, tmp_path
):
    log = CallLog(tmp_path)
    got = sample(faulty_fns(kind, log), backend, restart=True)
    assert_restarted_and_accounted(got, clean, log)


def test_a_sync_hang_that_ends_is_restarted(clean, tmp_path):
    log = CallLog(tmp_path)
    assert_restarted_and_accounted(sample(faulty_fns("hang", log), restart=True), clean, log)


@pytest.mark.parametrize(("backend", "kind"), REMOTE_FAULTS)
def test_with_a_restart_policy_a_dead_or_hung_worker_is_replaced(backend, kind, clean, tmp_path):
    # Worker (actor) 0 runs envs 0 and 1: when env 1 ends it (or hangs it) at its step
    # AT, it is replaced with new sub-envs, and both envs' slots of that step fail (their
    # episodes end as faults); env 2, on worker 1, is the fault-free run's throughout.
    log = CallLog(tmp_path)
    envs = make_envs(backend, faulty_fns(kind, log, hang_s=60.0), True, step_timeout_s=1.5)
    policy, params = random_policy(3), zero_params(3)
    with jr.EnvRunner(envs, policy, params, T, seed=SEED) as runner:
        traj, metrics = runner.sample(), runner.get_metrics()
        replaced = envs.num_worker_restarts if backend == "process" else envs.num_actor_restarts
        assert replaced == 1
    (pid,) = traj.groups
    g, ref = traj.groups[pid], clean[0].groups[pid]
    t = AT - 1
    assert not g.valid[t, :2].any()
    for field in ("valid", "reward", "terminated", "truncated", "obs", "action", "next_obs"):
        a, b = getattr(g, field), getattr(ref, field)
        np.testing.assert_array_equal(a[:t], b[:t], err_msg=field)
        np.testing.assert_array_equal(a[:, 2], b[:, 2], err_msg=field)
    assert g.valid[t + 1 :, :2].any()  # the new sub-envs' episodes go on
    assert log.count("made") == NUM_ENVS + 2  # the replacement made its two sub-envs anew
    assert metrics["num_agent_steps"] == int(g.valid.sum())
    assert metrics["num_dropped_steps"] == metrics["num_faulty_episodes"] == 2
    assert metrics["num_dropped_agent_steps"] == int(ref.valid[t, :2].sum())
    assert metrics["num_env_steps"] == NUM_ENVS * T - 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_turn_based_failure_drops_the_turns_waiting_for_their_transition(backend, tmp_path):
    # tictactoe: moves 1 (player_1), 2 (player_2), 3 (player_1), then move 4 (player_2)
    # returns player_1's observation without its "observation" key. player_2's move 2
    # completed at its move 4 (its turn); player_1's move 3 waits for its next turn, and
    # move 4 was taken in the failed step: two actions no transition carries.
    log = CallLog(tmp_path)
    fns = faulty_fns("obs_missing_key", log, base=tictactoe, agent="player_1")
    traj, metrics, restarts = sample(fns, backend, restart=True, num_actions=9, masked=True)
    (g,) = traj.groups.values()
    assert restarts == 1
    assert not g.valid[AT - 1, FAILING_ENV].any()
    assert metrics["num_agent_steps"] == int(g.valid.sum())
    assert metrics["num_dropped_steps"] == log.count("step_failed") == 1
    assert metrics["num_dropped_agent_steps"] == 2


@pytest.mark.parametrize(("backend", "kind"), backends_and(["raise", "bad_obs"]))
def test_a_failed_autoreset_keeps_the_good_step(backend, kind, clean, tmp_path):
    # Env 1's first episode ends at its 6th step (the last slot), and its autoreset (its
    # second reset) fails: the step's transitions stay; the env is recreated.
    log = CallLog(tmp_path)
    fault = FaultPlan(kind=kind, call="reset", at=(2,))
    fns = faulty_env_fns(coming_and_going, NUM_ENVS, {FAILING_ENV: [fault]}, log)
    traj, metrics, restarts = sample(fns, backend, restart=True)
    (pid,) = traj.groups
    g, ref = traj.groups[pid], clean[0].groups[pid]
    assert restarts == 1 and log.count("reset_failed") == 1
    assert clean[0].env_done[T - 1, FAILING_ENV]
    for field in ("valid", "reward", "terminated", "truncated", "next_obs"):
        np.testing.assert_array_equal(getattr(g, field), getattr(ref, field), err_msg=field)
    assert metrics["num_agent_steps"] == int(g.valid.sum())
    assert metrics["num_dropped_steps"] == 0
    error = EnvError if kind == "raise" else SpaceMismatchError
    with pytest.raises(error, match=f"sub-env {FAILING_ENV}") as info:
        sample(fns, backend)
    assert info.value.env_index == FAILING_ENV


# -- the wrapper itself ------------------------------------------------------------------------

STEP_KINDS = [k for k in GARBAGE if k not in ("bad_obs", "obs_dtype")] + ["bad_obs", "obs_dtype"]


@pytest.mark.parametrize("kind", STEP_KINDS)
def test_parallel_garbage_breaks_one_agents_returns_at_the_planned_call(kind):
    env = FaultyEnv(ComingAndGoing(), [FaultPlan(kind=kind, at=(AT,))], agent="a2")
    assert isinstance(env, FaultyParallelEnv)
    ref = ComingAndGoing()
    jr.testing.assert_trees_equal(env.reset(seed=3), ref.reset(seed=3), "reset")
    for n in range(1, AT + 2):
        actions = dict.fromkeys(ref.agents, 1)
        got, want = env.step(actions), ref.step(actions)
        if n == AT:  # a2's (obs, reward, terminated, info) broken, the rest as returned
            broken = break_returns(kind, want[0]["a2"], want[1]["a2"], want[2]["a2"], want[4]["a2"])
            want = tuple(dict(part) for part in want)
            for part, value in zip((0, 1, 2, 4), broken):
                want[part]["a2"] = value
        jr.testing.assert_trees_equal(got, want, f"step {n}")
    assert env.calls == {"step": AT + 1, "reset": 1}


@pytest.mark.parametrize("kind", ["nan_reward", "flag_not_bool", "bad_obs", "info_not_dict"])
def test_aec_garbage_reads_broken_until_the_next_call_and_leaves_the_env_alone(kind):
    env = FaultyEnv(Relay(), [FaultPlan(kind=kind, at=(2,))])
    assert isinstance(env, FaultyAECEnv)
    ref = Relay()
    env.reset(seed=0)
    ref.reset(seed=0)
    env.step(1)
    ref.step(1)
    jr.testing.assert_trees_equal(env.last(), ref.last(), "after step 1")
    env.step(2)
    ref.step(2)
    agent = ref.agent_selection  # r2: the one a driver reads next
    obs, since_last_turn, term, trunc, info = ref.last()
    broken = break_returns(kind, obs, ref.rewards[agent], term, info)
    jr.testing.assert_trees_equal(
        (env.observe(agent), env.rewards[agent], env.terminations[agent], env.infos[agent]),
        broken,
        "what a driver reads",
    )
    want = break_returns(kind, obs, since_last_turn, term, info)
    jr.testing.assert_trees_equal(env.last(), (*want[:3], trunc, want[3]), "last()")
    jr.testing.assert_trees_equal(env.unwrapped.rewards, ref.rewards, "the inner env's state")
    env.step(3)
    ref.step(3)
    jr.testing.assert_trees_equal(env.last(), ref.last(), "after step 3")


def test_raise_fails_before_the_inner_env_steps():
    env = FaultyEnv(ComingAndGoing(), [FaultPlan(kind="raise", at=(2,))])
    env.reset(seed=0)
    env.step({"a0": 0, "a1": 0})
    with pytest.raises(InjectedError, match="FaultyParallelEnv: injected failure in step #2"):
        env.step({"a0": 0, "a1": 0})
    assert env.unwrapped.t == 1


def test_only_pettingzoo_envs_are_wrapped_and_factories_pickle():
    with pytest.raises(InvalidArgumentTypeError, match="FaultyEnv"):
        FaultyEnv(object(), [])
    with pytest.raises(InvalidArgumentError, match="faulty_env_fns"):
        faulty_env_fns(coming_and_going)
    fns = faulty_env_fns([coming_and_going, functools.partial(Relay)], agent="r0")
    envs = [pickle.loads(pickle.dumps(fn))() for fn in fns]
    assert [type(e) for e in envs] == [FaultyParallelEnv, FaultyAECEnv]
    assert envs[1].agent == "r0"
    # Wrapped envs pickle too (with their call counts), as PettingZoo's own wrappers do.
    envs[0].reset(seed=1)
    copy = pickle.loads(pickle.dumps(envs[0]))
    assert type(copy) is FaultyParallelEnv and copy.calls == {"step": 0, "reset": 1}


RANDOM_FAULTS = [  # in-worker kinds at random (seeded) calls, resets included
    FaultPlan(kind="raise", probability=0.04),
    FaultPlan(kind="nan_reward", probability=0.03),
    FaultPlan(kind="bad_obs", probability=0.03),
    FaultPlan(kind="raise", call="reset", probability=0.1),
]


@pytest.mark.parametrize("backend", [*BACKENDS, "ray-buckets"])
def test_random_faults_are_counted_exactly(backend, tmp_path):
    # Every sub-env fails now and then, in steps and resets (restarts' resets too): every
    # good step call is in the trajectory, every failed one is dropped, and every valid
    # slot is one agent step.
    log = CallLog(tmp_path)
    fns = faulty_env_fns(coming_and_going, NUM_ENVS, RANDOM_FAULTS, log, seed=3)
    envs = make_envs(backend, fns, restart=True)
    policy, params = random_policy(3), zero_params(3)
    with jr.EnvRunner(envs, policy, params, 40, seed=SEED) as runner:
        traj = runner.sample()
        metrics = runner.get_metrics()
        restarts = envs.get_num_restarts()
    (g,) = traj.groups.values()
    assert log.count("step_failed") >= 3 and log.count("reset_failed") >= 1
    assert metrics["num_dropped_steps"] == log.count("step_failed")
    assert metrics["num_env_steps"] == log.count("step_ok")
    assert metrics["num_agent_steps"] == int(g.valid.sum())
    assert metrics["num_faulty_episodes"] == log.count("step_failed")
    # Every failure, of a step, a reset or a restart's reset, made one new instance; a
    # restart whose first attempts failed counts once.
    assert log.count("made") - NUM_ENVS == log.count("step_failed") + log.count("reset_failed")
    # The process backend counts the restarts its step replies report (not those inside
    # resets), so its count lies between the failed steps and every new instance.
    assert log.count("step_failed") <= restarts <= log.count("made") - NUM_ENVS


def test_random_faults_hit_the_same_calls_on_every_backend(tmp_path):
    # Each env's draws are numbered by its own instances, not by the order in which
    # concurrent workers made them, so a seeded run is the same run on any backend.
    runs = []
    for backend in ("sync", "process"):
        log = CallLog(tmp_path / backend)
        fns = faulty_env_fns(coming_and_going, NUM_ENVS, RANDOM_FAULTS, log, seed=3)
        with jr.EnvRunner(
            make_envs(backend, fns, restart=True), random_policy(3), zero_params(3), 40, seed=SEED
        ) as runner:
            traj = runner.sample()
        events = ("made", "step_ok", "step_failed", "reset_ok", "reset_failed")
        runs.append((traj, {name: log.count(name) for name in events}))
    (sync_traj, sync_counts), (process_traj, process_counts) = runs
    assert sync_counts["step_failed"] >= 3 and sync_counts["reset_failed"] >= 1
    assert process_counts == sync_counts
    chex.assert_trees_all_equal(process_traj, sync_traj)


# -- agent episodes cut by a failure: faulty, as single-agent episodes are ----------------------


class Ended(jr.multi_agent.AgentCallbacks):
    def __init__(self):
        self.episodes = []

    def on_agent_episode_end(self, runner, episode):
        self.episodes.append(episode)


def test_agent_episodes_cut_by_a_failure_end_there_as_faults(clean):
    # Env 1's step AT fails: a1 and a2 were in its first episode (a0 had terminated),
    # whose parts before the failure are the fault-free run's, ended there; the restarted
    # env's episode starts anew (never joined to them).
    traj, _, _ = sample(faulty_fns("raise"), restart=True)
    assert not traj.valid[AT - 1, FAILING_ENV] and traj.valid.sum() == traj.valid.size - 1
    assert clean[0].valid is not None and clean[0].valid.all()
    mine = [e for e in traj.split_episodes() if e.env_id == FAILING_ENV]
    cut = {e.agent_id: e for e in mine if e.faulty}
    assert sorted(cut) == ["a1", "a2"]
    reference = {
        (e.agent_id, e.episode_id): e for e in clean[0].split_episodes() if e.env_id == FAILING_ENV
    }
    for agent, e in cut.items():
        assert e.truncated and not e.terminated and e.is_complete
        whole = reference[agent, e.episode_id]
        rows = e.length
        assert whole.env_step[rows] == AT - 1  # the failed step: the rest never happened
        np.testing.assert_array_equal(e.reward, whole.reward[:rows])
        np.testing.assert_array_equal(e.action, whole.action[:rows])
        np.testing.assert_array_equal(e.obs[:rows], whole.obs[:rows])
    after = [e for e in mine if e.env_step[0] > AT - 1 or e.episode_id != mine[0].episode_id]
    assert all(not e.faulty and e.start_step == 0 for e in after) and after
    assert all(e.env_step[0] == 0 for e in after)


def test_sample_episodes_keeps_faulty_agent_episodes_only_when_asked():
    def episodes(include_faulty, num, callbacks=None):
        envs = make_envs("sync", faulty_fns("raise"), True)
        policy, params = random_policy(3), zero_params(3)
        runner = jr.EnvRunner(envs, policy, params, T, seed=SEED, callbacks=callbacks)
        with runner:
            return runner.sample_episodes(num, include_faulty=include_faulty)

    ended = Ended()
    kept, skipped = episodes(True, 8, ended), episodes(False, 6)
    faulty = [(e.agent_id, e.env_id) for e in kept if e.faulty]
    assert faulty == [("a1", FAILING_ENV), ("a2", FAILING_ENV)]
    assert all(not e.faulty for e in skipped)
    key = lambda e: (e.agent_id, e.env_id, e.episode_id, e.reward.tolist())  # noqa: E731
    assert [key(e) for e in kept if not e.faulty] == [key(e) for e in skipped]
    # The callbacks see every agent episode that ended, the faulty ones too.
    assert [key(e) for e in kept] == [key(e) for e in ended.episodes][: len(kept)]
    with pytest.raises(InvalidArgumentTypeError, match=r"sample_episodes\(include_faulty=1\)"):
        episodes(1, 1)

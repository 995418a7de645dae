"""Fault tolerance of ``backend="process"`` (issue 4): sub-envs restarted inside their
worker as in the sync backend, dead and hung workers replaced, nothing stale read, and
every ``env.step`` call accounted for against a cross-process :class:`CallLog`."""

from __future__ import annotations

import functools
import os
import pathlib
import signal
import time
from contextlib import closing
from typing import Any

import gymnasium
import jax
import numpy as np
import pytest
from conftest import short_cartpole
from test_faults import RANDOM_FAULTS

import jaxrunner as jr
from jaxrunner._src.backends.process import ProcessConfig, ProcessVectorEnv
from jaxrunner.errors import (
    ClosedError,
    EnvError,
    InvalidActionError,
    InvalidArgumentError,
    WorkerError,
    WorkerTimeoutError,
)
from jaxrunner.models import mlp_policy
from jaxrunner.testing import CallLog, CountingEnv, FaultPlan, InjectedError, faulty_env_fns

NUM_ENVS, T = 4, 8
TIMEOUT_S = 1.5  # step_timeout_s of the hang tests
OBS_COLUMNS = slice(0, CountingEnv.NOISE)  # a recreated env's noise is unseeded


def counting_base(env_id: int) -> gymnasium.Env:
    return CountingEnv(env_id=env_id, episode_length=7)


def fns_with(faults_by_env: dict[int, list[FaultPlan]], log: CallLog | None = None) -> list:
    fns = []
    for i in range(NUM_ENVS):
        base = functools.partial(counting_base, i)
        fns += faulty_env_fns(base, 1, {0: faults_by_env.get(i, [])}, log, seed=i)
    return fns


def make_runner(envs: jr.VectorEnv, rollout_length: int = T, **kwargs) -> jr.EnvRunner:
    """A runner on ``envs`` (whose own restart policy decides how faults are handled)."""
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    return jr.EnvRunner(envs, policy, params, rollout_length, 0, **kwargs)


def process(
    fns,
    num_workers: int = 2,
    restart_policy: jr.RestartPolicy | None = jr.RestartPolicy(),  # noqa: B008 (frozen)
    **config,
) -> ProcessVectorEnv:
    """A process vec env, restarts on unless ``restart_policy=None``."""
    config = ProcessConfig(num_workers=num_workers, **config)
    return ProcessVectorEnv(fns, config, restart_policy=restart_policy)


def check_exact(log: CallLog, metrics: dict, envs: ProcessVectorEnv) -> None:
    """Good calls = valid transitions + results lost with a dead worker; failed calls =
    dropped slots - lost - never-started steps."""
    assert log.count("step_ok") == metrics["num_env_steps"] + envs.num_lost_steps
    assert log.count("step_failed") == (
        metrics["num_dropped_steps"] - envs.num_lost_steps - envs.num_unrun_steps
    )


def check_aligned(traj: jr.Trajectory) -> None:
    """A valid slot's obs continues the previous next_obs, except after an episode end
    or a failed slot."""
    cont = traj.valid[1:] & traj.valid[:-1] & ~traj.done[:-1]
    np.testing.assert_array_equal(traj.obs[1:][cont], traj.next_obs[:-1][cont])


# -- sub-envs restarted inside their worker ------------------------------------------------------


@pytest.mark.parametrize(
    "faults",
    [
        (FaultPlan(kind="raise", at=(3,)), FaultPlan(kind="bad_obs", at=(3,))),
        (FaultPlan(kind="nan_reward", at=(3,)), FaultPlan(kind="raise", call="reset", at=(2,))),
    ],
    ids=["raise+bad_obs", "nan_reward+reset_raise"],
)
def test_sub_env_restarts_equal_the_sync_backends(faults, tmp_path):
    """Envs 0 and 2 (one per worker) fail; the process backend gives the sync backend's
    trajectory: same failed slots, same fresh env after them, others untouched."""
    faults = {0: [faults[0]], 2: [faults[1]]}
    with make_runner(
        jr.SyncVectorEnv(fns_with(faults), restart_policy=jr.RestartPolicy())
    ) as runner:
        expected, expected_metrics = runner.sample(), runner.get_metrics()
    log = CallLog(tmp_path)
    with make_runner(process(fns_with(faults, log))) as runner:
        traj, metrics = runner.sample(), runner.get_metrics()
    assert (~traj.valid).sum() == expected_metrics["num_dropped_steps"] > 0
    np.testing.assert_array_equal(traj.valid, expected.valid)
    for key in ("num_env_steps", "num_dropped_steps", "num_faulty_episodes", "num_episodes"):
        assert metrics[key] == expected_metrics[key], key
    for b in (1, 3):  # never failed: identical
        for name in ("obs", "action", "reward", "terminated", "truncated", "next_obs", "step"):
            np.testing.assert_array_equal(getattr(traj, name)[:, b], getattr(expected, name)[:, b])
    for b in (0, 2):  # identical up to the restart, and the fresh env's obs after it
        np.testing.assert_array_equal(traj.next_obs[:2, b], expected.next_obs[:2, b])
        np.testing.assert_array_equal(
            traj.obs[..., OBS_COLUMNS][:, b], expected.obs[..., OBS_COLUMNS][:, b]
        )
    check_exact(log, metrics, runner.envs)
    assert metrics["num_dropped_steps"] == log.count("step_failed")


def test_random_sub_env_faults_restart_in_worker_and_count_exactly(tmp_path):
    log = CallLog(tmp_path)
    fns = faulty_env_fns(short_cartpole, 6, RANDOM_FAULTS, log, seed=3)
    envs = process(fns)
    valid = 0
    with make_runner(envs, rollout_length=50) as runner:
        for _ in range(2):
            traj = runner.sample()
            valid += int(traj.valid.sum())
            check_aligned(traj)
        metrics = runner.get_metrics()
    assert log.count("step_failed") > 8  # faults really happened
    assert envs.num_worker_restarts == 0 and envs.num_restarts >= log.count("step_failed")
    assert metrics["num_env_steps"] == valid == log.count("step_ok")
    assert metrics["num_dropped_steps"] == log.count("step_failed")
    assert metrics["num_dropped_steps"] + valid == 2 * 50 * 6


def test_sub_env_restarts_in_workers_equal_the_sync_backends_step_by_step(tmp_path):
    """Driven directly (no runner): the one step loop restarts failed sub-envs in a
    worker exactly as in-process, whatever fails (step, observation, reward, reset)."""
    faults = {
        0: [FaultPlan(kind="raise", at=(3,))],
        1: [FaultPlan(kind="nan_reward", at=(2,))],
        2: [FaultPlan(kind="bad_obs", at=(4,))],
        3: [FaultPlan(kind="raise", call="reset", at=(2,))],
    }
    policy = jr.RestartPolicy()
    with (
        closing(jr.SyncVectorEnv(fns_with(faults), restart_policy=policy)) as ref,
        closing(process(fns_with(faults), restart_policy=policy)) as vec,
    ):
        jr.testing.assert_trees_equal(vec.reset(seed=1), ref.reset(seed=1), "reset")
        for t in range(12):
            actions = np.full(NUM_ENVS, t % 3, np.int64)
            got, want = vec.step_batch(actions), ref.step_batch(actions)
            for name in ("reward", "terminated", "truncated", "failed"):
                np.testing.assert_array_equal(getattr(got, name), getattr(want, name), name)
            np.testing.assert_array_equal(got.obs[:, OBS_COLUMNS], want.obs[:, OBS_COLUMNS])
            assert got.infos == want.infos and got.reset_infos == want.reset_infos
            assert (got.errors or {}).keys() == (want.errors or {}).keys(), t
            for i, error in (got.errors or {}).items():
                assert type(error) is type(want.errors[i]), (t, i)
        assert vec.num_restarts == ref.num_restarts >= 4  # recreated envs fail again


# -- dead and hung workers ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["exit", "kill", "segfault", "hang"])
def test_a_dying_or_hung_worker_is_replaced_and_its_envs_episodes_cut(kind, tmp_path):
    """Env 2, the first of worker 1, kills (or hangs) its worker at its 4th step."""
    log = CallLog(tmp_path)
    with make_runner(jr.SyncVectorEnv(fns_with({}))) as runner:
        clean = runner.sample()
    fns = fns_with({}, log)
    fns[2] = _FirstInstanceFails(log, FaultPlan(kind=kind, at=(4,)), env_id=2)
    envs = process(fns, step_timeout_s=TIMEOUT_S)
    old_pids = list(envs.worker_pids)
    with make_runner(envs) as runner:
        start = time.monotonic()
        traj = runner.sample()
        took = time.monotonic() - start
        metrics = runner.get_metrics()
        new_pids = list(envs.worker_pids)
        counts = (envs.num_worker_restarts, envs.num_lost_steps, envs.num_unrun_steps)
        ok, failed = log.count("step_ok"), log.count("step_failed")
        assert runner.sample().valid.all()  # carries on
    assert took < TIMEOUT_S + 10
    assert new_pids[0] == old_pids[0] and new_pids[1] != old_pids[1]
    expected_valid = np.ones((T, NUM_ENVS), bool)
    expected_valid[3, 2:] = False  # both envs of worker 1, at their 4th step
    np.testing.assert_array_equal(traj.valid, expected_valid)
    for name in ("obs", "action", "reward", "next_obs", "step"):  # episode ids shift
        np.testing.assert_array_equal(getattr(traj, name)[:, :2], getattr(clean, name)[:, :2])
        np.testing.assert_array_equal(getattr(traj, name)[:3, 2:], getattr(clean, name)[:3, 2:])
    # No stale data: the failed slots and what follows come from the new envs.
    fresh = traj.next_obs[3, 2:]
    np.testing.assert_array_equal(fresh[:, [CountingEnv.SEED, CountingEnv.EPISODE]], [[-1, 0]] * 2)
    np.testing.assert_array_equal(fresh[:, CountingEnv.T], [0, 0])
    np.testing.assert_array_equal(traj.obs[4, 2:], fresh)
    np.testing.assert_array_equal(traj.obs[4:, 2:, CountingEnv.T], traj.step[4:, 2:])
    assert (traj.reward[3, 2:] == 0).all()
    check_aligned(traj)
    episodes = [e for e in traj.split_episodes() if e.env_id >= 2 and e.faulty]
    assert sorted(e.length for e in episodes) == [3, 3]
    assert metrics["num_faulty_episodes"] == 2 and metrics["num_dropped_steps"] == 2
    # One restart. Env 2's call failed; env 3 never started its step.
    assert counts == (1, 0, 1)
    assert ok == metrics["num_env_steps"] and failed == 1
    check_exact(log, runner.get_metrics(), envs)


def test_random_worker_deaths_with_one_worker_count_exactly(tmp_path):
    """One worker holds both pipelining groups: a death loses the other group's step in
    flight too, or fails its envs at their next step; every call is accounted for."""
    log = CallLog(tmp_path)
    faults = [FaultPlan(kind=k, probability=0.004) for k in ("exit", "kill", "segfault")]
    faults.append(FaultPlan(kind="raise", probability=0.01))
    fns = faulty_env_fns(short_cartpole, 6, faults, log, seed=5)
    envs = process(fns, num_workers=1, step_timeout_s=30)
    with make_runner(envs, rollout_length=40) as runner:
        for _ in range(3):
            check_aligned(runner.sample())
        metrics = runner.get_metrics()
    assert envs.num_worker_restarts >= 2 and envs.num_restarts >= 2
    assert envs.num_lost_steps + envs.num_unrun_steps > 0
    assert metrics["num_env_steps"] + metrics["num_dropped_steps"] == 3 * 40 * 6
    check_exact(log, metrics, envs)


@pytest.mark.parametrize("kind", ["exit", "hang"])
def test_restart_off_a_dead_or_hung_worker_raises_promptly(kind):
    fault = FaultPlan(kind=kind, at=(3,))
    envs = process(fns_with({3: [fault]}), restart_policy=None, step_timeout_s=TIMEOUT_S)
    runner = make_runner(envs)
    error = WorkerTimeoutError if kind == "hang" else WorkerError
    start = time.monotonic()
    with runner, pytest.raises(error, match=r"worker 1 \(pid \d+, sub-envs 2..3\)") as info:
        runner.sample()
    assert time.monotonic() - start < TIMEOUT_S + 10
    assert info.value.worker_index == 1 and info.value.env_indices == range(2, 4)
    if kind == "hang":
        assert isinstance(info.value, TimeoutError)
        assert "did not answer within step_timeout_s=1.5 s" in str(info.value)
    assert info.value.partial_trajectory.num_steps == 2
    with pytest.raises(ClosedError, match="worker 1"):
        envs.step(np.zeros(NUM_ENVS, np.int64))


def test_a_worker_killed_between_steps_keeps_every_recorded_step_in_the_partial():
    """Killed after its reply, the worker fails the next step's send: the step every env
    had recorded was left out of err.partial_trajectory (counted only after the sends)."""

    class Kill(jr.Callbacks):
        def on_episode_step(self, runner, env_index, episode):
            steps[env_index] = steps.get(env_index, 0) + 1
            if env_index == NUM_ENVS - 1 and steps[env_index] == 3:  # the last env's 3rd step
                os.kill(runner.envs.worker_pids[1], signal.SIGKILL)
                time.sleep(0.3)  # dead before the next send

    steps: dict[int, int] = {}
    envs = process(fns_with({}), restart_policy=None, step_timeout_s=10)
    runner = make_runner(envs, callbacks=Kill())
    with runner, pytest.raises(WorkerError, match="worker 1") as info:
        runner.sample()
    assert set(steps.values()) == {3}  # every env recorded 3 steps
    partial = info.value.partial_trajectory
    assert partial.num_steps == 3
    with make_runner(jr.make_vec(fns_with({}), NUM_ENVS)) as sync:
        reference = sync.sample()
    np.testing.assert_array_equal(partial.obs, reference.obs[:3])
    np.testing.assert_array_equal(partial.action, reference.action[:3])


@pytest.mark.parametrize("ready_first", [False, True])
@pytest.mark.parametrize("kind", ["exit", "hang"])
def test_a_lost_worker_is_replaced_in_both_stepping_modes(kind, ready_first, tmp_path):
    """Driven directly (no runner): env 2, the first of worker 1, ends (or hangs) its
    worker at its 4th step. Both of worker 1's slots of that step fail, worker 0 steps
    on untouched, and every env.step call is accounted for."""
    log = CallLog(tmp_path)
    fns = fns_with({}, log)
    fns[2] = _FirstInstanceFails(log, FaultPlan(kind=kind, at=(4,)), env_id=2)
    envs = process(fns, step_timeout_s=TIMEOUT_S, ready_first=ready_first)
    valid = dropped = 0
    with closing(envs), closing(jr.SyncVectorEnv(fns_with({}))) as ref:
        envs.reset(seed=0)
        ref.reset(seed=0)
        for t in range(6):
            want = ref.step_batch(np.zeros(NUM_ENVS, np.int64)).next_obs.copy()
            envs.send(np.zeros(NUM_ENVS, np.int64))
            for _ in range(2 if ready_first else 1):
                out = envs.recv()
                rows = out.env_ids if ready_first else slice(0, NUM_ENVS)
                failed = np.zeros(len(out.reward), bool) if out.failed is None else out.failed
                valid += int((~failed).sum())
                dropped += int(failed.sum())
                worker_1 = np.arange(NUM_ENVS)[rows] >= 2
                np.testing.assert_array_equal(failed, worker_1 & (t == 3))
                if t == 3 and failed.any():
                    assert isinstance(
                        out.errors[2], WorkerTimeoutError if kind == "hang" else WorkerError
                    )
                    fresh = out.next_obs[failed]
                    np.testing.assert_array_equal(fresh[:, CountingEnv.T], [0, 0])
                if t < 3:  # before the fault: the sync backend's steps
                    np.testing.assert_array_equal(out.next_obs, want[rows])
                else:  # worker 0 never noticed
                    keep = ~worker_1
                    np.testing.assert_array_equal(out.next_obs[keep], want[rows][keep])
    counts = (envs.num_worker_restarts, envs.num_lost_steps, envs.num_unrun_steps)
    assert counts == (1, 0, 1)  # env 2's call failed; env 3 never started its step
    assert dropped == 2 and valid == 6 * NUM_ENVS - 2
    assert log.count("step_ok") == valid + envs.num_lost_steps
    assert log.count("step_failed") == dropped - envs.num_lost_steps - envs.num_unrun_steps


# -- bounded recreation -------------------------------------------------------------------------


class _FirstInstanceFails:
    """A factory (picklable: it counts in a CallLog) of CountingEnv ``env_id`` whose
    first instance fails as ``fault`` says; later ones behave."""

    def __init__(self, log: CallLog, fault: FaultPlan, env_id: int) -> None:
        self.log, self.fault, self.env_id = log, fault, env_id

    def __call__(self) -> gymnasium.Env:
        made = self.log.count("first")
        self.log.record("first")
        faults = [self.fault] if made == 0 else []
        return jr.testing.FaultyEnv(counting_base(self.env_id), faults, self.log)


class _Unrecreatable:
    """A factory (picklable: it counts in a CallLog) whose first env fails (``kind``) at
    its 3rd step and whose every later env fails so in reset."""

    def __init__(self, log: CallLog, kind: Any) -> None:
        self.log = log
        self.first = FaultPlan(kind=kind, at=(3,))
        self.later = FaultPlan(kind=kind, call="reset", probability=1.0)

    def __call__(self) -> gymnasium.Env:
        made = self.log.count("factory")
        self.log.record("factory")
        return jr.testing.FaultyEnv(CountingEnv(), [self.first if made == 0 else self.later])


def test_a_sub_env_that_cannot_be_recreated_raises_after_max_attempts(tmp_path):
    log = CallLog(tmp_path)
    factory = _Unrecreatable(log, "raise")
    envs = process([factory, CountingEnv], 1, jr.RestartPolicy(max_attempts=4))
    runner = make_runner(envs)
    with runner, pytest.raises(EnvError, match="4 attempts in a row") as info:
        runner.sample()
    assert isinstance(info.value.__cause__, InjectedError)  # the original failure
    assert isinstance(info.value.recreation_error, InjectedError)
    assert info.value.env_index == 0
    assert log.count("factory") == 1 + 4
    assert info.value.partial_trajectory.num_steps == 2


def test_a_worker_that_cannot_be_restarted_raises_after_max_attempts(tmp_path):
    log = CallLog(tmp_path)
    factory = _Unrecreatable(log, "exit")
    envs = process([CountingEnv, factory], 2, jr.RestartPolicy(max_attempts=3, backoff_s=0.01))
    runner = make_runner(envs)
    with runner, pytest.raises(WorkerError, match="3 attempts in a row") as info:
        runner.sample()
    assert "worker 1" in str(info.value) and info.value.env_indices == range(1, 2)
    assert isinstance(info.value.__cause__, WorkerError)  # the first death
    assert "exited with code 13" in str(info.value.__cause__)
    assert isinstance(info.value.recreation_error, WorkerError)
    assert log.count("factory") == 1 + 3
    with pytest.raises(ClosedError):
        envs.step(np.zeros(2, np.int64))


# -- bad calls ----------------------------------------------------------------------------------


def test_a_wrong_length_action_batch_is_rejected_before_any_worker_steps(tmp_path):
    log = CallLog(tmp_path)
    with closing(process(fns_with({}, log))) as vec:
        vec.reset(seed=0)
        vec.step(np.zeros(NUM_ENVS, np.int64))
        for bad, rows in ((np.zeros(NUM_ENVS - 1, np.int64), None), (np.zeros(3), slice(0, 2))):
            with pytest.raises(InvalidActionError):
                vec.step_batch(bad, rows)
        assert log.count("step_ok") == NUM_ENVS  # no worker was sent anything
        out = vec.step_batch(np.arange(NUM_ENVS) % 3)
        np.testing.assert_array_equal(out.reward, np.arange(NUM_ENVS) % 3)  # still aligned
        np.testing.assert_array_equal(out.next_obs[:, CountingEnv.T], [2] * NUM_ENVS)
        out = vec.step_batch(np.ones(2, np.int64), slice(2, 4))
        np.testing.assert_array_equal(out.next_obs[:, CountingEnv.T], [3, 3])


def test_every_call_after_close_raises_a_clear_error():
    vec = process(fns_with({}))
    vec.reset(seed=0)
    vec.send(np.zeros(NUM_ENVS, np.int64))
    vec.close()
    calls = {
        "step": lambda: vec.step(np.zeros(NUM_ENVS, np.int64)),
        "send": lambda: vec.send(np.zeros(NUM_ENVS, np.int64)),
        "recv": vec.recv,
        "reset": vec.reset,
        "reset_at": lambda: vec.reset_at(0),
        "call": lambda: vec.call("reset"),
    }
    for name, call in calls.items():
        with pytest.raises(ClosedError, match=r"after the vector env was closed"):
            call()
        assert name


def test_step_timeout_option():
    with pytest.raises(InvalidArgumentError, match=r"step_timeout_s=0"):
        ProcessConfig(step_timeout_s=0)
    config = ProcessConfig(step_timeout_s=None)
    with closing(jr.make_vec(CountingEnv, 2, backend="process", config=config)) as vec:
        assert vec.step_timeout_s is None
        assert vec.capabilities.can_restart


def _pid_gone(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_a_replaced_workers_process_is_gone(tmp_path):
    fns = fns_with({})
    fns[1] = _FirstInstanceFails(CallLog(tmp_path), FaultPlan(kind="hang", at=(2,)), env_id=1)
    envs = process(fns, step_timeout_s=TIMEOUT_S)
    old = envs.worker_pids[0]
    with make_runner(envs) as runner:
        runner.sample()
        assert envs.worker_pids[0] != old and _pid_gone(old)
    assert os.getpid() not in envs.worker_pids


def test_restarts_of_failed_resets_are_counted():
    # A sub-env whose second reset raises is recreated inside the worker's reset (its
    # new instance resets fine): the count must include it (it used to count only the
    # restarts that step replies reported).
    reset_fault = [FaultPlan(kind="raise", call="reset", at=(2,))]
    with closing(process(fns_with({1: reset_fault, 2: reset_fault}))) as envs:
        envs.reset(seed=0)
        assert envs.num_restarts == 0
        envs.reset(seed=1)
        assert envs.num_restarts == 2
        # reset_at (gymnasium's reset_mask too): the recreated env 1's 2nd reset fails.
        envs.reset_at(1, seed=5)
        assert envs.num_restarts == 3


class NthInstanceFaults:
    """Sub-env ``env_id``'s factory: its ``k``-th instance (0 first, in any process,
    counted in ``log``) misbehaves as ``faults[k]`` says."""

    def __init__(self, log: CallLog, env_id: int, faults: dict[int, list[FaultPlan]]) -> None:
        self.log, self.env_id, self.faults = log, env_id, faults

    def __call__(self) -> gymnasium.Env:
        made = self.log.count("made")
        self.log.record("made")
        return jr.testing.FaultyEnv(counting_base(self.env_id), self.faults.get(made, []))


def test_a_replaced_workers_restarts_of_failed_first_resets_are_counted(tmp_path):
    # Env 2's first instance kills its worker; the replacement's first reset of the
    # second instance raises, and a third is made inside that worker: one restart.
    log = CallLog(tmp_path)
    fns = fns_with({})
    fns[2] = NthInstanceFaults(log, 2, {0: [FaultPlan(kind="exit", at=(2,))], 1: [RESET_RAISES]})
    with closing(process(fns)) as envs:
        envs.reset(seed=0)
        for _ in range(3):
            envs.step_batch(np.zeros(NUM_ENVS, np.int64))
        assert (log.count("made"), envs.num_worker_restarts, envs.num_restarts) == (3, 1, 1)


RESET_RAISES = FaultPlan(kind="raise", call="reset", at=(1,))


def test_multi_agent_restarts_of_failed_resets_are_counted():
    from jaxrunner._src.backends.process.vector_env import ProcessMultiAgentVectorEnv
    from jaxrunner.testing import coming_and_going, faulty_env_fns

    fault = FaultPlan(kind="raise", call="reset", at=(2,))
    fns = faulty_env_fns(coming_and_going, 3, {0: [fault], 2: [fault]})
    config = ProcessConfig(num_workers=2)
    with ProcessMultiAgentVectorEnv(fns, config=config, restart_policy=jr.RestartPolicy()) as envs:
        envs.reset_batch([0, 1, 2])
        assert envs.get_num_restarts() == 0
        envs.reset_batch([3, 4, 5])
        assert envs.get_num_restarts() == 2

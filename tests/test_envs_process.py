"""Tests for jaxrunner._src.backends.process (backend="process").

The backend must equal the sync backend step for step (and so gymnasium's SyncVectorEnv),
give EnvRunner trajectories identical to the sync backend's whatever the workers and the
pipelining (invariant 7), bring worker errors home with their traceback, and leave no
worker process behind.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import pathlib
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any

import gymnasium
import jax
import numpy as np
import pytest
from conftest import (
    ActorCritic,
    count_action_batch_checks,
    sample_checked_then_flagged,
    short_cartpole,
)

import jaxrunner as jr
from jaxrunner._src.backends.process import (
    DEFAULT_SPIN_WAIT_US,
    ProcessConfig,
    ProcessVectorEnv,
    RemoteTraceback,
    launch,
    make_process_vec,
    protocol,
    spin_wait_s,
    worker_bounds,
)
from jaxrunner.errors import (
    ClosedError,
    EnvError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidStepError,
    SpaceMismatchError,
    WorkerError,
)
from jaxrunner.testing import (
    CountingEnv,
    FaultPlan,
    InjectedError,
    VectorEnvContract,
    assert_trees_equal,
    counting_env_fns,
    faulty_env_fns,
)
from tests.multi_agent_envs import HOST_KINDS, PettingZooCases, make_kind, zero_actions

SEED = 7


class TestProcessContract(PettingZooCases, VectorEnvContract):
    """The backend contract, with sub-envs split over two workers (2 + 1)."""

    env_kinds = HOST_KINDS

    def make_vec(self, env_fns: Sequence[Callable[[], Any]], restart_policy=None) -> Any:
        # Either kind, learned from the workers' start reports (as make_vec builds it).
        config = ProcessConfig(num_workers=2)
        return make_process_vec(env_fns, config, restart_policy=restart_policy, multi_agent=None)


class TestProcessReadyFirstContract(VectorEnvContract):
    """The contract in ready-first mode (``step_batch`` still steps every row at once),
    on every kind of env."""

    env_kinds = HOST_KINDS

    def make_vec(self, env_fns: Sequence[Callable[[], Any]], restart_policy=None) -> Any:
        config = ProcessConfig(num_workers=2, ready_first=True)
        return make_process_vec(env_fns, config, restart_policy=restart_policy, multi_agent=None)


def _pids_alive(pids: Sequence[int]) -> list[int]:
    """The pids that still run (zombies count as gone: nothing is left but an entry)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state not in ("Z", "X"):
            alive.append(pid)
    return alive


def _wait_gone(pids: Sequence[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (alive := _pids_alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")


# -- equality with the sync backend, through EnvRunner -----------------------------------------


def _runner(envs: jr.VectorEnv, **kwargs: Any) -> jr.EnvRunner:
    policy = jr.Policy.from_linen(ActorCritic(2), envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    return jr.EnvRunner(envs, policy, params, rollout_length=25, seed=SEED, **kwargs)


def _as_tree(traj: jr.Trajectory) -> dict[str, Any]:
    return {f.name: getattr(traj, f.name) for f in dataclasses.fields(traj)}


NUM_ENVS = 7


@pytest.fixture(scope="module")
def sync_reference() -> list[jr.Trajectory]:
    with _runner(jr.make_vec(short_cartpole, NUM_ENVS), num_splits=1) as runner:
        return [runner.sample() for _ in range(2)]  # episodes carry on across samples


@pytest.fixture(scope="module")
def shared_process_vec():
    """One process vec env (2 workers) shared by the runner tests: each runner resets it."""
    with ProcessVectorEnv([short_cartpole] * NUM_ENVS, ProcessConfig(num_workers=2)) as vec:
        yield vec


@pytest.mark.parametrize("num_splits", [None, 2])
def test_runner_equal_to_sync_whatever_the_groups(sync_reference, shared_process_vec, num_splits):
    runner = _runner(shared_process_vec, num_splits=num_splits)  # not stopped: vec is shared
    if num_splits is None:  # the default below TWO_SPLITS_MIN_ENVS: one split
        assert runner.sampler.splits == [slice(0, 7)]
    else:
        assert runner.sampler.splits == [slice(0, 4), slice(4, 7)]
    for t, expected in enumerate(sync_reference):
        assert_trees_equal(_as_tree(runner.sample()), _as_tree(expected), f"sample {t}")


@pytest.mark.parametrize(
    "options, num_splits",
    [
        ({"envs_per_worker": 3}, 3),  # groups 0-1, 2-4, 5-6 straddle workers 0-2, 3-5, 6
        ({"envs_per_worker": 1}, 2),
        ({"num_workers": 1}, 3),
    ],
)
def test_runner_equal_to_sync_whatever_the_workers(sync_reference, options, num_splits):
    envs = jr.make_vec(short_cartpole, NUM_ENVS, backend="process", config=ProcessConfig(**options))
    assert isinstance(envs, ProcessVectorEnv)
    with _runner(envs, num_splits=num_splits) as runner:
        for t, expected in enumerate(sync_reference):
            assert_trees_equal(_as_tree(runner.sample()), _as_tree(expected), f"sample {t}")
        metrics = runner.get_metrics()
    assert metrics["num_env_steps"] == 2 * 25 * NUM_ENVS and metrics["num_episodes"] > 0


# -- the async split ---------------------------------------------------------------------------


def test_a_send_of_rows_in_flight_waits_and_steps_them_after_the_earlier_send():
    """A lockstep send of rows still in flight is held (a copy of its actions) and goes
    out once the earlier send is received: both answer as two steps in turn would."""
    fns = counting_env_fns(4, episode_length=3)
    with closing(ProcessVectorEnv(fns)) as vec, closing(jr.SyncVectorEnv(fns)) as ref:
        vec.reset_batch([SEED + i for i in range(4)])
        ref.reset_batch([SEED + i for i in range(4)])
        first, second = np.array([1, 0, 1, 0]), np.array([0, 1])
        expected = [jax.tree.map(np.copy, tuple(ref.step_batch(first)[:3]))]
        expected.append(jax.tree.map(np.copy, tuple(ref.step_batch(second, slice(0, 2))[:3])))
        vec.send(first)
        vec.send(second, slice(0, 2))
        second[:] = 5  # held as a copy: the caller may reuse its array at once
        for want, rows in zip(expected, (None, slice(0, 2))):
            out = vec.recv()
            assert out.env_ids == rows
            assert_trees_equal(tuple(out[:3]), want, f"rows {rows}")


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_send_and_recv_answer_in_send_order(backend):
    """Disjoint rows in flight together; each recv returns the oldest send's rows."""
    fns = counting_env_fns(4, episode_length=2)
    make = functools.partial(ProcessVectorEnv, config=ProcessConfig(num_workers=2))
    with (
        closing(make(fns) if backend == "process" else jr.SyncVectorEnv(fns)) as vec,
        closing(jr.SyncVectorEnv(fns)) as ref,
    ):
        vec.reset_batch([SEED + i for i in range(4)])
        ref.reset_batch([SEED + i for i in range(4)])
        halves = slice(0, 2), slice(2, 4)
        for t in range(5):
            actions = np.full(4, t % 3, dtype=np.int64)
            expected = ref.step_batch(actions)
            want = (expected.obs.copy(), expected.next_obs.copy(), expected.reward.copy())
            order = halves if t % 2 else halves[::-1]
            for rows in order:
                vec.send(actions[rows], rows)
            for rows in order:
                out = vec.recv()
                assert out.env_ids == rows
                assert_trees_equal(
                    (out.obs, out.next_obs, out.reward), tuple(x[rows] for x in want), f"{t}"
                )
        with pytest.raises(InvalidArgumentError, match=r"no send\(\) is waiting"):
            vec.recv()
        if backend == "process":  # a reset drops the results of sends not yet received
            vec.send(np.zeros(2, np.int64), halves[0])
            ref.step_batch(np.zeros(2, np.int64), halves[0])  # the step itself happened
            assert_trees_equal(vec.reset(seed=SEED), ref.reset(seed=SEED), "reset")
            with pytest.raises(InvalidArgumentError, match=r"no send\(\) is waiting"):
                vec.recv()


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_same_rows_sent_again_before_the_recv_are_stepped_in_order(backend):
    fns = counting_env_fns(2, episode_length=50)
    config = ProcessConfig(num_workers=1)
    with closing(
        ProcessVectorEnv(fns, config) if backend == "process" else jr.SyncVectorEnv(fns)
    ) as vec:
        vec.reset(seed=SEED)
        vec.send(np.zeros(2, np.int64))
        # The second send waits (unsent) until the first is received.
        first = vec.step_batch(np.ones(2, np.int64))
        np.testing.assert_array_equal(first.obs[:, CountingEnv.T], [1, 1])
        np.testing.assert_array_equal(first.reward, [0.0, 0.0])
        second = vec.recv()
        np.testing.assert_array_equal(second.obs[:, CountingEnv.T], [2, 2])
        np.testing.assert_array_equal(second.reward, [1.0, 1.0])


def test_reset_at_of_a_sub_env_whose_step_is_in_flight_is_refused():
    """Its worker steps it before the reset, which would overwrite the step's observation
    (the sync backend resets first: it steps at recv); refused, the step still arrives."""
    with closing(ProcessVectorEnv(counting_env_fns(2, episode_length=50), ProcessConfig())) as vec:
        vec.reset(seed=SEED)
        vec.send(np.zeros(2, np.int64))
        with pytest.raises(InvalidArgumentError, match=r"reset_at\(1\): sub-env 1's step is in"):
            vec.reset(options={"reset_mask": np.array([False, True])})
        out = vec.recv()
        np.testing.assert_array_equal(out.next_obs[:, CountingEnv.T], [1, 1])
        np.testing.assert_array_equal(out.obs, out.next_obs)
        vec.reset_at(1)  # nothing in flight: as before


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault, call, at, error, match",
    [
        ("raise", "step", 2, EnvError, r"sub-env 1 raised in step\(\)"),
        ("raise", "reset", 2, EnvError, r"sub-env 1 raised in reset\(\)"),
        ("nan_reward", "step", 1, InvalidStepError, r"sub-env 1 returned a non-finite reward"),
        ("obs_dtype", "step", 1, SpaceMismatchError, r"sub-env 1 returned an observation"),
        ("info_not_dict", "reset", 1, InvalidStepError, r"sub-env 1 returned an info"),
    ],
)
def test_worker_errors_come_home_like_sync(fault, call, at, error, match):
    plan = FaultPlan(kind=fault, call=call, at=(at,))
    fns = faulty_env_fns(counting_env_fns(3, episode_length=1), faults={1: [plan]})
    errors = []
    for make in (
        jr.SyncVectorEnv,
        functools.partial(ProcessVectorEnv, config=ProcessConfig(num_workers=2)),
    ):
        with closing(make(fns)) as vec, pytest.raises(error, match=match) as excinfo:
            vec.reset(seed=SEED)
            for _ in range(3):
                vec.step(np.zeros(3, dtype=np.int64))
        errors.append(excinfo.value)
    sync_err, process_err = errors
    assert str(process_err) == str(sync_err)
    if error is EnvError:
        assert process_err.env_index == 1
        cause = process_err.__cause__
        assert isinstance(cause, InjectedError)
        # The worker's own traceback, as text, chained under the original exception.
        assert isinstance(cause.__cause__, RemoteTraceback)
        remote = str(cause.__cause__)
        assert "testing/faults.py" in remote and "InjectedError" in remote
    else:
        assert isinstance(process_err.__cause__, RemoteTraceback)


@pytest.mark.parametrize("ready_first", [False, True])
@pytest.mark.parametrize("kind", HOST_KINDS)
def test_send_and_recv_errors_name_the_vector_env_of_either_kind(kind, ready_first):
    config = ProcessConfig(num_workers=2, ready_first=ready_first)
    with closing(make_kind(kind, 4, "process", config=config, seed=SEED)) as vec:
        name = type(vec).__name__
        with pytest.raises(InvalidArgumentError, match=rf"^{name}\.recv\(\): no send"):
            vec.recv()
        with pytest.raises(InvalidArgumentError, match=rf"^{name}\.send\(env_ids=\[0, 1\]\)"):
            vec.send(zero_actions(vec, 2), [0, 1])
        if ready_first:
            with pytest.raises(InvalidArgumentError, match=rf"^{name}\.send\(.*whole workers"):
                vec.send(zero_actions(vec, 1), slice(0, 1))
            vec.send(zero_actions(vec, 4))
            with pytest.raises(InvalidArgumentError, match=rf"^{name}\.send\(.*in flight"):
                vec.send(zero_actions(vec, 2), slice(0, 2))


def test_failing_factory_names_the_env():
    def make(i: int) -> Callable[[], gymnasium.Env]:
        return functools.partial(CountingEnv, env_id=i) if i != 2 else _broken_factory

    with pytest.raises(EnvError, match=r"factory of sub-env 2 raised in worker 1") as excinfo:
        ProcessVectorEnv([make(i) for i in range(3)], ProcessConfig(num_workers=2))
    assert excinfo.value.env_index == 2
    assert isinstance(excinfo.value.__cause__, InjectedError)


def _broken_factory() -> gymnasium.Env:
    raise InjectedError("factory failed")


def test_different_spaces_across_workers():
    fns = [CountingEnv, CountingEnv, functools.partial(CountingEnv, num_actions=4)]
    with pytest.raises(SpaceMismatchError, match=r"sub-env 2 has action_space=Discrete\(4\)"):
        ProcessVectorEnv(fns, ProcessConfig(num_workers=3))


def test_lambda_factories_travel_by_value():
    lam = lambda: CountingEnv()  # noqa: E731
    with closing(ProcessVectorEnv([lam, lam], ProcessConfig(num_workers=1))) as vec:
        obs, _ = vec.reset(seed=SEED)
        assert obs.shape == (2, 5)
    lock = threading.Lock()  # process-bound: no pickler can send it
    bound = lambda: CountingEnv() if lock else None  # noqa: E731
    with pytest.raises(InvalidArgumentTypeError, match=r"factory of sub-env 1 cannot be sent"):
        ProcessVectorEnv([CountingEnv, bound], ProcessConfig(num_workers=1))


def _exit_in_step() -> gymnasium.Env:
    return _ExitingEnv()


class _ExitingEnv(CountingEnv):
    def step(self, action: Any) -> Any:
        os._exit(3)


def preload_seen() -> gymnasium.Env:
    env = CountingEnv()
    conftest = sys.modules.get("tests.conftest")  # (the tests import it as "conftest")
    env.preloaded_by = None if conftest is None else conftest.IMPORTED_IN  # type: ignore[attr-defined]
    env.worker = os.getpid()  # type: ignore[attr-defined]
    return env


def test_workers_fork_with_the_modules_the_user_preloads():
    """conftest.py names itself in multiprocessing's fork-server preload; the backend
    adds its own modules to that list, so each worker finds it imported by the fork
    server, not by itself."""
    config = ProcessConfig(num_workers=2)
    with closing(jr.make_vec(preload_seen, 2, "process", config=config)) as vec:
        workers = vec.get_attr("worker")
        assert len(set(workers)) == 2 and os.getpid() not in workers
        preloaded_by = vec.get_attr("preloaded_by")
        assert None not in preloaded_by and not set(preloaded_by) & set(workers), preloaded_by


def test_dead_worker_is_reported_and_closes_the_vec_env():
    with closing(
        ProcessVectorEnv([CountingEnv, _exit_in_step], ProcessConfig(num_workers=2))
    ) as vec:
        vec.reset(seed=SEED)
        pids = list(vec.worker_pids)
        with pytest.raises(WorkerError, match=r"worker 1 \(pid \d+, sub-envs 1..1\) exited with"):
            vec.step(np.zeros(2, np.int64))
        with pytest.raises(ClosedError, match=r"worker 1"):
            vec.step(np.zeros(2, np.int64))
    assert not _wait_gone(pids)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"envs_per_worker": 0}, r"envs_per_worker=0"),
        ({"num_workers": 1.5}, r"num_workers=1.5"),
        ({"num_workers": 5}, r"more workers than sub-envs"),
        ({"num_workers": 2, "envs_per_worker": 2}, r"give one of them"),
        ({"start_method": "fork"}, r"'fork' is refused"),
        ({"spin_wait_us": -1}, r"spin_wait_us=-1\)"),
        ({"spin_wait_us": float("nan")}, r"spin_wait_us=nan\)"),
        ({"spin_wait_us": True}, r"spin_wait_us=True\)"),
        ({"spin_wait_us": "300"}, r"spin_wait_us='300'\)"),
    ],
)
def test_bad_options(options, match):
    with pytest.raises(InvalidArgumentError, match=match):  # by the config, or at the start
        jr.make_vec(CountingEnv, 4, backend="process", config=ProcessConfig(**options))


def test_worker_bounds():
    assert worker_bounds(7, 3, None) == [(0, 3), (3, 6), (6, 7)]
    assert worker_bounds(7, None, 2) == [(0, 4), (4, 7)]
    assert worker_bounds(4, None, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert len(worker_bounds(64, None, None)) == max(1, launch.available_cpus() - 1)


def test_default_splits_two_from_the_sub_envs_where_they_pay(monkeypatch):
    """Two splits from TWO_SPLITS_MIN_ENVS sub-envs on a CPU host, whatever their agents
    (MPE's 3 agents at 8 envs ran faster in one), one below it and on an accelerator,
    where a second policy call per step costs more than the overlap gains. The threshold
    is lowered to 4 here (few workers to start): 3 and 4 envs of 3 agents are 9 and 12
    rows, which a threshold in rows would split alike."""
    from jaxrunner._src.backends.process import vector_env
    from jaxrunner._src.samplers import pipeline_splits
    from tests.multi_agent_envs import simple_spread

    monkeypatch.setattr(vector_env, "TWO_SPLITS_MIN_ENVS", 4)
    widths = [(3, 1), (4, 2)]
    cases = [(ProcessVectorEnv([short_cartpole] * n), s) for n, s in widths]
    cases += [(jr.make_multi_agent_vec(simple_spread, n, "process"), s) for n, s in widths]
    for vec, splits in cases:
        with vec:
            assert pipeline_splits.default_num_splits(vec) == splits
            with monkeypatch.context() as gpu:
                gpu.setattr(jax, "default_backend", lambda: "gpu")
                assert pipeline_splits.default_num_splits(vec) == 1


@pytest.mark.parametrize(
    ("num_envs", "main_process", "workers"),
    [
        (3, "computes", 3),  # one CPU for the main process's policy and bookkeeping
        (255, "computes", 3),
        (256, "computes", 4),  # from ALL_CPUS_FROM_ENVS, its envs outweigh that work
        (512, "steps", 3),  # a main process with sub-envs of its own keeps a CPU
        (8, "waits", 4),  # one that waits while the workers step does not
        (2, "waits", 2),  # at most one worker per sub-env
    ],
)
def test_default_workers_by_cpus_and_width(monkeypatch, num_envs, main_process, workers):
    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda _: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(launch, "cgroup_cpu_quota", lambda: None)
    assert launch.ALL_CPUS_FROM_ENVS == 256
    assert launch.default_num_workers(num_envs, main_process=main_process) == workers
    if main_process == "computes":
        assert len(worker_bounds(num_envs, None, None)) == workers


@pytest.mark.parametrize(
    ("spin_wait_us", "num_workers", "spin_s"),
    [
        (None, 3, DEFAULT_SPIN_WAIT_US * 1e-6),  # a CPU each: spin a little before sleeping
        (None, 4, 0.0),  # a worker per CPU: a spinning main process would take one's CPU
        (0, 3, 0.0),
        (50, 4, 50e-6),  # asked for: spins even where it shares CPUs
    ],
)
def test_spin_budget_by_cpus(monkeypatch, spin_wait_us, num_workers, spin_s):
    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda _: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(launch, "cgroup_cpu_quota", lambda: None)
    assert spin_wait_s(ProcessConfig(spin_wait_us=spin_wait_us), num_workers) == pytest.approx(
        spin_s
    )


def test_spin_returns_when_data_comes_or_the_budget_ends(monkeypatch):
    monkeypatch.setattr(protocol.os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # a quiet machine
    mine, theirs = socket.socketpair()
    with mine, theirs:
        poller = select.poll()
        poller.register(mine, select.POLLIN)
        start = time.perf_counter()
        protocol.Spin(0.02).until_readable(poller.poll)  # nothing comes: spins the whole budget
        assert time.perf_counter() - start >= 0.02
        theirs.sendall(b"x")
        start = time.perf_counter()
        protocol.Spin(60.0).until_readable(poller.poll)  # data waiting: returns at once
        assert time.perf_counter() - start < 30.0
        calls = []
        protocol.Spin(0.0).until_readable(lambda timeout: calls.append(timeout) or [])
        assert calls == []  # no budget: not even one poll


def test_spin_backs_off_when_it_does_not_pay_and_comes_back(monkeypatch):
    monkeypatch.setattr(protocol.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    spin = protocol.Spin(400e-6, cpus=2)
    nothing = lambda timeout: []  # noqa: E731  (the reply always comes after the budget)
    for _ in range(protocol.Spin.WINDOW * 4):
        spin.until_readable(nothing)
    assert spin.budget_s == 0.0  # 400 -> 200 -> 100 -> 50 -> off
    polls = []
    for _ in range(protocol.Spin.PROBE_EVERY - 1):  # off: not one poll until the probe
        spin.until_readable(lambda timeout: polls.append(timeout) or [])
    assert polls == []
    spin.until_readable(nothing)
    assert spin.budget_s == pytest.approx(50e-6)  # probing again, at an eighth
    ready = lambda timeout: [(0, select.POLLIN)]  # noqa: E731  (data is there at once)
    for _ in range(protocol.Spin.WINDOW * 3):
        spin.until_readable(ready)
    assert spin.budget_s == pytest.approx(400e-6)  # every spin paid: back to the budget


def test_spin_does_not_spin_while_the_machine_is_loaded(monkeypatch):
    monkeypatch.setattr(protocol.os, "getloadavg", lambda: (6.0, 6.0, 6.0))
    polls = []
    spin = protocol.Spin(0.05, cpus=2)
    start = time.perf_counter()
    spin.until_readable(lambda timeout: polls.append(timeout) or [])
    assert polls == [] and time.perf_counter() - start < 0.05


def test_available_cpus_reads_the_cgroup_quota(monkeypatch, tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert launch.cgroup_cpu_quota(str(tmp_path)) == pytest.approx(1.5)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert launch.cgroup_cpu_quota(str(tmp_path)) is None
    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda _: set(range(64)), raising=False)
    monkeypatch.setattr(launch, "cgroup_cpu_quota", lambda: 1.5)
    assert launch.available_cpus() == 2  # a container given 1.5 CPUs of a 64-core host


def test_trajectories_equal_with_and_without_spinning(sync_reference):
    for spin_wait_us in (0, 10_000):
        config = ProcessConfig(num_workers=2, spin_wait_us=spin_wait_us)
        envs = jr.make_vec(short_cartpole, NUM_ENVS, backend="process", config=config)
        assert envs._transport.pool.spin_s == pytest.approx(spin_wait_us * 1e-6)
        with _runner(envs) as runner:
            for t, expected in enumerate(sync_reference):
                assert_trees_equal(_as_tree(runner.sample()), _as_tree(expected), f"sample {t}")


# -- the rest of gymnasium's VectorEnv API ------------------------------------------------------


def test_call_get_attr_set_attr_render():
    fns = counting_env_fns(3, max_episode_steps=10, render_mode="ansi")
    with closing(ProcessVectorEnv(fns, ProcessConfig(num_workers=2))) as vec:
        assert vec.call("get_wrapper_attr", "env_id") == (0, 1, 2)
        assert vec.get_attr("episode_length") == (3, 4, 5)
        vec.set_attr("episode_length", [2, 1, 2])
        assert vec.get_attr("episode_length") == (2, 1, 2)
        with pytest.raises(ValueError, match=r"one value per sub-env \(3\), got 2"):
            vec.set_attr("episode_length", [1, 2])
        with pytest.raises(AttributeError):  # the worker's own error, re-raised here
            vec.get_attr("no_such_attribute")
        vec.reset(seed=SEED)
        _, _, terminated, _, _ = vec.step(np.zeros(3, dtype=np.int64))
        np.testing.assert_array_equal(terminated, [False, True, False])
        assert vec.render() == ("env 0 episode 0 t 1", "env 1 episode 1 t 0", "env 2 episode 0 t 1")


@pytest.mark.parametrize("first", ["step", "handle"])
def test_a_sub_env_handle_reaches_the_replacement_of_its_worker(first):
    """A handle names a slot, not an object: taken before sub-env 3's worker is killed
    and replaced (restart policy), it reaches the new worker's fresh sub-env, whether
    a step or the handle's own request meets the dead worker first."""
    config = ProcessConfig(num_workers=2)
    fns = counting_env_fns(4)  # episode lengths 3, 4, 5, 6
    with closing(ProcessVectorEnv(fns, config, restart_policy=jr.RestartPolicy())) as vec:
        vec.reset(seed=SEED)
        handles = vec.get_sub_environments()
        handles[3].set_attr("episode_length", 99)
        with pytest.raises(AttributeError):  # the sub-env's own error, re-raised here
            handles[3].get_attr("no_such_attribute")
        old_pid = vec.worker_pids[1]
        os.kill(old_pid, signal.SIGKILL)
        if first == "step":
            out = vec.step_batch(np.zeros(4, np.int64))
            np.testing.assert_array_equal(out.failed, [False, False, True, True])
        # The factory's new sub-env: its own episode length, not the one set on the old.
        assert handles[3].get_attr("episode_length") == 6
        assert vec.worker_pids[1] != old_pid and vec.num_worker_restarts == 1
        handles[3].set_attr("episode_length", 7)
        assert vec.get_attr("episode_length") == (3, 4, 5, 7)


def test_spawn_start_method():
    fns = [functools.partial(jr.testing.DictObsEnv, max_steps=3)] * 2
    with (
        closing(ProcessVectorEnv(fns, ProcessConfig(num_workers=1, start_method="spawn"))) as vec,
        closing(jr.SyncVectorEnv(fns)) as ref,
    ):
        assert_trees_equal(vec.reset(seed=SEED), ref.reset(seed=SEED))
        actions = np.full((2, 2), 0.5, np.float32)
        for t in range(4):
            assert_trees_equal(vec.step(actions), ref.step(actions), f"step {t}")


# -- no orphan processes ------------------------------------------------------------------------


@needs_proc
def test_workers_end_on_close_and_on_garbage_collection():
    vec = ProcessVectorEnv([CountingEnv] * 2, ProcessConfig(num_workers=2))
    pids = vec.worker_pids
    assert len(pids) == 2 and len(_pids_alive(pids)) == 2
    vec.close()
    assert not _wait_gone(pids)
    vec = ProcessVectorEnv([CountingEnv] * 2, ProcessConfig(num_workers=2))
    pids = vec.worker_pids
    del vec
    gc.collect()
    assert not _wait_gone(pids)


_ORPHAN_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import jaxrunner as jr

    if __name__ == "__main__":
        envs = jr.make_vec(
            "CartPole-v1", 2, backend="process", seed=0, config=jr.ProcessConfig(num_workers=2)
        )
        print(" ".join(str(pid) for pid in envs.worker_pids), flush=True)
        if sys.argv[1] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # no clean-up code runs at all
        # "exit": the interpreter exits with the vector env still referenced, unclosed
    """
)


@needs_proc
def test_no_orphans_after_interpreter_exit_or_kill(tmp_path: pathlib.Path):
    script = tmp_path / "orphans.py"
    script.write_text(_ORPHAN_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = {
        how: subprocess.Popen(
            [sys.executable, str(script), how], stdout=subprocess.PIPE, text=True, env=env
        )
        for how in ("exit", "kill")
    }
    for how, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        expected = -signal.SIGKILL if how == "kill" else 0
        assert proc.returncode == expected, out
        pids = [int(p) for p in out.split()]
        assert len(pids) == 2
        assert not _wait_gone(pids), f"{how}: workers {pids} outlived the main process"


# The CLI on the process backend: tests/test_benchmarks.py (one bench run checks both).


# -- ready-first mode ---------------------------------------------------------------------------


class GatedEnv(CountingEnv):
    """A CountingEnv whose first step waits until the file ``gate`` exists: a sub-env as
    slow as the test wants, without timing anything."""

    def __init__(self, gate: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate, self.steps = gate, 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        deadline = time.monotonic() + 60.0  # a safety net only: the test opens the gate
        while self.steps == 1 and not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.005)
        return super().step(action)


def _gated_fns(gate: pathlib.Path) -> list[Callable[[], gymnasium.Env]]:
    """Four CountingEnvs (long episodes); env 0's first step waits for ``gate``."""
    fns = [functools.partial(CountingEnv, env_id=i, episode_length=100) for i in range(4)]
    fns[0] = functools.partial(GatedEnv, str(gate), env_id=0, episode_length=100)
    return fns


def test_ready_first_returns_whichever_worker_answers_first(tmp_path: pathlib.Path):
    """Worker 0 (envs 0-1) is stuck in env 0's first step; worker 1 (envs 2-3) steps on,
    result after result. Every env steps exactly as often as it was sent, and each
    env's steps equal a sync env's given the same actions."""
    gate = tmp_path / "gate"
    config = ProcessConfig(num_workers=2, ready_first=True)
    with (
        closing(ProcessVectorEnv(_gated_fns(gate), config)) as vec,
        closing(jr.SyncVectorEnv(_gated_fns(tmp_path / "open"))) as ref,
    ):
        (tmp_path / "open").touch()  # the reference never waits
        assert vec.capabilities.ready_first and not ProcessVectorEnv.capabilities.ready_first
        assert_trees_equal(vec.reset(seed=SEED), ref.reset(seed=SEED), "reset")
        rng = np.random.default_rng(0)
        actions = rng.integers(0, 3, size=4)
        vec.send(actions)
        sent = {0: actions[:2], 2: actions[2:]}  # by the worker's first env
        counts = np.zeros(4, int)
        for k in range(5):  # worker 0 cannot answer before the gate opens
            out = vec.recv()
            assert out.env_ids == slice(2, 4), k
            want = ref.step_batch(sent[out.env_ids.start], out.env_ids)
            assert_trees_equal(
                (out.obs, out.next_obs, out.reward), (want.obs, want.next_obs, want.reward)
            )
            counts[2:] += 1
            sent[out.env_ids.start] = rng.integers(0, 3, size=2)
            vec.send(sent[out.env_ids.start], out.env_ids)
        gate.touch()  # now both workers have a step in flight, answered in any order
        answered = []
        for _ in range(2):
            out = vec.recv()
            want = ref.step_batch(sent[out.env_ids.start], out.env_ids)
            assert_trees_equal((out.obs, out.reward), (want.obs, want.reward))
            counts[out.env_ids] += 1
            answered.append(out.env_ids.start)
        assert sorted(answered) == [0, 2]
        with pytest.raises(InvalidArgumentError, match=r"no send\(\) is waiting"):
            vec.recv()
        obs = vec.step_batch(np.zeros(4, np.int64)).obs  # lockstep, in ready-first mode too
        np.testing.assert_array_equal(obs[:, CountingEnv.T], counts + 1)
        np.testing.assert_array_equal(counts, [1, 1, 6, 6])


def test_ready_first_sends_whole_workers_once_at_a_time():
    config = ProcessConfig(num_workers=2, ready_first=True)
    with closing(ProcessVectorEnv(counting_env_fns(4), config)) as vec:
        vec.reset(seed=SEED)
        with pytest.raises(InvalidArgumentError, match=r"must cover whole workers"):
            vec.send(np.zeros(1, np.int64), slice(0, 1))
        vec.send(np.zeros(2, np.int64), slice(2, 4))
        with pytest.raises(InvalidArgumentError, match=r"still in flight"):
            vec.send(np.zeros(4, np.int64))
        assert vec.recv().env_ids == slice(2, 4)


def test_process_config_is_checked():
    with pytest.raises(InvalidArgumentTypeError, match=r"ready_first=1"):
        ProcessConfig(ready_first=1)
    with pytest.raises(TypeError):  # keyword-only
        ProcessConfig(2)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ProcessConfig().num_workers = 2  # type: ignore[misc]
    with pytest.raises(InvalidArgumentTypeError, match=r"expected a jaxrunner.ProcessConfig"):
        ProcessVectorEnv(counting_env_fns(2), {"num_workers": 2})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match=r"expected a jaxrunner.ProcessConfig"):
        jr.make_vec(CountingEnv, 2, backend="process", config=jr.RayConfig())


def test_the_runners_checked_actions_skip_the_backends_check(monkeypatch) -> None:
    """The actions the runner's policy step checked are written to shared memory as they
    are (``send_checked``, the backend's check skipped); a batch the step flags goes
    through the check, which refuses it before any sub-env steps, naming the sub-env and
    the value."""
    checked = count_action_batch_checks(monkeypatch)
    envs = jr.make_vec("CartPole-v1", 3, "process")
    traj = sample_checked_then_flagged(envs, checked, 1, 2, r"sub-env 0's action 2 \(row 0")
    assert (traj.action == 1).all() and checked == [3]

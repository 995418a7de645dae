"""Tests for jaxrunner.envs.process (backend="process").

The backend must equal the sync backend step for step (and so gymnasium's SyncVectorEnv),
give EnvRunner trajectories identical to the sync backend's whatever the workers and the
pipelining (invariant 7), bring worker errors home with their traceback, and leave no
worker process behind.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import os
import pathlib
import signal
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
from conftest import ActorCritic, short_cartpole

import jaxrunner as jr
from jaxrunner import cli
from jaxrunner.envs.process import ProcessVectorEnv, RemoteTraceback, worker_bounds
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
    DictObsEnv,
    InjectedFault,
    VectorEnvContract,
    assert_trees_equal,
    bad_env_fns,
    counting_env_fns,
)

SEED = 7


class TestProcessContract(VectorEnvContract):
    """The backend contract, with sub-envs split over two workers (2 + 1)."""

    def make_vec(self, env_fns: Sequence[Callable[[], gymnasium.Env]]) -> jr.VectorEnv:
        return ProcessVectorEnv(env_fns, num_workers=2)


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
    with _runner(jr.make_vec(short_cartpole, NUM_ENVS), num_groups=1) as runner:
        return [runner.sample() for _ in range(2)]  # episodes carry on across samples


@pytest.fixture(scope="module")
def shared_process_vec():
    """One process vec env (2 workers) shared by the runner tests: each runner resets it."""
    with ProcessVectorEnv([short_cartpole] * NUM_ENVS, num_workers=2) as vec:
        yield vec


@pytest.mark.parametrize("num_groups", [1, None])
def test_runner_equal_to_sync_whatever_the_groups(sync_reference, shared_process_vec, num_groups):
    runner = _runner(shared_process_vec, num_groups=num_groups)  # not stopped: vec is shared
    if num_groups is None:  # the backend's default: two groups, one per worker
        assert ProcessVectorEnv.default_num_groups == 2
        assert [g.rows for g in runner._groups] == [slice(0, 4), slice(4, 7)]
    for t, expected in enumerate(sync_reference):
        assert_trees_equal(_as_tree(runner.sample()), _as_tree(expected), f"sample {t}")


@pytest.mark.parametrize(
    "options, num_groups",
    [
        ({"envs_per_worker": 3}, 3),  # groups 0-1, 2-4, 5-6 straddle workers 0-2, 3-5, 6
        ({"envs_per_worker": 1}, 2),
        ({"num_workers": 1}, 3),
    ],
)
def test_runner_equal_to_sync_whatever_the_workers(sync_reference, options, num_groups):
    envs = jr.make_vec(short_cartpole, NUM_ENVS, backend="process", **options)
    assert isinstance(envs, ProcessVectorEnv)
    with _runner(envs, num_groups=num_groups) as runner:
        for t, expected in enumerate(sync_reference):
            assert_trees_equal(_as_tree(runner.sample()), _as_tree(expected), f"sample {t}")
        metrics = runner.get_metrics()
    assert metrics["num_env_steps"] == 2 * 25 * NUM_ENVS and metrics["num_episodes"] > 0


# -- the async split ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_step_batch_async_and_wait(backend):
    """Disjoint rows in flight together; each wait returns its rows' step."""
    fns = counting_env_fns(4, episode_length=2)
    kwargs = {"num_workers": 2} if backend == "process" else {}
    make = ProcessVectorEnv if backend == "process" else jr.SyncVectorEnv
    with closing(make(fns, **kwargs)) as vec, closing(jr.SyncVectorEnv(fns)) as ref:
        vec.reset_batch([SEED + i for i in range(4)])
        ref.reset_batch([SEED + i for i in range(4)])
        halves = slice(0, 2), slice(2, 4)
        for t in range(5):
            actions = np.full(4, t % 3, dtype=np.int64)
            expected = ref.step_batch(actions)
            want = (expected.obs.copy(), expected.next_obs.copy(), expected.reward.copy())
            for rows in halves:
                vec.step_batch_async(actions[rows], rows)
            for rows in reversed(halves):  # waits in any order
                out = vec.step_batch_wait(rows)
                assert_trees_equal(
                    (out.obs, out.next_obs, out.reward), tuple(x[rows] for x in want), f"{t}"
                )
        with pytest.raises(InvalidArgumentError, match=r"no step_batch_async call"):
            vec.step_batch_wait(halves[0])
        vec.step_batch_async(np.zeros(2, np.int64), halves[0])
        if backend == "sync":  # the default keeps one call per rows
            with pytest.raises(InvalidArgumentError, match=r"already in flight"):
                vec.step_batch_async(np.zeros(2, np.int64), halves[0])
        vec.step_batch_wait(halves[0])


def test_same_rows_sent_again_before_the_wait_are_stepped_in_order():
    fns = counting_env_fns(2, episode_length=50)
    with closing(ProcessVectorEnv(fns, num_workers=1)) as vec:
        vec.reset(seed=SEED)
        vec.step_batch_async(np.zeros(2, np.int64))
        # The process backend waits for the first step before it rewrites the actions.
        out = vec.step_batch(np.ones(2, np.int64))
        np.testing.assert_array_equal(out.obs[:, CountingEnv.T], [2, 2])
        np.testing.assert_array_equal(out.reward, [1.0, 1.0])


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
    fns = bad_env_fns(counting_env_fns(3, episode_length=1), 1, fault, call=call, at=at)
    errors = []
    for make in (jr.SyncVectorEnv, functools.partial(ProcessVectorEnv, num_workers=2)):
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
        assert isinstance(cause, InjectedFault)
        # The worker's own traceback, as text, chained under the original exception.
        assert isinstance(cause.__cause__, RemoteTraceback)
        assert "testing.py" in str(cause.__cause__) and "InjectedFault" in str(cause.__cause__)
    else:
        assert isinstance(process_err.__cause__, RemoteTraceback)


def test_failing_factory_names_the_env():
    def make(i: int) -> Callable[[], gymnasium.Env]:
        return functools.partial(CountingEnv, env_id=i) if i != 2 else _broken_factory

    with pytest.raises(EnvError, match=r"factory of sub-env 2 raised in worker 1") as excinfo:
        ProcessVectorEnv([make(i) for i in range(3)], num_workers=2)
    assert excinfo.value.env_index == 2
    assert isinstance(excinfo.value.__cause__, InjectedFault)


def _broken_factory() -> gymnasium.Env:
    raise InjectedFault("factory failed")


def test_different_spaces_across_workers():
    fns = [CountingEnv, CountingEnv, functools.partial(CountingEnv, num_actions=4)]
    with pytest.raises(SpaceMismatchError, match=r"sub-env 2 has action_space=Discrete\(4\)"):
        ProcessVectorEnv(fns, num_workers=3)


def test_lambda_factories_travel_by_value():
    lam = lambda: CountingEnv()  # noqa: E731
    with closing(ProcessVectorEnv([lam, lam], num_workers=1)) as vec:
        obs, _ = vec.reset(seed=SEED)
        assert obs.shape == (2, 5)
    lock = threading.Lock()  # process-bound: no pickler can send it
    bound = lambda: CountingEnv() if lock else None  # noqa: E731
    with pytest.raises(InvalidArgumentTypeError, match=r"factory of sub-env 1 cannot be sent"):
        ProcessVectorEnv([CountingEnv, bound], num_workers=1)


def _exit_in_step() -> gymnasium.Env:
    return _ExitingEnv()


class _ExitingEnv(CountingEnv):
    def step(self, action: Any) -> Any:
        os._exit(3)


def test_dead_worker_is_reported_and_closes_the_vec_env():
    with closing(ProcessVectorEnv([CountingEnv, _exit_in_step], num_workers=2)) as vec:
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
    ],
)
def test_bad_options(options, match):
    with pytest.raises(InvalidArgumentError, match=match):
        jr.make_vec(CountingEnv, 4, backend="process", **options)


def test_worker_bounds():
    assert worker_bounds(7, 3, None) == [(0, 3), (3, 6), (6, 7)]
    assert worker_bounds(7, None, 2) == [(0, 4), (4, 7)]
    assert worker_bounds(4, None, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert len(worker_bounds(64, None, None)) == max(1, len(os.sched_getaffinity(0)) - 1)


# -- the rest of gymnasium's VectorEnv API ------------------------------------------------------


def test_call_get_attr_set_attr_render():
    fns = counting_env_fns(3, max_episode_steps=10, render_mode="ansi")
    with closing(ProcessVectorEnv(fns, num_workers=2)) as vec:
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


def test_spawn_start_method():
    fns = [functools.partial(DictObsEnv, max_steps=3)] * 2
    with (
        closing(ProcessVectorEnv(fns, num_workers=1, start_method="spawn")) as vec,
        closing(jr.SyncVectorEnv(fns)) as ref,
    ):
        assert_trees_equal(vec.reset(seed=SEED), ref.reset(seed=SEED))
        actions = np.full((2, 2), 0.5, np.float32)
        for t in range(4):
            assert_trees_equal(vec.step(actions), ref.step(actions), f"step {t}")


# -- no orphan processes ------------------------------------------------------------------------


@needs_proc
def test_workers_end_on_close_and_on_garbage_collection():
    vec = ProcessVectorEnv([CountingEnv] * 2, num_workers=2)
    pids = vec.worker_pids
    assert len(pids) == 2 and len(_pids_alive(pids)) == 2
    vec.close()
    assert not _wait_gone(pids)
    vec = ProcessVectorEnv([CountingEnv] * 2, num_workers=2)
    pids = vec.worker_pids
    del vec
    gc.collect()
    assert not _wait_gone(pids)


_ORPHAN_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import jaxrunner as jr

    if __name__ == "__main__":
        envs = jr.make_vec("CartPole-v1", 2, backend="process", num_workers=2, seed=0)
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


# -- the CLI ---------------------------------------------------------------------------------


def test_bench_cli_with_the_process_backend(capsys):
    argv = ["bench", "--backend", "process", "--num-envs", "2", "--seconds", "0.05", "--json"]
    # Async: inline dispatch is process-wide, and this process runs other tests.
    assert cli.main([*argv, "--cpu-dispatch", "async"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["backend"] == "process"
    assert report["results"][0]["jaxrunner_steps_per_s"] > 0

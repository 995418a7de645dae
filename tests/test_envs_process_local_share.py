"""Tests for the main process's share of ``backend="process"`` (``MainProcessWorker`` in
:mod:`jaxrunner._src.backends.process.handle`): the first sub-envs step in the main process
as worker 0, the rest in worker processes, and everything stays step for step equal to the
sync backend, for either kind of env."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any, ClassVar

import gymnasium
import jax
import numpy as np
import pytest
from conftest import ActorCritic, short_cartpole

import jaxrunner as jr
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.process import (
    ProcessConfig,
    ProcessVectorEnv,
    main_process_share,
    make_process_vec,
)
from jaxrunner._src.backends.process.protocol import OP_STEP
from jaxrunner.errors import EnvError, InvalidArgumentError, WorkerError
from jaxrunner.testing import (
    CountingEnv,
    FaultPlan,
    InjectedError,
    VectorEnvContract,
    assert_trees_equal,
    faulty_env_fns,
)

SEED = 7
NUM_ENVS = 7


def _share(fns: Sequence[Callable[[], Any]], share: int, restart_policy=None, **options) -> Any:
    """The process backend of ``fns``' kind with the first ``share`` sub-envs here."""
    config = ProcessConfig(main_process_envs=share, **options)
    return make_process_vec(fns, config, restart_policy=restart_policy, multi_agent=None)


class TestLocalShareContract(VectorEnvContract):
    """The backend contract on every kind: sub-env 0 in the main process, 1 and 2 in a
    worker (the contract's halves fall on the split)."""

    env_kinds: ClassVar[tuple[str, ...]] = ("gymnasium", "parallel", "aec")

    def make_vec(self, env_fns: Sequence[Callable[[], Any]], restart_policy=None) -> Any:
        return _share(env_fns, 1, restart_policy)


class TestLocalShareStraddlingContract(VectorEnvContract):
    """The contract with sends that straddle the split: sub-env 0 here, 1-3 in two
    workers (halves 0-1 and 2-3)."""

    num_envs: ClassVar[int] = 4

    def make_vec(self, env_fns: Sequence[Callable[[], gymnasium.Env]], restart_policy=None) -> Any:
        return _share(env_fns, 1, restart_policy, num_workers=2)


# -- equality with the sync backend, through EnvRunner -----------------------------------------


def _runner(envs: jr.VectorEnv, **kwargs: Any) -> jr.EnvRunner:
    policy = jr.Policy.from_linen(
        ActorCritic(int(envs.single_action_space.n)), envs.single_action_space
    )
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    return jr.EnvRunner(envs, policy, params, rollout_length=25, seed=SEED, **kwargs)


def _as_tree(traj: jr.Trajectory) -> dict[str, Any]:
    return {f.name: getattr(traj, f.name) for f in dataclasses.fields(traj)}


@pytest.fixture(scope="module")
def sync_reference() -> list[jr.Trajectory]:
    with _runner(jr.make_vec(short_cartpole, NUM_ENVS), num_splits=1) as runner:
        return [runner.sample() for _ in range(2)]  # episodes carry on across samples


@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_runner_equal_to_sync(sync_reference, num_splits):
    """Default: two groups, the main process's share and the workers'; 1 and 3 groups
    send rows of both parts at once."""
    config = ProcessConfig(main_process_envs=3)
    envs = jr.make_vec(short_cartpole, NUM_ENVS, backend="process", config=config)
    assert isinstance(envs, ProcessVectorEnv) and envs.main_process_envs == 3
    with _runner(envs, num_splits=num_splits) as runner:
        if num_splits is None:
            assert runner.sampler.splits == [slice(0, 3), slice(3, 7)]
        for t, expected in enumerate(sync_reference):
            assert_trees_equal(_as_tree(runner.sample()), _as_tree(expected), f"sample {t}")
        assert runner.get_metrics()["num_env_steps"] == 2 * 25 * NUM_ENVS


def test_the_samplers_pipeline_steps_the_share_while_the_workers_step():
    """With two groups, the main process's rows step at the recv that follows the
    workers' send: the workers' step is in flight while the share steps."""
    events: list[str] = []
    envs = _share([short_cartpole] * 4, 2)
    pool, stepper = envs._transport.pool, envs._transport.stepper
    main = pool.workers[0].worker  # worker 0: the main process's share
    pool_send, main_step = pool.send, main.step

    def send(w: int, op: int, *args: Any, **kwargs: Any) -> int:
        if w and op == OP_STEP:
            events.append("workers start")
        return pool_send(w, op, *args, **kwargs)

    def step(lo: int, hi: int) -> Any:
        in_flight = sum(1 for call in stepper.calls if call.lo >= 2)
        events.append(f"main steps ({in_flight} in the workers)")
        return main_step(lo, hi)

    pool.send, main.step = send, step
    with _runner(envs) as runner:
        runner.sample()
    assert events[:3] == ["workers start", "main steps (1 in the workers)", "workers start"]
    assert events.count("main steps (1 in the workers)") == 25


# -- faults ---------------------------------------------------------------------------------------

OBS_COLUMNS = slice(0, CountingEnv.NOISE)  # a recreated env's noise is unseeded


def _fns(faults_by_env: dict[int, list[FaultPlan]], num_envs: int = 4) -> list:
    fns = []
    for i in range(num_envs):
        base = functools.partial(CountingEnv, env_id=i, episode_length=7)
        fns += faulty_env_fns(base, 1, {0: faults_by_env.get(i, [])}, seed=i)
    return fns


FAULTS = {
    0: [FaultPlan(kind="raise", at=(3,))],
    1: [FaultPlan(kind="raise", call="reset", at=(2,))],
    2: [FaultPlan(kind="nan_reward", at=(2,))],
    3: [FaultPlan(kind="bad_obs", at=(4,))],
}


def test_failed_sub_envs_restart_as_in_the_sync_backend():
    """Sub-envs 0 and 1 (the main process's) and 2 and 3 (a worker's) fail: every
    step equals the sync backend's, failed slots and errors by global index included."""
    policy = jr.RestartPolicy()
    config = ProcessConfig(main_process_envs=2)
    with (
        closing(jr.SyncVectorEnv(_fns(FAULTS), restart_policy=policy)) as ref,
        closing(make_process_vec(_fns(FAULTS), config, restart_policy=policy)) as vec,
    ):
        assert vec.capabilities.can_restart and vec.restart_policy is policy
        assert_trees_equal(vec.reset(seed=1), ref.reset(seed=1), "reset")
        for t in range(12):
            actions = np.full(4, t % 3, np.int64)
            rows = [slice(0, 4)] if t % 2 else [slice(0, 2), slice(2, 4)]  # across, or by part
            want = ref.step_batch(actions)
            got = [vec.step_batch(actions[r], r) for r in rows]
            for part, r in zip(got, rows):
                assert part.env_ids == (None if r == slice(0, 4) else r), t
                for name in ("reward", "terminated", "truncated"):
                    np.testing.assert_array_equal(getattr(part, name), getattr(want, name)[r])
                failed = np.zeros(4, bool) if want.failed is None else want.failed
                np.testing.assert_array_equal(
                    np.zeros(r.stop - r.start, bool) if part.failed is None else part.failed,
                    failed[r],
                )
                np.testing.assert_array_equal(part.obs[:, OBS_COLUMNS], want.obs[r, OBS_COLUMNS])
                assert part.infos == want.infos[r], t
            assert {i: info for p in got for i, info in p.reset_infos.items()} == want.reset_infos
            errors = {i: type(e) for p in got for i, e in (p.errors or {}).items()}
            assert errors == {i: type(e) for i, e in (want.errors or {}).items()}, t
        assert vec.num_restarts == ref.num_restarts >= 4
        main_process_block = vec._transport.pool.workers[0].worker.sub_envs
        assert main_process_block.num_restarts >= 2  # sub-envs 0 and 1 restarted here


def test_runner_with_faults_equals_the_sync_backend():
    policy = jr.RestartPolicy()
    with _runner(jr.SyncVectorEnv(_fns(FAULTS), restart_policy=policy)) as runner:
        expected, expected_metrics = runner.sample(), runner.get_metrics()
    config = ProcessConfig(main_process_envs=2)
    envs = make_process_vec(_fns(FAULTS), config, restart_policy=policy)
    with _runner(envs) as runner:
        traj, metrics = runner.sample(), runner.get_metrics()
    assert metrics["num_dropped_steps"] == expected_metrics["num_dropped_steps"] > 0
    np.testing.assert_array_equal(traj.valid, expected.valid)
    for key in ("num_env_steps", "num_faulty_episodes", "num_episodes"):
        assert metrics[key] == expected_metrics[key], key
    # Up to the first failure, everything; after it the fresh envs' noise (unseeded)
    # steers the policy, so only the counting columns must agree.
    np.testing.assert_array_equal(traj.reward[:2], expected.reward[:2])
    np.testing.assert_array_equal(traj.obs[..., OBS_COLUMNS], expected.obs[..., OBS_COLUMNS])


def test_without_a_policy_a_failure_raises_and_the_env_goes_on_after_a_reset():
    """Sub-env 0 (the main process's) raises while the workers step theirs: the error
    comes out, the workers' result is collected, and a reset starts afresh."""
    fns = _fns({0: [FaultPlan(kind="raise", at=(2,))]})
    with closing(_share(fns, 2)) as vec:
        vec.reset(seed=0)
        vec.step_batch(np.zeros(4, np.int64))
        with pytest.raises(EnvError, match="sub-env 0") as info:
            vec.step_batch(np.zeros(4, np.int64))
        assert isinstance(info.value.__cause__, InjectedError)
        vec.reset(seed=0)
        for _ in range(3):
            out = vec.step_batch(np.ones(4, np.int64))
        assert out.reward.shape == (4,)


def test_a_lost_worker_is_replaced_and_only_its_envs_fail():
    """Sub-env 3 kills its worker (sub-envs 2 and 3) at its 3rd step: both slots fail
    with the worker's error, by global index; the main process's envs go on as in the
    sync backend."""
    fns = _fns({3: [FaultPlan(kind="kill", at=(3,))]})
    policy = jr.RestartPolicy()
    config = ProcessConfig(main_process_envs=2)
    with (
        closing(jr.SyncVectorEnv(_fns({}), restart_policy=policy)) as ref,
        closing(make_process_vec(fns, config, restart_policy=policy)) as vec,
    ):
        vec.reset(seed=3)
        ref.reset(seed=3)
        for t in range(5):
            actions = np.full(4, t % 3, np.int64)
            got, want = vec.step_batch(actions), ref.step_batch(actions)
            np.testing.assert_array_equal(got.obs[:2], want.obs[:2])
            np.testing.assert_array_equal(got.reward[:2], want.reward[:2])
            if t == 2:
                np.testing.assert_array_equal(got.failed, [False, False, True, True])
                assert sorted(got.errors) == [2, 3]
                assert all(isinstance(e, WorkerError) for e in got.errors.values())
            else:
                assert got.failed is None, t
        assert vec.num_worker_restarts == 1 and vec.num_restarts == 0


# -- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, match",
    [
        ({"main_process_envs": -1}, r"main_process_envs=-1\): expected an int >= 0"),
        ({"main_process_envs": 1.5}, r"main_process_envs=1.5\)"),
        ({"main_process_envs": True}, r"main_process_envs=True\)"),
        ({"main_process_envs": 2, "ready_first": True}, r"ready_first=True\): the main process"),
    ],
)
def test_bad_config(options, match):
    with pytest.raises(InvalidArgumentError, match=match):
        ProcessConfig(**options)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"main_process_envs": 4}, r"the workers need at least one sub-env"),
        ({"main_process_envs": 3, "num_workers": 2}, r"only 1 sub-envs are left"),
    ],
)
def test_a_share_that_leaves_the_workers_too_little_is_refused(options, match):
    with pytest.raises(InvalidArgumentError, match=match):
        jr.make_vec(CountingEnv, 4, backend="process", config=ProcessConfig(**options))


@pytest.mark.parametrize("bounds", [(0,), (1, 4), (0, 3, 3), (0, 4, 2)])
def test_pipeline_bounds_must_increase_from_zero(bounds):
    with pytest.raises(InvalidArgumentError, match=r"pipeline_bounds="):
        Capabilities(pipeline_bounds=bounds)


def test_no_share_by_default():
    assert main_process_share(8, ProcessConfig()) == 0
    assert main_process_share(8, ProcessConfig(main_process_envs=3)) == 3
    with closing(jr.make_vec(CountingEnv, 2, backend="process")) as vec:
        assert isinstance(vec, ProcessVectorEnv)


def test_errors_of_the_workers_part_name_the_sub_env_of_this_env():
    """Sub-env 3 (a worker's second) raises: the error names sub-env 3."""
    fns = _fns({3: [FaultPlan(kind="raise", at=(2,))]})
    with closing(_share(fns, 2)) as vec:
        vec.reset(seed=0)
        vec.step_batch(np.zeros(4, np.int64))
        with pytest.raises(EnvError, match=r"sub-env 3 raised in step\(\)") as info:
            vec.step_batch(np.zeros(4, np.int64))
        assert info.value.env_index == 3


def _broken_factory_at_3() -> gymnasium.Env:
    raise InjectedError("no env today")


def test_a_worker_factory_error_names_the_sub_env_of_this_env():
    fns = [CountingEnv, CountingEnv, CountingEnv, _broken_factory_at_3]
    with pytest.raises(EnvError) as info:
        _share(fns, 2)
    assert info.value.env_index == 3


def _broken_factory() -> gymnasium.Env:
    raise InjectedError("no env today")


def test_a_factory_that_raises_in_the_main_process_raises_as_in_a_worker():
    fns = [CountingEnv, _broken_factory, CountingEnv]
    with pytest.raises(EnvError, match=r"factory of sub-env 1 raised in the main process"):
        _share(fns, 2)
    with pytest.raises(EnvError, match=r"factory of sub-env 1 raised in worker") as info:
        ProcessVectorEnv(fns, ProcessConfig(num_workers=1))
    assert "no env today" in str(info.value)


def test_make_vec_builds_the_share_only_where_asked():
    with closing(jr.make_vec(CountingEnv, 4, backend="process", config=_config(0))) as vec:
        assert isinstance(vec, ProcessVectorEnv)
    with closing(jr.make_vec(CountingEnv, 4, backend="process", config=_config(1))) as vec:
        assert isinstance(vec, ProcessVectorEnv) and vec.main_process_envs == 1
        assert vec.num_workers == len(vec.worker_pids) == 1
        assert vec.capabilities.pipeline_bounds == (0, 1, 4)
        assert vec.call("env_id") == vec.get_attr("env_id") == (0, 0, 0, 0)
        vec.set_attr("flag", [0, 1, 2, 3])
        assert vec.get_attr("flag") == (0, 1, 2, 3)


def _config(share: int) -> ProcessConfig:
    return ProcessConfig(main_process_envs=share)

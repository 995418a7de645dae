"""Multi-agent failures reach the caller as jaxrunner's errors: the real sub-env index
and agent, the cause chained, the steps collected so far kept; seeds and params are
the single-agent runner's."""

from __future__ import annotations

import functools
import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

import jaxrunner as jr
from jaxrunner.errors import EnvError, InvalidArgumentError, SpaceMismatchError
from tests import multi_agent_envs as envs_mod
from tests.test_multi_agent import random_policy, zero_params

SEED = 5
NUM_ENVS = 3


def _runner(factory, backend="sync", num_actions=3, rollout_length=6, **kwargs):
    envs = jr.make_multi_agent_vec(factory, NUM_ENVS, backend, **kwargs)
    policy, params = random_policy(num_actions), zero_params(num_actions)
    return jr.MultiAgentRunner(envs, policy, params, rollout_length, seed=SEED)


def _trigger(b: int) -> int:
    """The reset seed sub-env ``b`` of a runner seeded ``SEED`` gets."""
    return jr.env_seeds(SEED, NUM_ENVS)[b]


BACKENDS = [
    pytest.param("sync", {}, id="sync"),
    pytest.param("process", {"num_workers": 2}, id="process"),
]


@pytest.mark.parametrize(("backend", "kwargs"), BACKENDS)
def test_a_sub_env_that_raises_is_named_with_the_cause_chained(backend, kwargs):
    factory = envs_mod.faulty_coming_and_going("raise", _trigger(2), at_step=4)
    with (
        _runner(factory, backend, **kwargs) as runner,
        pytest.raises(EnvError, match="sub-env 2 raised in step") as info,
    ):
        runner.sample()
    err = info.value
    assert err.env_index == 2
    assert isinstance(err.__cause__, ValueError) and str(err.__cause__) == "boom"
    # Steps 0..2 of every env stepped before step 3 (the fourth) failed.
    assert err.partial_trajectory.num_steps == 3


def test_a_turn_based_sub_env_names_the_agent_whose_turn_it_was():
    factory = functools.partial(envs_mod.FaultyRelay, _trigger(1), 3)
    with (
        _runner(factory, num_actions=4) as runner,
        pytest.raises(EnvError, match=r"sub-env 1 \(agent 'r2'\) raised in step") as info,
    ):
        runner.sample()
    assert (info.value.env_index, info.value.agent_id) == (1, "r2")
    assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.parametrize(("backend", "kwargs"), BACKENDS)
def test_an_observation_outside_its_space_names_the_sub_env_and_agent(backend, kwargs):
    factory = envs_mod.faulty_coming_and_going("bad_obs", _trigger(1), at_step=1)
    with (
        _runner(factory, backend, **kwargs) as runner,
        pytest.raises(SpaceMismatchError, match=r"sub-env 1, agent 'a1' returned an obs"),
    ):
        runner.sample()


def test_a_hung_sub_env_times_out_and_the_worker_is_killed():
    factory = envs_mod.faulty_coming_and_going("hang", _trigger(0), at_step=2)
    config = jr.ProcessConfig(num_workers=2, step_timeout_s=2.0)
    with _runner(factory, "process", config=config) as runner:
        started = time.monotonic()
        with pytest.raises(jr.errors.WorkerTimeoutError, match="worker 0") as info:
            runner.sample()
        assert time.monotonic() - started < 30  # not the 600 s the env sleeps
        assert info.value.env_indices == range(0, 2)
        assert info.value.partial_trajectory.num_steps == 1
        with pytest.raises(jr.errors.ClosedError):
            runner.envs.step_batch([np.zeros((NUM_ENVS, 4), np.int64)])


def test_a_worker_that_exits_mid_step_is_a_worker_error():
    factory = envs_mod.faulty_coming_and_going("exit", _trigger(2), at_step=3)
    with (
        _runner(factory, "process", num_workers=2) as runner,
        pytest.raises(jr.errors.WorkerError, match="worker 1") as info,
    ):
        runner.sample()
    assert info.value.env_indices == range(2, 3)
    assert info.value.partial_trajectory.num_steps == 2


def test_a_worker_killed_between_samples_is_a_worker_error_not_a_broken_pipe():
    with _runner(envs_mod.coming_and_going, "process", num_workers=2) as runner:
        runner.sample()
        os.kill(runner.envs.worker_pids[1], signal.SIGKILL)
        with pytest.raises(jr.errors.WorkerError, match="worker 1") as info:
            runner.sample()
    assert not isinstance(info.value, BrokenPipeError)


def test_process_config_options_that_do_not_apply_are_refused():
    with pytest.raises(InvalidArgumentError, match="ready_first"):
        jr.make_multi_agent_vec(
            envs_mod.coming_and_going, 2, "process", config=jr.ProcessConfig(ready_first=True)
        )
    with pytest.raises(jr.errors.InvalidArgumentTypeError, match="ProcessConfig"):
        jr.make_multi_agent_vec(envs_mod.coming_and_going, 2, "process", config=jr.RayConfig())


def test_sub_envs_are_seeded_as_an_env_runner_seeds_them():
    seeds = []

    class Recording(envs_mod.ComingAndGoing):
        def reset(self, seed=None, options=None):
            seeds.append(seed)
            return super().reset(seed, options)

    with _runner(Recording):
        pass
    assert seeds == jr.env_seeds(SEED, NUM_ENVS)


def test_params_and_policy_ids_are_checked():
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    policy, params = random_policy(3), zero_params(3)
    with pytest.raises(InvalidArgumentError, match=r"unknown: \['ghost'\]"):
        jr.MultiAgentRunner(envs, policy, {"policy_0": params, "ghost": params}, 4, seed=0)
    with jr.MultiAgentRunner(envs, policy, {"policy_0": params}, 4, seed=0) as runner:
        with pytest.raises(InvalidArgumentError, match="no such policy"):
            runner.get_params("nobody")
        assert runner.get_params("policy_0")["w"].shape == (3,)


RESTARTS = [
    pytest.param("sync", {}, id="sync"),
    pytest.param("process", {"num_workers": 2}, id="process"),
]


def _sample_with(factory, backend, kwargs, num_actions=3, restart=True):
    envs = jr.make_multi_agent_vec(
        factory,
        NUM_ENVS,
        backend,
        restart_policy=jr.RestartPolicy() if restart else None,
        **kwargs,
    )
    policy, params = random_policy(num_actions), zero_params(num_actions)
    with jr.MultiAgentRunner(envs, policy, params, 12, seed=SEED) as runner:
        return runner.sample(), runner.get_metrics(), envs.get_num_restarts()


@pytest.mark.parametrize(("backend", "kwargs"), RESTARTS)
def test_a_failed_sub_env_is_restarted_and_its_agents_get_no_transition(backend, kwargs):
    good, good_metrics, _ = _sample_with(envs_mod.coming_and_going, "sync", {})
    factory = envs_mod.faulty_coming_and_going("raise", _trigger(1), at_step=4)
    got, metrics, restarts = _sample_with(factory, backend, kwargs)
    assert restarts == 1
    (pid,) = got.groups
    g, ref = got.groups[pid], good.groups[pid]
    # Steps 0..2 are the fault-free run's in every env, and envs 0 and 2 throughout
    # (reset isolation); the failed step (3) holds no transition of env 1.
    for field in ("valid", "reward", "terminated", "truncated", "obs", "action", "next_obs"):
        a, b = getattr(g, field), getattr(ref, field)
        np.testing.assert_array_equal(a[:3], b[:3])
        np.testing.assert_array_equal(a[:, [0, 2]], b[:, [0, 2]])
    assert not g.valid[3, 1].any()
    # Env 1's episode ended there as a fault (the failed step is its last): a new episode
    # follows, whose agents start at step 0.
    assert got.episode_id[4, 1] != got.episode_id[3, 1] == got.episode_id[2, 1]
    assert (g.agent_step[4, 1][g.valid[4, 1]] == 0).all()
    # Exact accounting: good agent steps are the valid slots; the failed call is dropped
    # with the actions of the agents that had acted in it.
    assert metrics["num_agent_steps"] == int(g.valid.sum())
    assert metrics["num_dropped_steps"] == 1 and metrics["num_faulty_episodes"] == 1
    assert metrics["num_dropped_agent_steps"] == int(ref.valid[3, 1].sum()) > 0
    assert metrics["num_env_steps"] == good_metrics["num_env_steps"] - 1


def test_a_failed_turn_based_sub_env_drops_the_turns_waiting_for_their_transition():
    factory = functools.partial(envs_mod.FaultyRelay, _trigger(0), 4)
    got, metrics, restarts = _sample_with(factory, "sync", {}, num_actions=4)
    assert restarts == 1
    (g,) = got.groups.values()
    assert metrics["num_agent_steps"] == int(g.valid.sum())
    # r0, r1 and r2 took turns, then r0's second turn raised: r0's first transition had
    # completed (when its turn came again), r1's and r2's wait for their next turn, and
    # r0's new action was taken in the failed step: three actions no transition carries.
    assert metrics["num_dropped_agent_steps"] == 3
    assert metrics["num_dropped_steps"] == 1


def test_without_a_restart_policy_the_failure_raises():
    factory = envs_mod.faulty_coming_and_going("raise", _trigger(1), at_step=4)
    with pytest.raises(EnvError, match="sub-env 1"):
        _sample_with(factory, "sync", {}, restart=False)


@pytest.mark.parametrize(("backend", "kwargs"), RESTARTS)
def test_vector_env_utilities(backend, kwargs):
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, NUM_ENVS, backend, **kwargs)
    with envs:
        envs.reset_batch([1, 2, 3])
        assert envs.get_attr("episode") == (0, 0, 0)
        envs.set_attr("episode", [5, 6, 7])
        assert envs.call("_obs", "a1")[2][1] == 1.0  # agent a1's index
        assert envs.get_attr("episode") == (5, 6, 7)
        assert envs.reset_at(1, seed=9) == {"a0": {}, "a1": {}}
        assert envs.get_attr("episode") == (5, 7, 7)
        assert envs.render() == (0, 0, 0)
        with pytest.raises(jr.errors.EnvIndexError):
            envs.reset_at(NUM_ENVS)


@pytest.mark.parametrize("kind", ["exit", "hang"])
def test_a_lost_worker_is_replaced_and_its_sub_envs_episodes_end_as_faults(kind):
    good, _, _ = _sample_with(envs_mod.coming_and_going, "sync", {})
    factory = envs_mod.faulty_coming_and_going(kind, _trigger(2), at_step=3)
    config = jr.ProcessConfig(num_workers=2, step_timeout_s=2.0)  # worker 1 has env 2
    envs = jr.make_multi_agent_vec(
        factory, NUM_ENVS, "process", config=config, restart_policy=jr.RestartPolicy()
    )
    with jr.MultiAgentRunner(envs, random_policy(3), zero_params(3), 12, seed=SEED) as runner:
        got, metrics = runner.sample(), runner.get_metrics()
        assert envs.num_worker_restarts == 1
    (g,), (ref,) = got.groups.values(), good.groups.values()
    for field in ("valid", "reward", "obs", "action", "next_obs"):  # the other worker's envs
        np.testing.assert_array_equal(getattr(g, field)[:, :2], getattr(ref, field)[:, :2])
    assert not g.valid[2, 2].any()  # the step the lost worker owed
    np.testing.assert_array_equal(g.valid[:2, 2], ref.valid[:2, 2])
    assert g.valid[3:, 2].any()  # its replacement's new episode goes on
    assert metrics["num_dropped_steps"] == 1 and metrics["num_faulty_episodes"] == 1
    assert metrics["num_agent_steps"] == int(g.valid.sum())
    assert metrics["num_dropped_agent_steps"] == int(ref.valid[2, 2].sum())

"""Multi-agent failures reach the caller as jaxrunner's errors: the real sub-env index
and agent, the cause chained, the steps collected so far kept; seeds and params are
the single-agent runner's."""

from __future__ import annotations

import functools
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
        proc = runner.envs._procs[1]
        proc.kill()
        proc.join()
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

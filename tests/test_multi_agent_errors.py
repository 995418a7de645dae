"""Multi-agent errors and runner arguments beyond the fault suite
(test_multi_agent_faults.py): the agent of a turn-based failure, a worker killed
between samples, typed configs, seeds and params checked as the single-agent runner's."""

from __future__ import annotations

import os
import signal
from typing import ClassVar

import gymnasium
import numpy as np
import pytest

pytest.importorskip("pettingzoo")

import jaxrunner as jr
from jaxrunner._src.backends.sync import SyncMultiAgentVectorEnv
from jaxrunner.errors import (
    EnvError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    SpaceMismatchError,
)
from jaxrunner.testing import ComingAndGoing, FaultPlan, faulty_env_fns
from tests import multi_agent_envs as envs_mod
from tests.test_multi_agent import random_policy, zero_params

SEED = 5
NUM_ENVS = 3


def _runner(envs, num_actions=3, rollout_length=6):
    policy, params = random_policy(num_actions), zero_params(num_actions)
    return jr.EnvRunner(envs, policy, params, rollout_length, seed=SEED)


def test_a_turn_based_sub_env_names_the_agent_whose_turn_it_was():
    # Relay: r0, r1 and r2 take turns; the third step is r2's.
    fault = FaultPlan(kind="raise", at=(3,))
    fns = faulty_env_fns(envs_mod.relay, NUM_ENVS, {1: [fault]})
    with (
        _runner(SyncMultiAgentVectorEnv(fns), num_actions=4) as runner,
        pytest.raises(EnvError, match=r"sub-env 1 \(agent 'r2'\) raised in step") as info,
    ):
        runner.sample()
    assert (info.value.env_index, info.value.agent_id) == (1, "r2")
    assert isinstance(info.value.__cause__, jr.testing.InjectedError)
    assert info.value.partial_trajectory.num_steps == 2
    assert "the 2 steps completed before this error are in" in str(info.value.__notes__)


def test_a_worker_killed_between_samples_is_a_worker_error_not_a_broken_pipe():
    envs = jr.make_multi_agent_vec(
        envs_mod.coming_and_going, NUM_ENVS, "process", config=jr.ProcessConfig(num_workers=2)
    )
    with _runner(envs) as runner:
        runner.sample()
        os.kill(envs.worker_pids[1], signal.SIGKILL)
        with pytest.raises(jr.errors.WorkerError, match="worker 1") as info:
            runner.sample()
    assert info.value.env_indices == range(2, 3)
    assert info.value.partial_trajectory is None  # no step of that sample completed
    assert "no step had completed before this error" in str(info.value.__notes__)


def test_a_process_config_of_another_backend_is_refused():
    with pytest.raises(jr.errors.InvalidArgumentTypeError, match="ProcessConfig"):
        jr.make_multi_agent_vec(envs_mod.coming_and_going, 2, "process", config=jr.RayConfig())


# -- make_multi_agent_vec takes make_vec's arguments, in make_vec's conventions -------------


class RecordingCartPole(gymnasium.Wrapper):
    """CartPole that records the seeds of its resets in ``SEEDS``."""

    SEEDS: ClassVar[list] = []

    def __init__(self) -> None:
        super().__init__(gymnasium.make("CartPole-v1"))

    def reset(self, *, seed=None, options=None):
        RecordingCartPole.SEEDS.append(seed)
        return super().reset(seed=seed, options=options)


@pytest.mark.parametrize("backend", ["sync", "process", "ray"])
def test_seed_resets_sub_env_i_with_seed_plus_i_as_make_vec_does(backend, request):
    if backend == "ray":
        request.getfixturevalue("local_ray").cloudpickle.register_pickle_by_value(envs_mod)
    RecordingCartPole.SEEDS.clear()
    jr.make_vec(RecordingCartPole, 3, seed=7).close()
    assert RecordingCartPole.SEEDS == [7, 8, 9]
    envs = jr.make_vec(envs_mod.coming_and_going, 3, backend, 7)
    with envs:
        states = [rng.bit_generator.state for rng in envs.get_attr("rng")]
        out = envs.step_batch([np.ones((3, 4), np.int64)])
        with pytest.raises(InvalidArgumentError, match=r"reset_batch\(seeds=.*one seed per"):
            envs.reset_batch([1])  # one seed per sub-env, on every backend
    with pytest.raises(jr.errors.ClosedError, match=r"\.reset_batch\(\) called after"):
        envs.reset_batch([1, 2, 3])  # the call a multi-agent env has, named
    for i, state in enumerate(states):  # each sub-env as one reset by hand with seed 7 + i
        by_hand = ComingAndGoing()
        by_hand.reset(seed=7 + i)
        assert state == by_hand.rng.bit_generator.state
        next_obs, *_ = by_hand.step({"a0": 1, "a1": 1})
        np.testing.assert_array_equal(out.groups["policy_0"].next_obs[i, :2], [*next_obs.values()])


def refusals(make, env):
    """What ``make`` refuses, as ``(error type, message)`` per bad call."""
    bad_calls = {
        "num_envs": dict(num_envs=0),
        "backend": dict(backend="nope"),
        "config_on_sync": dict(config=jr.ProcessConfig()),
        "config_type": dict(backend="process", config=jr.RayConfig()),
        "restart_policy": dict(restart_policy="yes"),
    }
    out = {}
    for name, kwargs in bad_calls.items():
        kwargs = {"num_envs": 2, **kwargs}
        with pytest.raises(jr.errors.JaxRunnerError) as info:
            make(env, **kwargs)
        out[name] = type(info.value)
    return out


def test_make_multi_agent_vec_refuses_what_make_vec_refuses():
    got = refusals(jr.make_multi_agent_vec, envs_mod.coming_and_going)
    assert got == refusals(jr.make_vec, "CartPole-v1")
    for backend in ("gymnasium", "envpool"):  # pools of single-agent envs, built from ids
        for make in (jr.make_vec, jr.make_multi_agent_vec):
            with pytest.raises(
                InvalidArgumentTypeError, match="themselves: 'sync', 'process', 'ray', 'auto'"
            ):
                make(envs_mod.coming_and_going, 2, backend)
    for make, env in (
        (jr.make_multi_agent_vec, envs_mod.coming_and_going),
        (jr.make_vec, "CartPole-v1"),
    ):
        with pytest.raises(InvalidArgumentError, match=r"\(seed='7'\): expected an int"):
            make(env, 2, "sync", "7")


class Counted:
    """A factory of ``make`` envs that counts its calls in this process."""

    def __init__(self, make) -> None:
        self.make, self.calls = make, 0

    def __call__(self):
        self.calls += 1
        return self.make()


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_make_vec_builds_the_kind_its_factory_makes(backend):
    parallel, aec = Counted(envs_mod.coming_and_going), Counted(envs_mod.relay)
    with jr.make_vec(parallel, 3, backend) as envs, jr.make_vec([aec] * 2, 2, backend) as turns:
        assert isinstance(envs, jr.MultiAgentVectorEnv) and not envs.turn_based
        assert isinstance(turns, jr.MultiAgentVectorEnv) and turns.turn_based
        assert list(envs.possible_agents) == ComingAndGoing().possible_agents
    # The kind is read from sub-env 0: on sync, built here, where it stays sub-env 0; on
    # process, from its worker's start report, so nothing is built here.
    assert (parallel.calls, aec.calls) == ((3, 2) if backend == "sync" else (0, 0))
    gym = Counted(lambda: gymnasium.make("CartPole-v1"))
    with jr.make_vec(gym, 2, backend) as single:
        assert isinstance(single, jr.VectorEnv) and gym.calls == (2 if backend == "sync" else 0)


def test_make_vec_refuses_what_only_one_kind_takes():
    for backend in ("sync", "process"):  # process: the kind comes from the workers
        with pytest.raises(InvalidArgumentTypeError, match="policy mapping is for multi-agent"):
            jr.make_vec(lambda: gymnasium.make("CartPole-v1"), 2, backend, policy_mapping_fn=str)
    with pytest.raises(InvalidArgumentTypeError, match=r"policy_mapping_fn=.*themselves"):
        jr.make_vec("CartPole-v1", 2, "gymnasium", policy_mapping_fn=str)


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_a_policy_mapping_that_is_no_function_or_fails_is_named(backend):
    with pytest.raises(InvalidArgumentTypeError, match=r"policy_mapping_fn=3: expected a function"):
        jr.make_vec(envs_mod.coming_and_going, 2, backend, policy_mapping_fn=3)
    with pytest.raises(InvalidArgumentError, match=r"policy_mapping_fn\('a0'\) raised KeyError"):
        jr.make_vec(envs_mod.coming_and_going, 2, backend, policy_mapping_fn={}.__getitem__)
    with pytest.raises(InvalidArgumentError, match=r"policy_mapping_fn\('a0'\) returned 3"):
        jr.make_vec(envs_mod.coming_and_going, 2, backend, policy_mapping_fn=lambda agent: 3)
    with pytest.raises(InvalidArgumentTypeError, match="make_vec builds both kinds"):
        jr.make_multi_agent_vec(lambda: gymnasium.make("CartPole-v1"), 2)
    for env in (ComingAndGoing(), gymnasium.make("CartPole-v1")):  # an env, not a factory
        with pytest.raises(InvalidArgumentTypeError, match="pass the zero-argument callable"):
            jr.make_vec(env, 2)


def test_num_workers_is_deprecated_for_process_config():
    with pytest.warns(FutureWarning, match=r"config=jaxrunner\.ProcessConfig\(num_workers=1\)"):
        envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2, "process", num_workers=1)
    with envs:
        assert envs.config.num_workers == 1 and len(envs.worker_pids) == 1
    with pytest.raises(InvalidArgumentError, match="in one place"):
        jr.make_multi_agent_vec(
            envs_mod.coming_and_going, 2, "process", num_workers=1, config=jr.ProcessConfig()
        )
    with pytest.raises(InvalidArgumentError, match="backend='process' only"):
        jr.make_multi_agent_vec(envs_mod.coming_and_going, 2, "sync", num_workers=1)


def test_sub_envs_are_seeded_as_an_env_runner_seeds_them():
    seeds = []

    class Recording(ComingAndGoing):
        def reset(self, seed=None, options=None):
            seeds.append(seed)
            return super().reset(seed, options)

    with _runner(jr.make_multi_agent_vec(Recording, NUM_ENVS)):
        pass
    assert seeds == jr.env_seeds(SEED, NUM_ENVS)


def test_params_and_policy_ids_are_checked():
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    policy, params = random_policy(3), zero_params(3)
    with pytest.raises(InvalidArgumentError, match=r"unknown: \['ghost'\]"):
        jr.EnvRunner(envs, policy, {"policy_0": params, "ghost": params}, 4, seed=0)
    with jr.EnvRunner(envs, policy, {"policy_0": params}, 4, seed=0) as runner:
        with pytest.raises(InvalidArgumentError, match="no such policy"):
            runner.get_params("nobody")
        assert runner.get_params("policy_0")["w"].shape == (3,)


def test_one_argument_check_refuses_what_the_single_agent_runner_refuses():
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)  # one policy id
    policy = random_policy(3)
    with pytest.raises(InvalidArgumentError, match=r"EnvRunner\(params=None\)"):
        jr.EnvRunner(envs, policy, None, 4, seed=0)
    with pytest.raises(InvalidArgumentTypeError, match=r"takes a jaxrunner\.multi_agent\."):
        jr.EnvRunner(envs, policy, zero_params(3), 4, seed=0, callbacks=jr.Callbacks())

    class DeclaresMultiAgent:  # declares the kind, but is no vector env
        multi_agent = True

    with pytest.raises(InvalidArgumentTypeError, match="expected a jaxrunner vector env"):
        jr.EnvRunner(DeclaresMultiAgent(), policy, zero_params(3), 4, seed=0)
    # Refused before the runner took the envs: a runner may still have them.
    with jr.EnvRunner(envs, policy, zero_params(3), 4, seed=0) as runner:
        assert runner.sample().groups["policy_0"].valid.shape[:2] == (4, 2)


@pytest.mark.parametrize("action", ["shape", "dtype"])
def test_a_policy_whose_actions_do_not_fit_is_refused_at_construction(action):
    # As the single-agent runner does (test_runner.py), before any env steps: not at
    # the first sample(), as an env's InvalidActionError that leaves the runner unusable.
    def apply_fn(params, obs, carry, keys):
        n = obs.shape[0]
        if action == "shape":
            return np.zeros((n, 2), np.int32), {}, carry
        return np.zeros(n, np.float32), {}, carry

    envs = jr.make_vec(envs_mod.coming_and_going, NUM_ENVS)
    rows = NUM_ENVS * 4  # agents a0..a3, one group
    with pytest.raises(SpaceMismatchError, match=rf"expected shape \({rows},\)") as info:
        jr.EnvRunner(envs, jr.Policy(apply_fn), {}, rollout_length=4, seed=SEED)
    assert "the policy of 'policy_0'" in "\n".join(info.value.__notes__)
    _runner(envs).stop()  # refused before it owned them: the envs are free

"""The multi-agent process backend gives the sync backend's trajectories, bit for bit."""

from __future__ import annotations

import functools

import gymnasium
import jax
import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from conftest import sample_checked_then_flagged

import jaxrunner as jr
from tests import multi_agent_envs as envs_mod
from tests.ray_helpers import kill_actor
from tests.test_multi_agent import random_policy, zero_params


def _sample(factory, backend, n, masked=False, **kwargs):
    envs = jr.make_multi_agent_vec(factory, 3, backend, **kwargs)
    with jr.EnvRunner(envs, random_policy(n, masked), zero_params(n), 20, seed=7) as r:
        trajs = [r.sample(), r.sample()]
        return trajs, r.get_metrics()


@pytest.mark.parametrize(
    ("factory", "n", "masked"),
    [
        (envs_mod.coming_and_going, 3, False),
        (envs_mod.relay, 4, False),
        (envs_mod.tictactoe, 9, True),
    ],
)
def test_process_equals_sync(factory, n, masked):
    sync, sync_metrics = _sample(factory, "sync", n, masked)
    proc, proc_metrics = _sample(
        factory, "process", n, masked, config=jr.ProcessConfig(num_workers=2)
    )
    jax.tree.map(np.testing.assert_array_equal, sync, proc)
    for key in ("num_env_steps", "num_agent_steps", "unassigned_reward", "episode_return_mean"):
        assert sync_metrics[key] == proc_metrics[key]


@pytest.mark.parametrize(
    ("factory", "multi_agent", "bounds"),
    [
        (envs_mod.coming_and_going, True, [(0, 2), (2, 3)]),
        (functools.partial(gymnasium.make, "CartPole-v1"), False, [(0, 3)]),
    ],
)
def test_default_workers_take_every_cpu(monkeypatch, factory, multi_agent, bounds):
    # Lockstep: the main process waits while the workers step, so none is kept back
    # for it (the single-agent backend, which pipelines, keeps one). make_vec does not
    # know the kind: worker 0 reports it from sub-env 0, then builds the rest of its share.
    from jaxrunner._src.backends.process import launch

    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    monkeypatch.setattr(launch, "cgroup_cpu_quota", lambda: None)
    with jr.make_vec(factory, 3, "process", seed=0) as envs:
        assert envs._transport.pool.bounds == bounds
        assert envs.multi_agent == multi_agent
        assert len(envs.get_attr("metadata")) == 3  # every sub-env built, once
    assert launch.default_num_workers(3) == 1


def test_worker_error_reaches_the_caller_with_its_traceback():
    envs = jr.make_multi_agent_vec(
        envs_mod.coming_and_going, 2, "process", config=jr.ProcessConfig(num_workers=1)
    )
    with pytest.raises(jr.errors.InvalidActionError, match="policy_0"):
        envs.step_batch([np.zeros((2, 3), np.int64)])  # checked before any worker steps
    # Stepping before reset fails in the worker: its error names the sub-env and comes
    # with the worker's traceback, the env's own exception chained.
    with pytest.raises(jr.errors.EnvError, match="no attribute 'agents'") as info:
        envs.step_batch([np.zeros((2, 4), np.int64)])
    assert info.value.env_index == 0
    assert isinstance(info.value.__cause__, AttributeError)
    assert "Traceback" in str(info.value.__cause__.__cause__)  # the worker's, as text
    # As on the single-agent process backend, the workers live on: a reset recovers.
    envs.reset_batch([0, 1])
    assert envs.step_batch([np.zeros((2, 4), np.int64)]).env_reward.shape == (2,)
    envs.close()
    with pytest.raises(jr.errors.ClosedError):
        envs.step_batch([np.zeros((2, 4), np.int64)])


def test_ray_equals_sync_and_replaces_a_dead_actor(local_ray):
    ray = local_ray
    ray.cloudpickle.register_pickle_by_value(envs_mod)
    sync, sync_metrics = _sample(envs_mod.relay, "sync", 4)
    config = jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1)
    got, got_metrics = _sample(envs_mod.relay, "ray", 4, config=config)
    jax.tree.map(np.testing.assert_array_equal, sync, got)
    assert sync_metrics["num_agent_steps"] == got_metrics["num_agent_steps"]

    # An actor killed between samples is replaced: its sub-env's step under way
    # fails (no transition, its episode ends as a fault); the other actor's go on.
    envs = jr.make_multi_agent_vec(
        envs_mod.coming_and_going, 3, "ray", config=config, restart_policy=jr.RestartPolicy()
    )
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 6, seed=7) as runner:
        first = runner.sample()
        dead = envs.actors[1]  # sub-env 2
        kill_actor(dead)
        traj = runner.sample()
        metrics = runner.get_metrics()
        assert envs.num_actor_restarts == 1
    (group,) = traj.groups.values()
    assert not group.valid[0, 2].any() and group.valid[0, :2].any()
    assert group.valid[1:, 2].any()  # the new actor's episode goes on
    assert metrics["num_dropped_steps"] == 1 and metrics["num_faulty_episodes"] == 1
    valid = sum(int(t.groups["policy_0"].valid.sum()) for t in (first, traj))
    assert metrics["num_agent_steps"] == valid


@pytest.mark.parametrize(
    ("backend", "kind", "failing", "lost", "unrun"),
    [
        ("process", "pettingzoo", 0, 0, 1),
        ("process", "pettingzoo", 1, 1, 0),
        ("ray", "pettingzoo", 0, 0, 1),
        ("ray", "gymnasium", 1, 1, 0),
    ],
)
def test_a_dead_workers_slots_are_counted_lost_or_unrun(
    backend, kind, failing, lost, unrun, tmp_path, request
):
    # A worker (process) or actor (Ray) runs sub-envs 0 and 1, in that order; the
    # failing one kills it at its 4th step. Sub-env 0's kill leaves 1's step unrun; 1's
    # loses 0's completed step. All through the public API: make_vec's env and its
    # counters.
    from jaxrunner.testing import CallLog, CountingEnv, FaultPlan, faulty_env_fns

    log = CallLog(tmp_path)
    plan = {failing: [FaultPlan(kind="kill", at=(4,))]}
    base = envs_mod.coming_and_going if kind == "pettingzoo" else CountingEnv
    fns = faulty_env_fns(base, 3, plan, log)
    if backend == "ray":
        request.getfixturevalue("local_ray").cloudpickle.register_pickle_by_value(envs_mod)
        config = jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1)
    else:
        config = jr.ProcessConfig(num_workers=2)
    envs = jr.make_vec(fns, 3, backend, config=config, restart_policy=jr.RestartPolicy())
    n = 3 if kind == "pettingzoo" else 2
    # One send per step, so that both sub-envs' steps are one call of their actor.
    with jr.EnvRunner(envs, random_policy(n), zero_params(n), 6, seed=7, num_splits=1) as runner:
        runner.sample()
        metrics = runner.get_metrics()
        restarts = envs.num_worker_restarts if backend == "process" else envs.num_actor_restarts
        counts = (restarts, envs.num_lost_steps, envs.num_unrun_steps)
    assert counts == (1, lost, unrun)
    # Every env.step call accounted for, as on the single-agent process backend.
    assert log.count("step_ok") == metrics["num_env_steps"] + lost
    assert log.count("step_failed") == metrics["num_dropped_steps"] - lost - unrun == 1


def test_process_get_num_restarts_after_close_is_a_closed_error():
    from jaxrunner._src.backends.process.vector_env import ProcessMultiAgentVectorEnv

    envs = ProcessMultiAgentVectorEnv(
        [jr.testing.coming_and_going] * 2, config=jr.ProcessConfig(num_workers=1)
    )
    assert envs.get_num_restarts() == 0
    envs.close()
    with pytest.raises(jr.errors.ClosedError):
        envs.get_num_restarts()


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_the_runners_checked_actions_skip_the_backends_check(monkeypatch, backend):
    """Every group's actions the runner's policy step checked are only cast to the
    spaces' dtypes (``send_checked``, the backend's check skipped); a batch the step
    flags goes through the check, which names the group, the sub-env and the agent."""
    from jaxrunner._src.backends.multi_agent.action_check import ActionCheck

    calls = []
    real = ActionCheck.__call__

    def counted(self, actions):
        calls.append(self.num_envs)
        return real(self, actions)

    monkeypatch.setattr(ActionCheck, "__call__", counted)
    envs = jr.make_vec(envs_mod.simple_spread, 2, backend, seed=0)
    # (simple_spread's actions: Discrete(5))
    match = r"sub-env 0 agent .*'s action 5"
    traj = sample_checked_then_flagged(envs, calls, 4, 5, match, rollout_length=3)
    assert (traj.groups[envs.policy_ids[0]].action == 4).all() and calls == [2]

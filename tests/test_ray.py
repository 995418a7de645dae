"""Ray: backend="ray" (dynamic batching, actor replacement) and EnvRunnerGroup (issue 7).

One local Ray instance (2 CPUs) serves every test here; it is shut down at the end.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from contextlib import closing
from typing import Any

import gymnasium
import jax
import numpy as np
import pytest
from conftest import count_action_batch_checks, sample_checked_then_flagged

import jaxrunner as jr
from jaxrunner._src.services.distributed import group as group_module
from jaxrunner._src.services.distributed.worker import RunnerWorker
from jaxrunner.models import mlp_policy
from jaxrunner.testing import CountingEnv
from tests.multi_agent_envs import HOST_KINDS
from tests.ray_helpers import kill_actor, loads_jax

ray = pytest.importorskip("ray")

POLICY = functools.partial(mlp_policy, hidden=(16,))


class SlowEnv(gymnasium.Wrapper):
    """Sleeps ``delay_s`` in each step, so actors (and runners) finish at different times."""

    def __init__(self, env: gymnasium.Env, delay_s: float) -> None:
        super().__init__(env)
        self.delay_s = delay_s

    def step(self, action: Any) -> Any:
        time.sleep(self.delay_s)
        return self.env.step(action)


def slow_counting(env_id: int, delay_s: float, episode_length: int = 3) -> gymnasium.Env:
    return SlowEnv(CountingEnv(env_id=env_id, episode_length=episode_length + env_id), delay_s)


def slow_cartpole(delay_s: float) -> gymnasium.Env:
    return SlowEnv(gymnasium.make("CartPole-v1", max_episode_steps=20), delay_s)


@pytest.fixture(scope="module", autouse=True)
def module_envs_by_value(local_ray):
    # This module's envs travel to the actors by value (workers cannot import tests/).
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def runner_on(envs: jr.VectorEnv, rollout_length: int, **kwargs: Any) -> jr.EnvRunner:
    policy = POLICY(envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    return jr.EnvRunner(envs, policy, params, rollout_length, 0, **kwargs)


def assert_same_trajectory(actual: jr.Trajectory, expected: jr.Trajectory) -> None:
    for name in expected.__dataclass_fields__:
        jr.testing.assert_trees_equal(getattr(actual, name), getattr(expected, name), name)


# -- backend="ray" ---------------------------------------------------------------------------


def test_ray_backend_equals_sync_for_the_same_seed_although_batching_differs():
    # Actor u's envs step in 0, 4 or 8 ms: they run at different paces, so the policy
    # sees ever-changing subsets of envs.
    fns = [functools.partial(slow_counting, i, 0.004 * (i // 2)) for i in range(6)]
    T = 10
    ray_envs = jr.RayVectorEnv(fns, jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1))
    ref = jr.SyncVectorEnv(fns)
    # The lock-step contract path first: step for step equal to the sync backend.
    jr.testing.assert_trees_equal(ray_envs.reset(seed=5), ref.reset(seed=5), "reset")
    for t in range(8):
        actions = np.arange(6) % 3
        jr.testing.assert_trees_equal(ray_envs.step(actions), ref.step(actions), f"step {t}")
    rows = slice(1, 4)  # across actors
    got, want = ray_envs.step_batch(actions[rows], rows), ref.step_batch(actions[rows], rows)
    np.testing.assert_array_equal(got.next_obs, want.next_obs)
    with pytest.raises(jr.errors.InvalidArgumentError, match="callbacks"):
        runner_on(ray_envs, T, callbacks=jr.Callbacks())
    runner_on(ref, T, callbacks=jr.Callbacks())  # the same construction-time reset
    with runner_on(ref, T) as sync:
        expected = [sync.sample(), sync.sample()]
        sync_metrics = sync.get_metrics()
    with pytest.raises(jr.errors.InvalidActionError):
        ray_envs.step(np.zeros(2, np.int64))
    with runner_on(ray_envs, T) as runner:
        got = [runner.sample(), runner.sample()]
        metrics = runner.get_metrics()
        batcher = runner.sampler.ready_first
    for actual, exp in zip(got, expected):
        assert_same_trajectory(actual, exp)
    for key in ("num_env_steps", "num_episodes", "episode_return_mean", "episode_length_mean"):
        assert metrics[key] == sync_metrics[key], key
    # The batching really differed from the sync loop's one call of 6 envs per step...
    assert sum(n for size, n in batcher.ready_counts.items() if size < 6) > 0
    # ...and only the precompiled buckets ran: XLA never compiled anything else (whole
    # 4-row policy chunks, then all 6 envs).
    assert set(batcher.bucket_counts) <= set(batcher.buckets) == {4, 6}
    with pytest.raises(jr.errors.ClosedError):
        ray_envs.step(actions)
    with pytest.raises(jr.errors.ClosedError):  # (Ray's ActorDiedError: it asked the actors)
        _ = ray_envs.num_restarts


def test_ray_config_is_checked_before_any_actor_starts():
    with pytest.raises(jr.errors.InvalidArgumentError, match=r"RayConfig\(envs_per_actor=0\)"):
        jr.RayConfig(envs_per_actor=0)
    with pytest.raises(jr.errors.InvalidArgumentError, match="batch_buckets"):
        jr.RayConfig(batch_buckets=[4])  # type: ignore[arg-type]
    with pytest.raises(jr.errors.InvalidArgumentError, match="step_timeout_s"):
        jr.RayConfig(step_timeout_s=0)
    with pytest.raises(TypeError, match=r"expected a jaxrunner.RayConfig, got dict"):
        jr.RayVectorEnv([CountingEnv], {"envs_per_actor": 1})  # type: ignore[arg-type]
    with pytest.raises(
        jr.errors.InvalidArgumentError, match=r"RayConfig\(batch_buckets=\(16,\)\).*num_envs=5"
    ):
        jr.RayVectorEnv([CountingEnv] * 5, jr.RayConfig(batch_buckets=(16,)))


def test_the_multi_agent_ray_env_checks_its_arguments_as_the_single_agent_one():
    """Built directly (not through make_vec), each kind names itself in the same errors."""
    from jaxrunner._src.backends.ray.vector_env import RayMultiAgentVectorEnv

    for cls in (jr.RayVectorEnv, RayMultiAgentVectorEnv):
        name = cls.__name__
        with pytest.raises(jr.errors.InvalidArgumentError, match=rf"{name} needs at least one"):
            cls([])
        with pytest.raises(TypeError, match=rf"{name}\(config=...\): expected a jaxrunner.Ray"):
            cls([CountingEnv], config={"envs_per_actor": 1})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=rf"{name}\(restart_policy=True\)"):
            cls([CountingEnv], restart_policy=True)  # type: ignore[arg-type]


def test_send_recv_answers_the_first_actor_ready_and_replaces_a_dead_one():
    """Actor 0's envs are slow, actor 1's fast: recv returns actor 1 first (its slice in
    env_ids), each actor's steps equal the sync backend's, and a killed actor's step
    comes back failed from its replacement's first observations."""
    fns = [functools.partial(slow_counting, i, 0.3 if i < 2 else 0.0, 50) for i in range(4)]
    config = jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1)
    envs = jr.RayVectorEnv(fns, config, restart_policy=jr.RestartPolicy())
    ref = jr.SyncVectorEnv(fns)
    assert envs.capabilities.ready_first and envs.capabilities.can_restart
    jr.testing.assert_trees_equal(envs.reset(seed=3), ref.reset(seed=3), "reset")
    with pytest.raises(jr.errors.InvalidArgumentError, match="no send"):
        envs.recv()
    with pytest.raises(jr.errors.InvalidArgumentError, match="whole actors"):
        envs.send(np.zeros(1, np.int64), slice(1, 2))
    actions = np.array([1, 2, 0, 1])
    want = ref.step_batch(actions)  # before the send: recv must find actor 0 still busy
    want = (want.obs.copy(), want.reward.copy())
    envs.send(actions)
    with pytest.raises(jr.errors.InvalidArgumentError, match="still in flight"):
        envs.send(actions[2:], slice(2, 4))
    for rows in (slice(2, 4), slice(0, 2)):  # the fast actor first
        out = envs.recv()
        assert out.env_ids == rows and out.failed is None
        jr.testing.assert_trees_equal((out.obs, out.reward), (want[0][rows], want[1][rows]))
    victim = envs.actors[0]
    ray.kill(victim)  # dead before (or during) its 0.3 s step
    envs.send(actions[:2], slice(0, 2))
    out = envs.recv()
    assert out.env_ids == slice(0, 2) and out.failed.all()
    assert isinstance(out.errors[0], jr.errors.WorkerError)
    np.testing.assert_array_equal(out.reward, [0.0, 0.0])
    np.testing.assert_array_equal(out.next_obs[:, CountingEnv.T], [0, 0])  # new envs
    np.testing.assert_array_equal(out.obs, out.next_obs)
    assert envs.num_actor_restarts == 1 and envs.actors[0] is not victim
    out = envs.step_batch(actions)  # every actor again, in lockstep
    assert out.env_ids is None
    np.testing.assert_array_equal(out.next_obs[:, CountingEnv.T], [1, 1, 2, 2])
    # Actors that are both ready come back together, as one batch in actor order.
    envs.send(actions[2:], slice(2, 4))
    envs.send(actions[:2], np.arange(2))
    time.sleep(1.0)
    out = envs.recv()
    np.testing.assert_array_equal(out.env_ids, np.arange(4))
    np.testing.assert_array_equal(out.next_obs[:, CountingEnv.T], [2, 2, 3, 3])
    envs.close()
    ref.close()


def test_ready_first_false_gives_a_lockstep_ray_env_equal_to_sync():
    """``RayConfig(ready_first=False)`` means on gymnasium envs what it means on
    PettingZoo ones: ``recv`` answers the sends in order, a send may split actors, and
    the runner pipelines splits; trajectories equal the sync backend's."""
    fns = [functools.partial(slow_counting, i, 0.02 if i < 2 else 0.0, 4) for i in range(6)]
    config = jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1, ready_first=False)
    envs = jr.RayVectorEnv(fns, config)
    ref = jr.SyncVectorEnv(fns)
    assert not envs.capabilities.ready_first and envs.capabilities.steps_in_background
    with pytest.raises(jr.errors.InvalidArgumentError, match=r"reset_batch\(seeds=.*one seed per"):
        envs.reset_batch([1, 2])
    jr.testing.assert_trees_equal(envs.reset(seed=1), ref.reset(seed=1), "reset")
    actions = np.arange(6) % 3
    want = [ref.step_batch(actions[:3], slice(0, 3)), ref.step_batch(actions[3:], slice(3, 6))]
    want = [(w.env_ids, w.obs.copy(), w.reward.copy()) for w in want]
    envs.send(actions[:3], slice(0, 3))  # splits actor 1, whose part answers first
    envs.send(actions[3:], slice(3, 6))
    with pytest.raises(jr.errors.InvalidArgumentError, match="slice"):
        envs.send(actions[:2], np.arange(2))
    for expected in want:  # in send order: the slow actor 0's block first
        out = envs.recv()
        jr.testing.assert_trees_equal((out.env_ids, out.obs, out.reward), expected, "recv")
    with runner_on(ref, 12, num_splits=2) as sync:
        expected = sync.sample()
    with runner_on(envs, 12, num_splits=2) as runner:
        assert_same_trajectory(runner.sample(), expected)
    ref.close()


def test_env_actor_killed_mid_sample_is_replaced_and_nothing_good_is_lost():
    factory = functools.partial(slow_counting, 0, 0.005)
    T, killed = 20, 1  # actor 1 runs envs 2 and 3
    with runner_on(jr.make_vec(factory, 4), T) as sync:
        clean = sync.sample()
    config = jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1)
    envs = jr.make_vec(factory, 4, "ray", config=config, restart_policy=jr.RestartPolicy())
    with runner_on(envs, T) as runner:
        victim, recvs, real_recv = envs.actors[killed], [], envs.recv

        def recv() -> Any:  # kill the actor after a few steps: mid-sample
            recvs.append(1)
            if len(recvs) == 12:
                ray.kill(victim)
            return real_recv()

        envs.recv = recv
        traj = runner.sample()
        metrics = runner.get_metrics()
        assert envs.num_actor_restarts == 1 and envs.actors[killed] is not victim
        after = runner.sample()  # the replacement keeps sampling
    bad = [2, 3]
    # Exactly one failed slot per env of the killed actor, at the same step.
    assert traj.valid[:, [0, 1]].all()
    (t_fail,) = np.flatnonzero(~traj.valid[:, 2])
    assert 0 < t_fail < T - 1
    np.testing.assert_array_equal(np.flatnonzero(~traj.valid[:, 3]), [t_fail])
    # The other actor's envs are untouched; the killed envs' steps before it are kept.
    for name in ("obs", "action", "reward", "terminated", "next_obs", "step"):
        np.testing.assert_array_equal(getattr(traj, name)[:, :2], getattr(clean, name)[:, :2])
        np.testing.assert_array_equal(
            getattr(traj, name)[:t_fail, bad], getattr(clean, name)[:t_fail, bad], err_msg=name
        )
    # Episode ids are numbered in (step, env) order, so the cut episodes shift later ids
    # of other envs; the episodes themselves (where ids change) are the same.
    np.testing.assert_array_equal(traj.episode_id[: t_fail + 1], clean.episode_id[: t_fail + 1])
    np.testing.assert_array_equal(
        np.diff(traj.episode_id[:, :2], axis=0) != 0, np.diff(clean.episode_id[:, :2], axis=0) != 0
    )
    assert (traj.episode_id[t_fail + 1, bad] != traj.episode_id[t_fail, bad]).all()
    # The failed slot holds the new (unseeded) envs' first observation; new episodes follow.
    fresh = traj.next_obs[t_fail, bad]
    np.testing.assert_array_equal(fresh[:, CountingEnv.SEED], [-1, -1])
    np.testing.assert_array_equal(fresh[:, CountingEnv.T], [0, 0])
    np.testing.assert_array_equal(traj.obs[t_fail + 1, bad], fresh)
    assert (traj.step[t_fail + 1, bad] == 0).all()
    cut = [e for e in traj.split_episodes() if e.faulty]
    assert sorted(e.env_id for e in cut) == bad and all(e.truncated for e in cut)
    assert metrics["num_faulty_episodes"] == 2 and metrics["num_dropped_steps"] == 2
    assert metrics["num_env_steps"] == int(traj.valid.sum()) == 4 * T - 2
    assert after.valid.all()


@pytest.mark.parametrize("kind", ["gymnasium", "pettingzoo"])
def test_a_replaced_actors_env_that_was_not_stepping_fails_at_its_next_step(kind, tmp_path):
    """Lockstep in splits of one env: env 1 hangs in the last step of a sample and its
    actor is replaced; env 0, done with that sample, fails at its next step (unstepped,
    its episode cut), exactly as on the process backend with one worker of both."""
    pytest.importorskip("pettingzoo")  # the env, and the policy of tests/test_multi_agent.py
    from tests.test_multi_agent import random_policy, zero_params

    T = 4
    base = jr.testing.coming_and_going
    if kind == "gymnasium":
        base = functools.partial(CountingEnv, episode_length=3)
    hang = jr.testing.FaultPlan(kind="hang", at=(T,), hang_s=60.0)  # a new env 1 hangs too
    configs = {
        "process": jr.ProcessConfig(num_workers=1, step_timeout_s=1.5),
        "ray": jr.RayConfig(
            envs_per_actor=2, num_cpus_per_actor=0.1, ready_first=False, step_timeout_s=1.5
        ),
    }
    got, counts = {}, {}
    for backend, config in configs.items():
        log = jr.testing.CallLog(tmp_path / backend)
        fns = jr.testing.faulty_env_fns(base, 2, {1: [hang]}, log)
        envs = jr.make_vec(fns, 2, backend, config=config, restart_policy=jr.RestartPolicy())
        # Actions from the key alone: the unseeded new sub-envs' observations differ.
        policy, params = random_policy(3), zero_params(3)
        with jr.EnvRunner(envs, policy, params, T, seed=0, num_splits=2) as runner:
            trajs = [runner.sample(), runner.sample()]
            got[backend] = trajs, runner.get_metrics(), log.count("step_ok")
            if backend == "ray":  # stepped, failed, replaced, reset: still no JAX
                assert not any(loads_jax(actor) for actor in envs.actors)
        counts[backend] = (envs.num_lost_steps, envs.num_unrun_steps)
    (traj, ref), (metrics, ref_metrics) = zip(*(got[b][:2] for b in ("ray", "process")))
    valid = np.ones((2 * T, 2), bool)
    valid[[T - 1, 2 * T - 1], 1] = valid[T, 0] = False  # env 0 after env 1's first hang
    np.testing.assert_array_equal(np.concatenate([t.valid for t in traj]), valid)
    fields = ("valid", "episode_id", "step", "action", "reward", "terminated", "truncated")
    for mine, theirs in zip(traj, ref):
        if kind == "pettingzoo":  # deterministic envs: every field
            jr.testing.assert_trees_equal(mine, theirs, "trajectory")
        for name in fields if kind == "gymnasium" else ():
            np.testing.assert_array_equal(getattr(mine, name), getattr(theirs, name), name)
    keys = ("num_env_steps", "num_dropped_steps", "num_faulty_episodes")
    assert {k: metrics[k] for k in keys} == {k: ref_metrics[k] for k in keys}
    # Each hang's step is dropped, and env 0's unstepped one (num_unrun_steps).
    assert counts == {"process": (0, 1), "ray": (0, 1)} and metrics["num_dropped_steps"] == 3
    assert got["ray"][2] == got["process"][2] == metrics["num_env_steps"] == 4 * T - 3


# -- EnvRunnerGroup ----------------------------------------------------------------------------

N_ENVS, T_GROUP = 2, 16


@pytest.fixture(scope="module")
def group_params():
    envs = jr.make_vec("CartPole-v1", 1)
    policy = POLICY(envs.single_action_space)
    first = policy.init(jax.random.key(0), envs.single_observation_space)
    second = policy.init(jax.random.key(7), envs.single_observation_space)
    envs.close()
    return first, second


@pytest.fixture(scope="module")
def group(group_params):
    config = jr.EnvRunnerGroupConfig(
        num_runners=2,
        num_envs_per_runner=N_ENVS,
        rollout_length=T_GROUP,
        seed=3,
        num_cpus_per_runner=0.5,
        sample_timeout_s=60.0,
    )
    env = functools.partial(slow_cartpole, 0.01)
    with jr.EnvRunnerGroup(env, POLICY, group_params[0], config) as group:
        yield group


def _runner_metrics(group: jr.EnvRunnerGroup) -> list[tuple[int, dict[str, Any]]]:
    metrics = group.get_metrics()
    assert metrics["num_runner_restarts"] == 0  # else the local twins below start elsewhere
    return sorted(metrics["runners"].items())


def local_runner(group: jr.EnvRunnerGroup, index: int, incarnation: int, params: Any):
    """The runner that runner ``index`` of ``group`` is, built here."""
    config = group.config
    envs = jr.make_vec(functools.partial(slow_cartpole, 0.0), config.num_envs_per_runner)
    policy = POLICY(envs.single_action_space)
    return jr.EnvRunner(
        envs, policy, params, config.rollout_length, config.runner_seed(index, incarnation)
    )


@pytest.mark.parametrize("kind", ["gymnasium", "pettingzoo"])
def test_group_metrics_sum_every_counter_its_runners_report(kind):
    """EnvRunnerGroup.get_metrics's sums, from two local runners' get_metrics() (multi-agent:
    agent steps, dropped agent steps and unassigned reward, as the env steps are)."""
    from jaxrunner._src.services.distributed.group_metrics import aggregate_metrics

    runs = {}
    for index in range(2):
        if kind == "gymnasium":
            envs = jr.make_vec("CartPole-v1", 2)
            policy = POLICY(envs.single_action_space)
            params = policy.init(jax.random.key(0), envs.single_observation_space)
        else:
            pytest.importorskip("pettingzoo")
            from tests.test_multi_agent import random_policy, zero_params

            envs = jr.make_vec(jr.testing.relay, 2)  # turn-based: rewards before a first turn
            policy, params = random_policy(4), zero_params(4)
        with jr.EnvRunner(envs, policy, params, 8, seed=index) as runner:
            runner.sample()
            runs[index] = runner.get_metrics()
    group = aggregate_metrics(runs)
    counters = [key for key in runs[0] if key.startswith("num_") or key == "unassigned_reward"]
    assert len(counters) == (4 if kind == "gymnasium" else 7)
    for key in counters:
        assert group[key] == pytest.approx(sum(m[key] for m in runs.values())), key
    for part in ("policies", "agents"):  # multi-agent: per policy and agent, by one rule
        assert (part in group) == (kind == "pettingzoo")
        for name, entry in group.get(part, {}).items():
            each = [m[part][name] for m in runs.values()]
            for key in ("num_agent_steps", "num_episodes"):
                assert entry[key] == sum(e[key] for e in each), (part, name, key)
            means = [e["episode_length_mean"] for e in each]
            assert entry["episode_length_mean"] == pytest.approx(np.nanmean(means), nan_ok=True)


def test_group_of_two_runners_samples_in_parallel(group, group_params):
    traj = group.sample()
    assert traj.obs.shape == (T_GROUP, 2 * N_ENVS, 4)
    np.testing.assert_array_equal(traj.env_id[0], np.arange(2 * N_ENVS))
    per_runner = group.sample(concat=False)
    assert [t.num_envs for t in per_runner] == [N_ENVS, N_ENVS]
    # Episode ids are unique across runners.
    ids0, ids1 = (set(np.unique(t.episode_id).tolist()) for t in per_runner)
    assert not ids0 & ids1
    # Runner 1 is exactly a local EnvRunner with its seed (env ids shifted).
    with local_runner(group, 1, 0, group_params[0]) as local:
        expected = [local.sample(), local.sample()]
    actual = [traj.time_slice(0, T_GROUP), per_runner[1]]
    for got, exp in zip(actual, expected):
        got = jax.tree.map(lambda x: x[:, -N_ENVS:], got)
        np.testing.assert_array_equal(got.action, exp.action)
        np.testing.assert_array_equal(got.obs, exp.obs)
        np.testing.assert_array_equal(got.env_id, exp.env_id + N_ENVS)
        np.testing.assert_array_equal(got.episode_id, exp.episode_id + (1 << 40))
    metrics = group.get_metrics()
    assert metrics["num_env_steps"] == metrics["num_env_steps_sampled"] == 2 * 2 * N_ENVS * T_GROUP
    assert metrics["num_healthy_runners"] == 2 and len(metrics["runners"]) == 2


def test_weight_broadcast_reaches_every_runner(group, group_params, monkeypatch):
    # The samples each runner took before (other tests of this module share the group,
    # and pytest-xdist may run any of them elsewhere): read, not assumed.
    before = {i: m["num_env_steps"] // (N_ENVS * T_GROUP) for i, m in _runner_metrics(group)}
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value: puts.append(1) or real_put(value))
    group.set_params(group_params[1])
    monkeypatch.undo()
    assert len(puts) == 1  # once through the object store, whatever the number of runners
    traj = group.sample(concat=False)
    assert group.get_metrics()["runner_params_versions"] == {0: 1, 1: 1}
    # Each runner now acts exactly as a local runner that got the same params at the
    # same point (after its earlier samples), and unlike one that kept the old ones.
    for index in (0, 1):
        with (
            local_runner(group, index, 0, group_params[0]) as new,
            local_runner(group, index, 0, group_params[0]) as old,
        ):
            for _ in range(before[index]):
                new.sample(), old.sample()
            new.set_params(group_params[1])
            expected, stale = new.sample(), old.sample()
        np.testing.assert_array_equal(traj[index].action, expected.action)
        np.testing.assert_array_equal(traj[index].extras["log_prob"], expected.extras["log_prob"])
        assert not np.array_equal(traj[index].extras["log_prob"], stale.extras["log_prob"])


def test_runner_killed_mid_sample_is_restored_and_resynced(group, group_params):
    # The params this test expects the new incarnation to get, set here: under xdist the
    # module's earlier tests may run in another worker, with another group.
    group.set_params(group_params[1])
    version = group.get_metrics()["runner_params_versions"][0]
    assert version >= 1
    victim = group.runner_actors[1]
    # A sample takes >= 16 steps x 10 ms: the kill lands mid-sample.
    threading.Timer(0.08, ray.kill, args=(victim,)).start()
    traj = group.sample()
    # The healthy runner's envs came back; the dead one's did not.
    np.testing.assert_array_equal(traj.env_id[0], np.arange(N_ENVS))
    assert group.num_restarts == 1 and group.runner_actors[1] is not victim
    group.wait_until_healthy(120.0)
    traj = group.sample()
    np.testing.assert_array_equal(traj.env_id[0], np.arange(2 * N_ENVS))
    metrics = group.get_metrics()
    assert metrics["runner_params_versions"] == {0: version, 1: version}  # resynced
    assert metrics["num_runner_restarts"] == 1 and "runner_failures" in metrics
    # The new incarnation runs the latest params with its own, fresh seed.
    with local_runner(group, 1, 1, group_params[1]) as local:
        expected = local.sample()
    restored = jax.tree.map(lambda x: x[:, N_ENVS:], traj)
    np.testing.assert_array_equal(restored.action, expected.action)
    np.testing.assert_array_equal(restored.episode_id, expected.episode_id + ((2 + 1) << 40))


# -- errors raised by envs cross Ray intact (issue 16, defect 4) ------------------------------


class RaisingEnv(gymnasium.Wrapper):
    """Raises ``ValueError`` in its ``fail_at``-th step; once per ``marker`` file if one
    is given (the first env to create the file raises, every other env never does)."""

    def __init__(self, env: gymnasium.Env, fail_at: int, marker: str | None = None) -> None:
        super().__init__(env)
        self.fail_at, self.marker, self.steps = fail_at, marker, 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == self.fail_at and self._claim():
            raise ValueError("the env broke on purpose")
        return self.env.step(action)

    def _claim(self) -> bool:
        if self.marker is None:
            return True
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True


def raising_counting(env_id: int, fail_at: int | None) -> gymnasium.Env:
    env = CountingEnv(env_id=env_id, episode_length=50)
    return env if fail_at is None else RaisingEnv(env, fail_at)


def raising_cartpole(marker: str) -> gymnasium.Env:
    return RaisingEnv(slow_cartpole(0.0), fail_at=3, marker=marker)


def test_ray_backend_sub_env_error_arrives_as_env_error_with_index_and_cause():
    fns = [functools.partial(raising_counting, i, 3 if i == 3 else None) for i in range(4)]
    envs = jr.RayVectorEnv(fns, jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1))
    with runner_on(envs, 8) as runner, pytest.raises(jr.errors.EnvError) as caught:
        runner.sample()
    assert isinstance(caught.value, jr.errors.JaxRunnerError)
    assert caught.value.env_index == 3
    # The original error is named and chained (as on the other backends), and where the
    # actor raised it is noted.
    assert "ValueError('the env broke on purpose')" in str(caught.value)
    assert isinstance(caught.value.__cause__, ValueError)
    assert "broke on purpose" in str(caught.value.__cause__)
    assert any("raised in Ray env actor 1" in note for note in caught.value.__notes__)


class OddRefuses(gymnasium.Wrapper):
    """``parity()`` raises in the sub-envs of odd env id."""

    def parity(self) -> str:
        env_id = self.get_wrapper_attr("env_id")
        if env_id % 2:
            raise ValueError(f"env {env_id} is odd")
        return "even"


def odd_refuses(env_id: int) -> gymnasium.Env:
    return OddRefuses(CountingEnv(env_id=env_id))


def test_ray_call_and_get_attr_raise_the_sub_envs_error_or_a_worker_error_not_rays():
    """As on the process backend: the sub-env's own error (here named, with the call),
    and a dead actor's as WorkerError naming the actor and the call; not Ray's
    RayTaskError and RayActorError wrappers."""
    fns = [functools.partial(odd_refuses, i) for i in range(4)]
    config = jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1)
    with closing(jr.RayVectorEnv(fns, config)) as vec:
        with pytest.raises(ValueError, match="env 1 is odd") as caught:
            vec.call("parity")  # sub-envs 1 and 3 raise: the lowest comes
        assert not isinstance(caught.value, ray.exceptions.RayError)
        assert "jaxrunner: raised by sub-env 1 in call('parity')" in caught.value.__notes__
        with pytest.raises(AttributeError) as caught:
            vec.get_attr("no_such_attribute")
        assert not isinstance(caught.value, ray.exceptions.RayError)
        assert "raised by sub-env 0 in get_attr('no_such_attribute')" in caught.value.__notes__[0]
        kill_actor(vec.actors[1])
        match = r"Ray env actor 1 \(sub-envs 2\.\.3\) died or did not answer during get_attr\(\)"
        with pytest.raises(jr.errors.WorkerError, match=match):
            vec.get_attr("env_id")
        with pytest.raises(jr.errors.WorkerError, match=r"actor 1 .* during set_attr\(\)"):
            vec.set_attr("episode_length", 5)
        with pytest.raises(jr.errors.WorkerError, match=r"actor 1 .* during num_restarts\(\)"):
            vec.num_restarts  # noqa: B018  (a property that asks every actor)
        assert vec.get_sub_environments()[0].get_attr("env_id") == 0  # actor 0 answers on


class NappingEnv(gymnasium.Wrapper):
    """Its ``nap()`` and ``drowsy`` attribute sleep ``nap_s`` (0: return at once)."""

    def __init__(self, env: gymnasium.Env, nap_s: float) -> None:
        super().__init__(env)
        self.nap_s = nap_s

    def nap(self) -> float:
        time.sleep(self.nap_s)
        return self.nap_s

    @property
    def drowsy(self) -> float:
        return self.nap()


def napping(env_id: int, nap_s: float) -> gymnasium.Env:
    return NappingEnv(CountingEnv(env_id=env_id, episode_length=50), nap_s)


def test_ray_sub_env_calls_time_out_as_steps_do():
    """A hung call, get_attr or sub-env handle call waited forever (step_timeout_s held
    for steps only); now each raises the RemoteTimeoutError a missed step raises, naming
    the actor, and the hung actor is treated as dead: replaced at the next step (whose
    new sub-env naps again, for the next way of asking)."""
    # A deadline far above a loaded machine's answer times (ms), and a nap far above it.
    fns = [functools.partial(napping, i, 60.0 if i == 2 else 0.0) for i in range(4)]
    config = jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1, step_timeout_s=1.5)
    asks = {
        "call": lambda vec: vec.call("nap"),
        "get_attr": lambda vec: vec.get_attr("drowsy"),
        "handle": lambda vec: vec.get_sub_environments()[2].call("nap"),
    }
    with closing(jr.RayVectorEnv(fns, config, restart_policy=jr.RestartPolicy())) as vec:
        vec.reset_batch([0, 1, 2, 3])
        assert vec.get_sub_environments()[1].call("nap") == 0.0  # the fast ones answer
        for restarts, (ask, run) in enumerate(asks.items(), start=1):
            method = "call" if ask == "handle" else ask
            match = (
                r"Ray env actor 1 \(sub-envs 2\.\.3\) did not answer "
                rf"{method}\(\) within step_timeout_s=1\.5s; it is treated as dead"
            )
            start = time.monotonic()
            with pytest.raises(jr.errors.RemoteTimeoutError, match=match) as caught:
                run(vec)
            assert time.monotonic() - start < 30.0, ask  # (the nap is 60 s)
            assert (caught.value.worker_index, caught.value.env_indices) == (1, range(2, 4))
            out = vec.step_batch(np.zeros(4, np.int64))  # actor 1 is replaced, its slots fail
            assert vec.num_actor_restarts == restarts and out.failed.tolist() == [0, 0, 1, 1]


def _seen(err: BaseException) -> tuple[Any, ...]:
    """A sub-env error as its catcher sees it, less the note naming the Ray actor."""
    notes = [n for n in getattr(err, "__notes__", []) if "raised in Ray env actor" not in n]
    return type(err), getattr(err, "env_index", None), str(err), notes


def _on_sync_and_ray(base: Any, faults: dict, run: Any, **kwargs: Any) -> dict[str, Any]:
    """``run(envs)`` on 3 faulty sub-envs, sync and Ray (actors of 2: sub-env 2 is sub-env
    0 of actor 1)."""
    got = {}
    for backend in ("sync", "ray"):
        if backend == "ray":
            kwargs["config"] = jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1)
        envs = jr.make_vec(jr.testing.faulty_env_fns(base, 3, faults), 3, backend, **kwargs)
        try:
            got[backend] = run(envs)
        finally:
            envs.close()
    return got


@pytest.mark.parametrize("kind", ["gymnasium", "pettingzoo"])
@pytest.mark.parametrize("policy", [None, jr.RestartPolicy()])
def test_a_sub_env_raising_in_reset_does_on_ray_what_it_does_on_sync(kind, policy):
    """Without a restart policy its error is raised (the actor lives on: the next reset
    works); with one, the sub-env restarts in its actor."""
    base = functools.partial(CountingEnv, episode_length=3)
    if kind == "pettingzoo":
        pytest.importorskip("pettingzoo")
        base = jr.testing.coming_and_going
    fault = jr.testing.FaultPlan(kind="raise", call="reset", at=(2,))

    def run(envs: Any) -> Any:
        envs.reset_batch([0, 1, 2])
        seen = None
        try:
            envs.reset_batch([0, 1, 2])
        except Exception as err:
            seen = _seen(err)
        envs.reset_batch([0, 1, 2])
        return seen, envs.num_restarts, getattr(envs, "num_actor_restarts", 0)

    got = _on_sync_and_ray(base, {2: [fault]}, run, restart_policy=policy)
    assert got["ray"] == got["sync"]
    seen, restarts, _ = got["sync"]
    # With a policy, each new sub-env 2 fails in its 2nd reset too (the third one here).
    assert (seen is None, restarts) == ((False, 0) if policy is None else (True, 2))
    assert policy is not None or seen[1] == 2


def test_a_gymnasium_sub_env_error_from_a_ray_actor_names_it_as_sync_does():
    """Raised, or in a step's errors with a restart policy: the vector env's sub-env, in
    the message too (an invalid step has no env_index to renumber)."""
    base = functools.partial(CountingEnv, episode_length=3)

    def raised(envs: Any) -> Any:
        envs.reset(seed=0)
        with pytest.raises(jr.errors.JaxRunnerError) as caught:
            envs.step(np.zeros(3, np.int64))
        return _seen(caught.value)

    def kept(envs: Any) -> Any:
        envs.reset(seed=0)
        errors = envs.step_batch(np.zeros(3, np.int64)).errors
        return {i: _seen(err) for i, err in errors.items()}

    faults = {2: [jr.testing.FaultPlan(kind="nan_reward", at=(1,))]}
    got = _on_sync_and_ray(base, faults, raised)
    assert got["ray"] == got["sync"] and "sub-env 2" in got["sync"][2]
    faults = {2: [jr.testing.FaultPlan(kind="raise", at=(1,))]}
    got = _on_sync_and_ray(base, faults, kept, restart_policy=jr.RestartPolicy())
    assert got["ray"] == got["sync"] and list(got["sync"]) == [2]


def test_a_multi_agent_sub_env_error_from_a_ray_actor_names_it_as_sync_does():
    pytest.importorskip("pettingzoo")
    faults = {2: [jr.testing.FaultPlan(kind="raise", at=(1,))]}

    def run(envs: Any) -> Any:
        envs.reset_batch([0, 1, 2])
        with pytest.raises(jr.errors.EnvError) as caught:
            envs.step_batch([np.zeros((3, g.num_agents), np.int64) for g in envs.groups])
        return _seen(caught.value)

    got = _on_sync_and_ray(jr.testing.coming_and_going, faults, run)
    assert got["ray"] == got["sync"] and got["sync"][1] == 2


def broken_factory() -> Any:
    raise ValueError("cannot build this sub-env")


@pytest.mark.parametrize("kind", ["gymnasium", "pettingzoo"])
def test_a_sub_env_that_cannot_be_built_in_a_ray_actor_raises_what_sync_raises(kind):
    """A factory that raises, or unequal spaces, inside an actor: the sync backend's
    EnvError or SpaceMismatchError, not Ray's ActorDiedError (which keeps only the text
    of an error raised in an actor's constructor)."""
    base: Any = functools.partial(CountingEnv, episode_length=3)
    if kind == "pettingzoo":
        pytest.importorskip("pettingzoo")
        base = jr.testing.coming_and_going
    config = jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1)
    got = {}
    for backend, kwargs in (("sync", {}), ("ray", {"config": config})):
        with pytest.raises(jr.errors.EnvError) as caught:
            jr.make_vec([base, base, broken_factory], 3, backend, **kwargs)
        got[backend] = _seen(caught.value)
        assert isinstance(caught.value.__cause__, ValueError)
    assert got["ray"] == got["sync"] and got["sync"][1] == 2
    if kind == "gymnasium":  # sub-env 3 differs from sub-env 2, in the same actor
        fns = [base, base, base, functools.partial(CountingEnv, num_actions=4)]
        match = r"sub-env 3 has action_space=Discrete\(4\), but sub-env 2 has Discrete\(3\)"
        with pytest.raises(jr.errors.SpaceMismatchError, match=match):
            jr.make_vec(fns, 4, "ray", config=config)


def test_group_runner_whose_env_raises_is_replaced(group_params, tmp_path):
    config = jr.EnvRunnerGroupConfig(
        num_runners=2,
        num_envs_per_runner=1,
        rollout_length=8,
        seed=3,
        num_cpus_per_runner=0.5,
        sample_timeout_s=60.0,
    )
    env = functools.partial(raising_cartpole, str(tmp_path / "raised"))
    with jr.EnvRunnerGroup(env, POLICY, group_params[0], config) as group:
        traj = group.sample(concat=False)  # one runner's env raises: it is replaced
        assert len(traj) == 1 and group.num_restarts == 1
        (failures,) = group.get_metrics()["runner_failures"].values()
        assert "raised in step()" in failures[0] and "broke on purpose" in failures[0]
        group.wait_until_healthy(120.0)
        assert len(group.sample(concat=False)) == 2


def small_group_config(**kwargs: Any) -> jr.EnvRunnerGroupConfig:
    options = {"num_envs_per_runner": 1, "rollout_length": 4, "num_cpus_per_runner": 0.5}
    return jr.EnvRunnerGroupConfig(sample_timeout_s=60.0, **options, **kwargs)


def kill_runner(group: jr.EnvRunnerGroup, index: int) -> None:
    """Kills runner ``index``'s actor and waits until it is dead (``ray.kill`` is async)."""
    actor = group.runner_actors[index]
    ray.kill(actor)
    with pytest.raises(ray.exceptions.RayActorError):
        for _ in range(100):
            ray.get(actor.ready.remote())
            time.sleep(0.05)


def test_group_whose_runners_refuse_params_keeps_and_restarts_from_the_old_ones(group_params):
    bad = jax.tree.map(lambda x: np.zeros((*x.shape, 2), x.dtype), group_params[1])
    config = small_group_config(num_runners=1, max_restarts=1)
    with jr.EnvRunnerGroup("CartPole-v1", POLICY, group_params[0], config) as group:
        with pytest.raises(jr.errors.SpaceMismatchError) as caught:
            group.set_params(bad)
        assert "EnvRunnerGroup.set_params(): raised by a runner's" in caught.value.__notes__[-1]
        assert group.params_version == group.get_metrics()["params_version"] == 0
        kill_runner(group, 0)
        assert group.get_metrics()["num_runner_restarts"] == 1  # replaced
        group.wait_until_healthy(120.0)  # from the params the runners accepted
        assert group.get_metrics()["runner_params_versions"] == {0: 0}


def test_a_runner_dead_when_the_others_refuse_params_restarts_from_the_old_ones(group_params):
    """Runner 0 is dead when runner 1 refuses set_params: runner 0 is restarted from the
    params the group keeps (it was restarted from the refused ones, before the group
    took them back)."""
    bad = jax.tree.map(lambda x: np.zeros((*x.shape, 2), x.dtype), group_params[1])
    config = small_group_config(num_runners=2, max_restarts=1)
    with jr.EnvRunnerGroup("CartPole-v1", POLICY, group_params[0], config) as group:
        kill_runner(group, 0)
        with pytest.raises(jr.errors.SpaceMismatchError):
            group.set_params(bad)
        assert group.num_restarts == 1 and group.params_version == 0
        group.wait_until_healthy(120.0)
        assert group.get_metrics()["runner_params_versions"] == {0: 0, 1: 0}
        got, _ = ray.get(group.runner_actors[0].get_params.remote())
    jr.testing.assert_trees_equal(got, jax.device_get(group_params[0]), "params")


def test_group_that_gives_up_raises_the_samples_that_came_and_marks_the_runner_down(
    group_params,
):
    config = small_group_config(num_runners=2, max_restarts=0)
    with jr.EnvRunnerGroup("CartPole-v1", POLICY, group_params[0], config) as group:
        kill_runner(group, 1)
        with pytest.raises(jr.errors.RunnerFailedError, match="max_restarts=0") as caught:
            group.sample()
        partial = caught.value.partial_trajectory
        np.testing.assert_array_equal(partial.env_id[0], [0])  # runner 0's sample
        assert group.num_env_steps_sampled == partial.valid.sum() == 4
        assert group.healthy_runners == [0]
        assert [t.env_id[0, 0] for t in group.sample(concat=False)] == [0]  # runner 0 goes on
        metrics = group.get_metrics()
        assert len(metrics["runner_failures"][1]) == 1 and metrics["num_healthy_runners"] == 1
        with pytest.raises(jr.errors.RunnerFailedError, match="max_restarts"):
            group.wait_until_healthy(1.0)
        with pytest.raises(ValueError, match=r"wait_until_healthy\(timeout_s='1'\): expected"):
            group.wait_until_healthy("1")  # (a raw TypeError of float + str before)
    group.close()  # as a runner's: stop(), once more a no-op
    with pytest.raises(jr.errors.ClosedError):
        group.sample()


class MetricsRefusingWorker(RunnerWorker):
    """A group's runner whose first incarnation of runner 1 raises in get_metrics()."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.refuses = args[5:7] == (1, 0)  # (index, incarnation)

    def get_metrics(self) -> dict[str, Any]:
        if self.refuses:
            raise ValueError("the metrics broke on purpose")
        return super().get_metrics()


def test_group_runner_whose_get_metrics_raises_is_replaced_as_in_sample(group_params, monkeypatch):
    """As sample() treats a runner that raises: left out, replaced, its failure recorded
    (Ray's RayTaskError escaped get_metrics(), and the runner stayed up)."""
    monkeypatch.setattr(group_module, "RunnerWorker", MetricsRefusingWorker)
    config = small_group_config(num_runners=2, max_restarts=1)
    with jr.EnvRunnerGroup("CartPole-v1", POLICY, group_params[0], config) as group:
        metrics = group.get_metrics()
        assert list(metrics["runners"]) == [0] and metrics["num_runner_restarts"] == 1
        (failure,) = metrics["runner_failures"][1]
        assert "get_metrics() failed" in failure and "broke on purpose" in failure
        group.wait_until_healthy(120.0)
        assert sorted(group.get_metrics()["runners"]) == [0, 1]  # the new runner 1 answers


def test_a_stopped_group_reports_no_runner_up_and_restarts_none(group_params):
    """After stop() every runner is killed: none is healthy, and waiting for them is
    refused (polling the killed actors restarted them, or raised their raw death)."""
    config = small_group_config(num_runners=1, max_restarts=1)
    group = jr.EnvRunnerGroup("CartPole-v1", POLICY, group_params[0], config)
    assert group.healthy_runners == [0]
    group.stop()
    assert group.healthy_runners == []
    with pytest.raises(jr.errors.ClosedError, match=r"wait_until_healthy\(\) called after stop"):
        group.wait_until_healthy(1.0)
    assert group.num_restarts == 0


class TestRayContract(jr.testing.VectorEnvContract):
    """The backend contract on every kind of env, over one actor of every sub-env, and
    send/recv over actors of two, which answer apart. The contract's own env cases only:
    the transport is the same for every env, and each case costs new actors (~1.5 s of
    CPU each to start; sync and process cover the rest)."""

    env_kinds = HOST_KINDS
    envs_per_actor = None  # one actor of every sub-env

    def test_send_recv_steps_each_env_once_and_says_which(self, kind):
        self.envs_per_actor = 2  # actors of two, which answer apart
        super().test_send_recv_steps_each_env_once_and_says_which(kind)

    def make_vec(self, env_fns, restart_policy=None):
        from jaxrunner._src.backends.ray.vector_env import RayMultiAgentVectorEnv

        per_actor = self.envs_per_actor or self.num_envs
        config = jr.RayConfig(envs_per_actor=per_actor, num_cpus_per_actor=0.1)
        if self.kind == "gymnasium":
            return jr.RayVectorEnv(env_fns, config, restart_policy=restart_policy)
        return RayMultiAgentVectorEnv(env_fns, config=config, restart_policy=restart_policy)


def test_multi_agent_group_samples_like_local_runners_and_syncs_params_per_policy():
    """A PettingZoo env factory and no flag: the runners are EnvRunners, params and
    connector statistics go by policy id."""
    pytest.importorskip("pettingzoo")
    from jaxrunner import connectors as C
    from tests import multi_agent_envs as envs_mod

    ray.cloudpickle.register_pickle_by_value(envs_mod)
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 1)
    (g,) = envs.groups
    envs.close()
    conn = C.Connectors(obs=[C.NormalizeObservation()])
    policy = POLICY(g.action_space)
    first = {"policy_0": policy.init(jax.random.key(0), g.observation_space)}
    second = {"policy_0": policy.init(jax.random.key(7), g.observation_space)}
    config = jr.EnvRunnerGroupConfig(
        num_runners=2,
        num_envs_per_runner=2,
        rollout_length=8,
        seed=3,
        runner_options={"connectors": conn},
        num_cpus_per_runner=0.5,
        sample_timeout_s=60.0,
    )

    def local(index: int) -> jr.EnvRunner:
        envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
        seed = config.runner_seed(index, 0)
        return jr.EnvRunner(envs, policy, first, 8, seed, connectors=conn)

    with jr.EnvRunnerGroup(envs_mod.coming_and_going, POLICY, first, config) as group:
        traj = group.sample()
        merged = group.connector_statistics
        group.set_params(second)  # with the merged statistics
        states = [ray.get(a.get_connector_state.remote()) for a in group.runner_actors]
        params = [ray.get(a.get_params.remote()) for a in group.runner_actors]
        after = group.sample(concat=False)
        with pytest.raises(jr.errors.InvalidArgumentError, match="by policy id"):
            group.set_params({"ghost": second["policy_0"]})
        metrics = group.get_metrics()
    assert isinstance(merged, dict) and set(merged) == {"policy_0"}
    valid = traj.groups["policy_0"].valid
    assert float(merged["policy_0"][0].count) == valid.sum()  # every agent step, once
    for state, (got, version) in zip(states, params):
        stats = jax.device_get(state["policy_0"].obs[0].shared.stats)
        jr.testing.assert_trees_equal(stats, jax.device_get(merged["policy_0"][0]), "stats")
        jr.testing.assert_trees_equal(got, jax.device_get(second), "params")
        assert version == 1
    assert traj.groups["policy_0"].valid.shape == (8, 4, 4)
    np.testing.assert_array_equal(traj.env_id[0], np.arange(4))
    for index in (0, 1):  # each runner is a local EnvRunner with its seed
        with local(index) as runner:
            expected = runner.sample()
            runner.set_params(second["policy_0"], "policy_0")
            runner.set_connector_state(states[index])  # the group's merged statistics
            expected_after = runner.sample()
        got = jax.tree.map(lambda x, i=index: x[:, 2 * i : 2 * i + 2], traj)
        np.testing.assert_array_equal(
            got.groups["policy_0"].action, expected.groups["policy_0"].action
        )
        np.testing.assert_array_equal(got.env_id, expected.env_id + 2 * index)
        np.testing.assert_array_equal(
            after[index].groups["policy_0"].action, expected_after.groups["policy_0"].action
        )
    assert metrics["num_env_steps_sampled"] == 2 * 2 * 2 * 8  # runners x envs x samples x T
    assert metrics["runner_params_versions"] == {0: 1, 1: 1}


def two_policies(agent: str) -> str:
    return "a" if agent == "r0" else "b"


def two_policy_params() -> dict:
    """Params of policies "a" and "b" of the relay env (``two_policies``)."""
    pytest.importorskip("pettingzoo")
    envs = jr.make_vec(jr.testing.relay, 1, policy_mapping_fn=two_policies)
    params = {
        g.policy_id: POLICY(g.action_space).init(jax.random.key(0), g.observation_space)
        for g in envs.groups
    }
    envs.close()
    return params


def test_multi_agent_group_restarts_a_runner_with_the_policies_set_params_left_out():
    params = two_policy_params()
    new_a = jax.tree.map(lambda x: x + 1.0, params["a"])
    config = small_group_config(num_runners=1, max_restarts=1, policy_mapping_fn=two_policies)
    with jr.EnvRunnerGroup(jr.testing.relay, POLICY, params, config) as group:
        group.set_params({"a": new_a})  # some of the policy ids
        kill_runner(group, 0)
        assert group.get_metrics()["num_runner_restarts"] == 1
        group.wait_until_healthy(120.0)
        got, version = ray.get(group.runner_actors[0].get_params.remote())
    jr.testing.assert_trees_equal(got, jax.device_get({"a": new_a, "b": params["b"]}), "params")
    assert version == 1


def test_a_group_whose_runners_refuse_one_policys_params_keeps_every_policy_on_the_old():
    """set_params refused for policy "b" after policy "a"'s were taken: the runner puts
    "a"'s back (it kept them: runners half on the new params, the group on the old)."""
    params = two_policy_params()
    new = {
        "a": jax.tree.map(lambda x: x + 1.0, params["a"]),
        "b": jax.tree.map(lambda x: np.zeros((*x.shape, 2), x.dtype), params["b"]),
    }
    config = small_group_config(num_runners=1, policy_mapping_fn=two_policies)
    with jr.EnvRunnerGroup(jr.testing.relay, POLICY, params, config) as group:
        with pytest.raises(jr.errors.SpaceMismatchError, match=r"set_params\(params, 'b'\)"):
            group.set_params(new)
        got, version = ray.get(group.runner_actors[0].get_params.remote())
        assert group.params_version == version == 0
    jr.testing.assert_trees_equal(got, jax.device_get(params), "params")


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"backend": "nope"}, ValueError, r"backend='nope'\): expected one of"),
        ({"env_options": 3}, TypeError, r"env_options=3\): expected a dict"),
        ({"runner_options": ["metrics"]}, TypeError, r"runner_options=.*expected a dict"),
        ({"runner_options": {"nope": 1}}, ValueError, r"EnvRunner takes no \['nope'\]"),
        ({"policy_mapping_fn": "p"}, TypeError, r"policy_mapping_fn=...\): expected a function"),
    ],
)
def test_group_config_refuses_what_each_runner_would_refuse_later(options, error, match):
    # Refused where the config is built, not in every runner's process once Ray started it.
    with pytest.raises(error, match=match):
        jr.EnvRunnerGroupConfig(**options)


def test_group_config_multi_agent_flag_is_deprecated_and_a_mapping_needs_a_multi_agent_env():
    with pytest.warns(DeprecationWarning, match="learns the kind"):
        config = jr.EnvRunnerGroupConfig(multi_agent=True, num_runners=1, num_envs_per_runner=1)
    assert config.multi_agent  # kept, ignored
    config = jr.EnvRunnerGroupConfig(
        num_runners=1, num_envs_per_runner=1, policy_mapping_fn=lambda agent: "p"
    )
    params = POLICY(gymnasium.spaces.Discrete(2)).init(
        jax.random.key(0), gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    )
    with pytest.raises(jr.errors.RunnerFailedError, match="applies to multi-agent"):
        jr.EnvRunnerGroup("CartPole-v1", POLICY, params, config)


@pytest.mark.parametrize("ready_first", [True, False])
def test_the_runners_checked_actions_skip_the_main_process_check(monkeypatch, ready_first):
    """The actions the runner's policy step checked go to the actors without the main
    process's check of the batch (``send_checked``); a batch the step flags goes through
    it, which refuses it before any actor steps, naming the sub-env and the value."""
    checked = count_action_batch_checks(monkeypatch)
    config = jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1, ready_first=ready_first)
    envs = jr.make_vec(CountingEnv, 4, "ray", config=config)
    # (CountingEnv's actions: Discrete(3))
    traj = sample_checked_then_flagged(envs, checked, 1, 3, r"sub-env 0's action 3 \(row 0")
    assert (traj.action == 1).all() and checked

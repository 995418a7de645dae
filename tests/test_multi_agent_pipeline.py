"""Multi-agent vector envs on the core stepping protocol: block sends, pipelining
splits and ready-first stepping give the lockstep trajectories, bit for bit."""

from __future__ import annotations

import sys
import time
import types

import jax
import numpy as np
import pytest

pytest.importorskip("pettingzoo")

import jaxrunner as jr
from jaxrunner._src.testing.envs import ComingAndGoing
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.models import mlp_policy
from tests import multi_agent_envs as envs_mod
from tests.ray_helpers import kill_actor
from tests.shuffled_sync import ShuffledMultiAgentSync
from tests.test_multi_agent import random_policy, zero_params

LENGTH = 12


def spread_policy() -> tuple[jr.Policy, dict]:
    """simple_spread's agents under a 64-64 MLP: float work whose bits depend on the
    batch unless it is computed in the runner's fixed chunks."""
    env = envs_mod.simple_spread()
    agent = env.possible_agents[0]
    policy = mlp_policy(env.action_space(agent))
    params = policy.init(jax.random.key(0), env.observation_space(agent))
    env.close()
    return policy, params


def tictactoe_policy() -> tuple[jr.Policy, dict]:
    return random_policy(9, masked=True), zero_params(9)


POLICIES = {"simple_spread": spread_policy, "tictactoe": tictactoe_policy}


def sample(name, backend, num_splits, num_envs=5, **kwargs):
    """Two samples and the metrics of a runner on ``num_envs`` envs of ``name``."""
    envs = jr.make_multi_agent_vec(getattr(envs_mod, name), num_envs, backend, **kwargs)
    policy, params = POLICIES[name]()
    with jr.EnvRunner(envs, policy, params, LENGTH, seed=11, num_splits=num_splits) as runner:
        assert len(runner.sampler.splits) == (num_splits or len(runner.sampler.splits))
        trajs = [runner.sample(), runner.sample()]
        return trajs, runner.get_metrics()


def assert_same(a, b):
    (trajs_a, metrics_a), (trajs_b, metrics_b) = a, b
    jax.tree.map(np.testing.assert_array_equal, trajs_a, trajs_b)
    for key in ("num_env_steps", "num_agent_steps", "num_episodes", "episode_return_mean"):
        assert metrics_a[key] == metrics_b[key], key


@pytest.mark.parametrize("name", ["simple_spread", "tictactoe"])
def test_sync_splits_give_the_same_trajectories(name):
    one = sample(name, "sync", 1)
    assert one[1]["num_agent_steps"] > 0
    assert_same(one, sample(name, "sync", 2))
    assert_same(one, sample(name, "sync", 5))  # one env per split


@pytest.mark.parametrize("name", ["simple_spread", "tictactoe"])
def test_process_splits_give_the_sync_trajectories(name):
    reference = sample(name, "sync", 1)
    # Two workers (envs 0-2 and 3-4): two splits, and three splits that cut a worker.
    for splits in (1, 2, 3):
        assert_same(
            reference, sample(name, "process", splits, config=jr.ProcessConfig(num_workers=2))
        )


@pytest.mark.parametrize("name", ["simple_spread", "tictactoe"])
def test_a_main_process_share_gives_the_sync_trajectories(name):
    """Sub-envs 0-1 step in the main process, 2-4 in a worker: by default the two
    shares are the two splits; three splits cut across them."""
    reference = sample(name, "sync", 1)
    config = jr.ProcessConfig(main_process_envs=2, num_workers=1)
    for splits in (None, 3):
        assert_same(reference, sample(name, "process", splits, config=config))


@pytest.mark.parametrize("name", ["simple_spread", "tictactoe"])
def test_envs_answered_in_any_order_give_the_sync_trajectories(name):
    """The ready-first mode's bucket calls (Ray's batch_buckets, EnvPool's any order):
    envs answered one at a time in a random order, each padded to a bucket of 2, give
    the sync backend's bits (AEC turns and masks included)."""
    reference = sample(name, "sync", 1)
    envs = ShuffledMultiAgentSync([getattr(envs_mod, name)] * 5, buckets=(2, 5))
    policy, params = POLICIES[name]()
    with jr.EnvRunner(envs, policy, params, LENGTH, seed=11) as runner:
        got = [runner.sample(), runner.sample()], runner.get_metrics()
        counts = runner.sampler.ready_first.bucket_counts
    assert_same(reference, got)
    assert counts[2] > 0 and counts[5] == 2  # every env at each sample's start, then one


def test_default_splits_follow_the_lockstep_samplers_rule(monkeypatch):
    from jaxrunner._src.samplers import pipeline_splits

    envs = jr.make_multi_agent_vec(
        envs_mod.coming_and_going, 8, "process", config=jr.ProcessConfig(num_workers=2)
    )
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 3, seed=0) as runner:
        assert len(runner.sampler.splits) == pipeline_splits.default_num_splits(envs)
    # On an accelerator: one split at any width (each split pays a policy call's
    # host-side cost again); on a CPU host with asynchronous dispatch, two from
    # PIPELINE_MIN_ENVS.
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 8)
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 3, seed=0) as runner:
        assert runner.sampler.splits == [slice(0, 8)]
    for num_envs, gpu, cpu in ((pipeline_splits.PIPELINE_MIN_ENVS - 1, 1, 1), (256, 1, 2)):
        stepped = types.SimpleNamespace(num_envs=num_envs, capabilities=envs.capabilities)
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
        assert pipeline_splits.default_num_splits(stepped) == gpu  # type: ignore[arg-type]
        monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
        monkeypatch.setattr(pipeline_splits, "inline_cpu_dispatch", lambda: False)
        assert pipeline_splits.default_num_splits(stepped) == cpu  # type: ignore[arg-type]


def test_block_sends_step_only_their_envs_and_answer_in_order():
    """``send`` of two blocks then two ``recv``s: the sync backend answers the oldest
    first, with views of its block's rows, and each env steps as in a whole step."""
    whole = jr.make_multi_agent_vec(envs_mod.coming_and_going, 4)
    blocks = jr.make_multi_agent_vec(envs_mod.coming_and_going, 4)
    first = whole.reset_batch([0, 1, 2, 3])
    blocks.reset_batch([0, 1, 2, 3])
    actions = np.arange(4 * 4).reshape(4, 4) % 3
    want = whole.step_batch([actions])
    blocks.send([actions[:1]], slice(0, 1))
    blocks.send([actions[1:]], slice(1, 4))
    a, b = blocks.recv(), blocks.recv()
    assert (a.env_ids, b.env_ids) == (slice(0, 1), slice(1, 4))
    assert len(a.infos) == 1 and len(b.infos) == 3
    (pid,) = first.groups
    for field in ("obs", "acting", "completed", "reward", "next_obs"):
        got = np.concatenate([getattr(a.groups[pid], field), getattr(b.groups[pid], field)])
        np.testing.assert_array_equal(got, getattr(want.groups[pid], field))
    np.testing.assert_array_equal(np.concatenate([a.env_reward, b.env_reward]), want.env_reward)
    with pytest.raises(InvalidArgumentError, match="no send"):
        blocks.recv()
    with pytest.raises(InvalidArgumentError, match="step 1"):
        blocks.send([actions[::2]], slice(0, 4, 2))
        blocks.recv()
    whole.close()
    blocks.close()


def test_num_splits_out_of_range_is_refused():
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    in_range = r"num_splits=3\): expected an int in \[1, 2\] \(at most num_envs=2\)"
    with pytest.raises(InvalidArgumentError, match=in_range):
        jr.EnvRunner(envs, random_policy(3), zero_params(3), 3, seed=0, num_splits=3)
    envs.close()


class Sleepy(ComingAndGoing):
    """ComingAndGoing whose next step first sleeps ``sleep_s`` (set with ``set_attr``),
    once: a slow sub-env."""

    sleep_s = 0.0

    def step(self, actions):
        if self.sleep_s:
            time.sleep(self.sleep_s)
            self.sleep_s = 0.0
        return super().step(actions)


def sleepy() -> Sleepy:
    return Sleepy()


def ready_first_sample(backend, config, slow=0.0, length=8):
    """Two samples on 4 envs of two workers/actors (envs 0-1 and 2-3), sub-env 0's
    first step ``slow`` seconds long; the blocks ``recv`` answered, in order; the policy
    calls per bucket size."""
    envs = jr.make_multi_agent_vec(sleepy, 4, backend, config=config)
    if slow:
        envs.set_attr("sleep_s", [slow, 0.0, 0.0, 0.0])
    order = []
    recv = envs.recv

    def recording_recv():
        out = recv()
        order.append(out.env_ids)
        return out

    envs.recv = recording_recv
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), length, seed=5) as runner:
        trajs = [runner.sample(), runner.sample()]
        metrics = runner.get_metrics()
        counts = runner.sampler.ready_first.bucket_counts
    return (trajs, metrics), order, counts


def lockstep_reference(length=8):
    envs = jr.make_multi_agent_vec(sleepy, 4)
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), length, seed=5) as runner:
        return [runner.sample(), runner.sample()], runner.get_metrics()


def test_process_ready_first_matches_lockstep_and_a_slow_env_stalls_only_its_worker():
    config = jr.ProcessConfig(ready_first=True, num_workers=2)
    got, order, _ = ready_first_sample("process", config, slow=2.0)
    assert_same(lockstep_reference(), got)
    # Sub-env 0 sleeps through its first step: the other worker's envs take all 8 steps
    # of the first sample before worker 0's first answer, then worker 0 catches up.
    first, second = slice(0, 2), slice(2, 4)
    assert order[:8] == [second] * 8
    assert order[8:16] == [first] * 8
    assert sorted(map(str, order[16:])) == sorted(map(str, [first, second] * 8))


def test_process_ready_first_answers_a_waiting_worker_before_a_later_answer():
    """Worker 1's answer waits while worker 0 steps again: the next recv() is worker
    1's (it finished first), not worker 0's newer one. Reading one ready worker per
    wait, the lowest first, starved worker 1 while worker 0 kept answering."""
    config = jr.ProcessConfig(ready_first=True, num_workers=2)
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 4, "process", config=config)
    out = envs.reset_batch([0, 1, 2, 3])
    (pid,) = out.groups
    actions = np.zeros(out.groups[pid].acting.shape, np.int64)
    envs.send([actions], slice(0, 4))
    time.sleep(0.5)  # both workers have answered
    first = envs.recv()
    envs.send([actions[first.env_ids]], first.env_ids)
    time.sleep(0.5)  # and that worker again
    assert [first.env_ids, envs.recv().env_ids] == [slice(0, 2), slice(2, 4)]
    assert envs.recv().env_ids == slice(0, 2)
    envs.close()


def test_process_ready_first_refuses_splits_and_sends_of_part_of_a_worker():
    config = jr.ProcessConfig(ready_first=True, num_workers=2)
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 4, "process", config=config)
    assert envs.capabilities.ready_first
    with pytest.raises(InvalidArgumentError, match="ready-first"):
        jr.EnvRunner(envs, random_policy(3), zero_params(3), 3, seed=0, num_splits=2)
    envs.reset_batch([0, 1, 2, 3])
    with pytest.raises(InvalidArgumentError, match="whole workers"):
        envs.send([np.zeros((1, 4), np.int64)], slice(0, 1))
    envs.close()


def test_ray_ready_first_and_lockstep_splits_give_the_sync_trajectories(local_ray):
    ray = local_ray
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the Sleepy env
    reference = lockstep_reference()
    config = jr.RayConfig(
        envs_per_actor=2, num_cpus_per_actor=0.1, ready_first=True, batch_buckets=(2, 4)
    )
    got, order, counts = ready_first_sample("ray", config)
    assert_same(reference, got)
    assert len(order) == 2 * 2 * 8  # one answer per actor and step
    # Each actor's answer acts alone in the call of 2 envs; every env at a sample's start.
    assert counts[2] > 0 and counts[4] == 2
    config = jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1)
    envs = jr.make_multi_agent_vec(sleepy, 4, "ray", config=config)
    assert not envs.capabilities.ready_first and envs.capabilities.steps_in_background
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 8, seed=5, num_splits=2) as runner:
        got = [runner.sample(), runner.sample()], runner.get_metrics()
    assert_same(reference, got)

    # Two splits of one actor's envs, the actor killed between samples: both
    # splits' steps die with it; it is replaced once, and every env's slot fails.
    config = jr.RayConfig(envs_per_actor=4, num_cpus_per_actor=0.1)
    envs = jr.make_multi_agent_vec(
        sleepy, 4, "ray", config=config, restart_policy=jr.RestartPolicy()
    )
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 4, seed=5, num_splits=2) as runner:
        runner.sample()
        dead = envs.actors[0]
        kill_actor(dead)
        traj = runner.sample()
        assert envs.num_actor_restarts == 1
        assert traj.episode_id[0].tolist() != traj.episode_id[1].tolist()
        assert runner.get_metrics()["num_faulty_episodes"] == 4

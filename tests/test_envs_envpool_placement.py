"""EnvPool's threads pinned by its ``thread_affinity_offset``: the backend declares their
CPUs (``Capabilities.pinned_cpus``) and the runner samples with its other threads off
them, the same steps as unpinned; skipped without EnvPool."""

from __future__ import annotations

import os
from contextlib import closing

import jax
import pytest

import jaxrunner as jr
from jaxrunner._src.cpu_placement import _threads
from jaxrunner.models import mlp_policy
from jaxrunner.testing import assert_trees_equal

envpool = pytest.importorskip("envpool")
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*precision lowered:UserWarning"),
    pytest.mark.skipif(
        not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
        reason="thread placement needs Linux and 2 CPUs",
    ),
]

LAST = (os.cpu_count() or 1) - 1  # EnvPool numbers CPUs modulo os.cpu_count()
MODES = {"sync": {}, "async": {"batch_size": 2}, "pools": {"num_pools": 2}}


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_declares_the_cpus_its_threads_are_pinned_to(mode: str) -> None:
    pinned = {"num_threads": 1, "thread_affinity_offset": LAST}
    with closing(jr.make_vec("CartPole-v1", 4, backend="envpool", **MODES[mode], **pinned)) as vec:
        assert vec.capabilities.pinned_cpus == {LAST}
        assert any(os.sched_getaffinity(t) == {LAST} for t in _threads())
    with closing(jr.make_vec("CartPole-v1", 4, backend="envpool", **MODES[mode])) as vec:
        assert vec.capabilities.pinned_cpus == frozenset()
    two = {"num_threads": 2, "thread_affinity_offset": LAST}  # the second wraps to CPU 0
    with closing(jr.make_vec("CartPole-v1", 4, backend="envpool", **two)) as vec:
        assert vec.capabilities.pinned_cpus == {LAST, 0}


def _runner(**kwargs: object) -> jr.EnvRunner:
    envs = jr.make_vec("CartPole-v1", 8, backend="envpool", max_episode_steps=12, **kwargs)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    return jr.EnvRunner(envs, policy, params, rollout_length=32, seed=0)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_pinned_threads_sample_envpools_steps_with_the_runner_off_their_cpu(mode: str) -> None:
    home = os.sched_getaffinity(0)
    pinned = {"num_threads": 1, "thread_affinity_offset": LAST, **MODES[mode]}
    with _runner(**pinned) as runner, _runner(num_threads=1, **MODES[mode]) as free:
        recv, seen = runner.envs.recv, []

        def spying(*args: object, **kwargs: object) -> object:
            seen.append(os.sched_getaffinity(0))
            return recv(*args, **kwargs)

        runner.envs.recv = spying
        for _ in range(2):  # episodes end (12 steps) within each sample
            traj, same = runner.sample(), free.sample()
            assert_trees_equal(traj, same)
        assert seen and all(s == home - {LAST} for s in seen)
        assert os.sched_getaffinity(0) == home

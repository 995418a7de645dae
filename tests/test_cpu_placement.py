"""``kept_off``: while the runner samples, this process's threads stay off the CPUs a
backend's threads are pinned to (``Capabilities.pinned_cpus``), and get their CPUs back
after, even where the sample fails."""

from __future__ import annotations

import dataclasses
import os
import threading

import jax
import pytest

import jaxrunner as jr
from jaxrunner._src.cpu_placement import kept_off
from jaxrunner.models import mlp_policy
from jaxrunner.testing import assert_trees_equal

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="thread placement needs Linux and 2 CPUs",
)


@pytest.fixture
def cpus():
    """This process's CPUs, and the last of them as the one a backend pins."""
    home = os.sched_getaffinity(0)
    return home, frozenset({max(home)})


class _Parked:
    """A thread that waits until released, so its CPUs can be read meanwhile."""

    def __init__(self, cpus=None):
        self.tid, self._go, self._ready = 0, threading.Event(), threading.Event()
        self._cpus = cpus
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self._ready.wait()

    def _run(self):
        if self._cpus is not None:
            os.sched_setaffinity(0, self._cpus)
        self.tid = threading.get_native_id()
        self._ready.set()
        self._go.wait()

    def cpus(self):
        return os.sched_getaffinity(self.tid)

    def release(self):
        self._go.set()
        self.thread.join()


def test_threads_leave_the_pinned_cpus_for_the_block_and_get_theirs_back(cpus):
    home, pinned = cpus
    free, env_thread = _Parked(), _Parked(cpus=pinned)
    try:
        with kept_off(pinned):
            assert os.sched_getaffinity(0) == home - pinned
            assert free.cpus() == home - pinned
            assert env_thread.cpus() == pinned  # a pinned thread stays where it is
            started = _Parked()  # inherits this thread's CPUs
            assert started.cpus() == home - pinned
        assert os.sched_getaffinity(0) == home
        assert free.cpus() == home
        assert env_thread.cpus() == pinned
        assert started.cpus() == home  # still running: it gets the caller's CPUs back
    finally:
        for parked in (free, env_thread, started):
            parked.release()


def test_nothing_moves_where_no_cpu_is_pinned_or_every_cpu_is(cpus):
    home, _ = cpus
    for pinned in (frozenset(), frozenset(home)):
        with kept_off(pinned):
            assert os.sched_getaffinity(0) == home


def _runner(pinned):
    envs = jr.make_vec("CartPole-v1", 4)
    envs.capabilities = dataclasses.replace(envs.capabilities, pinned_cpus=pinned)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    return jr.EnvRunner(envs, policy, params, rollout_length=8, seed=0)


def test_the_runner_samples_off_the_pinned_cpus_and_the_same_steps(cpus):
    home, pinned = cpus
    seen = []
    with _runner(pinned) as runner, _runner(frozenset()) as unpinned:
        step = runner.envs.step_batch

        def spying(*args, **kwargs):
            seen.append(os.sched_getaffinity(0))
            return step(*args, **kwargs)

        runner.envs.step_batch = spying
        traj, same = runner.sample(), unpinned.sample()
        assert seen and all(s == home - pinned for s in seen)
        assert os.sched_getaffinity(0) == home
        assert_trees_equal(traj, same)

        def failing(*args, **kwargs):
            raise RuntimeError("step failed")

        runner.envs.step_batch = failing
        with pytest.raises(RuntimeError, match="step failed"):
            runner.sample()
        assert os.sched_getaffinity(0) == home  # given back whatever the sample raised

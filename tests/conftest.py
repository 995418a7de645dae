"""Shared fixtures: small envs and policies, fixed seeds."""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile

# One persistent XLA compilation cache for the run, before JAX starts: many tests (and
# the JAX children of the benchmark and notebook tests, which inherit the environment)
# compile the same small programs, and a hit skips XLA's compile. A fresh directory
# each run, removed at its end, so no run reads another's programs.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _XLA_CACHE = tempfile.mkdtemp(prefix="jaxrunner-tests-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _XLA_CACHE
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
else:
    _XLA_CACHE = None

import flax.linen as nn
import gymnasium
import jax
import pytest

import jaxrunner as jr
from jaxrunner.models import mlp_policy


def short_cartpole(max_episode_steps: int = 20) -> gymnasium.Env:
    """CartPole with a short time limit, so truncations happen often."""
    return gymnasium.make("CartPole-v1", max_episode_steps=max_episode_steps)


class ActorCritic(nn.Module):
    """Small MLP returning (logits_or_mean, value)."""

    num_outputs: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = nn.tanh(nn.Dense(16)(obs.reshape(obs.shape[0], -1).astype("float32")))
        return nn.Dense(self.num_outputs)(x), nn.Dense(1)(x)


def pytest_sessionfinish(session, exitstatus):
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    if _XLA_CACHE is not None:
        shutil.rmtree(_XLA_CACHE, ignore_errors=True)


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance (2 CPUs), started on first use and left running until the
    session ends: a start and a stop cost seconds, and the Ray tests of six modules
    share one per test process. A docs page's ``ray.init`` runs in a process of its own
    (test_docs_examples.py), so it starts its own instance and leaves this one alone."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    return ray


@pytest.fixture
def cartpole_runner():
    """Factory of runners on short CartPole with an actor-critic policy."""
    made = []

    def make(num_envs: int = 4, rollout_length: int = 32, seed: int = 0, **kwargs):
        envs = jr.make_vec(short_cartpole, num_envs)
        policy = jr.Policy.from_linen(ActorCritic(2), envs.single_action_space)
        params = policy.init(jax.random.key(1), envs.single_observation_space)
        runner = jr.EnvRunner(envs, policy, params, rollout_length, seed, **kwargs)
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.stop()


@pytest.fixture
def mlp():
    return functools.partial(mlp_policy, hidden=(16,))

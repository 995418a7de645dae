"""Shared fixtures: small envs and policies, fixed seeds."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys

# One persistent XLA compilation cache, before JAX starts: the tests, both xdist workers
# and the JAX children of the subprocess tests (they inherit the environment) compile
# the same small programs, in a run and from run to run, and a hit skips XLA's compile
# (test_returns.py: 26 s of CPU cold, 11 s warm). An entry's key holds its program, JAX's
# version and the compile options, so a changed program never reads an old one. Only with
# filelock: JAX then locks reads and writes across processes and evicts the oldest entries
# past 512 MiB. Set JAX_COMPILATION_CACHE_DIR to use another directory.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ and importlib.util.find_spec("filelock"):
    _cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    _xla_cache = os.path.join(_cache_home, "jaxrunner-tests", "xla")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _xla_cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(512 << 20)
    # A process killed between JAX's two writes leaves an entry without its access-time
    # file, and JAX's eviction scan then warns at every later compile (an error in the
    # tests that turn warnings into errors): drop such entries first.
    import filelock

    os.makedirs(_xla_cache, exist_ok=True)
    with filelock.FileLock(os.path.join(_xla_cache, ".lockfile"), timeout=60):
        for _name in os.listdir(_xla_cache):
            _key = _name.removesuffix("-cache")
            if _key != _name and not os.path.exists(os.path.join(_xla_cache, _key + "-atime")):
                os.remove(os.path.join(_xla_cache, _name))

import multiprocessing

import flax.linen as nn
import gymnasium
import jax
import pytest

import jaxrunner as jr
from jaxrunner.models import mlp_policy

# The process backend's workers fork from one fork server per test process. A test's env
# factory reaches a worker by reference to its test module, which the worker imports,
# and with it this module, pytest, flax and the test envs: 0.6 s of CPU per worker, and
# the suite starts hundreds. Imported once in the fork server, that is ~10 ms.
multiprocessing.set_forkserver_preload(
    ["__main__", "tests.conftest", "tests.multi_agent_envs", "jaxrunner.testing"]
)
IMPORTED_IN = os.getpid()
"""The process that imported this module (a worker finds the fork server's)."""


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


@pytest.fixture
def cpu_defaults(monkeypatch):
    """A CPU host's default splits and policy chunks on any platform (an accelerator takes
    one split and one chunk of every row), for tests that assert them."""
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")


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


_COMPILES: list[list[str]] = []
"""The event lists :func:`compile_events` fills (the innermost last)."""


def _record_compile(name: str, seconds: float, **kwargs: object) -> None:
    if _COMPILES and name.startswith("/jax/core/compile/"):
        _COMPILES[-1].append(name)


@pytest.fixture
def compile_events():
    """A context manager giving the list of JAX's trace, lowering and compile events
    inside it."""
    if not getattr(_record_compile, "registered", False):
        jax.monitoring.register_event_duration_secs_listener(_record_compile)
        _record_compile.registered = True  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def events():
        _COMPILES.append([])
        try:
            yield _COMPILES[-1]
        finally:
            _COMPILES.pop()

    return events


def constant_actions_policy() -> jr.Policy:
    """Acts ``params["a"]`` (an int32) in every row: a runner's actions set by hand."""
    import jax.numpy as jnp

    return jr.Policy(apply_fn=lambda p, o, c, k: (jnp.full(len(k), p["a"], jnp.int32), {}, None))


def count_action_batch_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The calls, from now on, of the checks ``space_arrays.action_batch_check`` builds
    (the batch size each checked): a backend's own check of an action batch's values."""
    from jaxrunner._src import space_arrays

    calls: list[int] = []
    real = space_arrays.action_batch_check

    def counting(space: gymnasium.Space, num: int):
        check = real(space, num)
        return lambda actions: (calls.append(num), check(actions))[1]

    monkeypatch.setattr(space_arrays, "action_batch_check", counting)
    return calls


def sample_checked_then_flagged(
    envs, checks: list, good: int, bad: int, match: str, rollout_length: int = 4
):
    """A runner on ``envs`` acting ``good`` everywhere samples with ``checks`` still empty
    (``send_checked``: the backend's own check skipped); acting ``bad``, the batch its
    policy step flags goes through that check, which refuses the next sample with an
    error matching ``match``. Returns the good sample."""
    import jax.numpy as jnp

    params = {"a": jnp.int32(good)}
    with jr.EnvRunner(envs, constant_actions_policy(), params, rollout_length, seed=0) as runner:
        traj = runner.sample()
        assert checks == []
        runner.set_params({"a": jnp.int32(bad)})
        with pytest.raises(jr.errors.InvalidActionError, match=match):
            runner.sample()
    return traj

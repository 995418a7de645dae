"""CPU dispatch: inline by default after ``import jaxrunner`` where safe; a process-wide
JAX setting, so each case runs in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner._src.cpu_dispatch import ENV_VAR
from jaxrunner._src.samplers import pipeline_splits
from jaxrunner.errors import DispatchConfigError
from jaxrunner.models import mlp_policy

SAMPLE = """
import jax, numpy as np
import jaxrunner as jr
from jaxrunner.models import mlp_policy
envs = jr.make_vec(lambda: __import__("gymnasium").make("CartPole-v1", max_episode_steps=20), 5)
policy = mlp_policy(envs.single_action_space, hidden=(16,))
params = policy.init(jax.random.key(3), envs.single_observation_space)
with jr.EnvRunner(envs, policy, params, 40, 7) as runner:
    traj = runner.sample()
    groups = len(runner.sampler.splits)
np.savez(OUT, action=traj.action, reward=traj.reward, obs=traj.obs,
         log_prob=traj.extras["log_prob"], episode_id=traj.episode_id, groups=groups)
"""


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != ENV_VAR} | env
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
    )


def _sample(tmp_path, inline: bool) -> dict[str, np.ndarray]:
    out = tmp_path / f"inline_{inline}.npz"
    env = {} if inline else {ENV_VAR: "1"}  # the default, or JAX's own default kept
    proc = _run(f"OUT = {str(out)!r}\n" + SAMPLE + CHECK_MODE.format(inline=inline), **env)
    assert proc.returncode == 0, proc.stderr
    return dict(np.load(out))


CHECK_MODE = "\nassert jr.cpu_dispatch.inline_cpu_dispatch() is {inline}\n"


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU-backend setting")
def test_inline_dispatch_gives_the_same_trajectories(tmp_path):
    inline, default = _sample(tmp_path, True), _sample(tmp_path, False)
    assert int(inline.pop("groups")) == int(default.pop("groups")) == 1
    for name in default:
        np.testing.assert_array_equal(inline[name], default[name], err_msg=name)


def test_importing_jaxrunner_makes_inline_the_default():
    proc = _run(
        """
        import jax, jaxrunner as jr
        assert jr.cpu_dispatch.inline_cpu_dispatch()
        jax.numpy.zeros(3).block_until_ready()
        assert jr.cpu_dispatch.inline_cpu_dispatch()
        jr.cpu_dispatch.use_inline_cpu_dispatch()  # after start-up, already inline: harmless
        print("ok")
        """
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_importing_jaxrunner_before_jax_sets_the_default_once_jax_loads():
    # jaxrunner loads JAX only where it uses it (a Ray actor stepping numpy envs never
    # does): the default is set right after ``import jax``, an availability check before
    # it notwithstanding.
    proc = _run(
        """
        import importlib.util, sys
        import jaxrunner as jr
        assert "jax" not in sys.modules
        assert importlib.util.find_spec("jax") is not None  # finds, loads nothing
        import jax
        assert jr.cpu_dispatch.inline_cpu_dispatch()
        jax.numpy.zeros(3).block_until_ready()
        assert jr.cpu_dispatch.inline_cpu_dispatch()
        print("ok")
        """
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_a_jax_without_the_private_probe_leaves_the_mode_alone():
    # jaxrunner asks JAX's private jax._src.xla_bridge whether the backends started; a
    # JAX release that moves it must not make the import fail or switch blindly.
    proc = _run(
        """
        import jax._src.xla_bridge as bridge
        del bridge.backends_are_initialized  # as a JAX upgrade that renamed it would
        import jax, jaxrunner as jr
        from jaxrunner._src.cpu_dispatch import _backends_started
        assert _backends_started() is None
        assert not jr.cpu_dispatch.inline_cpu_dispatch(), "unknown state: JAX's default kept"
        jr.cpu_dispatch.use_inline_cpu_dispatch()  # an explicit choice still works
        assert jr.cpu_dispatch.inline_cpu_dispatch()
        print("ok")
        """
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_a_chosen_mode_is_kept_and_switches_work_before_jax_starts():
    proc = _run(
        """
        import jax, jaxrunner as jr
        assert not jr.cpu_dispatch.inline_cpu_dispatch(), "the environment chose async"
        jr.cpu_dispatch.use_inline_cpu_dispatch()
        assert jr.cpu_dispatch.inline_cpu_dispatch()
        jr.cpu_dispatch.use_async_cpu_dispatch()
        jr.cpu_dispatch.use_async_cpu_dispatch()  # again: harmless
        jax.numpy.zeros(3).block_until_ready()
        assert not jr.cpu_dispatch.inline_cpu_dispatch()
        print("ok")
        """,
        **{ENV_VAR: "1"},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_importing_after_jax_started_leaves_its_mode():
    proc = _run(
        """
        import jax
        jax.numpy.zeros(3).block_until_ready()  # the user's JAX started first
        import jaxrunner as jr
        assert not jr.cpu_dispatch.inline_cpu_dispatch()
        try:
            jr.cpu_dispatch.use_inline_cpu_dispatch()
        except jr.errors.DispatchConfigError as err:
            assert isinstance(err, RuntimeError)
            assert "before any JAX computation" in str(err) and "=0" in str(err), err
        else:
            raise SystemExit("expected DispatchConfigError")
        assert not jr.cpu_dispatch.inline_cpu_dispatch(), "a refused switch changes nothing"
        print("ok")
        """
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_switch_after_jax_started_is_a_clear_error():
    jax.numpy.zeros(1).block_until_ready()  # this process's backend has started
    switch = (
        jr.cpu_dispatch.use_async_cpu_dispatch
        if jr.cpu_dispatch.inline_cpu_dispatch()
        else jr.cpu_dispatch.use_inline_cpu_dispatch
    )
    mode = jr.cpu_dispatch.inline_cpu_dispatch()
    with pytest.raises(DispatchConfigError, match="before any JAX computation") as info:
        switch()
    assert isinstance(info.value, RuntimeError)
    assert jr.cpu_dispatch.inline_cpu_dispatch() == mode, "a refused switch changes nothing"


def test_inline_dispatch_means_one_group_by_default(monkeypatch):
    """With inline dispatch a policy call blocks, so pipelining has nothing to overlap."""
    monkeypatch.setattr("jaxrunner._src.samplers.pipeline_splits.inline_cpu_dispatch", lambda: True)
    envs = jr.make_vec("CartPole-v1", pipeline_splits.PIPELINE_MIN_ENVS)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, 2, 0) as runner:
        assert len(runner.sampler.splits) == 1


@pytest.mark.parametrize("kind", ["gymnasium", "pettingzoo"])
def test_an_in_process_backend_steps_one_split_while_the_other_splits_policy_computes(
    kind, monkeypatch
):
    """The sync backend steps a split at ``recv``, in the sampler's thread: each split's
    policy step is queued after its envs step and collected only just before they step
    again, so that (asynchronous dispatch, an accelerator) it computes while the other
    split's envs step."""
    from jaxrunner._src.samplers.group_step import GroupSampler

    events: list[str] = []
    for name, tag in (("dispatch", "d"), ("collect", "c")):
        method = getattr(GroupSampler, name)

        def logged(self, *args, method=method, tag=tag):
            lo = args[-2]  # dispatch(params, buf, lo, hi), collect(t, lo, hi)
            events.append(f"{tag}{lo}")
            return method(self, *args)

        monkeypatch.setattr(GroupSampler, name, logged)
    if kind == "gymnasium":
        envs = jr.make_vec("CartPole-v1", 4)
        policy = mlp_policy(envs.single_action_space, hidden=(8,))
        params = policy.init(jax.random.key(0), envs.single_observation_space)
        real_step = envs._step  # where the sync backend steps a send, at its recv
        monkeypatch.setattr(
            envs, "_step", lambda a, rows: events.append(f"s{rows.start}") or real_step(a, rows)
        )
    else:
        pytest.importorskip("pettingzoo")
        from tests.test_multi_agent import random_policy, zero_params

        envs = jr.make_vec(jr.testing.coming_and_going, 4)
        policy, params = random_policy(3), zero_params(3)
        recv = envs.recv
        monkeypatch.setattr(envs, "recv", lambda: events.append("s") or recv())
    with jr.EnvRunner(envs, policy, params, 3, seed=0, num_splits=2) as runner:
        runner.sample()
    step = ["c0", "s0", "d0", "c2", "s2", "d2"]
    if kind == "pettingzoo":  # its recv steps whichever block was sent
        step = ["c0", "s", "d0", "c2", "s", "d2"]
    last = [e for e in step if not e.startswith("d")]
    assert events == ["d0", "d2", *step, *step, *last]

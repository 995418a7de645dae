"""backend="envpool" checks what EnvPool's C++ trusts (skipped without EnvPool).

An out-of-range action used to kill the process inside EnvPool (int32 max or min, NaN
cast to int) or be taken silently (6, 1000, -1, ``2**40`` wrapping to 0); async mode
took any dtype and any env ids, and its ``recv`` with too few envs in flight waited
forever. Each case runs in a child process, so a regression fails the test instead of
killing or hanging pytest.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("envpool")

_CHILD_PRELUDE = """
import warnings
warnings.filterwarnings("ignore")
import numpy as np
import envpool
import jaxrunner as jr
from jaxrunner.errors import EnvIndexError, InvalidActionError, InvalidArgumentError

def refused(error, fn, *args):
    try:
        fn(*args)
    except error as err:
        return str(err)
    raise SystemExit(f"accepted: {fn.__name__}{args!r}")
"""


def _run_child(body: str, timeout: float = 120) -> str:
    """Runs ``body`` (after the prelude) in a fresh interpreter; its stdout, or a test
    failure naming how it died."""
    code = _CHILD_PRELUDE + textwrap.dedent(body)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child hung for {timeout} s (EnvPool waiting forever?)")
    assert done.returncode == 0, f"child exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


_BAD_ACTIONS = """
BAD = {
    "int32 max": np.int64(2**31 - 1), "int32 min": np.int64(-(2**31)),
    "NaN cast to int": np.array(np.nan).astype(np.int32), "n": np.int64(6),
    "1000": np.int64(1000), "-1": np.int64(-1), "2**40": np.int64(2**40),
}
"""


@pytest.mark.parametrize(
    "mode",
    [{}, {"keep_reset_steps": False}, {"batch_size": 1}],
    ids=["sync", "same_step", "async"],
)
def test_out_of_range_actions_are_refused_and_lose_nothing(mode: dict) -> None:
    """Every bad value is refused with the task, row and value named; the pool is
    untouched: the steps after are those of a twin pool that never saw them."""
    out = _run_child(
        _BAD_ACTIONS
        + f"""
mode = {mode!r}
envs, twin = (jr.make_vec("Pong-v5", 2, backend="envpool", **mode) for _ in range(2))
for vec in (envs, twin):
    vec.reset_batch([5, 6])
def step(vec, actions):  # the steps' (next_obs, reward), copied
    if "batch_size" not in mode:
        out = vec.step_batch(actions)
        return [(out.next_obs.copy(), out.reward.copy())]
    outs = []
    for i in range(2):  # one env per send, batch_size 1
        vec.send(actions[i : i + 1], np.array([i]))
        out = vec.recv()
        outs.append((out.next_obs, out.reward))
    return outs
for t in range(4):
    for name, value in BAD.items():
        row = t % 2
        actions = np.array([1, 1], np.int64)
        actions[row] = value
        if "batch_size" in mode:
            message = refused(InvalidActionError, envs.send, actions[row : row + 1], [row])
            assert "row 0" in message and f"sub-env {{row}}" in message, message
        else:
            message = refused(InvalidActionError, envs.step_batch, actions)
            assert f"row {{row}}" in message, message
        assert "Pong-v5" in message and str(int(actions[row])) in message, message
    good = np.array([t % 6, (t + 3) % 6], np.int64)
    for (obs, reward), (twin_obs, twin_reward) in zip(step(envs, good), step(twin, good)):
        assert np.array_equal(obs, twin_obs) and np.array_equal(reward, twin_reward)
print("ok")
"""
    )
    assert out.strip().endswith("ok")


def test_async_send_and_recv_refuse_what_envpool_would_mishandle() -> None:
    """Async mode: wrong dtypes, negative, repeated, out-of-range or in-flight env ids
    are refused before anything is sent (an answer's own ids, sent back whole, are known
    good); ``recv`` with fewer envs in flight than
    ``batch_size`` is refused instead of waiting forever; ``reset`` works again once
    nothing is in flight, and a seeded one while envs step leaves the pool as it was."""
    out = _run_child(
        """
envs = jr.make_vec("CartPole-v1", 4, backend="envpool", batch_size=2)
envs.reset_batch([0, 1, 2, 3])
pool = envs.env
for bad in (np.array([True, False]), np.array([0.0, 1.0]), np.array(["a", "b"]),
            np.array([object(), 1], dtype=object)):
    refused(InvalidActionError, envs.send, bad, np.array([0, 1]))
one = np.zeros(2, np.int64)
assert "env id -1" in refused(EnvIndexError, envs.send, one, [-1, -2])
assert "env id 4" in refused(EnvIndexError, envs.send, one, [0, 4])
assert "repeated" in refused(InvalidArgumentError, envs.send, one, [1, 1])
assert "send() at least 2" in refused(InvalidArgumentError, envs.recv)
envs.send(np.zeros(1, np.int64), [3])
assert "still stepping" in refused(InvalidArgumentError, envs.send, one, [2, 3])
assert "1 more" in refused(InvalidArgumentError, envs.recv)
assert "still stepping" in refused(InvalidArgumentError, envs.reset_batch, [9, 9, 9, 9])
assert envs.env is pool  # the seeded reset built no new pool, closed no old one
envs.send(np.zeros(1, np.int64), [0])
assert sorted(envs.recv().env_ids.tolist()) == [0, 3]
obs, _ = envs.reset(seed=7)  # nothing in flight: reset works again, seeded too
expected = envpool.make_gymnasium("CartPole-v1", num_envs=4, seed=7).reset()[0]
assert np.array_equal(obs, expected)
for _ in range(3):  # and stepping after it
    envs.send(np.ones(4, np.int64))
    assert len(envs.recv().env_ids) == 2 and len(envs.recv().env_ids) == 2
# An answer's env ids sent back whole skip the checks: they cannot be edited, and once
# part of them is sent they are checked again.
envs.send(np.ones(4, np.int64))
answer = envs.recv().env_ids
assert not answer.flags.writeable
envs.send(np.zeros(1, np.int64), answer[:1])
assert "still stepping" in refused(InvalidArgumentError, envs.send, one, answer)
envs.send(np.zeros(1, np.int64), answer[1:])
assert sorted(envs.recv().env_ids.tolist() + envs.recv().env_ids.tolist()) == [0, 1, 2, 3]
print("ok")
"""
    )
    assert out.strip().endswith("ok")


def test_the_public_class_refuses_what_make_vec_refuses() -> None:
    """``jr.EnvPoolVectorEnv`` built directly checks its arguments as ``make_vec`` does:
    a negative ``num_threads`` aborted the whole process in EnvPool's C++, ``num_envs``
    below 1 failed EnvPool's bare assert, and a ``keep_reset_steps`` of another type
    was taken as its truth value."""
    out = _run_child(
        """
from jaxrunner.errors import InvalidArgumentTypeError
message = refused(
    InvalidArgumentError, lambda: jr.EnvPoolVectorEnv("CartPole-v1", 4, num_threads=-1)
)
assert "EnvPoolVectorEnv(num_threads=-1): expected an int >= 0" in message, message
for n in (0, -1):
    message = refused(InvalidArgumentError, lambda: jr.EnvPoolVectorEnv("CartPole-v1", n))
    assert f"EnvPoolVectorEnv(num_envs={n}): expected an int >= 1" in message, message
message = refused(
    InvalidArgumentTypeError, lambda: jr.EnvPoolVectorEnv("CartPole-v1", 2, keep_reset_steps="no")
)
assert "EnvPoolVectorEnv(keep_reset_steps='no'): expected True or False" in message, message
print("ok")
"""
    )
    assert out.strip().endswith("ok")


@pytest.mark.parametrize(
    "mode",
    [{}, {"keep_reset_steps": False}, {"batch_size": 2}, {"num_pools": 2}],
    ids=["sync", "same_step", "async", "pools"],
)
def test_a_runner_skips_the_check_its_policy_step_made_and_refuses_what_it_flagged(
    mode: dict,
) -> None:
    """The runner's policy step checks the actions' values in its compiled graph, so
    the backend skips its own check; a bad action there goes through the backend's
    check, which refuses it (naming the task, sub-env and value) before EnvPool's C++
    sees it."""
    out = _run_child(
        f"""
import jax.numpy as jnp
envs = jr.make_vec("CartPole-v1", 4, backend="envpool", **{mode!r})
sends = {{"send": 0, "send_checked": 0, "step_batch": 0}}
for name in sends:  # count the vector env's sends of each kind (an inline step: step_batch)
    orig = getattr(type(envs), name)
    def counted(self, *args, _name=name, _orig=orig):
        sends[_name] += 1
        return _orig(self, *args)
    setattr(type(envs), name, counted)
policy = jr.Policy(apply_fn=lambda p, o, c, k: (jnp.full(len(k), p["a"], jnp.int32), {{}}, None))
runner = jr.EnvRunner(envs, policy, {{"a": jnp.int32(1)}}, rollout_length=3, seed=0)
runner.sample()
assert sends["send"] == sends["step_batch"] == 0 and sends["send_checked"] > 0, sends
runner.set_params({{"a": jnp.int32(2)}})
message = refused(InvalidActionError, runner.sample)
assert "CartPole-v1" in message and "action 2" in message and "sub-env" in message, message
assert sends["send"] + sends["step_batch"] >= 1, sends
print("ok")
"""
    )
    assert out.strip().endswith("ok")

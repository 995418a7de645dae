"""The argument checks (jaxrunner/_src/arg_checks.py): their rules and wording, and a
``restart_policy`` that is no policy refused at every entry point that takes one."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner._src.arg_checks import (
    check_bool,
    check_int,
    check_number,
    is_int,
)
from jaxrunner._src.backends.restarts import check_restart_policy
from jaxrunner._src.backends.sync import SyncMultiAgentVectorEnv
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError
from jaxrunner.testing import CountingEnv

# -- the rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, r"^f\(n=0\): expected an int >= 1\.$"),
        (True, r"^f\(n=True\): expected an int >= 1; got bool\.$"),
        (np.bool_(True), r"^f\(n=np\.True_\): expected an int >= 1; got bool\.$"),
        (1.0, r"^f\(n=1\.0\): expected an int >= 1; got float\.$"),
        ("2", r"^f\(n='2'\): expected an int >= 1; got str\.$"),
        (None, r"^f\(n=None\): expected an int >= 1; got NoneType\.$"),
    ],
)
def test_check_int_refuses_what_is_no_count(value, message):
    with pytest.raises(InvalidArgumentError, match=message):
        check_int("f", "n", value)


def test_check_int_gives_a_python_int_and_says_its_bounds_none_and_hint():
    got = check_int("f", "n", np.int64(3))
    assert got == 3 and type(got) is int
    assert check_int("f", "n", None, none="for automatic") is None
    assert check_int("f", "n", -(2**70), low=-math.inf) == -(2**70)
    with pytest.raises(
        InvalidArgumentError,
        match=r"^f\(n=5\): expected an int in \[0, 4\] \(at most 4\), or None for automatic\.$",
    ):
        check_int("f", "n", 5, low=0, high=4, hint="at most 4", none="for automatic")


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (0, {"low_open": True}, r"expected a number > 0\.$"),
        (float("nan"), {}, r"expected a number >= 0\.$"),
        (-0.5, {}, r"expected a number >= 0\.$"),
        (1.5, {"high": 1.0}, r"expected a number in \[0, 1\]\.$"),
        (math.inf, {"high_open": True}, r"expected a number in \[0, inf\)\.$"),
        (False, {}, r"expected a number >= 0; got bool\.$"),
        ("0.9", {}, r"expected a number >= 0; got str\.$"),
    ],
)
def test_check_number_refuses_nan_bools_and_values_outside(value, kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        check_number("f", "x", value, **kwargs)


def test_check_number_gives_a_float_and_passes_none_only_when_it_means_something():
    assert check_number("f", "x", np.float32(0.5), high=1.0) == 0.5
    assert check_number("f", "x", 3) == 3.0 and type(check_number("f", "x", 3)) is float
    assert check_number("f", "x", None, none="for no timeout") is None
    with pytest.raises(InvalidArgumentError, match=r"x=None\): expected a number >= 0; got"):
        check_number("f", "x", None)


def test_check_bool_and_is_int():
    assert check_bool("f", "b", np.bool_(False)) is False
    for value in (1, "yes", None):
        with pytest.raises(InvalidArgumentTypeError, match=r"f\(b=.*\): expected True or False"):
            check_bool("f", "b", value)
    assert is_int(np.int32(0), low=0) and not is_int(True) and not is_int(2, high=1)
    check_restart_policy("f", None)
    check_restart_policy("f", jr.RestartPolicy())


# -- restart_policy=True at every entry point ----------------------------------------------


class _Counting:
    """A factory that counts the envs it built: a refusal must come before any."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make, self.made = make, 0

    def __call__(self) -> Any:
        self.made += 1
        return self.make()


def _from_env(backend: str) -> Callable[[_Counting], Any]:
    def build(factory: _Counting) -> Any:
        policy = jr.models.mlp_policy(CountingEnv().action_space)
        params = policy.init(jax.random.key(0), CountingEnv().observation_space)
        return jr.EnvRunner.from_env(
            factory, 2, policy, params, 4, 0, backend=backend, restart_policy=True
        )

    return build


def _coming_and_going() -> Any:
    return jr.testing.ComingAndGoing()


ENTRY_POINTS = {
    "make_vec sync": (CountingEnv, lambda f: jr.make_vec(f, 2, "sync", restart_policy=True)),
    "make_vec auto": (CountingEnv, lambda f: jr.make_vec(f, 2, "auto", restart_policy=True)),
    "SyncVectorEnv": (CountingEnv, lambda f: jr.SyncVectorEnv([f, f], restart_policy=True)),
    "ProcessVectorEnv": (CountingEnv, lambda f: jr.ProcessVectorEnv([f], restart_policy=True)),
    "RayVectorEnv": (CountingEnv, lambda f: jr.RayVectorEnv([f], restart_policy=True)),
    "EnvRunner.from_env sync": (CountingEnv, _from_env("sync")),
    "EnvRunner.from_env auto": (CountingEnv, _from_env("auto")),
    "make_multi_agent_vec": (
        _coming_and_going,
        lambda f: jr.make_multi_agent_vec(f, 2, restart_policy=True),
    ),
    "SyncMultiAgentVectorEnv": (
        _coming_and_going,
        lambda f: SyncMultiAgentVectorEnv([f, f], restart_policy=True),
    ),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_restart_policy_true_is_refused_before_any_env_is_built(entry):
    make, build = ENTRY_POINTS[entry]
    factory = _Counting(make)
    with pytest.raises(InvalidArgumentTypeError) as info:
        build(factory)
    message = str(info.value)
    assert "restart_policy=True" in message and "jr.RestartPolicy()" in message, message
    assert message.endswith("or None to let failures raise; got bool."), message
    assert factory.made == 0


@pytest.mark.parametrize("config", [{}, 0, "", 3])
def test_runner_group_refuses_a_config_that_is_not_one_falsy_or_not(config):
    # A falsy one ({}, 0, "") used to run with the default config, silently.
    with pytest.raises(InvalidArgumentError, match=r"expected an EnvRunnerGroupConfig"):
        jr.EnvRunnerGroup("CartPole-v1", lambda space: None, {}, config=config)

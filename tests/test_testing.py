"""jaxrunner.testing: the one fault injector, tree comparison, and its place in the API."""

from __future__ import annotations

import functools
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.testing import (
    CallLog,
    CountingEnv,
    DictObsEnv,
    FaultPlan,
    FaultyEnv,
    InjectedError,
    assert_trees_equal,
    counting_env_fns,
    faulty_env_fns,
)

AT = 3  # the planned call
NUM_CALLS = 5


def _first_key_dropped(obs: dict[str, Any]) -> dict[str, Any]:
    return dict(list(obs.items())[1:])


# What each garbage kind makes of a good step (obs, reward, terminated, truncated, info).
STEP_GARBAGE: dict[str, Callable[[tuple], tuple]] = {
    "nan_reward": lambda s: (s[0], float("nan"), *s[2:]),
    "inf_reward": lambda s: (s[0], float("inf"), *s[2:]),
    "array_reward": lambda s: (s[0], np.array([s[1], s[1]]), *s[2:]),
    "list_reward": lambda s: (s[0], [s[1], s[1]], *s[2:]),
    "flag_not_bool": lambda s: (*s[:2], int(s[2]), *s[3:]),
    "bad_obs": lambda s: (s[0][None], *s[1:]),
    "obs_dtype": lambda s: (s[0].astype(np.float64), *s[1:]),
    "info_not_dict": lambda s: (*s[:4], list(s[4].items())),
}
# ... and of a good reset (obs, info).
RESET_GARBAGE: dict[str, Callable[[tuple], tuple]] = {
    "bad_obs": lambda r: (r[0][None], r[1]),
    "obs_dtype": lambda r: (r[0].astype(np.float64), r[1]),
    "info_not_dict": lambda r: (r[0], list(r[1].items())),
}


def _pair(plan: FaultPlan, make: Callable[[], gymnasium.Env] = CountingEnv) -> tuple[Any, Any]:
    """A FaultyEnv with ``plan`` and an unwrapped twin, both reset with the same seed."""
    env, ref = FaultyEnv(make(), [plan]), make()
    for e in (env, ref):
        e.reset(seed=0)
        e.action_space.seed(0)
    return env, ref


@pytest.mark.parametrize("kind", sorted(STEP_GARBAGE))
def test_step_garbage_fires_at_the_planned_call_only(kind: str) -> None:
    env, ref = _pair(FaultPlan(kind=kind, at=(AT,)), lambda: CountingEnv(episode_length=20))
    for call in range(1, NUM_CALLS + 1):
        action = ref.action_space.sample()
        got, want = env.step(action), ref.step(action)
        if call == AT:
            want = STEP_GARBAGE[kind](want)
            assert type(got[1]) is type(want[1]) and type(got[4]) is type(want[4])
        assert_trees_equal(got, want, f"{kind}: step {call}")
    assert env.calls == {"step": NUM_CALLS, "reset": 1}


@pytest.mark.parametrize("kind", sorted(RESET_GARBAGE))
def test_reset_garbage_fires_at_the_planned_call_only(kind: str) -> None:
    env, ref = (
        FaultyEnv(CountingEnv(), [FaultPlan(kind=kind, call="reset", at=(AT,))]),
        CountingEnv(),
    )
    for call in range(1, NUM_CALLS + 1):
        got, want = env.reset(seed=call), ref.reset(seed=call)
        if call == AT:
            want = RESET_GARBAGE[kind](want)
        assert_trees_equal(got, want, f"{kind}: reset {call}")


@pytest.mark.parametrize("call", ["step", "reset"])
def test_obs_missing_key_drops_the_first_key(call: str) -> None:
    env, ref = _pair(FaultPlan(kind="obs_missing_key", call=call, at=(AT,)), DictObsEnv)
    # _pair made reset call 1: count the calls of the planned method from there.
    for number in range(1 + (call == "reset"), NUM_CALLS + 1):
        if call == "step":
            action = ref.action_space.sample()
            got, want = env.step(action), ref.step(action)
        else:
            got, want = env.reset(seed=number), ref.reset(seed=number)
        if number == AT:
            want = (_first_key_dropped(want[0]), *want[1:])
        assert_trees_equal(got, want, f"{call} {number}")


@pytest.mark.parametrize("call", ["step", "reset"])
@pytest.mark.parametrize("kind, match", [("raise", "injected failure"), ("hang", "hung for")])
def test_raise_and_hang_fail_before_the_inner_call(kind: str, call: str, match: str) -> None:
    plan = FaultPlan(kind=kind, call=call, at=(AT,), hang_s=0.01)
    env, ref = FaultyEnv(StepCounterEnv(), [plan]), StepCounterEnv()
    if call == "step":
        env.reset(seed=0), ref.reset(seed=0)
    for number in range(1, NUM_CALLS + 1):
        do = (lambda e: e.step(0)) if call == "step" else (lambda e, n=number: e.reset(seed=n))
        if number == AT:
            with pytest.raises(InjectedError, match=match):
                do(env)
            continue  # the inner env was not called: the twin skips it too
        assert_trees_equal(do(env), do(ref), f"{call} {number}")
    assert env.unwrapped.calls == ref.calls


class StepCounterEnv(CountingEnv):
    """A CountingEnv that counts its own step and reset calls."""

    def __init__(self) -> None:
        super().__init__(episode_length=20)
        self.calls = {"step": 0, "reset": 0}

    def reset(self, **kwargs: Any) -> Any:
        self.calls["reset"] += 1
        return super().reset(**kwargs)

    def step(self, action: Any) -> Any:
        self.calls["step"] += 1
        return super().step(action)


@pytest.mark.parametrize("kind, returncode", [("exit", 13), ("kill", -9), ("segfault", -11)])
def test_deadly_kinds_end_the_process_at_the_planned_call(kind: str, returncode: int) -> None:
    code = textwrap.dedent(f"""
        from jaxrunner.testing import CountingEnv, FaultPlan, FaultyEnv
        env = FaultyEnv(CountingEnv(episode_length=20), [FaultPlan(kind={kind!r}, at=({AT},))])
        env.reset(seed=0)
        for n in range(1, {NUM_CALLS + 1}):
            env.step(0)
            print("survived", n, flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == returncode, done.stderr
    assert done.stdout.split("\n")[:-1] == [f"survived {n}" for n in range(1, AT)]


def _draws(seed: int, instance: int, probability: float, num_calls: int) -> list[int]:
    """The calls a probabilistic fault hits, by the documented rule: one draw per call
    from ``default_rng([seed, instance])``."""
    rng = np.random.default_rng([seed, instance])
    return [n for n in range(1, num_calls + 1) if rng.random() < probability]


def _nan_steps(env: gymnasium.Env, num_calls: int) -> list[int]:
    env.reset(seed=0)
    return [n for n in range(1, num_calls + 1) if np.isnan(env.step(0)[1])]


def test_probability_mode_is_reproducible(tmp_path) -> None:
    plan = FaultPlan(kind="nan_reward", probability=0.3)
    made = [
        FaultyEnv(CountingEnv(episode_length=100), [plan], CallLog(tmp_path / log), seed=11)
        for log in ("a", "b", "b")
    ]
    hits = [_nan_steps(env, 60) for env in made]
    assert hits[0] == _draws(11, 0, 0.3, 60) and 5 < len(hits[0]) < 40
    assert hits[1] == hits[0]  # a fresh log: the same instance number, the same faults
    assert hits[2] == _draws(11, 1, 0.3, 60) != hits[0]  # the next instance draws anew
    log = CallLog(tmp_path / "a")
    assert (log.count("step_failed"), log.count("step_ok")) == (len(hits[0]), 60 - len(hits[0]))


def test_an_envs_draws_do_not_depend_on_the_other_envs_made_before_it(tmp_path) -> None:
    # Workers make their envs concurrently, in any order: env seed 11's faults must be
    # the same whether seed 12's env was made into the same log before it or not.
    plan = FaultPlan(kind="nan_reward", probability=0.3)
    alone = FaultyEnv(CountingEnv(episode_length=100), [plan], CallLog(tmp_path / "a"), seed=11)
    shared = CallLog(tmp_path / "b")
    FaultyEnv(CountingEnv(episode_length=100), [plan], shared, seed=12)
    after = FaultyEnv(CountingEnv(episode_length=100), [plan], shared, seed=11)
    assert _nan_steps(after, 60) == _nan_steps(alone, 60) == _draws(11, 0, 0.3, 60)
    assert shared.count("made") == 2


def test_a_run_without_a_log_is_the_same_run_again_in_the_same_process() -> None:
    # Without a log, instances were numbered per seed in the process: a second run (the
    # next test) drew other faults than the first, so tests depended on their order.
    plan = FaultPlan(kind="nan_reward", probability=0.3)
    base = functools.partial(CountingEnv, episode_length=100)
    runs = []
    for _ in range(2):
        (fn,) = faulty_env_fns(base, 1, [plan], seed=4)
        runs.append([_nan_steps(fn(), 60), _nan_steps(fn(), 60)])  # made, then recreated
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1]  # a recreated env still draws anew


def test_faulty_env_fns_per_env_faults_and_pickling() -> None:
    plan = FaultPlan(kind="raise", at=(1,))
    fns = pickle.loads(pickle.dumps(faulty_env_fns(counting_env_fns(3), faults={1: [plan]})))
    envs = [fn() for fn in fns]
    assert [env.unwrapped.env_id for env in envs] == [0, 1, 2]
    for i, env in enumerate(envs):
        env.reset(seed=i)
        if i == 1:
            with pytest.raises(InjectedError):
                env.step(0)
        else:
            env.step(0)
    same = faulty_env_fns(functools.partial(CountingEnv, env_id=7), 2, [plan])
    assert len(same) == 2 and all(fn().unwrapped.env_id == 7 for fn in same)
    with pytest.raises(InvalidArgumentError, match="num_envs"):
        faulty_env_fns(CountingEnv, faults=[plan])
    with pytest.raises(InvalidArgumentError, match="num_envs=2"):
        faulty_env_fns(counting_env_fns(3), 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kind": "explode"}, "expected one of"),
        ({"kind": "flag_not_bool", "call": "reset"}, "call='step'"),
        ({"call": "close"}, "expected 'step' or 'reset'"),
        ({"probability": -0.1}, r"in \[0, 1\]"),
        ({"at": (0,)}, "starting at 1"),
        ({"at": 3}, "a tuple of call numbers"),
    ],
)
def test_fault_plan_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        FaultPlan(**kwargs)


@pytest.mark.parametrize("at", [None, 3.0, ("3",), (1.5,), (True,)])
def test_fault_plan_refuses_call_numbers_that_are_not_ints(at: Any) -> None:
    # (1.5,) would never fire, and the others raised a raw TypeError.
    with pytest.raises(InvalidArgumentError, match=r"FaultPlan\(at=.*a tuple of call numbers"):
        FaultPlan(at=at)


@pytest.mark.parametrize("hang_s", [-1.0, "5", float("nan")])
def test_fault_plan_refuses_a_bad_hang_s_at_once(hang_s: Any) -> None:
    # Not at the hang, as a raw error from time.sleep in a worker.
    with pytest.raises(InvalidArgumentError, match=r"FaultPlan\(hang_s="):
        FaultPlan(kind="hang", at=(1,), hang_s=hang_s)


def test_fault_plan_takes_call_numbers_of_any_int_sequence() -> None:
    plan = FaultPlan(at=[np.int64(2), 3])
    assert plan.at == (2, 3) and hash(plan) == hash(FaultPlan(at=(2, 3)))


def test_fault_injectors_refuse_what_is_not_a_plan_or_a_factory() -> None:
    with pytest.raises(TypeError, match=r"FaultyEnv\(faults=...\): expected a list of .*FaultPlan"):
        FaultyEnv(CountingEnv(), FaultPlan())  # one plan, not a list of them
    with pytest.raises(TypeError, match=r"faulty_env_fns\(faults=...\): .* got an item 3"):
        faulty_env_fns(CountingEnv, 2, [FaultPlan(), 3])  # at once, not when an env is made
    with pytest.raises(TypeError, match=r"faulty_env_fns\(base=3\): expected a zero-argument"):
        faulty_env_fns(3, 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        # A fault for an env that is not there never fires: the test would pass vacuously.
        ({"faults": {2: [FaultPlan()]}}, r"faults=\{2: .*env indices 0 to 1"),
        ({"faults": {"1": [FaultPlan()]}}, r"faults=\{'1': .*env indices 0 to 1"),
        ({"num_envs": 0}, r"num_envs=0"),
        ({"seed": "x"}, r"seed='x'"),
        ({"log": "/tmp/log"}, r"log='/tmp/log'.*CallLog"),
    ],
)
def test_faulty_env_fns_refuses_bad_arguments_at_once(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises((InvalidArgumentError, TypeError), match=match):
        faulty_env_fns(**{"base": CountingEnv, "num_envs": 2, **kwargs})


def test_obs_missing_key_needs_dict_observations() -> None:
    env = FaultyEnv(CountingEnv(), [FaultPlan(kind="obs_missing_key", call="reset", at=(1,))])
    with pytest.raises(InvalidArgumentError, match="dict observations"):
        env.reset(seed=0)


def test_assert_trees_equal_names_the_difference() -> None:
    final = np.array([None, {"x": np.zeros(2)}], dtype=object)  # gymnasium's final_obs
    tree = ({"final_obs": final, "r": np.float32(1.0)}, [1, 2])
    same = ({"final_obs": final.copy(), "r": np.float32(1.0)}, (1, 2))
    assert_trees_equal(tree, same)
    for other in (
        ({"final_obs": final, "r": np.float64(1.0)}, [1, 2]),  # dtype
        ({"final_obs": np.array([None, {"x": np.ones(2)}], dtype=object), "r": 1.0}, [1, 2]),
        ({"final_obs": final, "r": np.float32(1.0)}, [1, 2, 3]),  # structure
    ):
        with pytest.raises(AssertionError, match=r"^step 4: "):
            assert_trees_equal(tree, other, "step 4")


def test_jr_testing_is_an_attribute_loaded_on_first_use() -> None:
    code = textwrap.dedent("""
        import sys
        import jaxrunner as jr
        assert "jaxrunner.testing" not in sys.modules, "imported eagerly"
        assert jr.testing.FaultyEnv.__name__ == "FaultyEnv"
        assert "testing" in jr.__all__
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert jr.testing.FaultPlan is FaultPlan


def test_pettingzoo_names_need_pettingzoo_and_are_the_modules_own() -> None:
    # With PettingZoo unimportable, jaxrunner.testing still imports; its PettingZoo
    # names say which extra to install.
    code = textwrap.dedent("""
        import sys
        sys.modules["pettingzoo"] = None  # as if it were not installed
        import jaxrunner as jr
        from jaxrunner.errors import MissingDependencyError
        assert jr.testing.FaultyEnv.__name__ == "FaultyEnv"
        assert "ComingAndGoing" in dir(jr.testing)
        try:
            jr.testing.ComingAndGoing
        except MissingDependencyError as err:
            print(err)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert 'needs PettingZoo: pip install "jaxrunner[multiagent]"' in done.stdout
    pytest.importorskip("pettingzoo")
    # With it, the names are the modules' own, and the deprecated ones are aliases.
    from jaxrunner._src.testing import contract, envs, faults

    assert jr.testing.ComingAndGoing is envs.ComingAndGoing
    assert jr.testing.FaultyParallelEnv is faults.FaultyParallelEnv
    assert jr.testing.faulty_multi_agent_env_fns is faults.faulty_env_fns
    assert jr.testing.FaultyMultiAgentEnv is FaultyEnv
    assert issubclass(jr.testing.MultiAgentVectorEnvContract, contract.VectorEnvContract)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        jr.testing.Nope  # noqa: B018

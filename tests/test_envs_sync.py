"""Tests for jaxrunner._src.backends.sync (backend="sync") and make_vec.

The backend must equal gymnasium's SyncVectorEnv with SAME_STEP autoreset step for step,
validate everything its sub-envs return, and name the sub-env at fault in every error.
"""

from __future__ import annotations

import functools
import itertools
import pickle
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any, ClassVar, NamedTuple

import gymnasium
import numpy as np
import pytest
from conftest import sample_checked_then_flagged
from gymnasium import spaces

import jaxrunner as jr
from jaxrunner._src.backends.gymnasium_block import GymnasiumBlock
from jaxrunner._src.backends.steps import StepBuffers
from jaxrunner._src.backends.sync import SyncMultiAgentVectorEnv
from jaxrunner.errors import (
    EnvError,
    EnvIndexError,
    InvalidActionError,
    InvalidArgumentError,
    InvalidStepError,
    JaxRunnerError,
    SpaceMismatchError,
)
from jaxrunner.testing import (
    CountingEnv,
    DictObsEnv,
    FaultPlan,
    FaultyEnv,
    InjectedError,
    VectorEnvContract,
    assert_trees_equal,
    counting_env_fns,
    faulty_env_fns,
    gymnasium_reference,
)
from tests.multi_agent_envs import (
    HOST_KINDS,
    ComingAndGoing,
    PettingZooCases,
    make_kind,
    zero_actions,
)

SEED = 2024
NUM_ENVS = 4


class TestSyncContract(PettingZooCases, VectorEnvContract):
    env_kinds = HOST_KINDS

    def make_vec(self, env_fns: Sequence[Callable[[], Any]], restart_policy=None) -> Any:
        if self.kind == "gymnasium":
            return jr.SyncVectorEnv(env_fns, restart_policy=restart_policy)
        return SyncMultiAgentVectorEnv(env_fns, restart_policy=restart_policy)


class _IgnoresResetBatchSeeds:
    """A broken backend: ``reset_batch`` resets every sub-env unseeded."""

    def reset_batch(self, seeds: Sequence[int | None], options: Any = None) -> Any:
        return super().reset_batch([None] * len(seeds), options)  # type: ignore[misc]


@pytest.mark.parametrize("kind", HOST_KINDS)
def test_the_seeds_contract_test_fails_a_backend_that_ignores_the_seeds(kind: str) -> None:
    # Relay's reset returns the same observations for every seed: the test passed on AEC.
    class Broken(TestSyncContract):
        def make_vec(self, env_fns: Sequence[Callable[[], Any]], restart_policy=None) -> Any:
            base = jr.SyncVectorEnv if self.kind == "gymnasium" else SyncMultiAgentVectorEnv
            cls = type("Broken", (_IgnoresResetBatchSeeds, base), {})
            return cls(env_fns, restart_policy=restart_policy)

    with pytest.raises(AssertionError):
        Broken().test_reset_batch_seeds_sub_env_i_with_seeds_i(kind)


class _DropsUnassignedRewards:
    """A broken backend: every step reports no unassigned reward."""

    def step_batch(self, actions: Any, rows: slice | None = None) -> Any:
        out = super().step_batch(actions, rows)  # type: ignore[misc]
        out.unassigned_reward[:] = 0.0
        return out


def test_the_parity_contract_test_fails_a_backend_that_drops_unassigned_rewards() -> None:
    """Resign's p1 gets +1 and never acts when p0 resigns: a reward no transition carries.
    The contract read no ``unassigned_reward``, so a backend that dropped it passed (and
    runners on it reported ``get_metrics()["unassigned_reward"]`` 0)."""
    from tests.test_multi_agent_aec import resign

    class WithResign(TestSyncContract):
        def env_cases(self) -> dict[str, Any]:
            return {"resign": resign}

    class Broken(WithResign):
        def make_vec(self, env_fns: Sequence[Callable[[], Any]], restart_policy=None) -> Any:
            cls = type("Broken", (_DropsUnassignedRewards, SyncMultiAgentVectorEnv), {})
            return cls(env_fns, restart_policy=restart_policy)

    WithResign().test_step_for_step_equal_to_the_envs_stepped_by_hand("aec")  # sync: right
    with pytest.raises(AssertionError, match=r"unassigned_reward 0\.0, by hand 1\.0"):
        Broken().test_step_for_step_equal_to_the_envs_stepped_by_hand("aec")


# -- parity with gymnasium ------------------------------------------------------------------------


class ParityCase(NamedTuple):
    env: str | Callable[[], gymnasium.Env]
    kwargs: dict[str, Any]
    sample: Callable[[np.random.Generator, int], np.ndarray]
    expect_truncation: bool


def _discrete(n: int) -> Callable[[np.random.Generator, int], np.ndarray]:
    return lambda rng, num_envs: rng.integers(0, n, size=num_envs)


def _box(low: float, high: float, dim: int) -> Callable[[np.random.Generator, int], np.ndarray]:
    return lambda rng, num_envs: rng.uniform(low, high, (num_envs, dim)).astype(np.float32)


class ScalarObsEnv(gymnasium.Env):
    """A random walk whose observation is a shape-() Box returned as a numpy scalar (not
    an array): the writer's fallback beside the array fast path."""

    observation_space = spaces.Box(-3.0, 3.0, shape=(), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.x = np.float32(self.np_random.uniform(-0.5, 0.5))
        return self.x, {}

    def step(self, action: Any) -> tuple:
        self.x = np.float32(self.x + (0.5 if action else -0.5))
        return self.x, float(self.x), bool(abs(self.x) > 2.0), False, {}


PARITY_CASES = {
    "cartpole": ParityCase("CartPole-v1", {"max_episode_steps": 20}, _discrete(2), True),
    "pendulum": ParityCase("Pendulum-v1", {}, _box(-2.0, 2.0, 1), True),
    "frozenlake": ParityCase("FrozenLake-v1", {"is_slippery": True}, _discrete(4), False),
    "dict_obs": ParityCase(functools.partial(DictObsEnv, max_steps=25), {}, _box(-1, 1, 2), True),
    "scalar_obs": ParityCase(ScalarObsEnv, {}, _discrete(2), False),
}


@pytest.mark.parametrize("case", PARITY_CASES.values(), ids=PARITY_CASES.keys())
def test_step_for_step_equal_to_gymnasium(case: ParityCase) -> None:
    if isinstance(case.env, str):
        factory = functools.partial(gymnasium.make, case.env, **case.kwargs)
    else:
        factory = case.env
    rng = np.random.default_rng(SEED)
    with (
        closing(jr.make_vec(case.env, NUM_ENVS, **case.kwargs)) as vec,
        closing(gymnasium_reference([factory] * NUM_ENVS)) as ref,
    ):
        assert isinstance(vec, jr.SyncVectorEnv)
        assert_trees_equal(vec.reset(seed=SEED), ref.reset(seed=SEED), "reset")
        terminations = truncations = 0
        for t in range(300):
            actions = case.sample(rng, NUM_ENVS)
            expected = ref.step(actions)
            got = vec.step(actions)
            # Compares obs, rewards, flags and the whole info, final_obs/final_info included.
            assert_trees_equal(got, expected, f"step {t}")
            terminations += int(expected[2].sum())
            truncations += int(expected[3].sum())
        assert terminations + truncations > 0
        assert truncations > 0 or not case.expect_truncation


def test_make_vec_seed_resets_like_gymnasium() -> None:
    factory = functools.partial(gymnasium.make, "CartPole-v1", max_episode_steps=20)
    rng = np.random.default_rng(SEED)
    with (
        closing(jr.make_vec(factory, 3, seed=SEED)) as vec,
        closing(gymnasium_reference([factory] * 3)) as ref,
    ):
        ref.reset(seed=SEED)
        for t in range(30):
            actions = rng.integers(0, 2, size=3)
            assert_trees_equal(vec.step(actions), ref.step(actions), f"step {t}")


def test_reset_mask_resets_only_masked_envs_like_gymnasium() -> None:
    fns = counting_env_fns(3)
    with closing(jr.SyncVectorEnv(fns)) as vec, closing(gymnasium_reference(fns)) as ref:
        vec.reset(seed=SEED)
        ref.reset(seed=SEED)
        actions = np.ones(3, dtype=np.int64)
        vec.step(actions)
        ref.step(actions)
        mask = np.array([True, False, True])
        assert_trees_equal(
            vec.reset(options={"reset_mask": mask.copy()}),
            ref.reset(options={"reset_mask": mask.copy()}),
        )


# -- arguments ------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_envs", [0, -1, 1.5, True, "2", None])
def test_make_vec_rejects_bad_num_envs(num_envs: Any) -> None:
    with pytest.raises(ValueError, match=r"num_envs"):
        jr.make_vec(CountingEnv, num_envs)


def test_make_vec_rejects_kwargs_with_a_callable() -> None:
    with pytest.raises(TypeError, match=r"episode_length=.*functools.partial"):
        jr.make_vec(CountingEnv, 2, episode_length=3)


def test_make_vec_rejects_unknown_backend() -> None:
    with pytest.raises(ValueError, match=r"backend='nope'.*'sync'"):
        jr.make_vec(CountingEnv, 2, backend="nope")


@pytest.mark.parametrize("env", [42, None, CountingEnv()])
def test_make_vec_rejects_non_callable_env(env: Any) -> None:
    with pytest.raises(TypeError, match=r"gymnasium id .* zero-argument callable"):
        jr.make_vec(env, 2)


@pytest.mark.parametrize("backend", ["sync", "process", "auto"])
def test_make_vec_takes_one_factory_per_sub_env(backend: str) -> None:
    """CleanRL's ``[make_env(env_id, i, ...) for i in range(n)]``: sub-env ``i`` is built by
    the ``i``-th factory, and rebuilt by it when it restarts."""
    fns = faulty_env_fns(
        [functools.partial(CountingEnv, env_id=10 + i, episode_length=2 + i) for i in range(3)],
        faults={1: [FaultPlan(kind="raise", at=(5,))]},  # each instance fails once
    )
    policy = jr.RestartPolicy()
    with closing(jr.make_vec(fns, 3, backend, seed=0, restart_policy=policy)) as envs:
        first = envs.reset(seed=0)[0]
        assert first[:, CountingEnv.ENV_ID].tolist() == [10, 11, 12]
        lengths: dict[int, set[int]] = {10: set(), 11: set(), 12: set()}
        obs = first
        for _ in range(12):
            before = obs
            obs, _, terminated, _, _ = envs.step(np.zeros(3, dtype=np.int64))
            for i in np.flatnonzero(terminated):
                lengths[int(before[i, CountingEnv.ENV_ID])].add(int(before[i, CountingEnv.T]) + 1)
        assert envs.num_restarts == 2  # at steps 5 and 10
        assert obs[:, CountingEnv.ENV_ID].tolist() == [10, 11, 12]  # env 1 restarted as itself
        assert lengths == {10: {2}, 11: {3}, 12: {4}}


def test_make_vec_refuses_a_list_it_cannot_use() -> None:
    fns = [CountingEnv, CountingEnv]
    with pytest.raises(ValueError, match=r"2 factories for 3 sub-envs"):
        jr.make_vec(fns, 3)
    with pytest.raises(TypeError, match=r"env\[1\] is a int"):
        jr.make_vec([CountingEnv, 7], 2)
    with pytest.raises(TypeError, match=r"from_gymnasium"):
        jr.make_vec(fns, 2, backend="gymnasium")


class _WorkersEnv(CountingEnv):
    """An env whose own constructor takes ``num_workers`` (a ProcessConfig field too)."""

    def __init__(self, num_workers: int = 1) -> None:
        super().__init__(env_id=num_workers)


# Registered on import: a worker process imports this module by the id's prefix.
gymnasium.register("JaxrunnerTestWorkersEnv-v0", entry_point=_WorkersEnv, disable_env_checker=True)
WORKERS_ENV_ID = f"{__name__}:JaxrunnerTestWorkersEnv-v0"


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_make_vec_passes_env_kwargs_named_like_backend_options_to_the_env(backend: str) -> None:
    config = jr.ProcessConfig(num_workers=1) if backend == "process" else None
    with closing(
        jr.make_vec(WORKERS_ENV_ID, 3, backend, SEED, config=config, num_workers=7)
    ) as vec:
        assert vec.get_attr("env_id") == (7, 7, 7)  # the env got it
        if backend == "process":
            assert vec.num_workers == 1  # the backend did not


def test_make_vec_explains_a_backend_option_given_as_an_env_kwarg() -> None:
    hint = r"refused 'envs_per_worker'.*config=jaxrunner.ProcessConfig\(envs_per_worker=...\)"
    with pytest.raises(EnvError, match=hint) as info:  # raised by the factory, in a worker
        jr.make_vec("CartPole-v1", 2, backend="process", envs_per_worker=1)
    assert isinstance(info.value.__cause__, jr.errors.InvalidArgumentTypeError)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'envs_per_worker'") as info:
        jr.make_vec("CartPole-v1", 2, envs_per_worker=1)  # no option of the sync backend
    assert not isinstance(info.value, jr.errors.JaxRunnerError)  # gymnasium.make's own


def test_make_vec_checks_config_and_restart_policy_against_the_backend() -> None:
    with pytest.raises(TypeError, match=r"backend='sync', config=.*expected no config"):
        jr.make_vec(CountingEnv, 2, config=jr.ProcessConfig())
    with pytest.raises(TypeError, match=r"expected a jaxrunner.RayConfig, got ProcessConfig"):
        jr.make_vec(CountingEnv, 2, backend="ray", config=jr.ProcessConfig())
    with pytest.raises(ValueError, match=r"gymnasium backend cannot restart.*backend='sync'"):
        jr.make_vec("CartPole-v1", 2, backend="gymnasium", restart_policy=jr.RestartPolicy())
    policy = jr.RestartPolicy(max_attempts=2)
    with closing(jr.make_vec(CountingEnv, 2, restart_policy=policy)) as vec:
        assert vec.restart_policy is policy and vec.capabilities.can_restart


def test_make_vec_passes_kwargs_to_gymnasium_make() -> None:
    with closing(jr.make_vec("CartPole-v1", 2, max_episode_steps=3)) as vec:
        vec.reset(seed=SEED)
        for _ in range(3):
            _, _, terminated, truncated, _ = vec.step(np.array([0, 1]))
        np.testing.assert_array_equal(truncated & ~terminated, [True, True])


def test_sync_vector_env_needs_an_env() -> None:
    with pytest.raises(ValueError, match=r"at least one"):
        jr.SyncVectorEnv([])


def _failing_factory() -> gymnasium.Env:
    raise InjectedError("factory failed")


@pytest.mark.parametrize("failing", [0, 2])
@pytest.mark.parametrize("kind", ["gymnasium", "pettingzoo"])
def test_make_vec_names_the_sub_env_whose_factory_raised(kind: str, failing: int) -> None:
    # Sub-env 0 is built first, to read the env's kind: its error is named as the others'.
    if kind == "pettingzoo":
        pytest.importorskip("pettingzoo")
    ok = CountingEnv if kind == "gymnasium" else ComingAndGoing
    fns = [_failing_factory if i == failing else ok for i in range(3)]
    with pytest.raises(EnvError, match=rf"sub-env {failing} raised in factory\(\)") as excinfo:
        jr.make_vec(fns, 3, backend="sync")
    assert excinfo.value.env_index == failing
    assert isinstance(excinfo.value.__cause__, InjectedError)


def test_reset_seed_list() -> None:
    with closing(jr.SyncVectorEnv(counting_env_fns(3))) as vec:
        obs, _ = vec.reset(seed=[9, 4, 1])
        np.testing.assert_array_equal(obs[:, CountingEnv.SEED], [9, 4, 1])
        with pytest.raises(ValueError, match=r"num_envs=3.*got 2"):
            vec.reset(seed=[1, 2])
        # Refused by name before any sub-env resets, not by gymnasium inside one.
        with pytest.raises(ValueError, match=r"num_envs=3.*got 1.5 \(float\)"):
            vec.reset(seed=[1, 1.5, 2])
        with pytest.raises(ValueError, match=r"reset\(seed=-1\): expected an int >= 0"):
            vec.reset(seed=-1)
        for seed in (2.0, True, "abc"):
            with pytest.raises(TypeError, match=r"reset\(seed=.*: expected an int >= 0"):
                vec.reset(seed=seed)
        assert vec.get_attr("episode") == (0, 0, 0)  # the first reset only


@pytest.mark.parametrize(
    "call",
    [
        lambda: jr.make_vec(CountingEnv, 0),
        lambda: jr.make_vec(CountingEnv, 2, backend="nope"),
        lambda: jr.make_vec(42, 2),
        lambda: jr.make_vec(CountingEnv, 3).reset(seed=[1, 2]),
    ],
    ids=["num_envs", "backend", "env", "seed_list"],
)
def test_argument_errors_are_jaxrunner_errors(call: Callable[[], Any]) -> None:
    with pytest.raises(JaxRunnerError):
        call()


def test_reset_at_rejects_bad_index() -> None:
    with closing(jr.SyncVectorEnv(counting_env_fns(2))) as vec:
        vec.reset(seed=SEED)
        for index in (-1, 2):
            with pytest.raises(IndexError, match=r"\[0, 2\)"):
                vec.reset_at(index)


# -- spaces ------------------------------------------------------------------------------------


def _recording(made: list[gymnasium.Env], factory: Callable[[], gymnasium.Env]) -> Callable:
    def make() -> gymnasium.Env:
        env = factory()
        made.append(env)
        return env

    return make


@pytest.mark.parametrize(
    "odd, name",
    [
        (DictObsEnv, "observation_space"),
        (functools.partial(CountingEnv, num_actions=4), "action_space"),
    ],
)
def test_sub_envs_with_different_spaces(odd: Callable[[], gymnasium.Env], name: str) -> None:
    made: list[gymnasium.Env] = []
    fns = [_recording(made, CountingEnv)] * 2 + [_recording(made, odd)]
    with pytest.raises(SpaceMismatchError, match=rf"sub-env 2 has {name}=") as excinfo:
        jr.SyncVectorEnv(fns)
    assert isinstance(excinfo.value, ValueError)
    assert all(env.unwrapped.is_closed for env in made)


class _OtherSpaces(ComingAndGoing):
    """ComingAndGoing whose agents observe float64, or have 4 actions."""

    closed: ClassVar[list[str]] = []

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        if name == "observation_space":
            self._obs_space = spaces.Box(-np.inf, np.inf, (3,), np.float64)
        else:
            self._act_space = spaces.Discrete(4)

    def close(self) -> None:
        _OtherSpaces.closed.append(self.name)


@pytest.mark.parametrize("name", ["observation_space", "action_space"])
def test_multi_agent_sub_envs_with_different_spaces(name: str) -> None:
    # As the single-agent sub-envs above (and the process and Ray backends' multi-agent ones).
    pytest.importorskip("pettingzoo")
    _OtherSpaces.closed.clear()
    fns = [ComingAndGoing] * 2 + [functools.partial(_OtherSpaces, name)]
    with pytest.raises(SpaceMismatchError, match=rf"sub-env 2 has {name}\('a0'\)=") as excinfo:
        SyncMultiAgentVectorEnv(fns)
    assert isinstance(excinfo.value, ValueError)
    assert _OtherSpaces.closed == [name]


@pytest.mark.parametrize("name", ["observation_space", "action_space"])
@pytest.mark.parametrize("backend", ["sync", "process"])
def test_a_restarted_sub_env_with_other_spaces_is_refused(backend: str, name: str) -> None:
    # As a multi-agent restart is (AgentBlock._check_agents): the step loop's buffers and
    # the policy were made for the first spaces.
    made = itertools.count()

    def flaky() -> gymnasium.Env:  # the first fails at its 2nd step, each new one differs
        if next(made) == 0:
            return FaultyEnv(CountingEnv(), [FaultPlan(call="step", at=(2,))])
        return DictObsEnv() if name == "observation_space" else CountingEnv(num_actions=7)

    policy = jr.RestartPolicy(max_attempts=2, backoff_s=0.0)
    envs = jr.make_vec([CountingEnv, flaky], 2, backend=backend, restart_policy=policy)
    match = rf"sub-env 1 failed .*could not be recreated: .*recreated with {name}="
    with closing(envs), pytest.raises(EnvError, match=match):
        envs.reset(seed=0)
        for _ in range(3):
            envs.step(np.zeros(2, np.int64))


class TextObsEnv(CountingEnv):
    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Text(8)


class TextActionEnv(CountingEnv):
    def __init__(self) -> None:
        super().__init__()
        self.action_space = spaces.Text(8)


@pytest.mark.parametrize(
    "env, where",
    [(TextObsEnv, "single_observation_space"), (TextActionEnv, "single_action_space")],
)
def test_unsupported_space(env: Callable[[], gymnasium.Env], where: str) -> None:
    with pytest.raises(SpaceMismatchError, match=rf"{where} is a Text.*supported spaces are"):
        jr.make_vec(env, 2)


def test_unsupported_space_closes_sub_envs() -> None:
    made: list[gymnasium.Env] = []
    # Keep the exception (as a caller logging it would): until it is freed, its traceback
    # keeps the half-built vector env alive, so VectorEnv.__del__ cannot close the envs.
    with pytest.raises(SpaceMismatchError) as excinfo:
        jr.SyncVectorEnv([_recording(made, TextObsEnv)] * 2)
    assert all(env.is_closed for env in made), excinfo.value


def test_failing_factory_closes_envs_built_so_far() -> None:
    made: list[gymnasium.Env] = []

    def broken() -> gymnasium.Env:
        raise InjectedError("factory failed")

    with pytest.raises(EnvError, match=r"sub-env 2 raised in factory\(\)") as info:
        jr.SyncVectorEnv([_recording(made, CountingEnv)] * 2 + [broken])
    assert isinstance(info.value.__cause__, InjectedError)
    assert len(made) == 2 and all(env.is_closed for env in made)


# -- bad input from sub-envs ----------------------------------------------------------------------

BAD_INDEX = 1


class BadCase(NamedTuple):
    fault: str
    call: str
    at: int
    dict_obs: bool
    error: type[JaxRunnerError]
    builtin: type[Exception]
    match: str


BAD_CASES = [
    BadCase("nan_reward", "step", 1, False, InvalidStepError, ValueError, "non-finite reward"),
    BadCase("inf_reward", "step", 2, False, InvalidStepError, ValueError, "non-finite reward"),
    BadCase("array_reward", "step", 1, False, InvalidStepError, ValueError, "reward of type"),
    BadCase("list_reward", "step", 1, False, InvalidStepError, ValueError, "reward of type list"),
    BadCase("flag_not_bool", "step", 1, False, InvalidStepError, ValueError, "terminated=0"),
    BadCase("info_not_dict", "step", 2, False, InvalidStepError, ValueError, "from step()"),
    BadCase("info_not_dict", "reset", 1, False, InvalidStepError, ValueError, "from reset()"),
    # The second reset is the autoreset inside step().
    BadCase("info_not_dict", "reset", 2, False, InvalidStepError, ValueError, "from reset()"),
    BadCase("obs_dtype", "step", 1, False, SpaceMismatchError, ValueError, "dtype float64"),
    BadCase("obs_dtype", "reset", 1, False, SpaceMismatchError, ValueError, "dtype float64"),
    BadCase("bad_obs", "step", 2, False, SpaceMismatchError, ValueError, r"shape \(1, 5\)"),
    BadCase("obs_dtype", "step", 1, True, SpaceMismatchError, ValueError, r"obs\['pos'\]"),
    BadCase("obs_missing_key", "step", 1, True, SpaceMismatchError, ValueError, "with keys"),
    BadCase("obs_missing_key", "reset", 1, True, SpaceMismatchError, ValueError, "with keys"),
    BadCase("raise", "step", 2, False, EnvError, RuntimeError, r"raised in step\(\)"),
    BadCase("raise", "reset", 1, False, EnvError, RuntimeError, r"raised in reset\(\)"),
    BadCase("raise", "reset", 2, False, EnvError, RuntimeError, r"raised in reset\(\)"),
]


@pytest.mark.parametrize(
    "case",
    BAD_CASES,
    ids=[f"{c.fault}-{c.call}{c.at}-{'dict' if c.dict_obs else 'box'}" for c in BAD_CASES],
)
def test_bad_sub_env_output_raises(case: BadCase) -> None:
    if case.dict_obs:
        base = [functools.partial(DictObsEnv, max_steps=2)] * 3
        actions = np.zeros((3, 2), dtype=np.float32)
    else:
        base = counting_env_fns(3, episode_length=2)
        actions = np.zeros(3, dtype=np.int64)
    plan = FaultPlan(kind=case.fault, call=case.call, at=(case.at,))
    fns = faulty_env_fns(base, faults={BAD_INDEX: [plan]})
    with (
        closing(jr.SyncVectorEnv(fns)) as vec,
        pytest.raises(case.error, match=case.match) as excinfo,
    ):
        vec.reset(seed=SEED)
        for _ in range(4):
            vec.step(actions)
    err = excinfo.value
    assert isinstance(err, case.builtin)
    assert f"sub-env {BAD_INDEX} " in str(err)
    if case.error is EnvError:
        assert err.env_index == BAD_INDEX
        assert isinstance(err.__cause__, InjectedError)


def test_fault_plan_rejects_reward_faults_in_reset() -> None:
    with pytest.raises(ValueError, match=r"call='step'"):
        FaultPlan(kind="nan_reward", call="reset")
    with pytest.raises(ValueError, match=r"expected one of"):
        FaultPlan(kind="typo")  # type: ignore[arg-type]


# -- the rest of gymnasium's VectorEnv API ---------------------------------------------------------


@pytest.mark.parametrize("render_mode", ["ansi", "rgb_array"])
def test_render(render_mode: str) -> None:
    with closing(jr.make_vec(functools.partial(CountingEnv, render_mode=render_mode), 2)) as vec:
        assert vec.render_mode == render_mode
        vec.reset(seed=SEED)
        vec.step(np.zeros(2, dtype=np.int64))
        frames = vec.render()
        assert isinstance(frames, tuple) and len(frames) == 2
        if render_mode == "ansi":
            assert frames == ("env 0 episode 0 t 1",) * 2
        else:
            np.testing.assert_array_equal(frames[1], np.ones((4, 4, 3), dtype=np.uint8))


def test_get_sub_environments() -> None:
    with closing(jr.SyncVectorEnv(counting_env_fns(3))) as vec:
        envs = vec.get_sub_environments()
        assert [env.env_id for env in envs] == [0, 1, 2]
        envs.clear()  # a new list each call: the vector env keeps its own
        assert len(vec.get_sub_environments()) == 3


def test_get_sub_environments_after_a_restart_holds_the_new_sub_env() -> None:
    # In-process entries are the env objects of the moment: a restart closes the old
    # one, and a new call returns its successor (a remote backend's handle follows it).
    plan = FaultPlan(kind="raise", call="step", at=(1,))
    fns = faulty_env_fns(counting_env_fns(2), faults={1: [plan]})
    with closing(jr.SyncVectorEnv(fns, restart_policy=jr.RestartPolicy())) as vec:
        vec.reset(seed=SEED)
        before = vec.get_sub_environments()
        out = vec.step_batch(np.zeros(2, dtype=np.int64))
        assert out.failed is not None and out.failed.tolist() == [False, True]
        after = vec.get_sub_environments()
        assert after[0] is before[0] and after[1] is not before[1]
        assert before[1].get_wrapper_attr("is_closed")
        assert not after[1].get_wrapper_attr("is_closed")


def test_call_get_attr_set_attr() -> None:
    # TimeLimit wrappers in between: attributes are found through them.
    with closing(jr.SyncVectorEnv(counting_env_fns(3, max_episode_steps=10))) as vec:
        assert vec.call("get_wrapper_attr", "env_id") == (0, 1, 2)
        assert vec.call("episode_length") == (3, 4, 5)  # a plain attribute is returned
        assert vec.get_attr("episode_length") == (3, 4, 5)
        vec.set_attr("episode_length", 1)
        assert vec.get_attr("episode_length") == (1, 1, 1)
        vec.set_attr("episode_length", [2, 1, 2])
        assert vec.get_attr("episode_length") == (2, 1, 2)
        with pytest.raises(ValueError, match=r"one value per sub-env \(3\), got 2"):
            vec.set_attr("episode_length", [1, 2])
        vec.reset(seed=SEED)
        _, _, terminated, _, _ = vec.step(np.zeros(3, dtype=np.int64))
        np.testing.assert_array_equal(terminated, [False, True, False])


def test_step_returns_copies_unless_copy_false() -> None:
    actions = np.zeros(2, dtype=np.int64)
    with closing(jr.SyncVectorEnv(counting_env_fns(2))) as vec:
        first, _ = vec.reset(seed=SEED)
        kept = first.copy()
        vec.step(actions)
        np.testing.assert_array_equal(first, kept)
    with closing(jr.SyncVectorEnv(counting_env_fns(2), copy=False)) as vec:
        first, _ = vec.reset(seed=SEED)
        second, *_ = vec.step(actions)
        assert second is first  # the buffer itself, overwritten in place


def test_observations_of_a_pickled_space_are_written_in_one_block() -> None:
    """A process worker's spaces arrive pickled, holding copies of numpy's dtypes; the
    step loop must still take its fast path (one block write, no per-row writer) and
    write what gymnasium's own envs return."""
    num_envs = 3
    envs = [gymnasium.make("CartPole-v1") for _ in range(num_envs)]
    reference = [gymnasium.make("CartPole-v1") for _ in range(num_envs)]
    space = pickle.loads(pickle.dumps(envs[0].observation_space))
    buffers = StepBuffers(space, num_envs)
    loop = GymnasiumBlock(envs, [None] * num_envs, 0, buffers, space, None)
    loop.reset(list(range(num_envs)), None)
    for i, env in enumerate(reference):
        env.reset(seed=i)
    per_row = []
    loop.write_next_obs = lambda i, obs: per_row.append(i)
    for step in range(30):
        actions = [np.int64((step + i) % 2) for i in range(num_envs)]
        loop.step(0, num_envs, actions)
        for i, env in enumerate(reference):
            obs, reward, terminated, truncated, _ = env.step(actions[i])
            np.testing.assert_array_equal(loop.buffers.next_obs[i], obs)
            assert (loop.buffers.reward[i], loop.buffers.terminated[i]) == (reward, terminated)
            if terminated or truncated:
                env.reset()
    assert per_row == []


class _EzCounter(gymnasium.Env, gymnasium.utils.EzPickle):
    """An env pickled by its constructor arguments (gymnasium's EzPickle, as MuJoCo and
    Box2D envs are), whose state is a step count and an rng."""

    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, scale: float = 1.0) -> None:
        gymnasium.utils.EzPickle.__init__(self, scale)
        self.scale, self.t = scale, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.t, self.np_random.uniform()]), {}

    def step(self, action):
        self.t += 1
        obs = np.array([self.t * self.scale, self.np_random.uniform()])
        return obs, float(action), False, self.t >= 50, {}


def test_snapshots_keep_the_state_of_ezpickle_envs():
    # A plain pickle of an EzPickle env rebuilds it from its constructor: a new env,
    # silently losing its step count and rng.
    envs = jr.SyncVectorEnv([_EzCounter, _EzCounter])
    envs.reset(seed=3)
    for _ in range(5):
        envs.step(np.array([1, 0]))
    snapshots = envs.snapshot_sub_envs()
    again = jr.SyncVectorEnv([_EzCounter, _EzCounter])
    again.reset(seed=99)
    again.restore_sub_envs(snapshots)
    for _ in range(3):
        want, got = envs.step(np.array([0, 1])), again.step(np.array([0, 1]))
        np.testing.assert_array_equal(got[0], want[0])
    assert again.get_attr("t") == (8, 8)
    envs.close()
    again.close()


# -- either kind of env alike ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sync", "process"])
@pytest.mark.parametrize("kind", HOST_KINDS)
def test_send_refuses_env_ids_that_are_no_block_and_loses_nothing(kind: str, backend: str) -> None:
    # Refused at send, as on every backend and kind: a step-2 slice once stepped the whole
    # block on the single-agent sync backend.
    with closing(make_kind(kind, 3, backend, seed=SEED)) as vec:
        vec.send(zero_actions(vec, 3))
        for env_ids in (slice(0, 3, 2), slice(2, 1), [0, 1], np.arange(2)):
            with pytest.raises(InvalidArgumentError, match=r"send\(env_ids=.*step 1 within"):
                vec.send(zero_actions(vec, 2), env_ids)
        assert vec.recv().env_ids in (None, slice(0, 3))  # the earlier send's results
        with pytest.raises(InvalidArgumentError, match=r"no send\(\) is waiting"):
            vec.recv()


@pytest.mark.parametrize("kind", HOST_KINDS)
def test_env_ids_slices_are_taken_as_python_slices(kind: str) -> None:
    with closing(make_kind(kind, 3, seed=SEED)) as vec:
        assert vec.step_batch(zero_actions(vec, 2), slice(-2, None)).env_ids == slice(1, 3)
        out = vec.step_batch(zero_actions(vec, 3), slice(None))
        assert out.env_ids in (None, slice(0, 3))


@pytest.mark.parametrize("backend", ["sync", "process"])
@pytest.mark.parametrize("kind", HOST_KINDS)
def test_reset_at_and_reset_refuse_bad_arguments_before_any_sub_env_resets(kind, backend):
    with closing(make_kind(kind, 3, backend, seed=SEED)) as vec:
        episodes = vec.get_attr("episode")
        for index in (3, -1, "a"):
            with pytest.raises(EnvIndexError, match=rf"reset_at\(index={index!r}\): index must"):
                vec.reset_at(index)
        for seed in (-1, 1.5, True):
            with pytest.raises(
                InvalidArgumentError, match=r"reset_at\(seed=.*expected an int >= 0"
            ):
                vec.reset_at(0, seed=seed)  # gymnasium's own refusal, inside sub-env 0, before
        calls = [lambda: vec.reset_at(0, options=3)]
        if isinstance(vec, jr.VectorEnv):  # a multi-agent vector env's reset is reset_batch
            calls.append(lambda: vec.reset(options=3))
        for call in calls:
            with pytest.raises(TypeError, match=r"\(options=3\): expected a dict, or None"):
                call()
        assert vec.get_attr("episode") == episodes  # no sub-env was reset


class NoSpaces(gymnasium.Env):
    """Steps, but never set its spaces."""

    def reset(self, *, seed=None, options=None):
        return np.zeros(3), {}

    def step(self, action):
        return np.zeros(3), 0.0, False, False, {}


class BrokenSpace(NoSpaces):
    action_space = gymnasium.spaces.Discrete(2)

    @property
    def observation_space(self):
        return self.no_such_attribute  # an AttributeError of the env's own


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_a_sub_env_without_spaces_is_named(backend: str) -> None:
    fns = [functools.partial(CountingEnv, 0), NoSpaces]
    with pytest.raises(
        SpaceMismatchError, match=r"sub-env 1 \(NoSpaces\) has no observation_space"
    ):
        jr.make_vec(fns, 2, backend=backend)  # AttributeError, from inside the backend, before
    with pytest.raises(AttributeError, match="no_such_attribute"):  # the env's own, as it is
        jr.make_vec([BrokenSpace], 1, backend="sync")


@pytest.mark.parametrize("backend", ["sync", "process"])
@pytest.mark.parametrize("kind", HOST_KINDS)
def test_reset_batch_refuses_a_seed_count_other_than_num_envs(kind: str, backend: str) -> None:
    # A multi-agent env's one reset, as a single-agent env's reset(seed=[...]) does: it
    # reset a prefix of the sub-envs (too few) or failed in a sub-env (too many).
    with closing(make_kind(kind, 3, backend, seed=SEED)) as vec:
        episodes = vec.get_attr("episode")
        for seeds in ([1, 2], [1, 2, 3, 4], 3, None, [1, 2.5, 3], [1, -2, 3], [1, True, 3]):
            with pytest.raises(InvalidArgumentError, match=r"reset_batch\(seeds=.*one seed per"):
                vec.reset_batch(seeds)
        assert vec.get_attr("episode") == episodes  # no sub-env was reset
        vec.reset_batch([1, 2, 3])
        assert vec.get_attr("episode") == tuple(e + 1 for e in episodes)


@pytest.mark.parametrize("backend", ["sync", "process"])
@pytest.mark.parametrize("kind", HOST_KINDS)
def test_reset_batch_drops_the_sends_not_yet_received(kind: str, backend: str) -> None:
    # Their actions were chosen for the episodes the reset ends: none steps a new one.
    with closing(make_kind(kind, 3, backend, seed=SEED)) as vec:
        vec.send(zero_actions(vec, 3))
        vec.reset_batch([1, 2, 3])
        with pytest.raises(InvalidArgumentError, match=r"recv\(\): no send\(\) is waiting"):
            vec.recv()
        vec.send(zero_actions(vec, 3))
        out = vec.recv()  # and it steps on
        assert len(out.infos) == 3 and out.failed is None


@pytest.mark.parametrize("backend", ["sync", "process"])
@pytest.mark.parametrize("kind", HOST_KINDS)
def test_repr_names_the_class_and_num_envs(kind: str, backend: str) -> None:
    with closing(make_kind(kind, 3, backend)) as vec:
        assert repr(vec) == f"{type(vec).__name__}(num_envs=3)"


@pytest.mark.parametrize("backend", ["sync", "process"])
@pytest.mark.parametrize("kind", HOST_KINDS)
def test_actions_given_as_lists_step_as_arrays_do(kind: str, backend: str) -> None:
    # Read as numpy reads them (same shape and dtype kind), for either kind: a multi-agent
    # group's nested list was refused with "got shape ()".
    with (
        closing(make_kind(kind, 2, backend, seed=SEED)) as arrays,
        closing(make_kind(kind, 2, backend, seed=SEED)) as lists,
    ):
        for _ in range(4):
            batch = zero_actions(arrays, 2)
            arrays.step_batch(batch)
            lists.step_batch(batch.tolist() if kind == "gymnasium" else [x.tolist() for x in batch])
        assert lists.get_attr("t") == arrays.get_attr("t") != (0, 0)


@pytest.mark.parametrize("backend", ["sync", "process"])
@pytest.mark.parametrize("kind", HOST_KINDS)
def test_a_bad_step_batch_behind_a_queued_send_is_refused_and_the_send_still_answers(kind, backend):
    """The actions are checked where they are handed over, on every backend: a bad
    ``step_batch`` with a send already queued raises and queues nothing, and the good
    send's ``recv`` then answers with exactly what stepping it alone gives."""
    with closing(make_kind(kind, 2, backend)) as vec, closing(make_kind(kind, 2)) as ref:
        vec.reset_batch([1, 2])
        ref.reset_batch([1, 2])
        good = zero_actions(vec, 2)
        bad = good[:1] if kind == "gymnasium" else [x[:1] for x in good]
        vec.send(good)
        with pytest.raises(InvalidActionError):
            vec.step_batch(bad)
        jr.testing.assert_trees_equal(
            _step_arrays(vec.recv()), _step_arrays(ref.step_batch(good)), "the good send"
        )
        with pytest.raises(InvalidArgumentError, match="no send"):
            vec.recv()


def test_a_runner_skips_the_check_its_policy_step_made_and_refuses_what_it_flagged(
    monkeypatch,
) -> None:
    """On sync, the actions the runner's policy step checked are split as they are
    (``send_checked``, the backend's check skipped); a batch the step flags goes through
    the check, which refuses it before any sub-env steps, naming the sub-env and value."""
    from jaxrunner._src.backends.sync import SyncVectorEnv

    checks, passes = [], []
    for name, calls in (("_checked", checks), ("_passed", passes)):
        real = getattr(SyncVectorEnv, name)

        def counted(self, actions, rows, _calls=calls, _real=real):
            _calls.append(rows)
            return _real(self, actions, rows)

        monkeypatch.setattr(SyncVectorEnv, name, counted)
    envs = jr.make_vec("CartPole-v1", 3, "sync")
    traj = sample_checked_then_flagged(envs, checks, 1, 2, r"sub-env 0's action 2 \(row 0")
    assert (traj.action == 1).all() and len(passes) == 4 and len(checks) == 1


def test_a_subclass_that_redefines_send_gets_the_checked_sends_too() -> None:
    """``send_checked`` skips the backend's check, so a subclass redefining ``send`` (a
    wrapper that logs, shuffles or edits the actions) would miss the runner's sends; its
    ``send_checked`` is the default one, which calls its ``send``."""
    sent = []

    class Logged(jr.SyncVectorEnv):
        def send(self, actions, env_ids=None):
            sent.append(np.copy(actions))
            super().send(actions, env_ids)

    assert Logged.send_checked is not jr.SyncVectorEnv.send_checked
    with closing(Logged(counting_env_fns(2))) as vec:
        vec.reset_batch([0, 1])
        vec.send_checked(np.array([1, 0]))
        vec.recv()
    assert [a.tolist() for a in sent] == [[1, 0]]


def _step_arrays(step: Any) -> Any:
    """A step's arrays of either kind (what the envs wrote), as host copies."""
    if hasattr(step, "groups"):
        return {pid: (np.copy(g.obs), np.copy(g.reward)) for pid, g in step.groups.items()}
    return np.copy(step.obs), np.copy(step.next_obs), np.copy(step.reward)


@pytest.mark.parametrize("backend", ["sync", "process", "gymnasium"])
def test_a_single_agent_env_is_one_group_of_one_agent(backend):
    """Every vector env has agent groups: a single-agent one has one, of its one agent,
    as a runner on it and a pure-JAX single-agent env see it."""
    with closing(jr.make_vec("CartPole-v1", 2, backend=backend)) as envs:
        (group,) = envs.groups
        assert (group.policy_id, group.agents) == ("default_policy", ("agent_0",))
        assert group.observation_space == envs.single_observation_space
        assert group.action_space == envs.single_action_space
        assert envs.policy_ids == ("default_policy",)
        assert envs.possible_agents == ("agent_0",)


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_the_vector_envs_name_a_factory_that_is_not_one(backend: str) -> None:
    cls = {"sync": jr.SyncVectorEnv, "process": jr.ProcessVectorEnv}[backend]
    make = functools.partial(gymnasium.make, "CartPole-v1")
    with pytest.raises(
        TypeError, match=r"expected a list of env factories, one per sub-env, got partial"
    ):
        cls(make)  # the factory itself, not a list of them
    with pytest.raises(TypeError, match=r"env_fns\[1\] is a TimeLimit, not a factory"):
        cls([make, make()])  # an env instance


def test_a_gymnasium_backend_class_given_pettingzoo_envs_points_to_make_vec() -> None:
    # It compared the envs' observation_space methods as spaces: a SpaceMismatchError
    # about "<bound method ...>" that named neither the kind nor the fix.
    pytest.importorskip("pettingzoo")
    with pytest.raises(jr.errors.InvalidArgumentTypeError, match=r"PettingZoo env.*make_vec"):
        jr.SyncVectorEnv([jr.testing.coming_and_going] * 2)


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_an_invalid_step_names_its_sub_env_in_env_index_as_for_agents(backend: str) -> None:
    # A multi-agent env's InvalidStepError had env_index set; a gymnasium env's had None,
    # the sub-env named only in the message.
    plan = jr.testing.FaultPlan(kind="nan_reward", at=(2,))
    fns = jr.testing.faulty_env_fns(CountingEnv, 2, {1: [plan]})
    with jr.make_vec(fns, 2, backend) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(2, np.int64))
        with pytest.raises(jr.errors.InvalidStepError, match="sub-env 1") as caught:
            envs.step(np.zeros(2, np.int64))
    assert caught.value.env_index == 1

"""Test utilities: small deterministic envs, fault injection and a contract test mixin.

Users can import them to test their own envs and vector-env backends::

    from jaxrunner.testing import VectorEnvContract

    class TestMyBackend(VectorEnvContract):
        def make_vec(self, env_fns):
            return MyVectorEnv(env_fns)

Nothing here imports pytest: the mixin's checks raise ``AssertionError`` themselves
(pytest does not rewrite ``assert`` outside test modules, and ``python -O`` strips it).
Every env factory built here is a ``functools.partial`` of module-level callables, so
it pickles and can be sent to worker processes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from typing import Any, ClassVar, Literal, get_args

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from jaxrunner import spaces as jr_spaces
from jaxrunner.envs.base import VectorEnv
from jaxrunner.errors import ClosedError, InvalidActionError
from jaxrunner.fault_injection import (  # noqa: F401  (re-exported)
    CallLog,
    FaultPlan,
    FaultyEnv,
    InjectedError,
    faulty_env_fns,
)

EnvFactory = Callable[[], gymnasium.Env]

# -- fake envs ---------------------------------------------------------------------------------


class CountingEnv(gymnasium.Env[np.ndarray, np.int64]):
    """A deterministic env whose observations say where and when they were made.

    Observation (int64, shape (5,)): ``[env_id, seed, episode, t, noise]`` where ``seed`` is
    the last seed passed to ``reset`` (-1 before any), ``episode`` counts resets from 0, ``t``
    counts steps within the episode and ``noise`` is drawn from ``np_random`` (so seeding
    shows). The reward equals the action, so a trajectory's ``reward[t] == action[t]``
    checks alignment. The episode terminates after ``episode_length`` steps.

    Args:
        env_id: written into every observation.
        episode_length: steps until ``terminated`` (>= 1).
        num_actions: size of the ``Discrete`` action space.
        render_mode: ``None``, ``"ansi"`` or ``"rgb_array"``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}
    ENV_ID, SEED, EPISODE, T, NOISE = range(5)  # observation columns

    def __init__(
        self,
        env_id: int = 0,
        episode_length: int = 5,
        num_actions: int = 3,
        render_mode: str | None = None,
    ) -> None:
        if episode_length < 1:
            raise ValueError(f"CountingEnv(episode_length={episode_length}): must be >= 1.")
        self.env_id, self.episode_length, self.render_mode = env_id, episode_length, render_mode
        self.observation_space = spaces.Box(-1, 2**40, shape=(5,), dtype=np.int64)
        self.action_space = spaces.Discrete(num_actions)
        self.last_seed, self.episode, self.t = -1, -1, 0
        self.is_closed = False

    def _obs(self) -> np.ndarray:
        noise = self.np_random.integers(0, 1000)
        return np.array([self.env_id, self.last_seed, self.episode, self.t, noise], dtype=np.int64)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self.last_seed = seed
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {"episode": self.episode}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not self.action_space.contains(action):
            raise ValueError(f"CountingEnv: invalid action {action!r} for {self.action_space}.")
        self.t += 1
        return self._obs(), float(action), self.t >= self.episode_length, False, {"t": self.t}

    def render(self) -> Any:
        if self.render_mode == "ansi":
            return f"env {self.env_id} episode {self.episode} t {self.t}"
        if self.render_mode == "rgb_array":
            return np.full((4, 4, 3), self.t % 256, dtype=np.uint8)
        return None

    def close(self) -> None:
        self.is_closed = True


def make_counting_env(max_episode_steps: int | None = None, **kwargs: Any) -> gymnasium.Env:
    """A :class:`CountingEnv`, wrapped in ``TimeLimit`` when ``max_episode_steps`` is set
    (so it truncates, and terminates and truncates at once when both limits coincide)."""
    env: gymnasium.Env = CountingEnv(**kwargs)
    if max_episode_steps is not None:
        env = gymnasium.wrappers.TimeLimit(env, max_episode_steps)
    return env


def counting_env_fns(
    num_envs: int, episode_length: int = 3, max_episode_steps: int | None = None, **kwargs: Any
) -> list[EnvFactory]:
    """Factories of CountingEnvs with ids ``0..num_envs-1`` and staggered episode lengths
    ``episode_length + i``, so episodes end at different steps in different sub-envs."""
    return [
        functools.partial(
            make_counting_env,
            max_episode_steps,
            env_id=i,
            episode_length=episode_length + i,
            **kwargs,
        )
        for i in range(num_envs)
    ]


class DictObsEnv(gymnasium.Env[dict, np.ndarray]):
    """A random walk with a nested ``Dict``/``Tuple`` observation and ``Box`` actions.

    ``pos`` starts uniform in [-0.5, 0.5]^2 and moves by ``0.25 * action`` (the action is
    clipped to [-1, 1]); the episode terminates when ``pos`` leaves [-1, 1]^2 and truncates
    after ``max_steps`` steps. The reward is ``sum(action)``. Step infos hold a nested dict
    with an array, which exercises gymnasium's info merging.
    """

    def __init__(self, max_steps: int = 20) -> None:
        self.max_steps = max_steps
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-2.0, 2.0, shape=(2,), dtype=np.float32),
                "mask": spaces.MultiBinary(3),
                "nested": spaces.Tuple(
                    (spaces.Discrete(5), spaces.Box(0.0, 1.0, shape=(2, 2), dtype=np.float64))
                ),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.pos = np.zeros(2, dtype=np.float32)
        self.t = 0
        self.is_closed = False

    def _obs(self) -> dict[str, Any]:
        rng = self.np_random
        return {
            "pos": self.pos.copy(),
            "mask": rng.integers(0, 2, size=3).astype(np.int8),
            "nested": (int(self.t % 5), rng.random((2, 2))),
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-0.5, 0.5, size=2).astype(np.float32)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        action = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
        self.pos = (self.pos + 0.25 * action).astype(np.float32)
        self.t += 1
        terminated = bool(np.any(np.abs(self.pos) > 1.0))
        info = {"stats": {"t": self.t, "pos": self.pos.copy()}}
        return self._obs(), float(action.sum()), terminated, self.t >= self.max_steps, info

    def close(self) -> None:
        self.is_closed = True


class StepCounter(gymnasium.Wrapper):
    """Counts ``step`` and ``reset`` calls in ``num_steps`` / ``num_resets``.

    The counts live in the wrapper, so read them with ``vec.get_attr("num_steps")``: that
    works for any backend (in-process or not) that implements ``get_attr``.
    """

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.num_steps = 0
        self.num_resets = 0

    def reset(self, **kwargs: Any) -> Any:
        self.num_resets += 1
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        self.num_steps += 1
        return self.env.step(action)

    @staticmethod
    def wrap_fns(env_fns: Sequence[EnvFactory]) -> list[EnvFactory]:
        """The same factories, each env wrapped in a StepCounter."""
        return [functools.partial(_counted, fn) for fn in env_fns]


def _counted(fn: EnvFactory) -> gymnasium.Env:
    return StepCounter(fn())


# -- fault injection ---------------------------------------------------------------------------

Fault = Literal[
    "raise",  # raise InjectedFault
    "nan_reward",
    "inf_reward",
    "array_reward",  # np.ndarray of shape (2,)
    "list_reward",  # [r, r]
    "flag_not_bool",  # terminated as an int
    "info_not_dict",  # info as a list of pairs
    "obs_dtype",  # first array leaf cast to another dtype
    "obs_shape",  # first array leaf with an extra axis
    "obs_missing_key",  # first key of a dict observation dropped
]
STEP_ONLY_FAULTS = ("nan_reward", "inf_reward", "array_reward", "list_reward", "flag_not_bool")


class InjectedFault(RuntimeError):
    """What :class:`BadEnv` raises for ``fault="raise"``."""


def _map_first_leaf(obs: Any, fn: Callable[[np.ndarray], Any]) -> Any:
    if isinstance(obs, Mapping):
        key = next(iter(obs))
        return {**obs, key: _map_first_leaf(obs[key], fn)}
    if isinstance(obs, tuple):
        return (_map_first_leaf(obs[0], fn), *obs[1:])
    return fn(np.asarray(obs))


class BadEnv(gymnasium.Wrapper):
    """Wraps an env (a :class:`CountingEnv` by default) and breaks gymnasium's API once.

    The fault is injected into the ``at``-th call (1-based) of ``call`` (``"step"`` or
    ``"reset"``); every other call passes through unchanged.

    Args:
        env: the env to break; ``None`` for ``CountingEnv()``.
        fault: what goes wrong (see :data:`Fault`).
        call: which method misbehaves.
        at: which call of it misbehaves.
    """

    def __init__(
        self,
        env: gymnasium.Env | None = None,
        *,
        fault: Fault,
        call: Literal["step", "reset"] = "step",
        at: int = 1,
    ) -> None:
        super().__init__(CountingEnv() if env is None else env)
        if fault not in get_args(Fault):
            raise ValueError(f"BadEnv(fault={fault!r}): expected one of {get_args(Fault)}.")
        if fault in STEP_ONLY_FAULTS and call != "step":
            raise ValueError(f"BadEnv(fault={fault!r}) only applies to call='step'.")
        self.fault, self.call, self.at = fault, call, at
        self.calls = {"step": 0, "reset": 0}

    def _due(self, call: str) -> bool:
        self.calls[call] += 1
        due = call == self.call and self.calls[call] == self.at
        if due and self.fault == "raise":
            raise InjectedFault(f"BadEnv: injected fault in {call} call {self.at}")
        return due

    def _break_obs_or_info(self, obs: Any, info: Any) -> tuple[Any, Any]:
        fault = self.fault
        if fault == "info_not_dict":
            info = list(info.items())
        elif fault == "obs_dtype":
            obs = _map_first_leaf(
                obs, lambda a: a.astype(np.float32 if a.dtype == np.float64 else np.float64)
            )
        elif fault == "obs_shape":
            obs = _map_first_leaf(obs, lambda a: a[None])
        elif fault == "obs_missing_key":
            obs = dict(list(obs.items())[1:])
        return obs, info

    def reset(self, **kwargs: Any) -> Any:
        due = self._due("reset")
        obs, info = self.env.reset(**kwargs)
        return self._break_obs_or_info(obs, info) if due else (obs, info)

    def step(self, action: Any) -> Any:
        due = self._due("step")
        obs, reward, terminated, truncated, info = self.env.step(action)
        if not due:
            return obs, reward, terminated, truncated, info
        fault = self.fault
        if fault in ("nan_reward", "inf_reward"):
            reward = float("nan") if fault == "nan_reward" else float("inf")
        elif fault == "array_reward":
            reward = np.array([reward, reward])
        elif fault == "list_reward":
            reward = [reward, reward]
        elif fault == "flag_not_bool":
            terminated = int(terminated)
        else:
            obs, info = self._break_obs_or_info(obs, info)
        return obs, reward, terminated, truncated, info


def _make_bad(base: EnvFactory, **kwargs: Any) -> gymnasium.Env:
    return BadEnv(base(), **kwargs)


def bad_env_fns(
    base_fns: Sequence[EnvFactory], index: int, fault: Fault, **kwargs: Any
) -> list[EnvFactory]:
    """``base_fns`` with the env at ``index`` wrapped in ``BadEnv(fault=fault, **kwargs)``."""
    fns = list(base_fns)
    fns[index] = functools.partial(_make_bad, fns[index], fault=fault, **kwargs)
    return fns


# -- comparing results -------------------------------------------------------------------------


def assert_trees_equal(actual: Any, expected: Any, where: str = "value") -> None:
    """Asserts two nested results (dicts, tuples/lists, arrays including object arrays,
    scalars) are exactly equal: same keys and lengths, same leaf values, shapes and dtypes
    (leaves compared as ``np.asarray``, so ``5`` equals ``np.int64(5)``; NaN equals NaN).

    Raises:
        AssertionError: naming the path ``where`` of the first difference.
    """
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            raise AssertionError(f"{where}: expected a dict, got {type(actual).__name__}")
        if set(actual) != set(expected):
            raise AssertionError(f"{where}: keys {sorted(actual)} != expected {sorted(expected)}")
        for key in expected:
            assert_trees_equal(actual[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            raise AssertionError(f"{where}: expected a sequence of {len(expected)}, got {actual!r}")
        for j, (a, e) in enumerate(zip(actual, expected)):
            assert_trees_equal(a, e, f"{where}[{j}]")
    elif isinstance(expected, np.ndarray) and expected.dtype == object:
        # gymnasium stores final_obs/final_info as object arrays of per-env values.
        if not isinstance(actual, np.ndarray) or actual.shape != expected.shape:
            raise AssertionError(f"{where}: expected an object array of shape {expected.shape}")
        for idx in np.ndindex(expected.shape):
            assert_trees_equal(actual[idx], expected[idx], f"{where}{list(idx)}")
    else:
        a, e = np.asarray(actual), np.asarray(expected)
        if a.dtype == object or e.dtype == object:
            if actual is not expected and actual != expected:
                raise AssertionError(f"{where}: {actual!r} != expected {expected!r}")
            return
        np.testing.assert_array_equal(a, e, err_msg=where, strict=True)


# -- the contract test mixin ---------------------------------------------------------------------


def _expect_raises(error: type[BaseException], fn: Callable[[], Any], what: str) -> BaseException:
    try:
        fn()
    except error as err:
        return err
    raise AssertionError(f"{what}: expected {error.__name__}, but nothing was raised")


def gymnasium_reference(env_fns: Sequence[EnvFactory]) -> gymnasium.vector.SyncVectorEnv:
    """gymnasium's SyncVectorEnv with SAME_STEP autoreset: what every backend must equal."""
    return gymnasium.vector.SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)


def _bad_action_batches(good: Any, space: gymnasium.Space) -> dict[str, Any]:
    """Action batches a backend must reject, derived from a valid batch ``good``."""
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        return {}
    good = np.asarray(good)
    wrong_kind = np.float64 if good.dtype.kind in "iu" else np.int64
    return {
        "one action too few": good[:-1],
        "one action too many": np.concatenate([good, good[:1]]),
        "an extra axis": good[..., None],
        f"dtype kind {np.dtype(wrong_kind).kind!r}": good.astype(wrong_kind),
        "bool actions": good.astype(bool),
    }


class VectorEnvContract:
    """Tests that a vector-env backend keeps the contract of :mod:`jaxrunner.envs.base`.

    Inherit it in a ``Test*`` class and implement :meth:`make_vec`; pytest then runs every
    ``test_*`` method below against the backend. The checks:

    * step for step equal to ``gymnasium.vector.SyncVectorEnv`` with SAME_STEP autoreset
      (obs, rewards, flags and infos, ``final_obs``/``final_info`` included), on envs
      with Box, Discrete and nested Dict/Tuple spaces, terminations and truncations;
    * metadata autoreset mode SAME_STEP; ``reset(seed=s)`` seeds sub-env ``i`` with s+i;
    * ``step_batch``: ``next_obs`` is the final obs where an episode ended, ``obs`` elsewhere;
    * ``reset_at(i)`` touches no other sub-env;
    * a bad action batch raises ``InvalidActionError`` before any sub-env steps;
    * every call after ``close()`` raises ``ClosedError``; the context manager closes.
    """

    num_envs: ClassVar[int] = 3
    seed: ClassVar[int] = 42
    num_steps: ClassVar[int] = 40

    def make_vec(self, env_fns: Sequence[EnvFactory]) -> VectorEnv:
        """Builds the backend under test from ``env_fns`` (one zero-arg factory per sub-env)."""
        raise NotImplementedError("A VectorEnvContract subclass must implement make_vec().")

    def env_cases(self) -> dict[str, list[EnvFactory]]:
        """Named lists of env factories the parity tests run on (override to add more)."""
        n = self.num_envs
        return {
            # Lengths 3, 4, 5 with a limit of 5: the last terminates and truncates at once.
            "counting": counting_env_fns(n, episode_length=3, max_episode_steps=5),
            "dict_obs": [functools.partial(DictObsEnv, max_steps=6 + i) for i in range(n)],
            "cartpole": [functools.partial(gymnasium.make, "CartPole-v1", max_episode_steps=8)] * n,
        }

    def _run_parity(
        self, vec: Any, ref: Any, name: str, num_steps: int, *, require_end: bool = True
    ) -> None:
        """Steps both with the same sampled actions and asserts equal results."""
        ref.action_space.seed(self.seed)
        ends = 0
        for t in range(num_steps):
            actions = ref.action_space.sample()
            expected = ref.step(actions)
            assert_trees_equal(vec.step(actions), expected, f"{name}: step {t}")
            ends += int(np.sum(expected[2] | expected[3]))
        if require_end and ends == 0:  # a parity run without an episode end would prove little
            raise AssertionError(f"{name}: no episode ended in {num_steps} steps")

    def test_metadata_and_spaces(self) -> None:
        fns = counting_env_fns(self.num_envs)
        with closing(self.make_vec(fns)) as vec, closing(gymnasium_reference(fns)) as ref:
            if vec.metadata.get("autoreset_mode") != AutoresetMode.SAME_STEP:
                raise AssertionError(f"metadata autoreset_mode: {vec.metadata!r}")
            for name in (
                "num_envs",
                "single_observation_space",
                "single_action_space",
                "observation_space",
                "action_space",
            ):
                if getattr(vec, name) != getattr(ref, name):
                    raise AssertionError(f"{name}: {getattr(vec, name)} != {getattr(ref, name)}")

    def test_step_for_step_equal_to_gymnasium(self) -> None:
        for name, fns in self.env_cases().items():
            with closing(self.make_vec(fns)) as vec, closing(gymnasium_reference(fns)) as ref:
                assert_trees_equal(vec.reset(seed=self.seed), ref.reset(seed=self.seed), name)
                self._run_parity(vec, ref, name, self.num_steps)
                # A second, explicitly seeded reset mid-run restarts every sub-env alike.
                seeds = [self.seed + 10 * i for i in range(self.num_envs)]
                assert_trees_equal(vec.reset(seed=seeds), ref.reset(seed=seeds), name)
                self._run_parity(vec, ref, f"{name} after reset", self.num_steps)

    def test_reset_seeds_sub_env_i_with_seed_plus_i(self) -> None:
        n = self.num_envs
        with closing(self.make_vec(counting_env_fns(n))) as vec:
            obs, _ = vec.reset(seed=7)
            np.testing.assert_array_equal(obs[:, CountingEnv.SEED], 7 + np.arange(n))
            np.testing.assert_array_equal(obs[:, CountingEnv.ENV_ID], np.arange(n))
            seeds = [100 + 3 * i for i in range(n)]
            obs, _ = vec.reset(seed=seeds)  # a list is taken as is
            np.testing.assert_array_equal(obs[:, CountingEnv.SEED], seeds)
            obs, _ = vec.reset_batch([5] * n)
            np.testing.assert_array_equal(obs[:, CountingEnv.SEED], [5] * n)

    def test_step_batch_next_obs_is_final_obs_where_done(self) -> None:
        fns = counting_env_fns(self.num_envs, episode_length=2, max_episode_steps=3)
        with closing(self.make_vec(fns)) as vec, closing(gymnasium_reference(fns)) as ref:
            space = vec.single_observation_space
            vec.reset_batch([self.seed + i for i in range(self.num_envs)])
            ref.reset(seed=self.seed)
            ref.action_space.seed(self.seed)
            for t in range(12):
                actions = ref.action_space.sample()
                out = vec.step_batch(actions)
                obs, reward, terminated, truncated, info = ref.step(actions)
                where = f"step_batch {t}"
                assert_trees_equal(
                    (out.obs, out.reward, out.terminated, out.truncated),
                    (obs, reward, terminated, truncated),
                    where,
                )
                done = terminated | truncated
                if sorted(out.reset_infos) != np.flatnonzero(done).tolist():
                    raise AssertionError(f"{where}: reset_infos for {sorted(out.reset_infos)}")
                for i in range(self.num_envs):
                    next_i = jr_spaces.take(space, out.next_obs, i)
                    want = info["final_obs"][i] if done[i] else jr_spaces.take(space, obs, i)
                    assert_trees_equal(next_i, want, f"{where}: next_obs[{i}]")

    def test_step_batch_rows_steps_only_those_envs(self) -> None:
        """``step_batch(actions, rows)`` steps rows ``rows`` only: stepping two halves
        one after the other equals one full step of the reference."""
        n = self.num_envs
        half = slice(0, n // 2), slice(n // 2, n)
        fns = counting_env_fns(n, episode_length=3, max_episode_steps=4)
        with closing(self.make_vec(fns)) as vec, closing(gymnasium_reference(fns)) as ref:
            space = vec.single_observation_space
            vec.reset_batch([self.seed + i for i in range(n)])
            ref.reset(seed=self.seed)
            ref.action_space.seed(self.seed)
            for t in range(10):
                actions = ref.action_space.sample()
                obs, reward, terminated, truncated, _ = ref.step(actions)
                for rows in half:
                    out = vec.step_batch(actions[rows], rows)
                    assert_trees_equal(
                        (out.obs, out.reward, out.terminated, out.truncated),
                        (
                            jr_spaces.rows(space, obs, rows),
                            reward[rows],
                            terminated[rows],
                            truncated[rows],
                        ),
                        f"step {t} rows {rows}",
                    )

    def test_reset_at_touches_no_other_env(self) -> None:
        n, index = self.num_envs, 1
        fns = counting_env_fns(n, episode_length=4)
        with closing(self.make_vec(fns)) as vec, closing(gymnasium_reference(fns)) as ref:
            space = vec.single_observation_space
            vec.reset(seed=self.seed)
            ref.reset(seed=self.seed)
            self._run_parity(vec, ref, "before reset_at", 2, require_end=False)
            actions = ref.action_space.sample()
            out = vec.step_batch(actions)
            ref.step(actions)
            before = jr_spaces.map_structure(space, np.copy, out.obs)
            obs_i, info_i = vec.reset_at(index, seed=99)
            # The reference resets the same sub-env directly and nothing else.
            assert_trees_equal((obs_i, info_i), ref.envs[index].reset(seed=99), "reset_at")
            for j in range(n):
                if j != index:
                    assert_trees_equal(
                        jr_spaces.take(space, out.obs, j),
                        jr_spaces.take(space, before, j),
                        f"obs buffer row {j} after reset_at({index})",
                    )
            self._run_parity(vec, ref, "after reset_at", 10)

    def test_invalid_actions_rejected_before_any_step(self) -> None:
        n = self.num_envs
        cases = {
            "discrete": counting_env_fns(n),
            "box": [functools.partial(DictObsEnv, max_steps=5)] * n,
        }
        for name, fns in cases.items():
            fns = StepCounter.wrap_fns(fns)
            with closing(self.make_vec(fns)) as vec, closing(gymnasium_reference(fns)) as ref:
                vec.reset(seed=self.seed)
                ref.reset(seed=self.seed)
                self._run_parity(vec, ref, name, 2, require_end=False)
                steps = vec.get_attr("num_steps")
                good = ref.action_space.sample()
                for what, bad in _bad_action_batches(good, vec.single_action_space).items():
                    _expect_raises(InvalidActionError, lambda b=bad: vec.step(b), f"{name}: {what}")
                    _expect_raises(
                        InvalidActionError, lambda b=bad: vec.step_batch(b), f"{name}: {what}"
                    )
                    if vec.get_attr("num_steps") != steps:
                        raise AssertionError(f"{name}: {what}: a sub-env stepped before the error")
                # Nothing moved: later steps still align with the reference.
                assert_trees_equal(vec.step(good), ref.step(good), f"{name}: after bad actions")
                self._run_parity(vec, ref, f"{name}: after bad actions", 12)

    def test_every_call_after_close_raises(self) -> None:
        n = self.num_envs
        vec = self.make_vec(counting_env_fns(n))
        vec.reset(seed=self.seed)
        actions = np.zeros(n, dtype=np.int64)
        vec.close()
        vec.close()  # closing twice is allowed and does nothing
        calls: dict[str, Callable[[], Any]] = {
            "reset": lambda: vec.reset(seed=0),
            "step": lambda: vec.step(actions),
            "reset_batch": lambda: vec.reset_batch([0] * n),
            "step_batch": lambda: vec.step_batch(actions),
            "reset_at": lambda: vec.reset_at(0),
            "render": vec.render,
            "call": lambda: vec.call("render"),
            "get_attr": lambda: vec.get_attr("env_id"),
            "set_attr": lambda: vec.set_attr("env_id", 1),
        }
        for name, call in calls.items():
            _expect_raises(ClosedError, call, f"{name}() after close()")

    def test_context_manager_closes(self) -> None:
        n = self.num_envs
        with self.make_vec(counting_env_fns(n)) as vec:
            vec.reset(seed=self.seed)
            vec.step(np.zeros(n, dtype=np.int64))
        if not vec.closed:
            raise AssertionError("leaving the with block did not close the vector env")
        _expect_raises(ClosedError, lambda: vec.step(np.zeros(n, dtype=np.int64)), "step()")

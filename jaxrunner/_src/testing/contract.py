"""The vector-env contract test mixin, which users inherit to test their own backends. Like
everything in this package, it does not import pytest: its checks raise
``AssertionError`` themselves."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any, ClassVar

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.sub_env_handle import SubEnvHandle
from jaxrunner._src.testing.assertions import assert_trees_equal, expect_raises
from jaxrunner._src.testing.envs import (
    CountingEnv,
    DictObsEnv,
    EnvFactory,
    StepCounter,
    counting_env_fns,
)
from jaxrunner.errors import ClosedError, InvalidActionError, InvalidArgumentError

# -- the contract test mixin ---------------------------------------------------------------------


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


def _sub_env_attr(sub: Any, name: str) -> Any:
    """Attribute ``name`` of an entry of ``get_sub_environments()``: through a handle,
    or found through a gymnasium env's wrappers (as the vector env's ``get_attr``)."""
    return sub.get_attr(name) if isinstance(sub, SubEnvHandle) else sub.get_wrapper_attr(name)


def _set_sub_env_attr(sub: Any, name: str, value: Any) -> None:
    if isinstance(sub, SubEnvHandle):
        sub.set_attr(name, value)
    else:
        sub.set_wrapper_attr(name, value)


def sub_env_handles(vec: Any) -> list[SubEnvHandle]:
    """The handles among ``vec.get_sub_environments()``; none where the backend refuses
    (it has no per-sub-env objects: it overrides the contract's sub-env test)."""
    try:
        subs = vec.get_sub_environments()
    except InvalidArgumentError:
        return []
    return [sub for sub in subs if isinstance(sub, SubEnvHandle)]


class VectorEnvContract:
    """Tests that a vector-env backend keeps the contract of :class:`~jaxrunner.VectorEnv`.

    Inherit it in a ``Test*`` class and implement :meth:`make_vec`; pytest then runs every
    ``test_*`` method below against the backend. The checks:

    * step for step equal to ``gymnasium.vector.SyncVectorEnv`` with SAME_STEP autoreset
      (obs, rewards, flags and infos, ``final_obs``/``final_info`` included), on envs
      with Box, Discrete and nested Dict/Tuple spaces, terminations and truncations;
    * metadata autoreset mode SAME_STEP; ``reset(seed=s)`` seeds sub-env ``i`` with s+i;
    * ``step_batch``: ``next_obs`` is the final obs where an episode ended, ``obs`` elsewhere;
    * ``send``/``recv``: each env steps once per send, ``env_ids`` says which rows are
      which env, and ``recv`` with nothing in flight raises;
    * ``reset_at(i)`` touches no other sub-env;
    * ``get_sub_environments()`` has one entry per sub-env, in order, each reaching its
      own sub-env only (an env object, or a handle that is closed with the vector env);
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
                seeds: list[int | None] = [self.seed + 10 * i for i in range(self.num_envs)]
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
                    next_i = space_arrays.take(space, out.next_obs, i)
                    want = info["final_obs"][i] if done[i] else space_arrays.take(space, obs, i)
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
                            space_arrays.rows(space, obs, rows),
                            reward[rows],
                            terminated[rows],
                            truncated[rows],
                        ),
                        f"step {t} rows {rows}",
                    )

    def test_send_recv_steps_each_env_once_and_says_which(self) -> None:
        """``send`` then ``recv`` until every env has answered: each env steps exactly
        once per send, its rows say which env they are (``BatchStep.env_ids``), and the
        results equal the reference's; ``recv`` with nothing in flight raises."""
        n = self.num_envs
        fns = counting_env_fns(n, episode_length=3, max_episode_steps=4)
        with closing(self.make_vec(fns)) as vec, closing(gymnasium_reference(fns)) as ref:
            vec.reset_batch([self.seed + i for i in range(n)])
            ref.reset(seed=self.seed)
            ref.action_space.seed(self.seed)
            expect_raises(InvalidArgumentError, vec.recv, "recv() with nothing in flight")
            for t in range(8):
                actions = ref.action_space.sample()
                obs, reward, terminated, truncated, _ = ref.step(actions)
                vec.send(actions)
                answered = np.zeros(n, np.int64)
                while answered.sum() < n:
                    out = vec.recv()
                    ids = np.arange(n)[slice(None) if out.env_ids is None else out.env_ids]
                    ids = np.atleast_1d(ids)
                    answered[ids] += 1
                    assert_trees_equal(
                        (out.obs, out.reward, out.terminated, out.truncated),
                        (obs[ids], reward[ids], terminated[ids], truncated[ids]),
                        f"step {t} envs {ids.tolist()}",
                    )
                if not (answered == 1).all():
                    raise AssertionError(f"step {t}: envs answered {answered.tolist()} times")

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
            before = space_arrays.map_structure(space, np.copy, out.obs)
            obs_i, info_i = vec.reset_at(index, seed=99)
            # The reference resets the same sub-env directly and nothing else.
            assert_trees_equal((obs_i, info_i), ref.envs[index].reset(seed=99), "reset_at")
            for j in range(n):
                if j != index:
                    assert_trees_equal(
                        space_arrays.take(space, out.obs, j),
                        space_arrays.take(space, before, j),
                        f"obs buffer row {j} after reset_at({index})",
                    )
            self._run_parity(vec, ref, "after reset_at", 10)

    def test_get_sub_environments_reach_each_sub_env_alone(self) -> None:
        """One entry per sub-env, in index order: the env object (in this process) or a
        :class:`~jaxrunner._src.backends.sub_env_handle.SubEnvHandle`. Each reads its
        own sub-env's attributes and renders, ``set_attr`` through sub-env 1's changes
        sub-env 1 only, and a handle's ``call`` equals the vector env's for its sub-env.
        (A backend with no per-sub-env objects, which refuses, overrides this test.)"""
        n = self.num_envs
        with closing(self.make_vec(counting_env_fns(n, render_mode="ansi"))) as vec:
            vec.reset(seed=self.seed)
            subs = vec.get_sub_environments()
            if len(subs) != n:
                raise AssertionError(f"get_sub_environments(): {len(subs)} entries, not {n}")
            ids = tuple(_sub_env_attr(sub, "env_id") for sub in subs)
            assert_trees_equal(ids, tuple(range(n)), "each entry's env_id (index order)")
            assert_trees_equal(ids, vec.get_attr("env_id"), "entries' env_id vs get_attr")
            lengths = list(vec.get_attr("episode_length"))
            _set_sub_env_attr(subs[1], "episode_length", 99)
            lengths[1] = 99
            assert_trees_equal(vec.get_attr("episode_length"), tuple(lengths), "set_attr of 1")
            renders = tuple(sub.render() for sub in subs)
            assert_trees_equal(renders, vec.render(), "each entry's render()")
            for i, sub in enumerate(subs):
                if isinstance(sub, SubEnvHandle):
                    got = (sub.index, sub.call("get_wrapper_attr", "episode_length"))
                    want = (i, vec.call("get_wrapper_attr", "episode_length")[i])
                    assert_trees_equal(got, want, f"{sub!r}.call()")

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
                    expect_raises(InvalidActionError, lambda b=bad: vec.step(b), f"{name}: {what}")
                    expect_raises(
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
        handles = sub_env_handles(vec)
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
            "get_sub_environments": vec.get_sub_environments,
            **{f"{h!r}.get_attr": lambda h=h: h.get_attr("env_id") for h in handles},
        }
        for name, call in calls.items():
            expect_raises(ClosedError, call, f"{name}() after close()")

    def test_context_manager_closes(self) -> None:
        n = self.num_envs
        with self.make_vec(counting_env_fns(n)) as vec:
            vec.reset(seed=self.seed)
            vec.step(np.zeros(n, dtype=np.int64))
        if not vec.closed:
            raise AssertionError("leaving the with block did not close the vector env")
        expect_raises(ClosedError, lambda: vec.step(np.zeros(n, dtype=np.int64)), "step()")

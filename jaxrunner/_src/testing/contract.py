"""The vector-env contract test mixin, which users inherit to test their own backends on every
kind of env a backend serves. Like everything in this package, it does not import pytest:
its checks raise ``AssertionError`` themselves."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any, ClassVar, Literal

import gymnasium
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.sub_env_handle import SubEnvHandle, run_on_env
from jaxrunner._src.core.seeds import restart_seed
from jaxrunner._src.testing.assertions import assert_trees_equal, expect_raises
from jaxrunner._src.testing.bad_actions import bad_agent_actions, bad_gymnasium_actions
from jaxrunner._src.testing.envs import (
    DictObsEnv,
    coming_and_going,
    counting_env_fns,
    relay,
    tictactoe,
)
from jaxrunner._src.testing.fault_plans import FaultPlan
from jaxrunner._src.testing.faults import faulty_env_fns
from jaxrunner._src.testing.gymnasium_contract import GymnasiumVectorApiContract, _gymnasium_only
from jaxrunner._src.testing.reference import ByHand, by_hand
from jaxrunner._src.testing.step_comparison import (
    ActionSampler,
    Row,
    assert_acting,
    assert_failed_slot,
    assert_row,
    env_ids,
    read_rows,
)
from jaxrunner.errors import (
    ClosedError,
    EnvIndexError,
    InvalidActionError,
    InvalidArgumentError,
)

EnvKind = Literal["gymnasium", "parallel", "aec"]
"""A kind of host env: gymnasium, PettingZoo parallel, PettingZoo AEC (turn-based)."""
EnvFns = Callable[[], Any] | Sequence[Callable[[], Any]]
"""One factory for every sub-env, or one per sub-env."""


def _on_sub_env(sub: Any, method: str, args: tuple) -> Any:
    """``method(*args)`` on an entry of ``get_sub_environments()`` (a handle or the env)."""
    if isinstance(sub, SubEnvHandle):
        return getattr(sub, method)(*args)
    return run_on_env(sub, method, args)


class VectorEnvContract(GymnasiumVectorApiContract):
    """Tests that a vector-env backend keeps the contract of :class:`~jaxrunner.VectorEnv`,
    on every kind of env it serves (:attr:`env_kinds`).

    Inherit it in a ``Test*`` class and implement :meth:`make_vec`; pytest then runs every
    ``test_*`` method below once per kind (``[gymnasium]``, ``[parallel]``, ``[aec]``).
    Written once for every kind, against the same envs stepped by hand (a gymnasium env
    is the one-agent case; PettingZoo's by its own loop), on envs whose agents leave and
    appear, turn-based ones and PettingZoo's own tictactoe:

    * ``reset_batch(seeds)`` resets sub-env ``i`` with ``seeds[i]``;
    * step for step equal to the envs stepped by hand: who acts on what, completed
      transitions (next observation, reward, flags), SAME_STEP autoreset, the infos; no
      ``errors`` where nothing failed, and ``reset_rows`` only where the backend declares
      ``capabilities.reset_steps``;
    * ``send``/``recv``: each env steps once per send, ``env_ids`` says which rows are
      which env, and ``recv`` with nothing in flight raises;
    * a bad action batch raises ``InvalidActionError`` before any sub-env steps, at
      ``send`` already (nothing is queued);
    * ``reset_at(i)`` touches no other sub-env;
    * with a restart policy, a failed sub-env is restarted, its row holds no transition
      (zero rewards, no flags, no infos), no other is touched, and ``get_num_restarts``
      counts each restart;
    * ``call``, ``get_attr``, ``set_attr``, ``render``; ``get_sub_environments()`` has
      one entry per sub-env, in order, each reaching its own sub-env only (an env
      object, or a handle that is closed with the vector env);
    * every call after ``close()`` raises ``ClosedError`` (closing twice is allowed);
      the context manager closes.

    And on gymnasium envs, gymnasium's vector API: step for step equal to
    ``gymnasium.vector.SyncVectorEnv`` with SAME_STEP autoreset (``final_obs`` and
    ``final_info`` included) on Box, Discrete and nested Dict/Tuple spaces; metadata and
    spaces; ``reset(seed=s)`` seeds sub-env ``i`` with ``s + i``; ``reset(options=
    {"reset_mask": m})`` resets those sub-envs only; ``step_batch(actions, rows)`` steps
    those rows only, each row equal to its env stepped by hand.
    """

    env_kinds: ClassVar[tuple[EnvKind, ...]] = ("gymnasium",)
    """The kinds of env the backend serves."""
    num_envs: ClassVar[int] = 3
    seed: ClassVar[int] = 42
    num_steps: ClassVar[int] = 40
    kind: EnvKind = "gymnasium"
    """The kind of env of the test running, set before each :meth:`make_vec` call (for
    a backend that builds each kind with its own class)."""

    def make_vec(
        self, env_fns: Sequence[Callable[[], Any]], restart_policy: RestartPolicy | None = None
    ) -> Any:
        """Builds the backend under test from ``env_fns`` (one zero-argument factory per
        sub-env, picklable), restarting failed sub-envs as ``restart_policy`` says (None:
        failures raise)."""
        raise NotImplementedError("A VectorEnvContract subclass must implement make_vec().")

    def env_cases(self) -> dict[str, EnvFns]:
        """Named env factories of :attr:`kind` the parity test runs on (override to add
        more): a factory for every sub-env, or a list of one per sub-env."""
        n = self.num_envs
        if self.kind == "parallel":
            return {"coming_and_going": coming_and_going}
        if self.kind == "aec":
            return {"relay": relay, "tictactoe": tictactoe}
        return {
            # Lengths 3, 4, 5 with a limit of 5: the last terminates and truncates at once.
            "counting": counting_env_fns(n, episode_length=3, max_episode_steps=5),
            "dict_obs": [functools.partial(DictObsEnv, max_steps=6 + i) for i in range(n)],
            "cartpole": functools.partial(gymnasium.make, "CartPole-v1", max_episode_steps=8),
        }

    # -- the kind under test, and its envs stepped by hand ------------------------------------

    def pytest_generate_tests(self, metafunc: Any) -> None:
        """pytest's hook: runs each test once per kind it checks that the backend serves."""
        if "kind" in metafunc.fixturenames:
            kinds = getattr(metafunc.function, "contract_kinds", self.env_kinds)
            metafunc.parametrize("kind", [k for k in self.env_kinds if k in kinds])

    def _fns(self, fns: EnvFns) -> list[Callable[[], Any]]:
        return [fns] * self.num_envs if callable(fns) else list(fns)

    def _basic(self, kind: EnvKind, **counting: Any) -> list[Callable[[], Any]]:
        """The first test env of ``kind`` for every sub-env (``counting``: CountingEnv's)."""
        if kind == "gymnasium":
            return counting_env_fns(self.num_envs, **counting)
        return self._fns(coming_and_going if kind == "parallel" else relay)

    def _make(
        self, kind: EnvKind, fns: Sequence[Callable[[], Any]], restarts: RestartPolicy | None = None
    ) -> Any:
        self.kind = kind
        return self.make_vec(fns, restarts) if restarts is not None else self.make_vec(fns)

    def _seeds(self, base: int) -> list[int | None]:
        return [base + 7 * i for i in range(self.num_envs)]

    def _reset(
        self,
        vec: Any,
        fns: Sequence[Callable[[], Any]],
        seeds: Sequence[int | None],
        where: str,
        refs: list[ByHand] | None = None,
    ) -> tuple[list[ByHand], list[Row]]:
        """Resets ``vec`` and the envs by hand (``refs``, else new ones); asserts equal rows."""
        refs = [by_hand(fn) for fn in fns] if refs is None else refs
        rows = read_rows(vec, vec.reset_batch(list(seeds)))
        for b, (ref, seed) in enumerate(zip(refs, seeds)):
            ref.reset(seed)
            assert_acting(rows[b], ref, f"{where}: sub-env {b}")
        return refs, rows

    def _run_parity(
        self,
        vec: Any,
        refs: list[ByHand],
        rows: list[Row],
        actions: ActionSampler,
        num_steps: int,
        where: str,
        require_end: bool = True,
    ) -> list[Row]:
        """Steps ``vec`` and the envs by hand with the same actions; asserts equal rows.
        Returns the last step's rows."""
        ends = 0
        for t in range(num_steps):
            batch = actions.sample(rows)
            expected = [ref.step(actions.of_row(batch, b)) for b, ref in enumerate(refs)]
            out = vec.step_batch(batch)
            if out.failed is not None or out.errors:
                raise AssertionError(f"{where}: step {t}: sub-envs {out.errors} failed")
            rows = read_rows(vec, out)
            for b, ref in enumerate(refs):
                assert_row(rows[b], expected[b], ref, f"{where}: step {t}: sub-env {b}")
            ends += sum(e.done for e in expected)
        if require_end and ends == 0:  # a parity run without an episode end would prove little
            raise AssertionError(f"{where}: no episode ended in {num_steps} steps")
        return rows

    # -- every kind ---------------------------------------------------------------------------

    def test_reset_batch_seeds_sub_env_i_with_seeds_i(self, kind: EnvKind) -> None:
        fns = self._basic(kind)
        with closing(self._make(kind, fns)) as vec:
            refs = None
            for seeds in (self._seeds(self.seed), [5] * self.num_envs):
                refs, _ = self._reset(vec, fns, seeds, f"reset_batch({seeds})", refs)

    def test_step_for_step_equal_to_the_envs_stepped_by_hand(self, kind: EnvKind) -> None:
        self.kind = kind
        for name, case in self.env_cases().items():
            fns = self._fns(case)
            with closing(self._make(kind, fns)) as vec:
                actions, refs = ActionSampler(vec, self.seed), None
                # A second, seeded reset mid-run restarts every sub-env alike.
                for seeds in (self._seeds(self.seed), self._seeds(self.seed + 1000)):
                    refs, rows = self._reset(vec, fns, seeds, f"{name}: reset", refs)
                    self._run_parity(vec, refs, rows, actions, self.num_steps, name)

    @_gymnasium_only
    def test_step_batch_rows_steps_only_those_envs(self, kind: EnvKind) -> None:
        n, fns = self.num_envs, self._basic(kind, episode_length=3, max_episode_steps=4)
        with closing(self._make(kind, fns)) as vec:
            space, actions = vec.single_action_space, ActionSampler(vec, self.seed)
            refs, rows = self._reset(vec, fns, self._seeds(self.seed), "reset")
            for t in range(10):
                batch = actions.sample(rows)
                expected = [ref.step(actions.of_row(batch, b)) for b, ref in enumerate(refs)]
                for part in (slice(0, n // 2), slice(n // 2, n)):
                    out = vec.step_batch(space_arrays.rows(space, batch, part), part)
                    got = read_rows(vec, out, part.start)
                    ids = env_ids(out, len(got)) if out.env_ids is not None else range(n)[part]
                    if list(ids) != list(range(n)[part]):
                        raise AssertionError(f"step {t}: rows {part} answered envs {list(ids)}")
                    for row, b in zip(got, ids):
                        rows[b] = row
                        assert_row(row, expected[b], refs[b], f"step {t}: rows {part}: sub-env {b}")

    def test_send_recv_steps_each_env_once_and_says_which(self, kind: EnvKind) -> None:
        n, fns = self.num_envs, self._basic(kind, episode_length=3, max_episode_steps=4)
        with closing(self._make(kind, fns)) as vec:
            actions = ActionSampler(vec, self.seed)
            refs, rows = self._reset(vec, fns, self._seeds(self.seed), "reset")
            expect_raises(InvalidArgumentError, vec.recv, "recv() with nothing in flight")
            for t in range(8):
                batch = actions.sample(rows)
                expected = [ref.step(actions.of_row(batch, b)) for b, ref in enumerate(refs)]
                vec.send(batch)
                answered = np.zeros(n, np.int64)
                while answered.sum() < n:
                    out = vec.recv()
                    got = read_rows(vec, out)
                    ids = env_ids(out, len(got))
                    for row, b in zip(got, ids):
                        answered[b] += 1
                        rows[b] = row
                        assert_row(row, expected[b], refs[b], f"step {t}: sub-env {b}")
                if not (answered == 1).all():
                    raise AssertionError(f"step {t}: envs answered {answered.tolist()} times")

    def test_invalid_actions_rejected_before_any_step(self, kind: EnvKind) -> None:
        cases = {"": self._basic(kind)}
        if kind == "gymnasium":
            box = [functools.partial(DictObsEnv, max_steps=5)] * self.num_envs
            cases = {"discrete": cases[""], "box": box}
        for name, fns in cases.items():
            with closing(self._make(kind, fns)) as vec:
                actions = ActionSampler(vec, self.seed)
                refs, rows = self._reset(vec, fns, self._seeds(self.seed), name)
                rows = self._run_parity(vec, refs, rows, actions, 2, name, require_end=False)
                steps = vec.get_attr("t")
                good = actions.sample(rows)
                if kind == "gymnasium":
                    bad = bad_gymnasium_actions(good, vec.single_action_space)
                else:
                    bad = bad_agent_actions(good, vec.groups)
                for what, batch in bad.items():
                    what = f"{name}: {what}"
                    calls = [vec.step_batch] + ([vec.step] if kind == "gymnasium" else [])
                    for call in calls:
                        expect_raises(InvalidActionError, lambda c=call, a=batch: c(a), what)
                    # send refuses them itself, and queues nothing that a recv would answer
                    expect_raises(InvalidActionError, lambda a=batch: vec.send(a), f"{what}: send")
                    expect_raises(InvalidArgumentError, vec.recv, f"{what}: recv after the send")
                    if vec.get_attr("t") != steps:
                        raise AssertionError(f"{what}: a sub-env stepped before the error")
                # Nothing moved: later steps still equal the envs stepped by hand.
                self._run_parity(vec, refs, rows, actions, 12, f"{name}: after bad actions")

    def test_reset_at_touches_no_other_env(self, kind: EnvKind) -> None:
        n, index, fns = self.num_envs, 1, self._basic(kind, episode_length=4)
        with closing(self._make(kind, fns)) as vec:
            actions = ActionSampler(vec, self.seed)
            refs, rows = self._reset(vec, fns, self._seeds(self.seed), "reset")
            rows = self._run_parity(vec, refs, rows, actions, 2, "before", require_end=False)
            batch = actions.sample(rows)
            expected = [ref.step(actions.of_row(batch, b)) for b, ref in enumerate(refs)]
            out = vec.step_batch(batch)
            got = vec.reset_at(index, seed=99)
            want = refs[index].reset(99)
            if kind == "gymnasium":  # gymnasium's reset returns the observation too
                want = (refs[index].acting[next(iter(refs[index].acting))], want)
            assert_trees_equal(got, want, f"reset_at({index})")
            after = read_rows(vec, out)  # views of the buffers
            for b in range(n):
                if b == index:
                    # A multi-agent row holds the new episode (gymnasium's: checked above).
                    if kind != "gymnasium":
                        assert_acting(after[b], refs[b], f"row {b} after reset_at({index})")
                else:
                    assert_row(after[b], expected[b], refs[b], f"row {b} after reset_at({index})")
            self._run_parity(vec, refs, after, actions, 10, "after reset_at")

    def test_a_restart_touches_no_other_env(self, kind: EnvKind) -> None:
        """Sub-env 1 raises at every third step; each new instance resets with ``restart_seed``."""
        index, every = 1, 3
        base = self._basic(kind)
        fns = faulty_env_fns(base, faults={index: [FaultPlan(kind="raise", at=(every,))]})
        with closing(self._make(kind, fns, RestartPolicy())) as vec:
            actions = ActionSampler(vec, self.seed)
            seeds = self._seeds(self.seed)
            refs, rows = self._reset(vec, base, seeds, "reset")
            restarts = 0
            for t in range(4 * every):
                batch = actions.sample(rows)
                out = vec.step_batch(batch)
                rows = read_rows(vec, out)
                where = f"step {t}"
                # Each instance of sub-env ``index`` fails at its ``every``-th step.
                fails = t % every == every - 1
                failed = [] if out.failed is None else np.flatnonzero(out.failed).tolist()
                if failed != ([index] if fails else []):
                    raise AssertionError(f"{where}: failed sub-envs {failed}")
                for b, ref in enumerate(refs):
                    if b == index and fails:
                        restarts += 1
                        refs[b] = ref = by_hand(base[b])
                        ref.reset(restart_seed(seeds[b], restarts))  # type: ignore[arg-type]
                        assert_failed_slot(rows[b], ref, f"{where}: sub-env {b}")
                        continue
                    expected = ref.step(actions.of_row(batch, b))
                    assert_row(rows[b], expected, ref, f"{where}: sub-env {b}")
            if vec.get_num_restarts() != restarts:
                raise AssertionError(
                    f"get_num_restarts() = {vec.get_num_restarts()}, not {restarts}"
                )

    def test_call_get_attr_set_attr_render(self, kind: EnvKind) -> None:
        n = self.num_envs
        fns = self._basic(kind, render_mode="ansi")
        with closing(self._make(kind, fns)) as vec:
            refs, _ = self._reset(vec, fns, self._seeds(self.seed), "reset")
            renders = tuple(ref.env.render() for ref in refs)
            assert_trees_equal(vec.render(), renders, "render()")
            assert_trees_equal(vec.call("render"), renders, "call('render')")
            if kind == "gymnasium":
                assert_trees_equal(vec.get_attr("env_id"), tuple(range(n)), "get_attr(env_id)")
                lengths = tuple(ref.env.get_wrapper_attr("episode_length") for ref in refs)
                got = vec.call("get_wrapper_attr", "episode_length")
                assert_trees_equal(got, lengths, "call(name, arg)")
            else:
                envs: list[Any] = [ref.env for ref in refs]  # PettingZoo envs
                agents = envs[0].possible_agents
                assert_trees_equal(vec.call("possible_agents"), (agents,) * n, "call()")
                want = tuple(env.observation_space(agents[0]) for env in envs)
                if vec.call("observation_space", agents[0]) != want:
                    raise AssertionError(f"call('observation_space', {agents[0]!r}) != {want}")
            assert_trees_equal(vec.get_attr("episode"), (0,) * n, "get_attr")
            vec.set_attr("episode", [5 + b for b in range(n)])
            assert_trees_equal(vec.get_attr("episode"), tuple(5 + b for b in range(n)), "set")
            vec.set_attr("episode", 3)  # one value for all
            assert_trees_equal(vec.get_attr("episode"), (3,) * n, "set_attr(one value)")
            expect_raises(EnvIndexError, lambda: vec.reset_at(n), "reset_at(num_envs)")
            self.check_sub_environments(vec)

    def check_sub_environments(self, vec: Any) -> None:
        """The ``get_sub_environments()`` checks of :meth:`test_call_get_attr_set_attr_render`
        (a backend with no per-sub-env objects, which refuses, overrides this)."""
        n = self.num_envs
        episodes = [10 + b for b in range(n)]  # tells the sub-envs apart
        vec.set_attr("episode", episodes)
        subs = vec.get_sub_environments()
        if len(subs) != n:
            raise AssertionError(f"get_sub_environments(): {len(subs)} entries, not {n}")
        got = tuple(_on_sub_env(sub, "get_attr", ("episode",)) for sub in subs)
        assert_trees_equal(got, tuple(episodes), "each entry's episode (index order)")
        _on_sub_env(subs[1], "set_attr", ("episode", 99))
        episodes[1] = 99
        assert_trees_equal(vec.get_attr("episode"), tuple(episodes), "set_attr of sub-env 1")
        assert_trees_equal(tuple(sub.render() for sub in subs), vec.render(), "render()s")
        for b, sub in enumerate(subs):
            if isinstance(sub, SubEnvHandle):
                got = (sub.index, sub.call("render"))
                assert_trees_equal(got, (b, vec.call("render")[b]), f"{sub!r}.call()")

    def test_every_call_after_close_raises(self, kind: EnvKind) -> None:
        n, fns = self.num_envs, self._basic(kind)
        vec = self._make(kind, fns)
        rows = read_rows(vec, vec.reset_batch(self._seeds(self.seed)))
        actions = ActionSampler(vec, self.seed).sample(rows)
        try:  # a backend with no per-sub-env objects refuses (it overrides the sub-env test)
            handles = [sub for sub in vec.get_sub_environments() if isinstance(sub, SubEnvHandle)]
        except InvalidArgumentError:
            handles = []
        vec.close()
        vec.close()  # closing twice is allowed and does nothing
        calls: dict[str, Callable[[], Any]] = {
            "reset_batch": lambda: vec.reset_batch([0] * n),
            "step_batch": lambda: vec.step_batch(actions),
            "send": lambda: vec.send(actions),
            "recv": vec.recv,
            "reset_at": lambda: vec.reset_at(0),
            "render": vec.render,
            "call": lambda: vec.call("render"),
            "get_attr": lambda: vec.get_attr("t"),
            "set_attr": lambda: vec.set_attr("t", 1),
            "get_sub_environments": vec.get_sub_environments,
            **{f"{h!r}.get_attr": lambda h=h: h.get_attr("t") for h in handles},
        }
        if kind == "gymnasium":
            calls |= {"reset": lambda: vec.reset(seed=0), "step": lambda: vec.step(actions)}
        for name, call in calls.items():
            expect_raises(ClosedError, call, f"{name}() after close()")

    def test_context_manager_closes(self, kind: EnvKind) -> None:
        with self._make(kind, self._basic(kind)) as vec:
            rows = read_rows(vec, vec.reset_batch(self._seeds(self.seed)))
            actions = ActionSampler(vec, self.seed).sample(rows)
            vec.step_batch(actions)
        if not vec.closed:
            raise AssertionError("leaving the with block did not close the vector env")
        expect_raises(ClosedError, lambda: vec.step_batch(actions), "step_batch() after with")


class MultiAgentVectorEnvContract(VectorEnvContract):
    """Deprecated: :class:`VectorEnvContract` with ``env_kinds = ("parallel", "aec")``;
    implement ``make_vec`` (``make_envs`` is still called where a subclass has it)."""

    env_kinds: ClassVar[tuple[EnvKind, ...]] = ("parallel", "aec")

    def make_vec(
        self, env_fns: Sequence[Callable[[], Any]], restart_policy: RestartPolicy | None = None
    ) -> Any:
        return self.make_envs(env_fns, restart_policy)

    def make_envs(
        self, env_fns: Sequence[Callable[[], Any]], restart_policy: RestartPolicy | None = None
    ) -> Any:
        """The old name of :meth:`make_vec`."""
        raise NotImplementedError(
            "A MultiAgentVectorEnvContract subclass must implement make_vec() (or make_envs())."
        )

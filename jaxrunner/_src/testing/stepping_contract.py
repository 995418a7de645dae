"""The contract's checks of stepping, on every kind of env: each sub-env reset, stepped, sent
to, refused a bad action and restarted exactly as the same env stepped by hand. A mixin of
:class:`~jaxrunner._src.testing.contract.VectorEnvContract`."""

from __future__ import annotations

import functools
from contextlib import closing
from typing import Any

import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.core.seeds import restart_seed
from jaxrunner._src.testing.assertions import assert_trees_equal, expect_raises
from jaxrunner._src.testing.bad_actions import bad_agent_actions, bad_gymnasium_actions
from jaxrunner._src.testing.envs import DictObsEnv
from jaxrunner._src.testing.fault_plans import FaultPlan
from jaxrunner._src.testing.faults import faulty_env_fns
from jaxrunner._src.testing.gymnasium_contract import _gymnasium_only
from jaxrunner._src.testing.reference import ByHand, ContractParts, EnvKind, by_hand
from jaxrunner._src.testing.step_comparison import (
    ActionSampler,
    Row,
    assert_acting,
    assert_failed_slot,
    assert_row,
    env_ids,
    read_rows,
)
from jaxrunner.errors import InvalidActionError, InvalidArgumentError


class SteppingContract(ContractParts):
    """The stepping checks of :class:`~jaxrunner._src.testing.contract.VectorEnvContract`'s
    docstring, from ``reset_batch`` to restarts."""

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

    def test_reset_batch_seeds_sub_env_i_with_seeds_i(self, kind: EnvKind) -> None:
        fns = self._basic(kind)
        with closing(self._make(kind, fns)) as vec:
            actions, refs = ActionSampler(vec, self.seed), None
            for seeds in (self._seeds(self.seed), [5] * self.num_envs):
                where = f"reset_batch({seeds})"
                refs, rows = self._reset(vec, fns, seeds, where, refs)
                # Steps until the seeded draws show: Relay's first is at its 5th step.
                self._run_parity(vec, refs, rows, actions, 6, where, require_end=False)

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

"""The multi-agent vector-env contract test mixin, which users inherit to test their own
multi-agent backends, checked against PettingZoo's envs stepped by hand. It imports
PettingZoo (optional), so ``jaxrunner.testing`` loads it only on first use."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any, ClassVar

import jax
import numpy as np

from jaxrunner._src.backends.multi_agent.buffers import MultiAgentStep
from jaxrunner._src.backends.multi_agent.vector_env import MultiAgentVectorEnv
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.sub_env_handle import SubEnvHandle
from jaxrunner._src.testing.assertions import assert_trees_equal, expect_raises
from jaxrunner._src.testing.contract import sub_env_handles
from jaxrunner._src.testing.faults import FaultPlan
from jaxrunner._src.testing.multi_agent_envs import coming_and_going, relay, tictactoe
from jaxrunner._src.testing.multi_agent_faults import faulty_multi_agent_env_fns
from jaxrunner._src.testing.multi_agent_reference import MultiAgentEnvFactory, by_hand
from jaxrunner._src.testing.multi_agent_step_comparison import (
    actions_of_row,
    assert_acting,
    assert_row,
    sample_actions,
)
from jaxrunner.errors import ClosedError, EnvIndexError, InvalidActionError

# -- the contract test mixin ---------------------------------------------------------------------


def _sub_env_attr(sub: Any, name: str) -> Any:
    """Attribute ``name`` of an entry of ``get_sub_environments()`` (a handle's, or the
    PettingZoo env's own, as the vector env's ``get_attr`` reads it)."""
    return sub.get_attr(name) if isinstance(sub, SubEnvHandle) else getattr(sub, name)


def _set_sub_env_attr(sub: Any, name: str, value: Any) -> None:
    if isinstance(sub, SubEnvHandle):
        sub.set_attr(name, value)
    else:
        setattr(sub, name, value)


class MultiAgentVectorEnvContract:
    """Tests that a multi-agent vector-env backend keeps the contract of
    :mod:`jaxrunner._src.backends.multi_agent.vector_env`.

    Inherit it in a ``Test*`` class and implement :meth:`make_envs`; pytest then runs every
    ``test_*`` method below against the backend. The checks, on a parallel env whose
    agents leave and appear (:class:`~jaxrunner._src.testing.multi_agent_envs.ComingAndGoing`),
    a turn-based one (:class:`~jaxrunner._src.testing.multi_agent_envs.Relay`) and
    PettingZoo's own tictactoe:

    * ``reset_batch(seeds)`` resets sub-env ``i`` with ``seeds[i]``, as the env reset by
      hand;
    * step for step equal to the envs stepped by hand (PettingZoo's own loop): who acts
      on what, completed transitions (next observation, reward, flags), ``agent_start``,
      ``env_done`` with SAME_STEP autoreset, ``env_reward`` and the infos;
    * a bad action batch raises ``InvalidActionError`` before any sub-env steps;
    * ``reset_at(i)`` touches no other sub-env;
    * with a restart policy, a failed sub-env is restarted and no other is touched;
    * ``call``, ``get_attr``, ``set_attr``, ``render``; ``get_sub_environments()`` has
      one entry per sub-env, in order, each reaching its own sub-env only (an env
      object, or a handle that is closed with the vector env);
    * every call after ``close()`` raises ``ClosedError``; the context manager closes.
    """

    num_envs: ClassVar[int] = 3
    seed: ClassVar[int] = 42
    num_steps: ClassVar[int] = 30

    def make_envs(
        self,
        env_fns: Sequence[MultiAgentEnvFactory],
        restart_policy: RestartPolicy | None = None,
    ) -> MultiAgentVectorEnv:
        """Builds the backend under test from ``env_fns`` (one zero-argument PettingZoo
        env factory per sub-env, picklable), restarting failed sub-envs as
        ``restart_policy`` says (None: failures raise)."""
        raise NotImplementedError(
            "A MultiAgentVectorEnvContract subclass must implement make_envs()."
        )

    def env_cases(self) -> dict[str, MultiAgentEnvFactory]:
        """Named env factories the parity tests run on (override to add more)."""
        return {"coming_and_going": coming_and_going, "relay": relay, "tictactoe": tictactoe}

    def _seeds(self, base: int) -> list[int]:
        return [base + 7 * i for i in range(self.num_envs)]

    def _run_parity(
        self,
        envs: MultiAgentVectorEnv,
        refs: list[Any],
        out: MultiAgentStep,
        num_steps: int,
        rng: np.random.Generator,
        name: str,
    ) -> MultiAgentStep:
        """Steps the backend and the envs by hand with the same actions; asserts equal
        rows. Returns the last step's result."""
        groups = envs.groups
        for t in range(num_steps):
            actions = sample_actions(rng, groups, out)
            expected = [ref.step(actions_of_row(actions, groups, b)) for b, ref in enumerate(refs)]
            out = envs.step_batch(actions)
            if out.failed is not None:
                raise AssertionError(f"{name}: step {t}: sub-envs {out.errors} failed")
            for b, ref in enumerate(refs):
                assert_row(out, groups, b, expected[b], ref, f"{name}: step {t}")
        return out

    def test_reset_batch_seeds_sub_env_i_with_seeds_i(self) -> None:
        n = self.num_envs
        with closing(self.make_envs([coming_and_going] * n)) as envs:
            for seeds in (self._seeds(self.seed), [5] * n):
                refs = [by_hand(coming_and_going) for _ in range(n)]
                out = envs.reset_batch(seeds)
                for b, (ref, seed) in enumerate(zip(refs, seeds)):
                    ref.reset(seed)
                    assert_acting(out, envs.groups, b, ref, f"reset_batch({seeds})")

    def test_step_for_step_equal_to_the_envs_steppedby_hand(self) -> None:
        n = self.num_envs
        for name, factory in self.env_cases().items():
            rng = np.random.default_rng(self.seed)
            with closing(self.make_envs([factory] * n)) as envs:
                refs = [by_hand(factory) for _ in range(n)]
                for seeds in (self._seeds(self.seed), self._seeds(self.seed + 1000)):
                    out = envs.reset_batch(seeds)
                    for b, (ref, seed) in enumerate(zip(refs, seeds)):
                        ref.reset(seed)
                        assert_acting(out, envs.groups, b, ref, f"{name}: reset")
                    self._run_parity(envs, refs, out, self.num_steps, rng, name)

    def test_invalid_actions_rejected_before_any_step(self) -> None:
        n = self.num_envs
        for factory in (coming_and_going, relay):
            rng = np.random.default_rng(self.seed)
            with closing(self.make_envs([factory] * n)) as envs:
                refs = [by_hand(factory) for _ in range(n)]
                out = envs.reset_batch(self._seeds(self.seed))
                for ref, seed in zip(refs, self._seeds(self.seed)):
                    ref.reset(seed)
                out = self._run_parity(envs, refs, out, 2, rng, "before bad actions")
                steps = envs.get_attr("t")
                good = sample_actions(rng, envs.groups, out)
                bad = {
                    "one batch too many": [*good, good[0]],
                    "no batch": [],
                    "one env too few": [x[:-1] for x in good],
                    "an agent too many": [np.concatenate([x, x[:, :1]], 1) for x in good],
                    "float actions": [x.astype(np.float64) for x in good],
                    "an extra axis": [x[..., None] for x in good],
                }
                for what, actions in bad.items():
                    expect_raises(InvalidActionError, lambda a=actions: envs.step_batch(a), what)
                    if envs.get_attr("t") != steps:
                        raise AssertionError(f"{what}: a sub-env stepped before the error")
                # Nothing moved: later steps still equal the envs stepped by hand.
                self._run_parity(envs, refs, out, 10, rng, "after bad actions")

    def test_reset_at_touches_no_other_env(self) -> None:
        n, index = self.num_envs, 1
        rng = np.random.default_rng(self.seed)
        with closing(self.make_envs([coming_and_going] * n)) as envs:
            refs = [by_hand(coming_and_going) for _ in range(n)]
            out = envs.reset_batch(self._seeds(self.seed))
            for ref, seed in zip(refs, self._seeds(self.seed)):
                ref.reset(seed)
            out = self._run_parity(envs, refs, out, 2, rng, "before reset_at")
            fields = ("acting", "agent_start", "obs")
            before = {
                pid: {f: jax.tree.map(np.copy, getattr(buf, f)) for f in fields}
                for pid, buf in out.groups.items()
            }
            infos = envs.reset_at(index, seed=99)
            assert_trees_equal(infos, refs[index].reset(99), "reset_at's infos")
            for b in range(n):
                # Row ``index`` is the new episode's; the other rows are as they were.
                ref = refs[b] if b == index else None
                for group in envs.groups:
                    buf, old = out.groups[group.policy_id], before[group.policy_id]
                    if ref is None:
                        for field in fields:
                            assert_trees_equal(
                                jax.tree.map(lambda x, b=b: x[b], getattr(buf, field)),
                                jax.tree.map(lambda x, b=b: x[b], old[field]),
                                f"row {b}.{field} after reset_at({index})",
                            )
                if ref is not None:
                    assert_acting(out, envs.groups, b, ref, f"reset_at({index})")
            self._run_parity(envs, refs, out, 10, rng, "after reset_at")

    def test_a_restart_touches_no_other_env(self) -> None:
        """Sub-env 1 raises at every third step of each instance; with a restart policy
        it is recreated each time (its step holds no transition, its new episode is an
        unseeded fresh env's), and the other sub-envs go on as the envs stepped by hand."""
        for factory in (coming_and_going, relay):
            self._check_restarts(factory, index=1, every=3)

    def _check_restarts(self, factory: MultiAgentEnvFactory, index: int, every: int) -> None:
        n = self.num_envs
        fns = faulty_multi_agent_env_fns(
            factory, n, {index: [FaultPlan(kind="raise", at=(every,))]}
        )
        rng = np.random.default_rng(self.seed)
        with closing(self.make_envs(fns, restart_policy=RestartPolicy())) as envs:
            groups = envs.groups
            refs = [by_hand(factory) for _ in range(n)]
            out = envs.reset_batch(self._seeds(self.seed))
            for ref, seed in zip(refs, self._seeds(self.seed)):
                ref.reset(seed)
            restarts = 0
            for t in range(4 * every):
                actions = sample_actions(rng, groups, out)
                out = envs.step_batch(actions)
                where = f"{factory.__name__}: step {t}"
                # Each instance of sub-env ``index`` fails at its ``every``-th step (the
                # contract envs have no AEC dead step before it).
                fails = t % every == every - 1
                failed = [] if out.failed is None else np.flatnonzero(out.failed).tolist()
                if failed != ([index] if fails else []):
                    raise AssertionError(f"{where}: failed sub-envs {failed}")
                for b, ref in enumerate(refs):
                    if b == index and fails:  # recreated and reset (unseeded)
                        refs[b] = ref = by_hand(factory)
                        ref.reset(None)
                        for group in groups:
                            if out.groups[group.policy_id].completed[b].any():
                                raise AssertionError(f"{where}: a failed step has transitions")
                        assert_acting(out, groups, b, ref, where)
                        restarts += 1
                        continue
                    expected = ref.step(actions_of_row(actions, groups, b))
                    assert_row(out, groups, b, expected, ref, where)
            if envs.get_num_restarts() != restarts:
                raise AssertionError(f"get_num_restarts() = {envs.get_num_restarts()}")

    def test_call_get_attr_set_attr_render(self) -> None:
        n = self.num_envs
        with closing(self.make_envs([coming_and_going] * n)) as envs:
            envs.reset_batch(self._seeds(self.seed))
            assert_trees_equal(envs.get_attr("episode"), (0,) * n, "get_attr")
            envs.set_attr("episode", [5 + b for b in range(n)])
            assert_trees_equal(envs.get_attr("episode"), tuple(5 + b for b in range(n)), "set")
            envs.set_attr("episode", 3)  # one value for all
            assert_trees_equal(envs.get_attr("episode"), (3,) * n, "set_attr(one value)")
            agent_index = envs.call("_obs", "a1")
            assert_trees_equal(tuple(float(o[1]) for o in agent_index), (1.0,) * n, "call")
            assert_trees_equal(envs.call("possible_agents")[0], ["a0", "a1", "a2", "a3"], "call")
            assert_trees_equal(envs.render(), (0,) * n, "render")
            expect_raises(EnvIndexError, lambda: envs.reset_at(n), "reset_at(num_envs)")
            self._check_sub_environments(envs)  # on these envs: no other to build

    def _check_sub_environments(self, envs: MultiAgentVectorEnv) -> None:
        """``get_sub_environments()``: one entry per sub-env, in index order, the env
        object (in this process) or a
        :class:`~jaxrunner._src.backends.sub_env_handle.SubEnvHandle`. Each reads its
        own sub-env's attributes and renders, ``set_attr`` through sub-env 1's changes
        sub-env 1 only, and a handle's ``call`` equals the vector env's for its sub-env."""
        n = self.num_envs
        episodes = [10 + b for b in range(n)]  # tells the sub-envs apart
        envs.set_attr("episode", episodes)
        subs = envs.get_sub_environments()
        if len(subs) != n:
            raise AssertionError(f"get_sub_environments(): {len(subs)} entries, not {n}")
        got = tuple(_sub_env_attr(sub, "episode") for sub in subs)
        assert_trees_equal(got, tuple(episodes), "each entry's episode (index order)")
        _set_sub_env_attr(subs[1], "episode", 99)
        episodes[1] = 99
        assert_trees_equal(envs.get_attr("episode"), tuple(episodes), "set_attr of sub-env 1")
        assert_trees_equal(tuple(sub.render() for sub in subs), envs.render(), "render()s")
        for b, sub in enumerate(subs):
            if isinstance(sub, SubEnvHandle):
                got = (sub.index, sub.call("observation_space", "a0"))
                want = (b, envs.call("observation_space", "a0")[b])
                if got != want:
                    raise AssertionError(f"{sub!r}.call(): {got} != {want}")

    def test_every_call_after_close_raises(self) -> None:
        n = self.num_envs
        envs = self.make_envs([coming_and_going] * n)
        out = envs.reset_batch(self._seeds(self.seed))
        actions = sample_actions(np.random.default_rng(self.seed), envs.groups, out)
        handles = sub_env_handles(envs)
        envs.close()
        envs.close()  # closing twice is allowed and does nothing
        calls: dict[str, Callable[[], Any]] = {
            "reset_batch": lambda: envs.reset_batch([0] * n),
            "step_batch": lambda: envs.step_batch(actions),
            "reset_at": lambda: envs.reset_at(0),
            "render": envs.render,
            "call": lambda: envs.call("render"),
            "get_attr": lambda: envs.get_attr("t"),
            "set_attr": lambda: envs.set_attr("t", 1),
            "get_sub_environments": envs.get_sub_environments,
            **{f"{h!r}.get_attr": lambda h=h: h.get_attr("t") for h in handles},
        }
        for name, call in calls.items():
            expect_raises(ClosedError, call, f"{name}() after close()")

    def test_context_manager_closes(self) -> None:
        n = self.num_envs
        with self.make_envs([coming_and_going] * n) as envs:
            out = envs.reset_batch(self._seeds(self.seed))
            actions = sample_actions(np.random.default_rng(self.seed), envs.groups, out)
            envs.step_batch(actions)
        expect_raises(ClosedError, lambda: envs.step_batch(actions), "step_batch() after with")

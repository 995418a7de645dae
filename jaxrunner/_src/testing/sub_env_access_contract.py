"""The contract's checks of the calls that reach the sub-envs without stepping them (``call``,
``get_attr``, ``set_attr``, ``render``, ``get_sub_environments``) and of closing, after which
every call raises. A mixin of :class:`~jaxrunner._src.testing.contract.VectorEnvContract`."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from typing import Any

from jaxrunner._src.backends.sub_env_handle import SubEnvHandle, run_on_env
from jaxrunner._src.testing.assertions import assert_trees_equal, expect_raises
from jaxrunner._src.testing.reference import ContractParts, EnvKind
from jaxrunner._src.testing.step_comparison import ActionSampler, read_rows
from jaxrunner.errors import ClosedError, EnvIndexError, InvalidArgumentError


def _on_sub_env(sub: Any, method: str, args: tuple) -> Any:
    """``method(*args)`` on an entry of ``get_sub_environments()`` (a handle or the env)."""
    if isinstance(sub, SubEnvHandle):
        return getattr(sub, method)(*args)
    return run_on_env(sub, method, args)


class SubEnvAccessContract(ContractParts):
    """The checks of :class:`~jaxrunner._src.testing.contract.VectorEnvContract`'s docstring
    from ``call`` on: reaching the sub-envs, and closing."""

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

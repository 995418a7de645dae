"""The vector-env contract test mixin, which users inherit to test their own backends on every
kind of env a backend serves. Like everything in this package, it does not import pytest:
its checks raise ``AssertionError`` themselves."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import gymnasium

from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.testing.envs import (
    DictObsEnv,
    coming_and_going,
    counting_env_fns,
    relay,
    tictactoe,
)
from jaxrunner._src.testing.gymnasium_contract import GymnasiumVectorApiContract
from jaxrunner._src.testing.reference import ByHand, EnvKind, by_hand
from jaxrunner._src.testing.step_comparison import Row, assert_acting, read_rows
from jaxrunner._src.testing.stepping_contract import SteppingContract
from jaxrunner._src.testing.sub_env_access_contract import SubEnvAccessContract

EnvFns = Callable[[], Any] | Sequence[Callable[[], Any]]
"""One factory for every sub-env, or one per sub-env."""


# pytest runs base classes' tests first: gymnasium's API, then stepping, then sub-env access.
class VectorEnvContract(SubEnvAccessContract, SteppingContract, GymnasiumVectorApiContract):
    """Tests that a vector-env backend keeps the contract of :class:`~jaxrunner.VectorEnv`,
    on every kind of env it serves (:attr:`env_kinds`).

    Inherit it in a ``Test*`` class and implement :meth:`make_vec`; pytest then runs every
    ``test_*`` method below once per kind (``[gymnasium]``, ``[parallel]``, ``[aec]``).
    Written once for every kind, against the same envs stepped by hand (a gymnasium env
    is the one-agent case; PettingZoo's by its own loop), on envs whose agents leave and
    appear, turn-based ones and PettingZoo's own tictactoe:

    * ``reset_batch(seeds)`` resets sub-env ``i`` with ``seeds[i]``;
    * step for step equal to the envs stepped by hand: who acts on what, completed
      transitions (next observation, reward, flags), the env's reward and the rewards
      no transition carries (``unassigned_reward``), SAME_STEP autoreset, the infos; no
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

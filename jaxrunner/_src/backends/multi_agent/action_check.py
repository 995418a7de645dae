"""The check of a multi-agent step's actions: every group's ``[B, A_g, ...]`` batch,
before any sub-env steps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from jaxrunner._src import space_arrays
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner.errors import InvalidActionError


class ActionCheck:
    """Validates every group's ``[B, A_g, ...]`` action batch as a whole (every row's,
    acting or not); a call returns the actions in the spaces' dtypes or raises
    InvalidActionError. The common case passes ``passing_batch_test`` inline."""

    def __init__(self, groups: Sequence[AgentGroup], num_envs: int) -> None:
        self.groups, self.num_envs = tuple(groups), num_envs
        tests = [
            space_arrays.passing_batch_test(g.action_space, (num_envs, g.num_agents))
            for g in self.groups
        ]
        self._passes = None if None in tests else [t for t in tests if t is not None]

    def __call__(self, actions: Sequence[Any]) -> Sequence[Any]:
        """The actions, each group's in its space's dtypes (what its agents are handed)."""
        tests = self._tests(actions)
        if tests is None or not all(test(batch) for test, batch in zip(tests, actions)):
            actions = self._check(actions)
        return self._cast(actions)

    def passed(self, actions: Sequence[Any]) -> Sequence[Any]:
        """:meth:`__call__` of actions known to pass its tests (a runner's policy step
        checked their values): only cast, where every group has an inline test."""
        return self._cast(actions) if self._tests(actions) else self(actions)

    def _tests(self, actions: Sequence[Any]) -> list[Any] | None:
        """Each group's inline test, where every group of ``actions`` has one."""
        return self._passes if self._passes and len(actions) == len(self._passes) else None

    def _cast(self, actions: Sequence[Any]) -> list[Any]:
        return [
            space_arrays.as_space_dtypes(g.action_space, a) for g, a in zip(self.groups, actions)
        ]

    def _check(self, actions: Sequence[Any]) -> Sequence[Any]:
        import jax  # here, not at the top: a Ray actor's import of this module skips JAX

        groups, num_envs = self.groups, self.num_envs
        if len(actions) != len(groups):
            raise InvalidActionError(
                f"multi-agent step: expected one action batch per group ({len(groups)}: "
                f"{[g.policy_id for g in groups]}), got {len(actions)}."
            )
        checked = []
        for group, batch in zip(groups, actions):
            if not isinstance(group.action_space, (spaces.Dict, spaces.Tuple)):
                batch = np.asarray(batch)  # lists read as numpy reads them, as single-agent
            checked.append(batch)
            rows = num_envs * group.num_agents
            lead = (num_envs, group.num_agents)

            def flat(x: Any, lead: tuple[int, int] = lead, group: AgentGroup = group) -> Any:
                shape = np.shape(x)
                if shape[:2] != lead:
                    raise InvalidActionError(
                        f"multi-agent step: group {group.policy_id!r} expected actions of "
                        f"leading shape [B, A_g] = {lead}, got shape {shape}."
                    )
                return np.asarray(x).reshape(-1, *shape[2:])

            def row_name(row: int, group: AgentGroup = group) -> str:
                env, a = divmod(row, group.num_agents)
                return f"sub-env {env} agent {group.agents[a]!r}"

            space_arrays.check_action_batch(
                group.action_space,
                jax.tree.map(flat, batch),
                rows,
                f"[{group.policy_id!r}]",
                row_name,
                rows_are="B*A_g",
            )
        return checked

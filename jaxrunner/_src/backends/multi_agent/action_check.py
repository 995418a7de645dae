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
    """Validates every group's ``[B, A_g, ...]`` action batch as a whole, before any
    sub-env steps (shapes, dtypes, and the range of ``Discrete`` and ``MultiDiscrete``
    actions, every row's, acting or not; nothing is cast). A call returns the actions.

    The common case (one numpy array per group, of the expected shape and dtype kind)
    is tested inline; anything else goes through
    :func:`~jaxrunner._src.space_arrays.check_action_batch`, which names what is wrong.

    Raises (from a call):
        InvalidActionError: a batch of the wrong structure, shape or dtype, or an action
            out of range.
    """

    def __init__(self, groups: Sequence[AgentGroup], num_envs: int) -> None:
        self.groups, self.num_envs = tuple(groups), num_envs
        self._fast: list[tuple[tuple[int, ...], str, Any]] | None = []
        for group in self.groups:
            space = group.action_space
            if type(space) not in space_arrays.LEAF_TYPES:
                self._fast = None
                break
            shape, dtype = space_arrays.leaf_spec(space)
            kinds = "iu" if dtype.kind in "iu" else "f" if dtype.kind == "f" else ""
            ranged = isinstance(space, (spaces.Discrete, spaces.MultiDiscrete))
            self._fast.append(((num_envs, group.num_agents, *shape), kinds, ranged and space))

    def __call__(self, actions: Sequence[Any]) -> Sequence[Any]:
        fast = self._fast
        if fast is not None and len(actions) == len(fast):
            for batch, (shape, kinds, ranged) in zip(actions, fast):
                if not (
                    type(batch) is np.ndarray and batch.shape == shape and batch.dtype.kind in kinds
                ):
                    break
                if ranged:  # only Discrete and MultiDiscrete groups pay for the range
                    flat = batch.reshape(shape[0] * shape[1], *shape[2:])
                    if space_arrays.out_of_range_row(ranged, flat) is not None:
                        break
            else:
                return actions
        return self._check(actions)

    def _check(self, actions: Sequence[Any]) -> Sequence[Any]:
        import jax  # here, not at the top: a Ray actor's import of this module skips JAX

        groups, num_envs = self.groups, self.num_envs
        if len(actions) != len(groups):
            raise InvalidActionError(
                f"multi-agent step: expected one action batch per group ({len(groups)}: "
                f"{[g.policy_id for g in groups]}), got {len(actions)}."
            )
        for group, batch in zip(groups, actions):
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
        return actions

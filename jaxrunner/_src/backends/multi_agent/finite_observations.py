"""NaN and infinity in a block's multi-agent observations: the single-agent loop's check
(:func:`~jaxrunner._src.space_arrays.checks.all_finite_test` and
:func:`~jaxrunner._src.space_arrays.checks.nonfinite_observations`) over every group's
agent rows, reported by sub-env."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jaxrunner._src.backends.multi_agent.buffers import GroupBuffers
from jaxrunner._src.backends.multi_agent.layout import Layout
from jaxrunner._src.space_arrays.checks import all_finite_test, nonfinite_observations
from jaxrunner.errors import InvalidStepError

FiniteTest = Callable[[int, int], bool]


class FiniteObservations:
    """Finds the sub-envs of a block whose ``obs`` or ``next_obs`` rows hold a NaN or an
    infinity. A step costs one sum per floating-point leaf, group and buffer (as the
    single-agent loop's); the exact check runs only when a sum is not finite.

    The buffers must hold finite values only, except where this step wrote: the block
    clears a failed row's observations (``AgentStepBuffers.fail_row`` and ``_fresh``).
    """

    def __init__(self, buffers: Sequence[GroupBuffers], layout: Layout) -> None:
        self._groups: list[tuple[Any, int, GroupBuffers, Any, FiniteTest, FiniteTest]] = []
        for group, buf, where in zip(layout.groups, buffers, layout.row_names):
            space = group.observation_space
            next_finite = all_finite_test(space, buf.next_obs_rows)
            obs_finite = all_finite_test(space, buf.obs_rows)
            if next_finite is not None and obs_finite is not None:  # else no float leaf
                self._groups.append((space, group.num_agents, buf, where, next_finite, obs_finite))

    def step(
        self, lo: int, hi: int, env_done: np.ndarray, obs_apart: bool = True
    ) -> dict[int, tuple[InvalidStepError, bool]]:
        """Rows ``[lo, hi)`` after a step: sub-env row ``b`` -> ``(error, in_step)``;
        ``in_step`` is False where only the observations of the reset after the episode's
        end (``env_done[b]``) are bad: the step's transitions are good. ``obs_apart``
        False (``Layout.obs_apart``): every ``obs`` written is a ``next_obs`` too, so
        only ``next_obs`` is tested."""
        bad: dict[int, tuple[InvalidStepError, bool]] = {}
        for space, a, buf, where, next_finite, obs_finite in self._groups:
            rows = lo * a, hi * a
            if not next_finite(*rows):
                found = nonfinite_observations(space, buf.next_obs_rows, *rows, "step", (), where)
                for row, err in found.items():
                    bad.setdefault(row // a, (err, True))
            if obs_apart and not obs_finite(*rows):
                found = nonfinite_observations(space, buf.obs_rows, *rows, "step", (), where)
                for row, err in found.items():
                    b = row // a
                    if b in bad:
                        continue
                    # Where the episode ended, every observation is the reset's.
                    reset_error = self.row(b, "reset") if env_done[b] else None
                    bad[b] = (reset_error, False) if reset_error else (err, True)
        return bad

    def row(self, b: int, call: str) -> InvalidStepError | None:
        """The first NaN or infinity in row ``b``'s ``obs`` (after ``call``), as an error."""
        for space, a, buf, where, _, _ in self._groups:
            found = nonfinite_observations(space, buf.obs_rows, b * a, (b + 1) * a, call, (), where)
            if found:
                return found[min(found)]
        return None

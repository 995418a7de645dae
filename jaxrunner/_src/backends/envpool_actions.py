"""What EnvPool's C++ trusts, checked before it is sent: ``Discrete`` actions in range
and async env ids. See docs/backends/envpool.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

from jaxrunner._src.backends.batch_step import EnvIds
from jaxrunner._src.space_arrays.actions import check_action_batch, passing_batch_test
from jaxrunner.errors import EnvIndexError, InvalidActionError, InvalidArgumentError


class EnvPoolActions:
    """Checks one pool's action batches before EnvPool's C++, which trusts them: the
    common batch passes inline (one ``passing_batch_test`` per batch size); any other goes
    through ``check_action_batch`` (its range checks come before any cast could wrap a
    value), whose error names the task, the row, its sub-env and the value."""

    def __init__(self, task_id: str, space: spaces.Space) -> None:
        self.task_id, self.space = task_id, space
        self._passes: dict[int, Callable[[Any], bool] | None] = {}

    def __call__(self, actions: Any, rows: np.ndarray) -> Any:
        n = len(rows)
        if n not in self._passes:
            self._passes[n] = passing_batch_test(self.space, (n,))
        passes = self._passes[n]
        if passes is not None and passes(actions):
            return actions
        try:
            return check_action_batch(
                self.space, actions, n, row_name=lambda i: f"sub-env {rows[i]}"
            )
        except InvalidActionError as err:
            raise InvalidActionError(
                f"EnvPool {self.task_id}: {err} EnvPool's C++ does not check actions (one far "
                "out of range crashes the process)."
            ) from None


def check_env_ids(env_ids: EnvIds, num_envs: int, in_flight: np.ndarray, who: str) -> np.ndarray:
    """The ``env_ids`` of an async ``send`` (None: all, a slice, or distinct ids in
    range) as an int32 array, refusing any still ``in_flight``."""
    if env_ids is None or isinstance(env_ids, slice):
        ids = np.arange(num_envs)[slice(None) if env_ids is None else env_ids]
    else:
        ids = np.atleast_1d(np.asarray(env_ids))
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise InvalidArgumentError(
                f"{who}.send(env_ids={env_ids!r}): expected None, a slice or a 1-d array of "
                "integer env ids."
            )
        outside = (ids < 0) | (ids >= num_envs)
        if outside.any():
            raise EnvIndexError(
                f"{who}.send(env_ids=...): env id {ids[outside][0]} is not in "
                f"[0, {num_envs}); pass the ids of the envs to step."
            )
    if len(ids) == 0:
        raise InvalidArgumentError(f"{who}.send(env_ids={env_ids!r}): no env to step.")
    if len(np.unique(ids)) != len(ids):
        raise InvalidArgumentError(
            f"{who}.send(env_ids={ids.tolist()}): an env id is repeated; each env steps once "
            "per send."
        )
    busy = in_flight[ids]
    if busy.any():
        raise InvalidArgumentError(
            f"{who}.send(env_ids=...): envs {ids[busy].tolist()} are still stepping; recv() "
            "their results before sending them again."
        )
    return ids.astype(np.int32)

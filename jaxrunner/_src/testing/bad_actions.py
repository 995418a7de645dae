"""Action batches a vector env must reject (the contract's invalid-action test), derived
from a valid batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces


def bad_gymnasium_actions(good: Any, space: gymnasium.Space) -> dict[str, Any]:
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
        **_out_of_range(good, space, lambda x: x[-1:]),
    }


def bad_agent_actions(good: list[np.ndarray], groups: Sequence[Any]) -> dict[str, Any]:
    """Per-group action batches a multi-agent backend must reject."""
    bad = {
        "one batch too many": [*good, good[0]],
        "no batch": [],
        "one env too few": [x[:-1] for x in good],
        "an agent too many": [np.concatenate([x, x[:, :1]], 1) for x in good],
        "float actions": [x.astype(np.float64) for x in good],
        "an extra axis": [x[..., None] for x in good],
    }
    for g, group in enumerate(groups):
        for what, batch in _out_of_range(
            good[g], group.action_space, lambda x: x[-1:, -1:]
        ).items():
            bad[f"group {group.policy_id!r}: {what}"] = [*good[:g], batch, *good[g + 1 :]]
    return bad


def _out_of_range(good: np.ndarray, space: gymnasium.Space, last: Callable) -> dict[str, Any]:
    """``good`` with the last sub-env's action outside a ``Discrete`` space's range (an
    env may crash on one, or wrap it silently)."""
    if not isinstance(space, spaces.Discrete):
        return {}
    bad = {}
    for value in (int(space.start + space.n), int(space.start) - 1, 2**31 - 1):
        batch = good.copy()
        last(batch)[...] = value
        bad[f"action {value} (outside {space})"] = batch
    return bad

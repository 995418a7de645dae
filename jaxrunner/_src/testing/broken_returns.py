"""What the faults that return garbage make of an env's good returns (:func:`break_returns`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxrunner.errors import InvalidArgumentError


def _map_first_leaf(obs: Any, fn: Callable[[np.ndarray], Any]) -> Any:
    if isinstance(obs, Mapping):
        key = next(iter(obs))
        return {**obs, key: _map_first_leaf(obs[key], fn)}
    if isinstance(obs, tuple):
        return (_map_first_leaf(obs[0], fn), *obs[1:])
    return fn(np.asarray(obs))


def _break_obs(kind: str, obs: Any) -> Any:
    if kind == "bad_obs":
        return _map_first_leaf(obs, lambda leaf: leaf[None])
    if kind == "obs_dtype":
        return _map_first_leaf(
            obs, lambda leaf: leaf.astype(np.float32 if leaf.dtype == np.float64 else np.float64)
        )
    if not isinstance(obs, Mapping):
        raise InvalidArgumentError(
            f"FaultPlan(kind='obs_missing_key'): expected an env with dict observations, got "
            f"a {type(obs).__name__} observation. Use kind='bad_obs' or 'obs_dtype'."
        )
    return dict(list(obs.items())[1:])


def break_returns(kind: str, obs: Any, reward: Any, terminated: Any, info: Any) -> tuple:
    """What a garbage fault of ``kind`` makes of one agent's good returns.

    Args:
        kind: a :data:`FaultKind` that returns garbage (not one of the kinds that never
            return).
        obs, reward, terminated, info: what the env returned (for a reset, any
            ``reward`` and ``terminated``: reset faults never break them).

    Returns:
        ``(obs, reward, terminated, info)`` with the one part ``kind`` breaks broken.
    """
    if kind in ("nan_reward", "inf_reward"):
        reward = float("nan") if kind == "nan_reward" else float("inf")
    elif kind == "array_reward":
        reward = np.array([reward, reward])
    elif kind == "list_reward":
        reward = [reward, reward]
    elif kind == "flag_not_bool":
        terminated = int(terminated)
    elif kind == "info_not_dict":
        info = list(info.items())
    else:
        obs = _break_obs(kind, obs)
    return obs, reward, terminated, info

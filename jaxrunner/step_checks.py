"""Validation of what a sub-env returns: the slow paths of every backend's step loop
(the loops test the common types inline and call these for anything else)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from jaxrunner.errors import InvalidStepError


def check_reward(value: Any, index: int) -> float:
    """A reward as a Python float, or a clear error (slow path of the step loop)."""
    if isinstance(value, (bool, np.bool_)) or not (
        isinstance(value, (int, float, np.integer, np.floating))
        or (isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iuf")
    ):
        raise InvalidStepError(
            f"sub-env {index} returned a reward of type {type(value).__name__} "
            f"({value!r:.60}); expected a finite scalar (float). Return float(reward) "
            "from the env's step()."
        )
    reward = float(value)
    if not math.isfinite(reward):
        raise InvalidStepError(
            f"sub-env {index} returned a non-finite reward ({reward}); expected a finite "
            "float. Fix the env, or clip/replace NaN and inf rewards in a wrapper."
        )
    return reward


def check_info(value: Any, index: int, call: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidStepError(
            f"sub-env {index} returned an info of type {type(value).__name__} from {call}(); "
            "expected a dict (gymnasium's API). Return {} when there is nothing to report."
        )
    return value


def check_flag(value: Any, index: int, name: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise InvalidStepError(
        f"sub-env {index} returned {name}={value!r:.60} of type {type(value).__name__}; "
        f"expected a bool. Return bool({name}) from the env's step()."
    )


__all__ = ["check_flag", "check_info", "check_reward"]

"""Strict checks of single values (one observation, one action) against their space.

Used where values come from outside jaxrunner's own loop: external envs and the
policy server. A value passes only if it is exactly what the space declares
(a mismatch is never cast silently); the result is a fresh tree of numpy arrays the
caller may keep. Nothing is touched on failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from jaxrunner.errors import SpaceMismatchError


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an ndarray of dtype {value.dtype} and shape {value.shape}"
    if isinstance(value, np.generic):
        return f"a numpy scalar of dtype {value.dtype}"
    return f"a {type(value).__name__}"


def check_value(space: spaces.Space, value: Any, what: str, *, bounds: bool = True) -> Any:
    """Returns ``value`` as a fresh tree of numpy arrays that fits ``space`` exactly.

    Args:
        space: a single (unbatched) gymnasium space.
        value: the value to check: arrays of exactly the space's dtype and shape;
            a Python or numpy integer for ``Discrete``; dicts/tuples for composites.
        what: names the value in error messages (``"obs"``, ``"action"``).
        bounds: if True, values must lie inside the space (``space.contains``); if
            False (sampled Box actions, which jaxrunner keeps unclipped), Box values
            need only be finite. Discrete, MultiDiscrete and MultiBinary values are
            always range-checked.

    Raises:
        SpaceMismatchError: naming the path inside the value, what was expected and
            what came.
    """
    return _check(space, value, what, bounds)


def _check(space: spaces.Space, value: Any, path: str, bounds: bool) -> Any:
    if isinstance(space, spaces.Dict):
        if not isinstance(value, Mapping) or set(value) != set(space.spaces):
            got = sorted(map(str, value)) if isinstance(value, Mapping) else _describe(value)
            raise SpaceMismatchError(
                f"{path}: expected a dict with keys {sorted(space.spaces)}, got {got}."
            )
        return {k: _check(sub, value[k], f"{path}[{k!r}]", bounds) for k, sub in space.items()}
    if isinstance(space, spaces.Tuple):
        n = len(space.spaces)
        if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != n:
            raise SpaceMismatchError(
                f"{path}: expected a tuple of {n} items, got {_describe(value)}"
                + (f" of {len(value)} items." if isinstance(value, Sequence) else ".")
            )
        return tuple(
            _check(sub, v, f"{path}[{j}]", bounds) for j, (sub, v) in enumerate(zip(space, value))
        )
    dtype, shape = np.dtype(space.dtype), tuple(space.shape)
    if isinstance(space, spaces.Discrete):
        if isinstance(value, (bool, np.bool_)) or not (
            isinstance(value, (int, np.integer))
            or (isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu")
        ):
            raise SpaceMismatchError(
                f"{path}: expected an integer (Discrete({space.n}, start={space.start})), got "
                f"{_describe(value)}."
            )
        number = int(value)
        if not int(space.start) <= number < int(space.start) + int(space.n):
            raise SpaceMismatchError(
                f"{path}: {number} is outside Discrete({space.n}, start={space.start}); "
                f"expected {space.start} <= value < {int(space.start) + int(space.n)}."
            )
        return np.asarray(number, dtype=dtype)
    exact = isinstance(value, np.ndarray) or (isinstance(value, np.generic) and shape == ())
    if not exact or value.dtype != dtype or np.shape(value) != shape:
        raise SpaceMismatchError(
            f"{path}: expected an ndarray of dtype {dtype} and shape {shape}, got "
            f"{_describe(value)}. Values are never cast: convert them to the space's dtype "
            "first."
        )
    array = np.array(value, dtype=dtype)
    if isinstance(space, spaces.Box) and not bounds:
        if dtype.kind == "f" and not np.isfinite(array).all():
            raise SpaceMismatchError(f"{path}: expected finite values, got NaN or infinity.")
        return array
    if not space.contains(array):
        raise SpaceMismatchError(
            f"{path}: the value is outside the space {space} (out of bounds, or NaN)."
        )
    return array

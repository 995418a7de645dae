"""Every check of a value against its space or gymnasium's API, in one wording:
``<where>: expected <what the space declares>, got <what came>. <how to fix it>``.
Nothing is cast, except Python and numpy integers for ``Discrete`` (exact, to int64)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from jaxrunner._src.space_arrays.buffers import (
    LEAF_SPACES,
    allocate,
    leaf_spaces,
    leaf_spec,
    leaves,
)
from jaxrunner.errors import InvalidStepError, SpaceMismatchError

SUPPORTED_SPACES = (*LEAF_SPACES, spaces.Dict, spaces.Tuple)
NEVER_CAST = "jaxrunner never casts silently"


def _describe(value: Any) -> str:
    """What came, for an error message: type, dtype and shape, keys or a short repr."""
    if isinstance(value, np.ndarray):
        return f"an ndarray of dtype {value.dtype} and shape {value.shape}"
    if isinstance(value, np.generic):
        return f"a numpy scalar of dtype {value.dtype} ({value!r:.60})"
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # jax arrays, ShapeDtypeStruct
        return f"an array of dtype {value.dtype} and shape {tuple(value.shape)}"
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    if isinstance(value, Mapping):
        return f"{article} {name} with keys {sorted(map(str, value))}"
    if isinstance(value, (list, tuple)):
        return f"{article} {name} of {len(value)} items ({value!r:.60})"
    return f"{article} {name} ({value!r:.60})"


def mismatch(where: str, expected: str, value: Any, fix: str) -> SpaceMismatchError:
    """The one ``SpaceMismatchError`` wording: where, what was expected, what came (``value``,
    described), and how to fix it."""
    return SpaceMismatchError(f"{where}: expected {expected}, got {_describe(value)}. {fix}")


# -- spaces --------------------------------------------------------------------------------------


def check_supported(space: spaces.Space, path: str = "space") -> None:
    """Raises ``SpaceMismatchError`` if ``space`` (or a part of it) is not supported."""
    for keys, leaf in leaf_spaces(space).items():
        if not isinstance(leaf, SUPPORTED_SPACES):
            names = ", ".join(cls.__name__ for cls in SUPPORTED_SPACES)
            raise SpaceMismatchError(
                f"{path}{''.join(f'[{key!r}]' for key in keys)} is a {type(leaf).__name__}, "
                "which jaxrunner cannot stack into fixed-shape arrays; supported spaces are "
                f"{names} (nested freely). Flatten it with a gymnasium observation/action "
                "wrapper first."
            )


# -- one value (external envs, the policy server) ------------------------------------------------


def check_value(space: spaces.Space, value: Any, what: str, *, bounds: bool = True) -> Any:
    """``value`` (from outside jaxrunner's loop: external envs, the policy server) as a
    fresh tree of numpy arrays of exactly ``space``'s dtypes and shapes, else a
    SpaceMismatchError naming the path (``what`` names the value). ``bounds=False``
    (sampled Box actions, kept unclipped) asks Box values only to be finite; discrete
    values are always range-checked."""
    if isinstance(space, spaces.Dict):
        if not isinstance(value, Mapping) or set(value) != set(space.spaces):
            raise SpaceMismatchError(
                f"{what}: expected a dict with keys {sorted(space.spaces)}, got {_describe(value)}."
            )
        return {
            k: check_value(sub, value[k], f"{what}[{k!r}]", bounds=bounds)
            for k, sub in space.items()
        }
    if isinstance(space, spaces.Tuple):
        n = len(space.spaces)
        if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != n:
            raise SpaceMismatchError(
                f"{what}: expected a tuple of {n} items, got {_describe(value)}."
            )
        return tuple(
            check_value(sub, v, f"{what}[{j}]", bounds=bounds)
            for j, (sub, v) in enumerate(zip(space, value))
        )
    shape, dtype = leaf_spec(space)
    if isinstance(space, spaces.Discrete):
        discrete = f"Discrete({space.n}, start={space.start})"
        if isinstance(value, (bool, np.bool_)) or not (
            isinstance(value, (int, np.integer))
            or (isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu")
        ):
            raise SpaceMismatchError(
                f"{what}: expected an integer ({discrete}), got {_describe(value)}."
            )
        number, start = int(value), int(space.start)
        if not start <= number < start + int(space.n):
            raise SpaceMismatchError(
                f"{what}: expected an integer in [{start}, {start + int(space.n)}) ({discrete}), "
                f"got {number}."
            )
        return np.asarray(number, dtype=dtype)
    exact = isinstance(value, np.ndarray) or (isinstance(value, np.generic) and shape == ())
    if not exact or value.dtype != dtype or np.shape(value) != shape:
        raise SpaceMismatchError(
            f"{what}: expected an ndarray of dtype {dtype} and shape {shape}, got "
            f"{_describe(value)}. {NEVER_CAST}: convert values to the space's dtype first."
        )
    array = np.array(value, dtype=dtype)
    if isinstance(space, spaces.Box) and not bounds:
        if dtype.kind == "f" and not np.isfinite(array).all():
            raise SpaceMismatchError(f"{what}: expected finite values, got NaN or infinity.")
        return array
    if not space.contains(array):
        raise SpaceMismatchError(
            f"{what}: expected a value inside {space}, got one out of bounds (or NaN)."
        )
    return array


# -- what a sub-env returns (the slow paths of every backend's step loop) -------------------------


def observation_mismatch(path: str, index: object, expected: str, value: Any) -> SpaceMismatchError:
    """The error for a sub-env's observation that does not fit its space at ``path``."""
    return mismatch(
        f"sub-env {index} returned an observation that does not match its observation space "
        f"at {path}",
        expected,
        value,
        f"{NEVER_CAST}: make the env return exactly what its space declares, or wrap it (e.g. "
        "gymnasium.wrappers.DtypeObservation / ReshapeObservation) so that it does.",
    )


def check_reward(value: Any, index: object) -> float:
    """A reward as a Python float, or a clear error (slow path of the step loop)."""
    if isinstance(value, (bool, np.bool_)) or not (
        isinstance(value, (int, float, np.integer, np.floating))
        or (isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iuf")
    ):
        raise InvalidStepError(
            f"sub-env {index} returned a reward of type {type(value).__name__}: expected a "
            f"finite scalar (float), got {_describe(value)}. Return float(reward) from the "
            "env's step()."
        )
    reward = float(value)
    if not math.isfinite(reward):
        raise InvalidStepError(
            f"sub-env {index} returned a non-finite reward: expected a finite float, got "
            f"{reward}. Fix the env, or clip/replace NaN and inf rewards in a wrapper."
        )
    return reward


def _float_leaves(space: spaces.Space, tree: Any, path: str) -> list[tuple[str, np.ndarray]]:
    """The floating-point leaves of ``tree`` (shaped by ``space``), with their paths."""
    if type(tree) is np.ndarray:  # the common case first: one array leaf
        return [(path, tree)] if tree.dtype.kind == "f" else []
    if isinstance(space, spaces.Dict):
        return [
            leaf
            for key, sub in space.spaces.items()
            for leaf in _float_leaves(sub, tree[key], f"{path}[{key!r}]")
        ]
    if isinstance(space, spaces.Tuple):
        return [
            leaf
            for j, sub in enumerate(space)
            for leaf in _float_leaves(sub, tree[j], f"{path}[{j}]")
        ]
    return []  # not an array: nothing to check


_ZEROS: dict[np.dtype, np.ndarray] = {}
"""Zeros by dtype, as long as the longest array :func:`surely_finite` was given yet."""


def surely_finite(flat: np.ndarray) -> bool:
    """True if the 1-d ``flat`` is surely finite: its dot product with zeros is 0, or NaN
    where a value is not finite, and no finite value overflows it (a square could: numpy
    warns, which may raise). False: maybe not (the exact check says which)."""
    n, zeros = len(flat), _ZEROS.get(flat.dtype)
    if zeros is None or len(zeros) < n:
        zeros = _ZEROS[flat.dtype] = np.zeros(n, flat.dtype)
    try:
        return math.isfinite(flat.dot(zeros[:n]))
    except (RuntimeWarning, FloatingPointError):  # 0 * inf, where numpy's warnings are errors
        return False


def finite_batch_test(space: spaces.Space) -> Callable[[Any], bool] | None:
    """``test(batch)``: :func:`all_finite_test` of a whole batch, for a backend that hands
    out new arrays each step; None without a float leaf. One dot product per leaf, with
    zeros: each product is 0, or NaN where a value is not finite, so finite values never
    overflow (a square of theirs could: numpy warns, which may raise)."""
    if not _float_leaves(space, allocate(space, (1,)), "obs"):
        return None

    def finite(leaf: np.ndarray) -> bool:
        return surely_finite(leaf.reshape(-1))

    if type(space) in LEAF_SPACES:  # one array: no tree walked per step
        return finite

    def test(batch: Any) -> bool:
        return all(finite(leaf) for _, leaf in _float_leaves(space, batch, "obs"))

    return test


def all_finite_test(space: spaces.Space, buffer: Any) -> Callable[[int, int], bool] | None:
    """``test(lo, hi)``: True if rows ``[lo, hi)`` of ``buffer`` are surely finite, False
    if they may not be (then :func:`nonfinite_observations` says which); None without
    a float leaf. One dot product with zeros per leaf and block."""
    leaves = [
        (leaf.reshape(-1), int(np.prod(leaf.shape[1:], dtype=np.int64)))
        for _, leaf in _float_leaves(space, buffer, "obs")
    ]
    if not leaves:
        return None
    isfinite = math.isfinite

    def test(lo: int, hi: int) -> bool:
        for flat, k in leaves:
            block = flat[lo * k : hi * k]
            # A few values: Python's sum of a list costs less than even BLAS's call.
            if len(block) <= 16:
                if not isfinite(sum(block.tolist())):
                    return False
            elif not surely_finite(block):
                return False
        return True

    return test


def nonfinite_observations(
    space: spaces.Space,
    buffer: Any,
    lo: int,
    hi: int,
    call: str,
    skip: Any = (),
    where: Callable[[int], object] | None = None,
) -> dict[int, InvalidStepError]:
    """The rows ``[lo, hi)`` of ``buffer`` (``skip`` aside) holding a NaN or an infinity,
    each with its InvalidStepError; ``where(i)`` names row ``i``'s sub-env (None: the
    row index). A non-finite observation is an invalid step, like a non-finite reward:
    statistics (``NormalizeObservation``) could never recover from one."""
    errors: dict[int, InvalidStepError] = {}
    for path, leaf in _float_leaves(space, buffer, "obs"):
        block = leaf[lo:hi]
        if np.isfinite(block).all():
            continue
        bad = ~np.isfinite(block.reshape(hi - lo, -1)).all(axis=1)
        for i in (lo + np.flatnonzero(bad)).tolist():
            if i not in skip and i not in errors:
                who = i if where is None else where(i)
                errors[i] = InvalidStepError(
                    f"sub-env {who} returned a non-finite observation from {call}() at {path}: "
                    "expected finite values, got NaN or infinity. Fix the env, or replace "
                    "them in a gymnasium observation wrapper (backends with a "
                    "restart_policy restart the sub-env instead)."
                )
    return errors


def check_finite_observations(space: spaces.Space, buffer: Any, call: str) -> None:
    """Raises the first :func:`nonfinite_observations` error of a whole batch (backends
    that cannot restart one sub-env: a wrapped gymnasium vector env)."""
    num_envs = len(next(leaves(buffer)))
    bad = nonfinite_observations(space, buffer, 0, num_envs, call)
    if bad:
        raise bad[min(bad)]


def check_info(value: Any, index: object, call: str) -> dict[str, Any]:
    """``value`` if it is a dict, as gymnasium's API requires of ``reset``/``step`` infos."""
    if not isinstance(value, dict):
        raise InvalidStepError(
            f"sub-env {index} returned an info of type {type(value).__name__} from {call}(): "
            f"expected a dict (gymnasium's API), got {_describe(value)}. Return {{}} when "
            "there is nothing to report."
        )
    return value


def check_flag(value: Any, index: object, name: str) -> bool:
    """``value`` (``terminated`` or ``truncated``) as a bool, if it is one."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise InvalidStepError(
        f"sub-env {index} returned {name}={value!r:.60}: expected a bool, got "
        f"{_describe(value)}. Return bool({name}) from the env's step()."
    )


# -- stored rows (checkpoints, datasets) ---------------------------------------------------------


def rows_in_space(space: spaces.Space, array: np.ndarray, bounds: bool = True) -> np.ndarray:
    """Which rows of ``array`` (``[n, *space.shape]``, of a non-composite ``space``) lie
    in ``space``; NaN lies outside. ``bounds`` as :func:`check_value`'s: if False (sampled
    Box actions, which jaxrunner keeps unclipped), every finite row of a Box lies in it."""
    axes = tuple(range(1, array.ndim))
    if isinstance(space, spaces.Box):
        if not bounds:
            return np.asarray(np.isfinite(array).all(axis=axes))
        if np.issubdtype(space.dtype, np.integer) and array.dtype.kind == "f":
            return np.zeros(len(array), np.bool_)  # fractions in an integer Box
        inside = (array >= space.low) & (array <= space.high)
    elif isinstance(space, spaces.Discrete):
        inside = (array >= space.start) & (array < space.start + space.n)
    elif isinstance(space, spaces.MultiDiscrete):
        inside = (array >= space.start) & (array < space.start + space.nvec)
    elif isinstance(space, spaces.MultiBinary):
        inside = (array == 0) | (array == 1)
    else:
        return np.array([space.contains(row) for row in array], np.bool_)
    if not isinstance(space, spaces.Box) and array.dtype.kind == "f":
        inside &= array == np.round(array)
    return np.all(inside, axis=axes) if axes else inside

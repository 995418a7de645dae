"""Assertions the contract tests share (:func:`assert_trees_equal`, :func:`expect_raises`).
They raise ``AssertionError`` themselves, without pytest (which rewrites ``assert`` only in
test modules; ``python -O`` strips it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import chex
import numpy as np


def _as_pytree(value: Any) -> Any:
    """``value`` with lists as tuples and gymnasium's object arrays (``final_obs`` and
    ``final_info``: one value per env, ``None`` where no episode ended) as tuples of
    their elements, so that chex compares them leaf by leaf."""
    if isinstance(value, Mapping):
        return {key: _as_pytree(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return tuple(_as_pytree(item) for item in value)
    if isinstance(value, np.ndarray) and value.dtype == object:
        return tuple(_as_pytree(item) for item in value)
    return value


def assert_trees_equal(actual: Any, expected: Any, where: str = "value") -> None:
    """Asserts two nested results (dicts, tuples/lists, arrays including gymnasium's
    object arrays, scalars) are exactly equal with ``chex.assert_trees_all_equal``
    (strict: same structure, leaf values, shapes and dtypes; ``5`` equals
    ``np.int64(5)``; NaN equals NaN).

    Raises:
        AssertionError: prefixed with ``where``, chex's message naming the path of the
            first difference.
    """
    try:
        chex.assert_trees_all_equal(_as_pytree(actual), _as_pytree(expected), strict=True)
    except AssertionError as err:
        raise AssertionError(f"{where}: {err}") from None


def expect_raises(error: type[BaseException], fn: Callable[[], Any], what: str) -> BaseException:
    """Calls ``fn``; returns the ``error`` it raised, or raises ``AssertionError`` naming
    ``what`` if it raised nothing (other exceptions propagate)."""
    try:
        fn()
    except error as err:
        return err
    raise AssertionError(f"{what}: expected {error.__name__}, but nothing was raised")

"""Validated writes into stacked buffers and validated splits of action batches, built once
per space (per batch size) for the step loops: common types tested inline, anything else
to :mod:`.checks` and :mod:`.actions` for the error."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from jaxrunner._src.space_arrays.actions import action_batch_check, passing_batch_test
from jaxrunner._src.space_arrays.buffers import as_space_dtypes, leaf_spec, take
from jaxrunner._src.space_arrays.checks import observation_mismatch

Writer = Callable[[int, Any], None]


def make_writer(
    space: spaces.Space,
    buffer: Any,
    path: str = "obs",
    where: Callable[[int], object] | None = None,
) -> Writer:
    """``write(i, value)``: checks ``value`` against ``space`` (a SpaceMismatchError on
    any structure, shape or dtype difference: nothing is cast) and stores it in row
    ``i`` of ``buffer``; ``where(i)`` names row ``i``'s sub-env (None: the row index)."""
    name: Callable[[int], object] = where or (lambda i: i)
    if isinstance(space, spaces.Dict):
        keys = tuple(space.spaces)
        key_set = set(keys)
        subs = [
            (key, make_writer(space[key], buffer[key], f"{path}[{key!r}]", where)) for key in keys
        ]

        def write_dict(i: int, value: Any) -> None:
            if not isinstance(value, Mapping) or value.keys() != key_set:
                raise observation_mismatch(path, name(i), f"a dict with keys {sorted(keys)}", value)
            for key, sub in subs:
                sub(i, value[key])

        return write_dict

    if isinstance(space, spaces.Tuple):
        subs_t = [make_writer(sub, buffer[j], f"{path}[{j}]", where) for j, sub in enumerate(space)]
        n = len(subs_t)

        def write_tuple(i: int, value: Any) -> None:
            if not isinstance(value, (tuple, list)) or len(value) != n:
                raise observation_mismatch(path, name(i), f"a tuple of {n} items", value)
            for sub, item in zip(subs_t, value):
                sub(i, item)

        return write_tuple

    shape, dtype = leaf_spec(space)
    if isinstance(space, spaces.Discrete):

        def write_discrete(i: int, value: Any) -> None:
            kind = type(value)
            if kind is not int and not isinstance(value, np.integer):
                if not (
                    isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu"
                ):
                    raise observation_mismatch(path, name(i), "an integer (Discrete)", value)
            buffer[i] = value

        return write_discrete

    expected = f"an ndarray of dtype {dtype} and shape {shape}"

    def write_array(i: int, value: Any) -> None:
        if type(value) is not np.ndarray or value.dtype != dtype or value.shape != shape:
            # numpy scalars of the exact dtype are fine for shape-() spaces
            if not (isinstance(value, np.generic) and value.dtype == dtype and shape == ()):
                raise observation_mismatch(path, name(i), expected, value)
        buffer[i] = value

    return write_array


def make_action_splitter(space: spaces.Space, num_envs: int) -> Callable[[Any], list[Any]]:
    """``split(actions)``: the ``num_envs`` per-env actions, the batch checked whole
    first (:func:`check_action_batch`) so a bad one is refused before any sub-env steps."""
    check = action_batch_check(space, num_envs)
    split = passed_action_splitter(space)
    if split is None:  # a composite

        def split_tree(actions: Any) -> list[Any]:
            checked = as_space_dtypes(space, check(actions))  # once for the batch
            return [take(space, checked, i) for i in range(num_envs)]

        return split_tree
    passes = passing_batch_test(space, (num_envs,))
    if passes is not None:  # the common batch tested here: one call fewer per step
        return lambda actions: split(actions if passes(actions) else check(actions))
    return lambda actions: split(check(actions))


def passed_action_splitter(space: spaces.Space) -> Callable[[Any], list[Any]] | None:
    """``split(actions)`` of a batch known to pass the checks: the per-env actions in the
    space's dtype (the env gets it, as on every backend); None for a composite space."""
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        return None
    dtype = leaf_spec(space)[1]
    return lambda actions: list(actions.astype(dtype, copy=False))

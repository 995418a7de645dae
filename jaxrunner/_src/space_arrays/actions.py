"""Checks of action batches against their space, before any sub-env steps: the policy's
action spec, each batch a backend is sent (shape, dtype kind, ``Discrete`` and
``MultiDiscrete`` ranges, finite floats), and the inline test of the common batch on the
per-step path."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from jaxrunner._src.space_arrays.buffers import LEAF_TYPES, allocate, leaf_spec
from jaxrunner._src.space_arrays.checks import _describe, mismatch, surely_finite
from jaxrunner.errors import InvalidActionError


def check_policy_actions(
    action_space: spaces.Space, spec: Any, num_envs: int, path: str = ""
) -> None:
    """Checks a policy's action output (arrays or ``ShapeDtypeStruct`` leaves) for a
    batch of ``num_envs`` against the action space, before any env is stepped; ``path``
    names a nested part (``"['move']"``)."""
    where, fix = f"policy actions{path}", "Check the policy's action head against the env."
    if isinstance(action_space, spaces.Dict):
        if not isinstance(spec, Mapping) or set(spec) != set(action_space.spaces):
            keys = sorted(action_space.spaces)  # an extra key would vanish unsaid
            raise mismatch(where, f"a dict with keys {keys} ({action_space})", spec, fix)
        for key, sub in action_space.items():
            check_policy_actions(sub, spec[key], num_envs, f"{path}[{key!r}]")
        return
    if isinstance(action_space, spaces.Tuple):
        if not isinstance(spec, (tuple, list)) or len(spec) != len(action_space.spaces):
            raise mismatch(
                where, f"a tuple of {len(action_space.spaces)} ({action_space})", spec, fix
            )
        for j, sub in enumerate(action_space):
            check_policy_actions(sub, spec[j], num_envs, f"{path}[{j}]")
        return
    exp = allocate(action_space, (num_envs,))
    shape = getattr(spec, "shape", None)
    if shape is None or tuple(shape) != exp.shape or not np.can_cast(spec.dtype, exp.dtype, "safe"):
        batched = shape is not None and tuple(shape) == (num_envs, *exp.shape)  # B actions a row
        raise mismatch(
            where,
            f"shape {exp.shape} (a batch of {num_envs} for the action space {action_space}) "
            f"and a dtype safely castable to {exp.dtype}",
            spec,
            "The policy looks built on the batched space: build it on the vector env's "
            "envs.single_action_space, not envs.action_space."
            if batched
            else fix,
        )


ACTION_KINDS = {"i": "iu", "u": "iu", "f": "f"}
"""The dtype kinds an action batch may have, by its space's dtype kind (any integer for an
integer space, any float for a float one); other spaces take their exact dtype."""


def check_action_batch(
    space: spaces.Space,
    actions: Any,
    num_envs: int,
    path: str = "",
    row_name: Callable[[int], str] | None = None,
    rows_are: str = "num_envs",
) -> Any:
    """The batch of ``num_envs`` actions as numpy leaves, checked whole before any
    sub-env steps: shape ``[num_envs, *shape]``, the space's dtype kind, discrete
    actions in range (an env may crash on, or wrap, one outside it), float actions
    finite. Else an
    InvalidActionError naming the path; ``row_name(i)`` names row ``i`` (None:
    ``"sub-env i"``), ``rows_are`` the row count."""
    if type(space) in LEAF_TYPES:  # the per-step fast path: no ABC isinstance checks
        return _check_action_leaf(space, actions, num_envs, path, row_name, rows_are)
    if isinstance(space, spaces.Dict):
        if not isinstance(actions, Mapping) or actions.keys() != set(space.spaces):
            raise InvalidActionError(
                f"actions{path}: expected a dict with keys {sorted(space.spaces)}, got "
                f"{_describe(actions)}."
            )
        return {
            k: check_action_batch(s, actions[k], num_envs, f"{path}[{k!r}]", row_name, rows_are)
            for k, s in space.items()
        }
    if isinstance(space, spaces.Tuple):
        if not isinstance(actions, Sequence) or len(actions) != len(space.spaces):
            raise InvalidActionError(
                f"actions{path}: expected a tuple of {len(space.spaces)} items, got "
                f"{_describe(actions)}."
            )
        return tuple(
            check_action_batch(s, v, num_envs, f"{path}[{j}]", row_name, rows_are)
            for j, (s, v) in enumerate(zip(space, actions))
        )
    return _check_action_leaf(space, actions, num_envs, path, row_name, rows_are)


def _check_action_leaf(
    space: spaces.Space,
    actions: Any,
    num_envs: int,
    path: str,
    row_name: Callable[[int], str] | None,
    rows_are: str,
) -> np.ndarray:
    shape, dtype = leaf_spec(space)
    array = np.asarray(actions)
    kinds = ACTION_KINDS.get(dtype.kind)
    kind_ok = array.dtype == dtype if kinds is None else array.dtype.kind in kinds
    if array.shape != (num_envs, *shape) or not kind_ok:
        raise InvalidActionError(
            f"actions{path}: expected an array of shape {(num_envs, *shape)} "
            f"({rows_are}={num_envs}, single action shape {shape}) with {dtype.kind!r}-kind "
            f"dtype like {dtype}, got {_describe(array)}. Pass one action per sub-env, "
            "stacked along the first axis."
        )
    # The first row outside a Discrete or MultiDiscrete range, if any, is refused.
    if isinstance(space, spaces.Discrete):
        low, high = int(space.start), int(space.start + space.n)
        if array.size <= 16:  # a few values: Python's min and max beat numpy's calls
            values = array.tolist()
            if not values or (min(values) >= low and max(values) < high):
                return array
        elif array.min() >= low and array.max() < high:
            return array
        bad = (array < low) | (array >= high)
    elif isinstance(space, spaces.MultiDiscrete):
        bad = ((array < space.start) | (array >= space.start + space.nvec)).reshape(len(array), -1)
        bad = bad.any(axis=1)
        if not bad.any():
            return array
    elif array.dtype.kind == "f" and not np.isfinite(array).all():
        # NaN or inf, e.g. from a diverged policy: the env would step into a NaN state
        # and its next reward, not the action, would be blamed.
        row = int(np.flatnonzero(~np.isfinite(array.reshape(len(array), -1)).all(axis=1))[0])
        who = f"sub-env {row}" if row_name is None else row_name(row)
        raise InvalidActionError(
            f"actions{path}: {who}'s action {array[row].tolist()!r} (row {row} of the "
            "batch) is not finite; an env stepped with it goes on in a NaN state. Check "
            "the policy that made it (its params, its outputs)."
        )
    else:
        return array
    row = int(np.flatnonzero(bad)[0])
    who = f"sub-env {row}" if row_name is None else row_name(row)
    raise InvalidActionError(
        f"actions{path}: {who}'s action {array[row].tolist()!r} (row {row} of the "
        f"batch) is outside {space}. Send actions within the action space."
    )


def bad_action_rows(space: spaces.Space, actions: Any, num_rows: int) -> Any:
    """``[num_rows]`` bool, traced: the rows whose action :func:`check_action_batch` would
    refuse for its value (a ``Discrete`` or ``MultiDiscrete`` one out of range, a float one
    not finite); None where no part of ``space`` has such a value to check."""
    import jax.numpy as jnp  # here, not at the top: a Ray actor's import of this skips JAX

    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        items = space.items() if isinstance(space, spaces.Dict) else enumerate(space.spaces)
        parts = [bad_action_rows(sub, actions[k], num_rows) for k, sub in items]
        parts = [p for p in parts if p is not None]
        return None if not parts else functools.reduce(jnp.logical_or, parts)
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
        low = np.asarray(space.start)
        high = low + (space.n if isinstance(space, spaces.Discrete) else space.nvec)
        if actions.dtype.kind in "iu":
            # Compared in the actions' dtype (JAX has no int64 for uint32 against int32
            # to meet in): each bound clipped to its range, one past it known statically.
            info = np.iinfo(actions.dtype)
            first, last = max(info.min, -(2**63)), min(info.max, 2**63 - 1)  # (int64 bounds)

            def at(bound: np.ndarray) -> Any:
                return jnp.asarray(np.clip(bound, first, last).astype(actions.dtype))

            too_high = (actions >= at(high)) & (high <= info.max)
            bad = (actions < at(low)) | (low > info.max) | too_high
        else:  # bool (a safe cast): as JAX promotes it
            bad = (actions < jnp.asarray(low)) | (actions >= jnp.asarray(high))
    elif leaf_spec(space)[1].kind == "f":
        bad = ~jnp.isfinite(actions)
    else:
        return None
    return bad.reshape(num_rows, -1).any(axis=1)


def batch_passes(space: spaces.Space, actions: Any) -> Any:
    """Traced: a 0-d bool, True where :func:`passing_batch_test` passes the host copy of
    ``actions`` (a policy's output, traced before :func:`check_policy_actions` sees it)
    as it is; None where that test does not cover the space, or the output is not one
    array of the space's shape and dtype kind."""
    import jax.numpy as jnp  # here, not at the top: a Ray actor's import of this skips JAX

    if type(space) not in LEAF_TYPES or not hasattr(actions, "dtype") or not actions.shape:
        return None
    rows, (shape, dtype) = actions.shape[0], leaf_spec(space)
    if passing_batch_test(space, (rows,)) is None or actions.shape[1:] != shape:
        return None
    if actions.dtype.kind not in ACTION_KINDS[dtype.kind]:
        return None
    bad = bad_action_rows(space, actions, rows)
    return jnp.bool_(True) if bad is None else ~bad.any()


def idle_action_filler(space: spaces.Space) -> Callable[[Any, np.ndarray], Any] | None:
    """``fill(actions, acting)``: a ``[n, A_g, ...]`` action batch with the rows where
    ``acting`` (``[n, A_g]``) is False set to the space's first value (``start``), in the
    ``Discrete`` and ``MultiDiscrete`` parts whose range leaves out 0; None where zeros lie
    in every part. An agent that does not act sends a row too, and the backends check
    every row: the policy step leaves the rows past its last acting one zero."""
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        items = list(space.items()) if isinstance(space, spaces.Dict) else list(enumerate(space))
        fills = {k: idle_action_filler(sub) for k, sub in items}
        if all(f is None for f in fills.values()):
            return None

        def fill_tree(actions: Any, acting: np.ndarray) -> Any:
            out = {k: actions[k] if f is None else f(actions[k], acting) for k, f in fills.items()}
            return out if isinstance(space, spaces.Dict) else tuple(out[j] for j in range(len(out)))

        return fill_tree
    if not isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
        return None
    low = np.asarray(space.start, np.int64)
    high = low + np.asarray(space.n if isinstance(space, spaces.Discrete) else space.nvec)
    if ((low <= 0) & (high > 0)).all():
        return None

    def fill(actions: Any, acting: np.ndarray) -> Any:
        actions = np.asarray(actions)
        mask = acting.reshape(acting.shape + (1,) * (actions.ndim - acting.ndim))
        return np.where(mask, actions, low.astype(actions.dtype))

    return fill


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def passing_batch_test(space: spaces.Space, lead: tuple[int, ...]) -> Callable[[Any], bool] | None:
    """The per-step test of the common action batch of a non-composite ``space``: a numpy
    array of shape ``lead + space.shape`` and an accepted dtype kind, its ``Discrete`` or
    ``MultiDiscrete`` actions in range, its float actions finite. True only where
    :func:`check_action_batch` would accept the batch as it is; False leaves the verdict,
    and the error, to it. None for the spaces it does not cover (composite ones, exact
    dtypes)."""
    if type(space) not in LEAF_TYPES:
        return None
    shape, dtype = leaf_spec(space)
    kinds = ACTION_KINDS.get(dtype.kind)
    if kinds is None:
        return None
    full = (*lead, *shape)

    def fits(batch: Any) -> bool:
        return type(batch) is np.ndarray and batch.shape == full and batch.dtype.kind in kinds

    if isinstance(space, spaces.MultiDiscrete):
        starts, stops = space.start, space.start + space.nvec
        return lambda batch: fits(batch) and bool(((batch >= starts) & (batch < stops)).all())
    if kinds == "f":  # a float Box: finite too (NaN and inf refused)

        def finite(batch: Any) -> bool:
            # fits(batch), inline; then one dot product with zeros (no finite value
            # overflows it), the exact test only where it is not finite
            if not (type(batch) is np.ndarray and batch.shape == full and batch.dtype.kind == "f"):
                return False
            return surely_finite(batch.reshape(-1)) or bool(np.isfinite(batch).all())

        return finite
    if not isinstance(space, spaces.Discrete):
        return fits
    low, high = int(space.start), int(space.start + space.n)

    def in_range(batch: Any) -> bool:
        # fits(batch), inline: the per-step call would cost about as much as the test
        if not (type(batch) is np.ndarray and batch.shape == full and batch.dtype.kind in kinds):
            return False
        if batch.size <= 16:  # a few values: Python's min and max beat numpy's calls
            values = batch.ravel().tolist()
            return not values or (min(values) >= low and max(values) < high)
        if low == 0:  # one reduction: viewed unsigned, a negative int is above any n
            return bool(batch.view(_UNSIGNED[batch.dtype.itemsize]).max() < high)
        return bool(batch.min() >= low and batch.max() < high)

    return in_range


def action_batch_check(space: spaces.Space, num_envs: int) -> Callable[[Any], Any]:
    """:func:`check_action_batch` for batches of ``num_envs`` actions, built once per batch
    size: the common batch passes :func:`passing_batch_test` inline (returned as it is),
    any other goes through the checks (returned as they return it, or refused)."""
    passes = passing_batch_test(space, (num_envs,))

    def check(actions: Any) -> Any:
        if passes is not None and passes(actions):
            return actions
        return check_action_batch(space, actions, num_envs)

    return check

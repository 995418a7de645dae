"""Checks of what users hand the connectors (constructor arguments, states): each error
names the connector, the argument or field, what was expected, what came, and the fix."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxrunner._src.arg_checks import check_bool, check_number
from jaxrunner._src.connectors.moments import COUNT_DTYPES
from jaxrunner.errors import InvalidArgumentError, SpaceMismatchError


def check_statistics_args(who: str, connector: Any) -> None:
    """The arguments of a connector with running statistics: ``clip``, ``epsilon``,
    ``min_std``, ``max_std``, ``count_dtype`` (one of
    :data:`~jaxrunner._src.connectors.moments.COUNT_DTYPES`, and a 64-bit one only with
    ``jax_enable_x64``: JAX would silently make it 32-bit) and ``frozen``."""
    min_std, max_std, count_dtype = connector.min_std, connector.max_std, connector.count_dtype
    check_number(who, "clip", connector.clip, low_open=True, none="for no clipping")
    check_number(who, "epsilon", connector.epsilon)
    check_number(who, "min_std", min_std, low_open=True)
    check_number(who, "max_std", max_std, low_open=True, high_open=True)
    if min_std > max_std:
        raise InvalidArgumentError(
            f"{who}(min_std={min_std!r}, max_std={max_std!r}): expected min_std <= max_std."
        )
    if count_dtype not in COUNT_DTYPES:
        raise InvalidArgumentError(
            f"{who}(count_dtype={count_dtype!r}): expected one of {COUNT_DTYPES}."
        )
    # jax.config's flags are attributes set at runtime, unseen by the checker.
    if count_dtype.endswith("64") and not jax.config.jax_enable_x64:  # type: ignore[attr-defined]
        raise InvalidArgumentError(
            f"{who}(count_dtype={count_dtype!r}): JAX runs without 64-bit types here, so the "
            "count would silently be 32-bit. Enable them first "
            "(jax.config.update('jax_enable_x64', True)), or use count_dtype='int32' (exact "
            "to 2**31 - 1 samples)."
        )
    check_bool(who, "frozen", connector.frozen)


def check_state(who: str, name: str, current: Any, new: Any) -> Any:
    """``new`` (connector ``name``'s state) as host numpy arrays, refused unless it has
    the structure, shapes and dtypes of ``current`` (the runner's) and finite floats;
    ``who`` is the call the message names."""
    want, treedef = jax.tree_util.tree_flatten_with_path(current)
    try:
        got = treedef.flatten_up_to(new)
    except (ValueError, TypeError) as err:
        raise InvalidArgumentError(
            f"{who}: connector {name!r}: expected a state of structure {treedef}, got "
            f"{jax.tree.structure(new)}. Start from runner.get_connector_state() and replace "
            "its arrays."
        ) from err
    out = []
    for (path, old), value in zip(want, got):
        field = f"{name}{jax.tree_util.keystr(path)}"
        dtype = np.dtype(jax.dtypes.canonicalize_dtype(np.result_type(old)))
        shape = tuple(np.shape(old))
        array = value if isinstance(value, (np.ndarray, np.generic, jax.Array)) else None
        if array is None or np.dtype(array.dtype) != dtype or tuple(np.shape(array)) != shape:
            came = (
                f"an array of dtype {array.dtype} and shape {tuple(np.shape(array))}"
                if array is not None
                else f"a {type(value).__name__} ({value!r:.60})"
            )
            raise SpaceMismatchError(
                f"{who}: field {field}: expected an array of dtype {dtype} and shape {shape}, "
                f"got {came}. jaxrunner never casts silently: convert it "
                f"(np.asarray(x, np.{dtype.name})) or start from runner.get_connector_state()."
            )
        array = np.array(array)
        if dtype.kind == "f" and not np.isfinite(array).all():
            raise SpaceMismatchError(
                f"{who}: field {field}: expected finite values, got NaN or infinity. Statistics "
                "never take in a non-finite value: fix the values before setting them."
            )
        out.append(array)
    return treedef.unflatten(out)

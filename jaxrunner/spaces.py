"""Gymnasium spaces as stacked numpy buffers: allocation, validated writes, splitting.

A space maps to a pytree of numpy arrays: ``Dict`` to a ``dict``, ``Tuple`` to a
``tuple``, every other supported space to one array whose dtype is the space's
dtype. Batched buffers add leading axes (``[B, ...]`` or ``[T, B, ...]``).

Writes are validated (invariant 6): a value whose shape or dtype differs from its
space raises :class:`~jaxrunner.errors.SpaceMismatchError`, it is never cast.
Python ``int``/numpy integer scalars are accepted for ``Discrete`` (an exact,
value-preserving conversion to the space's int64).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from jaxrunner.errors import InvalidActionError, SpaceMismatchError

SUPPORTED_SPACES = (
    spaces.Box,
    spaces.Discrete,
    spaces.MultiDiscrete,
    spaces.MultiBinary,
    spaces.Dict,
    spaces.Tuple,
)

Writer = Callable[[int, Any], None]


def check_supported(space: spaces.Space, path: str = "space") -> None:
    """Raises ``SpaceMismatchError`` if ``space`` (or a part of it) is not supported."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            check_supported(sub, f"{path}[{key!r}]")
    elif isinstance(space, spaces.Tuple):
        for j, sub in enumerate(space.spaces):
            check_supported(sub, f"{path}[{j}]")
    elif not isinstance(space, SUPPORTED_SPACES):
        names = ", ".join(cls.__name__ for cls in SUPPORTED_SPACES)
        raise SpaceMismatchError(
            f"{path} is a {type(space).__name__}, which jaxrunner cannot stack into fixed-shape "
            f"arrays; supported spaces are {names} (nested freely). Flatten it with a "
            "gymnasium observation/action wrapper first."
        )


def leaf_spec(space: spaces.Space) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of one element of a non-composite space."""
    return tuple(space.shape), np.dtype(space.dtype)


def allocate(space: spaces.Space, leading: tuple[int, ...], fill: float = 0) -> Any:
    """Preallocates a pytree of arrays shaped ``leading + space.shape`` per leaf."""
    if isinstance(space, spaces.Dict):
        return {key: allocate(sub, leading, fill) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(allocate(sub, leading, fill) for sub in space.spaces)
    shape, dtype = leaf_spec(space)
    return np.full(leading + shape, fill, dtype=dtype)


# gymnasium's Dict and Tuple are ABCs (Mapping, Sequence), so isinstance() on them
# costs ~0.5 us; the helpers below run every step, and test the leaf types first.
_LEAF_TYPES = frozenset({spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary})


def map_structure(space: spaces.Space, fn: Callable[..., Any], *trees: Any) -> Any:
    """Applies ``fn`` leaf by leaf to pytrees shaped by ``space``."""
    if type(space) in _LEAF_TYPES:
        return fn(*trees)
    if isinstance(space, spaces.Dict):
        return {key: map_structure(sub, fn, *(t[key] for t in trees)) for key, sub in space.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(map_structure(sub, fn, *(t[j] for t in trees)) for j, sub in enumerate(space))
    return fn(*trees)


def copy_into(space: spaces.Space, dst: Any, src: Any, index: Any = slice(None)) -> None:
    """``dst[index] = src`` leaf by leaf (both shaped by ``space``)."""
    if type(space) in _LEAF_TYPES:
        dst[index] = src
    elif isinstance(space, spaces.Dict):
        for key, sub in space.items():
            copy_into(sub, dst[key], src[key], index)
    elif isinstance(space, spaces.Tuple):
        for j, sub in enumerate(space):
            copy_into(sub, dst[j], src[j], index)
    else:
        dst[index] = src


def rows(space: spaces.Space, tree: Any, index: slice) -> Any:
    """``tree[index]`` leaf by leaf, as views."""
    return map_structure(space, lambda leaf: leaf[index], tree)


def take(space: spaces.Space, tree: Any, index: Any) -> Any:
    """``tree[index]`` leaf by leaf, as copies."""
    return map_structure(space, lambda leaf: np.array(leaf[index]), tree)


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"ndarray of dtype {value.dtype} and shape {value.shape}"
    if isinstance(value, np.generic):
        return f"numpy scalar of dtype {value.dtype}"
    return f"{type(value).__name__} {value!r:.60}"


def _mismatch(path: str, index: int, expected: str, value: Any) -> SpaceMismatchError:
    return SpaceMismatchError(
        f"sub-env {index} returned an observation that does not match its observation space "
        f"at {path}: expected {expected}, got {_describe(value)}. jaxrunner never casts "
        "silently: make the env return exactly what its space declares, or wrap it (e.g. "
        "gymnasium.wrappers.DtypeObservation / ReshapeObservation) so that it does."
    )


def make_writer(space: spaces.Space, buffer: Any, path: str = "obs") -> Writer:
    """Returns ``write(i, value)``: validates ``value`` against ``space`` and stores it
    in row ``i`` of the batched ``buffer`` (shaped by ``allocate(space, (B,))``)."""
    if isinstance(space, spaces.Dict):
        keys = tuple(space.spaces)
        key_set = set(keys)
        subs = [(key, make_writer(space[key], buffer[key], f"{path}[{key!r}]")) for key in keys]

        def write_dict(i: int, value: Any) -> None:
            if not isinstance(value, Mapping) or value.keys() != key_set:
                raise _mismatch(path, i, f"a dict with keys {sorted(keys)}", value)
            for key, sub in subs:
                sub(i, value[key])

        return write_dict

    if isinstance(space, spaces.Tuple):
        subs_t = [make_writer(sub, buffer[j], f"{path}[{j}]") for j, sub in enumerate(space)]
        n = len(subs_t)

        def write_tuple(i: int, value: Any) -> None:
            if not isinstance(value, (tuple, list)) or len(value) != n:
                raise _mismatch(path, i, f"a tuple of length {n}", value)
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
                    raise _mismatch(path, i, "an integer (Discrete)", value)
            buffer[i] = value

        return write_discrete

    expected = f"ndarray of dtype {dtype} and shape {shape}"

    def write_array(i: int, value: Any) -> None:
        if type(value) is not np.ndarray or value.dtype != dtype or value.shape != shape:
            # numpy scalars of the exact dtype are fine for shape-() spaces
            if not (isinstance(value, np.generic) and value.dtype == dtype and shape == ()):
                raise _mismatch(path, i, expected, value)
        buffer[i] = value

    return write_array


def check_policy_actions(action_space: spaces.Space, spec: Any, num_envs: int) -> None:
    """Checks a policy's action output (arrays or ``ShapeDtypeStruct`` leaves) for a
    batch of ``num_envs`` against the action space, before any env is stepped."""
    expected = allocate(action_space, (num_envs,))

    def check(exp: np.ndarray, got: Any) -> None:
        if tuple(got.shape) != exp.shape or not np.can_cast(got.dtype, exp.dtype, "safe"):
            raise SpaceMismatchError(
                f"the policy returns actions of shape {tuple(got.shape)} and dtype "
                f"{got.dtype}; the action space {action_space} needs shape {exp.shape} (a "
                f"batch of {num_envs}) and a dtype safely castable to {exp.dtype}. Check the "
                "policy's action head against the env."
            )

    try:
        map_structure(action_space, check, expected, spec)
    except (KeyError, IndexError, TypeError, AttributeError) as err:
        raise SpaceMismatchError(
            f"the policy's action structure does not match the action space {action_space}."
        ) from err


def _action_kind_ok(space_dtype: np.dtype, got: np.dtype) -> bool:
    if space_dtype.kind in "iu":
        return got.kind in "iu"
    if space_dtype.kind == "f":
        return got.kind == "f"
    return got == space_dtype


def make_action_splitter(space: spaces.Space, num_envs: int) -> Callable[[Any], list[Any]]:
    """Returns ``split(actions) -> list`` of ``num_envs`` per-env actions.

    The batch is validated as a whole first, so a bad batch is rejected before any
    sub-env is stepped. Each leaf must be array-like of shape ``[num_envs, *shape]``
    with the dtype kind of its space (integer or float).
    """

    def check_leaf(leaf_space: spaces.Space, value: Any, path: str) -> np.ndarray:
        shape, dtype = leaf_spec(leaf_space)
        array = np.asarray(value)
        if array.shape != (num_envs, *shape) or not _action_kind_ok(dtype, array.dtype):
            raise InvalidActionError(
                f"actions{path}: expected an array of shape {(num_envs, *shape)} "
                f"(num_envs={num_envs}, single action shape {shape}) with {dtype.kind!r}-kind "
                f"dtype like {dtype}, got {_describe(array)}. Pass one action per sub-env, "
                "stacked along the first axis."
            )
        return array

    if isinstance(space, (spaces.Dict, spaces.Tuple)):

        def check_tree(sub: spaces.Space, value: Any, path: str) -> Any:
            if isinstance(sub, spaces.Dict):
                if not isinstance(value, Mapping) or value.keys() != set(sub.spaces):
                    raise InvalidActionError(
                        f"actions{path}: expected a dict with keys {sorted(sub.spaces)}, got "
                        f"{_describe(value)}"
                    )
                return {k: check_tree(s, value[k], f"{path}[{k!r}]") for k, s in sub.items()}
            if isinstance(sub, spaces.Tuple):
                if not isinstance(value, Sequence) or len(value) != len(sub.spaces):
                    raise InvalidActionError(
                        f"actions{path}: expected a tuple of length {len(sub.spaces)}, got "
                        f"{_describe(value)}"
                    )
                return tuple(
                    check_tree(s, v, f"{path}[{j}]") for j, (s, v) in enumerate(zip(sub, value))
                )
            return check_leaf(sub, value, path)

        def split_tree(actions: Any) -> list[Any]:
            checked = check_tree(space, actions, "")
            return [take(space, checked, i) for i in range(num_envs)]

        return split_tree

    def split_leaf(actions: Any) -> list[Any]:
        return list(check_leaf(space, actions, ""))

    return split_leaf


def clip_box_actions(space: spaces.Space) -> Callable[[Any], Any] | None:
    """Returns a function clipping a batch of actions to the Box bounds, or None if
    no part of ``space`` is a bounded Box (then there is nothing to clip)."""
    if isinstance(space, spaces.Box):
        low, high = space.low, space.high
        if not (np.isfinite(low).any() or np.isfinite(high).any()):
            return None
        return lambda actions: np.clip(actions, low, high)
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        items = list(space.items()) if isinstance(space, spaces.Dict) else list(enumerate(space))
        clippers = {key: clip_box_actions(sub) for key, sub in items}
        if all(c is None for c in clippers.values()):
            return None

        def clip_tree(actions: Any) -> Any:
            out = {k: (actions[k] if c is None else c(actions[k])) for k, c in clippers.items()}
            return out if isinstance(space, spaces.Dict) else tuple(out[j] for j in range(len(out)))

        return clip_tree
    return None

"""Gymnasium spaces as stacked numpy buffers (a ``Dict`` space a ``dict``, a ``Tuple`` a
``tuple``, any other one array of its dtype, with leading ``[B]`` or ``[T, B]`` axes):
allocation, copies, row views. Nothing here validates (that is :mod:`.writers`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from jaxrunner.errors import SpaceMismatchError


def leaf_spec(space: spaces.Space) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of one element of a non-composite space."""
    if space.shape is None:  # Text, Graph, ...: check_supported refuses them first
        raise SpaceMismatchError(f"{space!r} has no fixed shape; jaxrunner cannot stack it.")
    return tuple(space.shape), np.dtype(space.dtype)


def allocate(space: spaces.Space, leading: tuple[int, ...]) -> Any:
    """Zeroed arrays, a pytree of them shaped ``leading + space.shape`` per leaf."""
    if isinstance(space, spaces.Dict):
        return {key: allocate(sub, leading) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(allocate(sub, leading) for sub in space.spaces)
    shape, dtype = leaf_spec(space)
    return np.zeros(leading + shape, dtype=dtype)


def leaf_spaces(
    space: spaces.Space, path: tuple[str | int, ...] = ()
) -> dict[tuple[str | int, ...], spaces.Space]:
    """Each non-composite part of ``space`` by its path in :func:`allocate`'s tree (a
    ``Dict``'s keys, a ``Tuple``'s indices; ``()`` for a space that is one leaf)."""
    if isinstance(space, spaces.Dict):
        return {
            k: v for key, sub in space.items() for k, v in leaf_spaces(sub, (*path, key)).items()
        }
    if isinstance(space, spaces.Tuple):
        return {
            k: v for j, sub in enumerate(space) for k, v in leaf_spaces(sub, (*path, j)).items()
        }
    return {path: space}


# isinstance() on gymnasium's Dict and Tuple (ABCs) costs ~0.5 us: per-step helpers test
# ``type(space) in LEAF_TYPES`` first.
LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
LEAF_TYPES = frozenset(LEAF_SPACES)


def map_structure(space: spaces.Space, fn: Callable[..., Any], *trees: Any) -> Any:
    """Applies ``fn`` leaf by leaf to pytrees shaped by ``space``."""
    if type(space) in LEAF_TYPES:
        return fn(*trees)
    if isinstance(space, spaces.Dict):
        return {key: map_structure(sub, fn, *(t[key] for t in trees)) for key, sub in space.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(map_structure(sub, fn, *(t[j] for t in trees)) for j, sub in enumerate(space))
    return fn(*trees)


def as_space_dtypes(space: spaces.Space, tree: Any) -> Any:
    """``tree`` (a batch of ``space``'s values) with every leaf in its space's dtype: what
    an env is handed, whatever the policy computed in (JAX's int32 for int64 spaces)."""
    if type(space) in LEAF_TYPES:
        return np.asarray(tree, dtype=leaf_spec(space)[1])
    if isinstance(space, spaces.Dict):
        return {key: as_space_dtypes(sub, tree[key]) for key, sub in space.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(as_space_dtypes(sub, tree[j]) for j, sub in enumerate(space))
    return tree


def tree_map(fn: Callable[..., Any], *trees: Any) -> Any:
    """Applies ``fn`` leaf by leaf to trees of dicts and tuples of arrays (as
    :func:`allocate` builds them), as ``jax.tree.map`` does, without loading JAX."""
    first = trees[0]
    if isinstance(first, Mapping):
        return {key: tree_map(fn, *(t[key] for t in trees)) for key in first}
    if isinstance(first, tuple):
        return tuple(tree_map(fn, *(t[j] for t in trees)) for j in range(len(first)))
    return fn(*trees)


def leaves(tree: Any) -> Iterator[Any]:
    """The arrays of a tree of dicts and tuples (as :func:`allocate` builds them)."""
    if isinstance(tree, Mapping):
        for sub in tree.values():
            yield from leaves(sub)
    elif isinstance(tree, tuple):
        for sub in tree:
            yield from leaves(sub)
    else:
        yield tree


def copy_into(space: spaces.Space, dst: Any, src: Any, index: Any = slice(None)) -> None:
    """``dst[index] = src`` leaf by leaf (both shaped by ``space``)."""
    if type(space) in LEAF_TYPES:
        dst[index] = src
    elif isinstance(space, spaces.Dict):
        for key, sub in space.items():
            copy_into(sub, dst[key], src[key], index)
    elif isinstance(space, spaces.Tuple):
        for j, sub in enumerate(space):
            copy_into(sub, dst[j], src[j], index)
    else:
        dst[index] = src


def rows(space: spaces.Space, tree: Any, index: Any) -> Any:
    """``tree[index]`` leaf by leaf (as views, unless ``index`` is an index array)."""
    return map_structure(space, lambda leaf: leaf[index], tree)


def take(space: spaces.Space, tree: Any, index: Any) -> Any:
    """``tree[index]`` leaf by leaf, as copies."""
    return map_structure(space, lambda leaf: np.array(leaf[index]), tree)

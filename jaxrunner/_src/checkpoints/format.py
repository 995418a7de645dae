"""What every runner's checkpoint shares: one ``.npz`` of arrays named by tree paths, a
JSON ``__meta__``, and the checks every reader makes. See docs/checkpoints.md."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxrunner._src.core.npz_file import HeaderCheck

META = "__meta__"
MAX_META_BYTES = 1 << 26
"""The most bytes the JSON metadata may take in the file (4 per character)."""
MAX_PATH_DEPTH = 32
"""The deepest a saved tree path may be."""
WINDOWS = ("returns", "lengths")
"""Metrics leaves whose length varies (recent-episode windows, at most the runner's
episode window); the others have the template's shape."""
ENV_STATE = "env_state"
"""The samplers' name for a pure-JAX env's state: arrays only the env interprets (a
NaN or an infinity there may be the env's own sentinel)."""

Part = str | int
"""One step of a tree path: a dict key or attribute name, or a sequence index."""


# -- tree paths ----------------------------------------------------------------------------


def part_of(entry: Any) -> Part:
    """One entry of a JAX tree path as a :data:`Part`."""
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            value = getattr(entry, attr)
            return value if isinstance(value, int) else str(value)
    raise TypeError(f"unsupported tree path entry {entry!r}")


def array_name(prefix: str, parts: list[Part] | tuple[Part, ...]) -> str:
    """The name under which a leaf at ``parts`` is saved below ``prefix``."""
    return "/".join([prefix, *(str(p) for p in parts)])


def is_key(leaf: Any) -> bool:
    # jax.dtypes exports issubdtype without the re-export form pyright looks for.
    is_sub = jax.dtypes.issubdtype  # type: ignore[attr-defined]
    return hasattr(leaf, "dtype") and is_sub(leaf.dtype, jax.dtypes.prng_key)


def path_leaves(tree: Any) -> tuple[list[tuple[list[Part], Any]], Any]:
    """``tree``'s leaves, each with its path as a list of :data:`Part`, and its treedef."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return [([part_of(e) for e in path], leaf) for path, leaf in flat], treedef


def build_tree(leaves: dict[tuple[Part, ...], np.ndarray]) -> Any:
    """The tree of ``leaves``: string steps as dicts, integer steps as tuples (a lone
    leaf for the empty path)."""
    if () in leaves:
        return leaves[()]
    root: dict[Part, Any] = {}
    for parts, leaf in leaves.items():
        node = root
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = leaf

    def build(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        if node and all(isinstance(k, int) for k in node):
            return tuple(build(node[k]) for k in sorted(node))
        return {k: build(v) for k, v in node.items()}

    return build(root)


# -- checks of an array's .npy header (shape and dtype), before it is loaded ---------------


def exact(shape: tuple[int, ...], dtype: np.dtype) -> HeaderCheck:
    """A header check: exactly ``shape`` of ``dtype``."""

    def check(got_shape: tuple[int, ...], got_dtype: np.dtype) -> str | None:
        if tuple(got_shape) == tuple(shape) and got_dtype == dtype:
            return None
        return f"is {got_dtype}{list(got_shape)}; this runner's is {dtype}{list(shape)}"

    return check


def leading(
    trailing: tuple[int, ...] | None,
    dtype: np.dtype | None,
    length: int | None,
    most: int | None = None,
    why: str = "",
) -> HeaderCheck:
    """A header check: ``[length, *trailing]`` of ``dtype`` (None: any of that part),
    its length at most ``most`` (``why`` says whose bound it is)."""

    def check(shape: tuple[int, ...], got: np.dtype) -> str | None:
        first = shape[0] if shape else None
        ok = first is not None and (length is None or first == length)
        ok = ok and (trailing is None or tuple(shape[1:]) == tuple(trailing))
        if ok and most is not None and first is not None and first > most:
            return f"is {got}{list(shape)}; expected at most {most} entries ({why})"
        if ok and (dtype is None or got == dtype):
            return None
        lead = "n" if length is None else length
        want = "[..]" if trailing is None else list(trailing)
        return f"is {got}{list(shape)}; expected [{lead}, *{want}] of {dtype or 'a numeric dtype'}"

    return check


def bytes_check(shape: tuple[int, ...], dtype: np.dtype) -> str | None:
    if len(shape) == 1 and dtype == np.uint8:
        return None
    return f"is {dtype}{list(shape)}; expected uint8[n] (a pickle's bytes)"

"""What every runner's checkpoint shares: one ``.npz`` of arrays named by tree paths, a
JSON ``__meta__``, and the checks every reader makes. See docs/checkpoints.md."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

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


def leaf_specs(tree: Any) -> dict[tuple[Part, ...], tuple[tuple[int, ...], np.dtype]]:
    """Each leaf's path, trailing shape (after the first axis) and dtype."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        tuple(part_of(e) for e in path): (np.shape(leaf)[1:], np.asarray(leaf).dtype)
        for path, leaf in flat
    }


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

"""Host buffers written leaf by leaf: a pytree's arrays found without a tree walk, and
the per-step copies into them by index and mask (the host loop's and ready-first's)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def tree_leaves(tree: Any) -> list[np.ndarray]:
    """The arrays of a pytree (a lone array without a tree walk)."""
    return [tree] if isinstance(tree, np.ndarray) else jax.tree.leaves(tree)


def put_leaves(
    dsts: list[np.ndarray], srcs: list[np.ndarray], index: Any, mask: np.ndarray | None
) -> None:
    """Leaf by leaf, ``dst[index] = src`` (``dst`` itself where ``index`` is None)
    where ``mask`` (None: everywhere; it covers the leading axes)."""
    for dst, src in zip(dsts, srcs):
        if mask is not None:
            view = dst if index is None else dst[index]
            where = mask
            if view.ndim > mask.ndim:
                where = mask.reshape(*mask.shape, *([1] * (view.ndim - mask.ndim)))
            np.copyto(view, src, where=where)
        elif index is None:
            dst[...] = src
        else:
            dst[index] = src  # a setitem: no view made


def put_rows(dsts: list[np.ndarray], srcs: list[np.ndarray], index: Any, mask: Any) -> None:
    """Leaf by leaf, ``dst[index] = src`` (fancy ``index``) where ``mask`` (None:
    everywhere; it covers the leading axes of ``src``)."""
    for dst, src in zip(dsts, srcs):
        if mask is None:
            dst[index] = src
        else:
            where = mask.reshape(*mask.shape, *([1] * (src.ndim - mask.ndim)))
            dst[index] = np.where(where, src, dst[index])

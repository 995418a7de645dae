"""Per-env views of gymnasium's merged vector infos, split only when read (the exact
inverse of ``VectorEnv._add_info``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

FINAL_KEYS = frozenset({"final_obs", "_final_obs", "final_info", "_final_info"})
"""Keys gymnasium adds to the merged info of a SAME_STEP vector env where episodes end."""


def split_info(merged: Mapping[str, Any], index: int, skip: frozenset[str] = frozenset()) -> dict:
    """Sub-env ``index``'s info out of a merged vector info (``skip`` left out); a key
    without its ``_key`` mask counts as reported by every sub-env (EnvPool's infos)."""
    info: dict[str, Any] = {}
    for key, value in merged.items():
        if key in skip or (key.startswith("_") and key[1:] in merged):
            continue
        mask = merged.get(f"_{key}")
        # No mask: every sub-env reported the key (EnvPool's batched infos).
        if mask is not None and not mask[index]:
            continue
        if isinstance(value, Mapping):
            info[key] = split_info(value, index)
        elif isinstance(value, np.ndarray):
            item = value[index]
            if value.dtype == object:
                info[key] = item
            elif value.dtype == np.bool_ and value.ndim == 1:
                # _add_info stores Python bools in a bool array; a numpy bool_ would
                # have gone to an object array instead, so give the bool back.
                info[key] = bool(item)
            else:
                info[key] = np.array(item) if value.ndim > 1 else item
        else:
            raise ValueError(
                f"vector info key {key!r} holds a {type(value).__name__}; expected an array "
                "with one entry per sub-env (gymnasium's merged layout)."
            )
    return info


class SplitInfos(Sequence[dict[str, Any]]):
    """The per-env infos of one vector-env call, split from ``merged`` on access.
    ``override`` replaces some envs' infos; ``rows`` gives each env's row in ``merged``
    (None: env ``i`` is row ``i``) for a call that answers some rows only.
    """

    def __init__(
        self,
        merged: Mapping[str, Any],
        num_envs: int,
        skip: frozenset[str] = frozenset(),
        override: Mapping[int, dict[str, Any]] | None = None,
        rows: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        self.merged, self._num_envs, self._skip = merged, num_envs, skip
        self._override = override or {}
        self._rows = rows
        self._cache: dict[int, dict[str, Any]] = {}

    def __len__(self) -> int:
        return self._num_envs

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._num_envs))]
        i = int(index)
        if i < 0:
            i += self._num_envs
        if not 0 <= i < self._num_envs:
            raise IndexError(f"info index {index} out of range for {self._num_envs} sub-envs")
        if i in self._override:
            return self._override[i]
        if i not in self._cache:
            row = i if self._rows is None else int(self._rows[i])
            self._cache[i] = split_info(self.merged, row, self._skip) if self.merged else {}
        return self._cache[i]


class ResetInfos(Mapping[int, dict[str, Any]]):
    """The infos of the resets done in one call, by env index, built on access
    (``lookup`` called at most once per index)."""

    def __init__(self, indices: Sequence[int], lookup: Callable[[int], dict[str, Any]]) -> None:
        self._indices, self._lookup = list(indices), lookup
        self._members = frozenset(self._indices)
        self._cache: dict[int, dict[str, Any]] = {}

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index not in self._members:
            raise KeyError(index)
        if index not in self._cache:
            self._cache[index] = self._lookup(index)
        return self._cache[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices)

    def __len__(self) -> int:
        return len(self._indices)

    def __contains__(self, index: object) -> bool:
        return index in self._members


EMPTY_RESET_INFOS: Mapping[int, dict[str, Any]] = ResetInfos((), lambda i: {})


def same_step_infos(
    merged: Mapping[str, Any], num_envs: int, ended: Sequence[int]
) -> tuple[SplitInfos, ResetInfos]:
    """The per-env step infos and the reset infos of sub-envs ``ended`` (in index order)
    of one call of a SAME_STEP vector env, which resets in the same call: ``merged`` is
    the reset's info, the ended steps' own are in ``merged["final_info"]`` where the env
    gave them. Neither holds :data:`FINAL_KEYS`."""
    final_info = merged.get("final_info")
    # gymnasium merges the final infos like any nested info dict (key/_key arrays).
    finals: dict[int, dict[str, Any]] = {}
    if isinstance(final_info, Mapping):
        finals = {i: split_info(final_info, i) for i in ended}
    reset_side = SplitInfos(merged, num_envs, skip=FINAL_KEYS)
    step_side = SplitInfos(merged, num_envs, skip=FINAL_KEYS, override=finals)
    return step_side, ResetInfos(ended, reset_side.__getitem__)

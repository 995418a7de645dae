"""Reading a saved trajectory file that may be hostile.

A file written by ``Trajectory.save`` is a zip of ``.npy`` members: ``__spec__``
(JSON: the format, its version, and each field's tree of dicts, tuples, ``None``
and array names) and one member per array. :class:`TrajectoryFile` reads the spec
within :data:`MAX_SPEC_BYTES`, then only the members it names, each once (one member
backs one field), checked against its own header before memory is allocated, within a
total byte cap (the bounded reader, :mod:`jaxrunner.npz_reader`); then it checks the
fields against each other.
Every failure is an :class:`~jaxrunner.errors.InvalidArgumentError` naming the field.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from jaxrunner.errors import InvalidArgumentError
from jaxrunner.npz_reader import NpzReader

MAX_SPEC_BYTES = 1 << 20
"""The most bytes the JSON spec may take."""
MAX_TREE_DEPTH = 32
"""The deepest a field's tree may nest."""
# Each field's leading shape [T, B] and the dtype kinds it may have (None: any numeric).
_FIELD_KINDS: dict[str, str | None] = {
    "obs": None,
    "action": None,
    "reward": "f",
    "terminated": "b",
    "truncated": "b",
    "next_obs": None,
    "extras": None,
    "env_id": "iu",
    "episode_id": "iu",
    "step": "iu",
    "valid": "b",
}
_FLAT = ("reward", "terminated", "truncated", "env_id", "episode_id", "step", "valid")


class TrajectoryFile:
    """An open trajectory file; use as a context manager.

    Args:
        path: the file.
        expected_format, expected_version: what its spec must say.
        max_bytes: the most bytes its arrays may take (None: no cap).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        expected_format: str,
        expected_version: int,
        max_bytes: int | None,
    ) -> None:
        self.path = path
        self._format, self._version = expected_format, expected_version
        self._npz = NpzReader(path, self._error, max_bytes, "; pass a larger max_bytes")

    def __enter__(self) -> TrajectoryFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._npz.close()

    def read_fields(self, names: tuple[str, ...]) -> dict[str, Any]:
        """Every field ``names`` lists, decoded and checked against each other."""
        spec = self._read_spec()
        fields = spec.get("fields")
        if not isinstance(fields, dict):
            raise self._error("its spec has no 'fields' object")
        missing = [n for n in names if n not in fields and n != "valid"]
        unknown = sorted(set(fields) - set(names))
        if missing or unknown:
            raise self._error(
                f"expected the fields {list(names)}; missing {missing}, unknown {unknown}"
            )
        decoded = {name: self._decode(fields[name], name, 0) for name in names if name in fields}
        _check_shapes(decoded, self._error)
        return decoded

    # -- internals --------------------------------------------------------------------------

    def _error(self, what: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"Trajectory.load({os.fspath(self.path)!r}): the file {what}. Load only files "
            "written by Trajectory.save."
        )

    def _read_spec(self) -> dict[str, Any]:
        if not self._npz.has("__spec__"):
            raise InvalidArgumentError(
                f"{os.fspath(self.path)} is not a jaxrunner trajectory file (no __spec__)."
            )
        spec = self._npz.read_json("__spec__", "spec", MAX_SPEC_BYTES)
        if not isinstance(spec, dict):
            raise self._error("has a spec that is not a JSON object")
        if spec.get("format") != self._format or spec.get("version") != self._version:
            raise InvalidArgumentError(
                f"{os.fspath(self.path)}: expected format {self._format} version "
                f"{self._version}, got {spec.get('format')!r} version {spec.get('version')!r}."
            )
        return spec

    def _decode(self, node: Any, where: str, depth: int) -> Any:
        if depth > MAX_TREE_DEPTH:
            raise self._error(f"nests field {where} deeper than {MAX_TREE_DEPTH} levels")
        if not isinstance(node, dict) or len(node) != 1:
            raise self._error(
                f"describes field {where} with {str(node)[:80]!r}; expected one "
                "of {'dict': ...}, {'tuple': ...}, {'none': true}, {'array': name}"
            )
        ((kind, value),) = node.items()
        if kind == "dict" and isinstance(value, dict):
            return {k: self._decode(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
        if kind == "tuple" and isinstance(value, list):
            return tuple(self._decode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))
        if kind == "none" and value is True:
            return None
        if kind == "array" and isinstance(value, str) and self._npz.has(value):
            return self._npz.read(value, where)
        raise self._error(
            f"describes field {where} with {str(node)[:80]!r}, which names no "
            "array member of the file"
        )


def _check_shapes(fields: dict[str, Any], error: Any) -> None:
    """Every leaf is ``[T, B, ...]`` with the same ``T, B``; the flat fields are
    exactly ``[T, B]`` of their dtype kind; ``next_obs`` is shaped like ``obs``."""
    reward = fields.get("reward")
    if not isinstance(reward, np.ndarray) or reward.ndim != 2:
        raise error(f"has a reward of shape {getattr(reward, 'shape', None)}; expected [T, B]")
    lead = reward.shape
    for name, tree in fields.items():
        leaves = _leaves(tree, name)
        if name in _FLAT and (len(leaves) != 1 or leaves[0][1].ndim != 2):
            raise error(f"has field {name} that is not one [T, B] array")
        kinds = _FIELD_KINDS[name]
        for where, leaf in leaves:
            if leaf.shape[:2] != lead:
                raise error(
                    f"has field {where} of shape {list(leaf.shape)}; every field must "
                    f"start with [T, B] = {list(lead)} (reward's)"
                )
            if kinds is not None and leaf.dtype.kind not in kinds:
                raise error(f"has field {where} of dtype {leaf.dtype}; expected kind {kinds!r}")
    obs = [(leaf.shape, leaf.dtype) for _, leaf in _leaves(fields["obs"], "obs")]
    nxt = [(leaf.shape, leaf.dtype) for _, leaf in _leaves(fields["next_obs"], "next_obs")]
    if obs != nxt or _structure(fields["obs"]) != _structure(fields["next_obs"]):
        raise error(
            "has next_obs shaped unlike obs; they must have one structure, shapes and dtypes"
        )


def _leaves(tree: Any, where: str) -> list[tuple[str, np.ndarray]]:
    if isinstance(tree, dict):
        return [leaf for k, v in tree.items() for leaf in _leaves(v, f"{where}.{k}")]
    if isinstance(tree, tuple):
        return [leaf for i, v in enumerate(tree) for leaf in _leaves(v, f"{where}[{i}]")]
    if tree is None:
        return []
    return [(where, tree)]


def _structure(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _structure(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_structure(v) for v in tree)
    return None if tree is None else "array"


__all__ = ["MAX_SPEC_BYTES", "MAX_TREE_DEPTH", "TrajectoryFile"]

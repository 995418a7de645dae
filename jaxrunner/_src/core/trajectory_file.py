"""Writing and reading trajectory files, which may be hostile: a zip of ``.npy`` members, a
JSON ``__spec__`` (format, version, each field's tree of array names) and one member per
array, read through the bounded :mod:`.npz_file` and checked field against field."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxrunner._src.arg_checks import check_int, check_path
from jaxrunner._src.core.npz_file import NpzReader
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

VERSION = 1
"""The version of the trajectory file formats."""
MAX_SPEC_BYTES = 1 << 20
"""The most bytes the JSON spec may take."""
MAX_TREE_DEPTH = 32
"""The deepest a field's tree may nest."""
FLAT_KINDS: dict[str, str] = {
    "reward": "f",
    "terminated": "b",
    "truncated": "b",
    "valid": "b",
    "env_id": "iu",
    "episode_id": "iu",
    "step": "iu",
    "env_done": "b",
    "agent_step": "iu",
}
"""The fields that are exactly one array of the leading shape, and their dtype kinds;
every other field is a tree of numeric arrays that start with the leading shape."""

ErrorFn = Callable[[str], InvalidArgumentError]
"""Builds the loader's error from a description of what is wrong with the file."""


def encode_tree(tree: Any, arrays: dict[str, np.ndarray]) -> Any:
    """JSON description of a pytree of dicts (str keys), tuples and arrays; each array is
    added to ``arrays`` under a new name, which the description refers to."""
    if isinstance(tree, dict):
        if not all(isinstance(k, str) for k in tree):
            raise InvalidArgumentTypeError(
                f"only str dict keys can be saved, got keys {list(tree)}"
            )
        return {"dict": {k: encode_tree(v, arrays) for k, v in tree.items()}}
    if isinstance(tree, (tuple, list)):
        return {"tuple": [encode_tree(v, arrays) for v in tree]}
    if tree is None:
        return {"none": True}
    array = np.asarray(tree)
    if array.dtype.kind not in "biufc":  # what a load reads back (bfloat16 is kind "V")
        raise InvalidArgumentTypeError(
            f"only arrays of bools and numbers can be saved, got one of dtype {array.dtype}; "
            "cast it first (bfloat16 to float32)."
        )
    name = f"a{len(arrays)}"
    arrays[name] = array
    return {"array": name}


class TrajectoryFile(NpzReader):
    """An open file of the trajectory class ``cls`` (a context manager) whose spec must
    name ``cls._FORMAT`` and :data:`VERSION`, its arrays within ``max_bytes`` (None: no
    cap); errors name ``cls``."""

    def __init__(self, path: str | os.PathLike[str], cls: Any, max_bytes: int | None) -> None:
        self._format, self._kind = cls._FORMAT, cls.__name__
        path = check_path(f"{self._kind}.load", "path", path)
        check_int(f"{self._kind}.load", "max_bytes", max_bytes, low=0, none="for no cap")
        super().__init__(path, self.error, max_bytes, "; pass a larger max_bytes")

    def error(self, what: str) -> InvalidArgumentError:
        """The loader's error: the file ``what`` (``"has field reward of ..."``)."""
        return InvalidArgumentError(
            f"{self._kind}.load({os.fspath(self.path)!r}): the file {what}. Load only files "
            f"written by {self._kind}.save."
        )

    def read_spec(self) -> dict[str, Any]:
        """The JSON spec, checked to be an object of the expected format and version."""
        if not self.has("__spec__"):
            raise InvalidArgumentError(
                f"{os.fspath(self.path)} is not a jaxrunner trajectory file (no __spec__)."
            )
        spec = self.read_json("__spec__", "spec", MAX_SPEC_BYTES)
        if not isinstance(spec, dict):
            raise self.error("has a spec that is not a JSON object")
        if spec.get("format") != self._format or spec.get("version") != VERSION:
            raise InvalidArgumentError(
                f"{os.fspath(self.path)}: expected format {self._format} version "
                f"{VERSION}, got {spec.get('format')!r} version {spec.get('version')!r}."
            )
        return spec

    def read_fields(
        self, node: Any, names: tuple[str, ...], where: str = "", optional: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """The fields ``names`` (exactly those, ``optional`` ones may be missing) that
        the spec object ``node`` describes, decoded (arrays read); ``where`` prefixes
        their names in errors (``"groups.p0."``)."""
        if not isinstance(node, dict):
            raise self.error(f"has no '{where}fields' object in its spec")
        missing = [n for n in names if n not in node and n not in optional]
        unknown = sorted(set(node) - set(names))
        if missing or unknown:
            raise self.error(
                f"expected the fields {list(names)}{f' in {where[:-1]}' if where else ''}; "
                f"missing {missing}, unknown {unknown}"
            )
        return {name: self._decode(node[name], where + name, 0) for name in names if name in node}

    def _decode(self, node: Any, where: str, depth: int) -> Any:
        if depth > MAX_TREE_DEPTH:
            raise self.error(f"nests field {where} deeper than {MAX_TREE_DEPTH} levels")
        if not isinstance(node, dict) or len(node) != 1:
            raise self.error(
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
        if kind == "array" and isinstance(value, str) and self.has(value):
            return self.read(value, where)
        raise self.error(
            f"describes field {where} with {str(node)[:80]!r}, which names no "
            "array member of the file"
        )


def lead_shape(fields: dict[str, Any], name: str, error: ErrorFn) -> tuple[int, ...]:
    """The shape of field ``name``, which must be one ``[T, B]`` array: the leading shape
    the other fields are checked against."""
    array = fields.get(name)
    if not isinstance(array, np.ndarray) or array.ndim != 2:
        raise error(f"has a {name} of shape {getattr(array, 'shape', None)}; expected [T, B]")
    return array.shape


def check_fields(
    fields: dict[str, Any],
    lead: tuple[int, ...],
    lead_source: str,
    error: ErrorFn,
    where: str = "",
    may_be_none: tuple[str, ...] = (),
) -> None:
    """Refuses (``error``, naming the field) decoded ``fields`` unless every leaf starts
    with ``lead`` (``[T, B]``, or a group's ``[T, B, A_g]``; from ``lead_source``), the
    :data:`FLAT_KINDS` fields are one ``lead``-shaped array of their dtype kind (or
    None, those in ``may_be_none``), and ``next_obs`` (if any) has ``obs``'s structure,
    shapes and dtypes."""
    for name, tree in fields.items():
        if name == "extras" and not isinstance(tree, dict):
            raise error(f"has field {where}extras that is not an object of named arrays")
        leaves = _leaves(tree, where + name)
        kinds = FLAT_KINDS.get(name)
        if tree is None and name in may_be_none:
            continue
        if kinds is not None and (len(leaves) != 1 or leaves[0][1].ndim != len(lead)):
            raise error(f"has field {where}{name} that is not one {list(lead)}-shaped array")
        for at, leaf in leaves:
            if leaf.shape[: len(lead)] != lead:
                raise error(
                    f"has field {at} of shape {list(leaf.shape)}; every field must "
                    f"start with {list(lead)} ({lead_source})"
                )
            if kinds is not None and leaf.dtype.kind not in kinds:
                raise error(f"has field {at} of dtype {leaf.dtype}; expected kind {kinds!r}")
    if "next_obs" not in fields:
        return
    obs = [(leaf.shape, leaf.dtype) for _, leaf in _leaves(fields["obs"], "obs")]
    nxt = [(leaf.shape, leaf.dtype) for _, leaf in _leaves(fields["next_obs"], "next_obs")]
    if obs != nxt or jax.tree.structure(fields["obs"]) != jax.tree.structure(fields["next_obs"]):
        raise error(
            f"has {where}next_obs shaped unlike {where}obs; they must have one structure, "
            "shapes and dtypes"
        )


def _leaves(tree: Any, where: str) -> list[tuple[str, np.ndarray]]:
    if isinstance(tree, dict):
        return [leaf for k, v in tree.items() for leaf in _leaves(v, f"{where}.{k}")]
    if isinstance(tree, tuple):
        return [leaf for i, v in enumerate(tree) for leaf in _leaves(v, f"{where}[{i}]")]
    if tree is None:
        return []
    return [(where, tree)]

"""The wire format, JSON only, never pickle: an array is ``{"dtype", "shape", "data"}``
(base64 little-endian bytes, a dtype from :data:`DTYPES`), observations and actions are
trees decoded guided by their space, params a flat list of leaves plus the treedef's text."""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import Any, Literal, get_args

import jax
import numpy as np
from gymnasium import spaces

from jaxrunner.errors import SpaceMismatchError

DType = Literal[
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
]
"""The only dtypes accepted on the wire (the schema's type)."""
DTYPES: tuple[str, ...] = get_args(DType)

MAX_DIMS = 16
CLIENT_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
"""The names a client may give itself (``X-Client-Id``; the server refuses others)."""
DEFAULT_MAX_ELEMENTS = 1 << 24


class WireError(SpaceMismatchError):
    """A message is malformed: bad array encoding, unknown dtype, wrong structure."""


def encode_array(value: Any) -> dict[str, Any]:
    """One array (or numpy scalar) as its JSON object."""
    array = np.asarray(value)
    if array.dtype.name not in DTYPES:
        raise WireError(
            f"cannot send an array of dtype {array.dtype}: not allowed; use one of "
            f"{', '.join(DTYPES)}."
        )
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return {
        "dtype": array.dtype.name,
        "shape": list(array.shape),
        "data": base64.b64encode(np.ascontiguousarray(little).tobytes()).decode("ascii"),
    }


def decode_array(obj: Any, where: str, max_elements: int = DEFAULT_MAX_ELEMENTS) -> np.ndarray:
    """The array an :func:`encode_array` object describes, after checking everything
    about it (fields, dtype allowlist, shape, byte count) before allocating."""
    if not isinstance(obj, Mapping) or set(obj) != {"dtype", "shape", "data"}:
        raise WireError(
            f"{where}: expected an array object {{dtype, shape, data}}, got {_kind(obj)}."
        )
    dtype_name, shape, data = obj["dtype"], obj["shape"], obj["data"]
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise WireError(
            f"{where}: dtype {dtype_name!r} is not allowed; allowed: {', '.join(DTYPES)}."
        )
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMS
        or not all(type(d) is int and 0 <= d <= max_elements for d in shape)
    ):
        raise WireError(f"{where}: shape must be a list of at most {MAX_DIMS} ints >= 0.")
    count = math.prod(shape)
    if count > max_elements:
        raise WireError(f"{where}: {count} elements is more than the limit of {max_elements}.")
    if not isinstance(data, str):
        raise WireError(f"{where}: data must be a base64 string.")
    dtype = np.dtype(dtype_name).newbyteorder("<")
    if len(data) > 4 * (-(-count * dtype.itemsize // 3)) + 4:
        raise WireError(f"{where}: data is longer than shape {shape} of {dtype_name} needs.")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise WireError(f"{where}: data is not valid base64.") from None
    if len(raw) != count * dtype.itemsize:
        raise WireError(
            f"{where}: data holds {len(raw)} bytes; shape {shape} of {dtype_name} needs "
            f"{count * dtype.itemsize}."
        )
    array = np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype_name)
    if array.dtype == np.bool_ and not np.isin(np.frombuffer(raw, np.uint8), (0, 1)).all():
        raise WireError(f"{where}: bool data must be bytes 0 or 1.")
    return array


def encode_tree(space: spaces.Space, value: Any) -> Any:
    """An observation or action shaped by ``space`` as JSON."""
    if isinstance(space, spaces.Dict):
        return {key: encode_tree(sub, value[key]) for key, sub in space.items()}
    if isinstance(space, spaces.Tuple):
        return [encode_tree(sub, item) for sub, item in zip(space, value)]
    return encode_array(value)


def decode_tree(space: spaces.Space, obj: Any, where: str) -> Any:
    """The tree ``obj`` encodes, structured by ``space``. Only the structure and
    encoding are checked here; check the values with
    :func:`jaxrunner._src.space_arrays.check_value`."""
    if isinstance(space, spaces.Dict):
        if not isinstance(obj, Mapping) or set(obj) != set(space.spaces):
            raise WireError(f"{where}: expected an object with keys {sorted(space.spaces)}.")
        return {key: decode_tree(sub, obj[key], f"{where}[{key!r}]") for key, sub in space.items()}
    if isinstance(space, spaces.Tuple):
        if not isinstance(obj, list) or len(obj) != len(space.spaces):
            raise WireError(f"{where}: expected a list of {len(space.spaces)} items.")
        return tuple(
            decode_tree(sub, item, f"{where}[{j}]") for j, (sub, item) in enumerate(zip(space, obj))
        )
    return decode_array(obj, where)


def encode_params(params: Any) -> dict[str, Any]:
    """Params as ``{"treedef": text, "leaves": [array, ...]}``."""
    leaves, treedef = jax.tree.flatten(jax.device_get(params))
    return {"treedef": str(treedef), "leaves": [encode_array(leaf) for leaf in leaves]}


def decode_params(obj: Any, template: Any) -> Any:
    """Params sent by :func:`encode_params`, checked against ``template`` (params of
    the same policy: structure, shapes and dtypes must match)."""
    leaves, treedef = jax.tree.flatten(template)
    if not isinstance(obj, Mapping) or obj.get("treedef") != str(treedef):
        raise WireError(
            "the server's params have another structure than this client's policy; run the "
            "same policy (module and action space) on both sides."
        )
    got = obj.get("leaves")
    if not isinstance(got, list) or len(got) != len(leaves):
        raise WireError("params: wrong number of leaves.")
    arrays = [decode_array(g, f"params leaf {i}") for i, g in enumerate(got)]
    for i, (array, like) in enumerate(zip(arrays, leaves)):
        if array.shape != np.shape(like) or array.dtype != np.asarray(like).dtype:
            raise WireError(
                f"params leaf {i}: got {array.dtype}{list(array.shape)}, this client's policy "
                f"has {np.asarray(like).dtype}{list(np.shape(like))}."
            )
    return jax.tree.unflatten(treedef, arrays)


def space_to_json(space: spaces.Space) -> dict[str, Any]:
    """A description of a (supported) space that :func:`space_from_json` rebuilds."""
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_json(s) for k, s in space.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_json(s) for s in space]}
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": encode_array(space.nvec),
            "start": encode_array(space.start),
            "dtype": np.dtype(space.dtype).name,
        }
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "low": encode_array(space.low),
            "high": encode_array(space.high),
            "dtype": np.dtype(space.dtype).name,
        }
    raise WireError(f"no wire description for space {space}.")


def space_from_json(obj: Mapping[str, Any]) -> spaces.Space:
    """The space :func:`space_to_json` described."""
    kind = obj["type"]
    if kind == "Dict":
        return spaces.Dict({k: space_from_json(s) for k, s in obj["spaces"].items()})
    if kind == "Tuple":
        return spaces.Tuple([space_from_json(s) for s in obj["spaces"]])
    if kind == "Discrete":
        return spaces.Discrete(obj["n"], start=obj["start"])
    if kind == "MultiDiscrete":
        nvec = decode_array(obj["nvec"], "nvec")
        start = decode_array(obj["start"], "start")
        return spaces.MultiDiscrete(nvec, dtype=obj["dtype"], start=start)
    if kind == "MultiBinary":
        return spaces.MultiBinary(obj["n"])
    if kind == "Box":
        low, high = decode_array(obj["low"], "low"), decode_array(obj["high"], "high")
        return spaces.Box(low, high, shape=low.shape, dtype=obj["dtype"])
    raise WireError(f"unknown space type {kind!r}.")


def _kind(obj: Any) -> str:
    if isinstance(obj, Mapping):
        return f"an object with keys {sorted(map(str, obj))[:8]}"
    return f"a JSON {type(obj).__name__}"

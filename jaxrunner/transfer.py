"""One transfer each way per step: pytrees packed into a single flat byte buffer.

``jax.device_put`` and ``jax.device_get`` cost a fixed amount *per array* (tens of
microseconds on a CPU host), so the runner moves one ``uint8`` buffer instead of
one array per leaf. :class:`Packing` is the layout: the host writes leaves into
numpy views of the buffer; jitted code unpacks them with bitcasts, which XLA
compiles to free reinterpretations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

_ALIGN = 8


class Packing:
    """The layout of a pytree of fixed-shape arrays inside one flat ``uint8`` buffer.

    Leaves are stored with JAX's canonical dtypes (``float64 -> float32`` and
    ``int64 -> int32`` unless x64 is enabled), as ``jax.device_put`` would do.

    Args:
        example: a pytree of arrays or ``jax.ShapeDtypeStruct`` giving shapes and dtypes.
    """

    def __init__(self, example: Any) -> None:
        leaves, self.treedef = jax.tree.flatten(example)
        self.shapes = [tuple(leaf.shape) for leaf in leaves]
        self.dtypes = [np.dtype(jax.dtypes.canonicalize_dtype(leaf.dtype)) for leaf in leaves]
        self.offsets = []
        self.sizes = [int(np.prod(shape)) for shape in self.shapes]
        offset = 0
        for size, dtype in zip(self.sizes, self.dtypes):
            self.offsets.append(offset)
            offset += -(-size * dtype.itemsize // _ALIGN) * _ALIGN
        self.nbytes = max(offset, _ALIGN)
        # host_views runs every step: its slicing is worked out once, here.
        self._views = [
            (lo, lo + size * dtype.itemsize, dtype, shape)
            for lo, size, dtype, shape in zip(self.offsets, self.sizes, self.dtypes, self.shapes)
        ]

    def allocate(self) -> np.ndarray:
        """A zeroed host buffer for this layout."""
        return np.zeros(self.nbytes, np.uint8)

    def host_views(self, buffer: np.ndarray) -> Any:
        """Numpy views of each leaf inside ``buffer`` (writes go into the buffer)."""
        return self.treedef.unflatten(self.host_leaves(buffer))

    def host_leaves(self, buffer: np.ndarray) -> list[np.ndarray]:
        """:meth:`host_views` as the flat list of leaves."""
        return [buffer[lo:hi].view(dtype).reshape(shape) for lo, hi, dtype, shape in self._views]

    def unpack(self, flat: jax.Array) -> Any:
        """The pytree stored in ``flat`` (traceable: use inside jit)."""
        leaves = []
        for shape, size, dtype, offset in zip(self.shapes, self.sizes, self.dtypes, self.offsets):
            chunk = flat[offset : offset + size * dtype.itemsize]
            if dtype == np.bool_:
                leaf = chunk != 0
            elif dtype.itemsize == 1:
                leaf = jax.lax.bitcast_convert_type(chunk, dtype)
            else:
                leaf = jax.lax.bitcast_convert_type(chunk.reshape(size, dtype.itemsize), dtype)
            leaves.append(leaf.reshape(shape))
        return self.treedef.unflatten(leaves)

    def pack(self, tree: Any) -> jax.Array:
        """``tree`` as one flat ``uint8`` array (traceable: use inside jit)."""
        pieces = []
        leaves = self.treedef.flatten_up_to(tree)
        for leaf, dtype, offset, next_offset in zip(
            leaves, self.dtypes, self.offsets, [*self.offsets[1:], self.nbytes]
        ):
            leaf = jnp.asarray(leaf).astype(dtype)
            if dtype == np.bool_:
                raw = leaf.astype(jnp.uint8).reshape(-1)
            else:
                raw = jax.lax.bitcast_convert_type(leaf, jnp.uint8).reshape(-1)
            pieces.append(raw)
            padding = next_offset - offset - raw.shape[0]
            if padding:
                pieces.append(jnp.zeros(padding, jnp.uint8))
        if not pieces:
            return jnp.zeros(self.nbytes, jnp.uint8)
        return jnp.concatenate(pieces)


class PackedProgram(NamedTuple):
    """A program compiled ahead of time by :func:`compile_packed`."""

    run: Callable[..., tuple[Any, ...]]
    """``run(*args, packed_inputs) -> (packed_outputs, *rest)``."""
    inputs: Packing
    """Layout of the packed inputs (``inputs.allocate()`` gives a host stage)."""
    outputs: Packing
    """Layout of the packed outputs."""
    output_spec: Any
    """Shapes and dtypes of the outputs, as a pytree of ``jax.ShapeDtypeStruct``."""


def compile_packed(
    fn: Callable[..., tuple[Any, ...]],
    args: tuple[Any, ...],
    inputs_example: Any,
    *,
    donate_argnums: tuple[int, ...] = (),
) -> PackedProgram:
    """Compiles ``fn(*args, inputs) -> (outputs, *rest)`` once, ahead of time, with
    ``inputs`` (shaped like ``inputs_example``) unpacked from one ``uint8`` buffer and
    ``outputs`` packed into one: one transfer each way per call. The one compile path
    of the samplers' policy step and the ExternalEnv batcher."""
    in_packing = Packing(inputs_example)
    traced: dict[str, Any] = {}

    def program(*call_args: Any) -> tuple[Any, ...]:
        *lead, packed = call_args
        outputs, *rest = fn(*lead, in_packing.unpack(packed))
        # Shapes are static while tracing: the output layout is fixed here, once.
        traced["spec"] = jax.eval_shape(lambda: outputs)
        traced["packing"] = Packing(outputs)
        return (traced["packing"].pack(outputs), *rest)

    packed_spec = jax.ShapeDtypeStruct((in_packing.nbytes,), jnp.uint8)
    lowered = jax.jit(program, donate_argnums=donate_argnums).trace(*args, packed_spec).lower()
    return PackedProgram(lowered.compile(), in_packing, traced["packing"], traced["spec"])

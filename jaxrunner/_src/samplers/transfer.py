"""One transfer each way per step: pytrees packed into a single buffer of 32-bit words.
See docs/design.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

_ALIGN = 8
_WORD = 4
HOST_ALIGN = 64
"""A host buffer at this alignment goes to a CPU device with no copy (JAX aliases it);
any other is copied, e.g. 37 us for a 451 KB stage of 16 Atari frames."""


def aligned_zeros(nbytes: int) -> np.ndarray:
    """A zeroed ``uint8`` array that owns its memory (the ``base`` of every array made
    from it), with room for ``nbytes`` from its :func:`aligned_start`."""
    return np.zeros(nbytes + HOST_ALIGN, np.uint8)


def aligned_start(raw: np.ndarray) -> int:
    """The offset of the first ``HOST_ALIGN``-aligned byte of ``raw``."""
    return -raw.ctypes.data % HOST_ALIGN


class Packing:
    """The layout of a pytree shaped as ``example`` (arrays or ``ShapeDtypeStruct``s)
    in one flat ``uint32`` buffer: each leaf at an 8-byte aligned offset, in JAX's
    canonical dtype (as ``jax.device_put`` would store it)."""

    def __init__(self, example: Any) -> None:
        leaves, self.treedef = jax.tree.flatten(example)
        self.shapes = [tuple(leaf.shape) for leaf in leaves]
        self.dtypes = [np.dtype(jax.dtypes.canonicalize_dtype(leaf.dtype)) for leaf in leaves]
        self.offsets = []  # in bytes
        self.sizes = [int(np.prod(shape)) for shape in self.shapes]
        offset = 0
        for size, dtype in zip(self.sizes, self.dtypes):
            self.offsets.append(offset)
            offset += -(-size * dtype.itemsize // _ALIGN) * _ALIGN
        self.nbytes = max(offset, _ALIGN)
        self.nwords = self.nbytes // _WORD
        # host_views runs every step: its slicing is worked out once, here.
        self._views = [
            (lo, lo + size * dtype.itemsize, dtype, shape)
            for lo, size, dtype, shape in zip(self.offsets, self.sizes, self.dtypes, self.shapes)
        ]
        self._by_lead: dict[tuple[int, ...], list[tuple[int, int, np.dtype, tuple]]] = {}

    def allocate(self) -> np.ndarray:
        """A zeroed host buffer for this layout, ``HOST_ALIGN``-byte aligned."""
        raw = aligned_zeros(self.nbytes)
        start = aligned_start(raw)
        return raw[start : start + self.nbytes].view(np.uint32)

    def host_views(self, buffer: np.ndarray) -> Any:
        """Numpy views of each leaf inside ``buffer`` (writes go into the buffer)."""
        return self.treedef.unflatten(self.host_leaves(buffer))

    def host_leaves(
        self, buffer: np.ndarray, lead: tuple[int, ...] | None = None
    ) -> list[np.ndarray]:
        """:meth:`host_views` as the flat list of leaves; with ``lead``, views of each
        leaf's first ``prod(lead)`` rows shaped ``[*lead, ...]`` (every leaf must have
        that many rows)."""
        # (a leading shape seen before: its views without a call)
        views = self._views if lead is None else self._by_lead.get(lead) or self._lead_views(lead)
        # One constructor call per leaf (a third of slicing, viewing and reshaping: this
        # runs on every policy step).
        return [np.ndarray(shape, dtype, buffer, lo) for lo, _, dtype, shape in views]

    def _lead_views(self, lead: tuple[int, ...]) -> list[tuple[int, int, np.dtype, tuple]]:
        # Worked out once per leading shape: a sampler asks for the same few every step.
        count = int(np.prod(lead))
        views = []
        for lo, hi, dtype, shape in self._views:
            if not shape:  # a scalar (not a row each): as it is
                views.append((lo, hi, dtype, shape))
                continue
            if shape[0] < count:
                raise ValueError(f"leaf of shape {shape} has fewer than {count} rows")
            views.append((lo, lo + (hi - lo) // shape[0] * count, dtype, (*lead, *shape[1:])))
        self._by_lead[lead] = views
        return views

    def unpack(self, flat: jax.Array) -> Any:
        """The pytree stored in ``flat`` (traceable: use inside jit)."""
        leaves = []
        for shape, size, dtype, offset in zip(self.shapes, self.sizes, self.dtypes, self.offsets):
            first = offset // _WORD
            words = flat[first : first + -(-size * dtype.itemsize // _WORD)]
            if dtype.itemsize == _WORD:
                leaf = jax.lax.bitcast_convert_type(words, dtype)
            elif dtype.itemsize > _WORD:
                leaf = jax.lax.bitcast_convert_type(
                    words.reshape(size, dtype.itemsize // _WORD), dtype
                )
            else:  # 1 or 2 bytes: the words' bytes (or halves), in memory order
                small = jnp.uint8 if dtype.itemsize == 1 else jnp.uint16
                parts = jax.lax.bitcast_convert_type(words, small).reshape(-1)[:size]
                leaf = (
                    parts != 0 if dtype == np.bool_ else jax.lax.bitcast_convert_type(parts, dtype)
                )
            leaves.append(leaf.reshape(shape))
        return self.treedef.unflatten(leaves)

    def pack(self, tree: Any) -> jax.Array:
        """``tree`` as one flat ``uint32`` array (traceable: use inside jit)."""
        pieces = []
        leaves = self.treedef.flatten_up_to(tree)
        for leaf, dtype, offset, next_offset in zip(
            leaves, self.dtypes, self.offsets, [*self.offsets[1:], self.nbytes]
        ):
            leaf = jnp.asarray(leaf).astype(dtype).reshape(-1)
            if dtype.itemsize >= _WORD:
                words = jax.lax.bitcast_convert_type(leaf, jnp.uint32).reshape(-1)
            else:  # 1 or 2 bytes: padded to whole words, then grouped into them
                small = jnp.uint8 if dtype.itemsize == 1 else jnp.uint16
                parts = leaf.astype(small) if dtype == np.bool_ else leaf
                parts = jax.lax.bitcast_convert_type(parts, small)
                per_word = _WORD // dtype.itemsize
                parts = jnp.pad(parts, (0, -parts.shape[0] % per_word))
                words = jax.lax.bitcast_convert_type(parts.reshape(-1, per_word), jnp.uint32)
            pieces.append(words)
            padding = (next_offset - offset) // _WORD - words.shape[0]
            if padding:
                pieces.append(jnp.zeros(padding, jnp.uint32))
        if not pieces:
            return jnp.zeros(self.nwords, jnp.uint32)
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
    ``inputs`` (shaped like ``inputs_example``) unpacked from one ``uint32`` buffer and
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

    packed_spec = jax.ShapeDtypeStruct((in_packing.nwords,), jnp.uint32)
    lowered = jax.jit(program, donate_argnums=donate_argnums).trace(*args, packed_spec).lower()
    return PackedProgram(lowered.compile(), in_packing, traced["packing"], traced["spec"])

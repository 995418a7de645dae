"""The connectors' state packed into one flat device buffer per dtype for a host sampler."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner._src.connectors.pipeline import ConnectorsState
from jaxrunner.errors import InvalidArgumentError


class StatePacking:
    """The connectors' state as one flat device buffer per dtype between a host
    sampler's compiled calls (each array passed costs ~1.5 us of dispatch on a CPU host).
    Leaves of a dtype are raveled and concatenated (bitcasts cost more than they save);
    ``example``'s shapes and dtypes fix the layout."""

    def __init__(self, example: ConnectorsState) -> None:
        leaves, self.treedef = jax.tree.flatten(example)
        self.shapes = [tuple(np.shape(x)) for x in leaves]
        self.dtypes = [np.dtype(jax.dtypes.canonicalize_dtype(x.dtype)) for x in leaves]
        self.groups = sorted({d.str for d in self.dtypes})
        # Leaf i lives in buffer groups.index(dtype) at [offset, offset + size).
        self.where: list[tuple[int, int, int]] = []
        sizes = dict.fromkeys(self.groups, 0)
        for shape, dtype in zip(self.shapes, self.dtypes):
            size = int(np.prod(shape))
            self.where.append((self.groups.index(dtype.str), sizes[dtype.str], size))
            sizes[dtype.str] += size
        self.sizes = [sizes[g] for g in self.groups]

    def pack(self, state: ConnectorsState) -> tuple[jax.Array, ...]:
        """Traceable: the flat buffers of ``state``, one per dtype."""
        parts: list[list[jax.Array]] = [[] for _ in self.groups]
        for (group, _, _), leaf in zip(self.where, self.treedef.flatten_up_to(state)):
            parts[group].append(jnp.ravel(leaf))
        return tuple(
            jnp.concatenate(p) if p else jnp.zeros(0, g) for p, g in zip(parts, self.groups)
        )

    def unpack(self, flat: tuple[jax.Array | np.ndarray, ...]) -> ConnectorsState:
        """Traceable: the state in ``flat`` (device or host buffers)."""
        leaves = [
            flat[group][offset : offset + size].reshape(shape)
            for (group, offset, size), shape in zip(self.where, self.shapes)
        ]
        return self.treedef.unflatten(leaves)

    def to_host(self, flat: tuple[jax.Array, ...]) -> ConnectorsState:
        """The state in device buffers, as numpy copies (one explicit transfer)."""
        host = tuple(np.asarray(x) for x in jax.device_get(flat))
        return jax.tree.map(np.copy, self.unpack(host))

    def to_device(self, state: ConnectorsState) -> tuple[jax.Array, ...]:
        """Fresh device buffers holding ``state`` (host or device arrays)."""
        values, treedef = jax.tree.flatten(jax.device_get(state))
        shapes = [tuple(np.shape(v)) for v in values]
        if treedef != self.treedef or shapes != self.shapes:
            raise InvalidArgumentError(
                "set_connector_state(state): expected the structure and shapes of "
                f"get_connector_state() ({self.treedef}, shapes {self.shapes}), got "
                f"{treedef}, shapes {shapes}. Start from runner.get_connector_state() and "
                "replace its arrays."
            )
        buffers = [np.zeros(size, g) for size, g in zip(self.sizes, self.groups)]
        for (group, offset, size), value in zip(self.where, values):
            buffers[group][offset : offset + size] = np.ravel(value)
        return tuple(jax.device_put(buffers))

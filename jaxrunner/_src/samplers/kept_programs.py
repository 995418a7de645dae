"""Compiled programs (and XLA's cost estimates) kept per policy: a runner built again
with the same policy (a notebook cell run again, ``from_env``'s trial, ``evaluate``
called again) traces and compiles nothing."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner._src.connectors.pipeline import Connectors
from jaxrunner._src.connectors.state_packing import StatePacking
from jaxrunner._src.core.policy import Policy

_KEPT: weakref.WeakKeyDictionary[Callable, dict[Hashable, tuple[Connectors | None, Any]]] = (
    weakref.WeakKeyDictionary()
)
"""What :func:`kept_for` built, by the policy's ``apply_fn``, then key and connectors."""

T = TypeVar("T")


def kept_for(
    policy: Policy, connectors: Connectors | None, key: Hashable, build: Callable[[], T]
) -> T:
    """``build()``, kept while the policy's ``apply_fn`` lives, for ``key`` (all else the
    result depends on) and ``connectors`` (the same object)."""
    try:
        kept = _KEPT.setdefault(policy.apply_fn, {})
    except TypeError:  # not weakly referenceable: not kept
        return build()
    key = (key, id(connectors))
    hit = kept.get(key)
    if hit is None or hit[0] is not connectors:  # (an id can outlive its object)
        hit = kept[key] = (connectors, build())
    return hit[1]


def avals(tree: Any) -> Hashable:
    """What a compiled program fixes of its argument ``tree``: structure, and each leaf's
    shape, dtype, weak type and placement."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple(
        (
            np.shape(x),
            jnp.result_type(x),
            getattr(x, "weak_type", isinstance(x, (bool, int, float, complex))),
            getattr(x, "sharding", None),
        )
        for x in leaves
    )


def packing_layout(packing: StatePacking | None) -> Hashable:
    """What a program fixes of the connectors state's packing (None: no connectors)."""
    if packing is None:
        return None
    return packing.treedef, tuple(packing.shapes), tuple(packing.dtypes)


def jax_settings() -> tuple[Any, ...]:
    """The JAX settings a trace depends on beyond its arguments."""
    config: Any = jax.config  # (its flags are attributes the type checkers do not see)
    return config.jax_enable_x64, config.jax_default_device, jax.default_backend()

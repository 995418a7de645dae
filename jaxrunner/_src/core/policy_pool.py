"""Many policies in one call: a fixed-size pool of params of one architecture, each agent
acting with the member drawn at its episode start (self-play, leagues)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner._src.arg_checks import check_int
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner.errors import InvalidArgumentError

_DRAW = 0x5EED
"""Folded into a row's key for its member draw (kept apart from its action key)."""


def pool_params(
    members: Sequence[Params], size: int, weights: Sequence[float] | None = None
) -> dict[str, Any]:
    """A pool of ``size`` slots holding ``members`` (params of one structure), drawn
    with ``weights`` (default: uniform over the members); slots past the members hold
    a copy of the first with weight 0."""
    members = list(members)
    if not 1 <= len(members) <= size:
        raise InvalidArgumentError(
            f"pool_params: expected between 1 and size={size} members, got {len(members)}. "
            "The pool's size is fixed (it fixes the compile): drop old members to add new ones."
        )
    if weights is None:
        weights = [1.0] * len(members)
    w = np.asarray(weights, np.float64)
    if w.shape != (len(members),) or not (np.isfinite(w).all() and (w >= 0).all() and w.sum()):
        raise InvalidArgumentError(
            f"pool_params(weights={list(weights)!r}): expected one finite weight >= 0 per "
            f"member ({len(members)}), not all zero."
        )
    structure = jax.tree.structure(members[0])
    for k, member in enumerate(members[1:], 1):
        if jax.tree.structure(member) != structure:
            raise InvalidArgumentError(
                f"pool_params: member {k} has a different params structure from member 0; a "
                "pool holds params of one architecture."
            )
    padded = members + [members[0]] * (size - len(members))
    stacked = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *padded)
    padded_weights = np.zeros(size, np.float32)
    padded_weights[: len(members)] = w
    return {"members": stacked, "weights": jnp.asarray(padded_weights)}


def pooled_policy(policy: Policy, size: int) -> Policy:
    """``policy`` served from a pool of ``size`` params (:func:`pool_params`).

    Each step computes every member on every row in one vmapped call and keeps, per
    row, the output of the row's member: drawn from the pool's ``weights`` at the row's
    episode start with the row's own key (so deterministically), kept in the carry, and
    recorded in ``extras["member"]``. A new pool of the same ``size``
    (``runner.set_params(pool_params(...), policy_id)``) never recompiles.
    """
    size = check_int("pooled_policy", "size", size)
    inner_apply = policy.apply_fn

    def apply_fn(params: Params, obs: Any, carry: Any, keys: jax.Array) -> Any:
        rows = jnp.arange(keys.shape[0])
        draw_keys = jax.vmap(lambda k: jax.random.fold_in(k, _DRAW))(keys)
        logits = jnp.log(params["weights"])
        drawn = jax.vmap(lambda k: jax.random.categorical(k, logits))(draw_keys)
        member = jnp.where(carry["member"] < 0, drawn, carry["member"]).astype(jnp.int32)
        action, extras, inner = jax.vmap(inner_apply, in_axes=(0, None, None, None))(
            params["members"], obs, carry["inner"], keys
        )

        def pick(x: jax.Array) -> jax.Array:
            return x[member, rows]

        extras = {**jax.tree.map(pick, extras), "member": member}
        new_carry = {"member": member, "inner": jax.tree.map(pick, inner)}
        return jax.tree.map(pick, action), extras, new_carry

    return Policy(
        apply_fn=apply_fn,
        initial_carry={"member": jnp.int32(-1), "inner": policy.initial_carry},
    )

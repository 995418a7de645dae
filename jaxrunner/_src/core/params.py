"""The params a runner or an external env takes: like the ones its policy is compiled
for, on device, without NaN."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner._src.core.policy import Params
from jaxrunner.errors import InvalidArgumentError, SpaceMismatchError


def check_params_like(current: Params, new: Params, what: str) -> None:
    """Refuses ``new`` params (given to ``what``) unless they match ``current`` in
    structure, shapes and dtypes: the policy is compiled for those, and must never
    retrace."""
    old = jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), current)
    got = jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), new)
    if jax.tree.structure(old) != jax.tree.structure(got) or old != got:
        raise SpaceMismatchError(
            f"{what}: the new params differ in structure, shape or dtype from the old "
            "ones, for which the policy is compiled. Pass params with the "
            "same pytree structure (e.g. the output of the same Policy.init)."
        )


def refuse_params_by_policy_id(
    new: Params, policy_ids: Collection[str], like: Params, what: str
) -> None:
    """Refuses a dict keyed by policy ids (as runners are built with, and as
    ``EnvRunnerGroup.set_params`` takes) where one policy's params ``like`` are expected."""
    if (
        isinstance(new, Mapping)
        and new
        and new.keys() <= set(policy_ids)
        and not (isinstance(like, Mapping) and new.keys() == like.keys())
    ):
        raise InvalidArgumentError(
            f"{what}: got a dict keyed by policy ids ({sorted(new)}); this takes one "
            "policy's params: call set_params(params[policy_id], policy_id) for each."
        )


def put_params(new: Params, what: str, like: Params | None = None) -> Params:
    """``new`` on device, as ``what`` (e.g. ``"EnvRunner.set_params(params)"``) takes
    them: refused unless they match ``like`` (see :func:`check_params_like`; None: the
    first ones) and hold no NaN."""
    if like is not None:
        check_params_like(like, new, what)
    device = jax.device_put(new)
    floats = [
        (path, x)
        for path, x in jax.tree_util.tree_leaves_with_path(device)
        if jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    leaves = [x for _, x in floats]
    with jax.transfer_guard_device_to_host("allow"):
        if all(d.platform == "cpu" for x in leaves for d in x.devices()):
            nan = [np.isnan(np.asarray(x)).any() for x in leaves]  # views: nothing compiles
        else:  # one flag per leaf, one read: the params stay where they are
            nan = np.asarray(_has_nan(leaves)) if leaves else []
    where = [
        jax.tree_util.keystr(path) or "the array" for (path, _), bad in zip(floats, nan) if bad
    ]
    if where:  # a policy would sample from them silently (NaN logits: action 0)
        raise InvalidArgumentError(
            f"{what}: the params hold NaN in {', '.join(where[:3])}"
            f"{f' (and {len(where) - 3} more leaves)' if len(where) > 3 else ''}; refused, "
            "nothing changed. Pass finite params (jax.config.update('jax_debug_nans', True) "
            "finds the update that made the NaN)."
        )
    return device


@jax.jit
def _has_nan(leaves: list[jax.Array]) -> jax.Array:
    return jnp.stack([jnp.isnan(x).any() for x in leaves])

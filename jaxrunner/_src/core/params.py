"""The params a runner or an external env takes: like the ones its policy is compiled
for, on device, without NaN."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import flax.errors
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner._src.core.policy import Params, Policy, one_row_args
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError, SpaceMismatchError


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


def params_error(
    err: BaseException,
    policies: Mapping[str, Policy],
    params: Mapping[str, Params],
    groups: Any,
    connectors: Mapping[str, Any],
    where: str = "EnvRunner",
    space_name: str = "envs.single_observation_space",
) -> InvalidArgumentError | None:
    """What to raise instead of ``err``, raised while building ``where``'s policy step,
    where the params are to blame; None to raise ``err`` itself. ``connectors``: by
    policy id, those of the policies with some (they change what the policy sees)."""
    # Tracing the policy with params of the wrong structure fails deep in its code.
    wrong_params = isinstance(err, KeyError | TypeError | AttributeError | flax.errors.FlaxError)
    # A tracer turned into a bool or an int is the policy's own code (Python control flow
    # on an array), whatever the params: JAX's error says so.
    if not wrong_params or isinstance(err, InvalidArgumentTypeError | jax.errors.JAXTypeError):
        return None
    for g in groups:  # each group's policy traced abstractly on one row of its params
        policy, seen = policies[g.policy_id], g.observation_space
        init = space_name
        if g.policy_id in connectors:  # what the policy sees: the connectors' output
            seen = connectors[g.policy_id].observation_space(seen)
            init = f"connectors.observation_space({init})"
        try:
            jax.eval_shape(policy.apply_fn, *one_row_args(policy, params[g.policy_id], seen))
        except Exception:
            shape = "" if seen.shape is None else f" of shape {seen.shape}"
            return InvalidArgumentError(
                f"{where}(params=...): the policy could not be applied to these params on "
                f"the observations it sees ({type(seen).__name__}{shape}; "
                f"{type(err).__name__}: {err}). Pass params initialised on those: "
                f"policy.init(jax.random.key(0), {init})."
            )
    err.add_note(
        f"{where}: the policy applies to these params; this came from building "
        "the rest of the step (a pure-JAX env's functions and its env params?)."
    )
    return None

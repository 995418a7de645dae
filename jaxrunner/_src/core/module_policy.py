"""A Policy's functions built from a flax module's forward pass: its output parsed into the
action distribution, sampled or at its mode."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from gymnasium import spaces

from jaxrunner._src.core import distributions
from jaxrunner.errors import SpaceMismatchError

# The function types of a Policy (re-exported by policy.py, which builds on this module).
Params = Any
Carry = Any
ApplyFn = Callable[[Params, Any, Carry, jax.Array], tuple[Any, dict[str, Any], Carry]]
InitFn = Callable[[jax.Array, Any, Carry], Params]
LogProbFn = Callable[[Params, Any, Carry, Any], jax.Array]
EvaluateFn = Callable[[Params, Any, Carry, Any], dict[str, jax.Array]]
DistributionFn = Callable[
    [Params, Any, Carry], tuple[distributions.Distribution, jax.Array | None, Carry]
]


def module_policy_fns(
    call: Callable[..., Any],
    init: Callable[..., Params],
    action_space: spaces.Space,
    deterministic: bool,
    recurrent: bool,
) -> dict[str, Any]:
    """A :class:`~jaxrunner.Policy`'s functions (``apply_fn``, ``init_fn``, ``log_prob_fn``,
    ``evaluate_fn``, ``distribution_fn``) around a module's ``call(module_params, *inputs)
    -> out`` and ``init(key, *inputs) -> module_params``, ``inputs`` being ``(obs,)``, or
    ``(carry, obs)`` (the module returning ``(carry, out)``) where ``recurrent``."""
    head = distributions.head_params(action_space)
    # Fail now, not at the first step, if no distribution fits the space.
    size = distributions.num_outputs(action_space)
    distributions.make_distribution(action_space, {"params": jnp.zeros((1, size))}, head)

    def distribution_fn(
        params: Params, obs: Any, carry: Carry
    ) -> tuple[distributions.Distribution, jax.Array | None, Carry]:
        if recurrent:
            carry, out = call(params["module"], carry, obs)
        else:
            out = call(params["module"], obs)
            carry = None
        out = parse_module_output(out)
        dist = distributions.make_distribution(action_space, out, params)
        return dist, out.get("value"), carry

    def init_fn(key: jax.Array, obs: Any, carry: Carry) -> Params:
        return {"module": init(key, *((carry, obs) if recurrent else (obs,))), **head}

    def evaluate_fn(params: Params, obs: Any, carry: Carry, action: Any) -> dict[str, Any]:
        dist, value, _ = distribution_fn(params, obs, carry)
        result = {"log_prob": dist.log_prob(action), "entropy": dist.entropy()}
        if value is not None:
            result["value"] = value
        return result

    def log_prob_fn(params: Params, obs: Any, carry: Carry, action: Any) -> jax.Array:
        return evaluate_fn(params, obs, carry, action)["log_prob"]  # XLA drops the rest

    return {
        "apply_fn": acting_fn(distribution_fn, deterministic),
        "init_fn": init_fn,
        "log_prob_fn": log_prob_fn,
        "evaluate_fn": evaluate_fn,
        "distribution_fn": distribution_fn,
    }


def acting_fn(distribution_fn: DistributionFn, deterministic: bool) -> ApplyFn:
    """An ``apply_fn`` that samples the distribution, or acts with its mode (the keys
    then unused); ``extras``: ``log_prob`` and ``value`` if any."""

    def apply_fn(params: Params, obs: Any, carry: Carry, keys: jax.Array):
        dist, value, carry = distribution_fn(params, obs, carry)
        action = dist.mode() if deterministic else dist.sample(keys)
        extras = {"log_prob": dist.log_prob(action)}
        if value is not None:
            extras["value"] = value
        return action, extras, carry

    return apply_fn


def parse_module_output(out: Any) -> dict[str, jax.Array]:
    """Normalises a module output to ``{"params", ["log_std"], ["value"]}``."""
    if isinstance(out, dict):
        keys = {"logits", "mean"} & set(out)
        unknown = set(out) - {"logits", "mean", "log_std", "value"}
        if len(keys) != 1 or unknown:
            raise SpaceMismatchError(
                f"the policy module returned a dict with keys {sorted(out)}; expected exactly "
                "one of 'logits'/'mean', plus optionally 'log_std' and 'value'."
            )
        parsed = {"params": out[keys.pop()]}
        parsed.update({k: out[k] for k in ("log_std", "value") if k in out})
    elif isinstance(out, tuple):
        if len(out) != 2:
            raise SpaceMismatchError(
                f"the policy module returned a tuple of {len(out)} items; expected "
                "(logits_or_mean, value). Return a dict for anything richer."
            )
        parsed = {"params": out[0], "value": out[1]}
    else:
        parsed = {"params": out}
    if "value" in parsed:
        value = parsed["value"]
        if value.ndim == 2 and value.shape[1] == 1:
            value = value[:, 0]
        if value.ndim != 1:
            raise SpaceMismatchError(
                f"the policy module's value has shape {value.shape}; expected [batch] or "
                "[batch, 1]."
            )
        parsed["value"] = value
    return parsed

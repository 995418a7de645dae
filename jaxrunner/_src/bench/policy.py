"""The benchmark's policies (``jaxrunner.models``: a 64-64 tanh MLP by default, the
workloads' NatureCNN and Gaussian MLP), and the jitted step a user writes around one
by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from jaxrunner._src.core.policy import Policy
from jaxrunner.models import MLP as MLP
from jaxrunner.models import mlp_policy as mlp_policy


def hand_act(policy: Policy, num_envs: int) -> Callable[[Any, Any, jax.Array], Any]:
    """The jitted policy step a user would write: one key split per step, no per-env
    keys; ``(params, obs, key) -> (action, extras, key)``, ``extras["log_prob"]`` the
    log-probability of each sampled action."""

    @jax.jit
    def act(params: Any, obs: Any, key: jax.Array) -> tuple[Any, Any, jax.Array]:
        key, sub = jax.random.split(key)
        action, extras, _ = policy.apply_fn(params, obs, None, jax.random.split(sub, num_envs))
        return action, extras, key

    return act

"""The benchmark's policy: a 64-64 tanh MLP with stochastic actions, and the jitted
step a user writes around it by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import gymnasium
import jax
import numpy as np

from jaxrunner.policy import Policy


class MLP(nn.Module):
    """The benchmark's policy network: a tanh MLP emitting distribution parameters."""

    num_outputs: int
    hidden: tuple[int, ...] = (64, 64)

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs.reshape(obs.shape[0], -1).astype(np.float32)
        for width in self.hidden:
            x = nn.tanh(nn.Dense(width)(x))
        return nn.Dense(self.num_outputs)(x)


def mlp_policy(action_space: gymnasium.Space, hidden: tuple[int, ...] = (64, 64)) -> Policy:
    """A stochastic MLP policy for a Discrete, MultiDiscrete, MultiBinary or Box space."""
    if isinstance(action_space, gymnasium.spaces.Discrete):
        outputs = int(action_space.n)
    elif isinstance(action_space, gymnasium.spaces.MultiDiscrete):
        outputs = int(np.sum(action_space.nvec))
    else:
        outputs = int(np.prod(action_space.shape))
    return Policy.from_linen(MLP(outputs, hidden), action_space)


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

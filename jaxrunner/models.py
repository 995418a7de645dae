"""Ready-made policies (``jr.models``): the networks the benchmarks and examples use, each
a :class:`~jaxrunner.Policy` (``Policy.from_linen``)."""

from __future__ import annotations

import flax.linen as nn
import gymnasium
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner._src.arg_checks import is_int
from jaxrunner._src.core.distributions import num_outputs
from jaxrunner._src.core.policy import Policy
from jaxrunner.errors import InvalidArgumentError, SpaceMismatchError


class MLP(nn.Module):
    """A tanh MLP emitting distribution parameters (no value head)."""

    num_outputs: int
    hidden: tuple[int, ...] = (64, 64)

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        if not hasattr(obs, "reshape"):
            raise SpaceMismatchError(
                f"mlp_policy: expected array observations (a Box, Discrete, MultiBinary or "
                f"MultiDiscrete space), got a {type(obs).__name__}. Flatten Dict and Tuple "
                "observations in each sub-env's factory (gymnasium.wrappers."
                "FlattenObservation), or write a module that takes them."
            )
        x = obs.reshape(obs.shape[0], -1).astype(np.float32)
        for width in self.hidden:
            x = nn.tanh(nn.Dense(width)(x))
        return nn.Dense(self.num_outputs)(x)


def mlp_policy(action_space: gymnasium.Space, hidden: tuple[int, ...] = (64, 64)) -> Policy:
    """A stochastic MLP policy for a Discrete, MultiDiscrete, MultiBinary or Box space."""
    if not (isinstance(hidden, tuple | list) and all(is_int(h) and h >= 1 for h in hidden)):
        raise InvalidArgumentError(
            f"mlp_policy(hidden={hidden!r}): expected a tuple of layer widths >= 1, e.g. (64, 64)."
        )
    return Policy.from_linen(MLP(num_outputs(action_space), tuple(hidden)), action_space)


class NatureCNN(nn.Module):
    """The DQN/PPO Atari network: Conv 32 8x8/4, 64 4x4/2, 64 3x3/1, Dense 512 (ReLU),
    then policy logits and a value, on uint8 images scaled to [0, 1]."""

    num_actions: int
    channels_first: bool = False
    """Observations are ``[B, C, H, W]`` (``FrameStackObservation``'s, EnvPool's), moved
    to ``[B, H, W, C]`` for the convolutions."""

    @nn.compact
    def __call__(self, obs: jax.Array) -> dict[str, jax.Array]:
        x = obs.astype(jnp.float32) / 255.0
        if self.channels_first:
            x = jnp.transpose(x, (0, 2, 3, 1))
        x = nn.relu(nn.Conv(32, (8, 8), (4, 4))(x))
        x = nn.relu(nn.Conv(64, (4, 4), (2, 2))(x))
        x = nn.relu(nn.Conv(64, (3, 3), (1, 1))(x))
        x = nn.relu(nn.Dense(512)(x.reshape(x.shape[0], -1)))
        return {"logits": nn.Dense(self.num_actions)(x), "value": nn.Dense(1)(x)[..., 0]}


def nature_cnn_policy(observation_space: gymnasium.Space, action_space: gymnasium.Space) -> Policy:
    """NatureCNN with categorical actions for image stacks: ``observation_space`` a
    Box of shape ``(H, W, C)`` or ``(C, H, W)`` (channels first where the first axis
    is the smallest, as ``FrameStackObservation(AtariPreprocessing(env), 4)``'s
    ``(4, 84, 84)``), ``action_space`` Discrete.

    Raises:
        SpaceMismatchError: not a 3-axis image Box, or not Discrete actions.
    """
    shape = tuple(getattr(observation_space, "shape", None) or ())
    if not isinstance(observation_space, gymnasium.spaces.Box) or len(shape) != 3:
        raise SpaceMismatchError(
            f"nature_cnn_policy(observation_space={observation_space}): expected a Box of "
            "images, shape (H, W, C) or (C, H, W), e.g. (84, 84, 4). Use mlp_policy for "
            "vector observations."
        )
    if not isinstance(action_space, gymnasium.spaces.Discrete):
        raise SpaceMismatchError(
            f"nature_cnn_policy(action_space={action_space}): expected a Discrete space "
            "(categorical actions)."
        )
    channels_first = shape[0] < shape[-1]
    return Policy.from_linen(NatureCNN(int(action_space.n), channels_first), action_space)


class GaussianMLP(nn.Module):
    """A tanh MLP emitting a Gaussian's mean (one per action dimension) and a value;
    the log-std is the policy's learned state-independent one."""

    action_dim: int
    hidden: tuple[int, ...] = (256, 256)

    @nn.compact
    def __call__(self, obs: jax.Array) -> dict[str, jax.Array]:
        x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
        for width in self.hidden:
            x = nn.tanh(nn.Dense(width)(x))
        return {"mean": nn.Dense(self.action_dim)(x), "value": nn.Dense(1)(x)[..., 0]}


def gaussian_mlp_policy(
    action_space: gymnasium.Space, hidden: tuple[int, ...] = (256, 256)
) -> Policy:
    """A diagonal-Gaussian MLP policy (256-256 tanh by default) for a Box action space.

    Raises:
        SpaceMismatchError: ``action_space`` is not a Box.
    """
    if not isinstance(action_space, gymnasium.spaces.Box):
        raise SpaceMismatchError(
            f"gaussian_mlp_policy(action_space={action_space}): expected a Box space; use "
            "mlp_policy for discrete actions."
        )
    return Policy.from_linen(GaussianMLP(int(np.prod(action_space.shape)), hidden), action_space)


__all__ = [
    "GaussianMLP",
    "MLP",
    "NatureCNN",
    "gaussian_mlp_policy",
    "mlp_policy",
    "nature_cnn_policy",
]

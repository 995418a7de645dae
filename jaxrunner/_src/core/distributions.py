"""Action distributions chosen by the action space, batched over envs: ``sample`` draws each
env's action from that env's own key, so it never depends on which envs share the batch."""

from __future__ import annotations

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner.errors import SpaceMismatchError


def _sum_event(x: jax.Array) -> jax.Array:
    """Sums every axis but the batch axis."""
    return x.reshape(x.shape[0], -1).sum(axis=1)


class Categorical(flax.struct.PyTreeNode):
    logits: jax.Array  # [B, n]
    start: int = flax.struct.field(pytree_node=False, default=0)

    def sample(self, keys: jax.Array) -> jax.Array:
        return jax.vmap(jax.random.categorical)(keys, self.logits) + self.start

    def mode(self) -> jax.Array:
        return jnp.argmax(self.logits, axis=-1) + self.start

    def log_prob(self, action: jax.Array) -> jax.Array:
        log_p = jax.nn.log_softmax(self.logits, axis=-1)
        index = (action - self.start).astype(jnp.int32)[:, None]
        return jnp.take_along_axis(log_p, index, axis=-1)[:, 0]

    def entropy(self) -> jax.Array:
        log_p = jax.nn.log_softmax(self.logits, axis=-1)
        p = jnp.exp(log_p)
        # Masked actions (-inf logits) add nothing; 0 * -inf would be NaN, and so its grad.
        return -(p * jnp.where(p > 0, log_p, 0.0)).sum(axis=-1)


class MultiCategorical(flax.struct.PyTreeNode):
    """Independent categoricals; logits of all components concatenated on the last axis."""

    logits: jax.Array  # [B, sum(nvec)]
    nvec: tuple[int, ...] = flax.struct.field(pytree_node=False)
    start: tuple[int, ...] = flax.struct.field(pytree_node=False)
    shape: tuple[int, ...] = flax.struct.field(pytree_node=False)
    # The space's dtype where it is not the default int64 (uint8, int32, ...): the
    # categoricals' JAX ints would not cast to it safely, and the runner refuses those.
    action_dtype: Any = flax.struct.field(pytree_node=False, default=None)

    def _parts(self) -> list[Categorical]:
        splits = np.cumsum(self.nvec)[:-1].tolist()
        return [
            Categorical(logits, start)
            for logits, start in zip(jnp.split(self.logits, splits, axis=-1), self.start)
        ]

    def _stack(self, parts: list[jax.Array]) -> jax.Array:
        stacked = jnp.stack(parts, axis=-1).reshape(-1, *self.shape)
        if self.action_dtype is None:
            return stacked
        return stacked.astype(jax.dtypes.canonicalize_dtype(self.action_dtype))

    def sample(self, keys: jax.Array) -> jax.Array:
        sub = jax.vmap(lambda k: jax.random.split(k, len(self.nvec)))(keys)
        return self._stack([part.sample(sub[:, j]) for j, part in enumerate(self._parts())])

    def mode(self) -> jax.Array:
        return self._stack([part.mode() for part in self._parts()])

    def log_prob(self, action: jax.Array) -> jax.Array:
        flat = action.reshape(action.shape[0], -1)
        return jnp.asarray(sum(part.log_prob(flat[:, j]) for j, part in enumerate(self._parts())))

    def entropy(self) -> jax.Array:
        return jnp.asarray(sum(part.entropy() for part in self._parts()))


class Bernoulli(flax.struct.PyTreeNode):
    logits: jax.Array  # [B, *shape]

    def sample(self, keys: jax.Array) -> jax.Array:
        draw = jax.vmap(lambda k, logit: jax.random.bernoulli(k, jax.nn.sigmoid(logit)))
        # int8: gymnasium's MultiBinary dtype, so actions store without a cast.
        return draw(keys, self.logits).astype(jnp.int8)

    def mode(self) -> jax.Array:
        return (self.logits > 0).astype(jnp.int8)

    def _log_p(self, a: jax.Array) -> jax.Array:
        """``log p(a)`` per dimension, for ``a`` in [0, 1]."""
        return a * jax.nn.log_sigmoid(self.logits) + (1 - a) * jax.nn.log_sigmoid(-self.logits)

    def log_prob(self, action: jax.Array) -> jax.Array:
        return _sum_event(self._log_p(action.astype(self.logits.dtype)))

    def entropy(self) -> jax.Array:
        return _sum_event(-self._log_p(jax.nn.sigmoid(self.logits)))


class DiagGaussian(flax.struct.PyTreeNode):
    mean: jax.Array  # [B, *shape]
    log_std: jax.Array  # broadcastable to mean
    # Actions rounded to a Box narrower than the mean (float16): what the env gets is
    # what is recorded, and log_prob is taken of it.
    action_dtype: Any = flax.struct.field(pytree_node=False, default=None)

    def sample(self, keys: jax.Array) -> jax.Array:
        noise = jax.vmap(lambda k: jax.random.normal(k, self.mean.shape[1:], self.mean.dtype))(keys)
        return self._rounded(self.mean + jnp.exp(self.log_std) * noise)

    def mode(self) -> jax.Array:
        return self._rounded(self.mean)

    def _rounded(self, action: jax.Array) -> jax.Array:
        return action if self.action_dtype is None else action.astype(self.action_dtype)

    def log_prob(self, action: jax.Array) -> jax.Array:
        log_std = jnp.broadcast_to(self.log_std, self.mean.shape)
        z = (action - self.mean) * jnp.exp(-log_std)
        return _sum_event(-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi))

    def entropy(self) -> jax.Array:
        log_std = jnp.broadcast_to(self.log_std, self.mean.shape)
        return _sum_event(log_std + 0.5 * math.log(2 * math.pi * math.e))


Distribution = Categorical | MultiCategorical | Bernoulli | DiagGaussian


def num_outputs(action_space: spaces.Space) -> int:
    """How many features a module outputs for ``action_space``'s distribution (logits, or
    a Box's means); 1 for a space without a shape (which no distribution takes)."""
    if isinstance(action_space, spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, spaces.MultiDiscrete):
        return int(np.sum(action_space.nvec))
    return int(np.prod(action_space.shape or (1,)))


def head_params(action_space: spaces.Space) -> dict[str, Any]:
    """Learned parameters the distribution adds to the module's (Box: a log-std)."""
    if isinstance(action_space, spaces.Box):
        return {"log_std": jnp.zeros(action_space.shape, jnp.float32)}
    return {}


def _reshaped(x: jax.Array, shape: tuple[int, ...], what: str) -> jax.Array:
    size = int(np.prod(shape))
    got = int(np.prod(x.shape[1:])) if x.ndim >= 1 else 0
    if got != size:
        # A vector env's batched action space asks for num_envs times the features.
        batched = (
            f" The action space looks batched ({size // got} copies of {got} features): "
            "pass the vector env's envs.single_action_space, not envs.action_space."
            if got and size % got == 0 and size > got
            else ""
        )
        raise SpaceMismatchError(
            f"the policy module's {what} output has shape {x.shape}; expected [batch, "
            f"{size}] or [batch, *{shape}] for this action space. Make the module's last "
            f"layer output {size} features.{batched}"
        )
    return x.reshape(x.shape[0], *shape)


def make_distribution(
    action_space: spaces.Space, out: dict[str, jax.Array], head: dict[str, Any]
) -> Distribution:
    """Builds the distribution for ``action_space`` from the module's outputs
    (``out["params"]``, optional ``out["log_std"]``) and the head's parameters."""
    params = out["params"]
    if isinstance(action_space, spaces.Discrete):
        logits = _reshaped(params, (int(action_space.n),), "logits")
        return Categorical(logits, int(action_space.start))
    if isinstance(action_space, spaces.MultiDiscrete):
        nvec = tuple(int(n) for n in np.ravel(action_space.nvec))
        starts = tuple(int(s) for s in np.ravel(action_space.start))
        logits = _reshaped(params, (sum(nvec),), "logits")
        dtype = np.dtype(action_space.dtype)
        action_dtype = None if dtype == np.int64 else dtype
        return MultiCategorical(logits, nvec, starts, tuple(action_space.shape), action_dtype)
    if isinstance(action_space, spaces.MultiBinary):
        return Bernoulli(_reshaped(params, tuple(action_space.shape), "logits"))
    if isinstance(action_space, spaces.Box):
        shape = tuple(action_space.shape)
        mean = _reshaped(params, shape, "mean")
        if "log_std" in out:
            log_std = _reshaped(out["log_std"], shape, "log_std")
        else:
            log_std = head["log_std"]
        dtype = np.dtype(action_space.dtype)
        narrow = np.issubdtype(dtype, np.floating) and dtype.itemsize < mean.dtype.itemsize
        return DiagGaussian(mean, log_std, dtype if narrow else None)
    raise SpaceMismatchError(
        f"Policy.from_linen/from_nnx: no built-in distribution for action space "
        f"{action_space}; supported are Discrete, MultiDiscrete, MultiBinary and Box. For "
        "others, write a jaxrunner.Policy with your own apply_fn."
    )

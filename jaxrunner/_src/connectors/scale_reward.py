"""ScaleReward: rewards divided by a running std of the discounted return."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxrunner._src.arg_checks import check_number
from jaxrunner._src.connectors.base import ConnectorState, RewardConnector
from jaxrunner._src.connectors.checks import check_statistics_args
from jaxrunner._src.connectors.moments import Moments, RunningMoments


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScaleReward(RewardConnector):
    """Rewards divided by a running estimate of the std of the discounted return, as
    gymnasium's ``NormalizeReward``: per env (per agent slot in a group) ``ret = gamma *
    ret + reward`` at each valid slot, restarted after every episode end (truncation
    included, as baselines' ``VecNormalize``); the statistics take in each step's returns
    of every valid slot, then ``reward / std`` (0 at invalid slots), with ``std`` as
    :class:`NormalizeObservation`'s. The scaled rewards go to ``extras["scaled_reward"]``.
    See docs/connectors.md for how it differs from gymnasium's."""

    gamma: float = 0.99
    """Discount of the return whose std scales the rewards, in [0, 1]."""
    epsilon: float = 1e-8
    """Added to the variance (>= 0)."""
    clip: float | None = None
    """Bound of the scaled rewards (> 0; None: no clipping)."""
    min_std: float = 1e-6
    """Smallest std divided by (> 0)."""
    max_std: float = 1e6
    """Largest std divided by (>= min_std)."""
    count_dtype: str = "float32"
    """Dtype of the statistics' count (see :class:`NormalizeObservation`)."""
    frozen: bool = False
    """Start with the statistics frozen; :func:`freeze`/:func:`unfreeze` at run time."""

    def __post_init__(self) -> None:
        who = "ScaleReward"
        check_number(who, "gamma", self.gamma, low=0.0, high=1.0)
        check_statistics_args(who, self)

    @classmethod
    def cleanrl(cls, gamma: float = 0.99) -> ScaleReward:
        """CleanRL's reward recipe (``NormalizeReward(gamma)`` then rewards clipped to
        +-10): ``ScaleReward(gamma=gamma, clip=10.0)``."""
        return cls(gamma=gamma, clip=10.0)

    def init(self, num_envs: int) -> ConnectorState:
        return ConnectorState(
            per_env=jnp.zeros(num_envs, jnp.float32),
            shared=RunningMoments.zeros((), self.count_dtype, self.frozen),
        )

    def __call__(
        self,
        state: ConnectorState,
        reward: jax.Array,
        terminated: jax.Array,
        truncated: jax.Array,
        valid: jax.Array,
    ) -> tuple[jax.Array, ConnectorState]:
        def step(carry: tuple[jax.Array, RunningMoments], xs: tuple) -> tuple[tuple, jax.Array]:
            ret, shared = carry
            r, term, trunc, ok = xs
            r = jnp.where(ok, r.astype(jnp.float32), 0.0)
            ret = jnp.where(ok, self.gamma * ret + r, ret)
            shared = shared.add(Moments.of(ret, ok, self.count_dtype))
            scale = shared.stats.inverse_std(self.epsilon, self.min_std, self.max_std)
            scaled = r * scale
            if self.clip is not None:
                scaled = jnp.clip(scaled, -self.clip, self.clip)
            ret = jnp.where(term | trunc, 0.0, ret)
            return (ret, shared), scaled

        (ret, shared), scaled = jax.lax.scan(
            step, (state.per_env, state.shared), (reward, terminated, truncated, valid)
        )
        return scaled, ConnectorState(per_env=ret, shared=shared)

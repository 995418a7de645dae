"""GAE over a group's ``[T, B, A_g]`` arrays, each agent's transitions chained even
where they are not in consecutive slots (turn-based envs)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrunner._src.core.multi_agent_trajectory import GroupTrajectory
from jaxrunner._src.core.returns import GAE, gae


def group_gae(
    group: GroupTrajectory,
    *,
    next_value: Any,
    value: Any | None = None,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> GAE:
    """:func:`jaxrunner.gae` over each agent's own sequence of transitions.

    ``jr.gae`` on a group's arrays as they are treats a slot with ``valid=False`` as a
    cut (the transition before it is bootstrapped like a truncation). That is exact for
    parallel envs, where an agent's transitions are consecutive slots; in a turn-based
    env an agent's transitions are separated by the other agents' turns. This moves
    each agent's valid slots together (a stable sort over time), runs ``jr.gae``, and
    puts the results back: an agent's transition ``k`` is chained to its transition
    ``k + 1`` across the others' turns. Jittable.

    Args:
        group: a :class:`~jaxrunner.multi_agent.GroupTrajectory`.
        next_value: ``V(next_obs)``, ``[T, B, A_g]``.
        value: ``V(obs)``, ``[T, B, A_g]`` (default: ``group.extras["value"]``).
        gamma, lam: as for :func:`jaxrunner.gae`.

    Returns:
        ``GAE(advantages, returns)``, ``[T, B, A_g]``, zero where ``valid`` is False.
    """
    if value is None:
        value = group.extras["value"]
    valid = jnp.asarray(group.valid)
    order = jnp.argsort(~valid, axis=0, stable=True)  # valid slots first, in time order

    def gather(x: Any) -> jax.Array:
        return jnp.take_along_axis(jnp.asarray(x), order, axis=0)

    out = gae(
        reward=gather(group.reward),
        terminated=gather(group.terminated),
        truncated=gather(group.truncated),
        valid=gather(valid),
        value=gather(value),
        next_value=gather(next_value),
        gamma=gamma,
        lam=lam,
    )

    def scatter(x: jax.Array) -> jax.Array:
        rest = tuple(jnp.indices(order.shape)[1:])
        return jnp.zeros_like(x).at[(order, *rest)].set(x)

    return GAE(scatter(out.advantages), scatter(out.returns))

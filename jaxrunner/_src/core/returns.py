"""Discounted returns and GAE over ``[T, ...]`` arrays with a validity mask (a ``[T, B]``
Trajectory, a ``[T, B, A_g]`` group), correct at episode boundaries: zero future after a
termination, ``next_value`` where an episode is cut, never chained across episodes."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrunner._src.arg_checks import check_bool
from jaxrunner._src.core.multi_agent_trajectory import GroupTrajectory
from jaxrunner._src.core.trajectory import Trajectory
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

ArrayLike = Any


class GAE(NamedTuple):
    """The output of :func:`gae`.

    Attributes:
        advantages: ``A[t]``, zero where ``valid`` is false.
        returns: ``advantages + value``, the value-function target (TD(lambda)
            return), zero where ``valid`` is false.
    """

    advantages: jax.Array
    returns: jax.Array


def gae(
    trajectory: Trajectory | GroupTrajectory | None = None,
    *,
    next_value: ArrayLike,
    value: ArrayLike | None = None,
    reward: ArrayLike | None = None,
    terminated: ArrayLike | None = None,
    truncated: ArrayLike | None = None,
    valid: ArrayLike | None = None,
    skip_invalid: bool | None = None,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> GAE:
    """Generalized advantage estimation (Schulman et al. 2016), boundary-correct.

    With ``c[t] = 1 - terminated[t]`` and ``k[t]`` true while the episode goes on
    after step ``t`` inside the batch (not terminated, not truncated, ``t < T - 1``
    and step ``t + 1`` valid)::

        delta[t] = reward[t] + gamma * c[t] * next_value[t] - value[t]
        A[t]     = delta[t] + gamma * lam * k[t] * A[t + 1]

    Time is axis 0; every other axis is a batch axis (``[T, B]``, or ``[T, B, A_g]``
    for a group's agents).

    Args:
        trajectory: a :class:`~jaxrunner.Trajectory` or a
            :class:`~jaxrunner.multi_agent.GroupTrajectory` (``traj.groups[pid]``);
            supplies ``reward``, ``terminated``, ``truncated``, ``value``
            (``extras["value"]``) and ``valid`` unless given explicitly.
        next_value: ``V(next_obs)``, of the reward's shape: the value of the
            observation that followed each step (the final observation where an
            episode ended); ``trajectory.next_value(value, value_fn)`` computes it
            from ``value``, calling ``value_fn`` only on a compact trajectory's stored
            rows.
        value: ``V(obs)``, of the reward's shape.
        reward, terminated, truncated: ``[T, ...]``.
        valid: optional boolean, of the reward's shape; false marks a slot holding
            no transition. Default: every slot valid.
        skip_invalid: how a slot with ``valid`` false is read. False: it cuts the
            episode, and the step before it is bootstrapped as at a truncation (a
            Trajectory's failed step or reset slot). True: it is skipped, and each
            column's valid slots are chained across it (a group's slots where the agent
            waited for the other agents' turns), unless the next valid slot starts an
            agent episode (a group's ``agent_step`` 0: a failed env step cut the one
            before). Default: True for a group, else False.
        gamma: discount factor.
        lam: GAE's lambda (1 gives discounted returns minus ``value``, 0 gives TD(0)).

    Returns:
        ``GAE(advantages, returns)``, arrays of the inputs' shape.
    """
    fields = (reward, terminated, truncated, valid, value, next_value)
    return _run("gae", trajectory, fields, skip_invalid, gamma, lam)


group_gae = gae
"""The former name of :func:`gae` on a group (``gae(traj.groups[pid], ...)`` chains each
agent's transitions), kept as an alias."""


def discounted_returns(
    trajectory: Trajectory | GroupTrajectory | None = None,
    *,
    next_value: ArrayLike,
    reward: ArrayLike | None = None,
    terminated: ArrayLike | None = None,
    truncated: ArrayLike | None = None,
    valid: ArrayLike | None = None,
    skip_invalid: bool | None = None,
    gamma: float = 0.99,
) -> jax.Array:
    """Discounted reward-to-go, bootstrapped where an episode was cut::

        G[t] = reward[t] + gamma * (k[t] * G[t + 1] + (1 - k[t]) * c[t] * next_value[t])

    with ``c`` and ``k`` as in :func:`gae`: after a termination the future is zero,
    after a truncation (or the batch's last step, or before an invalid slot) it is
    ``next_value[t]``, and no episode's rewards leak into another's.

    Args:
        trajectory, reward, terminated, truncated, valid, skip_invalid: as in
            :func:`gae`.
        next_value: ``V(next_obs)``, of the reward's shape (or a scalar such as
            ``0.0`` when no episode is cut, e.g. complete episodes only).
        gamma: discount factor.

    Returns:
        ``G``, of the inputs' shape, zero where ``valid`` is false.
    """
    fields = (reward, terminated, truncated, valid, 0.0, next_value)
    return _run("discounted_returns", trajectory, fields, skip_invalid, gamma, 1.0)


def _run(fn: str, trajectory: Any, fields: tuple, skip_invalid: Any, gamma: Any, lam: Any) -> Any:
    """``fn`` (``gae`` or ``discounted_returns``) of ``fields`` (``_FIELDS`` order)."""
    inputs = _gather(fn, trajectory, dict(zip(_FIELDS, fields)))
    _check_unit(fn, "gamma", gamma)
    if fn == "gae":
        _check_unit(fn, "lam", lam)
    if skip_invalid is None:  # a group's invalid slots are turns
        skip = isinstance(trajectory, GroupTrajectory)
    else:
        skip = check_bool(fn, "skip_invalid", skip_invalid)
    starts = None  # a group's agent episodes start at agent_step 0
    if skip and isinstance(trajectory, GroupTrajectory) and trajectory.agent_step is not None:
        starts = jnp.asarray(trajectory.agent_step) == 0
    return _compute(inputs, starts, gamma, lam, kind=fn, skip=skip)


# One compiled program per shape (eager, _over_valid_slots would compile a dozen).
@functools.partial(jax.jit, static_argnames=("kind", "skip"))
def _compute(
    arrays: tuple[jax.Array, ...],
    starts: jax.Array | None,
    gamma: jax.Array,
    lam: jax.Array,
    *,
    kind: str,
    skip: bool,
) -> Any:
    """``gae`` or ``discounted_returns`` (``kind``) of ``arrays`` (``_FIELDS``)."""

    def run(*arrays: jax.Array) -> Any:
        if kind == "discounted_returns":  # GAE with lam 1 and value 0, next_value where cut
            *rest, next_value = arrays
            cut_value = jnp.where(_episode_goes_on(*arrays[1:4]), 0.0, next_value)
            return _gae_scan((*rest, cut_value), gamma, lam)
        advantages = _gae_scan(arrays, gamma, lam)
        valid, value = arrays[_FIELDS.index("valid")], arrays[_FIELDS.index("value")]
        return GAE(advantages, jnp.where(valid, advantages + value, 0.0))

    return _over_valid_slots(run, arrays, skip, starts)


def _over_valid_slots(
    run: Any, inputs: tuple[jax.Array, ...], skip: bool, starts: jax.Array | None = None
) -> Any:
    """``run(*inputs)``; with ``skip``, on each column's valid slots moved to its front
    (a stable sort over time), the outputs put back where their inputs were. Where the
    next valid slot ``starts`` an episode, a slot ends its own (seen truncated): a failed
    env step cut it, unflagged, in a gap the skip would close."""
    if not skip:
        return run(*inputs)
    valid = inputs[_FIELDS.index("valid")]
    order = jnp.argsort(~valid, axis=0, stable=True)  # valid slots first, in time order
    moved = [jnp.take_along_axis(x, order, axis=0) for x in inputs]
    if starts is not None:
        later = jnp.take_along_axis(starts & valid, order, axis=0)[1:]
        cut = jnp.concatenate([later, jnp.zeros_like(starts[:1])], axis=0)
        moved[_FIELDS.index("truncated")] = moved[_FIELDS.index("truncated")] | cut
    out = run(*moved)
    rest = tuple(jnp.indices(order.shape)[1:])
    return jax.tree.map(lambda x: jnp.zeros_like(x).at[(order, *rest)].set(x), out)


def _episode_goes_on(terminated: jax.Array, truncated: jax.Array, valid: jax.Array) -> jax.Array:
    """``k[t]``: step ``t + 1`` continues step ``t``'s episode (false at ``T - 1``)."""
    next_valid = jnp.concatenate([valid[1:], jnp.zeros_like(valid[:1])], axis=0)
    return valid & next_valid & ~terminated & ~truncated


def _gae_scan(arrays: tuple[jax.Array, ...], gamma: jax.Array, lam: jax.Array) -> jax.Array:
    """The advantages of ``arrays`` (in ``_FIELDS`` order)."""
    reward, terminated, truncated, valid, value, next_value = arrays
    dtype = jnp.result_type(reward, value, next_value)  # a float64 rate (x64) keeps float32
    gamma, lam = jnp.asarray(gamma, dtype), jnp.asarray(lam, dtype)
    goes_on = _episode_goes_on(terminated, truncated, valid)
    delta = reward + gamma * jnp.where(terminated, 0.0, next_value) - value
    delta = jnp.where(valid, delta, 0.0)

    def step(later: jax.Array, xs: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        delta_t, goes_on_t = xs
        advantage = delta_t + gamma * lam * jnp.where(goes_on_t, later, 0.0)
        return advantage, advantage

    _, advantages = jax.lax.scan(step, jnp.zeros_like(delta[0]), (delta, goes_on), reverse=True)
    return advantages


_FIELDS = ("reward", "terminated", "truncated", "valid", "value", "next_value")


def _gather(
    fn: str, trajectory: Trajectory | GroupTrajectory | None, given: dict[str, ArrayLike | None]
) -> tuple[jax.Array, ...]:
    """The inputs in ``_FIELDS`` order, missing ones from ``trajectory``, checked."""
    if trajectory is not None and not isinstance(trajectory, (Trajectory, GroupTrajectory)):
        raise InvalidArgumentTypeError(
            f"{fn}(trajectory=...): expected a jaxrunner.Trajectory or a group of a "
            "MultiAgentTrajectory (traj.groups[policy_id]), or None with the arrays passed "
            f"by keyword; got {type(trajectory).__name__}."
        )
    if trajectory is not None:
        from_traj = {
            "reward": trajectory.reward,
            "terminated": trajectory.terminated,
            "truncated": trajectory.truncated,
            "valid": trajectory.valid,
            "value": trajectory.extras.get("value"),
        }
        given = {k: from_traj.get(k) if v is None else v for k, v in given.items()}
    for name in ("reward", "terminated", "truncated", "value", "next_value"):
        if given[name] is None:
            hint = (
                "the trajectory's policy has no value head (extras['value']); pass value=V(obs)"
                if name == "value" and trajectory is not None
                else f"pass {name}=... or a Trajectory"
            )
            raise InvalidArgumentError(f"{fn}(): no {name} given; {hint}.")
    reward = jnp.asarray(given["reward"])
    if reward.ndim < 1 or reward.shape[0] < 1:
        raise InvalidArgumentError(
            f"{fn}(reward=...): expected a [T, ...] array with T >= 1 (time on axis 0), got "
            f"shape {reward.shape}."
        )
    if not jnp.issubdtype(reward.dtype, jnp.floating):
        reward = reward.astype(jnp.result_type(float))
    shape = reward.shape
    out: list[jax.Array] = []
    for name in _FIELDS:
        raw = given[name]
        if name == "valid" and raw is None:
            out.append(jnp.ones(shape, jnp.bool_))
            continue
        array = jnp.asarray(raw)
        if name in ("value", "next_value") and array.ndim == 0:
            array = jnp.broadcast_to(array, shape)
        if array.shape != shape:
            # A critic's Dense(1) head gives [T, B, 1]: name the squeeze.
            squeeze = (
                f" Drop the trailing axis of size 1: pass {name}={name}[..., 0]."
                if array.shape == (*shape, 1)
                else ""
            )
            raise InvalidArgumentError(
                f"{fn}({name}=...): expected shape {shape} (the reward's), got "
                f"{array.shape}.{squeeze} Every input is time-major ([T, B], or [T, B, A_g] "
                "for a group); compute "
                "next_value as V(next_obs) over the whole [T, B] batch, e.g. "
                "jax.vmap(policy.value, in_axes=(None, 0))(params, traj.next_obs)."
            )
        if name in ("terminated", "truncated", "valid"):
            if array.dtype != jnp.bool_:
                raise InvalidArgumentError(
                    f"{fn}({name}=...): expected a boolean array, got dtype {array.dtype}; "
                    "pass a mask (e.g. x.astype(bool)) so flags are never mistaken for weights."
                )
        else:
            array = array.astype(reward.dtype)
        out.append(array)
    return tuple(out)


def _check_unit(fn: str, name: str, x: Any) -> None:
    """Checks ``0 <= x <= 1`` where ``x`` is concrete (traced values pass)."""
    try:
        concrete = float(x)
    except jax.errors.ConcretizationTypeError:
        return  # traced under jit: checked by the caller's own code, if at all
    except (TypeError, ValueError) as err:
        raise InvalidArgumentTypeError(
            f"{fn}({name}=...): expected a float, got {type(x).__name__} {x!r}."
        ) from err
    if not 0.0 <= concrete <= 1.0:
        raise InvalidArgumentError(f"{fn}({name}={concrete}): expected a value in [0, 1].")

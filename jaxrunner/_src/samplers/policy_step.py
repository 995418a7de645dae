"""The compiled policy step of every host sampler: staged observations in, actions and
extras out, one transfer each way. See docs/design.md."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, cast

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

import jaxrunner._src.samplers.keys as keys
from jaxrunner._src import space_arrays
from jaxrunner._src.connectors.pipeline import POLICY_OBS, Connectors, ConnectorsState
from jaxrunner._src.connectors.state_packing import StatePacking
from jaxrunner._src.connectors.state_rows import keep_active, put_rows, take_rows
from jaxrunner._src.core.policy import ApplyFn, Params, Policy
from jaxrunner._src.samplers.batch_invariance import (
    check_output_rows,
    chunked_apply,
    padded_rows,
)
from jaxrunner._src.samplers.kept_programs import avals, jax_settings, kept_for, packing_layout
from jaxrunner._src.samplers.transfer import compile_packed
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

# Transfer guard levels under which a transfer needs no "allow" scope (None: unset, allows),
# and the guards' options (.value: the level in force in this thread).
_NO_GUARD = (None, "allow")
_H2D_GUARD, _D2H_GUARD = jax.transfer_guard_host_to_device, jax.transfer_guard_device_to_host


class ActorState(flax.struct.PyTreeNode):
    """Device-resident state of the policy side of the loop, one row per env."""

    env_keys: jax.Array
    """[B, ...] one key per env, ``fold_in(seed_key, env_id)``, as raw key data: typed
    key arrays cost ~20 us of Python per compiled call (re-wrapped on the way out)."""
    env_steps: jax.Array
    """[B] steps each env has taken so far (folded into its key each step)."""
    carry: Any
    """[B, ...] recurrent state (None for feed-forward policies)."""
    initial_carry: Any
    """[B, ...] the carry each env restarts from at an episode start."""
    connectors: ConnectorsState = ConnectorsState()
    """The connectors' state (per-env rows and shared statistics)."""


def initial_actor_state(
    policy: Policy,
    seed: int,
    env_ids: np.ndarray,
    connectors: Connectors | None = None,
    obs_space: Any = None,
) -> ActorState:
    """The actor state of envs ``env_ids``; with ``connectors``, their initial state for
    observations of ``obs_space`` (the env's single observation space)."""
    key = keys.key(seed)
    conn = ConnectorsState() if connectors is None else connectors.init(len(env_ids), obs_space)
    return ActorState(
        env_keys=jax.random.key_data(
            jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.asarray(env_ids, jnp.uint32))
        ),
        env_steps=jnp.zeros(len(env_ids), dtype=jnp.uint32),
        carry=policy.batched_carry(len(env_ids)),
        initial_carry=policy.batched_carry(len(env_ids)),
        connectors=conn,
    )


def host_actor_state(
    policy: Policy,
    seed: int,
    num_envs: int,
    connectors: Connectors | None,
    obs_space: Any,
    env_ids: np.ndarray | None = None,
) -> tuple[ActorState, StatePacking | None]:
    """:func:`initial_actor_state` of envs ``env_ids`` (default ``0..num_envs-1``) for a
    host sampler, with the connectors' state packed into one device buffer (and the
    packing; None without connectors): the state :class:`CompiledPolicyStep` takes and
    returns."""
    ids = np.arange(num_envs) if env_ids is None else env_ids
    state = initial_actor_state(policy, seed, ids, connectors, obs_space)
    if connectors is None:
        return state, None
    packing = StatePacking(state.connectors)
    return state.replace(connectors=packing.to_device(state.connectors)), packing


def act(
    apply_fn: Callable,
    params: Params,
    state: ActorState,
    obs: Any,
    episode_start: jax.Array,
    active: jax.Array | None = None,
    connectors: Connectors | None = None,
    counted: jax.Array | None = None,
) -> tuple[Any, Any, dict[str, Any], ActorState]:
    """One policy step for a batch of envs (pure; jitted once per runner): returns
    ``(action, env_action, extras, state)``.

    Key rule: env ``i``'s key is ``fold_in(fold_in(seed_key, env_id[i]), env_steps[i])``,
    so its actions depend on the seed, its id and its step count only, never on which
    envs share its batch. Envs outside ``active`` keep their state; shared connector
    statistics take in the ``counted`` rows only (default ``active``; a bucket's padding
    is active but not counted).
    """

    def restart(c: jax.Array, c0: jax.Array) -> jax.Array:
        return jnp.where(_rows_mask(episode_start, c), c0, c)

    conn = state.connectors
    if connectors is not None and connectors.obs:
        if counted is None:
            counted = jnp.ones_like(episode_start) if active is None else active
        obs, conn = connectors.observe(conn, obs, episode_start, counted)
    carry = jax.tree.map(restart, state.carry, state.initial_carry)
    env_keys = keys.wrap(state.env_keys)
    step_keys = jax.vmap(jax.random.fold_in)(env_keys, state.env_steps)
    out = apply_fn(params, obs, carry, step_keys)
    action, extras, carry = apply_output(out, carry, episode_start.shape[0])
    env_action = action
    if connectors is not None:
        if connectors.obs:
            extras = {**extras, POLICY_OBS: obs}
        env_action = connectors.env_action(action)
    env_steps = state.env_steps + 1
    if active is not None:
        env_steps = jnp.where(active, env_steps, state.env_steps)
        carry = jax.tree.map(
            lambda new, old: jnp.where(_rows_mask(active, new), new, old), carry, state.carry
        )
        conn = keep_active(conn, state.connectors, active)
    new_state = state.replace(carry=carry, env_steps=env_steps, connectors=conn)
    return action, env_action, extras, new_state


def apply_output(out: Any, carry: Any, rows: int) -> tuple[Any, dict[str, Any], Any]:
    """A policy's ``apply_fn`` output for ``rows`` observations and ``carry``, checked
    while it is traced: ``(action, extras, carry)`` with ``extras`` a dict, one row per
    observation in every leaf, and a carry like ``carry`` (:func:`check_carry`)."""
    if not (isinstance(out, tuple) and len(out) == 3 and isinstance(out[1], Mapping)):
        got = f"a tuple of {len(out)}" if isinstance(out, tuple) else f"a {type(out).__name__}"
        if isinstance(out, tuple) and len(out) == 3:
            kind = "an array" if hasattr(out[1], "shape") else f"a {type(out[1]).__name__}"
            got = f"extras that are {kind}"
        raise InvalidArgumentTypeError(
            f"policy apply_fn: expected it to return (action, extras, carry), extras a dict "
            f"of [B, ...] arrays ({{}} for none, e.g. {{'log_prob': ...}}); got {got}."
        )
    check_output_rows(out, rows)
    check_carry(out[2], carry)
    return out


class _Leaf(str):
    """A leaf's description, shown without quotes in its tree's repr."""

    def __repr__(self) -> str:
        return str(self)


def _carry_spec(carry: Any) -> Any:
    """``carry`` with each leaf described as ``dtype[shape]`` (e.g. ``float32[4, 2]``)."""

    def describe(x: Any) -> _Leaf:
        return _Leaf(f"{getattr(x, 'dtype', type(x).__name__)}{list(np.shape(x))}")

    return jax.tree.map(describe, carry)


def check_carry(new: Any, given: Any) -> None:
    """Refuses, while tracing, a returned carry ``new`` whose structure, shapes or dtypes
    are not those of the carry ``given`` to the policy: the state keeps it for the next
    step (a mismatch failed in JAX's code, or was cast silently)."""
    expected, got = _carry_spec(given), _carry_spec(new)
    if jax.tree.flatten(got) == jax.tree.flatten(expected):
        return
    if given is None:
        fix = "Return None as a feed-forward policy's carry, or set Policy(initial_carry=...)."
    else:
        fix = (
            "Return a carry of initial_carry's structure, shapes and dtypes, one row per "
            "observation (cast a leaf with .astype(carry.dtype) where its dtype changed)."
        )
    raise InvalidArgumentError(
        f"policy apply_fn: the returned carry is the next step's, so it must have the "
        f"structure, shapes and dtypes of the carry it was given: expected {expected!r}, "
        f"got {got!r}. " + fix
    )


def _rows_mask(flags: jax.Array, like: jax.Array) -> jax.Array:
    """``[B]`` flags shaped to broadcast over the rows of ``like`` (``[B, ...]``)."""
    return flags.reshape(-1, *([1] * (like.ndim - 1)))


class Stage(NamedTuple):
    """A host buffer of one call's inputs and numpy views into it."""

    buffer: np.ndarray
    obs: Any
    """[rows, ...] observations."""
    episode_start: np.ndarray
    """[rows] bool: the row's env starts an episode (its carry restarts)."""
    env_index: np.ndarray
    """[rows] int32: the row's env, or ``num_envs`` for a row to drop."""


class CompiledPolicyStep:
    """:func:`act` for ``size`` rows (the stage's: rounded up to a multiple of
    ``chunk_rows``), compiled once, ahead of time, for the shapes of ``params`` and
    ``obs_example``. ``chunk_rows`` computes the policy in chunks, so a row's bits do not
    depend on the call's size (None: one call for all rows).
    """

    def __init__(
        self,
        policy: Policy,
        params: Params,
        state: ActorState,
        size: int,
        obs_example: Any,
        connectors: Connectors | None = None,
        packing: StatePacking | None = None,
        *,
        chunk_rows: int | None = None,
        action_space: Any = None,
    ) -> None:
        num_envs = int(state.env_steps.shape[0])
        self.num_envs, self.chunk_rows = num_envs, chunk_rows
        rows, chunked = size, None
        if chunk_rows is not None:
            rows = padded_rows(size, chunk_rows, num_envs)
            chunked = chunked_apply(policy.apply_fn, chunk_rows, num_envs)
        # The env's action travels in the same output only when it differs.
        self._env_actions = connectors is not None and bool(connectors.action)

        def step(params: Params, state: ActorState, inputs: Any) -> tuple[Any, ActorState]:
            obs, start, index = inputs
            apply_fn = policy.apply_fn
            if chunked is not None:
                # Rows up to the last real one (from the stage: a run-time count).
                real = jnp.arange(1, rows + 1, dtype=jnp.int32) * (index < num_envs)
                apply_fn = functools.partial(chunked, num_rows=real.max())
            if packing is not None:
                # Between calls the state holds the packed buffers (see step's end).
                flat = cast(tuple[jax.Array, ...], state.connectors)
                state = state.replace(connectors=packing.unpack(flat))
            if size == rows == num_envs:  # rows are envs: keep the active rows' new state
                action, env_action, extras, state = act(
                    apply_fn, params, state, obs, start, index < num_envs, connectors
                )
            else:  # gather the rows' state, scatter it back (padding dropped)
                action, env_action, extras, state = _act_gathered(
                    apply_fn, params, state, obs, start, index, connectors
                )
            if packing is not None:
                state = state.replace(connectors=packing.pack(state.connectors))
            outputs = (action, env_action, extras) if self._env_actions else (action, extras)
            # The backends' per-step check of the values, done here: one flag on the host.
            if action_space is not None:
                passes = space_arrays.batch_passes(action_space, env_action)
                outputs += () if passes is None else (passes,)
            return outputs, state

        obs_rows = jax.tree.map(lambda x: np.zeros((rows, *np.shape(x)[1:]), x.dtype), obs_example)
        example = (obs_rows, np.zeros(rows, np.bool_), np.zeros(rows, np.int32))
        key = (size, chunk_rows, packing_layout(packing), repr(action_space))  # (rows, envs: avals)
        key += (avals(params), avals(state), avals(example), *jax_settings())
        program = kept_for(
            policy,
            connectors,
            key,
            lambda: compile_packed(step, (params, state), example, donate_argnums=(1,)),
        )
        self._step, self._in_packing, self._out_packing = program[:3]
        # The last output, where there is one more: whether the env's actions pass.
        self.checks_actions = len(program.output_spec) > 2 + self._env_actions
        # Shapes and dtypes for num_envs rows (what a [T, B] buffer holds): of (action,
        # extras), and with action connectors of the actions the env gets (else None).
        spec = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct((num_envs, *s.shape[1:]), s.dtype),
            program.output_spec[: 2 + self._env_actions],
        )
        self.env_output_spec: tuple[Any, Any] = (spec[0], spec[-1])
        self.env_action_spec: Any = spec[1] if self._env_actions else None
        self._action_treedef = jax.tree.structure(spec[0])
        self._action_is_leaf = jax.tree_util.treedef_is_leaf(self._action_treedef)
        # The guard scopes, built once: each would cost ~2 us of Python per call, and
        # entered only where a guard is set (entering one costs ~1 us more).
        self._allow_h2d = jax.transfer_guard_host_to_device("allow")
        self._allow_d2h = jax.transfer_guard_device_to_host("allow")

    def new_stage(self) -> Stage:
        """A zeroed stage (every row marked to drop)."""
        buffer = self._in_packing.allocate()
        obs, start, index = self._in_packing.host_views(buffer)
        index[:] = self.num_envs
        return Stage(buffer, obs, start, index)

    def dispatch(self, params: Params, state: ActorState, stage: Stage) -> tuple[Any, ActorState]:
        """Sends ``stage`` (one host->device transfer) and queues the step; returns the
        pending output and the new actor state without waiting. The stage must stay
        unchanged until :meth:`collect` (the transfer may alias it)."""
        # Allowed here by name, so a caller's transfer_guard("disallow") still catches any
        # other transfer (an explicit device_put costs ~60 us more per call).
        if _H2D_GUARD.value in _NO_GUARD:  # the scope is a no-op
            return self._step(params, state, stage.buffer)
        with self._allow_h2d:
            return self._step(params, state, stage.buffer)

    def collect(
        self, pending: Any, lead: tuple[int, ...] | None = None
    ) -> tuple[Any, Any, list[np.ndarray], bool]:
        """Waits for a dispatched step; returns numpy views of the action and of the
        env's action (pytrees; the same object without action connectors) and of the
        extras' leaves in ``jax.tree.leaves`` order, ``[rows, ...]`` each (the step's
        one device->host transfer), and whether every row of the env's action passed
        the backends' check of its values in the step (False where not checked). With
        ``lead`` (e.g. ``(envs, agents)``), views of the first ``prod(lead)`` rows only,
        shaped ``[*lead, ...]``."""
        if _D2H_GUARD.value in _NO_GUARD:
            host = np.asarray(pending)
        else:
            with self._allow_d2h:
                host = np.asarray(pending)
        leaves = self._out_packing.host_leaves(host, lead)
        passed = self.checks_actions and bool(leaves.pop())
        if self._action_is_leaf and not self._env_actions:  # the common case: no tree
            return leaves[0], leaves[0], leaves[1:], passed
        num = self._action_treedef.num_leaves
        action = self._unflatten(leaves[:num])
        if not self._env_actions:
            return action, action, leaves[num:], passed
        return action, self._unflatten(leaves[num : 2 * num]), leaves[2 * num :], passed

    def _unflatten(self, leaves: list[np.ndarray]) -> Any:
        # The common case (one array) without a tree rebuilt per step.
        return leaves[0] if self._action_is_leaf else self._action_treedef.unflatten(leaves)


def _act_gathered(
    apply_fn: ApplyFn,
    params: Params,
    state: ActorState,
    obs: Any,
    start: jax.Array,
    index: jax.Array,
    connectors: Connectors | None = None,
) -> tuple[Any, Any, Any, ActorState]:
    """:func:`act` for the envs at ``index`` (``num_envs``: padding, dropped); shared
    connector statistics take in the real rows only."""
    num_envs = state.env_steps.shape[0]
    gather = jnp.minimum(index, num_envs - 1)

    def take(x: jax.Array) -> jax.Array:
        return x[gather]

    sub = ActorState(
        env_keys=state.env_keys[gather],
        env_steps=state.env_steps[gather],
        carry=jax.tree.map(take, state.carry),
        initial_carry=jax.tree.map(take, state.initial_carry),
        connectors=take_rows(state.connectors, gather),
    )
    action, env_action, extras, sub = act(
        apply_fn, params, sub, obs, start, None, connectors, counted=index < num_envs
    )
    state = state.replace(
        env_steps=state.env_steps.at[index].set(sub.env_steps, mode="drop"),
        carry=jax.tree.map(
            lambda full, part: full.at[index].set(part, mode="drop"), state.carry, sub.carry
        ),
        connectors=put_rows(state.connectors, sub.connectors, index),
    )
    return action, env_action, extras, state

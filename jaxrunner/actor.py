"""The policy side of the host loop: a pure, jitted step and its host-side driver.

:func:`act` is pure; :class:`GroupActor` owns one group of envs' device state,
stages their observations in one host buffer, and moves one packed array each way
per step (see :mod:`jaxrunner.transfer`). Calls are split in ``dispatch`` (returns
as soon as the computation is queued) and ``collect`` (waits for it), so the runner
can step other envs while a group's policy runs (pipelining).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner import spaces as jr_spaces
from jaxrunner.policy import Params, Policy
from jaxrunner.transfer import Packing


@flax.struct.dataclass
class ActorState:
    """Device-resident state of the policy side of the loop, for a group of envs."""

    env_keys: jax.Array
    """[B, ...] one key per env, ``fold_in(seed_key, env_id)``, as raw key data: typed
    key arrays cost ~20 us of Python per compiled call (re-wrapped on the way out)."""
    env_steps: jax.Array
    """[B] steps each env has taken so far (folded into its key each step)."""
    carry: Any
    """[B, ...] recurrent state (None for feed-forward policies)."""
    initial_carry: Any
    """[B, ...] the carry each env restarts from at an episode start."""


def initial_actor_state(policy: Policy, seed: int, env_ids: np.ndarray) -> ActorState:
    key = jax.random.key(seed)
    return ActorState(
        env_keys=jax.random.key_data(
            jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.asarray(env_ids, jnp.uint32))
        ),
        env_steps=jnp.zeros(len(env_ids), dtype=jnp.uint32),
        carry=policy.batched_carry(len(env_ids)),
        initial_carry=policy.batched_carry(len(env_ids)),
    )


def act(
    apply_fn: Callable,
    params: Params,
    state: ActorState,
    obs: Any,
    episode_start: jax.Array,
    active: jax.Array | None = None,
) -> tuple[Any, dict[str, Any], ActorState]:
    """One policy step for a batch of envs (pure; jitted once per runner).

    Env ``i``'s key is ``fold_in(fold_in(seed_key, env_id[i]), env_steps[i])``: its
    actions depend on the seed, its id and its step count only, never on which
    envs share its batch (invariant 7). With ``active`` ([B] bool) only those envs
    take a step: the others' step counts and carries are kept as they were.
    """

    def restart(c: jax.Array, c0: jax.Array) -> jax.Array:
        return jnp.where(_rows_mask(episode_start, c), c0, c)

    carry = jax.tree.map(restart, state.carry, state.initial_carry)
    env_keys = jax.random.wrap_key_data(state.env_keys)
    keys = jax.vmap(jax.random.fold_in)(env_keys, state.env_steps)
    action, extras, carry = apply_fn(params, obs, carry, keys)
    env_steps = state.env_steps + 1
    if active is not None:
        env_steps = jnp.where(active, env_steps, state.env_steps)
        carry = jax.tree.map(
            lambda new, old: jnp.where(_rows_mask(active, new), new, old), carry, state.carry
        )
    return action, extras, state.replace(carry=carry, env_steps=env_steps)


def _rows_mask(flags: jax.Array, like: jax.Array) -> jax.Array:
    """``[B]`` flags shaped to broadcast over the rows of ``like`` (``[B, ...]``)."""
    return flags.reshape(-1, *([1] * (like.ndim - 1)))


class GroupActor:
    """Runs the policy for envs ``rows`` of a vector env.

    Every call computes the policy for all the vector env's envs, this group's at
    their own rows, with one executable that every group shares, and keeps this
    group's rows (the others' state is left as it was). XLA's matmuls round
    differently by batch size, so this is what makes an env's actions and extras
    bitwise the same whatever the grouping (invariant 7); the cost is computing
    every row in each group's call.

    Args:
        policy: the policy.
        params: device params (only their shapes matter here).
        seed: the runner's seed.
        rows: the slice of env indices this group serves.
        obs_example: the observations of all the envs (numpy, ``[num_envs, ...]``).
        compiled: the compiled step of another group, to reuse (filled if empty).
    """

    def __init__(
        self,
        policy: Policy,
        params: Params,
        seed: int,
        rows: slice,
        obs_example: Any,
        compiled: dict[str, tuple[Callable, Packing, Any]],
    ) -> None:
        self.rows = rows
        num_envs = jax.tree.leaves(obs_example)[0].shape[0]
        self.state = initial_actor_state(policy, seed, np.arange(num_envs))
        active = np.zeros(num_envs, np.bool_)
        active[rows] = True
        in_packing = Packing((obs_example, active, active))  # obs, episode starts, active
        self._stage = in_packing.allocate()
        self._stage_obs, self._stage_start, stage_active = in_packing.host_views(self._stage)
        stage_active[:] = active
        self._whole = rows.start == 0 and rows.stop == num_envs  # nothing to drop
        if not compiled:
            compiled["step"] = _compile(policy, params, self.state, in_packing)
        self._step, self._out_packing, self.output_spec = compiled["step"]
        self._action_treedef = jax.tree.structure(self.output_spec[0])
        self._action_is_leaf = jax.tree_util.treedef_is_leaf(self._action_treedef)
        self._pending: jax.Array | None = None
        # The guard scopes of dispatch/collect, built once: each call would cost
        # ~2 us of Python (they are re-entered in turn, never nested).
        self._allow_h2d = jax.transfer_guard_host_to_device("allow")
        self._allow_d2h = jax.transfer_guard_device_to_host("allow")

    def dispatch(
        self, params: Params, obs_space: spaces.Space, obs: Any, episode_start: np.ndarray
    ) -> None:
        """Stages this group's ``obs`` and episode-start flags at its rows, sends the
        stage (one transfer) and queues the policy step; returns without waiting."""
        jr_spaces.copy_into(obs_space, self._stage_obs, obs, self.rows)
        self._stage_start[self.rows] = episode_start
        # The staged numpy buffer goes in as the call's argument: the step's one
        # host->device transfer, allowed here by name so a caller's
        # jax.transfer_guard("disallow") still catches any other. (An explicit
        # jax.device_put costs ~60 us more per call through its Python path; the
        # stage is only rewritten after collect(), so the transfer may alias it.)
        with self._allow_h2d:
            self._pending, self.state = self._step(params, self.state, self._stage)

    def collect(self) -> tuple[Any, list[np.ndarray]]:
        """Waits for the queued step; returns numpy views of this group's rows of the
        action and of the extras' leaves, in ``jax.tree.leaves`` order (the step's
        one device->host transfer, allowed by name as in :meth:`dispatch`)."""
        with self._allow_d2h:
            host = np.asarray(self._pending)
        self._pending = None
        leaves = self._out_packing.host_leaves(host)
        if not self._whole:
            leaves = [leaf[self.rows] for leaf in leaves]
        if self._action_is_leaf:
            return leaves[0], leaves[1:]
        num = self._action_treedef.num_leaves
        return self._action_treedef.unflatten(leaves[:num]), leaves[num:]


def _compile(
    policy: Policy, params: Params, state: ActorState, in_packing: Packing
) -> tuple[Callable, Packing, Any]:
    """Compiles ``packed inputs -> packed outputs`` once, ahead of time."""
    traced: dict[str, Any] = {}

    def step(params: Params, state: ActorState, packed: jax.Array):
        obs, start, active = in_packing.unpack(packed)
        action, extras, state = act(policy.apply_fn, params, state, obs, start, active)
        # Shapes are static while tracing: the output layout is fixed here, once.
        traced["spec"] = jax.eval_shape(lambda: (action, extras))
        traced["packing"] = Packing((action, extras))
        return traced["packing"].pack((action, extras)), state

    packed_spec = jax.ShapeDtypeStruct((in_packing.nbytes,), jnp.uint8)
    lowered = jax.jit(step, donate_argnums=1).trace(params, state, packed_spec).lower()
    return lowered.compile(), traced["packing"], traced["spec"]

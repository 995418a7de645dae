"""The compiled rollout of a :class:`~jaxrunner.JaxVectorEnv`: policy, env, autoreset and
bookkeeping of every step in one ``lax.scan``, for one-agent and JaxMARL-style envs alike."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

import jaxrunner._src.samplers.keys as keys
from jaxrunner._src import space_arrays
from jaxrunner._src.backends.functional_env import EnvStep
from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.connectors.pipeline import Connectors, finish_group_sample
from jaxrunner._src.connectors.sample_end import finish_inputs
from jaxrunner._src.core.multi_agent_trajectory import GroupTrajectory
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.core.trajectory import Trajectory
from jaxrunner._src.samplers.env_streams import (
    env_roots,
    env_step_keys,
    first_reset_keys,
    reset_where_done,
)
from jaxrunner._src.samplers.policy_step import ActorState, act


class RolloutState(flax.struct.PyTreeNode):
    """Everything the scan carries from one step (and one ``sample()``) to the next."""

    obs: Any
    """[B, ...] observations to act on (a JaxMARL-style env's: a dict by agent)."""
    env_state: Any
    """[B, ...] env states."""
    actor: Any
    """The policy side's state, which only the step function reads: a one-agent env's
    :class:`ActorState` (policy keys, per-env step counts and recurrent state, as in the
    host loop), or a JaxMARL-style env's groups (see :func:`_step`)."""
    env_roots: jax.Array
    """[2, ...] the step and reset roots (raw key data)."""
    num_steps: jax.Array
    """[] uint32: steps every env has taken (they step in lockstep)."""
    episode_start: jax.Array
    """[B] bool: ``obs`` is the first observation of an episode."""
    episode_id: jax.Array
    """[B] the id of each env's current episode."""
    episode_step: jax.Array
    """[B] steps taken in the current episode."""
    episode_return: jax.Array
    """[B] reward summed over the current episode."""
    next_episode_id: jax.Array
    """[] the next free episode id."""


StepFn = Callable[[Any, Any, jax.Array, Any, jax.Array], tuple[EnvStep, Any, Any]]
"""``(actor, obs, episode_start, env_state, step_keys) -> (env_step, record, actor)``:
the policy acts on ``[B]`` envs and the envs step (no reset) with ``step_keys``;
``record`` is what the scan stacks besides the env-level fields."""


def initial_state(
    reset: Callable[[jax.Array], tuple[Any, Any]], actor: Any, seed: int, num_envs: int
) -> RolloutState:
    """Resets every env with its first-reset key (``reset(keys) -> (obs, env_state)``,
    ``[B]`` envs); pure, jit it."""
    obs, env_state = reset(first_reset_keys(seed, jnp.arange(num_envs)))
    int_dtype = jax.dtypes.canonicalize_dtype(np.int64)
    return RolloutState(
        obs=obs,
        env_state=env_state,
        actor=actor,
        env_roots=jax.random.key_data(env_roots(seed)),
        num_steps=jnp.zeros((), jnp.uint32),
        episode_start=jnp.ones(num_envs, bool),
        episode_id=jnp.arange(num_envs, dtype=int_dtype),
        episode_step=jnp.zeros(num_envs, int_dtype),
        episode_return=jnp.zeros(num_envs, jax.dtypes.canonicalize_dtype(np.float64)),
        next_episode_id=jnp.asarray(num_envs, int_dtype),
    )


def scan_envs(
    step_fn: StepFn,
    reset: Callable[[jax.Array], tuple[Any, Any]],
    num_steps: int,
    state: RolloutState,
) -> tuple[RolloutState, Any, dict[str, jax.Array], jax.Array]:
    """``num_steps`` steps of every env (pure; jit it): ``step_fn``, then the resets of
    the ended envs and the episode numbering. Returns the new state, the records and
    the env-level fields (``[T, B]``; ``total``: the return so far), and ``ends``
    ``[2, T, B]``: the return and length of each episode ended at ``[t, b]`` (length 0
    where none did).
    """
    env_ids = jnp.arange(state.episode_id.shape[0])

    def step(s: RolloutState, _: None) -> tuple[RolloutState, tuple[Any, dict[str, Any]]]:
        roots = keys.wrap(s.env_roots)
        key_step = env_step_keys(roots[0], s.num_steps, env_ids)
        out, record, actor = step_fn(s.actor, s.obs, s.episode_start, s.env_state, key_step)
        done = jnp.logical_or(out.terminated, out.truncated)
        obs, env_state = reset_where_done(
            done, (out.obs, out.state), reset, roots[1], s.num_steps, env_ids
        )
        total = s.episode_return + out.reward
        # New ids in env order within the step, as the host loop gives them.
        new_ids = s.next_episode_id + jnp.cumsum(done, dtype=s.episode_id.dtype)
        # Only what varies per step is stacked (each output costs a write per step).
        env = {
            "reward": out.reward,
            "terminated": out.terminated,
            "truncated": out.truncated,
            "episode_id": s.episode_id,
            "step": s.episode_step,
            "total": total,
        }
        new_state = RolloutState(
            obs=obs,
            env_state=env_state,
            actor=actor,
            env_roots=s.env_roots,
            num_steps=s.num_steps + 1,
            episode_start=done,
            episode_id=jnp.where(done, new_ids - 1, s.episode_id),
            episode_step=jnp.where(done, 0, s.episode_step + 1),
            episode_return=jnp.where(done, 0, total),
            next_episode_id=new_ids[-1],
        )
        return new_state, (record, env)

    state, (record, env) = jax.lax.scan(step, state, None, length=num_steps)
    done = jnp.logical_or(env["terminated"], env["truncated"])
    ends = jnp.stack(
        [
            jnp.where(done, env["total"], 0),
            jnp.where(done, env["step"] + 1, 0).astype(env["total"].dtype),
        ],
    )
    return state, record, env, ends


# -- the kind-specific parts: an env's actor state, and its step read into records ------


def actors_of(envs: JaxVectorEnv, actor: Any) -> dict[str, ActorState]:
    """Each group's :class:`ActorState` by policy id (a one-agent env's actor is its one
    group's)."""
    if envs.multi_agent:
        return dict(actor["actors"])
    return {envs.groups[0].policy_id: actor}


def with_actors(envs: JaxVectorEnv, actor: Any, actors: dict[str, ActorState]) -> Any:
    """``actor`` with the groups' actor states ``actors`` (the inverse of :func:`actors_of`)."""
    if envs.multi_agent:
        return {**actor, "actors": actors}
    return actors[envs.groups[0].policy_id]


def bad_actions(
    envs: JaxVectorEnv, actions: dict[str, Any], valid: dict[str, Any] | None, num_steps: int
) -> dict[str, jax.Array]:
    """Per policy id (of the groups whose space has values to check), ``[T, B * A_g]``:
    the acting rows whose recorded action (``actions``, ``[T, B(, A_g), ...]``) is outside
    its space, as the host loop would refuse it before the env steps. ``valid``: which
    slots act (None: all)."""
    out = {}
    for g in envs.groups:
        rows = envs.num_envs * g.num_agents
        pid = g.policy_id
        bad = space_arrays.bad_action_rows(g.action_space, actions[pid], num_steps * rows)
        if bad is not None:
            bad = bad.reshape(num_steps, rows)
            # a done agent's actions are not the env's
            out[pid] = bad if valid is None else bad & valid[pid].reshape(num_steps, rows)
    return out


def _stack(values: dict[str, Any], agents: tuple[str, ...]) -> Any:
    """``[B, A, ...]`` from a dict of ``[B, ...]`` per agent."""
    return jax.tree.map(lambda *xs: jnp.stack(xs, axis=1), *[values[a] for a in agents])


def _step(
    envs: JaxVectorEnv,
    policies: dict[str, Policy],
    connectors: dict[str, Connectors],
    params: dict[str, Params],
    env_params: Any,
    actor: Any,
    obs: Any,
    episode_start: jax.Array,
    env_state: Any,
    step_keys: jax.Array,
) -> tuple[EnvStep, Any, Any]:
    """The scan's step function (:data:`StepFn`): every group acts on its rows (one per
    env and agent slot: a one-agent env's rows are its envs, all acting, with no mask),
    then the envs step (a JaxMARL-style env's step is read by :func:`_read_agents`)."""
    num_envs, actors = envs.num_envs, actors_of(envs, actor)
    if envs.multi_agent:
        rows = {
            g.policy_id: jax.tree.map(
                lambda x: x.reshape(num_envs * x.shape[1], *x.shape[2:]), _stack(obs, g.agents)
            )
            for g in envs.groups
        }
    else:
        rows = {envs.groups[0].policy_id: obs}
    acted = {}
    for g in envs.groups:
        pid = g.policy_id
        active = actor["alive"][pid].ravel() if envs.multi_agent else None
        # Every agent of an env starts an episode where the env does.
        start = episode_start if g.num_agents == 1 else jnp.repeat(episode_start, g.num_agents)
        action, env_action, extras, actors[pid] = act(
            policies[pid].apply_fn,
            params[pid],
            actors[pid],
            rows[pid],
            start,
            active,
            connectors.get(pid),
        )
        # Checked while tracing (shapes only), before the env sees the actions.
        space_arrays.check_policy_actions(g.action_space, action, num_envs * g.num_agents)
        acted[pid] = (action, env_action, extras)
    if envs.multi_agent:
        return _read_agents(envs, actor, actors, rows, acted, env_state, step_keys)
    pid = envs.groups[0].policy_id
    action, env_action, extras = acted[pid]
    clip = space_arrays.clip_box_actions_jax(envs.single_action_space)
    out = envs.step(step_keys, env_state, clip(env_action), env_params)
    record = {"obs": obs, "action": action, "next_obs": out.obs, "extras": extras}
    return out, record, actors[pid]


def _read_agents(
    envs: JaxVectorEnv,
    actor: dict[str, Any],
    actors: dict[str, ActorState],
    rows: dict[str, Any],
    acted: dict[str, tuple[Any, Any, Any]],
    env_state: Any,
    step_keys: jax.Array,
) -> tuple[EnvStep, dict[str, GroupTrajectory], dict[str, Any]]:
    """A JaxMARL-style env's step, read into each group's slots ``[B, A_g]``. ``actor``
    holds per policy id the groups' ``actors`` (policy state, one row per slot),
    ``alive`` (the slot's agent acts this step) and ``agent_step`` (its steps in its
    agent episode)."""
    num_envs = envs.num_envs
    actions, slots = {}, {}
    for g in envs.groups:

        def to_slots(x: jax.Array, a_g: int = g.num_agents) -> jax.Array:
            return x.reshape(num_envs, a_g, *x.shape[1:])

        obs_g, (action, env_action, extras) = jax.tree.map(
            to_slots, (rows[g.policy_id], acted[g.policy_id])
        )
        env_action = space_arrays.clip_box_actions_jax(g.action_space)(env_action)
        for k, agent in enumerate(g.agents):
            actions[agent] = jax.tree.map(lambda x, k=k: x[:, k], env_action)
        slots[g.policy_id] = (obs_g, action, extras)
    next_obs, env_state, rewards, dones, _ = envs.step_agents(step_keys, env_state, actions)
    done_all = dones["__all__"]
    reset_all = done_all[:, None]
    groups, alive_next, agent_step = {}, {}, {}
    env_reward = jnp.zeros(num_envs, jnp.float32)
    for g in envs.groups:
        pid = g.policy_id
        obs_g, action, extras = slots[pid]
        valid = actor["alive"][pid]
        reward = jnp.where(valid, _stack(rewards, g.agents).astype(jnp.float32), 0.0)
        env_reward = env_reward + reward.sum(1)
        done_a = _stack(dones, g.agents) & valid
        ended = valid & (done_a | reset_all)
        if envs.dones_are_truncations:
            terminated, truncated = jnp.zeros_like(ended), ended
        else:
            terminated, truncated = done_a, ended & ~done_a

        def mask(x: jax.Array, valid: jax.Array = valid) -> jax.Array:
            return jnp.where(valid.reshape(*valid.shape, *([1] * (x.ndim - 2))), x, 0)

        step_g = actor["agent_step"][pid]
        groups[pid] = GroupTrajectory(
            obs=jax.tree.map(mask, obs_g),
            action=jax.tree.map(mask, action),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            next_obs=jax.tree.map(mask, _stack(next_obs, g.agents)),
            extras=jax.tree.map(mask, extras),
            valid=valid,
            agent_step=jnp.where(valid, step_g, 0),
        )
        alive_next[pid] = reset_all | (valid & ~done_a)
        agent_step[pid] = jnp.where(reset_all | ended, 0, step_g + valid)
    out = EnvStep(next_obs, env_state, env_reward, done_all, jnp.zeros_like(done_all))
    return out, groups, {"actors": actors, "alive": alive_next, "agent_step": agent_step}


# -- the rollout and its views ----------------------------------------------------------


def _finish(finish: Callable[..., tuple], actor: ActorState, traj: Any) -> tuple[Any, Any]:
    """``finish`` (:meth:`Connectors.finish_sample`, or :func:`finish_group_sample`) on a
    device trajectory (pure) with ``actor``'s connector state: the trajectory, the new
    actor state."""
    extras, state = finish(actor.connectors, *finish_inputs(traj))
    return traj.replace(extras={**traj.extras, **extras}), actor.replace(connectors=state)


def rollout(
    envs: JaxVectorEnv,
    policies: dict[str, Policy],
    connectors: dict[str, Connectors],
    num_steps: int,
    as_groups: bool,
    params: dict[str, Params],
    state: RolloutState,
    env_params: Any,
) -> tuple[RolloutState, Any, jax.Array, jax.Array]:
    """``num_steps`` steps of every env (pure; jit it), then each group's per-sample
    connectors. Returns the new state, a :class:`Trajectory` or (``as_groups``) the
    groups and the env-level fields a :class:`MultiAgentTrajectory` reads (XLA drops
    the rest), the ``ends`` of :func:`scan_envs`, and whether any action was outside its
    space (:func:`bad_actions`: the scan cannot stop there, as the host loop does, so
    its sampler refuses the sample after it; one flag, checked after the steps, costs
    least).
    """
    step = functools.partial(_step, envs, policies, connectors, params, env_params)
    state, rec, env, ends = scan_envs(
        step, lambda reset_keys: envs.reset(reset_keys, env_params), num_steps, state
    )
    if envs.multi_agent:
        actions = {pid: g.action for pid, g in rec.items()}
        valid: Any = {pid: g.valid for pid, g in rec.items()}
    else:
        actions, valid = {envs.groups[0].policy_id: rec["action"]}, None
    bad = bad_actions(envs, actions, valid, num_steps)
    any_bad = functools.reduce(jnp.logical_or, [b.any() for b in bad.values()], jnp.bool_(False))
    actors = actors_of(envs, state.actor)
    if envs.multi_agent:
        for pid, conn in connectors.items():
            if conn.per_sample:
                finish = functools.partial(finish_group_sample, conn)
                rec[pid], actors[pid] = _finish(finish, actors[pid], rec[pid])
        fields = {"done": env["terminated"], "episode_id": env["episode_id"], "step": env["step"]}
        out: Any = (rec, fields)
    else:
        shape = (num_steps, envs.num_envs)
        out = Trajectory(
            obs=rec["obs"],
            action=rec["action"],
            reward=env["reward"],
            terminated=env["terminated"],
            truncated=env["truncated"],
            next_obs=rec["next_obs"],
            extras=rec["extras"],
            env_id=jnp.broadcast_to(jnp.arange(envs.num_envs, dtype=state.episode_id.dtype), shape),
            episode_id=env["episode_id"],
            step=env["step"],
        )
        pid = envs.groups[0].policy_id
        conn = connectors.get(pid)
        if conn is not None and conn.per_sample:
            out, actors[pid] = _finish(conn.finish_sample, actors[pid], out)
        if as_groups:
            out = _one_group(pid, out)
    return state.replace(actor=with_actors(envs, state.actor, actors)), out, ends, any_bad


def _one_group(policy_id: str, traj: Trajectory) -> tuple[dict[str, GroupTrajectory], Any]:
    """A one-agent env's trajectory as its one group of one agent (``[T, B, 1, ...]``),
    and the env-level fields, as :func:`rollout` returns a JaxMARL-style env's."""
    group = GroupTrajectory(
        obs=traj.obs,
        action=traj.action,
        reward=traj.reward,
        terminated=traj.terminated,
        truncated=traj.truncated,
        next_obs=traj.next_obs,
        extras=traj.extras,
        valid=traj.valid,
        agent_step=traj.step,
    )
    group = jax.tree.map(lambda x: x[:, :, None], group)  # [T, B, ...] -> [T, B, 1, ...]
    done = jnp.logical_or(traj.terminated, traj.truncated)
    return {policy_id: group}, {"done": done, "episode_id": traj.episode_id, "step": traj.step}

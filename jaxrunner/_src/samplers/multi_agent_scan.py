"""The multi-agent scan sampler: the step function of a pure-JAX multi-agent env and
every group's policy, run by the scan sampler's loop."""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner._src.backends.functional_env import EnvStep
from jaxrunner._src.backends.multi_agent.jax_env import JaxMultiAgentVectorEnv
from jaxrunner._src.connectors.pipeline import (
    Connectors,
    ConnectorsState,
    finish_group_sample,
)
from jaxrunner._src.connectors.state_rows import device_copy
from jaxrunner._src.core.multi_agent_trajectory import GroupTrajectory, MultiAgentTrajectory
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.samplers.agent_episodes import agent_episode_ends
from jaxrunner._src.samplers.multi_agent import MultiAgentSetup
from jaxrunner._src.samplers.policy_step import act, initial_actor_state
from jaxrunner._src.samplers.sampler import StepProgress
from jaxrunner._src.samplers.scan_loop import (
    RolloutState,
    ScanLoop,
    episode_counts,
    finish_sample,
    initial_state,
    scan_envs,
)


def _stack(values: dict[str, Any], agents: tuple[str, ...]) -> Any:
    """``[B, A, ...]`` from a dict of ``[B, ...]`` per agent."""
    return jax.tree.map(lambda *xs: jnp.stack(xs, axis=1), *[values[a] for a in agents])


def _step(
    envs: JaxMultiAgentVectorEnv,
    policies: dict[str, Policy],
    connectors: dict[str, Connectors],
    params: dict[str, Params],
    actor: dict[str, Any],
    obs: dict[str, Any],
    episode_start: jax.Array,
    env_state: Any,
    step_keys: jax.Array,
) -> tuple[EnvStep, dict[str, GroupTrajectory], dict[str, Any]]:
    """The scan's step function (:data:`~jaxrunner._src.samplers.scan_loop.StepFn`): every group
    acts on its agents' slots, then the envs step. ``actor`` holds per policy id the
    groups' ``actors`` (policy state, one row per slot), ``alive`` (the slot's agent
    acts this step) and ``agent_step`` (its steps in its agent episode), ``[B, A_g]``."""
    num_envs = envs.num_envs
    actions, outs, actors = {}, {}, {}
    for g in envs.groups:
        pid, a_g = g.policy_id, g.num_agents

        def rows(x: jax.Array, a_g: int = a_g) -> jax.Array:
            return x.reshape(num_envs * a_g, *x.shape[2:])

        def slots(x: jax.Array, a_g: int = a_g) -> jax.Array:
            return x.reshape(num_envs, a_g, *x.shape[1:])

        obs_g = _stack(obs, g.agents)
        alive = actor["alive"][pid]
        # Every agent of an env starts an episode where the env does.
        start = jnp.broadcast_to(episode_start[:, None], alive.shape)
        action, env_action, extras, actors[pid] = act(
            policies[pid].apply_fn,
            params[pid],
            actor["actors"][pid],
            jax.tree.map(rows, obs_g),
            start.ravel(),
            alive.ravel(),
            connectors.get(pid),
        )
        action, env_action, extras = jax.tree.map(slots, (action, env_action, extras))
        for k, agent in enumerate(g.agents):
            actions[agent] = jax.tree.map(lambda x, k=k: x[:, k], env_action)
        outs[pid] = (obs_g, action, extras)
    next_obs, env_state, rewards, dones, _ = jax.vmap(envs.env.step_env)(
        step_keys, env_state, actions
    )
    done_all = dones["__all__"]
    reset_all = done_all[:, None]
    groups, alive_next, agent_step = {}, {}, {}
    env_reward = jnp.zeros(num_envs, jnp.float32)
    for g in envs.groups:
        pid = g.policy_id
        obs_g, action, extras = outs[pid]
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


def _rollout(
    envs: JaxMultiAgentVectorEnv,
    policies: dict[str, Policy],
    connectors: dict[str, Connectors],
    num_steps: int,
    params: dict[str, Params],
    state: RolloutState,
) -> tuple[RolloutState, dict[str, GroupTrajectory], dict[str, jax.Array], jax.Array]:
    """:func:`~jaxrunner._src.samplers.scan_loop.scan_envs` with :func:`_step`, then each group's
    per-sample connectors (pure; jit it). Of the env-level fields, only those the
    trajectory reads are returned: XLA drops the others from the loop."""
    step = functools.partial(_step, envs, policies, connectors, params)
    state, groups, env, ends = scan_envs(step, jax.vmap(envs.env.reset), num_steps, state)
    actors = dict(state.actor["actors"])
    for pid, conn in connectors.items():
        if conn.per_sample:
            finish = functools.partial(finish_group_sample, conn)
            groups[pid], conn_state = finish_sample(finish, actors[pid].connectors, groups[pid])
            actors[pid] = actors[pid].replace(connectors=conn_state)
    state = state.replace(actor={**state.actor, "actors": actors})
    return state, groups, {k: env[k] for k in ("terminated", "episode_id", "step")}, ends


class MultiAgentScanSampler:
    """Samples a :class:`~jaxrunner._src.backends.multi_agent.jax_env.JaxMultiAgentVectorEnv`."""

    def __init__(self, envs: JaxMultiAgentVectorEnv, setup: MultiAgentSetup) -> None:
        self.envs, self.rollout_length, self.metrics = envs, setup.rollout_length, setup.metrics
        num_envs, num_possible = envs.num_envs, len(envs.possible_agents)
        self.agents = {g.policy_id: g.agents for g in envs.groups}
        actors, offset = {}, 0
        for g in envs.groups:
            ids = np.arange(num_envs)[:, None] * num_possible + offset + np.arange(g.num_agents)
            actors[g.policy_id] = initial_actor_state(
                setup.policies[g.policy_id],
                setup.seed,
                ids.ravel(),
                setup.connectors.get(g.policy_id),
                g.observation_space,
            )
            offset += g.num_agents
        shape_of = {g.policy_id: (num_envs, g.num_agents) for g in envs.groups}
        actor = {
            "actors": actors,
            "alive": {pid: jnp.ones(s, jnp.bool_) for pid, s in shape_of.items()},
            "agent_step": {pid: jnp.zeros(s, jnp.int32) for pid, s in shape_of.items()},
        }
        state = initial_state(jax.vmap(envs.env.reset), actor, setup.seed, num_envs)
        run = functools.partial(
            _rollout, envs, setup.policies, dict(setup.connectors), self.rollout_length
        )
        self._loop = ScanLoop(run, setup.params, state)
        # Each agent slot's running return and length (host side, for the agent metrics).
        self._running = {
            pid: (np.zeros(s, np.float64), np.zeros(s, np.int64)) for pid, s in shape_of.items()
        }

    def sample(
        self, params: dict[str, Params], progress: StepProgress | None = None
    ) -> MultiAgentTrajectory:
        start = time.perf_counter()
        groups, env, ends = self._loop(params)
        num_steps, num_envs = self.rollout_length, self.envs.num_envs
        host = jax.device_get(
            {
                "ends": ends,
                "env": env,
                "groups": {
                    pid: (g.reward, g.valid, g.terminated, g.truncated) for pid, g in groups.items()
                },
            }
        )
        window = self.metrics.episodes.window
        self.metrics.add(episode_counts(host["ends"], window, num_steps * num_envs))
        for pid, (reward, valid, term, trunc) in host["groups"].items():
            running_return, running_length = self._running[pid]
            agent_ends = agent_episode_ends(
                running_return, running_length, reward, valid, term | trunc, num_steps
            )
            self.metrics.add_group_counts(pid, np.count_nonzero(valid, axis=(0, 1)), agent_ends)
        self.metrics.sample_time_s += time.perf_counter() - start
        shape = (num_steps, num_envs)
        return MultiAgentTrajectory(
            groups=groups,
            env_id=np.broadcast_to(np.arange(num_envs, dtype=np.int64), shape).copy(),
            episode_id=np.asarray(host["env"]["episode_id"], np.int64),
            step=np.asarray(host["env"]["step"], np.int64),
            env_done=np.asarray(host["env"]["terminated"]),
            agents=self.agents,
        )

    def get_state(self) -> dict[str, Any]:
        """The whole rollout state, env states included (always restorable exactly), and
        each agent slot's running return and length (copies), per policy id."""
        running = {
            pid: {"return": r.copy(), "length": n.copy()} for pid, (r, n) in self._running.items()
        }
        return {"rollout": self._loop.state, "running": running}

    def set_state(self, state: dict[str, Any]) -> None:
        """Takes a :meth:`get_state` (structure, shapes and dtypes checked by the caller)."""
        self._loop.state = state["rollout"]
        for pid, (running_return, running_length) in self._running.items():
            np.copyto(running_return, state["running"][pid]["return"])
            np.copyto(running_length, state["running"][pid]["length"])

    def get_connector_state(self, policy_id: str) -> ConnectorsState:
        """A host copy of the state of ``policy_id``'s connectors."""
        return jax.device_get(self._loop.state.actor["actors"][policy_id].connectors)

    def set_connector_state(self, policy_id: str, state: ConnectorsState) -> None:
        """Replaces the state of ``policy_id``'s connectors; never recompiles."""
        actor = self._loop.state.actor
        actors = dict(actor["actors"])
        actors[policy_id] = actors[policy_id].replace(connectors=device_copy(state))
        self._loop.state = self._loop.state.replace(actor={**actor, "actors": actors})

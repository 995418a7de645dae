"""The multi-agent scan sampler: a pure-JAX multi-agent env and every group's policy
in one jitted ``lax.scan`` (the multi-agent twin of :mod:`jaxrunner.sampling.scan`).

Compiled once, ahead of time; new params never retrace. Group arrays stay on device;
per ``sample()`` one ``device_get`` brings the env-level flags and rewards (``[T, B]``)
and the groups' rewards, flags and masks (``[T, B, A_g]``) to the host for the episode
numbering and the metrics.

Keys follow the scan sampler's streams: env ``i`` first resets with ``fold_in(
first_reset_root, i)``, steps at its ``n``-th step with ``fold_in(fold_in(step_root,
n), i)`` and, where the episode ended, resets with ``fold_in(fold_in(reset_root, n),
i)``. Policy keys are the host sampler's (row ``b * N + k`` of agent ``k`` of env
``b``, folded with the agent's action count).

Connectors (per policy id) run in each group's step, with its agent slots as rows, and
their per-sample part at the end of the same compiled program
(:func:`~jaxrunner.connectors.pipeline.finish_group_sample`).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.connectors.pipeline import (
    POLICY_OBS,
    ConnectorsState,
    device_copy,
    finish_group_sample,
)
from jaxrunner.multi_agent.groups import AgentGroup
from jaxrunner.multi_agent.jax_env import JaxMultiAgentVectorEnv
from jaxrunner.multi_agent.trajectory import GroupTrajectory, MultiAgentTrajectory
from jaxrunner.policy import Params
from jaxrunner.policy_step import act, initial_actor_state
from jaxrunner.sampling.agent_episodes import agent_episode_ends
from jaxrunner.sampling.env_streams import (
    env_roots,
    env_step_keys,
    first_reset_keys,
    reset_where_done,
)
from jaxrunner.sampling.episodes import EpisodeBook
from jaxrunner.sampling.multi_agent import EnvLevel, MultiAgentSetup


def _stack(values: dict[str, Any], agents: tuple[str, ...]) -> Any:
    """``[B, A, ...]`` from a dict of ``[B, ...]`` per agent."""
    return jax.tree.map(lambda *xs: jnp.stack(xs, axis=1), *[values[a] for a in agents])


class MultiAgentScanSampler:
    """Samples a :class:`~jaxrunner.multi_agent.jax_env.JaxMultiAgentVectorEnv`."""

    def __init__(self, envs: JaxMultiAgentVectorEnv, setup: MultiAgentSetup) -> None:
        self.envs, self.rollout_length, self.metrics = envs, setup.rollout_length, setup.metrics
        env, num_envs = envs.env, envs.num_envs
        self.agents = {g.policy_id: g.agents for g in envs.groups}
        groups: tuple[AgentGroup, ...] = envs.groups
        num_possible = len(envs.possible_agents)
        self._step_root, self._reset_root = env_roots(setup.seed)
        env_ids = jnp.arange(num_envs, dtype=jnp.uint32)
        obs, env_state = jax.vmap(env.reset)(first_reset_keys(setup.seed, env_ids))
        actors, offset = {}, 0
        for g in groups:
            ids = np.arange(num_envs)[:, None] * num_possible + offset + np.arange(g.num_agents)
            actors[g.policy_id] = initial_actor_state(
                setup.policies[g.policy_id],
                setup.seed,
                ids.ravel(),
                setup.connectors.get(g.policy_id),
                g.observation_space,
            )
            offset += g.num_agents
        shape_of = {g.policy_id: (num_envs, g.num_agents) for g in groups}
        self._carry = {
            "env_state": env_state,
            "obs": obs,
            "actors": actors,
            "alive": {pid: jnp.ones(s, jnp.bool_) for pid, s in shape_of.items()},
            "start": {pid: jnp.ones(s, jnp.bool_) for pid, s in shape_of.items()},
            "agent_step": {pid: jnp.zeros(s, jnp.int32) for pid, s in shape_of.items()},
            "n": jnp.zeros((), jnp.uint32),
        }
        truncations = envs.dones_are_truncations
        connectors = dict(setup.connectors)

        def one_step(params: dict[str, Params], carry: dict[str, Any]) -> tuple[dict, dict]:
            actions, outs, actors = {}, {}, {}
            for g in groups:
                pid, a_g = g.policy_id, g.num_agents
                obs_g = _stack(carry["obs"], g.agents)
                rows = jax.tree.map(
                    lambda x, a_g=a_g: x.reshape(num_envs * a_g, *x.shape[2:]), obs_g
                )
                alive = carry["alive"][pid]
                action, env_action, extras, actors[pid] = act(
                    setup.policies[pid].apply_fn,
                    params[pid],
                    carry["actors"][pid],
                    rows,
                    carry["start"][pid].ravel(),
                    alive.ravel(),
                    connectors.get(pid),
                )
                action, env_action = jax.tree.map(
                    lambda x, a_g=a_g: x.reshape(num_envs, a_g, *x.shape[1:]),
                    (action, env_action),
                )
                extras = jax.tree.map(
                    lambda x, a_g=a_g: x.reshape(num_envs, a_g, *x.shape[1:]), extras
                )
                for k, agent in enumerate(g.agents):
                    actions[agent] = jax.tree.map(lambda x, k=k: x[:, k], env_action)
                outs[pid] = (obs_g, action, extras)
            n = carry["n"]
            obs_st, state_st, rewards, dones, _ = jax.vmap(env.step_env)(
                env_step_keys(self._step_root, n, env_ids), carry["env_state"], actions
            )
            done_all = dones["__all__"]
            obs, env_state = reset_where_done(
                done_all,
                (obs_st, state_st),
                jax.vmap(env.reset),
                self._reset_root,
                n,
                env_ids,
            )
            new = {
                "env_state": env_state,
                "obs": obs,
                "actors": actors,
                "alive": {},
                "start": {},
                "agent_step": {},
                "n": n + 1,
            }
            ys: dict[str, Any] = {"groups": {}}
            env_reward = jnp.zeros(num_envs, jnp.float32)
            for g in groups:
                pid = g.policy_id
                obs_g, action, extras = outs[pid]
                valid = carry["alive"][pid]
                reward = jnp.where(valid, _stack(rewards, g.agents).astype(jnp.float32), 0.0)
                env_reward = env_reward + reward.sum(1)
                done_a = _stack(dones, g.agents) & valid
                ended = valid & (done_a | done_all[:, None])
                if truncations:
                    terminated, truncated = jnp.zeros_like(ended), ended
                else:
                    terminated, truncated = done_a, ended & ~done_a

                def mask(x: jax.Array, valid: jax.Array = valid) -> jax.Array:
                    return jnp.where(valid.reshape(*valid.shape, *([1] * (x.ndim - 2))), x, 0)

                step_g = carry["agent_step"][pid]
                ys["groups"][pid] = GroupTrajectory(
                    obs=jax.tree.map(mask, obs_g),
                    action=jax.tree.map(mask, action),
                    reward=reward,
                    terminated=terminated,
                    truncated=truncated,
                    next_obs=jax.tree.map(mask, _stack(obs_st, g.agents)),
                    extras=jax.tree.map(mask, extras),
                    valid=valid,
                    agent_step=jnp.where(valid, step_g, 0),
                )
                reset_all = done_all[:, None]
                new["alive"][pid] = reset_all | (valid & ~done_a)
                new["start"][pid] = jnp.broadcast_to(reset_all, valid.shape)
                new["agent_step"][pid] = jnp.where(reset_all | ended, 0, step_g + valid)
            ys["env_done"], ys["env_reward"] = done_all, env_reward
            return new, ys

        def rollout(params: dict[str, Params], carry: dict[str, Any]) -> tuple[dict, dict]:
            carry, ys = jax.lax.scan(
                lambda c, _: one_step(params, c), carry, None, self.rollout_length
            )
            for pid, conn in connectors.items():
                if not conn.per_sample:
                    continue
                g, actor = ys["groups"][pid], carry["actors"][pid]
                extras, state = finish_group_sample(
                    conn,
                    actor.connectors,
                    g.obs,
                    g.extras.get(POLICY_OBS),
                    g.next_obs,
                    g.reward,
                    g.terminated,
                    g.truncated,
                    g.valid,
                )
                ys["groups"][pid] = g.replace(extras={**g.extras, **extras})
                carry["actors"][pid] = actor.replace(connectors=state)
            return carry, ys

        self._rollout = (
            jax.jit(rollout, donate_argnums=1).lower(setup.params, self._carry).compile()
        )
        self._book = EpisodeBook(num_envs)
        self._running = {
            pid: (np.zeros(s, np.float64), np.zeros(s, np.int64)) for pid, s in shape_of.items()
        }

    def sample(self, params: dict[str, Params]) -> MultiAgentTrajectory:
        start = time.perf_counter()
        self._carry, ys = self._rollout(params, self._carry)
        num_steps, num_envs = self.rollout_length, self.envs.num_envs
        host = jax.device_get(
            {
                "env_done": ys["env_done"],
                "env_reward": ys["env_reward"],
                "groups": {
                    pid: (g.reward, g.valid, g.terminated, g.truncated)
                    for pid, g in ys["groups"].items()
                },
            }
        )
        shape = (num_steps, num_envs)
        env_level = EnvLevel(
            reward=np.asarray(host["env_reward"], np.float64),
            terminated=np.asarray(host["env_done"]),
            truncated=np.zeros(shape, np.bool_),
            valid=np.ones(shape, np.bool_),
            episode_id=np.zeros(shape, np.int64),
            step=np.zeros(shape, np.int64),
        )
        self.metrics.add(self._book.close(env_level, num_steps))  # type: ignore[arg-type]
        for pid, (reward, valid, term, trunc) in host["groups"].items():
            running_return, running_length = self._running[pid]
            ends = agent_episode_ends(
                running_return, running_length, reward, valid, term | trunc, num_steps
            )
            self.metrics.add_group_counts(pid, np.count_nonzero(valid, axis=(0, 1)), ends)
        self.metrics.sample_time_s += time.perf_counter() - start
        return MultiAgentTrajectory(
            groups=ys["groups"],
            env_id=np.broadcast_to(np.arange(num_envs, dtype=np.int64), shape).copy(),
            episode_id=env_level.episode_id,
            step=env_level.step,
            env_done=env_level.terminated,
            agents=self.agents,
        )

    def get_connector_state(self, policy_id: str) -> ConnectorsState:
        """A host copy of the state of ``policy_id``'s connectors."""
        return jax.device_get(self._carry["actors"][policy_id].connectors)

    def set_connector_state(self, policy_id: str, state: ConnectorsState) -> None:
        """Replaces the state of ``policy_id``'s connectors; never recompiles."""
        actors = dict(self._carry["actors"])
        actors[policy_id] = actors[policy_id].replace(connectors=device_copy(state))
        self._carry = {**self._carry, "actors": actors}


__all__ = ["MultiAgentScanSampler"]

"""The scan sampler: policy, env, autoreset and bookkeeping of a
:class:`~jaxrunner.JaxVectorEnv` in one ``lax.scan`` compiled ahead of time, for one-agent
and JaxMARL-style envs alike. See docs/backends/jax.md."""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.connectors.pipeline import ConnectorsState
from jaxrunner._src.core.multi_agent_trajectory import MultiAgentTrajectory
from jaxrunner._src.samplers.episode_ids import SampleCounts, agent_episode_ends
from jaxrunner._src.samplers.policy_step import initial_actor_state
from jaxrunner._src.samplers.sampler import SamplerSetup, StepProgress, attach_partial
from jaxrunner._src.samplers.scan_rollout import (
    RolloutState,
    actors_of,
    bad_actions,
    initial_state,
    rollout,
    with_actors,
)
from jaxrunner.errors import InvalidActionError


def episode_counts(ends: np.ndarray, window: int, num_env_steps: int) -> SampleCounts:
    """What a rollout adds to the metrics, from its ``ends`` (see :func:`scan_envs`, on
    the host): the episodes that ended, the latest ``window`` at least, in step order
    then env order (as the host loop)."""
    num_episodes = int(np.count_nonzero(ends[1]))
    # The metrics keep the latest episodes only: read the last steps that hold them
    # (a mask over every step cost another ~0.1 ms at 8 x 4096).
    first, held = len(ends[1]), 0
    while first > 0 and held < window:
        first -= 1
        held += np.count_nonzero(ends[1, first])
    returns, lengths = ends[0, first:], ends[1, first:]
    mask = lengths > 0  # row-major: step order, then env order
    return SampleCounts(
        num_env_steps=num_env_steps,
        num_faulty_episodes=0,
        returns=returns[mask].astype(np.float64),
        lengths=lengths[mask].astype(np.int64),
        num_episodes=num_episodes,
    )


class ScanSampler:
    """Runs :func:`rollout` on a JaxVectorEnv for an :class:`~jaxrunner.EnvRunner`: a
    :class:`Trajectory` on device for one policy, else (``setup.by_group``) a
    :class:`MultiAgentTrajectory` with env-level ids on host. Perf timers stay 0:
    policy and env run fused, with no phase to time apart.
    """

    on_device = True
    """Its rollouts and the envs' states are device arrays its compiled scan builds: there
    is no host buffer to hand back, and checkpoints hold the envs' states."""

    def __init__(self, envs: JaxVectorEnv, setup: SamplerSetup) -> None:
        self.envs, self.rollout_length, self.metrics = envs, setup.rollout_length, setup.metrics
        self.splits = [slice(0, envs.num_envs)]  # one compiled scan of every env
        self._env_params = jax.device_put(envs.params)
        num_envs, seed = envs.num_envs, setup.seed
        policies, connectors = dict(setup.policies), dict(setup.connectors)
        as_groups, params = setup.by_group, setup.params
        run = functools.partial(rollout, envs, policies, connectors, self.rollout_length, as_groups)
        if not as_groups:  # an EnvRunner's one policy, the one group's: its params as they are
            pid, run_groups = envs.groups[0].policy_id, run
            params = setup.params[pid]
            run = lambda params, *args: run_groups({pid: params}, *args)  # noqa: E731

        def start(env_params: Any) -> RolloutState:
            actors, offset = {}, 0
            for g in envs.groups:  # a row per env and agent slot, numbered env by env
                slot = np.arange(num_envs)[:, None] * len(envs.possible_agents) + offset
                actors[g.policy_id] = initial_actor_state(
                    policies[g.policy_id],
                    seed,
                    (slot + np.arange(g.num_agents)).ravel(),
                    connectors.get(g.policy_id),
                    g.observation_space,
                )
                offset += g.num_agents
            shape_of = {g.policy_id: (num_envs, g.num_agents) for g in envs.groups}
            groups = {
                "actors": actors,
                "alive": {pid: jnp.ones(s, jnp.bool_) for pid, s in shape_of.items()},
                "agent_step": {pid: jnp.zeros(s, jnp.int32) for pid, s in shape_of.items()},
            }
            actor = with_actors(envs, groups, actors)
            return initial_state(lambda k: envs.reset(k, env_params), actor, seed, num_envs)

        self._state = jax.jit(start)(self._env_params)
        """The :class:`RolloutState` carried between samples (donated to each call)."""
        # Compiled once, ahead of time: new values never retrace.
        traced = jax.jit(run, donate_argnums=1).trace(params, self._state, self._env_params)
        self._run = traced.lower().compile()
        self.agents = {g.policy_id: g.agents for g in envs.groups}
        # Each agent slot's running return and length (host side, for the agent metrics).
        self._running = None
        if as_groups:
            self._running = {
                g.policy_id: (
                    np.zeros((num_envs, g.num_agents)),
                    np.zeros((num_envs, g.num_agents), np.int64),
                )
                for g in envs.groups
            }

    def sample(self, params: Any, progress: StepProgress | None = None) -> Any:
        """One rollout; the returns and lengths of the episodes that ended, in step
        order then env order, go to the metrics (the sample's one transfer)."""
        start_time = time.perf_counter()
        self._state, out, ends, any_bad = self._run(params, self._state, self._env_params)
        num_steps, num_envs = self.rollout_length, self.envs.num_envs
        window = self.metrics.episodes.window
        if self._running is None:
            # The sample's transfers, allowed by name; views where the device is the host
            # CPU (device_get copied them: ~0.1 ms a sample at 8 x 4096).
            with jax.transfer_guard_device_to_host("allow"):
                ends = np.asarray(ends)
                self._refuse_bad_actions(np.asarray(any_bad), out)
            self.metrics.add(episode_counts(ends, window, num_steps * num_envs))
            self.metrics.sample_time_s += time.perf_counter() - start_time
            return out
        groups, env = out
        host = jax.device_get(
            {
                "ends": ends,
                "any_bad": any_bad,
                "env": env,
                "groups": {
                    pid: (g.reward, g.valid, g.terminated, g.truncated) for pid, g in groups.items()
                },
            }
        )
        shape = (num_steps, num_envs)
        traj = MultiAgentTrajectory(
            groups=groups,
            env_id=np.broadcast_to(np.arange(num_envs, dtype=np.int64), shape).copy(),
            episode_id=np.asarray(host["env"]["episode_id"], np.int64),
            step=np.asarray(host["env"]["step"], np.int64),
            env_done=np.asarray(host["env"]["done"]),
            agents=self.agents,
        )
        with jax.transfer_guard_device_to_host("allow"):
            self._refuse_bad_actions(host["any_bad"], traj)
        self.metrics.add(episode_counts(host["ends"], window, num_steps * num_envs))
        for pid, (reward, valid, term, trunc) in host["groups"].items():
            running_return, running_length = self._running[pid]
            agent_ends = agent_episode_ends(
                running_return, running_length, reward, valid, term | trunc, num_steps
            )
            self.metrics.add_group_counts(pid, np.count_nonzero(valid, axis=(0, 1)), agent_ends)
        self.metrics.sample_time_s += time.perf_counter() - start_time
        return traj

    def _refuse_bad_actions(self, any_bad: np.ndarray, traj: Any) -> None:
        """Where ``any_bad``: raises InvalidActionError at the first step with an action
        outside its space (the first group's, then row's), with the steps before it in
        ``err.partial_trajectory``."""
        if not any_bad:
            return
        if isinstance(traj, MultiAgentTrajectory):
            actions = {pid: g.action for pid, g in traj.groups.items()}
            valid: Any = {pid: g.valid for pid, g in traj.groups.items()}
        else:
            actions, valid = {self.envs.groups[0].policy_id: traj.action}, None
        bad = bad_actions(self.envs, actions, valid, self.rollout_length)
        t = min(int(np.flatnonzero(np.asarray(b).any(axis=1))[0]) for b in bad.values() if b.any())
        pid, rows = next((pid, np.asarray(b[t])) for pid, b in bad.items() if b[t].any())
        g = next(g for g in self.envs.groups if g.policy_id == pid)
        env, slot = divmod(int(np.argmax(rows)), g.num_agents)
        if valid is None:
            at: tuple[int, ...] = (t, env)
            who = f"sub-env {env}"
        else:
            at, who = (t, env, slot), f"sub-env {env} agent {g.agents[slot]!r}"
        value = jax.tree.map(lambda x: np.asarray(x[at]).tolist(), actions[pid])
        space = g.action_space
        if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
            what = f"is outside {space}"
        elif isinstance(space, (spaces.Dict, spaces.Tuple)):
            what = f"is outside {space} or not finite"
        else:  # a float Box
            what = "is not finite"
        err = InvalidActionError(
            f"actions: {who}'s action {value!r} at step {t} of this sample {what}. The "
            "pure-JAX env stepped with it inside the compiled scan, which cannot stop there; "
            "check the policy that made it (its action head, its params)."
        )
        attach_partial(err, traj.time_slice(0, t) if t else None)
        raise err

    def free_buffers(self) -> None:
        """Nothing to let go: a scan's trajectories are new arrays on the device."""

    def get_connector_state(self, policy_id: str) -> ConnectorsState:
        """A host copy of the state of ``policy_id``'s connectors: the statistics the
        next sample uses."""
        return jax.device_get(actors_of(self.envs, self._state.actor)[policy_id].connectors)

    def set_connector_state(self, state: ConnectorsState, policy_id: str) -> None:
        """Replaces the state of ``policy_id``'s connectors (shapes as
        :meth:`get_connector_state`'s); never recompiles."""
        actor = self._state.actor
        actors = actors_of(self.envs, actor)
        # A device copy the runner owns: its compiled step donates its state.
        actors[policy_id] = actors[policy_id].replace(
            connectors=jax.device_put(jax.device_get(state))
        )
        self._state = self._state.replace(actor=with_actors(self.envs, actor, actors))

    def get_state(self) -> dict[str, Any]:
        """The whole rollout state, env states included (always restorable exactly), and
        for a multi-agent env each agent slot's running return and length (copies), per
        policy id."""
        if self._running is None:
            return {"rollout": self._state}
        running = {
            pid: {"return": r.copy(), "length": n.copy()} for pid, (r, n) in self._running.items()
        }
        return {"rollout": self._state, "running": running}

    def set_state(self, state: dict[str, Any], live: list[Any] | None = None) -> None:
        """Takes a :meth:`get_state` (structure, shapes and dtypes checked by the caller);
        a pure-JAX env has no per-step callbacks (``live``)."""
        del live
        self._state = state["rollout"]
        for pid, (running_return, running_length) in (self._running or {}).items():
            np.copyto(running_return, state["running"][pid]["return"])
            np.copyto(running_length, state["running"][pid]["length"])

    def live_episodes(self) -> list[Any]:
        """No episodes: a pure-JAX env has no per-step callbacks (and its checkpoints hold
        the env states, so it never restarts episodes)."""
        return []

    def info_names(self) -> None:
        """No ``info_keys``: a pure-JAX env's infos are not recorded."""
        return None

    def set_info_names(self, names: dict[str, Any]) -> None:
        """Nothing to take (a file's names, of another runner, are ignored)."""

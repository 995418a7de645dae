"""Small pure-JAX envs for testing the pure-JAX backends without gymnax, brax or JaxMARL:
gymnax-style :class:`RandomWalk` (and its older done-only form), brax-style
:class:`BraxPoint` and JaxMARL-style :class:`Drift` (two agents)."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces


class WalkParams(flax.struct.PyTreeNode):
    max_steps_in_episode: int = 12
    """Truncation at this many steps."""
    threshold: float = 1.5
    """Termination where ``|position| > threshold``."""


class WalkState(flax.struct.PyTreeNode):
    pos: jax.Array
    time: jax.Array


class RandomWalk:
    """A 1-D walk: action 1 pushes right, 0 left, plus noise from the step key.

    Observation ``[position, time]`` (float32); reward: the new position.
    """

    @property
    def default_params(self) -> WalkParams:
        return WalkParams()

    def observation_space(self, params: WalkParams) -> spaces.Box:
        return spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, params: WalkParams) -> spaces.Discrete:
        return spaces.Discrete(2)

    def reset(self, key: jax.Array, params: WalkParams) -> tuple[jax.Array, WalkState]:
        state = WalkState(
            pos=jax.random.uniform(key, (), minval=-1.0, maxval=1.0), time=jnp.int32(0)
        )
        return self._obs(state), state

    def step(
        self, key: jax.Array, state: WalkState, action: jax.Array, params: WalkParams
    ) -> tuple[Any, ...]:
        """``(obs, state, reward, terminated, truncated, info)``; 5 items in the done-only
        form of :class:`DoneOnlyRandomWalk`."""
        push = 0.4 * (2.0 * action.astype(jnp.float32) - 1.0)
        pos = state.pos + push + 0.3 * jax.random.normal(key)
        state = WalkState(pos=pos, time=state.time + 1)
        terminated = jnp.abs(pos) > params.threshold
        truncated = state.time >= params.max_steps_in_episode
        return self._obs(state), state, pos, terminated, truncated, {}

    @staticmethod
    def _obs(state: WalkState) -> jax.Array:
        return jnp.stack([state.pos, state.time.astype(jnp.float32)])


class DoneOnlyRandomWalk(RandomWalk):
    """:class:`RandomWalk` in the done-only form ``(obs, state, reward, done, info)``
    (gymnax < 1.0): ``done`` includes the time limit, which the runner reads from
    ``state.time >= params.max_steps_in_episode``, or from ``info["truncation"]`` when
    ``report_truncation`` is set."""

    def __init__(self, report_truncation: bool = False) -> None:
        self.report_truncation = report_truncation

    def step(
        self, key: jax.Array, state: WalkState, action: jax.Array, params: WalkParams
    ) -> tuple[Any, ...]:
        obs, state, reward, terminated, truncated, _ = super().step(key, state, action, params)
        info = {"truncation": truncated} if self.report_truncation else {}
        return obs, state, reward, jnp.logical_or(terminated, truncated), info


class BraxState(flax.struct.PyTreeNode):
    """brax's ``State`` fields."""

    pipeline_state: Any
    obs: jax.Array
    reward: jax.Array
    done: jax.Array
    metrics: dict[str, jax.Array] = flax.struct.field(default_factory=dict)
    info: dict[str, Any] = flax.struct.field(default_factory=dict)


class BraxPoint:
    """A point in the plane pushed by a ``Box(-1, 1, (2,))`` action, brax style.

    Done (as a float, like brax) when it leaves the unit disc; a time limit of
    ``episode_length`` steps as brax's ``EpisodeWrapper`` sets it: ``done = 1`` and
    ``info["truncation"] = 1 - done_before_limit``.
    """

    action_size = 2
    observation_size = 4

    def __init__(self, episode_length: int = 10) -> None:
        self.episode_length = episode_length

    def reset(self, rng: jax.Array) -> BraxState:
        q = jax.random.uniform(rng, (2,), minval=-0.5, maxval=0.5)
        zero = jnp.zeros(())
        return BraxState(
            pipeline_state=q,
            obs=jnp.concatenate([q, jnp.zeros(2)]),
            reward=zero,
            done=zero,
            info={"steps": zero, "truncation": zero},
        )

    def step(self, state: BraxState, action: jax.Array) -> BraxState:
        q = state.pipeline_state + 0.3 * action
        steps = state.info["steps"] + 1
        done = (jnp.linalg.norm(q) > 1.0).astype(jnp.float32)
        at_limit = steps >= self.episode_length
        return state.replace(
            pipeline_state=q,
            obs=jnp.concatenate([q, action]),
            reward=-jnp.linalg.norm(q),
            done=jnp.where(at_limit, 1.0, done),
            info={"steps": steps, "truncation": jnp.where(at_limit, 1.0 - done, 0.0)},
        )


class AutoResetWrapper:
    """Named like brax's wrapper (which restores one cached first state): refused."""

    def __init__(self, env: Any) -> None:
        self.env = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


class Drift:
    """A JaxMARL-style env: two agents drift on a line; ``x0`` is done after 3 steps,
    ``x1`` after 5 to 6 (random), and the episode ends when both are."""

    agents = ("x0", "x1")

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-np.inf, np.inf, (3,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(3)

    def _obs(self, state: tuple) -> dict[str, jax.Array]:
        t, pos, _ = state
        return {
            a: jnp.stack([t.astype(jnp.float32), pos[k], float(k)])
            for k, a in enumerate(self.agents)
        }

    def reset(self, key: jax.Array) -> tuple[dict[str, jax.Array], tuple]:
        state = (jnp.int32(0), jax.random.normal(key, (2,)), 5 + jax.random.bernoulli(key))
        return self._obs(state), state

    def step_env(self, key: jax.Array, state: tuple, actions: dict[str, jax.Array]) -> tuple:
        t, pos, end = state
        moves = jnp.stack([actions[a] for a in self.agents]) - 1.0
        pos = pos + moves + 0.1 * jax.random.normal(key, (2,))
        t = t + 1
        state = (t, pos, end)
        dones = {"x0": t >= 3, "x1": t >= end}
        dones["__all__"] = dones["x0"] & dones["x1"]
        rewards = {a: -jnp.abs(pos[k]) for k, a in enumerate(self.agents)}
        return self._obs(state), state, rewards, dones, {}

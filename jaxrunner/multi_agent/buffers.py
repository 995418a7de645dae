"""Host buffers of one multi-agent step: per-group ``[B, A_g, ...]`` arrays and masks.

The sub-env drivers (:mod:`jaxrunner.multi_agent.drivers`) write into them in place,
row ``b`` per sub-env; the vector env hands them to the sampler as views.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxrunner import spaces as jr_spaces
from jaxrunner.multi_agent.groups import AgentGroup


@dataclasses.dataclass
class GroupBuffers:
    """One group's step buffers, ``[B, A_g, ...]``."""

    obs: Any
    """The observation each acting agent acts on next."""
    acting: np.ndarray
    """bool: the agent acts at the next step."""
    agent_start: np.ndarray
    """bool: the agent's next action is the first of its episode (its carry restarts)."""
    completed: np.ndarray
    """bool: a transition of the agent completed in the last step."""
    reward: np.ndarray
    """float64: the completed transition's reward."""
    terminated: np.ndarray
    truncated: np.ndarray
    next_obs: Any
    """The completed transition's next observation (the final one where it ended)."""
    obs_rows: Any = None
    """``obs`` viewed as ``[B * A_g, ...]`` (for the row writers)."""
    next_obs_rows: Any = None

    @classmethod
    def allocate(cls, group: AgentGroup, num_envs: int) -> GroupBuffers:
        shape = (num_envs, group.num_agents)
        space = group.observation_space
        obs, next_obs = jr_spaces.allocate(space, shape), jr_spaces.allocate(space, shape)
        flat = num_envs * group.num_agents
        return cls(
            obs=obs,
            acting=np.zeros(shape, np.bool_),
            agent_start=np.zeros(shape, np.bool_),
            completed=np.zeros(shape, np.bool_),
            reward=np.zeros(shape, np.float64),
            terminated=np.zeros(shape, np.bool_),
            truncated=np.zeros(shape, np.bool_),
            next_obs=next_obs,
            obs_rows=jax.tree.map(lambda x: x.reshape(flat, *x.shape[2:]), obs),
            next_obs_rows=jax.tree.map(lambda x: x.reshape(flat, *x.shape[2:]), next_obs),
        )

    def clear_step(self, same_step: bool = False) -> None:
        """Clears every env's masks and completed transitions before a step.

        Args:
            same_step: every acting agent's transition completes in this step (parallel
                envs): ``completed`` is set to ``acting``, and ``acting`` is kept (the
                drivers clear the agents that stop acting).
        """
        if same_step:
            np.copyto(self.completed, self.acting)
        else:
            self.acting[:] = False
            self.completed[:] = False
        self.agent_start[:] = False
        self.reward[:] = 0.0
        self.terminated[:] = False
        self.truncated[:] = False


class MultiAgentStep(NamedTuple):
    """What one multi-agent vector step returns (views of the env's buffers: valid until
    its next call). Group dicts are keyed by policy id."""

    groups: dict[str, GroupBuffers]
    env_done: np.ndarray
    """[B] bool: the env's episode ended in this step and the env was reset."""
    env_reward: np.ndarray
    """[B] float64: every reward handed out in the step, summed over agents."""
    unassigned_reward: np.ndarray
    """[B] float64: rewards no transition can carry, counted where the env's episode
    ended (only then): those of agents that never acted in it, and those that reached
    an agent after its final transition. A reward before an agent's first action is
    not here: it is added to that agent's first transition (as RLlib does)."""
    infos: list[dict[str, Any]]
    """Per-env infos of the step (the env's per-agent info dict; ``{}`` where it failed)."""
    failed: np.ndarray | None = None
    """[B] bool, or None when no sub-env failed: the sub-envs whose step failed and were
    recreated (only with a ``restart_policy``). Their rows hold no transition for any
    agent (``completed`` False); their episodes ended as faults, and ``acting``/``obs``
    are the new episode's."""
    errors: dict[int, BaseException] | None = None
    """The failures of this step by env index: failed steps (``failed``), and failed
    resets after a good step (whose transitions stay valid)."""


__all__ = ["GroupBuffers", "MultiAgentStep"]

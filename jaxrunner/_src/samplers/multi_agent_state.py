"""What the multi-agent sampler carries from one ``sample()`` to the next, typed."""

from __future__ import annotations

from typing import Any

import flax.struct
import numpy as np

from jaxrunner._src.samplers.policy_step import ActorState


@flax.struct.dataclass
class GroupState:
    """One policy group's state, ``[B, A_g, ...]`` per agent slot unless said."""

    actor: ActorState
    """The group's compiled policy step state, one row per agent slot (``B * A_g``):
    policy keys, action counts, recurrent carries, connector state."""
    running_return: np.ndarray
    """float64: each agent's return so far in its current agent episode."""
    running_length: np.ndarray
    """int64: its transitions so far in that episode."""
    awaiting: np.ndarray
    """bool, turn-based envs: the agent acted and its transition has not completed yet
    (it completes at the agent's next turn, or at the end of its episode)."""
    pending_obs: Any
    """Turn-based envs: the observation each awaiting action was taken on."""
    pending_action: Any
    """Turn-based envs: the awaiting actions (as the policy sampled them)."""
    pending_extras: tuple[np.ndarray, ...]
    """Turn-based envs: their extras, leaf by leaf (the policy's extras order)."""
    obs: Any
    """The observations the next step acts on (the last step's, the env's buffers)."""
    acting: np.ndarray
    """bool: the agent acts at the next step."""
    agent_start: np.ndarray
    """bool: that action is the first of its agent episode (its carry restarts)."""


@flax.struct.dataclass
class MultiAgentSamplerState:
    """The multi-agent sampler's state."""

    book: dict[str, np.ndarray]
    """The env-level episode bookkeeping (:meth:`EpisodeBook.get_state
    <jaxrunner._src.samplers.episode_ids.EpisodeBook.get_state>`): each env's episode id, first
    step and return so far, the next free id, the steps closed."""
    groups: dict[str, GroupState]
    """Policy id -> its group's state."""

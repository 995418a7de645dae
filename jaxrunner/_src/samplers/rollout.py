"""One sample's buffers as the host loop writes them, with the env-level arrays the
episode book reads."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrunner._src.core.multi_agent_trajectory import MultiAgentTrajectory


@dataclasses.dataclass
class EnvLevel:
    """The env-level fields :class:`EpisodeBook` numbers episodes from."""

    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray
    episode_id: np.ndarray
    step: np.ndarray


@dataclasses.dataclass
class Rollout:
    """One sample's buffers, as the loop writes them."""

    traj: MultiAgentTrajectory
    level: EnvLevel
    leaves: dict[str, list[list[np.ndarray]]]
    """Each group's buffer leaves that the steps write (:meth:`GroupSampler.leaves_of`)."""
    unassigned: np.ndarray | None
    """Multi-agent envs: ``[T, B]`` rewards no transition carries (summed at close)."""
    resets: np.ndarray | None
    """Backends that keep their reset steps: which slots are resets (for the book)."""

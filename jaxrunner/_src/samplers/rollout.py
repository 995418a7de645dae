"""One sample's buffers as the host loop writes them, with the env-level arrays the
episode book reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import cast

import numpy as np

from jaxrunner._src.core.multi_agent_trajectory import MultiAgentTrajectory
from jaxrunner._src.samplers.group_step import GroupSampler


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

    @classmethod
    def of(
        cls,
        traj: MultiAgentTrajectory,
        groups: Mapping[str, GroupSampler],
        one_agent: bool,
        reset_steps: bool,
    ) -> Rollout:
        """``traj``'s rollout: a single agent's arrays are its env's, a multi-agent env
        has env-level arrays of its own."""
        valid = cast(np.ndarray, traj.valid)  # (a host buffer)
        shape = valid.shape
        unassigned = None
        if one_agent:
            (group,) = traj.groups.values()
            reward, terminated, truncated = (
                np.asarray(x)[..., 0] for x in (group.reward, group.terminated, group.truncated)
            )
        else:
            reward, terminated = np.zeros(shape, np.float64), traj.env_done
            truncated, unassigned = np.zeros(shape, np.bool_), np.zeros(shape, np.float64)
        level = EnvLevel(reward, terminated, truncated, valid, traj.episode_id, traj.step)  # type: ignore[arg-type]
        leaves = {pid: gs.leaves_of(traj.groups[pid]) for pid, gs in groups.items()}
        resets = np.zeros(shape, np.bool_) if reset_steps else None
        return cls(traj, level, leaves, unassigned, resets)

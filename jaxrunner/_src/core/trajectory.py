"""The single-agent trajectory: ``[T, B]`` steps of ``B`` envs, split into episodes."""

from __future__ import annotations

import itertools
import os
from typing import Any

import flax.struct
import jax
import numpy as np

from jaxrunner._src.core.episode import Episode, cut_steps
from jaxrunner._src.core.time_major import (
    MAX_LOAD_BYTES,
    HostOrDevice,
    StoredNextObs,
    replace_fields,
)
from jaxrunner._src.core.trajectory_file import TrajectoryFile, check_fields, lead_shape


class Trajectory(StoredNextObs, flax.struct.PyTreeNode):
    """``T`` steps of ``B`` envs. Every field is ``[T, B, ...]``; row ``[t, b]`` of
    every field comes from the same ``env.step`` call of env ``b``.

    Attributes:
        obs: observations acted on (pytree shaped by the observation space).
        action: actions as sampled by the policy (Box actions unclipped).
        reward: float64 rewards.
        terminated: the episode ended in a terminal state.
        truncated: the episode was cut (time limit...); bootstrap from ``next_obs``.
        next_obs: the true next observation: the final one where an episode ended,
            never the observation of the reset that followed. A property: a compact
            trajectory (``EnvRunner(..., compact_next_obs=True)``) builds it on demand
            from ``obs`` and the rows it stores (``next_obs_store``).
        extras: dict of policy outputs per step (``log_prob``, ``value``, ...).
        env_id: index of the env (global across workers).
        episode_id: unique per runner; the same for every step of an episode.
        step: index of the step within its episode (0 at the first).
        valid: False where the slot holds no transition: the env's step failed and
            the env was restarted (``make_vec(..., restart_policy=...)``), which ends
            the episode at the step before, bootstrapped like a truncation (``jr.gae``
            does), reward 0; or an env's own reset step, kept by EnvPool's
            ``keep_reset_steps=True`` (``step`` -1, the next episode's id, its first
            observation in ``next_obs``; no fault). All True when omitted.
    """

    _FORMAT = "jaxrunner.Trajectory"

    obs: Any
    action: Any
    reward: HostOrDevice
    terminated: HostOrDevice
    truncated: HostOrDevice
    next_obs_store: Any
    """The dense ``[T, B]`` next observations, or a compact trajectory's
    :class:`FinalObs` (see ``next_obs``)."""
    extras: dict[str, Any]
    env_id: HostOrDevice
    episode_id: HostOrDevice
    step: HostOrDevice
    valid: Any = None

    def __init__(
        self,
        obs: Any,
        action: Any,
        reward: HostOrDevice,
        terminated: HostOrDevice,
        truncated: HostOrDevice,
        next_obs: Any = None,
        extras: dict[str, Any] | None = None,
        env_id: HostOrDevice | None = None,
        episode_id: HostOrDevice | None = None,
        step: HostOrDevice | None = None,
        valid: Any = None,
        *,
        next_obs_store: Any = None,
    ) -> None:
        if valid is None and hasattr(reward, "shape"):
            ones = np.ones if isinstance(reward, np.ndarray) else jax.numpy.ones
            valid = ones(reward.shape, np.bool_)
        self._set_fields(locals())

    def split_episodes(self) -> list[Episode]:
        """Splits into episodes, env by env, in time order. Those still running at
        the end are not ``is_done``; those begun before the first step have
        ``start_step > 0`` (``is_complete``: seen from first to last step)."""
        host = self.dense().to_numpy()
        episodes: list[Episode] = []
        if host.num_steps == 0:
            return episodes
        for b in range(host.num_envs):
            ids = host.episode_id[:, b]
            cuts = [0, *(np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist(), host.num_steps]
            for start, stop in itertools.pairwise(cuts):
                if host.step[start, b] < 0:  # an env's reset step: no transition
                    start += 1
                    if start == stop:
                        continue
                episodes.append(_episode_from(host, b, start, stop))
        return episodes

    def save(self, path: str | os.PathLike[str]) -> None:
        """Saves to one ``.npz`` file (no pickle); :meth:`load` restores it exactly (a
        compact trajectory is saved, and loads, dense)."""
        self._save(path, self._file_fields())

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, max_bytes: int | None = MAX_LOAD_BYTES
    ) -> Trajectory:
        """Loads a file written by :meth:`save`, trusting nothing in it.

        Only the members its spec names are read (never pickle), each once and checked
        against its own header before any memory is allocated; fields must have the
        keys, ``[T, B]`` leading shapes and dtype kinds a trajectory has (flags bool, ids
        and steps integer, rewards float, ``next_obs`` shaped like ``obs``).

        Args:
            path: the file.
            max_bytes: the most bytes the arrays may take in memory (None: no cap).

        Raises:
            InvalidArgumentError: the file is not a valid trajectory file; the message
                names the field (or member) at fault and what is wrong with it.
        """
        with TrajectoryFile(path, cls, max_bytes) as file:
            spec = file.read_spec()
            # valid is optional: files saved before it existed load as all valid.
            fields = file.read_fields(spec.get("fields"), cls._file_fields(), optional=("valid",))
        lead = lead_shape(fields, "reward", file.error)
        # The ids a Trajectory built by hand may leave out (None) are saved as None.
        ids = ("env_id", "episode_id", "step")
        check_fields(fields, lead, "reward's", file.error, may_be_none=ids)
        return cls(**fields)


# After the class: flax's dataclass transform sets its own replace on the class.
Trajectory.replace = replace_fields  # type: ignore[method-assign]


def _episode_from(traj: Trajectory, b: int, start: int, stop: int) -> Episode:
    """Steps ``start:stop`` of env ``b``. An invalid last slot (a failed step) is cut
    off, and the episode ends ``faulty`` with that slot's ``obs``."""
    last = stop - 1
    faulty = not traj.valid[last, b]
    steps = slice(start, last if faulty else stop)
    at = last if faulty else start
    return Episode(
        **cut_steps(traj, (steps, b), (last, b), traj.obs if faulty else traj.next_obs),
        terminated=not faulty and bool(traj.terminated[last, b]),
        truncated=faulty or bool(traj.truncated[last, b]),
        episode_id=int(traj.episode_id[at, b]),
        env_id=int(traj.env_id[at, b]),
        start_step=int(traj.step[start, b]),
        faulty=faulty,
    )

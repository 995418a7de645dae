"""What one step of a vector env returns (:class:`BatchStep`), and which envs a send
steps (:data:`EnvIds`): the values the backends hand the samplers
(:mod:`jaxrunner._src.backends.base` has the protocol itself)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxrunner.errors import InvalidArgumentError


class BatchStep(NamedTuple):
    """What one ``step_batch`` call returns. Arrays are views of the env's buffers:
    valid until its next call; copy what you keep."""

    obs: Any
    """[B, ...] observations to act on next (reset ones where an episode ended)."""
    next_obs: Any
    """[B, ...] true next observations (the final one where an episode ended)."""
    reward: np.ndarray
    """[B] float64."""
    terminated: np.ndarray
    """[B] bool."""
    truncated: np.ndarray
    """[B] bool."""
    infos: Sequence[dict[str, Any]]
    """Per-env step infos (the final info where an episode ended)."""
    reset_infos: Mapping[int, dict[str, Any]]
    """Infos of the resets done in this call, by env index."""
    failed: np.ndarray | None = None
    """[B] bool, or None when no sub-env failed: the sub-envs whose step failed and
    were restarted (only with a ``restart_policy``). Their slots hold no transition:
    reward 0, both flags False, and ``obs`` and ``next_obs`` the new sub-env's reset
    observation. Their step infos are ``{}``; ``errors`` holds what went wrong."""
    errors: dict[int, BaseException] | None = None
    """The failures of this call, by env index: step failures (``failed``) and
    reset failures after a good step (that transition stays valid). Each is the error
    raised without a restart policy: an :class:`~jaxrunner.errors.EnvError` naming the
    sub-env, with the env's own exception as its ``__cause__``, or the error of a check
    the env failed (``InvalidStepError``, ``WorkerError``, ...)."""
    env_ids: slice | np.ndarray | None = None
    """Which envs these rows are: a ``slice`` of env indices (a contiguous block) or
    an int array (any set, in row order). ``None`` means every env, in order."""
    reset_rows: np.ndarray | None = None
    """[B] bool, or None when there are none: rows that are the env's own reset step
    (EnvPool's NEXT_STEP autoreset, kept by ``make_vec(..., backend="envpool",
    keep_reset_steps=True)``), the call after an episode ended. The env ignored their
    action: no transition (reward 0, both flags False), ``next_obs`` and ``obs`` the new
    episode's first observation. Not a fault: the runner records them ``valid=False``
    with ``step`` -1 and counts them in no metric (see
    :class:`~jaxrunner._src.samplers.episode_ids.EpisodeBook`)."""


EnvIds = slice | np.ndarray | None
"""The envs a :meth:`VectorEnv.send` steps: a slice, an int array, or None for all."""


def block_rows(env_ids: EnvIds, num_envs: int, where: str) -> tuple[int, int]:
    """The rows ``[lo, hi)`` of a lockstep send's ``env_ids``: None (every env) or a
    non-empty slice with step 1 (else an error naming the caller, ``where``)."""
    if env_ids is None:
        return 0, num_envs
    if isinstance(env_ids, slice):
        lo, hi, step = env_ids.indices(num_envs)
        if step == 1 and lo < hi:
            return lo, hi
    raise InvalidArgumentError(
        f"{where}.send(env_ids={env_ids!r}): expected None (every env) or a non-empty "
        f"slice of env indices with step 1 within [0, {num_envs}) (lockstep sends)."
    )

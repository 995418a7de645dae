"""Checkpoints of an :class:`~jaxrunner.EnvRunner`: save, and resume exactly.
See docs/checkpoints.md."""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.backends.snapshots import SnapshotRefusedError
from jaxrunner._src.checkpoints.env_runner_file import (
    EPISODE_SCALARS,
    FORMAT,
    VERSION,
    Checkpoint,
    CheckpointFile,
)
from jaxrunner._src.checkpoints.writer import (
    put_snapshots,
    put_steps,
    put_tree,
    write_checkpoint,
)
from jaxrunner._src.core.episode import Episode
from jaxrunner._src.core.runner_state import Runner
from jaxrunner._src.core.seeds import env_seeds
from jaxrunner.errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True)
class RestoreReport:
    """What :meth:`EnvRunner.restore` (or ``MultiAgentRunner.restore``) restored."""

    envs_restored: bool
    """The envs are in their saved state: sampling continues the saved episodes exactly.
    False: every env was reset and started a new episode (see ``note``)."""
    note: str
    """How the envs were resumed, and why."""


# -- writing -------------------------------------------------------------------------------


def _put_episodes(
    arrays: dict[str, np.ndarray], prefix: str, episodes: list[Episode]
) -> list[dict[str, Any]]:
    metas = []
    for k, episode in enumerate(episodes):
        meta: dict[str, Any] = {f: t(getattr(episode, f)) for f, t in EPISODE_SCALARS.items()}
        meta.update(put_steps(arrays, f"{prefix}/{k}", episode))
        metas.append(meta)
    return metas


def put_env_snapshot(
    arrays: dict[str, np.ndarray], envs: Any, can_snapshot: bool
) -> tuple[str, str]:
    """Adds the sub-envs' pickles (``envs.snapshot_sub_envs()``) where the backend can
    take them; returns the ``(envs, envs_note)`` metadata: ``"pickle"`` or ``"none"``
    and why."""
    if not can_snapshot:
        return "none", f"{type(envs).__name__} cannot snapshot its sub-envs"
    try:
        blobs = envs.snapshot_sub_envs()
    except Exception as err:  # a sub-env that does not pickle: resume restarts episodes
        return "none", f"a sub-env could not be pickled ({type(err).__name__}: {err})"
    put_snapshots(arrays, blobs)
    return "pickle", "the sub-envs are pickled"


# -- save and restore ----------------------------------------------------------------------


def save(runner: Runner, path: str | os.PathLike) -> None:
    """Writes ``runner``'s state to ``path`` (see docs/checkpoints.md); atomic: a
    crash mid-write leaves any earlier file at ``path`` whole."""
    arrays: dict[str, np.ndarray] = {}
    sampler = runner.sampler
    put_tree(arrays, "params", runner.get_params())
    put_tree(arrays, "sampler", sampler.get_state())
    state = runner.state
    metrics_paths = put_tree(arrays, "metrics", state.metrics.get_state())
    envs = runner.envs
    if isinstance(envs, JaxVectorEnv):  # pure: its states are in the sampler's state
        envs_kind, envs_note = "pytree", "the env states are arrays in the sampler's state"
    else:
        envs_kind, envs_note = put_env_snapshot(arrays, envs, envs.capabilities.can_snapshot)
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "sampler": type(sampler).__name__,
        "num_envs": int(runner.envs.num_envs),
        "seed": runner.seed,
        "rollout_length": runner.rollout_length,
        "envs": envs_kind,
        "envs_note": envs_note,
        "metrics": metrics_paths,
        "fragments": _put_episodes(arrays, "fragments", list(state.episodes.fragments.values())),
        "finished": _put_episodes(arrays, "finished", state.finished),
    }
    write_checkpoint(path, arrays, meta)


def restore(
    runner: Runner, path: str | os.PathLike, load_env_pickles: bool, max_bytes: int
) -> RestoreReport:
    """Makes ``runner`` (new, built as the saved one) continue where the checkpoint at
    ``path`` left off; see :meth:`EnvRunner.restore`. The file is read and checked whole
    before anything of the runner changes."""
    return _apply(
        runner, CheckpointFile(runner, path).read(load_env_pickles, max_bytes), os.fspath(path)
    )


def resume_envs(
    runner_name: str,
    sampler: Any,
    ckpt: Any,
    restore_sub_envs: Callable[[Sequence[bytes]], None],
    restart: Callable[[list[int]], None],
    num_envs: int,
    path: str,
) -> tuple[bool, str]:
    """The fallible steps of a restore, all or none: installs ``ckpt.sampler_state`` in
    ``sampler``, then resumes the envs: from ``ckpt.env_snapshots`` (by
    ``restore_sub_envs``) where there are any, else by ``restart(seeds)``, every env
    reset with ``env_seeds((ckpt.seed, ckpt.steps_done), num_envs)`` (new episodes),
    unless ``ckpt.envs`` is ``"pytree"`` (the envs are in the sampler state). If a step
    fails, the sampler gets its previous state back and the error propagates.

    Returns:
        ``(envs_restored, note)``: whether the envs resume their saved episodes, and
        the note for the :class:`RestoreReport` (and the warning when they do not).
    """
    envs_restored = ckpt.envs == "pytree"
    note = ckpt.envs_note
    previous = sampler.get_state()
    sampler.set_state(ckpt.sampler_state)  # refuses (runner unchanged) or takes it whole
    try:
        if ckpt.env_snapshots is not None:
            try:
                restore_sub_envs(list(ckpt.env_snapshots))
            except SnapshotRefusedError as err:
                raise InvalidArgumentError(
                    f"{runner_name}.restore({path!r}): the checkpoint's sub-env pickle "
                    f"envs/{err.index} {err.problem}; the runner is unchanged. Restore only "
                    f"checkpoints written by {runner_name}.save, into a runner built as the "
                    "saved one."
                ) from err
            envs_restored, note = True, "the sub-envs were unpickled from the checkpoint"
        elif ckpt.envs == "pickle":
            note = (
                "the checkpoint holds pickled sub-envs, which are only loaded with "
                "restore(path, load_env_pickles=True) (unpickling runs code from the file: "
                "only for checkpoints you trust)"
            )
        if not envs_restored:
            restart(env_seeds((ckpt.seed, ckpt.steps_done), num_envs))
    except BaseException:
        sampler.set_state(previous)
        raise
    if not envs_restored:
        note = (
            f"every env was reset and started a new episode ({note}); the episodes under way "
            "when it was saved are abandoned"
        )
    return envs_restored, note


def _apply(runner: Runner, ckpt: Checkpoint, path: str) -> RestoreReport:
    """Installs ``ckpt``. The steps that can fail (the sampler refusing a state, the
    sub-env pickles, the fresh resets) come first and are undone if one fails; the rest
    are assignments of values already checked."""
    sampler = runner.sampler

    def restart(seeds: list[int]) -> None:
        sampler.restart_episodes(seeds)
        if runner.connectors is not None:  # e.g. ScaleReward's running returns restart too
            state = runner.connectors.restart_episodes(runner.get_connector_state())
            runner.set_connector_state(state)

    envs_restored, note = resume_envs(
        "EnvRunner",
        sampler,
        ckpt,
        lambda blobs: runner.envs.restore_sub_envs(blobs),
        restart,
        int(runner.envs.num_envs),
        path,
    )
    runner.set_params(ckpt.params)
    state = runner.state
    state.metrics.set_state(ckpt.metrics_state)
    runner.seed = ckpt.seed
    state.finished = list(ckpt.finished)
    state.episodes.set_fragments(ckpt.fragments if envs_restored else [])
    if not envs_restored:
        warnings.warn(f"EnvRunner.restore({path!r}): {note}.", stacklevel=4)
    return RestoreReport(envs_restored=envs_restored, note=note)

"""Checkpoints of either runner, over the state it hands in (:class:`RunnerParts`): save,
and resume exactly. See docs/checkpoints.md."""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from typing import Any

import jax
import numpy as np

from jaxrunner._src.arg_checks import check_path
from jaxrunner._src.backends.snapshots import SnapshotRefusedError
from jaxrunner._src.checkpoints.checkpoint_file import (
    FORMAT,
    VERSION,
    Checkpoint,
    CheckpointFile,
    identity,
)
from jaxrunner._src.checkpoints.format import META, Part, array_name, is_key, path_leaves
from jaxrunner._src.checkpoints.kept_episodes import EPISODE_SCALARS, kept_episodes
from jaxrunner._src.checkpoints.live_episodes import put_live_episodes
from jaxrunner._src.core.npz_file import write_npz
from jaxrunner._src.core.runner_state import RunnerParts
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


# -- save ----------------------------------------------------------------------------------


def save(parts: RunnerParts, path: str | os.PathLike) -> None:
    """Writes the runner's state to ``path`` (see docs/checkpoints.md); atomic: a crash
    mid-write leaves any earlier file at ``path`` whole."""
    path = check_path(f"{parts.runner}.save", "path", path)
    arrays: dict[str, np.ndarray] = {}
    state = parts.state
    put_tree(arrays, "params", dict(state.params))
    put_tree(arrays, "sampler", parts.sampler.get_state())
    metrics_paths = put_tree(arrays, "metrics", state.metrics.get_state())
    if parts.sampler.on_device:
        envs_kind, envs_note = "pytree", "the env states are arrays in the sampler's state"
    else:
        envs_kind, envs_note = _put_env_snapshots(arrays, parts.envs)
        if envs_kind == "none" and parts.envs.can_snapshot:  # said now, not at the restore
            warnings.warn(
                f"{parts.runner}.save({path!r}): {envs_note}, so the checkpoint "
                "holds no sub-envs: a restore starts new episodes.",
                stacklevel=3,
            )
    live = envs_kind == "pickle" and put_live_episodes(arrays, parts)
    meta = {
        "format": FORMAT,
        "version": VERSION,
        **identity(parts),
        "seed": parts.seed,
        "rollout_length": parts.rollout_length,
        "envs": envs_kind,
        "envs_note": envs_note,
        "live_episodes": live,
        "info_names": parts.sampler.info_names(),
        "metrics": metrics_paths,
        **{key: _put_episodes(arrays, key, kept) for key, kept in kept_episodes(parts).items()},
    }
    arrays[META] = np.array(json.dumps(meta))
    write_npz(path, arrays, f"{parts.runner}.save")


def put_tree(arrays: dict[str, np.ndarray], prefix: str, tree: Any) -> list[list[Part]]:
    """Adds the leaves of ``tree`` as ``prefix/<path>`` (typed keys as their raw data);
    returns the paths, saved in the metadata."""
    paths = []
    for parts, leaf in path_leaves(tree)[0]:
        value = np.asarray(jax.device_get(jax.random.key_data(leaf) if is_key(leaf) else leaf))
        if value.dtype.kind == "V":  # bfloat16 (ml_dtypes): float32 holds it exactly, .npy reads it
            value = value.astype(np.float32)
        arrays[array_name(prefix, parts)] = value
        paths.append(parts)
    return paths


def _put_env_snapshots(arrays: dict[str, np.ndarray], envs: Any) -> tuple[str, str]:
    """Adds the sub-envs' pickles where it can; returns ``("pickle" | "none", why)``."""
    if not envs.can_snapshot:
        return "none", f"{type(envs).__name__} cannot snapshot its sub-envs"
    try:
        blobs = envs.snapshot_sub_envs()
    except Exception as err:  # a sub-env that does not pickle: resume restarts episodes
        return "none", f"a sub-env could not be pickled ({type(err).__name__}: {err})"
    for i, blob in enumerate(blobs):  # read only on request
        arrays[f"envs/{i}"] = np.frombuffer(blob, np.uint8)
    return "pickle", "the sub-envs are pickled"


def _put_episodes(
    arrays: dict[str, np.ndarray], prefix: str, episodes: list[Any]
) -> list[dict[str, Any]]:
    metas = []
    for k, episode in enumerate(episodes):
        scalars = EPISODE_SCALARS[type(episode)]
        meta: dict[str, Any] = {f: t(getattr(episode, f)) for f, t in scalars.items()}
        steps = {"obs": episode.obs, "action": episode.action, "reward": episode.reward}
        meta["paths"] = put_tree(arrays, f"{prefix}/{k}", steps)
        meta["extras"] = put_tree(arrays, f"{prefix}/{k}/extras", dict(episode.extras))
        if "agent_id" in scalars:
            arrays[f"{prefix}/{k}/env_step"] = np.asarray(episode.env_step, np.int64)
        metas.append(meta)
    return metas


# -- restore -------------------------------------------------------------------------------


def restore(
    parts: RunnerParts, path: str | os.PathLike, load_env_pickles: bool, max_bytes: int
) -> RestoreReport:
    """Makes the runner of ``parts`` (built as the saved one) continue where the checkpoint
    at ``path`` left off (``parts.seed`` set to the saved one). The file is checked whole
    first; the steps that can fail come next and are undone if one fails."""
    path = check_path(f"{parts.runner}.restore", "path", path)
    ckpt = CheckpointFile(parts, path).read(load_env_pickles, max_bytes)
    envs_restored, note = _resume_envs(parts, ckpt, path)
    state = parts.state
    state.params.update(ckpt.params)
    state.metrics.set_state(ckpt.metrics_state)
    parts.seed = ckpt.seed
    state.finished = list(ckpt.kept["finished"])
    state.episodes.set_fragments(ckpt.kept["fragments"] if envs_restored else ())
    state.callback_episodes.set_fragments(ckpt.kept["callback_fragments"] if envs_restored else ())
    if ckpt.info_names is not None:
        parts.sampler.set_info_names(ckpt.info_names)
    if not envs_restored:
        warnings.warn(f"{parts.runner}.restore({path!r}): {note}.", stacklevel=3)
    return RestoreReport(envs_restored=envs_restored, note=note)


def _resume_envs(parts: RunnerParts, ckpt: Checkpoint, path: str) -> tuple[bool, str]:
    """The fallible steps of a restore, all or none: the sampler state, then the envs
    (unpickled, or reset with fresh seeds unless in the sampler state). Returns
    ``(envs_restored, note)``."""
    sampler, runner = parts.sampler, parts.runner
    envs_restored = ckpt.envs == "pytree"
    note = ckpt.envs_note
    previous, previous_live = sampler.get_state(), sampler.live_episodes() or None
    live = ckpt.live_episodes
    if live is None and not envs_restored and ckpt.env_snapshots is None:
        live = previous_live  # not started here: restart_episodes starts them, once
    # refuses (runner unchanged) or takes it whole
    sampler.set_state(ckpt.sampler_state, live)
    try:
        if ckpt.env_snapshots is not None:
            try:
                parts.envs.restore_sub_envs(list(ckpt.env_snapshots))
            except SnapshotRefusedError as err:
                raise InvalidArgumentError(
                    f"{runner}.restore({path!r}): the checkpoint's sub-env pickle "
                    f"envs/{err.index} {err.problem}; the runner is unchanged. Restore only "
                    f"checkpoints written by {runner}.save, into a runner built as the "
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
            seeds = env_seeds((ckpt.seed, ckpt.steps_done), int(parts.envs.num_envs))
            sampler.restart_episodes(seeds)
            parts.restart_connectors()
    except BaseException:
        sampler.set_state(previous, previous_live)
        raise
    if not envs_restored:
        note = (
            f"every env was reset and started a new episode ({note}); the episodes under way "
            "when it was saved are abandoned"
        )
    return envs_restored, note

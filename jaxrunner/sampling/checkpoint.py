"""Checkpoints of an :class:`~jaxrunner.EnvRunner`: save, and resume exactly.

Format: one ``.npz`` file (numpy's zip of ``.npy`` arrays, read with
``allow_pickle=False``) plus a JSON document stored in it as ``__meta__``. Array names
are tree paths (``params/module/Dense_0/kernel``); the JSON holds the format version,
the runner's shape (sampler, ``num_envs``, seed, rollout length), the paths of the
trees restored without a template, and each kept episode's scalar fields.

What is saved: the params; the sampler's state (every env's policy key and step
count, recurrent carries, episode ids, first steps and returns so far, the
episode-start flags, the latest observations; for a pure-JAX env, the env states); the
metrics' counters, windows and perf timers; the episodes ``sample_episodes`` holds
(fragments of unfinished ones, finished ones not yet returned).

The envs. A :class:`~jaxrunner.JaxVectorEnv`'s state is a pytree of arrays, always
saved and restored. A host backend that declares ``capabilities.can_snapshot`` (the
sync backend) adds a pickle of each sub-env, stored as bytes in the ``.npz``: it is
only unpickled when the caller opts in (``restore(path, load_env_pickles=True)``),
since unpickling a file runs code from it. Without it (or for backends that cannot
snapshot), resuming resets every env with fresh seeds and starts new episodes in all
of them, and says so (a :class:`RestoreReport` and a warning); everything else is
restored.

Restoring reads the whole file into a checked, frozen
:class:`~jaxrunner.sampling.checkpoint_file.Checkpoint` first (see
:mod:`jaxrunner.sampling.checkpoint_file`: a damaged or hostile file is refused with an
:class:`~jaxrunner.errors.InvalidArgumentError` naming the field), then applies it; a
refused restore leaves the runner as it was.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from jaxrunner.envs.jax_env import JaxVectorEnv
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.sampling.checkpoint_file import (
    EPISODE_SCALARS,
    FORMAT,
    META,
    VERSION,
    Checkpoint,
    CheckpointFile,
    Part,
    array_name,
    is_key,
    part_of,
)
from jaxrunner.sampling.seeds import env_seeds
from jaxrunner.trajectory import Episode

if TYPE_CHECKING:
    from jaxrunner.sampling.runner import EnvRunner


@dataclasses.dataclass(frozen=True)
class RestoreReport:
    """What :meth:`EnvRunner.restore` restored."""

    envs_restored: bool
    """The envs are in their saved state: sampling continues the saved episodes exactly.
    False: every env was reset and started a new episode (see ``note``)."""
    note: str
    """How the envs were resumed, and why."""


# -- writing -------------------------------------------------------------------------------


def put_tree(arrays: dict[str, np.ndarray], prefix: str, tree: Any) -> list[list[Part]]:
    """Adds the leaves of ``tree`` as ``prefix/<path>`` (typed keys as their raw data);
    returns the paths, saved in the metadata."""
    paths = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        parts = [part_of(e) for e in path]
        value = jax.random.key_data(leaf) if is_key(leaf) else leaf
        arrays[array_name(prefix, parts)] = np.asarray(jax.device_get(value))
        paths.append(parts)
    return paths


def _put_episodes(
    arrays: dict[str, np.ndarray], prefix: str, episodes: list[Episode]
) -> list[dict[str, Any]]:
    metas = []
    for k, episode in enumerate(episodes):
        data = {"obs": episode.obs, "action": episode.action, "reward": episode.reward}
        meta: dict[str, Any] = {f: t(getattr(episode, f)) for f, t in EPISODE_SCALARS.items()}
        meta["paths"] = put_tree(arrays, f"{prefix}/{k}", data)
        meta["extras"] = put_tree(arrays, f"{prefix}/{k}/extras", dict(episode.extras))
        metas.append(meta)
    return metas


# -- save and restore ----------------------------------------------------------------------


def save(runner: EnvRunner, path: str | os.PathLike) -> None:
    """Writes ``runner``'s state to ``path`` (see the module docstring); atomic: a
    crash mid-write leaves any earlier file at ``path`` whole."""
    arrays: dict[str, np.ndarray] = {}
    sampler = runner.sampler
    put_tree(arrays, "params", runner.get_params())
    put_tree(arrays, "sampler", sampler.get_state())
    metrics_paths = put_tree(arrays, "metrics", runner._metrics.get_state())
    envs_kind, envs_note = _put_env_snapshot(arrays, runner)
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
        "fragments": _put_episodes(arrays, "fragments", list(runner._fragments.values())),
        "finished": _put_episodes(arrays, "finished", runner._finished),
    }
    arrays[META] = np.array(json.dumps(meta))
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


def _put_env_snapshot(arrays: dict[str, np.ndarray], runner: EnvRunner) -> tuple[str, str]:
    """Adds the sub-envs' pickles where the backend can take them; returns (kind, note)."""
    envs = runner.envs
    if isinstance(envs, JaxVectorEnv):  # pure: its states are in the sampler's state
        return "pytree", "the env states are arrays in the sampler's state"
    if not envs.capabilities.can_snapshot:
        return "none", f"{type(envs).__name__} cannot snapshot its sub-envs"
    try:
        blobs = envs.snapshot_sub_envs()
    except Exception as err:  # a sub-env that does not pickle: resume restarts episodes
        return "none", f"a sub-env could not be pickled ({type(err).__name__}: {err})"
    for i, blob in enumerate(blobs):
        arrays[f"envs/{i}"] = np.frombuffer(blob, np.uint8)
    return "pickle", "the sub-envs are pickled"


def restore(runner: EnvRunner, path: str | os.PathLike, load_env_pickles: bool) -> RestoreReport:
    """Makes ``runner`` (new, built as the saved one) continue where the checkpoint at
    ``path`` left off; see :meth:`EnvRunner.restore`. The file is read and checked whole
    before anything of the runner changes."""
    return _apply(runner, CheckpointFile(runner, path).read(load_env_pickles), os.fspath(path))


def _apply(runner: EnvRunner, ckpt: Checkpoint, path: str) -> RestoreReport:
    """Installs ``ckpt``. The steps that can fail (the sampler refusing a state, the
    sub-env pickles, the fresh resets) come first and are undone if one fails; the rest
    are assignments of values already checked."""
    sampler = runner.sampler
    envs_restored = ckpt.envs == "pytree"
    note = ckpt.envs_note
    previous = sampler.get_state()
    sampler.set_state(ckpt.sampler_state)  # refuses (runner unchanged) or takes it whole
    try:
        if ckpt.env_snapshots is not None:
            _restore_sub_envs(runner, ckpt.env_snapshots, path)
            envs_restored, note = True, "the sub-envs were unpickled from the checkpoint"
        elif ckpt.envs == "pickle":
            note = (
                "the checkpoint holds pickled sub-envs, which are only loaded with "
                "restore(path, load_env_pickles=True) (unpickling runs code from the file: "
                "only for checkpoints you trust)"
            )
        if not envs_restored:
            num_envs = int(runner.envs.num_envs)
            sampler.restart_episodes(env_seeds((ckpt.seed, ckpt.steps_done), num_envs))
            if runner.connectors is not None:  # e.g. ScaleReward's running returns restart too
                state = runner.connectors.restart_episodes(runner.get_connector_state())
                runner.set_connector_state(state)
    except BaseException:
        sampler.set_state(previous)
        raise
    runner.set_params(ckpt.params)
    runner._metrics.set_state(ckpt.metrics_state)
    runner.seed = ckpt.seed
    runner._finished = list(ckpt.finished)
    runner._fragments = {e.env_id: e for e in ckpt.fragments} if envs_restored else {}
    if not envs_restored:
        note = (
            f"every env was reset and started a new episode ({note}); the episodes under way "
            "when it was saved are abandoned"
        )
        warnings.warn(f"EnvRunner.restore({path!r}): {note}.", stacklevel=4)
    return RestoreReport(envs_restored=envs_restored, note=note)


def _restore_sub_envs(runner: EnvRunner, snapshots: tuple[bytes, ...], path: str) -> None:
    """Replaces the sub-envs by their pickles, all or none."""
    try:
        runner.envs.restore_sub_envs(list(snapshots))
    except InvalidArgumentError as err:
        raise InvalidArgumentError(
            f"EnvRunner.restore({path!r}): the checkpoint's sub-env pickles (envs/0, envs/1, "
            f"...) were refused, and the runner is unchanged: {err}"
        ) from err


__all__ = ["RestoreReport", "put_tree", "restore", "save"]

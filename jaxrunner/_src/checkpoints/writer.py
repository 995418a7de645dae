"""Writing a checkpoint: its trees, episode steps and env snapshots as arrays, then the file."""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from jaxrunner._src.checkpoints.format import META, Part, array_name, is_key, part_of


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


def put_steps(arrays: dict[str, np.ndarray], prefix: str, episode: Any) -> dict[str, Any]:
    """Adds an episode's step arrays (``obs``, ``action``, ``reward``, ``extras``) below
    ``prefix``; returns their paths for its metadata (``paths``, ``extras``)."""
    data = {"obs": episode.obs, "action": episode.action, "reward": episode.reward}
    return {
        "paths": put_tree(arrays, prefix, data),
        "extras": put_tree(arrays, f"{prefix}/extras", dict(episode.extras)),
    }


def put_snapshots(arrays: dict[str, np.ndarray], blobs: list[bytes]) -> None:
    """Adds one pickle per sub-env, as bytes (``envs/<i>``: read only on request)."""
    for i, blob in enumerate(blobs):
        arrays[f"envs/{i}"] = np.frombuffer(blob, np.uint8)


def write_checkpoint(path: str | os.PathLike, arrays: dict[str, np.ndarray], meta: Any) -> None:
    """Writes ``arrays`` and the JSON ``meta`` to ``path``; atomic: a crash mid-write
    leaves any earlier file at ``path`` whole."""
    arrays = {**arrays, META: np.array(json.dumps(meta))}
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        # The stub lets a name collide with savez's allow_pickle; ours are paths "a/b".
        np.savez(f, **arrays)  # type: ignore[arg-type]
    os.replace(tmp, path)

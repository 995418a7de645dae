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
from jaxrunner.sampling.seeds import env_seeds
from jaxrunner.trajectory import Episode

if TYPE_CHECKING:
    from jaxrunner.sampling.runner import EnvRunner

FORMAT = "jaxrunner.EnvRunner checkpoint"
VERSION = 1
META = "__meta__"

Part = str | int
"""One step of a tree path: a dict key or attribute name, or a sequence index."""


@dataclasses.dataclass(frozen=True)
class RestoreReport:
    """What :meth:`EnvRunner.restore` restored."""

    envs_restored: bool
    """The envs are in their saved state: sampling continues the saved episodes exactly.
    False: every env was reset and started a new episode (see ``note``)."""
    note: str
    """How the envs were resumed, and why."""


# -- trees <-> named arrays ----------------------------------------------------------------


def _part(entry: Any) -> Part:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            value = getattr(entry, attr)
            return value if isinstance(value, int) else str(value)
    raise TypeError(f"unsupported tree path entry {entry!r}")


def _name(prefix: str, parts: list[Part]) -> str:
    return "/".join([prefix, *(str(p) for p in parts)])


def _is_key(leaf: Any) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def put_tree(arrays: dict[str, np.ndarray], prefix: str, tree: Any) -> list[list[Part]]:
    """Adds the leaves of ``tree`` as ``prefix/<path>`` (typed keys as their raw data);
    returns the paths, for :func:`get_tree`."""
    paths = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        parts = [_part(e) for e in path]
        value = jax.random.key_data(leaf) if _is_key(leaf) else leaf
        arrays[_name(prefix, parts)] = np.asarray(jax.device_get(value))
        paths.append(parts)
    return paths


def get_tree(arrays: Any, prefix: str, paths: list[list[Part]]) -> Any:
    """The tree :func:`put_tree` saved, rebuilt from its paths: string steps as dicts,
    integer steps as tuples (a lone leaf for an empty path)."""
    if paths == [[]]:
        return arrays[prefix + "/"] if prefix + "/" in arrays else arrays[prefix]
    root: dict[Part, Any] = {}
    for parts in paths:
        node = root
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = arrays[_name(prefix, parts)]

    def build(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        if node and all(isinstance(k, int) for k in node):
            return tuple(build(node[k]) for k in sorted(node))
        return {k: build(v) for k, v in node.items()}

    return build(root)


def get_like(arrays: Any, prefix: str, template: Any, what: str) -> Any:
    """The tree saved under ``prefix``, in ``template``'s structure, each leaf checked
    against the template's shape and dtype (device arrays where the template has them)."""
    leaves = []
    flat, treedef = jax.tree_util.tree_flatten_with_path(template)
    for path, like in flat:
        name = _name(prefix, [_part(e) for e in path])
        if name not in arrays:
            raise InvalidArgumentError(
                f"EnvRunner.restore(): the checkpoint has no {name!r}: its {what} has another "
                "structure than this runner's. Restore into a runner built as the saved one "
                "(same policy, envs, spaces and connectors). A checkpoint saved by an older "
                "jaxrunner whose state had another layout (e.g. connector statistics before "
                "their frozen flag) cannot be restored by this one."
            )
        value = arrays[name]
        want = jax.random.key_data(like) if _is_key(like) else like
        want_shape, want_dtype = np.shape(want), np.asarray(want).dtype
        if value.shape != want_shape or value.dtype != want_dtype:
            raise InvalidArgumentError(
                f"EnvRunner.restore(): {name!r} is {value.dtype}{list(value.shape)} in the "
                f"checkpoint, but this runner's {what} has {want_dtype}{list(want_shape)}. "
                "Restore into a runner built as the saved one (same policy, envs, num_envs)."
            )
        if _is_key(like):
            leaves.append(jax.random.wrap_key_data(value, impl=jax.random.key_impl(like)))
        elif isinstance(like, jax.Array):
            leaves.append(jax.device_put(value))
        else:
            leaves.append(np.array(value))
    return jax.tree_util.tree_unflatten(treedef, leaves)


# -- episodes ------------------------------------------------------------------------------

_SCALAR = {
    "terminated": bool,
    "truncated": bool,
    "episode_id": int,
    "env_id": int,
    "start_step": int,
    "faulty": bool,
}
"""The scalar fields of an :class:`Episode`, kept in the JSON."""
_EPISODE_FIELDS = tuple(_SCALAR)


def _put_episodes(
    arrays: dict[str, np.ndarray], prefix: str, episodes: list[Episode]
) -> list[dict[str, Any]]:
    metas = []
    for k, episode in enumerate(episodes):
        data = {"obs": episode.obs, "action": episode.action, "reward": episode.reward}
        meta: dict[str, Any] = {f: _SCALAR[f](getattr(episode, f)) for f in _EPISODE_FIELDS}
        meta["paths"] = put_tree(arrays, f"{prefix}/{k}", data)
        meta["extras"] = put_tree(arrays, f"{prefix}/{k}/extras", dict(episode.extras))
        metas.append(meta)
    return metas


def _get_episodes(arrays: Any, prefix: str, metas: list[dict[str, Any]]) -> list[Episode]:
    episodes = []
    for k, meta in enumerate(metas):
        data = get_tree(arrays, f"{prefix}/{k}", meta["paths"])
        extras = get_tree(arrays, f"{prefix}/{k}/extras", meta["extras"]) if meta["extras"] else {}
        scalars = {f: _SCALAR[f](meta[f]) for f in _EPISODE_FIELDS}
        episodes.append(Episode(data["obs"], data["action"], data["reward"], extras, **scalars))
    return episodes


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
    ``path`` left off; see :meth:`EnvRunner.restore`."""
    with np.load(os.fspath(path), allow_pickle=False) as data:
        arrays = dict(data)
    if META not in arrays:
        raise InvalidArgumentError(
            f"EnvRunner.restore({os.fspath(path)!r}): not a jaxrunner checkpoint (no {META}); "
            "write one with EnvRunner.save(path)."
        )
    meta = json.loads(str(arrays.pop(META)))
    _check_meta(runner, meta, os.fspath(path))
    params = get_like(arrays, "params", runner.get_params(), "params")
    sampler = runner.sampler
    state = get_like(arrays, "sampler", sampler.get_state(), "sampler state")
    envs_restored = meta["envs"] == "pytree"
    note = meta["envs_note"]
    if meta["envs"] == "pickle":
        if load_env_pickles:
            runner.envs.restore_sub_envs(
                [arrays[f"envs/{i}"].tobytes() for i in range(meta["num_envs"])]
            )
            envs_restored, note = True, "the sub-envs were unpickled from the checkpoint"
        else:
            note = (
                "the checkpoint holds pickled sub-envs, which are only loaded with "
                "restore(path, load_env_pickles=True) (unpickling runs code from the file: "
                "only for checkpoints you trust)"
            )
    runner.set_params(params)
    runner._metrics.set_state(get_tree(arrays, "metrics", meta["metrics"]))
    sampler.set_state(state)
    runner.seed = int(meta["seed"])
    runner._finished = _get_episodes(arrays, "finished", meta["finished"])
    runner._fragments = {}
    if envs_restored:
        runner._fragments = {
            e.env_id: e for e in _get_episodes(arrays, "fragments", meta["fragments"])
        }
    else:
        steps_done = int(state["book"]["steps_done"])
        sampler.restart_episodes(env_seeds((runner.seed, steps_done), meta["num_envs"]))
        if runner.connectors is not None:  # e.g. ScaleReward's running returns restart too
            state = runner.connectors.restart_episodes(runner.get_connector_state())
            runner.set_connector_state(state)
        note = (
            f"every env was reset and started a new episode ({note}); the episodes under way "
            "when it was saved are abandoned"
        )
        warnings.warn(f"EnvRunner.restore({os.fspath(path)!r}): {note}.", stacklevel=3)
    return RestoreReport(envs_restored=envs_restored, note=note)


def _check_meta(runner: EnvRunner, meta: dict[str, Any], path: str) -> None:
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise InvalidArgumentError(
            f"EnvRunner.restore({path!r}): expected a {FORMAT} version {VERSION}, got "
            f"{meta.get('format')!r} version {meta.get('version')!r}."
        )
    here = {"sampler": type(runner.sampler).__name__, "num_envs": int(runner.envs.num_envs)}
    for key, value in here.items():
        if meta.get(key) != value:
            raise InvalidArgumentError(
                f"EnvRunner.restore({path!r}): the checkpoint was saved by a runner with "
                f"{key}={meta.get(key)!r}, this one has {key}={value!r}. Build the runner as the "
                "saved one was (same kind of backend, same num_envs)."
            )


__all__ = ["RestoreReport", "get_like", "get_tree", "put_tree", "restore", "save"]

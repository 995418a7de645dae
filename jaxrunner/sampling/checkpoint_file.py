"""Reading an :class:`~jaxrunner.EnvRunner` checkpoint that may be damaged or hostile.

:meth:`CheckpointFile.read` turns the file into a :class:`Checkpoint`: a frozen value
holding everything a restore installs, each part read through the bounded reader
(:mod:`jaxrunner.npz_reader`: only the members something references, each once, its
header checked before memory is allocated) and checked against the runner it is for:

- the metadata: a JSON object of the saved format and version, with ``sampler``,
  ``num_envs``, ``seed``, ``rollout_length``, ``envs``, ``envs_note``, ``metrics``,
  ``fragments`` and ``finished`` of the right types and ranges;
- the params and sampler state: the runner's own structure, shapes and dtypes; the
  episode bookkeeping consistent (ids non-negative, distinct and below the next free
  id, so new episodes never reuse one; step counts in range; returns finite);
- the metrics: counters non-negative, timers finite and non-negative, the return and
  length windows finite, of one length;
- the kept episodes: the observation and action spaces' structure and shapes (the
  observations' dtypes too), ``L + 1`` observations for ``L`` steps, finite rewards,
  one dtype per field and one extras structure across them, ids below the next free id,
  unfinished ones (fragments) in their env's current episode and finished ones
  complete;
- the sub-env pickles, only when the caller opted in: one ``uint8`` array per sub-env.

Nothing is applied to the runner here; every failure is an
:class:`~jaxrunner.errors.InvalidArgumentError` naming the field at fault.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from jaxrunner import spaces as jr_spaces
from jaxrunner.envs.jax_env import JaxVectorEnv
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.npz_reader import NUMERIC_KINDS, HeaderCheck, NpzReader
from jaxrunner.trajectory import Episode

if TYPE_CHECKING:
    from jaxrunner.sampling.runner import EnvRunner

FORMAT = "jaxrunner.EnvRunner checkpoint"
VERSION = 1
META = "__meta__"
MAX_META_BYTES = 1 << 26
"""The most bytes the JSON metadata may take in the file (4 per character)."""
MAX_RESTORE_BYTES = 1 << 33
"""The most bytes a checkpoint's arrays may take in memory (8 GiB)."""
MAX_PATH_DEPTH = 32
"""The deepest a saved tree path may be."""

Part = str | int
"""One step of a tree path: a dict key or attribute name, or a sequence index."""

EPISODE_SCALARS = {
    "terminated": bool,
    "truncated": bool,
    "episode_id": int,
    "env_id": int,
    "start_step": int,
    "faulty": bool,
}
"""The scalar fields of an :class:`Episode`, kept in the JSON."""
EPISODE_FIELDS = tuple(EPISODE_SCALARS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """A checkpoint read and checked against the runner it restores: ready to apply."""

    params: Any
    """The policy params, in the runner's structure (device arrays)."""
    sampler_state: Any
    """The sampler's state, in the structure of the runner's ``sampler.get_state()``."""
    steps_done: int
    """Steps every env had closed when it was saved (seeds the fresh resets)."""
    metrics_state: dict[str, np.ndarray]
    """The metrics' counters, windows and timers (``RunnerMetrics.get_state()``)."""
    seed: int
    """The saved runner's seed."""
    envs: str
    """How the envs were saved: ``"pytree"`` (in the sampler state), ``"pickle"``
    (sub-env pickles) or ``"none"``."""
    envs_note: str
    """Why, as the saving runner said it."""
    env_snapshots: tuple[bytes, ...] | None
    """One pickle per sub-env; None unless saved and opted in to."""
    fragments: tuple[Episode, ...]
    """Unfinished episodes ``sample_episodes`` holds (read only when the envs resume)."""
    finished: tuple[Episode, ...]
    """Complete episodes ``sample_episodes`` holds, not yet returned."""


# -- tree paths ----------------------------------------------------------------------------


def part_of(entry: Any) -> Part:
    """One entry of a JAX tree path as a :data:`Part`."""
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            value = getattr(entry, attr)
            return value if isinstance(value, int) else str(value)
    raise TypeError(f"unsupported tree path entry {entry!r}")


def array_name(prefix: str, parts: list[Part] | tuple[Part, ...]) -> str:
    """The name under which a leaf at ``parts`` is saved below ``prefix``."""
    return "/".join([prefix, *(str(p) for p in parts)])


def is_key(leaf: Any) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _leaf_specs(tree: Any) -> dict[tuple[Part, ...], tuple[tuple[int, ...], np.dtype]]:
    """Each leaf's path, trailing shape (after the first axis) and dtype."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        tuple(part_of(e) for e in path): (np.shape(leaf)[1:], np.asarray(leaf).dtype)
        for path, leaf in flat
    }


def _build(leaves: dict[tuple[Part, ...], np.ndarray]) -> Any:
    """The tree of ``leaves``: string steps as dicts, integer steps as tuples (a lone
    leaf for the empty path)."""
    if () in leaves:
        return leaves[()]
    root: dict[Part, Any] = {}
    for parts, leaf in leaves.items():
        node = root
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = leaf

    def build(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        if node and all(isinstance(k, int) for k in node):
            return tuple(build(node[k]) for k in sorted(node))
        return {k: build(v) for k, v in node.items()}

    return build(root)


# -- the reader ----------------------------------------------------------------------------


class CheckpointFile:
    """The checkpoint at ``path``, read for ``runner`` (see the module docstring).

    Args:
        runner: the runner it will restore (its structure is what the file must have).
        path: the file.
    """

    def __init__(self, runner: EnvRunner, path: str | os.PathLike) -> None:
        self.runner = runner
        self.path = os.fspath(path)

    def read(self, load_env_pickles: bool) -> Checkpoint:
        """Reads and checks the whole file; touches nothing of the runner.

        Raises:
            InvalidArgumentError: the file is not a checkpoint of this runner's kind, or
                a value in it is damaged; the message names the field.
        """
        hint = "; the limit is jaxrunner.sampling.checkpoint_file.MAX_RESTORE_BYTES"
        with NpzReader(self.path, self._error, MAX_RESTORE_BYTES, hint) as npz:
            if not npz.has(META):
                raise InvalidArgumentError(
                    f"EnvRunner.restore({self.path!r}): not a jaxrunner checkpoint (no "
                    f"{META}); write one with EnvRunner.save(path)."
                )
            meta = self._check_meta(npz.read_json(META, f"metadata ({META})", MAX_META_BYTES))
            runner = self.runner
            params = self._read_like(npz, "params", runner.get_params(), "params")
            state = self._read_like(npz, "sampler", runner.sampler.get_state(), "sampler state")
            ids, next_id, steps_done = self._check_book(state)
            metrics = self._read_metrics(npz, meta["metrics"])
            finished = self._read_episodes(npz, "finished", meta["finished"], next_id)
            snapshots = None
            if meta["envs"] == "pickle" and load_env_pickles:
                snapshots = tuple(
                    npz.read(f"envs/{i}", f"envs/{i}", "u", _bytes_check).tobytes()
                    for i in range(meta["num_envs"])
                )
            fragments: tuple[Episode, ...] = ()
            if meta["envs"] == "pytree" or snapshots is not None:  # the envs resume
                fragments = self._read_episodes(npz, "fragments", meta["fragments"], next_id)
        self._check_kept(fragments, finished, ids)
        return Checkpoint(
            params=params,
            sampler_state=state,
            steps_done=steps_done,
            metrics_state=metrics,
            seed=meta["seed"],
            envs=meta["envs"],
            envs_note=meta["envs_note"],
            env_snapshots=snapshots,
            fragments=fragments,
            finished=finished,
        )

    # -- metadata ----------------------------------------------------------------------------

    def _error(self, what: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"EnvRunner.restore({self.path!r}): the checkpoint {what}. Restore only "
            "checkpoints written by EnvRunner.save, into a runner built as the saved one."
        )

    def _check_meta(self, meta: Any) -> dict[str, Any]:
        if not isinstance(meta, dict):
            raise self._error(f"has metadata ({META}) that is not a JSON object")
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise InvalidArgumentError(
                f"EnvRunner.restore({self.path!r}): expected a {FORMAT} version {VERSION}, "
                f"got {meta.get('format')!r} version {meta.get('version')!r}."
            )
        here = {
            "sampler": type(self.runner.sampler).__name__,
            "num_envs": int(self.runner.envs.num_envs),
        }
        for key, value in here.items():
            if meta.get(key) != value or type(meta.get(key)) is not type(value):
                raise InvalidArgumentError(
                    f"EnvRunner.restore({self.path!r}): the checkpoint was saved by a runner "
                    f"with {key}={meta.get(key)!r}, this one has {key}={value!r}. Build the "
                    "runner as the saved one was (same kind of backend, same num_envs)."
                )
        self._int(meta.get("seed"), "metadata field seed", 0)
        self._int(meta.get("rollout_length"), "metadata field rollout_length", 1)
        kinds = ("pytree",) if isinstance(self.runner.envs, JaxVectorEnv) else ("pickle", "none")
        if meta.get("envs") not in kinds:
            raise self._error(f"has metadata field envs={meta.get('envs')!r}; expected {kinds}")
        note = meta.get("envs_note")
        if not isinstance(note, str) or len(note) > 10_000:
            raise self._error("has a metadata field envs_note that is not a short string")
        want = [list(p) for p in _leaf_specs(self.runner._metrics.get_state())]
        if meta.get("metrics") != want:
            raise self._error(
                f"has metadata field metrics={meta.get('metrics')!r}; expected {want}"
            )
        for key in ("fragments", "finished"):
            if not isinstance(meta.get(key), list):
                raise self._error(f"has a metadata field {key} that is not a list")
        return meta

    def _int(self, value: Any, where: str, low: int, high: float = float("inf")) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            bounds = f">= {low}" if high == float("inf") else f"in [{low}, {high}]"
            raise self._error(f"has {where}={value!r}; expected an int {bounds}")
        return value

    # -- arrays ------------------------------------------------------------------------------

    def _read_like(self, npz: NpzReader, prefix: str, template: Any, what: str) -> Any:
        """The tree saved under ``prefix`` in ``template``'s structure, shapes and dtypes
        (checked from each member's header before it is read); device arrays where the
        template has them, typed keys rewrapped."""
        leaves = []
        flat, treedef = jax.tree_util.tree_flatten_with_path(template)
        for path, like in flat:
            name = array_name(prefix, [part_of(e) for e in path])
            if not npz.has(name):
                raise InvalidArgumentError(
                    f"EnvRunner.restore({self.path!r}): the checkpoint has no {name!r}: its "
                    f"{what} has another structure than this runner's. Restore into a runner "
                    "built as the saved one (same policy, envs, spaces and connectors). A "
                    "checkpoint saved by an older jaxrunner whose state had another layout "
                    "(e.g. connector statistics before their frozen flag) cannot be restored "
                    "by this one."
                )
            want = jax.random.key_data(like) if is_key(like) else like
            value = npz.read(name, name, check=_exact(np.shape(want), np.asarray(want).dtype))
            if is_key(like):
                leaves.append(jax.random.wrap_key_data(value, impl=jax.random.key_impl(like)))
            elif isinstance(like, jax.Array):
                leaves.append(jax.device_put(value))
            else:
                leaves.append(value)
        return jax.tree_util.tree_unflatten(treedef, leaves)

    def _check_book(self, state: dict[str, Any]) -> tuple[np.ndarray, int, int]:
        """Checks the sampler's episode bookkeeping; returns each env's current episode
        id, the next free id and the steps closed so far."""
        if "book" in state:  # the host samplers
            book, where = state["book"], "sampler/book"
            ids, next_id = book["episode_id"], int(book["next_episode_id"])
            steps_done = int(book["steps_done"])
            begin, returns = book["episode_begin"], book["episode_return"]
            self._require(steps_done >= 0, f"{where}/steps_done", f"{steps_done} < 0")
            bad = (begin < 0) | (begin > steps_done)
            self._require(not bad.any(), f"{where}/episode_begin", f"outside [0, {steps_done}]")
        else:  # the scan sampler
            rollout, where = state["rollout"], "sampler/rollout"
            ids = np.asarray(rollout.episode_id)
            next_id, steps_done = int(rollout.next_episode_id), int(rollout.num_steps)
            returns = np.asarray(rollout.episode_return)
            step = np.asarray(rollout.episode_step)
            self._require((step >= 0).all(), f"{where}/episode_step", "negative")
        self._require(np.isfinite(returns).all(), f"{where}/episode_return", "not finite")
        self._require((ids >= 0).all(), f"{where}/episode_id", "negative")
        self._require(len(np.unique(ids)) == len(ids), f"{where}/episode_id", "repeated")
        self._require(
            bool((ids < next_id).all()),
            f"{where}/next_episode_id",
            f"{next_id}, not above every current episode id (max {int(ids.max(initial=-1))}): "
            "new episodes would reuse ids",
        )
        return ids, next_id, steps_done

    def _require(self, ok: Any, where: str, problem: str) -> None:
        if not ok:
            raise self._error(f"has {where} {problem}")

    def _read_metrics(self, npz: NpzReader, paths: list[list[Part]]) -> dict[str, np.ndarray]:
        template = self.runner._metrics.get_state()
        state = {}
        for (key,) in paths:
            want = template[key]
            name = array_name("metrics", [key])
            if key in ("returns", "lengths"):  # windows: any length, checked below
                check = _leading(want.shape[1:], want.dtype, None)
            else:
                check = _exact(want.shape, want.dtype)
            state[key] = npz.read(name, name, check=check)
        counters, returns, lengths = state["counters"], state["returns"], state["lengths"]
        self._require((counters >= 0).all(), "metrics/counters", "with a negative count")
        self._require(len(returns) == len(lengths), "metrics/returns", "unlike metrics/lengths")
        self._require(np.isfinite(returns).all(), "metrics/returns", "not finite")
        self._require((lengths >= 1).all(), "metrics/lengths", "below 1")
        self._require(len(returns) <= counters[3], "metrics/returns", "beyond num_episodes")
        for key in ("sample_time_s", "perf"):
            ok = np.isfinite(state[key]).all() and (state[key] >= 0).all()
            self._require(ok, f"metrics/{key}", "not finite and >= 0")
        return state

    # -- episodes ----------------------------------------------------------------------------

    def _read_episodes(
        self, npz: NpzReader, prefix: str, metas: list[Any], next_id: int
    ) -> tuple[Episode, ...]:
        spaces = self.runner.get_spaces()
        specs = {
            "obs": _leaf_specs(jr_spaces.allocate(spaces["observation_space"], (0,))),
            "action": _leaf_specs(jr_spaces.allocate(spaces["action_space"], (0,))),
        }
        return tuple(
            self._read_episode(npz, prefix, k, meta, next_id, specs) for k, meta in enumerate(metas)
        )

    def _read_episode(
        self,
        npz: NpzReader,
        prefix: str,
        k: int,
        meta: Any,
        next_id: int,
        specs: dict[str, dict[tuple[Part, ...], tuple[tuple[int, ...], np.dtype]]],
    ) -> Episode:
        """Episode ``k`` of ``prefix``: its metadata ``meta`` checked, then its arrays."""
        where, base = f"{prefix}[{k}]", f"{prefix}/{k}"
        keys = {*EPISODE_FIELDS, "paths", "extras"}
        if not isinstance(meta, dict) or set(meta) != keys:
            raise self._error(f"has {where} that is not an object of the keys {sorted(keys)}")
        for field, kind in EPISODE_SCALARS.items():
            if kind is bool and not isinstance(meta[field], bool):
                raise self._error(f"has {where}.{field}={meta[field]!r}; expected true or false")
        self._int(meta["episode_id"], f"{where}.episode_id", 0, next_id - 1)
        self._int(meta["env_id"], f"{where}.env_id", 0, int(self.runner.envs.num_envs) - 1)
        self._int(meta["start_step"], f"{where}.start_step", 0)
        data_paths = self._paths(meta["paths"], f"{where}.paths")
        extras_paths = self._paths(meta["extras"], f"{where}.extras")
        want = {("reward",)} | {(key, *p) for key, leaves in specs.items() for p in leaves}
        if set(data_paths) != want:
            raise self._error(
                f"has {where}.paths={meta['paths']!r}; this runner's episodes have the "
                f"paths {sorted(map(list, want), key=str)}"
            )
        if any(not all(isinstance(p, str) for p in path) for path in extras_paths):
            raise self._error(f"has {where}.extras with a non-string key")
        name = array_name(base, ["reward"])
        reward = npz.read(name, name, "f", _leading((), None, None))
        self._require(np.isfinite(reward).all(), name, "not finite")
        steps = len(reward)

        def read(path: tuple[Part, ...], sub: str, check: HeaderCheck) -> np.ndarray:
            name = array_name(f"{base}{sub}", path)
            return npz.read(name, name, NUMERIC_KINDS, check)

        obs_specs, action_specs = specs["obs"], specs["action"]
        obs = {p: read(("obs", *p), "", _leading(*obs_specs[p], steps + 1)) for p in obs_specs}
        action = {
            p: read(("action", *p), "", _leading(action_specs[p][0], None, steps))
            for p in action_specs
        }
        extras = {p: read(p, "/extras", _leading(None, None, steps)) for p in extras_paths}
        return Episode(
            obs=_build(obs),
            action=_build(action),
            reward=reward,
            extras=_build(extras) if extras else {},
            **{field: meta[field] for field in EPISODE_FIELDS},
        )

    def _paths(self, paths: Any, where: str) -> list[tuple[Part, ...]]:
        """``paths`` as tuples, each a non-empty list of str or int parts."""

        def ok(path: Any) -> bool:
            return (
                isinstance(path, list)
                and 0 < len(path) <= MAX_PATH_DEPTH
                and all(isinstance(p, str | int) and not isinstance(p, bool) for p in path)
            )

        if not isinstance(paths, list) or not all(ok(p) for p in paths):
            raise self._error(
                f"has {where} that is not a list of tree paths (lists of keys and indices)"
            )
        result = [tuple(p) for p in paths]
        if len(set(result)) != len(result):
            raise self._error(f"has {where} with a repeated path")
        return result

    def _check_kept(
        self, fragments: tuple[Episode, ...], finished: tuple[Episode, ...], ids: np.ndarray
    ) -> None:
        """The kept episodes fit each other and the bookkeeping."""
        signature = None
        for where, episodes in (("fragments", fragments), ("finished", finished)):
            for k, episode in enumerate(episodes):
                sig = jax.tree.map(
                    lambda x: (x.dtype, x.shape[1:]), (episode.action, episode.extras)
                )
                if signature is not None and sig != signature:
                    raise self._error(
                        f"has {where}[{k}] whose rewards, actions or extras differ in structure, "
                        "dtype or shape from the other kept episodes'"
                    )
                signature = sig
        envs_with = [e.env_id for e in fragments]
        for k, episode in enumerate(fragments):
            self._require(not episode.is_done, f"fragments[{k}]", "that is finished")
            self._require(
                episode.episode_id == ids[episode.env_id],
                f"fragments[{k}].episode_id",
                f"{episode.episode_id}, not the current episode of env {episode.env_id}",
            )
        self._require(len(set(envs_with)) == len(envs_with), "fragments", "with two for one env")
        finished_ids = [e.episode_id for e in finished]
        self._require(len(set(finished_ids)) == len(finished_ids), "finished", "with a repeated id")
        for k, episode in enumerate(finished):
            self._require(episode.is_complete, f"finished[{k}]", "that is not complete")
            self._require(
                episode.episode_id not in set(ids.tolist()),
                f"finished[{k}].episode_id",
                f"{episode.episode_id}, the id of an episode still running",
            )


def _exact(shape: tuple[int, ...], dtype: np.dtype) -> HeaderCheck:
    def check(got_shape: tuple[int, ...], got_dtype: np.dtype) -> str | None:
        if tuple(got_shape) == tuple(shape) and got_dtype == dtype:
            return None
        return f"is {got_dtype}{list(got_shape)}; this runner's is {dtype}{list(shape)}"

    return check


def _leading(
    trailing: tuple[int, ...] | None, dtype: np.dtype | None, length: int | None
) -> HeaderCheck:
    """A header check: ``[length, *trailing]`` of ``dtype`` (None: any of that part)."""

    def check(shape: tuple[int, ...], got: np.dtype) -> str | None:
        ok = len(shape) >= 1 and (length is None or shape[0] == length)
        ok = ok and (trailing is None or tuple(shape[1:]) == tuple(trailing))
        if ok and (dtype is None or got == dtype):
            return None
        lead = "n" if length is None else length
        want = "[..]" if trailing is None else list(trailing)
        return f"is {got}{list(shape)}; expected [{lead}, *{want}] of {dtype or 'a numeric dtype'}"

    return check


def _bytes_check(shape: tuple[int, ...], dtype: np.dtype) -> str | None:
    if len(shape) == 1 and dtype == np.uint8:
        return None
    return f"is {dtype}{list(shape)}; expected uint8[n] (a pickle's bytes)"


__all__ = [
    "FORMAT",
    "MAX_META_BYTES",
    "MAX_RESTORE_BYTES",
    "META",
    "VERSION",
    "EPISODE_FIELDS",
    "EPISODE_SCALARS",
    "Checkpoint",
    "CheckpointFile",
    "array_name",
    "is_key",
    "part_of",
]

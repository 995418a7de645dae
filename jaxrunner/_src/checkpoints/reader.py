"""The checks of a checkpoint's parts (:class:`CheckpointReader`), with which
:class:`~jaxrunner._src.checkpoints.checkpoint_file.CheckpointFile` reads either runner's."""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.arg_checks import check_bool, check_int, is_int
from jaxrunner._src.checkpoints.format import (
    ENV_STATE,
    MAX_META_BYTES,
    MAX_PATH_DEPTH,
    META,
    WINDOWS,
    Part,
    array_name,
    build_tree,
    exact,
    is_key,
    leading,
    path_leaves,
)
from jaxrunner._src.core.npz_file import NUMERIC_KINDS, HeaderCheck, NpzReader
from jaxrunner._src.core.seeds import MAX_SEED
from jaxrunner.errors import InvalidArgumentError

EpisodeSpaces = dict[str, dict[tuple[Part, ...], Any]]
"""A kept episode's ``"obs"`` and ``"action"`` leaf spaces, by path."""


class CheckpointReader:
    """The checks ``CheckpointFile`` makes on a checkpoint's metadata, trees, metrics and
    episode steps; nothing here changes a runner. ``metrics``: the restoring runner's
    (``RunnerMetrics``: the structure of theirs in the file, and its longest window)."""

    def __init__(self, runner_name: str, path: str | os.PathLike, metrics: Any) -> None:
        self.runner_name = runner_name
        self.path = os.fspath(path)
        self.where = f"{runner_name}.restore({self.path!r})"
        self.metrics_template = metrics.get_state()
        self.window = int(metrics.episodes.window)

    def open(self, load_env_pickles: Any, max_bytes: Any) -> NpzReader:
        """The file, opened within ``max_bytes`` for its arrays (a context manager),
        once ``restore``'s arguments are checked."""
        call = f"{self.runner_name}.restore"
        check_bool(call, "load_env_pickles", load_env_pickles)
        check_int(call, "max_bytes", max_bytes, low=0, hint="bytes the arrays may take")
        hint = f"; the limit is max_bytes={max_bytes} (restore(..., max_bytes=...))"
        return NpzReader(self.path, self.error, max_bytes, hint)

    def error(self, what: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{self.where}: the checkpoint {what}. Restore only checkpoints written by "
            f"{self.runner_name}.save, into a runner built as the saved one."
        )

    def require(self, ok: Any, where: str, problem: str) -> None:
        if not ok:
            raise self.error(f"has {where} {problem}")

    def int_field(self, value: Any, where: str, low: int, high: float = float("inf")) -> int:
        if not is_int(value, low, high):
            bounds = f">= {low}" if high == float("inf") else f"in [{low}, {high}]"
            raise self.error(f"has {where}={value!r}; expected an int {bounds}")
        return int(value)

    # -- metadata ----------------------------------------------------------------------------

    def read_meta(self, npz: NpzReader, reads: dict[str, tuple[int, ...]]) -> dict[str, Any]:
        """The JSON metadata: an object of one of the formats ``reads`` names (the first
        is the current one), of one of its versions."""
        if not npz.has(META):
            raise InvalidArgumentError(
                f"{self.where}: not a jaxrunner checkpoint (no {META}); write one with "
                f"{self.runner_name}.save(path)."
            )
        meta = npz.read_json(META, f"metadata ({META})", MAX_META_BYTES)
        if not isinstance(meta, dict):
            raise self.error(f"has metadata ({META}) that is not a JSON object")
        version = meta.get("version")
        if not is_int(version) or version not in reads.get(meta.get("format"), ()):  # type: ignore[arg-type]
            (fmt, versions), *earlier = reads.items()
            older = "".join(
                f" (or a {name} version {' or '.join(map(str, v))}, written before)"
                for name, v in earlier
            )
            raise InvalidArgumentError(
                f"{self.where}: expected a {fmt} version {' or '.join(map(str, versions))}"
                f"{older}, got {meta.get('format')!r} version {version!r}."
            )
        return meta

    def check_same(self, meta: dict[str, Any], here: dict[str, Any], fix: str) -> None:
        """The saved runner's ``here`` keys equal this runner's (value and type)."""
        for key, value in here.items():
            if meta.get(key) != value or type(meta.get(key)) is not type(value):
                raise InvalidArgumentError(
                    f"{self.where}: the checkpoint was saved by a runner with "
                    f"{key}={meta.get(key)!r}, this one has {key}={value!r}. Build the runner "
                    f"as the saved one was ({fix})."
                )

    def check_common_meta(self, meta: dict[str, Any], env_kinds: tuple[str, ...]) -> None:
        """``seed``, ``rollout_length``, ``envs`` (one of ``env_kinds``), ``envs_note``
        and the ``metrics`` paths (this runner's)."""
        self.int_field(meta.get("seed"), "metadata field seed", 0, MAX_SEED)
        self.int_field(meta.get("rollout_length"), "metadata field rollout_length", 1)
        if meta.get("envs") not in env_kinds:
            raise self.error(f"has metadata field envs={meta.get('envs')!r}; expected {env_kinds}")
        note = meta.get("envs_note")
        if not isinstance(note, str) or len(note) > 10_000:
            raise self.error("has a metadata field envs_note that is not a short string")
        want = [parts for parts, _ in path_leaves(self.metrics_template)[0]]
        if meta.get("metrics") != want:
            raise self.error(f"has metadata field metrics={meta.get('metrics')!r}; expected {want}")

    # -- arrays ------------------------------------------------------------------------------

    def read_like(self, npz: NpzReader, prefix: str, template: Any, what: str) -> Any:
        """The tree saved under ``prefix`` in ``template``'s structure, shapes and dtypes
        (checked from the headers first), every float finite but a pure-JAX env's state's."""
        leaves = []
        flat, treedef = path_leaves(template)
        for parts, like in flat:
            name = array_name(prefix, parts)
            if not npz.has(name):
                raise InvalidArgumentError(
                    f"{self.where}: the checkpoint has no {name!r}: its {what} has another "
                    "structure than this runner's. Restore into a runner built as the saved "
                    "one (same policy, envs, spaces and connectors). A checkpoint saved by an "
                    "older jaxrunner whose state had another layout (e.g. connector "
                    "statistics before their frozen flag) cannot be restored by this one."
                )
            want = jax.random.key_data(like) if is_key(like) else like
            dtype = np.asarray(want).dtype
            stored = np.dtype(np.float32) if dtype.kind == "V" else dtype  # as put_tree saves
            value = npz.read(name, name, check=exact(np.shape(want), stored)).astype(
                dtype, copy=False
            )
            # A pure-JAX env's own state may hold a NaN (a sentinel): the env's business.
            exempt = value.dtype.kind not in "fc" or ENV_STATE in name.split("/")
            if not (exempt or np.isfinite(value).all()):
                raise self.error(f"has {name} not finite (NaN or infinity)")
            if is_key(like):
                # wrap_key_data takes any array-like; its annotation says jax.Array.
                value = jax.random.wrap_key_data(value, impl=jax.random.key_impl(like))  # type: ignore[arg-type]
            elif isinstance(like, jax.Array):
                value = jax.device_put(value)
            leaves.append(value)
        return jax.tree_util.tree_unflatten(treedef, leaves)

    def check_ids(self, ids: np.ndarray, next_id: int, returns: np.ndarray, where: str) -> None:
        """Current episode ids non-negative, distinct and below the next free id (so new
        episodes never reuse one); their returns so far finite."""
        self.require(np.isfinite(returns).all(), f"{where}/episode_return", "not finite")
        self.require((ids >= 0).all(), f"{where}/episode_id", "negative")
        self.require(len(np.unique(ids)) == len(ids), f"{where}/episode_id", "repeated")
        self.require(
            bool((ids < next_id).all()),
            f"{where}/next_episode_id",
            f"{next_id}, not above every current episode id (max {int(ids.max(initial=-1))}): "
            "new episodes would reuse ids",
        )

    def read_metrics(self, npz: NpzReader) -> Any:
        """The metrics state in the template's structure (windows up to this runner's
        episode window), counts non-negative, floats finite, counters consistent; with the
        agent metrics (where the runner keeps them): per-policy and per-agent windows,
        agent steps that add up."""
        leaves = []
        flat, treedef = path_leaves(self.metrics_template)
        why = "this runner's MetricsConfig.episode_window: build it as the saved one"
        for parts, want in flat:
            name = array_name("metrics", parts)
            if parts[-1] in WINDOWS:
                check = leading(want.shape[1:], want.dtype, None, self.window, why)
            else:
                check = exact(want.shape, want.dtype)
            value = npz.read(name, name, check=check)
            if value.dtype.kind in "iu":
                self.require((value >= 0).all(), name, "with a negative count")
            leaves.append(value)
        state = jax.tree_util.tree_unflatten(treedef, leaves)
        self.check_window(state, "metrics", int(state["counters"][3]))
        for key in ("sample_time_s", "perf"):
            ok = np.isfinite(state[key]).all() and (state[key] >= 0).all()
            self.require(ok, f"metrics/{key}", "not finite and >= 0")
        if "agents" not in state:
            return state
        agents, where = state["agents"], "metrics/agents"
        ok = np.isfinite(agents["unassigned_reward"])
        self.require(ok, f"{where}/unassigned_reward", "not finite")
        for key in ("policies", "agents"):
            for name, stats in agents[key].items():
                self.check_window(stats, f"{where}/{key}/{name}", int(stats["counters"][0]))
            steps = sum(int(stats["counters"][1]) for stats in agents[key].values())
            self.require(
                steps == int(agents["counters"][0]),
                f"{where}/counters",
                f"whose agent steps ({int(agents['counters'][0])}) are not the sum over "
                f"{where}/{key} ({steps})",
            )
        return state

    def check_window(self, stats: dict[str, np.ndarray], where: str, num_episodes: int) -> None:
        """An episode window (``returns``, ``lengths``) of at most ``num_episodes``."""
        returns, lengths = stats["returns"], stats["lengths"]
        self.require(len(returns) == len(lengths), f"{where}/returns", f"unlike {where}/lengths")
        self.require(np.isfinite(returns).all(), f"{where}/returns", "not finite")
        self.require((lengths >= 1).all(), f"{where}/lengths", "below 1")
        self.require(len(returns) <= num_episodes, f"{where}/returns", "beyond num_episodes")

    # -- kept episodes -----------------------------------------------------------------------

    def paths(self, paths: Any, where: str) -> list[tuple[Part, ...]]:
        """``paths`` as tuples, each a non-empty list of str or int parts."""

        def ok(path: Any) -> bool:
            return (
                isinstance(path, list)
                and 0 < len(path) <= MAX_PATH_DEPTH
                and all(isinstance(p, str | int) and not isinstance(p, bool) for p in path)
            )

        if not isinstance(paths, list) or not all(ok(p) for p in paths):
            raise self.error(
                f"has {where} that is not a list of tree paths (lists of keys and indices)"
            )
        result = [tuple(p) for p in paths]
        if len(set(result)) != len(result):
            raise self.error(f"has {where} with a repeated path")
        return result

    def read_steps(
        self,
        npz: NpzReader,
        where: str,
        base: str,
        meta: dict[str, Any],
        specs: EpisodeSpaces,
        most: int,
    ) -> dict[str, Any]:
        """An episode's step arrays below ``base``: ``obs`` ``[L + 1]`` and ``action``
        ``[L]`` in ``specs``' spaces but a Box's bounds, ``reward`` ``[L]`` (``L`` at most
        ``most``) and ``extras`` ``[L]``."""
        data_paths = self.paths(meta["paths"], f"{where}.paths")
        extras_paths = self.paths(meta["extras"], f"{where}.extras")
        want = {("reward",)} | {(key, *p) for key, leaves in specs.items() for p in leaves}
        if set(data_paths) != want:
            raise self.error(
                f"has {where}.paths={meta['paths']!r}; this runner's episodes have the "
                f"paths {sorted(map(list, want), key=str)}"
            )
        if any(not all(isinstance(p, str) for p in path) for path in extras_paths):
            raise self.error(f"has {where}.extras with a non-string key")
        name = array_name(base, ["reward"])
        counted = "the steps the checkpoint's metrics count"
        reward = npz.read(name, name, "f", leading((), None, None, most, counted))
        self.require(np.isfinite(reward).all(), name, "not finite")
        steps = len(reward)

        def read(name: str, check: HeaderCheck) -> np.ndarray:
            return npz.read(name, name, NUMERIC_KINDS, check)

        obs, action = {}, {}
        for p, space in specs["obs"].items():  # a runner records no NaN or infinite observation
            name = array_name(base, ("obs", *p))
            obs[p] = leaf = read(name, leading(*space_arrays.leaf_spec(space), steps + 1))
            finite = leaf.dtype.kind != "f" or np.isfinite(leaf).all()
            self.require(finite, name, "not finite (NaN or infinity)")
            self.check_rows(space, leaf, name)
        for p, space in specs["action"].items():
            name = array_name(base, ("action", *p))
            action[p] = leaf = read(name, leading(space_arrays.leaf_spec(space)[0], None, steps))
            self.check_rows(space, leaf, name)
        extras_check = leading(None, None, steps)
        extras = {p: read(array_name(f"{base}/extras", p), extras_check) for p in extras_paths}
        return {
            "obs": build_tree(obs),
            "action": build_tree(action),
            "reward": reward,
            "extras": build_tree(extras),
        }

    def check_rows(self, space: Any, array: np.ndarray, name: str) -> None:
        """Every row of member ``name`` lies in ``space`` but a Box's bounds (as sampling
        checks it: gymnasium envs may leave them)."""
        outside = np.flatnonzero(~space_arrays.rows_in_space(space, array, bounds=False))
        if len(outside):
            row = int(outside[0])
            raise self.error(
                f"has {name} row {row} ({array[row].tolist()!r:.80}) outside the runner's "
                f"space {space}"
            )

    def refuse_unreferenced(self, npz: NpzReader, meta: dict[str, Any]) -> None:
        """Every member was read, or is a pickle of a checkpoint that holds them (the
        sub-envs', ``live_episodes``); another is refused unread."""
        live = ["live_episodes"] if meta.get("live_episodes") is True else []
        pickles = {*(f"envs/{i}" for i in range(meta["num_envs"])), *live}
        other = sorted(set(npz.unread()) - (pickles if meta["envs"] == "pickle" else set()))
        state = [m for m in other if "connectors/" in m]
        if state:  # a runner saved with connectors, restored into one without (or fewer)
            raise self.error(
                f"holds connector state ({state[0]!r}) that this runner has no connector "
                "for: build it with the connectors it was saved with"
            )
        if other:
            raise self.error(
                f"has a member {other[0]!r} that no field references ({len(other)} such "
                f"member{'s' if len(other) > 1 else ''}); {self.runner_name}.save writes none"
            )

"""Episodes to and from Minari datasets (``pip install "jaxrunner[minari]"``).

Minari is the Farama Foundation's format for offline RL datasets (the successor of
D4RL): :func:`to_minari` writes :class:`~jaxrunner.Episode`\\ s as a dataset that
``minari.load_dataset`` opens, and :func:`from_minari` reads a Minari dataset back
as Episodes, trusting its files as data only (it never imports or calls what a dataset
names, unless told to by name) and refusing inconsistent episodes.

Per episode Minari stores ``L + 1`` observations (the reset observation to the true
final one), ``L`` actions, rewards and separate ``terminations`` / ``truncations``,
and the reset seed where it is known. jaxrunner's own fields travel in the
episode's ``infos`` (``L + 1`` rows, one per observation, as Minari's own collector
writes them): ``env_id`` and ``episode_id`` (the runner's), and under ``extras`` the
policy's outputs for the action taken at each observation (``log_prob``,
``value``, ...), zero in the final row, where no action was taken.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import gymnasium
import jax
import numpy as np
from gymnasium import spaces

from jaxrunner._src import space_arrays as jr_spaces
from jaxrunner._src.runner.trajectory import Episode
from jaxrunner.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    MissingDependencyError,
)

MAX_METADATA_BYTES = 1 << 26
"""The most bytes a dataset's ``metadata.json`` may take (:func:`from_minari`)."""
_SPACE_KEYS = ("observation_space", "action_space")


def _minari() -> Any:
    try:
        import minari
    except ImportError as err:
        raise MissingDependencyError(
            'jaxrunner._src.services.datasets needs Minari: pip install "jaxrunner[minari]".'
        ) from err
    return minari


def to_minari(
    episodes: Iterable[Episode],
    dataset_id: str,
    *,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    env: str | None = None,
    seeds: Mapping[int, int] | None = None,
    include_faulty: bool = False,
    **metadata: Any,
) -> Any:
    """Writes ``episodes`` as the Minari dataset ``dataset_id`` and returns it (a
    ``minari.MinariDataset``; ``minari.load_dataset(dataset_id)`` opens it later).

    The dataset lands where Minari keeps local datasets (``$MINARI_DATASETS_PATH``,
    default ``~/.minari/datasets``); an existing ``dataset_id`` is refused by Minari.
    Actions are stored as the env received them: Box actions clipped to the bounds,
    every action cast to the space's dtype (``extras["log_prob"]`` stays that of the
    sampled action). Observations are stored losslessly (no JPEG encoding).

    Args:
        episodes: complete episodes, e.g. from ``runner.sample_episodes(n)``.
        dataset_id: Minari's ``(namespace/)(env_name/)name-v(version)``.
        observation_space, action_space: a single env's spaces
            (``envs.single_observation_space``, ``envs.single_action_space``).
        env: the gymnasium id the episodes came from, if any; Minari records its spec
            so ``dataset.recover_environment()`` can rebuild it.
        seeds: the reset seed of the episodes whose seed you know, by
            ``episode_id``; the others are stored without one.
        include_faulty: also write episodes cut by a failure of their env
            (``Episode.faulty``; stored as truncated). Left out by default.
        **metadata: passed to ``minari.create_dataset_from_buffers`` (e.g.
            ``algorithm_name``, ``author``, ``description``).

    Raises:
        InvalidArgumentError: an episode is not complete (not seen from its reset,
            or not finished).
    """
    minari = _minari()
    from minari.data_collector import EpisodeBuffer

    clip = jr_spaces.clip_box_actions(action_space)
    seeds = dict(seeds or {})
    buffers = []
    for episode in episodes:
        if episode.faulty and not include_faulty:
            continue
        if not episode.is_complete:
            raise InvalidArgumentError(
                f"to_minari: episode {episode.episode_id} of env {episode.env_id} is not "
                f"complete (start_step={episode.start_step}, terminated="
                f"{episode.terminated}, truncated={episode.truncated}); a dataset holds "
                "whole episodes. Collect them with runner.sample_episodes(n)."
            )
        action = episode.action if clip is None else clip(episode.action)
        action = _cast(action, action_space)
        buffers.append(
            EpisodeBuffer(
                id=len(buffers),
                seed=seeds.get(episode.episode_id),
                observations=jax.tree.map(np.asarray, episode.obs),
                actions=action,
                # Typed list by Minari, which stores any array-like.
                rewards=np.asarray(episode.reward, np.float64),  # type: ignore[arg-type]
                terminations=_final_flag(episode.length, episode.terminated),  # type: ignore[arg-type]
                truncations=_final_flag(episode.length, episode.truncated),  # type: ignore[arg-type]
                infos=_infos(episode),
            )
        )
    if not buffers:
        raise InvalidArgumentError(
            "to_minari: no episodes to write (faulty ones are left out unless include_faulty=True)."
        )
    options: dict[str, Any] = {"env": env, **metadata}
    if env is None:
        options.update(observation_space=observation_space, action_space=action_space)
    if "jpeg_encoding" in inspect.signature(minari.create_dataset_from_buffers).parameters:
        options.setdefault("jpeg_encoding", False)  # lossless, as the episodes came
    return minari.create_dataset_from_buffers(dataset_id, buffers, **options)


def from_minari(
    dataset: Any,
    episode_indices: Sequence[int] | None = None,
    *,
    trusted_entry_point: str | None = None,
) -> list[Episode]:
    """Reads a Minari dataset's episodes as :class:`~jaxrunner.Episode`\\ s, checking each.

    A dataset id is opened without running anything the dataset names: its
    ``metadata.json`` is read as data (within :data:`MAX_METADATA_BYTES`) and the spaces
    are rebuilt from the serialized ``observation_space`` and ``action_space`` stored in
    it (Minari's own format, which names no code). A dataset without them names an env
    (``env_spec``) whose entry point Minari would import and call to learn the spaces;
    that happens only when the caller names the same entry point in
    ``trusted_entry_point``. A ``minari.MinariDataset`` you pass was opened by Minari
    (``minari.load_dataset``), which may already have done so.

    Args:
        dataset: a dataset id of a local dataset (downloads are left to you:
            ``minari.download_dataset(id)``), or a ``minari.MinariDataset``.
        episode_indices: which episodes (Minari's indices); all by default.
        trusted_entry_point: for a dataset whose metadata lacks its spaces: the entry
            point (``"package.module:EnvClass"``) of its ``env_spec`` you trust; the
            env is made once, to read its spaces. Refused when the dataset names
            another one or wrappers. Only for a dataset id.

    Returns:
        One Episode per dataset episode, in order: ``obs`` ``[L + 1]`` (the reset
        observation to the final one), ``action``, ``reward``, ``terminated`` and
        ``truncated`` as stored, ``extras`` as written by :func:`to_minari` (empty for
        other datasets), ``env_id`` and ``episode_id`` as written by
        :func:`to_minari` (else 0 and Minari's index).

    Raises:
        InvalidArgumentError: the dataset is missing, its metadata is unreadable or
            lacks its spaces (and no matching ``trusted_entry_point``), an index is out
            of range, or an episode is inconsistent: ``L + 1`` observations and ``L``
            actions, rewards and flags, in the spaces, finite rewards, the episode ended
            at its last step only, ``infos`` rows per observation. The message names
            the episode and the field.
    """
    _minari()
    if trusted_entry_point is not None and not isinstance(trusted_entry_point, str):
        raise InvalidArgumentTypeError(
            f"from_minari(trusted_entry_point={trusted_entry_point!r}): expected None or a "
            'string naming an entry point ("package.module:EnvClass").'
        )
    if isinstance(dataset, str):
        name = repr(dataset)
        storage, obs_space, action_space, total = _open_local(dataset, trusted_entry_point)
    else:
        name = f"<{type(dataset).__name__}>"
        storage, total = dataset.storage, int(dataset.storage.total_episodes)
        obs_space, action_space = dataset.observation_space, dataset.action_space
    chosen: Iterable[int] = episode_indices if episode_indices is not None else ()
    if episode_indices is None:
        chosen = range(total) if isinstance(dataset, str) else dataset.episode_indices
    indices = [_index(i, total, name) for i in chosen]
    episodes = []
    reader = None
    for index in indices:
        try:
            reader = reader or iter(storage.get_episodes(indices))
            data = next(reader)
        except Exception as err:  # Minari's readers raise anything on damaged files
            raise InvalidArgumentError(
                f"from_minari({name}): episode {index} cannot be read ({type(err).__name__}: "
                f"{err}). The dataset is damaged; download or write it again."
            ) from err
        check = _EpisodeCheck(f"from_minari({name}): episode {index}")
        episodes.append(check.episode(data, index, obs_space, action_space))
    return episodes


def _open_local(
    dataset_id: str, trusted_entry_point: str | None
) -> tuple[Any, spaces.Space, spaces.Space, int]:
    """The storage, spaces and episode count of the local dataset ``dataset_id``, read
    from its metadata as data."""
    from minari.dataset._storages import get_minari_storage, get_storage_keys
    from minari.storage import get_dataset_path

    where = f"from_minari({dataset_id!r})"
    data_path = get_dataset_path(dataset_id) / "data"
    meta_path = data_path / "metadata.json"
    try:
        size = meta_path.stat().st_size
        if size > MAX_METADATA_BYTES:
            raise InvalidArgumentError(
                f"{where}: {meta_path} is {size} bytes; the limit is {MAX_METADATA_BYTES} "
                "(jaxrunner._src.services.datasets.MAX_METADATA_BYTES)."
            )
        metadata = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise InvalidArgumentError(
            f"{where}: no local dataset at {data_path} (no metadata.json). from_minari never "
            "downloads: minari.download_dataset(id) first, or check $MINARI_DATASETS_PATH."
        ) from err
    except (OSError, ValueError, RecursionError) as err:
        raise InvalidArgumentError(
            f"{where}: {meta_path} is not readable JSON ({type(err).__name__}: {err}). The "
            "dataset is damaged; download or write it again."
        ) from err
    if not isinstance(metadata, dict):
        raise InvalidArgumentError(f"{where}: {meta_path} is not a JSON object.")
    fmt = metadata.get("data_format")
    if fmt not in get_storage_keys():
        raise InvalidArgumentError(
            f"{where}: metadata.json has data_format={fmt!r}; expected one of {get_storage_keys()}."
        )
    total = metadata.get("total_episodes")
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise InvalidArgumentError(
            f"{where}: metadata.json has total_episodes={total!r}; expected an int >= 0."
        )
    stored = {key: _stored_space(metadata, key, where) for key in _SPACE_KEYS}
    if None in stored.values():
        made = _spaces_from_env_spec(metadata, trusted_entry_point, where, stored)
        stored = {key: stored[key] or made[key] for key in _SPACE_KEYS}
    obs_space, action_space = stored["observation_space"], stored["action_space"]
    assert obs_space is not None and action_space is not None  # made above when missing
    try:
        storage = get_minari_storage(fmt)(
            data_path,
            obs_space,
            action_space,
            jpeg_encoding=bool(metadata.get("jpeg_encoding", True)),
        )
    except Exception as err:  # the storage class opens its files: anything on damage
        raise InvalidArgumentError(
            f"{where}: its {fmt} data cannot be opened ({type(err).__name__}: {err}). The "
            "dataset is damaged; download or write it again."
        ) from err
    return storage, obs_space, action_space, total


def _stored_space(metadata: dict[str, Any], key: str, where: str) -> spaces.Space | None:
    """The space serialized under ``key`` (Minari's JSON: a type name and numbers;
    nothing is imported), or None where the metadata has none."""
    from minari.serialization import deserialize_space

    text = metadata.get(key)
    if text is None:
        return None
    try:
        if not isinstance(text, str):
            raise TypeError(f"a {type(text).__name__}, not a string")
        space = deserialize_space(text)
        if not isinstance(space, spaces.Space):
            raise TypeError(f"a {type(space).__name__}")
    except Exception as err:  # any part of the JSON may be wrong: its type, numbers, dtype
        raise InvalidArgumentError(
            f"{where}: metadata.json's {key} is not a serialized space "
            f"({type(err).__name__}: {err}). The dataset is damaged; write it again."
        ) from err
    return space


def _spaces_from_env_spec(
    metadata: dict[str, Any], trusted: str | None, where: str, stored: dict[str, Any]
) -> dict[str, spaces.Space]:
    """The spaces of the env the dataset's ``env_spec`` names, made only if its entry
    point is ``trusted`` (and no wrapper is named)."""
    missing = [key for key in _SPACE_KEYS if stored[key] is None]
    try:
        spec = json.loads(metadata["env_spec"])
        entry_point = spec["entry_point"]
        wrappers = spec.get("additional_wrappers") or []
    except Exception as err:  # absent, not JSON, not an object: no env to name
        raise InvalidArgumentError(
            f"{where}: metadata.json has no {' or '.join(missing)} and no readable env_spec "
            "to rebuild them from. Write the dataset again with its spaces (to_minari and "
            "Minari's DataCollector store them)."
        ) from err
    if trusted is None or entry_point != trusted or wrappers:
        named = "" if not wrappers else f" and the wrappers {wrappers!r}"
        raise InvalidArgumentError(
            f"{where}: metadata.json has no {' or '.join(missing)}; they would come from "
            f"making the env its env_spec names (entry point {entry_point!r}{named}), which "
            "imports and runs that code. from_minari does so only when you name the entry "
            f"point: from_minari(..., trusted_entry_point={entry_point!r}) if you trust it "
            "(no wrappers), else write the dataset again with its spaces "
            f"(trusted_entry_point was {trusted!r})."
        )
    from gymnasium.envs.registration import EnvSpec

    try:
        env = gymnasium.make(EnvSpec.from_json(metadata["env_spec"]))
    except Exception as err:  # the spec's fields or the trusted env itself
        raise InvalidArgumentError(
            f"{where}: making the env of its env_spec (entry point {entry_point!r}, trusted) "
            f"failed ({type(err).__name__}: {err}); write the dataset again with its spaces."
        ) from err
    try:
        return {"observation_space": env.observation_space, "action_space": env.action_space}
    finally:
        env.close()


def _index(index: Any, total: int, name: str) -> int:
    if isinstance(index, bool) or not isinstance(index, int | np.integer) or index < 0:
        raise InvalidArgumentError(
            f"from_minari({name}, episode_indices=...): expected ints >= 0, got {index!r}."
        )
    if index >= total:
        raise InvalidArgumentError(
            f"from_minari({name}, episode_indices=...): episode {index} is out of range; the "
            f"dataset has {total} episodes."
        )
    return int(index)


class _EpisodeCheck:
    """Checks one stored episode (Minari's dict of its fields) and builds its Episode;
    errors name the episode (``where``) and the field."""

    def __init__(self, where: str) -> None:
        self.where = where

    def error(self, field: str, problem: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{self.where}, field {field}: {problem}. The episode is inconsistent and is "
            "refused; write the dataset again from complete episodes."
        )

    def episode(
        self, data: Any, index: int, obs_space: spaces.Space, action_space: spaces.Space
    ) -> Episode:
        if not isinstance(data, Mapping):
            raise self.error("(all)", f"expected Minari's episode dict, got {type(data).__name__}")
        reward = self.numeric(data.get("rewards"), "rewards", "biuf")
        if reward.ndim != 1:
            raise self.error("rewards", f"expected [L], got shape {list(reward.shape)}")
        bad = np.flatnonzero(~np.isfinite(reward))
        if len(bad):
            raise self.error("rewards", f"step {bad[0]} is {reward[bad[0]]}; expected finite")
        steps = len(reward)
        ends = [self.flags(data.get(key), key, steps) for key in ("terminations", "truncations")]
        obs = self.in_space(data.get("observations"), obs_space, steps + 1, "observations")
        action = self.in_space(data.get("actions"), action_space, steps, "actions")
        infos = data.get("infos") or {}
        if not isinstance(infos, Mapping):
            raise self.error("infos", f"expected a dict, got {type(infos).__name__}")
        # The final row belongs to the final observation, where no action was taken.
        extras = self.rows(infos.get("extras", {}), steps + 1, "infos.extras")
        return Episode(
            obs=obs,
            action=action,
            reward=reward.astype(np.float64),
            extras=jax.tree.map(lambda x: x[:steps], extras),
            terminated=bool(steps and ends[0][-1]),
            truncated=bool(steps and ends[1][-1]),
            episode_id=self.constant(infos, "episode_id", steps + 1, index),
            env_id=self.constant(infos, "env_id", steps + 1, 0),
        )

    def numeric(self, value: Any, field: str, kinds: str) -> np.ndarray:
        array = np.asarray(value) if isinstance(value, np.ndarray | list | tuple) else None
        if array is None or array.dtype.kind not in kinds:
            got = type(value).__name__ if array is None else str(array.dtype)
            raise self.error(field, f"expected an array of dtype kind {kinds!r}, got {got}")
        return array

    def flags(self, value: Any, field: str, steps: int) -> np.ndarray:
        flags = self.numeric(value, field, "biu")
        if flags.shape != (steps,) or not np.isin(flags, (0, 1)).all():
            raise self.error(
                field,
                f"expected [{steps}] flags (one per reward), got {flags.dtype}{list(flags.shape)}",
            )
        early = np.flatnonzero(flags[:-1])
        if len(early):
            raise self.error(
                field, f"the episode ends at step {early[0]}, before its last step {steps - 1}"
            )
        return flags.astype(np.bool_)

    def in_space(self, value: Any, space: spaces.Space, rows: int, field: str) -> Any:
        """``value``: ``rows`` rows of ``space``, each in it."""
        if isinstance(space, spaces.Dict):
            if not isinstance(value, Mapping) or set(value) != set(space.spaces):
                got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
                raise self.error(field, f"expected the keys {sorted(space.spaces)}, got {got}")
            return {
                k: self.in_space(value[k], sub, rows, f"{field}.{k}") for k, sub in space.items()
            }
        if isinstance(space, spaces.Tuple):
            if not isinstance(value, tuple | list) or len(value) != len(space.spaces):
                raise self.error(field, f"expected a tuple of {len(space.spaces)} parts")
            return tuple(
                self.in_space(v, sub, rows, f"{field}[{i}]")
                for i, (v, sub) in enumerate(zip(value, space.spaces))
            )
        array = self.numeric(value, field, "biuf")
        shape, _ = jr_spaces.leaf_spec(space)
        if array.shape != (rows, *shape):
            raise self.error(
                field,
                f"expected {rows} rows of shape {list(shape)}, got "
                f"{array.dtype}{list(array.shape)}",
            )
        inside = _rows_in_space(array, space)
        if not inside.all():
            row = int(np.flatnonzero(~inside)[0])
            raise self.error(field, f"row {row} ({array[row]!r}) is outside {space}")
        return array

    def rows(self, tree: Any, rows: int, field: str) -> Any:
        """A dict tree of arrays of ``rows`` rows (numeric)."""
        if isinstance(tree, Mapping):
            return {k: self.rows(v, rows, f"{field}.{k}") for k, v in tree.items()}
        array = self.numeric(tree, field, "biufc")
        if array.ndim < 1 or len(array) != rows:
            raise self.error(field, f"expected {rows} rows (one per observation), got shape "
                             f"{list(array.shape)}")  # fmt: skip
        return array

    def constant(self, infos: Mapping[str, Any], key: str, rows: int, default: int) -> int:
        """``infos[key]``: one int >= 0 repeated on every row (``default`` if absent)."""
        if key not in infos:
            return default
        array = self.numeric(infos[key], f"infos.{key}", "iu")
        if array.shape != (rows,) or (array != array[:1]).any() or (array < 0).any():
            raise self.error(
                f"infos.{key}",
                f"expected one int >= 0 on each of {rows} rows, got "
                f"{array.dtype}{list(array.shape)}",
            )
        return int(array[0])


def _rows_in_space(array: np.ndarray, space: spaces.Space) -> np.ndarray:
    """Which rows of ``array`` (``[n, *space.shape]``) lie in ``space``."""
    axes = tuple(range(1, array.ndim))
    if isinstance(space, spaces.Box):
        if np.issubdtype(space.dtype, np.integer) and array.dtype.kind == "f":
            return np.zeros(len(array), np.bool_)  # fractions in an integer Box
        inside = (array >= space.low) & (array <= space.high)  # NaN: outside
    elif isinstance(space, spaces.Discrete):
        inside = (array >= space.start) & (array < space.start + space.n)
    elif isinstance(space, spaces.MultiDiscrete):
        inside = (array >= space.start) & (array < space.start + space.nvec)
    elif isinstance(space, spaces.MultiBinary):
        inside = (array == 0) | (array == 1)
    else:
        return np.array([space.contains(row) for row in array], np.bool_)
    if not isinstance(space, spaces.Box) and array.dtype.kind == "f":
        inside &= array == np.round(array)
    return np.all(inside, axis=axes) if axes else inside


def _final_flag(length: int, value: bool) -> np.ndarray:
    flags = np.zeros(length, np.bool_)
    flags[-1:] = value
    return flags


def _infos(episode: Episode) -> dict[str, Any]:
    rows = episode.length + 1
    return {
        "env_id": np.full(rows, episode.env_id, np.int64),
        "episode_id": np.full(rows, episode.episode_id, np.int64),
        "extras": jax.tree.map(
            lambda x: np.concatenate([np.asarray(x), np.zeros_like(np.asarray(x)[:1])]),
            dict(episode.extras),
        ),
    }


def _cast(action: Any, space: spaces.Space) -> Any:
    """``action`` (a batch over steps) in the dtypes of ``space``'s leaves."""
    if isinstance(space, spaces.Dict):
        return {key: _cast(action[key], sub) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_cast(a, sub) for a, sub in zip(action, space.spaces))
    return np.asarray(action).astype(space.dtype, copy=False)


__all__ = ["MAX_METADATA_BYTES", "from_minari", "to_minari"]

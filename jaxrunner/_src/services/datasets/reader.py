"""Reading a Minari dataset back as Episodes (:func:`from_minari`), its metadata as data only."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import gymnasium
from gymnasium import spaces

from jaxrunner._src.arg_checks import is_int
from jaxrunner._src.core.episode import Episode
from jaxrunner._src.services.datasets.episode_check import EpisodeCheck, import_minari
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

MAX_METADATA_BYTES = 1 << 26
"""The most bytes a dataset's ``metadata.json`` may take (:func:`from_minari`)."""
_SPACE_KEYS = ("observation_space", "action_space")


def from_minari(
    dataset: Any,
    episode_indices: Sequence[int] | None = None,
    *,
    trusted_entry_point: str | None = None,
) -> list[Episode]:
    """Reads a Minari dataset's episodes as :class:`~jaxrunner.Episode`\\ s, checking each.

    A dataset id is opened as data only: ``metadata.json`` is read (within
    :data:`MAX_METADATA_BYTES`) and the spaces rebuilt from the serialized spaces in it;
    nothing the dataset names is imported or run, unless ``trusted_entry_point`` names it
    (docs/evaluation-and-datasets.md, "What from_minari trusts").

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
    minari = import_minari()
    if not isinstance(dataset, str | minari.MinariDataset):
        raise InvalidArgumentTypeError(
            f"from_minari(dataset={dataset!r:.80}): expected a dataset id (str) or a "
            f"minari.MinariDataset; got {type(dataset).__name__}."
        )
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
    if episode_indices is None:
        episode_indices = range(total) if isinstance(dataset, str) else [*dataset.episode_indices]
    indices = [_index(i, total, name) for i in episode_indices]
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
        check = EpisodeCheck(f"from_minari({name}): episode {index}")
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
                f"{where}: {meta_path} is {size} bytes, more than the {MAX_METADATA_BYTES} "
                "a dataset's metadata may take; it is not a Minari dataset's metadata (check "
                "the file, or rebuild the dataset)."
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
    if not is_int(total, low=0):
        raise InvalidArgumentError(
            f"{where}: metadata.json has total_episodes={total!r}; expected an int >= 0."
        )
    stored = {key: _stored_space(metadata, key, where) for key in _SPACE_KEYS}
    if None in stored.values():
        made = _spaces_from_env_spec(metadata, trusted_entry_point, where, stored)
        stored = {key: made[key] if stored[key] is None else stored[key] for key in _SPACE_KEYS}
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
    return storage, obs_space, action_space, int(total)  # type: ignore[arg-type]  # checked


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
    if not is_int(index, low=0):
        raise InvalidArgumentError(
            f"from_minari({name}, episode_indices=...): expected ints >= 0, got {index!r}."
        )
    if index >= total:
        raise InvalidArgumentError(
            f"from_minari({name}, episode_indices=...): episode {index} is out of range; the "
            f"dataset has {total} episodes."
        )
    return int(index)

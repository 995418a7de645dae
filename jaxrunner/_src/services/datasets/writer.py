"""Writing Episodes as a Minari dataset (:func:`to_minari`)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable, Mapping
from typing import Any

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner._src import space_arrays
from jaxrunner._src.arg_checks import check_dict, check_space, is_int
from jaxrunner._src.connectors.pipeline import Connectors
from jaxrunner._src.core.episode import AgentEpisode, Episode
from jaxrunner._src.services.datasets.episode_check import EpisodeCheck, import_minari
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

DATASET_ID = re.compile(r"(?:[-_\w][-_\w/]*[-_\w]+/)?[-_\w]+?-v\d+")
"""Minari's ``(namespace/)name-v(version)``, the version required: Minari's own pattern
makes it optional, then fails on a missing one with a bare ``TypeError``."""


OWN = ("env", "observation_space", "action_space")
"""The arguments of ``minari.create_dataset_from_buffers`` that are ``to_minari``'s own."""


def to_minari(
    episodes: Iterable[Episode],
    dataset_id: str,
    *,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    env: str | None = None,
    seeds: Mapping[int, int] | None = None,
    include_faulty: bool = False,
    connectors: Connectors | None = None,
    **metadata: Any,
) -> Any:
    """Writes ``episodes`` as the Minari dataset ``dataset_id`` and returns it (a
    ``minari.MinariDataset``; ``minari.load_dataset(dataset_id)`` opens it later).

    The dataset lands in ``$MINARI_DATASETS_PATH`` (default ``~/.minari/datasets``);
    an existing ``dataset_id`` is refused (Minari overwrites none). Actions are stored as
    the env received them (through ``connectors``' action connectors, Box actions
    clipped, cast to the space's dtype), observations losslessly.

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
            (``Episode.faulty``; stored as truncated; those cut before their first step
            hold no transition and are left out). Left out by default.
        connectors: the runner's ``Connectors`` where it has action connectors
            (``RescaleActions``): an episode keeps the policy's actions, and these map
            them to what the env received. Without them, such episodes are stored with
            the policy's actions.
        **metadata: passed to ``minari.create_dataset_from_buffers`` (e.g.
            ``algorithm_name``, ``author``, ``description``).

    Raises:
        InvalidArgumentError: ``dataset_id`` is not of Minari's form or names a dataset
            that exists; an episode is not complete (not seen from its reset, or not
            finished), is an ``AgentEpisode``, or does not fit the spaces (the check
            :func:`from_minari` makes on reading, made before anything is written); an
            ``extras`` entry's name holds a ``/`` (it would read back nested); a seed is
            not an int >= 0; a metadata argument is one Minari does not take, or Minari
            refuses it or ``env`` as it writes. A write that fails leaves no dataset
            behind.
        InvalidArgumentTypeError: a space is not a gymnasium space, ``episodes`` not an
            iterable of Episodes, or ``dataset_id`` not a str.
    """
    minari = import_minari()
    from minari.data_collector import EpisodeBuffer
    from minari.storage import get_dataset_path

    # Before the episodes are converted: Minari checks the id only once they are.
    _check_dataset_id(dataset_id, get_dataset_path)
    if not isinstance(episodes, Iterable):
        raise InvalidArgumentTypeError(
            f"to_minari(episodes={episodes!r:.80}): expected an iterable of jaxrunner.Episode "
            "objects, e.g. runner.sample_episodes(n)."
        )
    check_space("to_minari", "observation_space", observation_space)
    check_space("to_minari", "action_space", action_space)
    clip = space_arrays.clip_box_actions(action_space)
    if connectors is not None and not isinstance(connectors, Connectors):
        raise InvalidArgumentTypeError(
            f"to_minari(connectors={connectors!r:.80}): expected None or the runner's "
            "jaxrunner.connectors.Connectors."
        )
    to_env = connectors.env_action if connectors is not None and connectors.action else None
    seeds = check_dict("to_minari", "seeds", seeds, "e.g. {0: 42}: episode id -> its reset seed")
    seeds = dict(seeds or {})
    for key, seed in seeds.items():
        if not is_int(key, low=0) or not is_int(seed, low=0):
            raise InvalidArgumentError(
                f"to_minari(seeds={{{key!r}: {seed!r}}}, ...): expected episode ids (ints "
                ">= 0) mapped to their reset seeds (ints >= 0)."
            )
    buffers = []
    for k, episode in enumerate(episodes):
        if isinstance(episode, AgentEpisode):
            raise InvalidArgumentError(
                f"to_minari: got an AgentEpisode of agent {episode.agent_id!r}; a Minari "
                "dataset holds single-agent episodes (Minari has no multi-agent format). "
                "Write the episodes of a single-agent runner."
            )
        if not isinstance(episode, Episode):
            raise InvalidArgumentTypeError(
                f"to_minari(episodes=...): item {k} is a {type(episode).__name__}; expected "
                "jaxrunner.Episode objects, e.g. from runner.sample_episodes(n)."
            )
        # A faulty episode cut before its first step holds no transition to store.
        if episode.faulty and (not include_faulty or episode.length == 0):
            continue
        if not episode.is_complete:
            raise InvalidArgumentError(
                f"to_minari: episode {episode.episode_id} of env {episode.env_id} is not "
                f"complete (start_step={episode.start_step}, terminated="
                f"{episode.terminated}, truncated={episode.truncated}); a dataset holds "
                "whole episodes. Collect them with runner.sample_episodes(n)."
            )
        _check_extras_names(episode)
        action = episode.action
        if to_env is not None:  # the policy's actions, as the env received them
            action = jax.device_get(to_env(jax.tree.map(jnp.asarray, action)))
        action = action if clip is None else clip(action)
        fields = {
            "observations": jax.tree.map(np.asarray, episode.obs),
            "actions": space_arrays.as_space_dtypes(action_space, action),
            "rewards": np.asarray(episode.reward, np.float64),
            "terminations": _final_flag(episode.length, episode.terminated),
            "truncations": _final_flag(episode.length, episode.truncated),
            "infos": _infos(episode),
        }
        # What from_minari would refuse is not written: the same check, before any write.
        where = f"to_minari: episode {episode.episode_id} of env {episode.env_id}"
        fix = "pass a single env's spaces (envs.single_observation_space, ...) and its episodes"
        EpisodeCheck(where, fix).episode(fields, k, observation_space, action_space)
        seed = seeds.get(episode.episode_id)
        # Typed lists by Minari, which stores any array-like.
        buffers.append(EpisodeBuffer(id=len(buffers), seed=seed, **fields))  # type: ignore[arg-type]
    if not buffers:
        raise InvalidArgumentError(
            "to_minari: no episodes to write (faulty ones are left out unless include_faulty=True)."
        )
    takes = inspect.signature(minari.create_dataset_from_buffers).parameters
    any_key = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in takes.values())
    unknown = [] if any_key else sorted(set(metadata) - (set(takes) - {"dataset_id", "buffer"}))
    if unknown:
        raise InvalidArgumentError(
            f"to_minari({unknown[0]}=...): minari.create_dataset_from_buffers takes no such "
            f"metadata; it takes {sorted(set(takes) - {'dataset_id', 'buffer', *OWN})}."
        )
    options: dict[str, Any] = {"env": env, **metadata}
    if env is None:
        options.update(observation_space=observation_space, action_space=action_space)
    if "jpeg_encoding" in takes:
        options.setdefault("jpeg_encoding", False)  # lossless, as the episodes came
    existed = get_dataset_path(dataset_id).exists()
    try:
        return minari.create_dataset_from_buffers(dataset_id, buffers, **options)
    except BaseException as err:
        if not existed and get_dataset_path(dataset_id).exists():  # half written
            minari.delete_dataset(dataset_id)
        # Minari checks env= and the metadata as it writes (author=5: a bare assert).
        if isinstance(err, TypeError | ValueError | AssertionError | gymnasium.error.Error):
            raise InvalidArgumentError(
                f"to_minari({dataset_id!r}): Minari refused to write the dataset "
                f"({type(err).__name__}: {err}); nothing was written. Check env= (a gymnasium "
                "id, EnvSpec or env) and the metadata arguments against "
                "minari.create_dataset_from_buffers."
            ) from err
        raise


def _check_dataset_id(dataset_id: Any, get_dataset_path: Any) -> None:
    if not isinstance(dataset_id, str):
        raise InvalidArgumentTypeError(
            f"to_minari(dataset_id={dataset_id!r:.80}): expected a str, Minari's "
            '"(namespace/)name-v(version)", e.g. "jaxrunner/cartpole/ppo-v0".'
        )
    if not DATASET_ID.fullmatch(dataset_id):
        raise InvalidArgumentError(
            f"to_minari(dataset_id={dataset_id!r}): not a Minari dataset id; give "
            '"(namespace/)name-v(version)": letters, digits, "-" and "_", a version, and '
            'a namespace (if any) of 2 characters or more, e.g. "jaxrunner/cartpole/ppo-v0".'
        )
    path = get_dataset_path(dataset_id)
    if path.exists():
        raise InvalidArgumentError(
            f"to_minari(dataset_id={dataset_id!r}): that dataset exists ({path}) and Minari "
            "never overwrites one; give another name or version, or delete it first "
            f"(minari.delete_dataset({dataset_id!r}))."
        )


def _check_extras_names(episode: Episode) -> None:
    """Refuses an extras key with a "/": Minari's HDF5 storage reads it as a path, so it
    would come back as nested dicts ({"a": {"b": ...}} for "a/b"), not as written."""
    for path, _ in jax.tree_util.tree_flatten_with_path(dict(episode.extras))[0]:
        keys = [str(getattr(p, "key", "")) for p in path]
        bad = next((k for k in keys if "/" in k), None)
        if bad is not None:
            where = "".join(f"[{k!r}]" for k in keys[: keys.index(bad) + 1])
            raise InvalidArgumentError(
                f"to_minari: episode {episode.episode_id} of env {episode.env_id} has the "
                f"extras entry {where}, whose name holds a '/'; Minari stores it as nested "
                "groups, so it would read back as another structure. Rename it, or leave it "
                "out (episode.replace(extras=...)); for an info entry, name the ones to "
                "keep in EnvRunner(info_keys=...)."
            )


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

"""The per-step callbacks' episodes under way at a save: one pickle beside the sub-envs',
written and read (only on request, as theirs) so that they go on after a restore."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import numpy as np

from jaxrunner._src.checkpoints.format import bytes_check
from jaxrunner._src.checkpoints.reader import CheckpointReader
from jaxrunner._src.core.npz_file import NpzReader
from jaxrunner._src.core.runner_state import RunnerParts
from jaxrunner._src.samplers.callbacks import LiveEpisode


def put_live_episodes(arrays: dict[str, np.ndarray], parts: RunnerParts) -> bool:
    """Adds the per-step callbacks' episodes under way as one pickle (``live_episodes``);
    returns whether there were any."""
    live = parts.sampler.live_episodes()
    if not live:
        return False
    try:
        blob = pickle.dumps(live)
    except Exception as err:  # e.g. an open file in user_data: they restart at a restore
        warnings.warn(
            f"{parts.runner}.save(): the callbacks' live episodes could not be pickled "
            f"({type(err).__name__}: {err}); at a restore they start again from the "
            "restored observations.",
            stacklevel=4,
        )
        return False
    arrays["live_episodes"] = np.frombuffer(blob, np.uint8)
    return True


def read_live_episodes(
    reader: CheckpointReader, npz: NpzReader, meta: dict[str, Any], ids: np.ndarray, sampler: Any
) -> list[LiveEpisode] | None:
    """The saved live episodes, unpickled: one :class:`LiveEpisode` per env, of the
    episode under way there (``ids``); None where none were saved or ``sampler`` has no
    per-step callbacks."""
    saved = meta.get("live_episodes", False)
    if not isinstance(saved, bool):
        raise reader.error(f"has metadata field live_episodes={saved!r}; expected a bool")
    if not saved or not sampler.live_episodes():
        return None
    blob = npz.read("live_episodes", "live_episodes", "u", bytes_check).tobytes()
    try:
        live = pickle.loads(blob)
    except Exception as err:
        raise reader.error(f"has a live_episodes pickle that fails to load ({err!r:.200})") from err
    if not isinstance(live, list) or len(live) != len(ids):
        raise reader.error(f"has live_episodes that are not {len(ids)} episodes")
    for i, episode in enumerate(live):
        if (
            not isinstance(episode, LiveEpisode)
            or episode.env_id != i
            or episode.episode_id != int(ids[i])
        ):
            raise reader.error(
                f"has live_episodes[{i}] that is not env {i}'s episode {int(ids[i])} "
                "under way (the sampler state's)"
            )
    return live

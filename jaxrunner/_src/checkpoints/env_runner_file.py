"""Reading an :class:`~jaxrunner.EnvRunner` checkpoint that may be damaged or hostile into
a checked, frozen :class:`Checkpoint`; nothing is applied to the runner here."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.checkpoints import format as checkpoint_format
from jaxrunner._src.checkpoints.format import Part
from jaxrunner._src.checkpoints.reader import CheckpointReader
from jaxrunner._src.core.episode import Episode
from jaxrunner._src.core.npz_reader import NpzReader
from jaxrunner._src.core.runner_state import Runner

FORMAT = "jaxrunner.EnvRunner checkpoint"
VERSION = 2
"""Version 2: the sync backend's sub-env pickles hold each sub-env's restart state."""
READS = (1, 2)
"""The versions this reader takes."""
MAX_META_BYTES = checkpoint_format.MAX_META_BYTES
MAX_RESTORE_BYTES = 1 << 33
"""The most bytes a checkpoint's arrays may take in memory (8 GiB), an ``EnvRunner``'s
or a ``MultiAgentRunner``'s; read at each restore."""

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
    """Unfinished episodes ``sample_episodes`` holds (kept only when the envs resume)."""
    finished: tuple[Episode, ...]
    """Complete episodes ``sample_episodes`` holds, not yet returned."""


# -- the reader ----------------------------------------------------------------------------


class CheckpointFile(CheckpointReader):
    """The checkpoint at ``path``, read and checked for ``runner``; nothing
    is applied. Every failure is an :class:`~jaxrunner.errors.InvalidArgumentError`
    naming the field.

    Args:
        runner: the runner it will restore (its structure is what the file must have).
        path: the file.
    """

    def __init__(self, runner: Runner, path: str | os.PathLike) -> None:
        super().__init__("EnvRunner", path, runner.state.metrics)
        self.runner = runner

    def read(self, load_env_pickles: bool, max_bytes: int = MAX_RESTORE_BYTES) -> Checkpoint:
        """Reads and checks the whole file; touches nothing of the runner.

        Raises:
            InvalidArgumentError: the file is not a checkpoint of this runner's kind, or
                a value in it is damaged; the message names the field.
        """
        with self.open(load_env_pickles, max_bytes) as npz:
            meta = self._check_meta(npz)
            runner = self.runner
            params = self.read_like(npz, "params", runner.get_params(), "params")
            state = self.read_like(npz, "sampler", runner.sampler.get_state(), "sampler state")
            ids, next_id, steps_done = self._check_book(state)
            metrics = self.read_metrics(npz)
            # Valid and dropped steps: no episode the runner kept has more.
            most = int(metrics["counters"][0] + metrics["counters"][2])
            kept = {
                key: self._read_episodes(npz, key, meta[key], next_id, most)
                for key in ("finished", "fragments")
            }
            snapshots = None
            if meta["envs"] == "pickle" and load_env_pickles:
                snapshots = self.read_snapshots(npz, meta["num_envs"])
            self.refuse_unreferenced(npz, meta)
        fragments, finished = kept["fragments"], kept["finished"]
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

    def _check_meta(self, npz: NpzReader) -> dict[str, Any]:
        meta = self.read_meta(npz, FORMAT, READS)
        here = {
            "sampler": type(self.runner.sampler).__name__,
            "num_envs": int(self.runner.envs.num_envs),
        }
        self.check_same(meta, here, "same kind of backend, same num_envs")
        kinds = ("pytree",) if isinstance(self.runner.envs, JaxVectorEnv) else ("pickle", "none")
        self.check_common_meta(meta, kinds)
        for key in ("fragments", "finished"):
            self.check_list(meta, key)
        return meta

    def _check_book(self, state: dict[str, Any]) -> tuple[np.ndarray, int, int]:
        """Checks the sampler's episode bookkeeping; returns each env's current episode
        id, the next free id and the steps closed so far."""
        if "book" in state:  # the host samplers
            return self.check_book(state["book"], "sampler/book")
        return self.check_rollout(state["rollout"], "sampler/rollout")  # the scan sampler

    # -- episodes ----------------------------------------------------------------------------

    def _read_episodes(
        self, npz: NpzReader, prefix: str, metas: list[Any], next_id: int, most: int
    ) -> tuple[Episode, ...]:
        spaces = self.runner.get_spaces()
        specs = self.episode_specs(spaces["observation_space"], spaces["action_space"])
        return tuple(
            self._read_episode(npz, prefix, k, meta, next_id, specs, most)
            for k, meta in enumerate(metas)
        )

    def _read_episode(
        self,
        npz: NpzReader,
        prefix: str,
        k: int,
        meta: Any,
        next_id: int,
        specs: dict[str, dict[tuple[Part, ...], tuple[tuple[int, ...], np.dtype]]],
        most: int,
    ) -> Episode:
        """Episode ``k`` of ``prefix``: its metadata ``meta`` checked, then its arrays
        (at most ``most`` steps)."""
        where, base = f"{prefix}[{k}]", f"{prefix}/{k}"
        num_envs = int(self.runner.envs.num_envs)
        self.check_episode_meta(meta, where, EPISODE_SCALARS, next_id, num_envs)
        return Episode(
            **self.read_steps(npz, where, base, meta, specs, most),
            **{field: meta[field] for field in EPISODE_FIELDS},
        )

    def _check_kept(
        self, fragments: tuple[Episode, ...], finished: tuple[Episode, ...], ids: np.ndarray
    ) -> None:
        """The kept episodes fit each other and the bookkeeping."""
        self.check_alike(
            [(f"fragments[{k}]", e) for k, e in enumerate(fragments)]
            + [(f"finished[{k}]", e) for k, e in enumerate(finished)]
        )
        envs_with = [e.env_id for e in fragments]
        for k, episode in enumerate(fragments):
            self.require(not episode.is_done, f"fragments[{k}]", "that is finished")
            self.require(
                episode.episode_id == ids[episode.env_id],
                f"fragments[{k}].episode_id",
                f"{episode.episode_id}, not the current episode of env {episode.env_id}",
            )
        self.require(len(set(envs_with)) == len(envs_with), "fragments", "with two for one env")
        finished_ids = [e.episode_id for e in finished]
        self.require(len(set(finished_ids)) == len(finished_ids), "finished", "with a repeated id")
        for k, episode in enumerate(finished):
            self.require(episode.is_complete, f"finished[{k}]", "that is not complete")
            self.require(
                episode.episode_id not in set(ids.tolist()),
                f"finished[{k}].episode_id",
                f"{episode.episode_id}, the id of an episode still running",
            )

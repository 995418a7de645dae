"""Reading a runner's checkpoint that may be damaged or hostile into a checked, frozen
:class:`Checkpoint`, for either runner; nothing is applied to the runner here."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.checkpoints.format import bytes_check
from jaxrunner._src.checkpoints.kept_episodes import KeptEpisodeReader, kept_episodes
from jaxrunner._src.checkpoints.live_episodes import read_live_episodes
from jaxrunner._src.core.agent_groups import DEFAULT_POLICY_ID
from jaxrunner._src.core.npz_file import NpzReader
from jaxrunner._src.core.runner_state import RunnerParts
from jaxrunner._src.samplers.info_arrays import is_recorder_state
from jaxrunner._src.samplers.policy_step import ActorState

FORMAT = "jaxrunner checkpoint"
VERSION = 4
"""Version 4: one format for every runner: params by policy id, the policy ids and agents
in the metadata (an ``EnvRunner`` has one of each)."""
LEGACY_READS = {"EnvRunner": (1, 2, 3), "MultiAgentRunner": (1, 3)}
"""The earlier versions each runner still reads, by the runner their format named
(``RunnerParts.file_format``): 3 has version 4's layout, as has a multi-agent 1; a
single-agent 1 and 2 hold one policy's params tree and no policy ids or agents (1 also
lacks the sub-env pickles' restart state)."""
MAX_RESTORE_BYTES = 1 << 33
"""The most bytes a checkpoint's arrays may take in memory (8 GiB); read at each restore."""

OPTIONAL_KEPT = {"EnvRunner": ("callback_fragments",)}
"""Kept episodes a runner's files may lack, by ``RunnerParts.file_format``, read as none:
a single-agent runner saved no callback fragments before its ``on_agent_episode_end``
ran (version 4 files of then, and earlier versions)."""


def legacy_format(runner: str) -> str:
    """The ``format`` of ``runner``'s checkpoints before version 4
    (``"jaxrunner.EnvRunner checkpoint"``)."""
    return f"jaxrunner.{runner} checkpoint"


def identity(parts: RunnerParts) -> dict[str, Any]:
    """What a restoring runner must share with the saved one (JSON values)."""
    return {
        "sampler": getattr(parts.sampler, "saved_as", type(parts.sampler).__name__),
        "num_envs": int(parts.envs.num_envs),
        "policy_ids": [g.policy_id for g in parts.groups],
        "possible_agents": [a for g in parts.groups for a in g.agents],
    }


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """A checkpoint read and checked against the runner it restores: ready to apply."""

    params: dict[str, Any]
    """Policy id -> params, in the runner's structure (device arrays)."""
    sampler_state: Any
    """The sampler's state, in the structure of the runner's ``sampler.get_state()``."""
    steps_done: int
    """Env steps every env had closed when it was saved (seeds the fresh resets)."""
    metrics_state: Any
    """The metrics' counters, windows and timers (``metrics.get_state()``)."""
    seed: int
    """The saved runner's seed."""
    envs: str
    """How the envs were saved: ``"pytree"`` (in the sampler state), ``"pickle"``
    (sub-env pickles) or ``"none"``."""
    envs_note: str
    """Why, as the saving runner said it (or why the pickles cannot be restored here)."""
    env_snapshots: tuple[bytes, ...] | None
    """One pickle per sub-env; None unless saved, opted in to and restorable here."""
    live_episodes: list[Any] | None
    """The per-step callbacks' episodes under way, one per env, unpickled and checked
    against the sampler state; None unless saved with the sub-envs' pickles, opted in
    to, and this runner has per-step callbacks."""
    kept: dict[str, tuple[Any, ...]]
    """The kept episodes, as :func:`kept_episodes` (kept only when the envs resume,
    but ``finished``)."""
    info_names: dict[str, Any] | None
    """The ``info_keys`` recorder's names (``sampler.info_names()``); None where the
    runner recorded no infos or the file is older than them."""


class CheckpointFile(KeptEpisodeReader):
    """The checkpoint at ``path``, read and checked for the runner of ``parts`` (whose
    structure the file must have); nothing is applied. Every failure is an
    :class:`~jaxrunner.errors.InvalidArgumentError` naming the field."""

    def read(self, load_env_pickles: bool, max_bytes: int = MAX_RESTORE_BYTES) -> Checkpoint:
        """Reads and checks the whole file (of this runner's kind, every value whole);
        touches nothing of the runner."""
        parts = self.parts
        with self.open(load_env_pickles, max_bytes) as npz:
            meta = self._check_meta(npz)
            params = dict(parts.state.params)
            if self._one_tree(meta):
                tree = self.read_like(npz, "params", params[DEFAULT_POLICY_ID], "params")
                params = {DEFAULT_POLICY_ID: tree}
            else:
                params = self.read_like(npz, "params", params, "params")
            state = self.read_like(npz, "sampler", parts.sampler.get_state(), "sampler state")
            ids, next_id, steps_done = self._check_state(state)
            metrics = self.read_metrics(npz)
            most = (  # valid and dropped (agent) steps: no kept episode has more
                int(metrics["agents"]["counters"].sum())
                if "agents" in metrics
                else int(metrics["counters"][0] + metrics["counters"][2])
            )
            specs = {
                g.policy_id: {
                    "obs": space_arrays.leaf_spaces(g.observation_space),
                    "action": space_arrays.leaf_spaces(g.action_space),
                }
                for g in parts.groups
            }
            kept = {
                key: tuple(
                    self._read_episode(npz, key, k, m, next_id, specs, most)
                    for k, m in enumerate(meta[key])
                )
                for key in kept_episodes(parts)
            }
            envs, envs_note, snapshots, live = meta["envs"], meta["envs_note"], None, None
            if envs == "pickle" and load_env_pickles:
                if parts.envs.can_snapshot:
                    snapshots = tuple(  # bytes, not unpickled here
                        npz.read(f"envs/{i}", f"envs/{i}", "u", bytes_check).tobytes()
                        for i in range(self.num_envs)
                    )
                    live = read_live_episodes(self, npz, meta, ids, parts.sampler)
                else:  # saved on the sync backend, restored on another: new episodes
                    name = type(parts.envs).__name__
                    envs, envs_note = "none", f"{name} cannot restore sub-env snapshots"
            self.refuse_unreferenced(npz, meta)
        self._check_alike(kept)
        for key, episodes in kept.items():
            if key == "finished":
                self._check_finished(episodes, ids)
            else:
                self._check_fragments(key, episodes, ids)
        return Checkpoint(
            params=params,
            sampler_state=state,
            steps_done=steps_done,
            metrics_state=metrics,
            seed=meta["seed"],
            envs=envs,
            envs_note=envs_note,
            env_snapshots=snapshots,
            live_episodes=live,
            kept=kept,
            info_names=self._info_names(meta),
        )

    def _check_meta(self, npz: NpzReader) -> dict[str, Any]:
        kind = self.parts.file_format
        reads = {FORMAT: (VERSION,), legacy_format(kind): LEGACY_READS[kind]}
        meta = self.read_meta(npz, reads)
        here = identity(self.parts)
        if self._one_tree(meta):  # no policy ids or agents then
            here = {key: here[key] for key in ("sampler", "num_envs")}
        self.check_same(meta, here, "same envs, policy ids and num_envs")
        envs = ("pytree",) if self.parts.sampler.on_device else ("pickle", "none")
        self.check_common_meta(meta, envs)
        optional = OPTIONAL_KEPT.get(self.parts.file_format, ())
        for key in kept_episodes(self.parts):
            if key in optional and key not in meta:
                meta[key] = []
            if not isinstance(meta.get(key), list):
                raise self.error(f"has a metadata field {key} that is not a list")
        return meta

    def _info_names(self, meta: dict[str, Any]) -> dict[str, Any] | None:
        names = meta.get("info_names")
        if names is not None and not is_recorder_state(names):
            raise self.error(
                "has a metadata field info_names that is not an info_keys recorder's names "
                "(every: a bool; keys, unseen and reported: lists of names, unseen among keys)"
            )
        return names

    def _one_tree(self, meta: dict[str, Any]) -> bool:
        """An ``EnvRunner`` checkpoint of version 1 or 2: params as the one policy's tree."""
        return meta["format"] == legacy_format("EnvRunner") and meta["version"] < 3

    # -- state -------------------------------------------------------------------------------

    def _check_state(self, state: Any) -> tuple[np.ndarray, int, int]:
        """Checks the sampler state's episode bookkeeping (a scan sampler's ``RolloutState``,
        a host sampler's ``EpisodeBook``) and, where it has them, each agent slot's running
        episode (lengths in range, returns finite); returns each env's current episode id,
        the next free id and the env steps closed so far."""
        if isinstance(state, dict) and "rollout" in state:  # the scan sampler's
            rollout, where = state["rollout"], "sampler/rollout"
            ids, returns = np.asarray(rollout.episode_id), np.asarray(rollout.episode_return)
            next_id, steps_done = int(rollout.next_episode_id), int(rollout.num_steps)
            step = np.asarray(rollout.episode_step)
            # No episode is longer than the steps every env took (the host samplers'
            # episode_begin is checked likewise); a longer one records steps past them.
            ok = ((step >= 0) & (step <= steps_done)).all()
            self.require(ok, f"{where}/episode_step", f"outside [0, {steps_done}]")
            # Each policy row's step count seeds its action keys: none took more steps
            # than every env (JaxMARL-style agents act on their turns only: fewer).
            for name, env_steps in _actor_env_steps(rollout.actor).items():
                ok = ((env_steps >= 0) & (env_steps <= steps_done)).all()
                self.require(ok, f"{where}/{name}", f"outside [0, {steps_done}]")
            returns_name, lengths_name = "return", "length"
            running = {
                f"sampler/running/{pid}/": (r["return"], r["length"])
                for pid, r in state.get("running", {}).items()
            }
        else:  # the host samplers'
            book, where = state["book"] if isinstance(state, dict) else state.book, "sampler/book"
            ids, returns, begin = book["episode_id"], book["episode_return"], book["episode_begin"]
            next_id, steps_done = int(book["next_episode_id"]), int(book["steps_done"])
            self.require(steps_done >= 0, f"{where}/steps_done", f"{steps_done} < 0")
            bad = (begin < 0) | (begin > steps_done)
            self.require(not bad.any(), f"{where}/episode_begin", f"outside [0, {steps_done}]")
            returns_name, lengths_name = "running_return", "running_length"
            groups = {} if isinstance(state, dict) else state.groups
            running = {
                f"sampler/groups/{pid}/": (g.running_return, g.running_length)
                for pid, g in groups.items()
            }
        self.check_ids(ids, next_id, returns, where)
        for name, (returns, lengths) in running.items():
            ok = ((lengths >= 0) & (lengths <= steps_done)).all()
            self.require(ok, name + lengths_name, f"outside [0, {steps_done}]")
            self.require(np.isfinite(returns).all(), name + returns_name, "not finite")
        return ids, next_id, steps_done


def _actor_env_steps(actor: Any) -> dict[str, Any]:
    """The scan sampler's per-row step counts by their name in the checkpoint: a one-agent
    env's ``actor/env_steps``, a JaxMARL-style env's ``actor/actors/<policy id>/env_steps``."""
    if isinstance(actor, ActorState):
        return {"actor/env_steps": np.asarray(actor.env_steps)}
    actors = actor["actors"].items()
    return {f"actor/actors/{pid}/env_steps": np.asarray(a.env_steps) for pid, a in actors}

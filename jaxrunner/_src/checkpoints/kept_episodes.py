"""The episodes a runner keeps between samples, as a checkpoint saves them and as its
reader reads and checks them back."""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any

import jax
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.checkpoints.format import leading
from jaxrunner._src.checkpoints.reader import CheckpointReader, EpisodeSpaces
from jaxrunner._src.core.agent_groups import DEFAULT_POLICY_ID
from jaxrunner._src.core.episode import AgentEpisode, Episode
from jaxrunner._src.core.npz_file import NpzReader
from jaxrunner._src.core.runner_state import RunnerParts
from jaxrunner._src.samplers.info_arrays import INFOS, INFOS_PRESENT

EPISODE_SCALARS: dict[type, dict[str, type]] = {
    cls: {
        f.name: typing.get_type_hints(cls)[f.name]
        for f in dataclasses.fields(cls)
        if not f.metadata.get("pytree_node", True)
    }
    for cls in (Episode, AgentEpisode)
}
"""Per kind of kept episode, its scalar (static) fields and their types, kept in the JSON.
An ``AgentEpisode`` also saves its ``env_step`` array beside its steps."""
EPISODE_DEFAULTS = {"faulty": False}
"""Scalar fields a file's kept episodes may lack, and the value they then take: a
``MultiAgentRunner``'s files of version 1, and of version 3 until it kept ``faulty``,
have none."""


def kept_episodes(parts: RunnerParts) -> dict[str, list[Any]]:
    """The episodes a runner keeps between samples, by how they are saved:
    ``sample_episodes``' unfinished ones, ``on_agent_episode_end``'s unfinished ones and
    ``sample_episodes``' finished ones not yet returned."""
    state = parts.state
    return {
        "fragments": list(state.episodes.fragments.values()),
        "callback_fragments": list(state.callback_episodes.fragments.values()),
        "finished": list(state.finished),
    }


class KeptEpisodeReader(CheckpointReader):
    """A checkpoint reader's part that reads and checks the kept episodes."""

    def __init__(self, parts: RunnerParts, path: str | os.PathLike) -> None:
        super().__init__(parts.runner, path, parts.state.metrics)
        self.parts = parts
        self.num_envs = int(parts.envs.num_envs)
        self.scalars = EPISODE_SCALARS[parts.episode_type]
        self.per_agent = "agent_id" in self.scalars
        """Agent episodes: one stream per agent and env, not one per env."""
        self.records_infos = parts.sampler.info_names() is not None
        """``info_keys``: every episode's extras hold the info dicts, empty ones too."""

    def _read_episode(
        self,
        npz: NpzReader,
        prefix: str,
        k: int,
        meta: Any,
        next_id: int,
        specs: dict[str, EpisodeSpaces],
        most: int,
    ) -> Any:
        """Episode ``k`` of ``prefix``: its metadata ``meta`` checked (an agent episode's
        agent of its policy), then its arrays (at most ``most`` steps)."""
        where, base = f"{prefix}[{k}]", f"{prefix}/{k}"
        meta = self._check_episode_meta(meta, where, next_id)
        pid = self._check_agent(meta, where) if self.per_agent else DEFAULT_POLICY_ID
        steps = self.read_steps(npz, where, base, meta, specs[pid], most)
        steps["action"] = self._as_recorded(pid, steps["action"])
        if self.records_infos:  # a file holds no empty dict (it has no leaves)
            steps["extras"] = {INFOS: {}, INFOS_PRESENT: {}, **steps["extras"]}
        scalars = {f: meta[f] for f in self.scalars}
        if not self.per_agent:
            return Episode(**steps, **scalars)
        name = f"{base}/env_step"
        env_step = npz.read(name, name, "i", leading((), np.dtype(np.int64), len(steps["reward"])))
        self.require((env_step >= 0).all(), name, "negative")
        return AgentEpisode(**steps, env_step=env_step, **scalars)

    def _check_agent(self, meta: dict[str, Any], where: str) -> str:
        """An agent episode's policy, one of the runner's, and its agent, one of that
        policy's; returns the policy id."""
        agents = {g.policy_id: g.agents for g in self.parts.groups}
        pid = meta["policy_id"]
        if not isinstance(pid, str) or pid not in agents:
            raise self.error(f"has {where}.policy_id={pid!r}; expected one of {list(agents)}")
        if not isinstance(meta["agent_id"], str) or meta["agent_id"] not in agents[pid]:
            raise self.error(
                f"has {where}.agent_id={meta['agent_id']!r}; policy {pid!r} serves the agents "
                f"{list(agents[pid])}"
            )
        return pid

    def _as_recorded(self, policy_id: str, action: Any) -> Any:
        """Policy ``policy_id``'s kept actions as this runner records them: a host sampler
        in the env's dtypes (earlier multi-agent runners kept the policy's: int32 for a
        Discrete space's int64), a pure-JAX env's scan as its policy gives them."""
        if self.parts.sampler.on_device:
            return action
        space = next(g.action_space for g in self.parts.groups if g.policy_id == policy_id)
        return space_arrays.as_space_dtypes(space, action)

    def _check_episode_meta(self, meta: Any, where: str, next_id: int) -> dict[str, Any]:
        """A kept episode's JSON: an object of its scalar fields and its paths and extras,
        true or false where a bool is due, its episode id issued already, its env in
        range, its start step not negative, truncated if faulty. Returns it with the
        :data:`EPISODE_DEFAULTS` of the fields it lacks (an older file's)."""
        keys = {*self.scalars, "paths", "extras"}
        if not isinstance(meta, dict) or not keys - set(EPISODE_DEFAULTS) <= set(meta) <= keys:
            raise self.error(
                f"has {where} that is not an object of the keys {sorted(keys)} "
                f"({sorted(EPISODE_DEFAULTS)} optional)"
            )
        meta = {**EPISODE_DEFAULTS, **meta}
        for field, kind in self.scalars.items():
            if kind is bool and not isinstance(meta[field], bool):
                raise self.error(f"has {where}.{field}={meta[field]!r}; expected true or false")
        self.int_field(meta["episode_id"], f"{where}.episode_id", 0, next_id - 1)
        self.int_field(meta["env_id"], f"{where}.env_id", 0, self.num_envs - 1)
        self.int_field(meta["start_step"], f"{where}.start_step", 0)
        if meta.get("faulty") and not meta["truncated"]:
            raise self.error(f"has {where}.faulty=true but truncated=false (a faulty one is both)")
        return meta

    def _check_fragments(self, key: str, episodes: tuple[Any, ...], ids: np.ndarray) -> None:
        """Unfinished, one per stream, each of the env's current
        episode (an agent's may be of an earlier one: an agent can leave unended)."""
        seen = set()
        for k, episode in enumerate(episodes):
            where = f"{key}[{k}]"
            self.require(not episode.is_done, where, "that is finished")
            current = int(ids[episode.env_id])
            if self.per_agent:
                self.require(
                    episode.episode_id <= current,
                    f"{where}.episode_id",
                    f"{episode.episode_id}, after the current episode of env {episode.env_id} "
                    f"({current})",
                )
            else:
                self.require(
                    episode.episode_id == current,
                    f"{where}.episode_id",
                    f"{episode.episode_id}, not the current episode of env {episode.env_id}",
                )
            agent, env = (episode.agent_id if self.per_agent else None), episode.env_id
            whose = f"agent {agent!r} of env {env}" if self.per_agent else "one env"
            self.require((agent, env) not in seen, key, f"with two for {whose}")
            seen.add((agent, env))

    def _check_finished(self, episodes: tuple[Any, ...], ids: np.ndarray) -> None:
        """Complete, each (episode, agent) once; an env's own episode
        is none still running."""
        running = set(ids.tolist())
        seen = set()
        for k, episode in enumerate(episodes):
            self.require(episode.is_complete, f"finished[{k}]", "that is not complete")
            if self.per_agent:
                slot = (episode.episode_id, episode.agent_id)
                problem = f"with a repeated (episode id, agent) {slot}"
            else:
                slot, problem = episode.episode_id, "with a repeated id"
                self.require(
                    episode.episode_id not in running,
                    f"finished[{k}].episode_id",
                    f"{episode.episode_id}, the id of an episode still running",
                )
            self.require(slot not in seen, "finished", problem)
            seen.add(slot)

    def _check_alike(self, kept: dict[str, tuple[Any, ...]]) -> None:
        """Every kept episode of a policy has one structure, dtype and trailing shape
        per action and extras leaf."""
        for group in self.parts.groups:
            signature = None
            for key, episodes in kept.items():
                for k, e in enumerate(episodes):
                    if getattr(e, "policy_id", DEFAULT_POLICY_ID) != group.policy_id:
                        continue
                    sig = jax.tree.map(lambda x: (x.dtype, x.shape[1:]), (e.action, e.extras))
                    if signature is not None and sig != signature:
                        raise self.error(
                            f"has {key}[{k}] whose rewards, actions or extras differ in "
                            "structure, dtype or shape from the other kept episodes'"
                        )
                    signature = sig

"""Reading a :class:`~jaxrunner.MultiAgentRunner` checkpoint (:class:`MultiAgentCheckpointFile`)
into a checked :class:`MultiAgentCheckpoint`, ready to apply."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.checkpoints import env_runner_file as checkpoint_file
from jaxrunner._src.checkpoints.format import Part
from jaxrunner._src.checkpoints.header_checks import leading
from jaxrunner._src.checkpoints.reader import CheckpointReader
from jaxrunner._src.core.episode import AgentEpisode
from jaxrunner._src.core.npz_reader import NpzReader
from jaxrunner._src.core.runner_state import Runner

FORMAT = "jaxrunner.MultiAgentRunner checkpoint"
VERSION = 1
KEPT = ("fragments", "callback_fragments", "finished")
"""The kinds of kept agent episodes, as saved: ``sample_episodes``' unfinished ones,
the callbacks' unfinished ones, ``sample_episodes``' finished ones not yet returned."""
EPISODE_SCALARS = {
    "terminated": bool,
    "truncated": bool,
    "agent_id": str,
    "policy_id": str,
    "env_id": int,
    "episode_id": int,
    "start_step": int,
}
"""The scalar fields of an :class:`AgentEpisode`, kept in the JSON."""
EpisodeSpecs = dict[str, dict[tuple[Part, ...], tuple[tuple[int, ...], np.dtype]]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MultiAgentCheckpoint:
    """A checkpoint read and checked against the runner it restores: ready to apply."""

    params: dict[str, Any]
    """Policy id -> params, in the runner's structure (device arrays)."""
    sampler_state: Any
    """The sampler's state, in the structure of the runner's ``sampler.get_state()``."""
    steps_done: int
    """Env steps every env had closed when it was saved (seeds the fresh resets)."""
    metrics_state: dict[str, Any]
    """``RunnerMetrics.get_state()`` (with agents)."""
    seed: int
    """The saved runner's seed."""
    envs: str
    """How the envs were saved: ``"pytree"`` (a pure-JAX env: in the sampler state),
    ``"pickle"`` (sub-env pickles) or ``"none"``."""
    envs_note: str
    """Why, as the saving runner said it."""
    env_snapshots: tuple[bytes, ...] | None
    """One pickle per sub-env; None unless saved and opted in to."""
    fragments: tuple[AgentEpisode, ...]
    """Unfinished agent episodes ``sample_episodes`` holds (kept only when the envs
    resume)."""
    callback_fragments: tuple[AgentEpisode, ...]
    """Unfinished agent episodes the callbacks' joiner holds (likewise)."""
    finished: tuple[AgentEpisode, ...]
    """Complete agent episodes ``sample_episodes`` holds, not yet returned."""


def shape_of(runner: Runner) -> dict[str, Any]:
    """What a restoring runner must share with the saved one (JSON values)."""
    return {
        "sampler": type(runner.sampler).__name__,
        "num_envs": int(runner.envs.num_envs),
        "policy_ids": list(runner.policy_ids),
        "possible_agents": list(runner.envs.possible_agents),
    }


class MultiAgentCheckpointFile(CheckpointReader):
    """The checkpoint at ``path``, read for ``runner``: every check of an ``EnvRunner``
    checkpoint (:class:`~jaxrunner._src.checkpoints.reader.CheckpointReader`), plus
    the runner's policy ids and agents, each group's state (running lengths in range,
    returns finite), the agent metrics (per-policy and per-agent windows, agent steps
    that add up) and the kept agent episodes (agents of their policy, envs in range, ids
    below the next free one, one unfinished episode per agent and env, finished ones
    complete and distinct).

    Args:
        runner: the runner it will restore (its structure is what the file must have).
        path: the file.
    """

    def __init__(self, runner: Runner, path: str | os.PathLike) -> None:
        super().__init__("MultiAgentRunner", path, runner.state.metrics)
        self.runner = runner
        self.sampler, self.envs = runner.sampler, runner.envs
        self.pure = isinstance(self.envs, JaxVectorEnv)
        """A pure-JAX env: its states are in the sampler state (``envs`` is ``"pytree"``)."""

    def read(
        self, load_env_pickles: bool, max_bytes: int = checkpoint_file.MAX_RESTORE_BYTES
    ) -> MultiAgentCheckpoint:
        """Reads and checks the whole file; touches nothing of the runner.

        Raises:
            InvalidArgumentError: the file is not a checkpoint of this runner's kind, or
                a value in it is damaged; the message names the field.
        """
        runner = self.runner
        with self.open(load_env_pickles, max_bytes) as npz:
            meta = self.read_meta(npz, FORMAT, (VERSION,))
            self.check_same(meta, shape_of(runner), "same envs, policy ids and num_envs")
            self.check_common_meta(meta, ("pytree",) if self.pure else ("pickle", "none"))
            for key in KEPT:
                self.check_list(meta, key)
            params = {pid: runner.get_params(pid) for pid in runner.policy_ids}
            params = self.read_like(npz, "params", params, "params")
            state = self.read_like(npz, "sampler", self.sampler.get_state(), "sampler state")
            ids, next_id, steps_done = self._check_state(state)
            metrics = self._read_metrics(npz)
            # Valid and dropped agent steps: no agent episode the runner kept has more.
            most = int(metrics["agents"]["counters"].sum())
            kept = {key: self._read_episodes(npz, key, meta[key], next_id, most) for key in KEPT}
            envs, envs_note, snapshots = meta["envs"], meta["envs_note"], None
            if envs == "pickle" and load_env_pickles:
                if self.envs.can_snapshot:  # type: ignore[union-attr]  # "pickle": host envs
                    snapshots = self.read_snapshots(npz, meta["num_envs"])
                else:  # saved on the sync backend, restored on another: new episodes
                    name = type(self.envs).__name__
                    envs, envs_note = "none", f"{name} cannot restore sub-env snapshots"
            self.refuse_unreferenced(npz, meta)
        for key in ("fragments", "callback_fragments"):
            self._check_fragments(key, kept[key], ids)
        self._check_finished(kept["finished"])
        return MultiAgentCheckpoint(
            params=params,
            sampler_state=state,
            steps_done=steps_done,
            metrics_state=metrics,
            seed=meta["seed"],
            envs=envs,
            envs_note=envs_note,
            env_snapshots=snapshots,
            fragments=kept["fragments"],
            callback_fragments=kept["callback_fragments"],
            finished=kept["finished"],
        )

    # -- state -------------------------------------------------------------------------------

    def _check_state(self, state: Any) -> tuple[np.ndarray, int, int]:
        """Checks the sampler state's episode bookkeeping and each agent slot's running
        episode (lengths in range, returns finite); returns as ``check_book`` does."""
        if self.pure:  # the scan sampler's
            ids, next_id, steps_done = self.check_rollout(state["rollout"], "sampler/rollout")
            running = {
                f"sampler/running/{pid}/": (r["return"], "return", r["length"], "length")
                for pid, r in state["running"].items()
            }
        else:
            ids, next_id, steps_done = self.check_book(state.book, "sampler/book")
            running = {
                f"sampler/groups/{pid}/": (
                    g.running_return,
                    "running_return",
                    g.running_length,
                    "running_length",
                )
                for pid, g in state.groups.items()
            }
        for where, (returns, returns_name, lengths, lengths_name) in running.items():
            ok = ((lengths >= 0) & (lengths <= steps_done)).all()
            self.require(ok, where + lengths_name, f"outside [0, {steps_done}]")
            self.require(np.isfinite(returns).all(), where + returns_name, "not finite")
        return ids, next_id, steps_done

    def _read_metrics(self, npz: NpzReader) -> dict[str, Any]:
        state = self.read_metrics(npz)
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

    # -- kept agent episodes -----------------------------------------------------------------

    def _read_episodes(
        self, npz: NpzReader, prefix: str, metas: list[Any], next_id: int, most: int
    ) -> tuple[AgentEpisode, ...]:
        specs = {
            g.policy_id: self.episode_specs(g.observation_space, g.action_space)
            for g in self.runner.envs.groups
        }
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
        specs: dict[str, EpisodeSpecs],
        most: int,
    ) -> AgentEpisode:
        """Agent episode ``k`` of ``prefix``: its metadata ``meta`` checked, then its
        arrays (at most ``most`` steps)."""
        where, base = f"{prefix}[{k}]", f"{prefix}/{k}"
        num_envs = int(self.runner.envs.num_envs)
        self.check_episode_meta(meta, where, EPISODE_SCALARS, next_id, num_envs)
        agents = {g.policy_id: g.agents for g in self.runner.envs.groups}
        pid = meta["policy_id"]
        if not isinstance(pid, str) or pid not in agents:
            raise self.error(f"has {where}.policy_id={pid!r}; expected one of {list(agents)}")
        if not isinstance(meta["agent_id"], str) or meta["agent_id"] not in agents[pid]:
            raise self.error(
                f"has {where}.agent_id={meta['agent_id']!r}; policy {pid!r} serves the agents "
                f"{list(agents[pid])}"
            )
        steps = self.read_steps(npz, where, base, meta, specs[pid], most)
        name = f"{base}/env_step"
        env_step = npz.read(name, name, "i", leading((), np.dtype(np.int64), len(steps["reward"])))
        self.require((env_step >= 0).all(), name, "negative")
        return AgentEpisode(**steps, env_step=env_step, **{f: meta[f] for f in EPISODE_SCALARS})

    def _check_fragments(
        self, key: str, episodes: tuple[AgentEpisode, ...], ids: np.ndarray
    ) -> None:
        """Unfinished, alike per policy, one per (agent, env), none of an env episode
        after the env's current one."""
        self._check_alike(key, episodes)
        seen = set()
        for k, episode in enumerate(episodes):
            where = f"{key}[{k}]"
            self.require(not episode.is_done, where, "that is finished")
            current = int(ids[episode.env_id])
            self.require(
                episode.episode_id <= current,
                f"{where}.episode_id",
                f"{episode.episode_id}, after the current episode of env {episode.env_id} "
                f"({current})",
            )
            slot = (episode.agent_id, episode.env_id)
            self.require(slot not in seen, key, f"with two for agent {slot[0]!r} of env {slot[1]}")
            seen.add(slot)

    def _check_finished(self, episodes: tuple[AgentEpisode, ...]) -> None:
        """Complete, alike per policy, each (episode, agent) once."""
        self._check_alike("finished", episodes)
        seen = set()
        for k, episode in enumerate(episodes):
            self.require(episode.is_complete, f"finished[{k}]", "that is not complete")
            slot = (episode.episode_id, episode.agent_id)
            self.require(
                slot not in seen, "finished", f"with a repeated (episode id, agent) {slot}"
            )
            seen.add(slot)

    def _check_alike(self, key: str, episodes: tuple[AgentEpisode, ...]) -> None:
        for pid in self.runner.policy_ids:
            self.check_alike(
                [(f"{key}[{k}]", e) for k, e in enumerate(episodes) if e.policy_id == pid]
            )

"""Checkpoints of a :class:`~jaxrunner.MultiAgentRunner`: save, and resume exactly.
See docs/multi-agent.md and docs/checkpoints.md."""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.checkpoints.env_runner import (
    RestoreReport,
    put_env_snapshot,
    resume_envs,
)
from jaxrunner._src.checkpoints.multi_agent_runner_file import (
    EPISODE_SCALARS,
    FORMAT,
    VERSION,
    MultiAgentCheckpointFile,
    shape_of,
)
from jaxrunner._src.checkpoints.writer import put_steps, put_tree, write_checkpoint
from jaxrunner._src.core.episode import AgentEpisode
from jaxrunner._src.core.runner_state import EpisodeJoiner, Runner, RunnerState

# -- save ----------------------------------------------------------------------------------


def save(runner: Runner, path: str | os.PathLike) -> None:
    """Writes ``runner``'s state to ``path`` (see docs/multi-agent.md, Checkpoints); atomic."""
    arrays: dict[str, np.ndarray] = {}
    envs = runner.envs
    put_tree(arrays, "params", {pid: runner.get_params(pid) for pid in runner.policy_ids})
    put_tree(arrays, "sampler", runner.sampler.get_state())
    state = runner.state
    metrics_paths = put_tree(arrays, "metrics", state.metrics.get_state())
    if isinstance(envs, JaxVectorEnv):  # pure: its states are in the sampler's
        envs_kind, envs_note = "pytree", "the env states are arrays in the sampler's state"
    else:
        envs_kind, envs_note = put_env_snapshot(arrays, envs, envs.can_snapshot)
    kept = {
        "fragments": list(state.episodes.fragments.values()),
        "callback_fragments": list(_callback_joiner(state).fragments.values()),
        "finished": state.finished,
    }
    meta = {
        "format": FORMAT,
        "version": VERSION,
        **shape_of(runner),
        "seed": runner.seed,
        "rollout_length": runner.rollout_length,
        "envs": envs_kind,
        "envs_note": envs_note,
        "metrics": metrics_paths,
        **{key: _put_episodes(arrays, key, episodes) for key, episodes in kept.items()},
    }
    write_checkpoint(path, arrays, meta)


def _callback_joiner(state: RunnerState) -> EpisodeJoiner:
    joiner = state.callback_episodes
    assert joiner is not None, "a MultiAgentRunner always keeps its callbacks' episodes"
    return joiner


def _put_episodes(
    arrays: dict[str, np.ndarray], prefix: str, episodes: list[AgentEpisode]
) -> list[dict[str, Any]]:
    metas = []
    for k, episode in enumerate(episodes):
        meta: dict[str, Any] = {f: t(getattr(episode, f)) for f, t in EPISODE_SCALARS.items()}
        meta.update(put_steps(arrays, f"{prefix}/{k}", episode))
        arrays[f"{prefix}/{k}/env_step"] = np.asarray(episode.env_step, np.int64)
        metas.append(meta)
    return metas


# -- restore -------------------------------------------------------------------------------


def restore(
    runner: Runner, path: str | os.PathLike, load_env_pickles: bool, max_bytes: int
) -> RestoreReport:
    """Makes ``runner`` (new, built as the saved one) continue where the checkpoint at
    ``path`` left off; see :meth:`MultiAgentRunner.restore`. The file is read and
    checked whole before anything of the runner changes; the steps that can fail (the
    sampler state, the sub-env pickles, the fresh resets) come next and are undone if
    one fails; the rest are assignments of values already checked."""
    path = os.fspath(path)
    reader = MultiAgentCheckpointFile(runner, path)
    ckpt, sampler = reader.read(load_env_pickles, max_bytes), reader.sampler

    def restart(seeds: list[int]) -> None:  # host envs only: a pure-JAX env always resumes
        sampler.restart_episodes(seeds)  # type: ignore[union-attr]
        for pid, connectors in runner.connectors.items():  # e.g. running returns restart
            state = connectors.restart_episodes(sampler.get_connector_state(pid))
            sampler.set_connector_state(pid, state)

    envs_restored, note = resume_envs(
        "MultiAgentRunner",
        sampler,
        ckpt,
        lambda blobs: reader.envs.restore_sub_envs(blobs),  # type: ignore[union-attr]
        restart,
        int(runner.envs.num_envs),
        path,
    )
    state = runner.state
    state.params.update(ckpt.params)
    state.metrics.set_state(ckpt.metrics_state)
    runner.seed = ckpt.seed
    state.finished = list(ckpt.finished)
    state.episodes.set_fragments(ckpt.fragments if envs_restored else ())
    _callback_joiner(state).set_fragments(ckpt.callback_fragments if envs_restored else ())
    if not envs_restored:
        warnings.warn(f"MultiAgentRunner.restore({path!r}): {note}.", stacklevel=3)
    return RestoreReport(envs_restored=envs_restored, note=note)

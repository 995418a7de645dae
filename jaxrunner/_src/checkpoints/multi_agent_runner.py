"""Checkpoints of a :class:`~jaxrunner.MultiAgentRunner`: save, and resume exactly.

The format is an ``EnvRunner`` checkpoint's (:mod:`jaxrunner._src.checkpoints.format`:
one ``.npz`` of arrays named by tree paths, a JSON ``__meta__``), of its own format
name, and it is written, read and applied by the same machinery
(:mod:`jaxrunner._src.checkpoints.env_runner`).

What is saved: each policy's params (``params/<policy_id>/...``); the sampler's state
(:meth:`~jaxrunner._src.samplers.multi_agent.MultiAgentSampler.get_state`: the env-level
episode book and, per policy group, the compiled step's keys, step counts, carries and
connector state, the agents' running episode returns and lengths, the turn-based turns
waiting for their transition, and the observations and masks the next step reads; a
pure-JAX env's: the scan's rollout state and the agents' running returns and lengths);
the metrics (:meth:`~jaxrunner._src.core.multi_agent_metrics.MultiAgentMetrics.get_state`); the
agent episodes kept between samples (``sample_episodes``' fragments and finished
episodes not yet returned, the callbacks' fragments).

The envs. A pure-JAX env's states (:class:`~jaxrunner.multi_agent.JaxMultiAgentVectorEnv`)
are arrays in the sampler's state, always saved and restored (as an ``EnvRunner``'s
``JaxVectorEnv``'s). The sync backend (``can_snapshot``) adds a pickle of each sub-env
with its driver's state (the rewards each agent received since its last action, who
acted, who acts next), only unpickled when the caller opts in (``restore(path,
load_env_pickles=True)``): then sampling continues the saved trajectories bit for bit.
Otherwise (or on the process and Ray backends) every env is reset with
``jr.env_seeds((seed, steps_done), num_envs)`` and starts a new episode, with a
:class:`~jaxrunner.RestoreReport` and a warning that say so, exactly as for an
``EnvRunner``.

Restoring reads and checks the whole file first
(:class:`~.multi_agent_runner_file.MultiAgentCheckpointFile`;
a damaged or hostile file is refused with an
:class:`~jaxrunner.errors.InvalidArgumentError` naming the field), then applies it;
a refused restore leaves the runner as it was.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from jaxrunner._src.backends.multi_agent.jax_env import JaxMultiAgentVectorEnv
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
from jaxrunner._src.core.multi_agent_trajectory import AgentEpisode
from jaxrunner._src.core.runner_state import EpisodeJoiner, Runner, RunnerState

# -- save ----------------------------------------------------------------------------------


def save(runner: Runner, path: str | os.PathLike) -> None:
    """Writes ``runner``'s state to ``path`` (see the module docstring); atomic."""
    arrays: dict[str, np.ndarray] = {}
    envs = runner.envs
    put_tree(arrays, "params", {pid: runner.get_params(pid) for pid in runner.policy_ids})
    put_tree(arrays, "sampler", runner.sampler.get_state())
    state = runner.state
    metrics_paths = put_tree(arrays, "metrics", state.metrics.get_state())
    if isinstance(envs, JaxMultiAgentVectorEnv):  # pure: its states are in the sampler's
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
    state.episodes.set_fragments(ckpt.fragments)
    _callback_joiner(state).set_fragments(ckpt.callback_fragments)
    if not envs_restored:
        warnings.warn(f"MultiAgentRunner.restore({path!r}): {note}.", stacklevel=3)
    return RestoreReport(envs_restored=envs_restored, note=note)

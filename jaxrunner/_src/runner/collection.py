"""How ``EnvRunner`` collects: one sample with its agent-episode hooks, samples until
enough episodes are complete, and an iterator of samples."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jaxrunner._src.runner.progress import Progress
from jaxrunner._src.samplers.sampler import attach_episodes, attach_partial


def sample_once(runner: Any, progress: bool = False) -> Any:
    """One ``sampler.sample(params)``, then the per-agent-episode hooks; a failure
    marks the runner unusable."""
    runner._ownership.check_usable("sample")
    total = runner.rollout_length * runner.envs.num_envs
    name = f"{type(runner).__name__}.sample"
    params = runner.kind.from_policy_dict(runner.state.params)
    runner._ownership.sampling = True
    try:
        with Progress(total, enabled=progress, desc=name, unit="env step") as bar:
            traj = runner.sampler.sample(params, progress=bar.update if progress else None)
            bar.update(total)  # a pure-JAX env's scan reports only when it returns
        if runner._on_agent_episode_end is not None:
            done = runner.state.callback_episodes.complete(traj.split_episodes())
            try:
                for episode in runner.kind.agent_episodes(done):
                    runner._on_agent_episode_end(runner, episode)
            except BaseException as err:  # the sample is whole: it goes with the error
                attach_partial(err, traj)
                raise
    except BaseException as err:
        runner._ownership.failure = err
        raise
    finally:
        runner._ownership.sampling = False
    return traj


def sampled_episodes(runner: Any, include_faulty: bool) -> list[Any]:
    """The episodes one more sample completes (seen from their first step; faulty ones
    with ``include_faulty``), in the order they started."""
    return completed(runner, sample_once(runner), include_faulty)


def completed(runner: Any, traj: Any, include_faulty: bool) -> list[Any]:
    """The episodes ``traj`` (the next steps sampled) completes, in the order they started."""
    done = runner.state.episodes.complete(traj.split_episodes())
    return [e for e in done if include_faulty or not e.faulty]


def collect_episodes(
    runner: Any, name: str, num_episodes: int, include_faulty: bool, progress: bool
) -> list[Any]:
    """The loop of ``EnvRunner.sample_episodes`` (its arguments checked): samples until
    ``num_episodes`` complete episodes are available; those beyond stay in the state."""
    state = runner.state
    if not include_faulty:  # kept by a call that included them: skipped now, as they came
        state.finished[:] = [e for e in state.finished if not e.faulty]
    with Progress(num_episodes, enabled=progress, desc=name, unit="episode") as bar:
        bar.update(len(state.finished))
        while len(state.finished) < num_episodes:
            try:
                done = sampled_episodes(runner, include_faulty)
            except BaseException as err:  # the episodes completed so far go with it,
                partial = getattr(err, "partial_trajectory", None)
                if partial is not None:  # those the failed sample completed included
                    state.finished.extend(completed(runner, partial, include_faulty))
                    state.finished.sort(key=state.episodes.order)
                attach_episodes(err, state.take_finished(len(state.finished)))
                raise
            state.finished.extend(done)
            state.finished.sort(key=state.episodes.order)  # one begun earlier ends later
            bar.update(len(state.finished))
    return state.take_finished(num_episodes)


def iterate_samples(
    runner: Any, name: str, num_samples: int | None, progress: bool, reuse_buffers: bool
) -> Iterator[Any]:
    """Yields ``runner.sample()`` ``num_samples`` times (``EnvRunner.iterate``, arguments
    checked), each handed back when the next is asked for if ``reuse_buffers``."""
    per_sample = runner.rollout_length * runner.envs.num_envs
    total = None if num_samples is None else num_samples * per_sample
    done = 0
    with Progress(total, enabled=progress, desc=name, unit="env step") as bar:
        while num_samples is None or done < num_samples:
            traj = runner.sample()
            done += 1
            bar.update(done * per_sample)
            yield traj
            if reuse_buffers:
                runner.release(traj)

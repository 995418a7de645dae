"""The host loop's per-step callbacks: one live episode per env, its hooks run as each
block of envs records a step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxrunner._src.backends.steps import GroupBuffers, MultiAgentStep
from jaxrunner._src.samplers.agent_callbacks import overrides
from jaxrunner._src.samplers.callbacks import Callbacks, LiveEpisode


class LiveEpisodes:
    """Each env's episode under way, for ``callbacks``' per-step hooks (given ``runner``).

    ``one_agent``: a single-agent env (its first observation as it is, its own flags);
    ``reset_steps``: the backend keeps its reset steps, where an episode begins a call
    after the end before it.
    """

    def __init__(
        self, callbacks: Callbacks, runner: Any, num_envs: int, one_agent: bool, reset_steps: bool
    ) -> None:
        self.callbacks, self._runner = callbacks, runner
        self._on_step = overrides(callbacks, "on_episode_step")
        self._one_agent, self._reset_steps = one_agent, reset_steps
        self.episodes: list[LiveEpisode] = []
        self.next_id = num_envs
        """The id of the next episode to start (the book's, counted step by step)."""
        self._reserved = np.zeros(num_envs, np.int64)
        """Reset steps: the id each env's next episode takes at its reset step."""
        self.num_info_keys = 0
        """The info entries (``info_keys="all"``) the view of the sample's buffers holds."""

    def step(self, lo: int, hi: int, t: int, out: MultiAgentStep, rows: Any) -> None:
        """The hooks of envs ``[lo, hi)``'s step ``t`` (recorded in ``rows``): a step,
        then an end where the env's episode ended or its step failed (``faulty``), and
        the start of the next one, with the next id."""
        callbacks, runner, failed = self.callbacks, self._runner, out.failed
        if self._one_agent:  # the env's own flags
            (group,) = out.groups.values()
            terminated, truncated = group.terminated[:, 0], group.truncated[:, 0]
        else:
            terminated, truncated = out.env_done, None
        reset = out.reset_rows
        for j, b in enumerate(range(lo, hi)):
            if reset is not None and reset[j]:  # an episode's first obs: the one reserved
                self.episodes[b] = self.start(b, self._reserved[b], out.groups, lo)
                continue
            live = self.episodes[b]
            if failed is not None and failed[j]:
                live.truncated = live.faulty = True
            else:
                live.add_step(rows, t, float(out.env_reward[j]), out.infos[j])
                live.terminated = bool(terminated[j])
                if truncated is not None:
                    live.truncated = bool(truncated[j])
                if self._on_step:
                    callbacks.on_episode_step(runner, b, live)
                if not (live.terminated or live.truncated):
                    continue
            callbacks.on_episode_end(runner, b, live)
            live.detach()  # a kept episode must not keep the trajectory alive
            if self._reset_steps:  # it starts at the env's reset step, a call later
                self._reserved[b] = self.next_id
            else:
                self.episodes[b] = self.start(b, self.next_id, out.groups, lo)
            self.next_id += 1

    def start(
        self, b: int, episode_id: int, groups: Mapping[str, GroupBuffers], offset: int = 0
    ) -> LiveEpisode:
        """Env ``b``'s episode ``episode_id``, from its first observations (row ``b -
        offset`` of ``groups``: the acting agents', zeros elsewhere); its start hook."""
        if self._one_agent:  # the env's observation, as it is
            (buf,) = groups.values()
            first_obs = jax.tree.map(lambda x: np.array(x[b - offset, 0]), buf.obs)
        else:

            def first(buf: GroupBuffers) -> Any:
                acting = buf.acting[b - offset]
                return jax.tree.map(
                    lambda x: np.where(acting.reshape(-1, *[1] * (x.ndim - 2)), x[b - offset], 0),
                    buf.obs,
                )

            first_obs = {pid: first(buf) for pid, buf in groups.items()}
        live = LiveEpisode(b, int(episode_id), first_obs)
        self.callbacks.on_episode_start(self._runner, b, live)
        return live

    def restart(self, ids: list[int], groups: Mapping[str, GroupBuffers]) -> None:
        """Every env's episode starts again, env ``b``'s with id ``ids[b]``, from the
        latest observations ``groups``."""
        self.episodes = [self.start(b, ids[b], groups) for b in range(len(ids))]

    def detach(self) -> None:
        """The next sample writes other buffers: the episodes copy what they hold."""
        for live in self.episodes:
            live.detach()

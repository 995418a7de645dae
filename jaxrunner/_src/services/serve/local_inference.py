"""Local inference of a PolicyClient: its own ExternalEnv, and each ended episode reported
to the server in chunks."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx
from gymnasium import spaces

import jaxrunner.errors as errors
from jaxrunner._src import space_arrays
from jaxrunner._src.core.episode import Episode
from jaxrunner._src.services.external import AgentRecord, ExternalEnv
from jaxrunner._src.services.serve import wire
from jaxrunner._src.services.serve.client_http import (
    NoAnswerError,
    PolicyServerError,
    ReportError,
    request_json,
)


class LocalEnv(ExternalEnv):
    """An ExternalEnv that hands every ended episode to the client for reporting."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ended: dict[int, Episode | None] = {}  # of the episodes with a step

    def start_episode(
        self, episode_id: int | None = None, training_enabled: bool = True, *, client: str = "local"
    ) -> int:
        """Starts the server's episode ``episode_id`` here: the server's ids are the
        ones to keep unique, and a restarted server numbers from 0 again."""
        if episode_id is not None:
            with self._lock:
                self._episodes.forget_ended(episode_id)
        return super().start_episode(episode_id, training_enabled, client=client)

    def _emit(self, live: AgentRecord, episode: Episode | None) -> None:
        self.ended[live.episode_id] = episode


@dataclasses.dataclass
class EpisodeReport:
    """Reports locally run episodes to the server for a client (its connection,
    spaces and chunk limits at the time of the report)."""

    http: httpx.Client
    observation_space: spaces.Space
    action_space: spaces.Space
    chunk_steps: int
    chunk_bytes: int

    def send(
        self, episode_id: int, episode: Episode | None, final_obs: Any, truncated: bool
    ) -> None:
        """Sends a locally run episode's steps in chunks of at most
        ``report_chunk_bytes`` and ``report_chunk_steps``; the last one ends it. A
        chunk refused as too large (413: nothing recorded) is split and sent again."""
        length = 0 if episode is None else episode.length
        steps = [self.encode_step(episode, t) for t in range(length)]
        tail = "," + json.dumps({"final_obs": final_obs, "truncated": truncated})[1:]
        budget, start = self.chunk_bytes, 0
        while True:
            stop = self.chunk_end(steps, start, budget, len(tail))
            body = self.report_body(steps[start:stop], tail if stop == length else "}")
            try:
                request_json(self.http, "POST", f"/v1/episodes/{episode_id}/report", content=body)
            except (NoAnswerError, httpx.HTTPError) as err:  # unknown whether the chunk arrived
                raise ReportError(
                    f"reporting episode {episode_id} failed after {start} of {length} steps "
                    f"({err!r}); whether the last chunk arrived is unknown, so the server's "
                    "episode is left to its reaper (episode_timeout_s). The steps are in this "
                    "error's episode.",
                    0,
                    "network_error",
                    episode=episode,
                    steps_reported=start,
                    ended_on_server=False,
                ) from err
            except errors.JaxRunnerError as err:  # the server answered: nothing recorded
                if isinstance(err, PolicyServerError) and err.status == 413 and stop - start > 1:
                    budget = max(1, min(budget, len(body)) // 2)
                    continue  # the guard refused it before reading: nothing recorded
                self.abandon(episode_id, episode, start, err)
            if stop == length:
                return
            start = stop

    def encode_step(self, episode: Episode | None, t: int) -> tuple[str, str, str]:
        """Step ``t`` of ``episode`` as the JSON texts of its obs, action and reward."""
        assert episode is not None
        obs = space_arrays.take(self.observation_space, episode.obs, t)
        action = space_arrays.take(self.action_space, episode.action, t)
        return (
            json.dumps(wire.encode_tree(self.observation_space, obs)),
            json.dumps(wire.encode_tree(self.action_space, action)),
            json.dumps(float(episode.reward[t])),
        )

    def chunk_end(
        self, steps: list[tuple[str, str, str]], start: int, budget: int, tail: int
    ) -> int:
        """Where the chunk from ``start`` ends: as many steps as fit ``budget`` bytes
        (at least one) and ``report_chunk_steps``."""
        size = len(self.report_body([], "")) + tail
        stop = start
        while stop < len(steps) and stop - start < self.chunk_steps:
            step = sum(len(part) + 1 for part in steps[stop])  # with its commas
            if stop > start and size + step > budget:
                break
            size += step
            stop += 1
        return stop

    @staticmethod
    def report_body(steps: list[tuple[str, str, str]], tail: str) -> bytes:
        """The JSON body of a report chunk; ``tail`` closes the object ("" leaves it open)."""
        obs, actions, rewards = ([step[i] for step in steps] for i in range(3))
        return (
            f'{{"obs":[{",".join(obs)}],"actions":[{",".join(actions)}],'
            f'"rewards":[{",".join(rewards)}]{tail}'
        ).encode()

    def abandon(
        self, episode_id: int, episode: Episode | None, reported: int, cause: errors.JaxRunnerError
    ) -> None:
        """After a chunk the server refused (nothing of it recorded): ends the
        server's episode as truncated after the ``reported`` steps it has, freeing
        its slot, and raises :class:`ReportError`. Without an episode (no step, or its
        steps could not be stacked) there is no observation to end it on: the server's
        reaper ends it."""
        ended = episode is not None
        try:
            if episode is not None:
                obs = space_arrays.take(self.observation_space, episode.obs, reported)
                body = {"obs": wire.encode_tree(self.observation_space, obs), "truncated": True}
                request_json(self.http, "POST", f"/v1/episodes/{episode_id}/end", body)
        except (httpx.HTTPError, errors.JaxRunnerError):
            ended = False  # the server's reaper ends it after episode_timeout_s
        length = 0 if episode is None else episode.length
        where = "ended there as truncated" if ended else "left to the server's reaper"
        raise ReportError(
            f"reporting episode {episode_id} failed after {reported} of {length} steps: "
            f"{cause} The server keeps the first {reported} steps ({where}); all steps are in "
            "this error's episode. If the server refused a single step as too large, raise "
            "its max_body_bytes.",
            getattr(cause, "status", 0),
            getattr(cause, "code", type(cause).__name__),
            episode=episode,
            steps_reported=reported,
            ended_on_server=ended,
        ) from cause

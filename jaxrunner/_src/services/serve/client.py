"""PolicyClient: the Python side of a :class:`~jaxrunner.serve.PolicyServer`."""

from __future__ import annotations

import json
import os
import threading
import uuid
from typing import Any, Literal

import httpx
import jax

from jaxrunner import errors
from jaxrunner._src import space_arrays as jr_spaces
from jaxrunner._src.runner.policy import Params, Policy
from jaxrunner._src.runner.trajectory import Episode
from jaxrunner._src.services.external import ExternalEnv, ExternalEnvConfig, LiveEpisode
from jaxrunner._src.services.serve import wire
from jaxrunner._src.services.serve.auth import read_token
from jaxrunner._src.space_arrays import check_value


class PolicyServerError(errors.JaxRunnerError, RuntimeError):
    """The server refused a request (401, 413, 415, ...) or failed.

    Attributes:
        status: the HTTP status.
        code: the server's error code (``"unauthorized"``, ...).
    """

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class ReportError(PolicyServerError):
    """A locally run episode could not be reported whole (``inference="local"``).

    Nothing is lost: the first ``steps_reported`` steps are on the server, in an
    episode ended there as truncated at the next observation (so its slot is free),
    unless the failure left unknown whether the last request arrived (a network
    error: then the server's reaper ends it after ``episode_timeout_s``); all of
    them, reported or not, are in ``episode``.

    Attributes:
        episode: the whole episode as run locally.
        steps_reported: how many of its first steps the server recorded.
        ended_on_server: whether the server's episode was ended (its slot freed).
    """

    def __init__(
        self,
        message: str,
        status: int,
        code: str,
        *,
        episode: Episode | None,
        steps_reported: int,
        ended_on_server: bool,
    ) -> None:
        super().__init__(message, status, code)
        self.episode = episode
        self.steps_reported = steps_reported
        self.ended_on_server = ended_on_server


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        detail = response.json()["error"]
        code, message = str(detail["code"]), str(detail["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "http_error", response.text[:200]
    text = f"{message} (HTTP {response.status_code} {code})"
    status = response.status_code
    if status in (404, 410):
        raise errors.EpisodeNotFoundError(text, ended=status == 410)
    kind = {
        409: errors.EpisodeConflictError,
        429: errors.TooManyEpisodesError,
        422: errors.SpaceMismatchError,
    }.get(status)
    if status == 429 and code == "memory_limit":
        kind = errors.MemoryLimitError
    if kind is not None:
        raise kind(text)
    if status == 503 and code == "timeout":
        raise errors.ActionTimeoutError(text)
    raise PolicyServerError(text, status, code)


def open_http(
    url: str,
    token: str | None,
    token_file: str | os.PathLike[str] | None,
    client_id: str | None,
    timeout_s: float,
) -> httpx.Client:
    """The HTTP connection pool of a policy client: its token (given, or read from
    ``token_file``) and client id (random by default) in every request's headers."""
    if token is None and token_file is not None:
        token = read_token(token_file)
    headers = {"X-Client-Id": client_id or f"client-{uuid.uuid4().hex[:12]}"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(
        base_url=url,
        headers=headers,
        timeout=timeout_s,
        # Idle connections expire here before the server's keep-alive (30 s) ends
        # them, so a request never goes out on a connection being closed.
        limits=httpx.Limits(
            max_connections=256, max_keepalive_connections=256, keepalive_expiry=10.0
        ),
    )


def request_json(http: httpx.Client, method: str, path: str, body: Any = None) -> Any:
    """The server's JSON answer to a JSON request; its errors raised as the env's
    (``EpisodeNotFoundError`` for 404/410, ...) or :class:`PolicyServerError`."""
    response = http.request(method, path, json=body)
    _raise_for(response)
    return response.json()


class _LocalEnv(ExternalEnv):
    """An ExternalEnv that hands every ended episode to the client for reporting."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ended: dict[int, Episode | None] = {}

    def _emit(self, live: LiveEpisode, episode: Episode | None) -> None:
        self.ended[live.episode_id] = episode


class PolicyClient:
    """Talks to a policy server; the same calls as :class:`~jaxrunner.ExternalEnv`.

    Args:
        url: the server's URL (``PolicyServer.url``).
        token: the server's token; or ``token_file`` to read it from.
        token_file: a file holding the token (the server's token file).
        inference: ``"remote"``: the server computes every action (one request per
            call). ``"local"``: this client pulls the params every
            ``update_interval_s``, computes actions itself with the same jitted,
            batched policy, and reports each episode's experience when it ends
            (the server scores the actions under its current params, as logged
            actions). Local episodes must end within the server's
            ``episode_timeout_s``.
        policy: the policy, for ``inference="local"`` (the same as the server's).
        update_interval_s: local inference: how often to pull new params.
        seed: local inference: seeds the client's action keys.
        client_id: names this client to the server (per-client episode caps);
            random by default.
        timeout_s: HTTP timeout per request.
        report_chunk_steps: local inference: the most steps per report request.
        report_chunk_bytes: local inference: the most bytes per report request (keep
            it at most the server's ``max_body_bytes``, 1 MiB by default; a chunk
            the server still refuses as too large is split in two and sent again).
        local_config: local inference: batching of the client's own policy calls
            (default: batches of up to 32, one compiled size).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        inference: Literal["remote", "local"] = "remote",
        policy: Policy | None = None,
        update_interval_s: float = 10.0,
        seed: int = 0,
        client_id: str | None = None,
        timeout_s: float = 60.0,
        report_chunk_steps: int = 512,
        report_chunk_bytes: int = 512 * 1024,
        local_config: ExternalEnvConfig | None = None,
    ) -> None:
        for name, value in (
            ("report_chunk_steps", report_chunk_steps),
            ("report_chunk_bytes", report_chunk_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise errors.InvalidArgumentError(
                    f"PolicyClient({name}={value!r}): expected an int >= 1."
                )
        if inference not in ("remote", "local"):
            raise errors.InvalidArgumentError(
                f"PolicyClient(inference={inference!r}): expected 'remote' or 'local'."
            )
        if inference == "local" and not isinstance(policy, Policy):
            raise errors.InvalidArgumentError(
                "PolicyClient(inference='local') needs policy=<the server's jaxrunner.Policy>: "
                "the client computes actions itself."
            )
        self.inference = inference
        self.report_chunk_steps = report_chunk_steps
        self.report_chunk_bytes = report_chunk_bytes
        self._http = open_http(url, token, token_file, client_id, timeout_s)
        spaces_json = self._call("GET", "/v1/spaces")
        if "agents" in spaces_json:
            self._http.close()
            raise errors.InvalidArgumentError(
                f"PolicyClient({url!r}): the server serves a multi-agent env; talk to it "
                "with jaxrunner.serve.MultiAgentPolicyClient."
            )
        self.observation_space = wire.space_from_json(spaces_json["observation_space"])
        self.action_space = wire.space_from_json(spaces_json["action_space"])
        self._local: _LocalEnv | None = None
        self._stop = threading.Event()
        self._updater: threading.Thread | None = None
        self.params_version = -1
        self.num_param_pulls = 0
        if inference == "local":
            assert policy is not None
            self._template = policy.init(jax.random.key(0), self.observation_space)
            params = self._pull_params()
            self._local = _LocalEnv(
                self.observation_space,
                self.action_space,
                policy,
                params,
                seed=seed,
                config=local_config
                or ExternalEnvConfig(
                    max_concurrent=1 << 20, episode_timeout_s=None, max_batch=32, buckets=(32,)
                ),
            )
            self._updater = threading.Thread(
                target=self._update_loop, args=(update_interval_s,), daemon=True
            )
            self._updater.start()

    # -- the ExternalEnv calls ----------------------------------------------------------------

    def start_episode(self, episode_id: int | None = None, training_enabled: bool = True) -> int:
        """Starts an episode on the server; returns its id."""
        body = {"episode_id": episode_id, "training_enabled": training_enabled}
        eid = int(self._call("POST", "/v1/episodes", body)["episode_id"])
        if self._local is not None:
            self._local.start_episode(eid, training_enabled)
        return eid

    def get_action(self, episode_id: int, obs: Any) -> Any:
        """The policy's action for ``obs``."""
        if self._local is not None:
            return self._local.get_action(episode_id, obs)
        obs = check_value(self.observation_space, obs, "obs")
        out = self._call(
            "POST",
            f"/v1/episodes/{episode_id}/action",
            {"obs": wire.encode_tree(self.observation_space, obs)},
        )
        action = wire.decode_tree(self.action_space, out["action"], "action")
        return check_value(self.action_space, action, "action", bounds=False)

    def log_action(self, episode_id: int, obs: Any, action: Any) -> None:
        """Records an action chosen elsewhere."""
        if self._local is not None:
            self._local.log_action(episode_id, obs, action)
            return
        obs = check_value(self.observation_space, obs, "obs")
        action = check_value(self.action_space, action, "action", bounds=False)
        body = {
            "obs": wire.encode_tree(self.observation_space, obs),
            "action": wire.encode_tree(self.action_space, action),
        }
        self._call("POST", f"/v1/episodes/{episode_id}/log_action", body)

    def log_returns(
        self, episode_id: int, reward: float, info: dict[str, Any] | None = None
    ) -> None:
        """Adds ``reward`` to the latest action's reward."""
        if self._local is not None:
            self._local.log_returns(episode_id, reward, info)
            return
        body = {"reward": float(reward), "info": info}
        self._call("POST", f"/v1/episodes/{episode_id}/returns", body)

    def end_episode(self, episode_id: int, obs: Any, *, truncated: bool = False) -> None:
        """Ends the episode at its final observation (terminated, or ``truncated``).

        With ``inference="local"`` this reports the episode's steps, in requests of at
        most ``report_chunk_bytes`` and ``report_chunk_steps``.

        Raises:
            ReportError: the report failed part way; the error holds the episode and
                says how much of it the server has.
        """
        obs = check_value(self.observation_space, obs, "obs")
        encoded_obs = wire.encode_tree(self.observation_space, obs)
        if self._local is None:
            body = {"obs": encoded_obs, "truncated": bool(truncated)}
            self._call("POST", f"/v1/episodes/{episode_id}/end", body)
            return
        self._local.end_episode(episode_id, obs, truncated=truncated)
        episode = self._local.ended.pop(episode_id)
        self._report(episode_id, episode, encoded_obs, bool(truncated))

    def get_metrics(self) -> dict[str, Any]:
        """The server's metrics."""
        return self._call("GET", "/v1/metrics")

    def close(self) -> None:
        self._stop.set()
        if self._updater is not None:
            self._updater.join()
        if self._local is not None:
            self._local.close()
        self._http.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        return request_json(self._http, method, path, body)

    def _call_raw(self, method: str, path: str, content: bytes) -> Any:
        """Like :meth:`_call`, for a body already encoded as JSON."""
        headers = {"Content-Type": "application/json"}
        response = self._http.request(method, path, content=content, headers=headers)
        _raise_for(response)
        return response.json()

    def _report(
        self, episode_id: int, episode: Episode | None, final_obs: Any, truncated: bool
    ) -> None:
        """Sends a locally run episode's steps in chunks of at most
        ``report_chunk_bytes`` and ``report_chunk_steps``; the last one ends it. A
        chunk refused as too large (413: nothing recorded) is split and sent again."""
        length = 0 if episode is None else episode.length
        steps = [self._encode_step(episode, t) for t in range(length)]
        tail = json.dumps({"final_obs": final_obs, "truncated": truncated})[1:]
        budget, start = self.report_chunk_bytes, 0
        while True:
            stop = self._chunk_end(steps, start, budget, len(tail))
            body = self._report_body(steps[start:stop], tail if stop == length else "}")
            try:
                self._call_raw("POST", f"/v1/episodes/{episode_id}/report", body)
            except errors.JaxRunnerError as err:  # the server answered: nothing recorded
                if isinstance(err, PolicyServerError) and err.status == 413 and stop - start > 1:
                    budget = max(1, min(budget, len(body)) // 2)
                    continue  # the guard refused it before reading: nothing recorded
                self._abandon_report(episode_id, episode, start, err)
            except httpx.HTTPError as err:  # unknown whether the chunk arrived
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
            if stop == length:
                return
            start = stop

    def _encode_step(self, episode: Episode | None, t: int) -> tuple[str, str, str]:
        """Step ``t`` of ``episode`` as the JSON texts of its obs, action and reward."""
        assert episode is not None
        obs = jr_spaces.take(self.observation_space, episode.obs, t)
        action = jr_spaces.take(self.action_space, episode.action, t)
        return (
            json.dumps(wire.encode_tree(self.observation_space, obs)),
            json.dumps(wire.encode_tree(self.action_space, action)),
            json.dumps(float(episode.reward[t])),
        )

    def _chunk_end(
        self, steps: list[tuple[str, str, str]], start: int, budget: int, tail: int
    ) -> int:
        """Where the chunk from ``start`` ends: as many steps as fit ``budget`` bytes
        (at least one) and ``report_chunk_steps``."""
        size = len(self._report_body([], "}")) + tail
        stop = start
        while stop < len(steps) and stop - start < self.report_chunk_steps:
            step = sum(len(part) + 1 for part in steps[stop])  # with its commas
            if stop > start and size + step > budget:
                break
            size += step
            stop += 1
        return stop

    @staticmethod
    def _report_body(steps: list[tuple[str, str, str]], tail: str) -> bytes:
        """The JSON body of a report chunk; ``tail`` closes the object."""
        obs, actions, rewards = ([step[i] for step in steps] for i in range(3))
        return (
            f'{{"obs":[{",".join(obs)}],"actions":[{",".join(actions)}],'
            f'"rewards":[{",".join(rewards)}]' + ("," + tail if tail != "}" else tail)
        ).encode()

    def _abandon_report(
        self, episode_id: int, episode: Episode | None, reported: int, cause: errors.JaxRunnerError
    ) -> None:
        """After a chunk the server refused (nothing of it recorded): ends the
        server's episode as truncated after the ``reported`` steps it has, freeing
        its slot, and raises :class:`ReportError`."""
        ended = True
        try:
            if episode is not None:
                obs = jr_spaces.take(self.observation_space, episode.obs, reported)
                body = {"obs": wire.encode_tree(self.observation_space, obs), "truncated": True}
                self._call("POST", f"/v1/episodes/{episode_id}/end", body)
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

    def _pull_params(self) -> Params | None:
        since = None if self.params_version < 0 else self.params_version
        out = self._call("GET", "/v1/params", None) if since is None else self._http_params(since)
        if out["params"] is None:
            return None
        params = wire.decode_params(out["params"], self._template)
        self.params_version = int(out["version"])
        self.num_param_pulls += 1
        return params

    def _http_params(self, since: int) -> Any:
        response = self._http.get("/v1/params", params={"since": since})
        _raise_for(response)
        return response.json()

    def _update_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                params = self._pull_params()
            except (httpx.HTTPError, errors.JaxRunnerError):
                continue  # keep acting with the params we have; try again next time
            if params is not None and self._local is not None:
                self._local.set_params(params)

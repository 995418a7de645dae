"""PolicyClient: the Python side of a :class:`~jaxrunner.serve.PolicyServer`."""

from __future__ import annotations

import os
import threading
from typing import Any, Literal

import httpx
import jax

import jaxrunner.errors as errors
from jaxrunner._src.arg_checks import check_int
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.services.external import ExternalEnvConfig
from jaxrunner._src.services.serve import wire
from jaxrunner._src.services.serve.client_http import open_http, raise_for, request_json
from jaxrunner._src.services.serve.local_inference import EpisodeReport, LocalEnv
from jaxrunner._src.space_arrays import check_value


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
        check_int("PolicyClient", "report_chunk_steps", report_chunk_steps)
        check_int("PolicyClient", "report_chunk_bytes", report_chunk_bytes)
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
        self._local: LocalEnv | None = None
        self._stop = threading.Event()
        self._updater: threading.Thread | None = None
        self.params_version = -1
        self.num_param_pulls = 0
        if inference == "local":
            assert policy is not None
            self._template = policy.init(jax.random.key(0), self.observation_space)
            params = self._pull_params()
            self._local = LocalEnv(
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
        report = EpisodeReport(
            self._http,
            self.observation_space,
            self.action_space,
            self.report_chunk_steps,
            self.report_chunk_bytes,
        )
        report.send(episode_id, episode, encoded_obs, bool(truncated))

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
        raise_for(response)
        return response.json()

    def _update_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                params = self._pull_params()
            except (httpx.HTTPError, errors.JaxRunnerError):
                continue  # keep acting with the params we have; try again next time
            if params is not None and self._local is not None:
                self._local.set_params(params)

"""The Python side of a :class:`~jaxrunner.serve.PolicyServer`: a view per kind of env on the
one client core (:class:`~.client_http.ClientCore`), PolicyClient (one agent, with local
inference) and MultiAgentPolicyClient (``{agent_id: value}`` dicts)."""

from __future__ import annotations

import os
import threading
from typing import Any, ClassVar, Literal

import httpx
import jax
from gymnasium import spaces

import jaxrunner._src.services.external.checks as checks
import jaxrunner.errors as errors
from jaxrunner._src.arg_checks import check_bool, check_config, check_int
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.services.external import ExternalEnvConfig
from jaxrunner._src.services.serve import wire
from jaxrunner._src.services.serve.client_http import (
    MAX_ANSWER_BYTES,
    ClientCore,
    PolicyServerError,
)
from jaxrunner._src.services.serve.local_inference import EpisodeReport, LocalEnv
from jaxrunner._src.space_arrays import check_value


class PolicyClient(ClientCore):
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
        max_answer_bytes: the longest answer read from the server (a longer one raises
            ``PolicyServerError``); raise it for the params of a large policy.
        report_chunk_steps: local inference: the most steps per report request.
        report_chunk_bytes: local inference: the most bytes per report request (keep
            it at most the server's ``max_body_bytes``, 1 MiB by default; a chunk
            the server still refuses as too large is split in two and sent again).
        local_config: local inference: batching of the client's own policy calls
            (default: batches of up to 32, one compiled size).

    Attributes:
        num_param_pulls: local inference: how many times the client has downloaded
            params from the server, the first (at construction) included; a pull that
            finds its params current downloads none and does not count (0 for remote).
    """

    multi_agent: ClassVar[bool] = False

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
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        report_chunk_steps: int = 512,
        report_chunk_bytes: int = 512 * 1024,
        local_config: ExternalEnvConfig | None = None,
    ) -> None:
        check_int("PolicyClient", "report_chunk_steps", report_chunk_steps)
        check_int("PolicyClient", "report_chunk_bytes", report_chunk_bytes)
        if local_config is not None:
            check_config("PolicyClient", local_config, ExternalEnvConfig, "local_config")
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
        super().__init__(url, token, token_file, client_id, timeout_s, max_answer_bytes)
        self.observation_space = wire.space_from_json(self._spaces["observation_space"])
        self.action_space = wire.space_from_json(self._spaces["action_space"])
        self._local: LocalEnv | None = None
        self._stop = threading.Event()
        self._updater: threading.Thread | None = None
        self.params_version = -1
        self.num_param_pulls = 0
        if inference == "local":
            assert policy is not None
            self._template = policy.init(jax.random.key(0), self.observation_space)
            params, self.params_version = self._pull_params()
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
        eid = super().start_episode(episode_id, training_enabled)
        if (local := self._local_env()) is not None:
            local.start_episode(eid, training_enabled)
        return eid

    def get_action(self, episode_id: int, obs: Any) -> Any:
        """The policy's action for ``obs``."""
        if (local := self._local_env()) is not None:
            return local.get_action(episode_id, obs)
        body = {"obs": self._encode(self.observation_space, obs, "obs")}
        out = self._call("POST", f"/v1/episodes/{episode_id}/action", body, fields=("action",))
        return self._decode(self.action_space, out["action"], "action")

    def log_action(self, episode_id: int, obs: Any, action: Any) -> None:
        """Records an action chosen elsewhere."""
        if (local := self._local_env()) is not None:
            local.log_action(episode_id, obs, action)
            return
        body = {
            "obs": self._encode(self.observation_space, obs, "obs"),
            "action": self._encode(self.action_space, action, "action", bounds=False),
        }
        self._call("POST", f"/v1/episodes/{episode_id}/log_action", body)

    def log_returns(
        self, episode_id: int, reward: float, info: dict[str, Any] | None = None
    ) -> None:
        """Adds ``reward`` to the latest action's reward."""
        if (local := self._local_env()) is not None:
            local.log_returns(episode_id, reward, info)
            return
        checks.check_reward(reward, "reward")  # as the env checks them
        checks.check_info(info)  # as the env checks it; never stored, so not sent
        body = {"reward": float(reward)}
        self._call("POST", f"/v1/episodes/{episode_id}/returns", body)

    def end_episode(self, episode_id: int, obs: Any, *, truncated: bool = False) -> None:
        """Ends the episode at its final observation (terminated, or ``truncated``).

        With ``inference="local"`` this reports the episode's steps, in requests of at
        most ``report_chunk_bytes`` and ``report_chunk_steps``.

        Raises:
            ReportError: the report failed part way; the error holds the episode and
                says how much of it the server has.
        """
        truncated = check_bool("end_episode", "truncated", truncated)  # as the env in process
        obs = check_value(self.observation_space, obs, "obs")
        encoded_obs = wire.encode_tree(self.observation_space, obs)
        if (local := self._local_env()) is None:
            body = {"obs": encoded_obs, "truncated": truncated}
            self._call("POST", f"/v1/episodes/{episode_id}/end", body)
            return
        local.end_episode(episode_id, obs, truncated=truncated)
        episode = local.ended.pop(episode_id, None)  # None: no step, or not stacked
        report = EpisodeReport(
            self._http,
            self.observation_space,
            self.action_space,
            self.report_chunk_steps,
            self.report_chunk_bytes,
        )
        report.send(episode_id, episode, encoded_obs, truncated)

    def close(self) -> None:
        self._stop.set()
        if self._updater is not None:
            self._updater.join()
        if self._local is not None:
            self._local.close()
        super().close()

    # -- internals ----------------------------------------------------------------------------

    def _local_env(self) -> LocalEnv | None:
        """The env of local inference (None: remote), once the client is known open: a
        closed client refuses a call as a remote one does, not as its private env."""
        self._check_open()
        return self._local

    def _pull_params(self) -> tuple[Params | None, int]:
        """The server's params and their version (None: unchanged since
        ``params_version``)."""
        since = {} if self.params_version < 0 else {"since": self.params_version}
        out = self._call("GET", "/v1/params", params=since, fields=("params", "version"))
        if out["params"] is None:
            return None, self.params_version
        self.num_param_pulls += 1
        return wire.decode_params(out["params"], self._template), int(out["version"])

    def _update_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                params, version = self._pull_params()
            except (httpx.HTTPError, errors.JaxRunnerError):
                continue  # keep acting with the params we have; try again next time
            if params is not None and self._local is not None:
                self._local.set_params(params)
                self.params_version = version  # once they act: a reader sees both


class MultiAgentPolicyClient(ClientCore):
    """Talks to a policy server serving a multi-agent env: the same calls as
    :class:`~jaxrunner._src.services.external.MultiAgentExternalEnv`, each one request; the server
    computes every action. Values are checked against their agent's space before they
    are sent. Its arguments are those of :class:`~jaxrunner.serve.PolicyClient` (``url``,
    ``token``, ``token_file``, ``client_id``, ``timeout_s``, ``max_answer_bytes``).

    Attributes:
        observation_spaces, action_spaces: ``agent_id -> space``, as the server said.
        policy_ids: ``agent_id -> policy_id``.
    """

    multi_agent: ClassVar[bool] = True

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        client_id: str | None = None,
        timeout_s: float = 60.0,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        super().__init__(url, token, token_file, client_id, timeout_s, max_answer_bytes)
        agents = self._spaces["agents"]
        self.observation_spaces: dict[str, spaces.Space] = {
            a: wire.space_from_json(d["observation_space"]) for a, d in agents.items()
        }
        self.action_spaces: dict[str, spaces.Space] = {
            a: wire.space_from_json(d["action_space"]) for a, d in agents.items()
        }
        self.policy_ids: dict[str, str] = {a: str(d["policy_id"]) for a, d in agents.items()}
        self.possible_agents = tuple(agents)

    def get_action(self, episode_id: int, obs: dict[str, Any]) -> dict[str, Any]:
        """The policies' actions for ``obs`` (``{agent_id: obs}``): ``{agent_id: action}``.

        Raises:
            PolicyServerError: the answer is not an action for each agent of ``obs``
                (``invalid_answer``).
        """
        body = {"obs": self._encode_agents(obs, "get_action", "obs")}
        out = self._call("POST", f"/v1/episodes/{episode_id}/action", body, fields=("actions",))
        actions = out["actions"]
        if not isinstance(actions, dict) or set(actions) != set(obs):
            got = sorted(actions) if isinstance(actions, dict) else type(actions).__name__
            raise PolicyServerError(
                f"get_action(episode_id={episode_id}): the server answered actions for "
                f"{got}, not for the agents asked, {sorted(obs)}; the steps may be recorded "
                "on the server. Is the server a jaxrunner policy server of the same version?",
                200,
                "invalid_answer",
            )
        return {
            agent: self._decode(self.action_spaces[agent], tree, f"actions[{agent!r}]")
            for agent, tree in actions.items()
        }

    def log_action(self, episode_id: int, obs: dict[str, Any], actions: dict[str, Any]) -> None:
        """Records actions chosen elsewhere (``{agent_id: action}``) at ``obs``."""
        body = {
            "obs": self._encode_agents(obs, "log_action", "obs"),
            "actions": self._encode_agents(actions, "log_action", "actions", actions=True),
        }
        self._call("POST", f"/v1/episodes/{episode_id}/log_action", body)

    def log_returns(
        self, episode_id: int, rewards: dict[str, float], info: dict[str, Any] | None = None
    ) -> None:
        """Adds each agent's reward to its latest action's reward."""
        rewards = checks.check_agent_rewards(rewards, self.possible_agents)
        checks.check_info(info)  # as the env checks it; never stored, so not sent
        body = {"rewards": {a: float(r) for a, r in rewards.items()}}
        self._call("POST", f"/v1/episodes/{episode_id}/returns", body)

    def end_agents(self, episode_id: int, obs: dict[str, Any], *, truncated: bool = False) -> None:
        """Ends the agents of ``obs`` (``{agent_id: final_obs}``) while the episode
        goes on."""
        truncated = check_bool("end_agents", "truncated", truncated)
        body = {"obs": self._encode_agents(obs, "end_agents", "obs"), "truncated": truncated}
        self._call("POST", f"/v1/episodes/{episode_id}/end_agents", body)

    def end_episode(self, episode_id: int, obs: dict[str, Any], *, truncated: bool = False) -> None:
        """Ends the episode; ``obs`` holds the final observation of every agent that
        acted and has not ended."""
        truncated = check_bool("end_episode", "truncated", truncated)
        body = {"obs": self._encode_agents(obs, "end_episode", "obs"), "truncated": truncated}
        self._call("POST", f"/v1/episodes/{episode_id}/end", body)

    def _encode_agents(
        self, values: Any, call: str, name: str, *, actions: bool = False
    ) -> dict[str, Any]:
        values = checks.check_agent_dict(values, self.possible_agents, call, name, empty=True)
        agent_spaces = self.action_spaces if actions else self.observation_spaces
        return {
            agent: self._encode(
                agent_spaces[agent], value, f"{name}[{agent!r}]", bounds=not actions
            )
            for agent, value in values.items()
        }

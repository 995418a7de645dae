"""MultiAgentPolicyClient: the Python side of a policy server that serves a
:class:`~jaxrunner._src.services.external.MultiAgentExternalEnv`."""

from __future__ import annotations

import os
from typing import Any

from gymnasium import spaces

import jaxrunner._src.services.external.checks as checks
import jaxrunner.errors as errors
from jaxrunner._src.services.serve import wire
from jaxrunner._src.services.serve.client_http import open_http, request_json
from jaxrunner._src.space_arrays import check_value


class MultiAgentPolicyClient:
    """Talks to a policy server serving a multi-agent env: the same calls as
    :class:`~jaxrunner._src.services.external.MultiAgentExternalEnv`, each one request; the server
    computes every action. Values are checked against their agent's space before they
    are sent.

    Args:
        url: the server's URL (``PolicyServer.url``).
        token: the server's token; or ``token_file`` to read it from.
        token_file: a file holding the token (the server's token file).
        client_id: names this client to the server (per-client episode caps);
            random by default.
        timeout_s: HTTP timeout per request.

    Attributes:
        observation_spaces, action_spaces: ``agent_id -> space``, as the server said.
        policy_ids: ``agent_id -> policy_id``.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        client_id: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self._http = open_http(url, token, token_file, client_id, timeout_s)
        try:
            described = self._call("GET", "/v1/spaces")
            if "agents" not in described:
                raise errors.InvalidArgumentError(
                    f"MultiAgentPolicyClient({url!r}): the server serves a single-agent env; "
                    "talk to it with jaxrunner.serve.PolicyClient."
                )
        except BaseException:
            self._http.close()
            raise
        agents = described["agents"]
        self.observation_spaces: dict[str, spaces.Space] = {
            a: wire.space_from_json(d["observation_space"]) for a, d in agents.items()
        }
        self.action_spaces: dict[str, spaces.Space] = {
            a: wire.space_from_json(d["action_space"]) for a, d in agents.items()
        }
        self.policy_ids: dict[str, str] = {a: str(d["policy_id"]) for a, d in agents.items()}
        self.possible_agents = tuple(agents)

    def start_episode(self, episode_id: int | None = None, training_enabled: bool = True) -> int:
        """Starts an episode on the server; returns its id."""
        body = {"episode_id": episode_id, "training_enabled": training_enabled}
        return int(self._call("POST", "/v1/episodes", body)["episode_id"])

    def get_action(self, episode_id: int, obs: dict[str, Any]) -> dict[str, Any]:
        """The policies' actions for ``obs`` (``{agent_id: obs}``): ``{agent_id: action}``."""
        body = {"obs": self._encode(obs, "get_action", "obs")}
        out = self._call("POST", f"/v1/episodes/{episode_id}/action", body)
        actions = checks.check_agent_dict(
            out["actions"], self.possible_agents, "get_action", "answer", empty=True
        )
        return {
            agent: check_value(
                self.action_spaces[agent],
                wire.decode_tree(self.action_spaces[agent], tree, f"actions[{agent!r}]"),
                f"actions[{agent!r}]",
                bounds=False,
            )
            for agent, tree in actions.items()
        }

    def log_action(self, episode_id: int, obs: dict[str, Any], actions: dict[str, Any]) -> None:
        """Records actions chosen elsewhere (``{agent_id: action}``) at ``obs``."""
        body = {
            "obs": self._encode(obs, "log_action", "obs"),
            "actions": self._encode(actions, "log_action", "actions", actions=True),
        }
        self._call("POST", f"/v1/episodes/{episode_id}/log_action", body)

    def log_returns(self, episode_id: int, rewards: dict[str, float]) -> None:
        """Adds each agent's reward to its latest action's reward."""
        rewards = checks.check_agent_dict(
            rewards, self.possible_agents, "log_returns", "rewards", empty=True
        )
        for agent, reward in rewards.items():
            checks.check_reward(reward, f"rewards[{agent!r}]")
        body = {"rewards": {a: float(r) for a, r in rewards.items()}}
        self._call("POST", f"/v1/episodes/{episode_id}/returns", body)

    def end_agents(self, episode_id: int, obs: dict[str, Any], *, truncated: bool = False) -> None:
        """Ends the agents of ``obs`` (``{agent_id: final_obs}``) while the episode
        goes on."""
        body = {"obs": self._encode(obs, "end_agents", "obs"), "truncated": bool(truncated)}
        self._call("POST", f"/v1/episodes/{episode_id}/end_agents", body)

    def end_episode(self, episode_id: int, obs: dict[str, Any], *, truncated: bool = False) -> None:
        """Ends the episode; ``obs`` holds the final observation of every agent that
        acted and has not ended."""
        body = {"obs": self._encode(obs, "end_episode", "obs"), "truncated": bool(truncated)}
        self._call("POST", f"/v1/episodes/{episode_id}/end", body)

    def get_metrics(self) -> dict[str, Any]:
        """The server's metrics."""
        return self._call("GET", "/v1/metrics")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> MultiAgentPolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        return request_json(self._http, method, path, body)

    def _encode(
        self, values: Any, call: str, name: str, *, actions: bool = False
    ) -> dict[str, Any]:
        """``{agent_id: value}`` checked against each agent's space and encoded."""
        values = checks.check_agent_dict(values, self.possible_agents, call, name, empty=True)
        encoded = {}
        for agent, value in values.items():
            space = (self.action_spaces if actions else self.observation_spaces)[agent]
            checked = check_value(space, value, f"{name}[{agent!r}]", bounds=not actions)
            encoded[agent] = wire.encode_tree(space, checked)
        return encoded

"""The policy server and MultiAgentPolicyClient for a MultiAgentExternalEnv: PettingZoo
envs driven by hand over HTTP, the agent episodes checked exactly; the same guard,
limits and error format as for one agent."""

from __future__ import annotations

import pickle

import gymnasium
import httpx
import jax
import numpy as np
import pytest
from external_helpers import play, run_threads
from external_multi_agent_helpers import assert_matches, make_env, play_parallel, play_turns

pytest.importorskip("fastapi")

import jaxrunner as jr
import jaxrunner.errors as errors
from jaxrunner._src.services.external import ExternalEnvConfig
from jaxrunner._src.services.serve import wire
from jaxrunner._src.services.serve.schema import MAX_AGENTS
from jaxrunner._src.testing.envs import ComingAndGoing, Relay
from jaxrunner.models import mlp_policy
from jaxrunner.serve import (
    MultiAgentPolicyClient,
    PolicyClient,
    PolicyServer,
)


@pytest.fixture
def served(tmp_path):
    token_file = tmp_path / "token"
    env = make_env(ComingAndGoing(), config=ExternalEnvConfig(max_batch=16, buckets=(4, 16)))
    server = PolicyServer(env, token_file=token_file).start()
    yield env, server, token_file
    server.close()
    env.close()


def test_parallel_env_over_http_exactly(served):
    env, server, token_file = served
    with MultiAgentPolicyClient(server.url, token_file=token_file) as client:
        assert client.possible_agents == ("a0", "a1", "a2", "a3")
        assert set(client.policy_ids.values()) == {"policy_0"}
        for seed in (0, 1):
            refs = play_parallel(client, seed, ComingAndGoing())
            assert_matches(env.poll_episodes(), refs)
        metrics = client.get_metrics()
    assert metrics["num_agent_steps"] == 2 * (3 + 5 + 4)  # fresh envs: a2 acts 4 times
    assert metrics["num_dropped_steps"] == 0
    assert metrics["params_version"] == {"policy_0": 0}


def test_the_server_reads_the_kind_each_external_env_declares(tmp_path):
    assert jr.multi_agent.MultiAgentExternalEnv.multi_agent is True
    assert jr.ExternalEnv.multi_agent is False
    with pytest.raises(errors.InvalidArgumentTypeError, match=r"expected a jaxrunner\.ExternalEnv"):
        PolicyServer(object(), token_file=tmp_path / "token")  # type: ignore[arg-type]


def test_turn_based_env_over_http_exactly(tmp_path):
    token_file = tmp_path / "token"
    with (
        make_env(Relay()) as env,
        PolicyServer(env, token_file=token_file) as server,
        MultiAgentPolicyClient(server.url, token_file=token_file) as client,
    ):
        refs = play_turns(client, seed=2)
        assert_matches(env.poll_episodes(), refs)


def test_concurrent_clients_exact_counts(served):
    env, server, token_file = served
    refs = []

    def agent(seed: int) -> None:
        with MultiAgentPolicyClient(server.url, token_file=token_file) as client:
            refs.append(play_parallel(client, seed, ComingAndGoing()))

    run_threads(agent, [(seed,) for seed in range(6)])
    episodes = env.poll_episodes()
    metrics = env.get_metrics()
    steps = sum(len(r.actions) for ref in refs for r in ref.values())
    assert sum(e.length for e in episodes) == steps == metrics["num_agent_steps"]
    assert metrics["num_policy_rows"] == steps and metrics["num_dropped_steps"] == 0
    first_obs = {ref["a0"].obs[0].tobytes(): ref for ref in refs}
    for eid in {e.episode_id for e in episodes}:
        mine = [e for e in episodes if e.episode_id == eid]
        a0 = next(e for e in mine if e.agent_id == "a0")
        assert_matches(mine, first_obs[a0.obs[0].tobytes()])


def test_bad_requests_get_the_error_format_and_lose_nothing(served):
    env, server, token_file = served
    token = token_file.read_text().strip()
    pz = ComingAndGoing()
    obs, _ = pz.reset(seed=3)
    space = pz.observation_space("a0")
    with MultiAgentPolicyClient(server.url, token_file=token_file) as client:
        eid = client.start_episode()
        actions = client.get_action(eid, obs)
        obs2, rewards, *_ = pz.step({a: int(v) for a, v in actions.items()})
        client.log_returns(eid, rewards)
        good = {a: wire.encode_tree(space, o) for a, o in obs2.items()}
        url = f"{server.url}/v1/episodes/{eid}/action"
        auth = {"Authorization": f"Bearer {token}"}
        cases = [
            ({"obs": {**good, "ghost": good["a0"]}}, auth, 422, "unknown agent 'ghost'"),
            (
                {"obs": {**good, "a1": wire.encode_tree(space, np.zeros(3, np.float64))}},
                auth,
                422,
                "obs['a1']",
            ),
            ({"obs": {**good, "a1": [1, 2]}}, auth, 422, "a1"),
            ({"obs": good}, {}, 401, ""),
        ]
        for body, headers, status, text in cases:
            response = httpx.post(url, json=body, headers=headers)
            assert response.status_code == status, (response.status_code, response.text)
            error = response.json()["error"]
            assert set(error) == {"code", "message"} and text in error["message"]
        response = httpx.post(
            url,
            content=pickle.dumps({"obs": good}),
            headers={**auth, "Content-Type": "application/python-pickle"},
        )
        assert response.status_code == 415
        unknown = f"{server.url}/v1/episodes/999/action"
        response = httpx.post(unknown, json={"obs": good}, headers=auth)
        assert response.status_code == 404 and "error" in response.json()
        client.end_agents(eid, {"a0": obs2["a0"]})
        with pytest.raises(errors.EpisodeConflictError, match="have ended"):  # 409
            client.get_action(eid, {"a0": obs2["a0"]})
        with pytest.raises(errors.InvalidArgumentError, match="acted"):  # 422, as the env's
            client.end_episode(eid, {})
        for end in (client.end_agents, client.end_episode):  # as the env in process: no bool()
            with pytest.raises(errors.InvalidArgumentTypeError, match=r"truncated='False'\)"):
                end(eid, {"a1": obs2["a1"]}, truncated="False")
        client.end_episode(eid, {"a1": obs2["a1"]}, truncated=True)
        episodes = {e.agent_id: e for e in env.poll_episodes()}
    assert {a: e.length for a, e in episodes.items()} == {"a0": 1, "a1": 1}
    assert episodes["a1"].truncated and episodes["a0"].terminated
    assert env.get_metrics()["num_policy_rows"] == 2  # no refused request reached a policy


def test_openapi_lists_the_multi_agent_routes_and_agent_counts_are_capped(served):
    _, server, token_file = served
    paths = set(httpx.get(server.url + "/openapi.json").json()["paths"])
    routes = {"action", "log_action", "returns", "end_agents", "end"}
    assert {f"/v1/episodes/{{episode_id}}/{r}" for r in routes} <= paths
    assert "/v1/episodes/{episode_id}/report" not in paths  # local inference: single-agent
    auth = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
    too_many = {"rewards": {f"agent{i}": 0.0 for i in range(MAX_AGENTS + 1)}}
    response = httpx.post(f"{server.url}/v1/episodes/0/returns", json=too_many, headers=auth)
    assert response.status_code == 422 and "error" in response.json()


def test_clients_refuse_the_other_kind_of_server(served, tmp_path):
    _, server, token_file = served
    with pytest.raises(errors.InvalidArgumentError, match="MultiAgentPolicyClient"):
        PolicyClient(server.url, token_file=token_file)
    single_token = tmp_path / "single"
    game = gymnasium.make("CartPole-v1")
    policy = mlp_policy(game.action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), game.observation_space)
    with (
        jr.ExternalEnv(game.observation_space, game.action_space, policy, params) as env,
        PolicyServer(env, token_file=single_token) as single,
    ):
        with pytest.raises(errors.InvalidArgumentError, match="single-agent env"):
            MultiAgentPolicyClient(single.url, token_file=single_token)
        with PolicyClient(single.url, token_file=single_token) as client:
            play(client, seed=0)  # the single-agent routes are unchanged
        assert env.get_metrics()["num_episodes"] == 1


@pytest.mark.parametrize("multi_agent", [False, True], ids=["single", "multi"])
def test_log_returns_takes_info_on_both_kinds_and_refuses_a_bad_one(tmp_path, multi_agent):
    # RLlib's log_returns of both kinds takes an info dict: accepted, not stored, and one
    # that is not a dict is refused the same way by the env, the client and the route.
    game = gymnasium.make("CartPole-v1")
    obs_space, action_space = game.observation_space, game.action_space
    policy = mlp_policy(action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), obs_space)
    if multi_agent:
        env = jr.multi_agent.MultiAgentExternalEnv(
            {"a": obs_space}, {"a": action_space}, policy, {"policy_0": params}
        )
        client_type, one, body = MultiAgentPolicyClient, lambda v: {"a": v}, "rewards"
    else:
        env = jr.ExternalEnv(obs_space, action_space, policy, params)
        client_type, one, body = PolicyClient, lambda v: v, "reward"
    token_file = tmp_path / "token"
    with (
        env,
        PolicyServer(env, token_file=token_file) as server,
        client_type(server.url, token_file=token_file) as client,
    ):
        url = f"{server.url}/v1/episodes/{{}}/returns"
        auth = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        obs, _ = game.reset(seed=0)
        eid = client.start_episode()
        client.get_action(eid, one(obs))
        for caller in (env, client):
            with pytest.raises(
                errors.InvalidArgumentTypeError,
                match=r"^log_returns\(info=\.\.\.\): expected a dict or None, got list\.$",
            ):
                caller.log_returns(eid, one(1.0), [1])  # type: ignore[arg-type]
        refused = httpx.post(url.format(eid), json={body: one(1.0), "info": [1]}, headers=auth)
        assert refused.status_code == 422 and "info" in refused.json()["error"]["message"]
        env.log_returns(eid, one(0.25), {"from": "env"})
        # A gymnasium info, numpy values and all: checked, not stored, so not sent.
        client.log_returns(eid, one(0.5), info={"lives": np.int64(3), "pos": np.zeros(2)})
        sent = httpx.post(url.format(eid), json={body: one(1.0), "info": {"a": 1}}, headers=auth)
        assert sent.status_code == 200, sent.text
        client.end_episode(eid, one(obs))
        (episode,) = env.poll_episodes()
    assert episode.reward.tolist() == [1.75]  # the refused calls added nothing


@pytest.mark.parametrize("client", [PolicyClient, MultiAgentPolicyClient])
@pytest.mark.parametrize("url", ["localhost:1", "127.0.0.1:8000", None])
def test_clients_refuse_a_url_without_its_scheme(client, url):
    with pytest.raises(errors.InvalidArgumentError, match=r"url=.*expected the server's http://"):
        client(url)


@pytest.mark.parametrize("client", [PolicyClient, MultiAgentPolicyClient])
def test_clients_check_their_arguments_and_refuse_calls_after_close(client, served):
    _, server, token_file = served
    with pytest.raises(errors.InvalidArgumentError, match=r"timeout_s=-1\): expected a number > 0"):
        client(server.url, token_file=token_file, timeout_s=-1)  # httpx's own ValueError before
    with pytest.raises(TypeError, match=r"token_file=3\): expected a file path"):
        client(server.url, token_file=3)  # an int would be read as a file descriptor
    # Names the server refuses (422 on every start_episode, UnicodeEncodeError before).
    for name in ("robot 1", "robot/1", "r\u00f4bot", "x" * 65):
        with pytest.raises(errors.InvalidArgumentError, match=r"client_id=.*e\.g\. 'robot-1'"):
            client(server.url, token_file=token_file, client_id=name)
    with pytest.raises(errors.InvalidArgumentTypeError, match=r"client_id=7\): expected a str"):
        client(server.url, token_file=token_file, client_id=7)  # httpx's TypeError before
    named = MultiAgentPolicyClient(server.url, token_file=token_file, client_id="robot-1.a:b_c")
    with named:  # (the server's kind)
        assert named.start_episode() >= 0
    with pytest.raises(TypeError, match=r"ServerConfig\(token_file=3\): expected a file path"):
        PolicyServer(server.env, token_file=3)
    opened = MultiAgentPolicyClient(server.url, token_file=token_file)  # (one _call for both)
    opened.close()
    with pytest.raises(errors.ClosedError, match="called after close"):
        opened.start_episode()  # httpx's own RuntimeError before

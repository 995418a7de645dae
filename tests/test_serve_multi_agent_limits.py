"""The multi-agent policy server under the attacks of issue 43 (its "same attack" list):
agents that never act, large bodies, hostile answers and sockets. Through the public
API; each test failed on d660c28."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading

import jax
import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

import jaxrunner.errors as errors  # noqa: E402
from jaxrunner import ExternalEnvConfig  # noqa: E402
from jaxrunner._src.services.serve import wire  # noqa: E402
from jaxrunner.models import mlp_policy  # noqa: E402
from jaxrunner.multi_agent import MultiAgentExternalEnv  # noqa: E402
from jaxrunner.serve import (  # noqa: E402
    MultiAgentPolicyClient,
    PolicyClient,
    PolicyServer,
    PolicyServerError,
)

OBS_SPACE = spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTION_SPACE = spaces.Discrete(3)
POLICY = mlp_policy(ACTION_SPACE, hidden=(8,))
PARAMS = {"policy_0": POLICY.init(jax.random.key(0), OBS_SPACE)}
OBS = np.zeros(4, np.float32)


def many_agents(num_agents: int, **config) -> MultiAgentExternalEnv:
    """An env of ``num_agents`` agents sharing one policy."""
    agents = [f"a{i}" for i in range(num_agents)]
    config.setdefault("max_batch", 8)
    config.setdefault("buckets", (8,))
    return MultiAgentExternalEnv(
        dict.fromkeys(agents, OBS_SPACE),
        dict.fromkeys(agents, ACTION_SPACE),
        POLICY,
        PARAMS,
        config=ExternalEnvConfig(**config),
    )


@contextlib.contextmanager
def served(env: MultiAgentExternalEnv, tmp_path, **fields):
    token_file = tmp_path / "token"
    with (
        env,
        PolicyServer(env, token_file=token_file, **fields) as server,
        MultiAgentPolicyClient(server.url, token_file=token_file) as client,
    ):
        yield server, client


# -- agents that never act -------------------------------------------------------------------


def test_agents_that_never_act_are_charged_to_the_memory_budget(tmp_path):
    budget = 200_000
    with served(many_agents(64, max_memory_bytes=budget), tmp_path) as (_, client):
        eid = client.start_episode()
        before = client.get_metrics()["memory_bytes"]
        client.log_returns(eid, {f"a{i}": 1.0 for i in range(32)})  # none of them acts
        grown = client.get_metrics()["memory_bytes"] - before
        assert grown >= 32 * 500  # each record costs about 600 B (tracemalloc)
        client.end_agents(eid, {f"a{i}": OBS for i in range(32, 64)})
        assert client.get_metrics()["memory_bytes"] - before >= 2 * grown
        # One token holder naming agents in episode after episode is refused at the cap.
        with pytest.raises(errors.MemoryLimitError, match="max_memory_bytes=200000") as caught:
            for _ in range(budget // grown + 1):
                eid = client.start_episode()
                client.end_agents(eid, {f"a{i}": OBS for i in range(64)})
        assert "new agent record(s)" in str(caught.value)
        metrics = client.get_metrics()
        assert 0.8 * budget <= metrics["memory_bytes"] <= budget
        for eid in range(metrics["num_live_episodes"]):
            client.end_episode(eid, {})
        assert client.get_metrics()["memory_bytes"] == 0  # every record's charge went back


def test_rewards_of_agents_that_never_act_are_counted_unassigned(tmp_path):
    with served(many_agents(4), tmp_path) as (_, client):
        eid = client.start_episode()
        client.log_returns(eid, {"a0": 1.0, "a1": 0.25})  # before any action: onto it
        actions = client.get_action(eid, {"a0": OBS})
        assert set(actions) == {"a0"}
        client.log_returns(eid, {"a0": 2.0, "a2": 0.5, "a3": 4.0})
        client.end_agents(eid, {"a2": OBS})  # a2 never acted
        client.end_episode(eid, {"a0": OBS})  # a1 and a3 never acted either
        metrics = client.get_metrics()
    assert metrics["unassigned_reward"] == 0.25 + 0.5 + 4.0
    assert metrics["episode_return_mean"] == 3.0  # a0's one episode: 1.0 + 2.0


# -- large bodies ----------------------------------------------------------------------------


def test_large_bodies_are_decoded_checked_and_answered_off_the_event_loop(tmp_path, monkeypatch):
    threads = []

    def recording(fn):
        def wrapper(*args, **kwargs):
            threads.append(threading.current_thread().name)
            return fn(*args, **kwargs)

        return wrapper

    # The server's calls only (the client encodes and decodes in this thread).
    for name in ("decode_tree", "encode_tree"):
        monkeypatch.setattr(wire, name, recording(getattr(wire, name)))
    env = many_agents(64, max_batch=64, buckets=(64,))
    with served(env, tmp_path, max_body_bytes=1 << 22) as (_, client):
        eid = client.start_episode()
        obs = {f"a{i}": OBS for i in range(64)}
        assert set(client.get_action(eid, obs)) == set(obs)
        client.log_action(eid, obs, dict.fromkeys(obs, 1))
        client.end_agents(eid, dict(list(obs.items())[:32]))
        client.end_episode(eid, dict(list(obs.items())[32:]))
        assert client.get_metrics()["num_agent_steps"] == 128
    server = [t for t in threads if t != threading.current_thread().name]
    assert len(server) == 64 + 64 + 64 + 64 + 32 + 32  # obs, actions, logged, final obs
    assert "jaxrunner-server" not in server  # the thread running the event loop


# -- hostile answers -------------------------------------------------------------------------


@contextlib.contextmanager
def fake_server(action_answer: bytes, spaces_json: dict | list | None = None):
    """A server that describes two agents (or answers ``spaces_json``), then answers
    every POST with ``action_answer`` (200)."""
    spaces_json = spaces_json or {
        "agents": {
            a: {
                "observation_space": wire.space_to_json(OBS_SPACE),
                "action_space": wire.space_to_json(ACTION_SPACE),
                "policy_id": "policy_0",
            }
            for a in ("a0", "a1")
        }
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self, data: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self.answer(json.dumps(spaces_json).encode())

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.answer(action_answer)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_either_client_refuses_answers_without_the_fields_it_reads():
    one_agent = {"observation_space": wire.space_to_json(OBS_SPACE)}  # no action_space
    no_action = pytest.raises(PolicyServerError, match=r"GET /v1/spaces has no 'action_space'")
    with fake_server(b"{}", one_agent) as url, no_action:
        PolicyClient(url, token="x" * 16)
    one_agent["action_space"] = wire.space_to_json(ACTION_SPACE)
    with fake_server(b"{}", one_agent) as url, PolicyClient(url, token="x" * 16) as client:
        with pytest.raises(PolicyServerError, match=r"/v1/episodes has no 'episode_id'") as caught:
            client.start_episode()
        assert caught.value.code == "invalid_answer"
        with pytest.raises(PolicyServerError, match=r"/v1/episodes/0/action has no 'action'"):
            client.get_action(0, OBS)
    no_actions = pytest.raises(PolicyServerError, match=r"/action has no 'actions'")
    with (
        fake_server(b"[1]") as url,
        MultiAgentPolicyClient(url, token="x" * 16) as client,
        no_actions,
    ):
        client.get_action(0, {"a0": OBS})
    no_agents = pytest.raises(PolicyServerError, match=r"GET /v1/spaces has no 'agents'")
    with fake_server(b"{}", [1]) as url, no_agents:  # (an object without it: the other kind)
        MultiAgentPolicyClient(url, token="x" * 16)


def test_client_refuses_answers_that_omit_agents_are_too_long_or_too_deep():
    one = {"actions": {"a0": wire.encode_array(np.array(1, np.int64))}}
    both = {"obs": {"a0": OBS, "a1": OBS}}
    with (
        fake_server(json.dumps(one).encode()) as url,
        MultiAgentPolicyClient(url, token="x" * 16) as client,
    ):
        assert client.get_action(0, {"a0": OBS}) == {"a0": 1}  # what it asked for
        with pytest.raises(PolicyServerError, match=r"for \['a0'\], not for .*'a1'"):
            client.get_action(0, both["obs"])
    deep = b"[" * 100_000 + b"]" * 100_000
    with fake_server(deep) as url, MultiAgentPolicyClient(url, token="x" * 16) as client:
        with pytest.raises(PolicyServerError, match="nested too deeply") as caught:
            client.get_action(0, both["obs"])
        assert caught.value.code == "invalid_answer"
    long = json.dumps({"actions": {}, "pad": "x" * (1 << 20)}).encode()
    with fake_server(long) as url:
        assert MultiAgentPolicyClient(url, token="x" * 16).max_answer_bytes == 32 << 20
        with MultiAgentPolicyClient(url, token="x" * 16, max_answer_bytes=1 << 16) as client:
            with pytest.raises(PolicyServerError, match="max_answer_bytes=65536") as caught:
                client.get_action(0, both["obs"])
            assert caught.value.code == "answer_too_large"


# -- params and reports ----------------------------------------------------------------------


def test_params_serve_each_policy_and_reports_are_refused_clearly(tmp_path):
    with served(many_agents(4), tmp_path) as (server, client):
        token = (tmp_path / "token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}
        got = httpx.get(f"{server.url}/v1/params?policy_id=policy_0", headers=auth).json()
        assert got["version"] == 0
        params = wire.decode_params(got["params"], PARAMS["policy_0"])
        same = jax.tree.map(np.array_equal, params, PARAMS["policy_0"])
        assert all(jax.tree.leaves(same))
        since = httpx.get(f"{server.url}/v1/params?policy_id=policy_0&since=0", headers=auth)
        assert since.json() == {"version": 0, "params": None}
        # The env's one policy needs no id, as env.get_params() and EnvRunner's need none.
        assert httpx.get(f"{server.url}/v1/params", headers=auth).json() == got
        refused = httpx.get(f"{server.url}/v1/params?policy_id=nope", headers=auth)
        assert refused.status_code == 422
        assert "unknown policy id" in refused.json()["error"]["message"]
        eid = client.start_episode()
        body = {"obs": [], "actions": [], "rewards": []}
        report = httpx.post(f"{server.url}/v1/episodes/{eid}/report", json=body, headers=auth)
        assert report.status_code == 501
        assert report.json()["error"]["code"] == "not_implemented"
        assert "single-agent envs only" in report.json()["error"]["message"]


def test_params_of_an_env_of_several_policies_need_a_policy_id(tmp_path):
    spaces_ = {"a0": OBS_SPACE, "a1": OBS_SPACE}
    env = MultiAgentExternalEnv(
        spaces_,
        dict.fromkeys(spaces_, ACTION_SPACE),
        POLICY,
        {"p0": PARAMS["policy_0"], "p1": PARAMS["policy_0"]},
        policy_mapping_fn={"a0": "p0", "a1": "p1"}.__getitem__,
    )
    with served(env, tmp_path) as (server, _):
        auth = {"Authorization": f"Bearer {(tmp_path / 'token').read_text().strip()}"}
        refused = httpx.get(f"{server.url}/v1/params", headers=auth)
        assert refused.status_code == 422
        assert "policy_id=<id>" in refused.json()["error"]["message"]
        assert httpx.get(f"{server.url}/v1/params?policy_id=p1", headers=auth).status_code == 200


# -- hostile sockets -------------------------------------------------------------------------


def test_new_connection_per_request_clients_are_served_beside_idle_tokenless_sockets(tmp_path):
    """The multi-agent server runs the single-agent one's transport: tokenless idle
    keep-alive sockets, twice the connection cap, never starve a client that opens a
    new connection for every request."""
    cap = 32
    with served(many_agents(4), tmp_path, max_connections=cap) as (server, _):
        host, port = server.url.removeprefix("http://").split(":")
        hostile = []
        for _ in range(2 * cap):  # one tokenless request each, then silence
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            hostile.append(sock)
        auth = {"Authorization": f"Bearer {(tmp_path / 'token').read_text().strip()}"}

        def post(path: str, body: dict) -> dict:
            with httpx.Client(base_url=server.url, headers=auth, timeout=3) as fresh:
                answer = fresh.post(path, json=body)
            assert answer.status_code in (200, 201), answer.text
            return answer.json()

        obs = {a: wire.encode_array(OBS) for a in ("a0", "a1", "a2", "a3")}
        eid = post("/v1/episodes", {})["episode_id"]
        for _ in range(3):
            assert set(post(f"/v1/episodes/{eid}/action", {"obs": obs})["actions"]) == set(obs)
        post(f"/v1/episodes/{eid}/end", {"obs": obs})
        for sock in hostile:
            sock.close()
        assert server.env.get_metrics()["num_agent_steps"] == 12

"""The policy server under slow, impatient and hostile clients (issue 16)."""

from __future__ import annotations

import contextlib
import json
import pickle
import socket
import threading
import time

import gymnasium
import jax
import numpy as np
import pytest
from gated_policy import GatedPolicy

import jaxrunner as jr
from jaxrunner.models import mlp_policy

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from jaxrunner._src.services.serve import wire  # noqa: E402
from jaxrunner.serve import PolicyServer  # noqa: E402

CARTPOLE = gymnasium.make("CartPole-v1")
OBS_SPACE, ACTION_SPACE = CARTPOLE.observation_space, CARTPOLE.action_space
POLICY = mlp_policy(ACTION_SPACE, hidden=(16,))
OBS = np.zeros(4, np.float32)


def make_env(**config) -> jr.ExternalEnv:
    config.setdefault("max_batch", 8)
    config.setdefault("buckets", (8,))
    params = POLICY.init(jax.random.key(0), OBS_SPACE)
    return jr.ExternalEnv(
        OBS_SPACE, ACTION_SPACE, POLICY, params, seed=1, config=jr.ExternalEnvConfig(**config)
    )


def post(url: str, path: str, body: dict, timeout: float = 30) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=timeout)


def when_idle(url: str, path: str, body: dict) -> httpx.Response:
    """Posts until the episode is not busy (409) any more."""
    deadline = time.monotonic() + 10
    while True:
        response = post(url, path, body)
        if response.status_code != 409 or time.monotonic() > deadline:
            return response
        time.sleep(0.01)


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def open_episode(url: str) -> tuple[int, dict]:
    """Starts an episode over HTTP; returns its id and a request body with ``OBS``."""
    eid = post(url, "/v1/episodes", {}).json()["episode_id"]
    return eid, {"obs": wire.encode_array(OBS)}


def one_episode(env: jr.ExternalEnv) -> jr.Episode:
    (episode,) = env.poll_episodes()
    return episode


# -- defects 2 and 3: only delivered actions are steps; a failure frees the episode ----------


def test_http_timeout_then_retry_records_one_step():
    env = make_env(action_timeout_s=0.3)
    gated = GatedPolicy(env)
    with env, PolicyServer(env, require_token=False) as server:
        eid, act = open_episode(server.url)
        gated.gate.clear()
        first = post(server.url, f"/v1/episodes/{eid}/action", act)
        assert first.status_code == 503 and first.json()["error"]["code"] == "timeout"
        gated.gate.set()
        retry = when_idle(server.url, f"/v1/episodes/{eid}/action", act)
        assert retry.status_code == 200
        post(server.url, f"/v1/episodes/{eid}/returns", {"reward": 1.0})
        post(server.url, f"/v1/episodes/{eid}/end", act)
        episode = one_episode(env)
        assert episode.length == 1 and episode.reward.tolist() == [1.0]
        assert env.get_metrics()["num_dropped_steps"] == 1


def _hang_up_during(url: str, path: str, body: dict) -> None:
    """Sends a request, then closes the socket before the answer."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        time.sleep(0.2)  # the server has read it: the request is queued


@pytest.mark.parametrize("answer_before_noticed", [False, True])
def test_http_client_that_hangs_up_gets_no_step(answer_before_noticed):
    env = make_env(action_timeout_s=30)
    gated = GatedPolicy(env)
    with env, PolicyServer(env, require_token=False) as server:
        eid, act = open_episode(server.url)
        gated.gate.clear()
        _hang_up_during(server.url, f"/v1/episodes/{eid}/action", act)
        if answer_before_noticed:  # the action is computed while the client is gone
            gated.gate.set()
        else:  # the server notices the hang-up first and withdraws the request
            wait_for(lambda: any(future.cancelled() for future in list(env._delivery.calls)))
            gated.gate.set()
        wait_for(lambda: env.get_metrics()["num_dropped_steps"] == 1)
        assert when_idle(server.url, f"/v1/episodes/{eid}/action", act).status_code == 200
        post(server.url, f"/v1/episodes/{eid}/end", act)
        assert one_episode(env).length == 1


def test_http_failed_policy_call_frees_the_episode():
    env = make_env(max_concurrent=1)
    gated = GatedPolicy(env)
    with env, PolicyServer(env, require_token=False) as server:
        eid, act = open_episode(server.url)
        gated.fail = 1
        failed = post(server.url, f"/v1/episodes/{eid}/action", act)
        assert failed.status_code == 500 and "Traceback" not in failed.text
        assert post(server.url, f"/v1/episodes/{eid}/action", act).status_code == 200
        assert post(server.url, f"/v1/episodes/{eid}/end", act).status_code == 200
        assert one_episode(env).length == 1
        assert post(server.url, "/v1/episodes", {}).status_code == 201  # the slot is free


# -- defect 1: slow clients are cut off, and cannot starve the others ------------------------


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the socket."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_slow_sockets_are_closed_while_real_clients_are_served(tmp_path):
    env = make_env()
    n_slow = 200
    with env, PolicyServer(env, token_file=tmp_path / "token", read_timeout_s=1.0) as server:
        auth = {"Authorization": f"Bearer {server.token}"}
        slow = [_connect(server.url) for _ in range(n_slow)]
        for i, sock in enumerate(slow):
            if i % 3 == 0:  # half a request line and header
                sock.sendall(b"POST /v1/episodes HTTP/1.1\r\nHost: x\r\nAuthor")
            elif i % 3 == 1:  # headers that promise a body that never comes whole
                sock.sendall(
                    b"POST /v1/episodes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                    b"\r\nContent-Length: 100\r\nAuthorization: Bearer "
                    + server.token.encode()
                    + b'\r\n\r\n{"epi'
                )
            # else: connected, never a byte
        # Every slow socket is open now; a real client is served all the same.
        with httpx.Client(headers=auth, timeout=30) as client:
            for _ in range(3):
                eid = client.post(server.url + "/v1/episodes", json={}).json()["episode_id"]
                act = {"obs": wire.encode_array(OBS)}
                got = client.post(f"{server.url}/v1/episodes/{eid}/action", json=act)
                assert got.status_code == 200, got.text
                assert client.post(f"{server.url}/v1/episodes/{eid}/end", json=act).is_success
        # ...and each slow socket is closed by the server, after a JSON 408 if it sent bytes.
        for i, sock in enumerate(slow):
            answer = _read_all(sock)
            sock.close()
            if i % 3 == 2:
                assert answer == b""
            else:
                head, body = answer.split(b"\r\n\r\n", 1)
                assert head.startswith(b"HTTP/1.1 408"), answer
                assert json.loads(body)["error"]["code"] == "request_timeout"
        assert env.get_metrics()["num_started_episodes"] == 3  # no slow request got in


def test_transport_errors_are_json(tmp_path):
    env = make_env()
    with env, PolicyServer(env, require_token=False, max_connections=4) as server:
        with _connect(server.url) as sock:
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            head, body = _read_all(sock).split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 400")
        assert json.loads(body)["error"]["code"] == "bad_http"
        # Four connections busy with a request (none idle): a fifth is refused.
        held = [_connect(server.url) for _ in range(4)]
        for sock in held:
            sock.sendall(
                b"POST /v1/episodes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n{"
            )
        time.sleep(0.2)  # the server has read their heads
        with _connect(server.url) as sock:
            head, body = _read_all(sock).split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 503")
        assert json.loads(body)["error"]["code"] == "too_many_connections"
        for sock in held:
            sock.close()


def test_http_memory_limit_answers_429():
    env = make_env(max_memory_bytes=20_000)
    with env, PolicyServer(env, require_token=False) as server:
        eid, act = open_episode(server.url)
        for _ in range(100):
            got = post(server.url, f"/v1/episodes/{eid}/action", act)
            if got.status_code != 200:
                break
        assert got.status_code == 429 and got.json()["error"]["code"] == "memory_limit"
        assert env.get_metrics()["memory_bytes"] <= 20_000


# -- defect 8: the smaller ones ---------------------------------------------------------------


def test_http_refuses_infinite_observations_like_nan():
    env = make_env()
    with env, PolicyServer(env, require_token=False) as server:
        eid = post(server.url, "/v1/episodes", {}).json()["episode_id"]
        for bad in (np.inf, -np.inf, np.nan):
            obs = np.array([0.0, bad, 0.0, 0.0], np.float32)  # dimension 1 is unbounded
            got = post(server.url, f"/v1/episodes/{eid}/action", {"obs": wire.encode_array(obs)})
            assert got.status_code == 422 and "finite" in got.json()["error"]["message"]


def test_report_decodes_off_the_event_loop(monkeypatch):
    threads = []
    decode_tree = wire.decode_tree

    def recording(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return decode_tree(*args, **kwargs)

    monkeypatch.setattr(wire, "decode_tree", recording)
    env = make_env()
    with env, PolicyServer(env, require_token=False) as server:
        eid = post(server.url, "/v1/episodes", {}).json()["episode_id"]
        obs = wire.encode_array(OBS)
        zero = wire.encode_array(np.array(0, np.int64))
        body = {"obs": [obs] * 3, "actions": [zero] * 3, "rewards": [1.0] * 3, "final_obs": obs}
        assert post(server.url, f"/v1/episodes/{eid}/report", body).status_code == 200
    assert len(threads) == 7
    assert "jaxrunner-server" not in threads  # the thread running the event loop


# -- issue 30, item 8: ending a long episode is done off the event loop ----------------------


def test_end_episode_stacks_off_the_event_loop(monkeypatch):
    from jaxrunner._src.services.external.episodes import AgentRecord

    threads = []
    to_episode = AgentRecord.to_episode

    def recording(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return to_episode(self, *args, **kwargs)

    monkeypatch.setattr(AgentRecord, "to_episode", recording)
    env = make_env()
    with env, PolicyServer(env, require_token=False) as server:
        for path in ("end", "report"):
            eid, act = open_episode(server.url)
            if path == "end":
                assert post(server.url, f"/v1/episodes/{eid}/action", act).status_code == 200
                assert post(server.url, f"/v1/episodes/{eid}/end", act).status_code == 200
            else:
                zero = wire.encode_array(np.array(0, np.int64))
                body = {"obs": [act["obs"]], "actions": [zero], "rewards": [1.0]}
                body["final_obs"] = act["obs"]
                assert post(server.url, f"/v1/episodes/{eid}/report", body).status_code == 200
    assert len(threads) == 2
    assert "jaxrunner-server" not in threads  # the thread running the event loop


def test_a_request_with_no_answer_raises_a_jaxrunner_error_that_says_if_retrying_is_safe():
    # A request that times out or cannot connect raises PolicyServerError (httpx's own
    # ReadTimeout/ConnectError before), naming the request and whether a retry is safe,
    # httpx's error chained. As it says for get_action: the step whose answer never came
    # is taken back, so the retry records the one step.
    from gated_policy import when_idle as retry_while_busy

    env = make_env(action_timeout_s=30)
    gated = GatedPolicy(env)
    with env, PolicyServer(env, require_token=False) as server:
        url = server.url
        with jr.serve.PolicyClient(url, timeout_s=0.5) as client:
            eid = client.start_episode()
            gated.gate.clear()
            with pytest.raises(jr.serve.PolicyServerError) as info:
                client.get_action(eid, OBS)
            gated.gate.set()
            err = info.value
            assert (err.status, err.code) == (0, "timeout")
            assert isinstance(err.__cause__, httpx.TimeoutException)
            assert f"POST /v1/episodes/{eid}/action" in str(err) and "retry" in str(err)
            wait_for(lambda: env.get_metrics()["num_dropped_steps"] == 1)
            retry_while_busy(lambda: client.get_action(eid, OBS))
            client.log_returns(eid, 1.0)
            client.end_episode(eid, OBS)
        assert one_episode(env).length == 1
    with pytest.raises(jr.serve.PolicyServerError) as info:
        jr.serve.PolicyClient(url, timeout_s=5)  # the server is gone
    err = info.value
    assert (err.status, err.code) == (0, "network_error")
    assert isinstance(err.__cause__, httpx.ConnectError)
    assert "GET /v1/spaces" in str(err) and "never sent" in str(err)


@contextlib.contextmanager
def one_answer_server(answer: bytes | None):
    """The URL of a loopback socket that takes one connection, reads its request and
    sends ``answer`` (None: never answers while the block runs)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        accepted: list[socket.socket] = []

        def serve() -> None:
            conn, _ = listener.accept()
            accepted.append(conn)
            conn.recv(65536)
            if answer is not None:
                conn.sendall(answer)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{listener.getsockname()[1]}"
        finally:
            thread.join(10)
            for conn in accepted:
                conn.close()


def test_a_client_timeout_is_a_timeout_error_as_the_servers_action_timeout_is():
    # The client's own timeout_s raised a PolicyServerError that was no TimeoutError
    # (the server's action timeout is one: ActionTimeoutError, as every jaxrunner timeout).
    with one_answer_server(None) as url, pytest.raises(TimeoutError) as info:
        jr.serve.PolicyClient(url, timeout_s=0.3)
    err = info.value
    assert isinstance(err, jr.serve.PolicyServerError) and (err.status, err.code) == (0, "timeout")
    assert isinstance(err.__cause__, httpx.TimeoutException) and "GET /v1/spaces" in str(err)
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), str(back), back.status, back.code) == (type(err), str(err), 0, "timeout")


@pytest.mark.parametrize("case", ["undecodable answer", "invalid url"])
def test_httpx_errors_never_reach_the_caller(case):
    # An answer httpx could not decode raised httpx.DecodingError, a URL it could not
    # parse httpx.InvalidURL: now jaxrunner's errors, saying what is wrong.
    if case == "invalid url":
        with pytest.raises(jr.errors.InvalidArgumentError, match=r"url='http://\[::1'.*not a"):
            jr.serve.PolicyClient("http://[::1", timeout_s=5)
        return
    bad_gzip = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello"
    undecodable = pytest.raises(jr.serve.PolicyServerError, match="could not be decoded")
    with one_answer_server(bad_gzip) as url, undecodable as info:
        jr.serve.PolicyClient(url, timeout_s=5)
    assert info.value.code == "invalid_answer" and "gzip" in str(info.value)

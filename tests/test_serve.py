"""PolicyServer and PolicyClient: a real server on loopback, real clients over HTTP."""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import time

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from external_helpers import ACTION_SPACE, OBS_SPACE, assert_replays, play, run_threads

import jaxrunner as jr
import jaxrunner.errors as errors
from jaxrunner.models import mlp_policy

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from jaxrunner._src.services.serve import wire  # noqa: E402
from jaxrunner._src.services.serve.client_http import raise_for  # noqa: E402
from jaxrunner.serve import PolicyClient, PolicyServer, ServerConfig  # noqa: E402

POLICY = mlp_policy(ACTION_SPACE, hidden=(16,))


def make_env(**config) -> jr.ExternalEnv:
    params = POLICY.init(jax.random.key(0), OBS_SPACE)
    return jr.ExternalEnv(
        OBS_SPACE, ACTION_SPACE, POLICY, params, seed=1, config=jr.ExternalEnvConfig(**config)
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("serve") / "token"
    env = make_env(
        max_batch=64,
        buckets=(8, 64),
        max_wait_ms=10,
        max_concurrent=96,
        max_episodes_per_client=16,
    )
    server = PolicyServer(env, token_file=token_file).start()
    yield env, server, token_file
    server.close()
    env.close()


def test_64_concurrent_episodes_over_http_equal_the_envs_own(served):
    env, server, token_file = served
    before = env.get_metrics()
    clients = [PolicyClient(server.url, token_file=token_file) for _ in range(8)]
    seeds = list(range(64))
    run_threads(lambda s: play(clients[s % 8], s, 10_000 + s), [(s,) for s in seeds])
    for client in clients:
        client.close()
    episodes = {e.episode_id - 10_000: e for e in env.poll_episodes()}
    assert sorted(episodes) == seeds  # none lost, none duplicated
    for seed, episode in episodes.items():
        assert_replays(episode, seed)
    after = env.get_metrics()
    steps = sum(e.length for e in episodes.values())
    assert after["num_env_steps"] - before["num_env_steps"] == steps
    rows = after["num_policy_rows"] - before["num_policy_rows"]
    batches = after["num_batches"] - before["num_batches"]
    assert rows == steps and rows / batches > 1, (rows, batches)
    assert after["num_traces"] <= 2  # one per bucket, whatever the batch sizes


def test_local_inference_reports_experience_and_pulls_params(served):
    env, server, token_file = served
    client = PolicyClient(
        server.url, token_file=token_file, inference="local", policy=POLICY, update_interval_s=0.2
    )
    try:
        seeds = list(range(200, 212))
        run_threads(lambda s: play(client, s, 20_000 + s), [(s,) for s in seeds])
        episodes = {e.episode_id - 20_000: e for e in env.poll_episodes()}
        assert sorted(episodes) == seeds
        params, version = env.get_params()
        for seed, episode in episodes.items():
            assert_replays(episode, seed)
        # Actions came from the client; the server scored them under its params.
        obs = np.concatenate([e.obs[:-1] for e in episodes.values()])
        actions = np.concatenate([e.action for e in episodes.values()])
        expected = POLICY.log_prob_fn(params, obs, None, actions)
        got = np.concatenate([e.extras["log_prob"] for e in episodes.values()])
        np.testing.assert_allclose(got, expected, rtol=1e-5)
        assert client.params_version == version
        assert client.num_param_pulls == 1  # at construction; later pulls found them current
        new = jax.tree.map(lambda x: x * 0.5, params)
        new_version = env.set_params(new)
        deadline = time.monotonic() + 10
        while client.params_version != new_version and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.params_version == new_version and client.num_param_pulls == 2
        local_params, _ = client._local.get_params()
        jax.tree.map(np.testing.assert_array_equal, local_params, new)
    finally:
        client.close()
        env.set_params(params)


def test_local_inference_publishes_a_version_only_once_its_params_act(served):
    env, server, token_file = served
    client = PolicyClient(
        server.url, token_file=token_file, inference="local", policy=POLICY, update_interval_s=0.05
    )
    params, _ = env.get_params()
    seen = []  # the version a reader saw while the new params were being installed
    install = client._local.set_params

    def slow_install(new):
        seen.append(client.params_version)
        time.sleep(0.2)
        seen.append(client.params_version)
        install(new)

    client._local.set_params = slow_install
    try:
        old = client.params_version
        new_version = env.set_params(jax.tree.map(lambda x: x * 0.5, params))
        deadline = time.monotonic() + 10
        while client.params_version != new_version and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.params_version == new_version
        assert seen[:2] == [old, old], seen  # not the new version before its params act
    finally:
        client.close()
        env.set_params(params)


def _post(url: str, path: str, token: str | None, body=None, *, content=None, headers=None):
    sent = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    if content is None:
        content = json.dumps(body)
    return httpx.post(url + path, content=content, headers=sent, timeout=30)


def _obs_json(obs: np.ndarray) -> dict:
    return wire.encode_array(obs)


def test_bad_requests_get_4xx_with_a_clear_error_and_change_nothing(served):
    env, server, token_file = served
    url, token = server.url, token_file.read_text().strip()
    client = PolicyClient(url, token=token, client_id="bad-input")
    cartpole = gymnasium.make("CartPole-v1")
    obs, _ = cartpole.reset(seed=5)
    eid = client.start_episode()
    ended = client.start_episode()
    with pytest.raises(errors.InvalidArgumentTypeError, match=r"truncated='False'\): expected"):
        client.end_episode(ended, obs, truncated="False")  # as the env in process: no bool()
    client.end_episode(ended, obs)
    fresh = client.start_episode()  # no action yet
    action = client.get_action(eid, obs)
    obs1, reward, *_ = cartpole.step(int(action))
    keys = ("num_started_episodes", "num_live_episodes", "num_env_steps", "num_episodes")
    before = {k: env.get_metrics()[k] for k in keys}
    rows_before = env.get_metrics()["num_policy_rows"]
    act = f"/v1/episodes/{eid}/action"
    good = {"obs": _obs_json(obs1)}
    outside = {"obs": _obs_json(np.array([9, 0, 0, 0], np.float32))}
    as_f64 = {"obs": _obs_json(obs1.astype(np.float64))}
    nan_obs = {"obs": _obs_json(np.full(4, np.nan, np.float32))}
    bad_dtype = {"obs": {"dtype": "object", "shape": [4], "data": ""}}
    short = {"obs": {"dtype": "float32", "shape": [4], "data": "AAAA"}}
    not_b64 = {"obs": {"dtype": "float32", "shape": [4], "data": "!!!!"}}
    pickled = pickle.dumps(good)
    huge = json.dumps({"obs": _obs_json(obs1), "pad": "x" * (1 << 20)})

    def chunked():
        for _ in range(20):
            yield b"x" * 65536

    cases = [
        ("no token", _post(url, act, None, good), 401, "unauthorized"),
        ("wrong token", _post(url, act, "x" * 43, good), 401, "unauthorized"),
        (
            "pickle body",
            _post(
                url,
                act,
                token,
                content=pickled,
                headers={"Content-Type": "application/python-pickle"},
            ),
            415,
            "unsupported_media_type",
        ),
        ("pickle as json", _post(url, act, token, content=pickled), 400, "invalid_json"),
        ("oversized body", _post(url, act, token, content=huge), 413, "too_large"),
        ("oversized stream", _post(url, act, token, content=chunked()), 413, "too_large"),
        ("obs outside space", _post(url, act, token, outside), 422, "space_mismatch"),
        ("obs float64", _post(url, act, token, as_f64), 422, "space_mismatch"),
        ("obs NaN", _post(url, act, token, nan_obs), 422, "space_mismatch"),
        ("dtype not allowed", _post(url, act, token, bad_dtype), 422, "space_mismatch"),
        ("short data", _post(url, act, token, short), 422, "space_mismatch"),
        ("not base64", _post(url, act, token, not_b64), 422, "space_mismatch"),
        ("extra field", _post(url, act, token, {**good, "x": 1}), 422, "invalid_request"),
        (
            "NaN reward",
            _post(url, f"/v1/episodes/{eid}/returns", token, content='{"reward": NaN}'),
            422,
            "invalid_request",
        ),
        (
            "string reward",
            _post(url, f"/v1/episodes/{eid}/returns", token, {"reward": "1"}),
            422,
            "invalid_request",
        ),
        (
            "unknown episode",
            _post(url, "/v1/episodes/999999999/action", token, good),
            404,
            "episode_not_found",
        ),
        (
            "ended episode",
            _post(url, f"/v1/episodes/{ended}/action", token, good),
            410,
            "episode_ended",
        ),
        ("negative id", _post(url, "/v1/episodes/-1/action", token, good), 422, "invalid_request"),
        (
            "reward before action",
            _post(url, f"/v1/episodes/{fresh}/returns", token, {"reward": 1.0}),
            409,
            "episode_conflict",
        ),
        (
            "duplicate id",
            _post(url, "/v1/episodes", token, {"episode_id": eid}),
            409,
            "episode_conflict",
        ),
        ("unknown route", _post(url, "/v1/nothing", token, good), 404, "not_found"),
    ]
    for name, response, status, code in cases:
        assert response.status_code == status, (name, response.status_code, response.text)
        error = response.json()["error"]
        assert error["code"] == code, (name, error)
        assert error["message"] and "Traceback" not in response.text, name
    assert {k: env.get_metrics()[k] for k in keys} == before
    assert env.get_metrics()["num_policy_rows"] == rows_before
    # The client refuses a reward as the env does (and MultiAgentPolicyClient), sending none.
    for bad, info, error in [
        (float("nan"), None, errors.InvalidArgumentError),
        (True, None, errors.InvalidArgumentTypeError),
        ("1.5", None, errors.InvalidArgumentTypeError),
        (1.0, [1], errors.InvalidArgumentTypeError),
    ]:
        with pytest.raises(error, match=r"log_returns\("):
            client.log_returns(eid, bad, info)
    # A 422 is raised as the kind the env raised (the schema's: InvalidArgumentError),
    # not as one kind for every 422.
    with pytest.raises(errors.InvalidArgumentError, match="HTTP 422 invalid_request"):
        client.start_episode(-1)
    for code, kind in [
        ("space_mismatch", errors.SpaceMismatchError),
        ("invalid_value", errors.InvalidArgumentError),
        ("invalid_type", errors.InvalidArgumentTypeError),
    ]:
        with pytest.raises(kind, match=f"HTTP 422 {code}") as raised:
            raise_for(422, {"error": {"code": code, "message": "m"}})
        assert type(raised.value) is kind, code
    # The episode goes on as if nothing had happened.
    client.log_returns(eid, reward)
    client.end_episode(eid, obs1)
    client.end_episode(fresh, obs)
    (episode,) = env.poll_episodes()
    assert episode.episode_id == eid and episode.action.tolist() == [int(action)]
    assert episode.reward.tolist() == [reward]
    np.testing.assert_array_equal(episode.obs, np.stack([obs, obs1]))
    with pytest.raises(errors.EpisodeNotFoundError, match="HTTP 410"):
        client.get_action(ended, obs)
    client.close()


def test_numpy_scalars_are_taken_as_the_env_in_process_takes_them(served):
    """Episode ids, flags and truncation as numpy scalars (e.g. read from a vector env's
    arrays): each client sends them as JSON's values; a local-inference episode ended
    with one reaches the server whole."""
    env, server, token_file = served
    obs = np.zeros(4, np.float32)
    remote = PolicyClient(server.url, token_file=token_file, client_id="numpy-scalars")
    local = PolicyClient(server.url, token_file=token_file, inference="local", policy=POLICY)
    try:
        for client, eid in ((remote, 30_000), (local, 30_001)):
            assert client.start_episode(np.int64(eid), training_enabled=np.bool_(True)) == eid
            for t in range(3):
                client.get_action(eid, obs + 0.01 * t)
                client.log_returns(eid, np.float32(1.0))
            client.end_episode(eid, obs, truncated=np.bool_(True))
        episodes = {e.episode_id: e for e in env.poll_episodes()}
        assert sorted(episodes) == [30_000, 30_001]
        for episode in episodes.values():
            assert episode.length == 3 and episode.truncated and not episode.terminated
            assert episode.reward.tolist() == [1.0, 1.0, 1.0]
    finally:
        remote.close()
        local.close()


def test_episode_caps_answer_429(served):
    env, server, token_file = served
    clients = [
        PolicyClient(server.url, token_file=token_file, client_id=f"cap-{i}") for i in range(7)
    ]
    started = [(clients[0], clients[0].start_episode()) for _ in range(16)]
    with pytest.raises(errors.TooManyEpisodesError, match=r"client 'cap-0'.*HTTP 429"):
        clients[0].start_episode()
    started += [(c, c.start_episode()) for c in clients[1:6] for _ in range(16)]
    with pytest.raises(errors.TooManyEpisodesError, match=r"max_concurrent.*HTTP 429"):
        clients[6].start_episode()
    assert env.get_metrics()["num_live_episodes"] == 96
    zeros = np.zeros(4, np.float32)
    for client, eid in started:
        client.end_episode(eid, zeros)
    for client in clients:
        client.close()
    assert env.get_metrics()["num_live_episodes"] == 0


def test_openapi_is_published_and_health_is_open(served):
    _, server, _ = served
    schema = httpx.get(server.url + "/openapi.json").json()
    assert "/v1/episodes/{episode_id}/action" in schema["paths"]
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    assert httpx.get(server.url + "/v1/health").json() == {"status": "ok"}
    assert httpx.get(server.url + "/v1/metrics").status_code == 401


def test_the_bearer_scheme_is_case_insensitive_and_the_token_is_not(served):
    """RFC 7235: ``bearer <token>`` is ``Bearer <token>`` (it got 401)."""
    _, server, _ = served
    url, token = server.url + "/v1/metrics", server.token
    for scheme in ("Bearer", "bearer", "BEARER"):
        answer = httpx.get(url, headers={"Authorization": f"{scheme} {token}"}, timeout=30)
        assert answer.status_code == 200, (scheme, answer.text)
    for wrong in (f"Bearer {token.swapcase()}", f"Basic {token}", f"Bearer{token}", "bearer"):
        answer = httpx.get(url, headers={"Authorization": wrong}, timeout=30)
        assert answer.status_code == 401, wrong


def test_fuzzed_with_schemathesis_no_5xx(tmp_path):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis.generation import GenerationMode

    with make_env(max_batch=4, buckets=(4,), max_concurrent=32) as env:
        server = PolicyServer(env, token_file=tmp_path / "token").start()
        try:
            auth = {"Authorization": f"Bearer {server.token}"}
            schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
            operations = [result.ok() for result in schema.get_all_operations()]
            assert len(operations) >= 9
            calls: list[str] = []
            for operation in operations:
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                    strategy = operation.as_strategy(generation_mode=mode, headers=auth)

                    @settings(
                        max_examples=8 if mode == GenerationMode.POSITIVE else 5,
                        deadline=None,
                        database=None,
                        suppress_health_check=list(HealthCheck),
                    )
                    @given(case=strategy)
                    def no_server_error(case):
                        calls.append(case.operation.label)
                        response = case.call(base_url=server.url, headers=auth)
                        assert response.status_code < 500, (
                            case.operation.label,
                            response.status_code,
                            response.text[:300],
                        )

                    try:
                        no_server_error()
                    except Unsatisfiable:  # nothing to make invalid (e.g. no parameters)
                        assert mode == GenerationMode.NEGATIVE, operation.label
            assert len(set(calls)) == len(operations) and 60 < len(calls) <= 300
        finally:
            server.close()


def test_token_file_is_private_and_checked(served, tmp_path):
    env, _, _ = served
    path = tmp_path / "token"
    first = PolicyServer(env, token_file=path)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    second = PolicyServer(env, token_file=path)
    assert first.token == second.token and len(first.token) >= 32
    first.close()
    second.close()
    os.chmod(path, 0o644)
    with pytest.raises(errors.InvalidArgumentError, match="chmod 600"):
        PolicyServer(env, token_file=path)
    with pytest.raises(errors.InvalidArgumentError, match="is a folder; give a file's path"):
        PolicyClient(first.url, token_file=tmp_path)  # IsADirectoryError before
    with pytest.raises(errors.InvalidArgumentError, match="does not exist; pass the file"):
        PolicyClient(first.url, token_file=tmp_path / "missing")  # FileNotFoundError before
    with pytest.raises(errors.InvalidArgumentError, match="loopback"):
        ServerConfig(host="0.0.0.0", require_token=False)
    assert ServerConfig().host == "127.0.0.1"


def test_a_token_no_request_can_carry_is_refused_by_name(served, tmp_path):
    """A token with a space around it got 401 for every request, one with other than
    printable ASCII too (clients raised httpx's UnicodeEncodeError)."""
    env, _, _ = served
    url = "http://127.0.0.1:1"  # refused before any request
    with pytest.raises(errors.InvalidArgumentError, match="starts or ends with a space"):
        ServerConfig(token=" " + "a" * 16)
    with pytest.raises(errors.InvalidArgumentError, match="index 16 is not printable ASCII"):
        ServerConfig(token="a" * 16 + "\u00e9")
    with pytest.raises(errors.InvalidArgumentError, match=r"PolicyClient\(token=...\): its char"):
        PolicyClient(url, token="a" * 16 + "\u20ac")
    with pytest.raises(errors.InvalidArgumentTypeError, match="expected the token as a str"):
        PolicyClient(url, token=1234)  # type: ignore[arg-type]
    path = tmp_path / "token"
    path.write_text("a" * 16 + "\tb\n")
    path.chmod(0o600)
    for make in (
        lambda: PolicyServer(env, token_file=path),
        lambda: PolicyClient(url, token_file=path),
    ):
        with pytest.raises(
            errors.InvalidArgumentError, match=re.escape(f"token file {path}: its char")
        ):
            make()


def test_configs_of_another_type_are_refused_by_name():
    env = make_env()
    with pytest.raises(errors.InvalidArgumentTypeError, match=r"expected a jaxrunner.serve.Serv"):
        PolicyServer(env, config={"port": 0})  # AttributeError before
    with pytest.raises(errors.InvalidArgumentTypeError, match=r"PolicyClient\(local_config="):
        PolicyClient("http://127.0.0.1:1", inference="local", local_config={"max_batch": 1})


def test_wire_round_trips_and_refusals():
    for array in (
        np.arange(6, dtype=np.int16).reshape(2, 3),
        np.array([True, False]),
        np.float64(2.5),
        np.zeros((0, 3), np.uint8),
    ):
        back = wire.decode_array(json.loads(json.dumps(wire.encode_array(array))), "x")
        assert back.dtype == np.asarray(array).dtype
        np.testing.assert_array_equal(back, array)
    with pytest.raises(wire.WireError, match="not allowed"):
        wire.encode_array(np.array(["a"]))
    with pytest.raises(wire.WireError, match="more than the limit"):
        wire.decode_array({"dtype": "uint8", "shape": [1 << 20, 1 << 20], "data": ""}, "x")
    with pytest.raises(wire.WireError, match="0 or 1"):
        wire.decode_array({"dtype": "bool", "shape": [1], "data": "Ag=="}, "x")
    composite = gymnasium.spaces.Dict(
        {
            "a": gymnasium.spaces.Box(-np.inf, 1.0, (2,), np.float32),
            "b": gymnasium.spaces.Tuple(
                [gymnasium.spaces.MultiDiscrete([2, 3]), gymnasium.spaces.MultiBinary(3)]
            ),
            "c": gymnasium.spaces.Discrete(4, start=1),
        }
    )
    rebuilt = wire.space_from_json(json.loads(json.dumps(wire.space_to_json(composite))))
    assert rebuilt == composite
    sample = composite.sample()
    back = wire.decode_tree(composite, wire.encode_tree(composite, sample), "obs")
    jax.tree.map(np.testing.assert_array_equal, back, sample)


def test_clients_go_on_with_a_restarted_server(tmp_path):
    """A restarted server numbers its episodes from 0 again: a local-inference client,
    whose own table had those ids ended, takes the server's ids as they come."""
    token_file, obs = tmp_path / "token", np.zeros(4, np.float32)
    env = make_env()
    server = PolicyServer(env, token_file=token_file).start()
    port = server.port
    clients = [
        PolicyClient(server.url, token_file=token_file),
        PolicyClient(server.url, token_file=token_file, inference="local", policy=POLICY),
    ]

    def play(client: PolicyClient) -> int:
        eid = client.start_episode()
        client.get_action(eid, obs)
        client.log_returns(eid, 1.0)
        client.end_episode(eid, obs)
        return eid

    try:
        first = [play(client) for client in clients]
        server.close()
        env.close()
        env = make_env()
        server = PolicyServer(env, port=port, token_file=token_file).start()
        assert [play(client) for client in clients] == first == [0, 1]
        assert sorted(e.episode_id for e in env.poll_episodes()) == [0, 1]
        assert env.get_metrics()["num_live_episodes"] == 0
    finally:
        for client in clients:
            client.close()
        server.close()
        env.close()


def test_a_client_connecting_before_the_server_runs_is_queued_not_refused(tmp_path):
    """The CLI prints the url, then starts serving: a client that connects in between
    must wait in the backlog, not get 'connection refused' (CI saw it happen)."""
    env = make_env()
    server = PolicyServer(env, token_file=tmp_path / "token")  # built, not started
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass
    finally:
        server.close()
        env.close()


def test_cli_serve_end_to_end(tmp_path):
    token_file = tmp_path / "token"
    command = [sys.executable, "-m", "jaxrunner", "serve", "--port", "0", "--hidden", "8"]
    command += ["--token-file", str(token_file), "--max-batch", "4"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        info = json.loads(process.stdout.readline())
        with PolicyClient(info["url"], token_file=info["token_file"]) as client:
            play(client, seed=0)
            assert client.get_metrics()["num_episodes"] == 1
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--port", "-1"], r"ServerConfig\(port=-1\): expected an int in \[0, 65535\]"),
        (["--env", "NoSuch-v0"], r"Environment `NoSuch` doesn't exist"),
        (["--max-batch", "0"], r"ExternalEnvConfig\(max_batch=0\): expected an int >= 1"),
        (["--seed", "-1"], r"ExternalEnv\(seed=-1\): expected an int >= 0"),
        (["--policy", "no_such_module:fn"], r"--policy 'no_such_module:fn': No module named"),
        (["--policy", "os:no_such_fn"], r"--policy 'os:no_such_fn': module 'os' has no"),
        (["--policy", "no_colon"], r"--policy 'no_colon': expected MODULE:FUNCTION"),
        (["--token-file", "."], r"token file \. is a folder; give a file's path"),
        (["--token-file", "a_file/token"], r"a_file is a file, not a folder; give a path"),
    ],
)
def test_cli_serve_names_a_bad_flag_in_one_line(flags, message, capsys, tmp_path):
    from jaxrunner._src import cli

    if flags[0] == "--token-file":  # (its mode was blamed: "chmod 600" on a folder)
        if flags[1] == ".":
            flags = ["--token-file", str(tmp_path), "--port", "0"]
            message = message.replace(r"\.", re.escape(str(tmp_path)))
        else:  # (mkdir raised FileExistsError: a traceback)
            (tmp_path / "a_file").write_text("")
            flags = ["--token-file", str(tmp_path / flags[1]), "--port", "0"]
    assert cli.main(["serve", *flags]) == 2  # a traceback before, nothing served
    err = capsys.readouterr().err
    assert re.fullmatch(rf"jaxrunner serve: .*{message}.*\n", err), err


def test_cli_serve_names_a_port_in_use_in_one_line(capsys, tmp_path):
    """A port already in use raised OSError from bind: a traceback, not the flag."""
    from jaxrunner._src import cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        flags = ["--port", str(port), "--token-file", str(tmp_path / "token")]
        assert cli.main(["serve", *flags]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(
        rf"jaxrunner serve: PolicyServer: cannot listen on host '127.0.0.1', port {port} "
        r"\(Address already in use\); pick a free port \(port=0, or --port 0, picks one\) "
        r"or a host of this machine\.\n",
        err,
    ), err


def test_constant_policy_params_reach_remote_clients(served):
    """set_params on the server applies to the next remote action (no recompile)."""

    def apply_fn(params, obs, carry, keys):
        n = obs.shape[0]
        return jnp.full((n,), params["a"]), {"log_prob": jnp.zeros(n)}, carry

    config = jr.ExternalEnvConfig(max_batch=2, buckets=(2,))
    with (
        jr.ExternalEnv(
            OBS_SPACE, ACTION_SPACE, jr.Policy(apply_fn), {"a": jnp.int32(0)}, config=config
        ) as env,
        PolicyServer(env, require_token=False) as server,
        PolicyClient(server.url) as client,
    ):
        eid = client.start_episode()
        zeros = np.zeros(4, np.float32)
        assert int(client.get_action(eid, zeros)) == 0
        env.set_params({"a": jnp.int32(1)})
        assert int(client.get_action(eid, zeros)) == 1
        assert env.get_metrics()["num_traces"] == 1


def test_a_closed_env_raises_closed_error_through_the_client_as_in_process():
    # The server answers 503 "closed" for an env closed under it; the client raised
    # PolicyServerError, not the ClosedError the env raises in process.
    env = make_env(max_batch=8, buckets=(8,))
    with (
        env,
        PolicyServer(env, require_token=False) as server,
        PolicyClient(server.url) as client,
    ):
        env.close()
        with pytest.raises(errors.ClosedError, match=r"after close\(\).*HTTP 503 closed"):
            client.start_episode()
        with pytest.raises(errors.ClosedError, match="start_episode"):
            env.start_episode()  # the same kind, in process


@pytest.mark.parametrize("inference", ["remote", "local"])
def test_a_closed_client_refuses_every_call_alike_whatever_its_inference(inference):
    # After close() every call of a PolicyClient raises the same ClosedError, naming the
    # client and the fix, whether it computes actions on the server or itself: local
    # inference must not answer with its private env's error ("create a new LocalEnv").
    env = make_env(max_batch=8, buckets=(8,))
    obs = np.zeros(4, np.float32)
    with env, PolicyServer(env, require_token=False) as server:
        client = PolicyClient(server.url, inference=inference, policy=POLICY)
        eid = client.start_episode()
        client.get_action(eid, obs)
        client.close()
        calls = {
            "start_episode": lambda: client.start_episode(),
            "get_action": lambda: client.get_action(eid, obs),
            "log_action": lambda: client.log_action(eid, obs, 0),
            "log_returns": lambda: client.log_returns(eid, 1.0),
            "end_episode": lambda: client.end_episode(eid, obs),
        }
        for name, call in calls.items():
            with pytest.raises(errors.ClosedError) as info:
                call()
            assert str(info.value) == (
                "PolicyClient: called after close(); create a new client."
            ), name
        assert env.get_metrics()["num_env_steps"] == 0  # nothing reported after close

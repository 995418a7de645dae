"""Local-inference clients report image-sized episodes in chunks of bytes, and a
report that fails loses nothing and frees the server's slot (issue 30, item 7)."""

from __future__ import annotations

import contextlib

import jax
import numpy as np
import pytest
from gymnasium import spaces

import jaxrunner as jr
from jaxrunner.models import mlp_policy

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from jaxrunner.serve import PolicyClient, PolicyServer, ReportError  # noqa: E402

IMAGE_SPACE = spaces.Box(0, 255, (84, 84, 1), np.uint8)
ACTION_SPACE = spaces.Discrete(4)
POLICY = mlp_policy(ACTION_SPACE, hidden=(8,))


@contextlib.contextmanager
def image_server(tmp_path, max_memory_bytes: int = 64 << 20, **fields):
    params = POLICY.init(jax.random.key(0), IMAGE_SPACE)
    config = jr.ExternalEnvConfig(max_batch=4, buckets=(4,), max_memory_bytes=max_memory_bytes)
    with (
        jr.ExternalEnv(IMAGE_SPACE, ACTION_SPACE, POLICY, params, seed=0, config=config) as env,
        PolicyServer(env, token_file=tmp_path / "token", **fields) as server,
    ):
        yield env, server


def run_local_episode(client: PolicyClient, steps: int, seed: int = 0) -> tuple[int, list]:
    """Plays ``steps`` steps of random images; returns the id and the observations."""
    rng = np.random.default_rng(seed)
    observations = [rng.integers(0, 256, IMAGE_SPACE.shape, np.uint8) for _ in range(steps + 1)]
    eid = client.start_episode()
    for t in range(steps):
        client.get_action(eid, observations[t])
        client.log_returns(eid, float(t))
    return eid, observations


def local_client(server: PolicyServer, **kwargs) -> PolicyClient:
    return PolicyClient(
        server.url, token=server.token, inference="local", policy=POLICY, seed=1, **kwargs
    )


def test_image_episode_is_reported_in_chunks_under_the_body_limit(tmp_path):
    with image_server(tmp_path) as (env, server), local_client(server) as client:
        eid, observations = run_local_episode(client, 300)
        client.end_episode(eid, observations[-1])
        (episode,) = env.poll_episodes()
        assert episode.length == 300 and episode.terminated
        np.testing.assert_array_equal(episode.obs, np.stack(observations))
        np.testing.assert_array_equal(episode.reward, np.arange(300, dtype=np.float64))
        assert env.get_metrics()["num_live_episodes"] == 0


def test_a_chunk_refused_as_too_large_is_split(tmp_path):
    fields = {"max_body_bytes": 100_000}  # ~8 image steps; the client aims at 512 KiB
    with image_server(tmp_path, **fields) as (env, server), local_client(server) as client:
        eid, observations = run_local_episode(client, 40)
        client.end_episode(eid, observations[-1], truncated=True)
        (episode,) = env.poll_episodes()
        assert episode.length == 40 and episode.truncated
        np.testing.assert_array_equal(episode.obs, np.stack(observations))


def test_a_report_the_server_refuses_frees_the_slot_and_loses_nothing(tmp_path):
    with image_server(tmp_path, max_memory_bytes=100_000) as (env, server):  # ~12 steps
        with local_client(server, report_chunk_steps=4) as client:
            eid, observations = run_local_episode(client, 30)
            with pytest.raises(ReportError, match="memory_limit") as caught:
                client.end_episode(eid, observations[-1])
        error = caught.value
        assert isinstance(error.__cause__, jr.errors.MemoryLimitError)  # HTTP 429
        assert 0 < error.steps_reported < 30 and error.steps_reported % 4 == 0
        assert error.ended_on_server and env.get_metrics()["num_live_episodes"] == 0
        np.testing.assert_array_equal(error.episode.obs, np.stack(observations))
        (kept,) = env.poll_episodes()  # what arrived, cut at the next observation
        assert kept.length == error.steps_reported and kept.truncated
        np.testing.assert_array_equal(kept.obs, np.stack(observations[: kept.length + 1]))


def test_a_report_failing_part_way_keeps_what_arrived_as_truncated(tmp_path, monkeypatch):
    with image_server(tmp_path) as (env, server), local_client(server) as client:
        client.report_chunk_steps = 4
        eid, observations = run_local_episode(client, 10)
        calls = {"report": 0}
        stream = client._http.stream

        @contextlib.contextmanager
        def third_report_fails(method, path, **kwargs):
            if path.endswith("/report"):
                calls["report"] += 1
                if calls["report"] == 3:
                    yield httpx.Response(503, json={"error": {"code": "x", "message": "down"}})
                    return
            with stream(method, path, **kwargs) as response:
                yield response

        monkeypatch.setattr(client._http, "stream", third_report_fails)
        with pytest.raises(ReportError, match="after 8 of 10 steps") as caught:
            client.end_episode(eid, observations[-1])
        assert caught.value.steps_reported == 8 and caught.value.ended_on_server
        (episode,) = env.poll_episodes()  # the 8 steps that arrived, cut at the 9th obs
        assert episode.length == 8 and episode.truncated and not episode.terminated
        np.testing.assert_array_equal(episode.obs, np.stack(observations[:9]))
        np.testing.assert_array_equal(caught.value.episode.obs, np.stack(observations))
        assert env.get_metrics()["num_live_episodes"] == 0


def test_report_chunk_sizes_are_checked(tmp_path):
    with image_server(tmp_path) as (_, server):
        for bad in (0, -1, 1.5, True):
            with pytest.raises(jr.errors.InvalidArgumentError, match="report_chunk_bytes"):
                local_client(server, report_chunk_bytes=bad)


def test_a_refused_report_of_an_episode_without_steps_says_the_reaper_ends_it(
    tmp_path, monkeypatch
):
    """No step: no observation to end the server's episode on, so nothing ends it but
    its reaper (the error said it was ended)."""
    with image_server(tmp_path) as (env, server), local_client(server) as client:
        eid, observations = run_local_episode(client, 0)
        stream, paths = client._http.stream, []

        @contextlib.contextmanager
        def report_refused(method, path, **kwargs):
            paths.append(path)
            if path.endswith("/report"):
                yield httpx.Response(503, json={"error": {"code": "x", "message": "down"}})
                return
            with stream(method, path, **kwargs) as response:
                yield response

        monkeypatch.setattr(client._http, "stream", report_refused)
        with pytest.raises(ReportError, match="left to the server's reaper") as caught:
            client.end_episode(eid, observations[-1])
        assert not caught.value.ended_on_server and caught.value.steps_reported == 0
        assert paths == [f"/v1/episodes/{eid}/report"]
        assert env.get_metrics()["num_live_episodes"] == 1

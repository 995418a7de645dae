"""The multi-agent policy server under the attacks of issue 43 (its "same attack" list):
agents that never act, large bodies, hostile answers and sockets. Through the public
API; each test failed on d660c28."""

from __future__ import annotations

import contextlib

import jax
import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

import jaxrunner.errors as errors  # noqa: E402
from jaxrunner import ExternalEnvConfig  # noqa: E402
from jaxrunner.models import mlp_policy  # noqa: E402
from jaxrunner.multi_agent import MultiAgentExternalEnv  # noqa: E402
from jaxrunner.serve import MultiAgentPolicyClient, PolicyServer  # noqa: E402

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

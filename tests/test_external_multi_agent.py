"""MultiAgentExternalEnv: PettingZoo envs driven by hand through the external API, the
recorded agent episodes checked exactly against what the env itself returned."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from external_helpers import run_threads
from external_multi_agent_helpers import Ref, assert_matches, make_env, play_parallel, play_turns

from jaxrunner._src.core.policy import Policy
from jaxrunner._src.services.external import ExternalEnv, ExternalEnvConfig, MultiAgentExternalEnv
from jaxrunner._src.testing.envs import ComingAndGoing, Relay
from jaxrunner.errors import (
    ClosedError,
    EpisodeConflictError,
    EpisodeNotFoundError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    MemoryLimitError,
    SpaceMismatchError,
)
from jaxrunner.models import mlp_policy


def test_parallel_env_agents_come_and_go_exactly():
    with make_env(ComingAndGoing()) as env:
        pz = ComingAndGoing()
        for seed in (3, 4):  # a2 terminates at step 6 in one episode, 7 in the other
            refs = play_parallel(env, seed, pz)
            episodes = env.poll_episodes()
            assert_matches(episodes, refs)
            by_agent = {e.agent_id: e for e in episodes}
            assert "a3" not in by_agent  # never appeared: no episode
            assert by_agent["a0"].terminated and by_agent["a1"].truncated
            assert by_agent["a0"].length == 3 and by_agent["a1"].length == 5
            np.testing.assert_array_equal(by_agent["a2"].env_step, refs["a2"].env_steps)
            assert by_agent["a2"].env_step[0] == 2  # appeared after step 2
            assert by_agent["a2"].reward[0] > 0.5  # the reward before it acted is carried
            assert len({e.episode_id for e in episodes}) == 1
        metrics = env.get_metrics()
    assert metrics["num_agent_steps"] == 3 + 5 + 4 + 3 + 5 + 5
    assert metrics["num_env_steps"] == 6 + 7
    assert metrics["num_ended_episodes"] == 2 and metrics["num_episodes"] == 6
    assert metrics["num_dropped_steps"] == 0 and metrics["memory_bytes"] == 0


def test_turn_based_env_rewards_between_turns_exactly():
    with make_env(Relay()) as env:
        refs = play_turns(env, seed=5)
        episodes = env.poll_episodes()
    assert_matches(episodes, refs)
    by_agent = {e.agent_id: e for e in episodes}
    assert by_agent["r1"].terminated and by_agent["r1"].length == 2
    assert by_agent["r0"].truncated and by_agent["r2"].truncated
    assert by_agent["r1"].env_step.tolist() == [1, 4]
    assert sum(e.length for e in episodes) == 8  # the env's 8 turns, one transition each


def test_actions_do_not_depend_on_batching():
    """Keys derive from the seed, the episode, the agent and its step only."""
    results = []
    for config in (
        ExternalEnvConfig(max_batch=1),
        ExternalEnvConfig(max_batch=16, buckets=(4, 16), max_wait_ms=50.0),
    ):
        with make_env(ComingAndGoing(), seed=7, config=config) as env:
            run_threads(play_parallel, [(env, k, ComingAndGoing(), 10 + k) for k in range(3)])
            results.append(
                {(e.episode_id, e.agent_id): e.action.tolist() for e in env.poll_episodes()}
            )
    assert len(results[0]) == 9 and results[0] == results[1]
    assert len({tuple(a) for a in results[0].values()}) > 1  # agents draw their own keys


def two_policy_env(**config: Any) -> MultiAgentExternalEnv:
    pz = ComingAndGoing()
    space = pz.observation_space("a0")
    policy = mlp_policy(pz.action_space("a0"), hidden=(8,))
    params = {
        "left": policy.init(jax.random.key(0), space),
        "right": policy.init(jax.random.key(1), space),
    }
    return MultiAgentExternalEnv.from_pettingzoo(
        pz,
        policy,
        params,
        policy_mapping_fn=lambda a: "left" if a in ("a0", "a1") else "right",
        config=ExternalEnvConfig(**config),
    )


def test_one_compiled_call_per_policy_per_batch():
    with two_policy_env(max_batch=8, buckets=(8,), max_wait_ms=10_000.0) as env:
        eids = [env.start_episode() for _ in range(2)]
        obs = {a: np.array([0.0, k, 0.5], np.float32) for k, a in enumerate(env.possible_agents)}
        futures = [env.submit_action(eid, obs) for eid in eids]
        # Every agent of both live episodes asked: each policy's batch goes at once.
        actions = [f.result(timeout=60) for f in futures]
        metrics = env.get_metrics()
    assert [set(a) for a in actions] == [set(env.possible_agents)] * 2
    assert metrics["num_batches"] == 2 and metrics["num_policy_rows"] == 8
    assert metrics["num_traces"] == 2  # one bucket per policy, compiled once
    assert metrics["params_version"] == {"left": 0, "right": 0}


def test_policies_map_agents_and_params_are_per_policy():
    with two_policy_env(max_batch=4, buckets=(4,)) as env:
        assert env.policy_ids == ("left", "right")
        refs = play_parallel(env, 2, ComingAndGoing())
        episodes = env.poll_episodes()
        assert {e.agent_id: e.policy_id for e in episodes} == {
            "a0": "left",
            "a1": "left",
            "a2": "right",
        }
        for episode in episodes:
            ref = refs[episode.agent_id]
            np.testing.assert_array_equal(episode.action, ref.actions)
        params, _ = env.get_params("right")
        assert env.set_params(params, "right") == 1
        assert env.get_params("left")[1] == 0
        with pytest.raises(InvalidArgumentError, match=r"policy_id='middle'.*unknown policy id"):
            env.set_params(params, "middle")
        with pytest.raises(InvalidArgumentError, match="Name one: this env has several"):
            env.get_params()
        every = {"left": env.get_params("left")[0], "right": params}  # as it was built with
        keyed = r"keyed by policy ids \(\['left', 'right'\]\)"
        with pytest.raises(InvalidArgumentError, match=keyed):
            env.set_params(every, "right")
        assert env.get_params("right")[1] == 1  # nothing changed
    # One policy: no policy id needed, as a runner's set_params(params) and ExternalEnv's.
    with make_env(ComingAndGoing()) as env:
        params, version = env.get_params()
        assert version == 0 and env.set_params(params) == 1
        assert env.get_params("policy_0")[1] == 1


def test_log_action_records_actions_as_given():
    with make_env(ComingAndGoing()) as env:
        pz = ComingAndGoing()
        obs, _ = pz.reset(seed=0)
        eid = env.start_episode()
        given = {"a0": 2, "a1": 0}
        env.log_action(eid, obs, given)
        obs2, rewards, *_ = pz.step(given)
        env.log_returns(eid, rewards)
        env.log_returns(eid, {"a1": 1e308})
        memory = env.get_metrics()["memory_bytes"]
        with pytest.raises(InvalidArgumentError, match="agent 'a1''s latest action overflows"):
            env.log_returns(eid, {"a0": 1.0, "a1": 1e308})  # refused whole: a0 gets nothing
        with pytest.raises(InvalidArgumentError, match="agent 'a1''s latest action overflows"):
            env.log_returns(eid, {"a1": 1e308, "a2": 1.0})  # a2 does not join the episode
        assert env.get_metrics()["memory_bytes"] == memory  # (a new agent record is charged)
        rewards["a1"] += 1e308
        env.end_episode(eid, {a: obs2[a] for a in given}, truncated=True)
        episodes = {e.agent_id: e for e in env.poll_episodes()}
    for agent, action in given.items():
        assert episodes[agent].action.tolist() == [action]
        assert episodes[agent].reward.tolist() == [rewards[agent]]
        assert episodes[agent].truncated and not episodes[agent].terminated
        assert np.isfinite(episodes[agent].extras["log_prob"]).all()
        np.testing.assert_array_equal(episodes[agent].obs, np.stack([obs[agent], obs2[agent]]))


def test_concurrent_threads_exact_counts():
    num_threads, per_thread = 6, 3
    refs: list[dict[str, Ref]] = []

    def worker(k: int) -> None:
        pz = ComingAndGoing()
        for n in range(per_thread):
            refs.append(play_parallel(env, 100 * k + n, pz))

    with make_env(ComingAndGoing(), config=ExternalEnvConfig(max_batch=16)) as env:
        run_threads(worker, [(k,) for k in range(num_threads)])
        episodes = env.poll_episodes()
        metrics = env.get_metrics()
    expected_steps = sum(len(r.actions) for ref in refs for r in ref.values())
    assert metrics["num_agent_steps"] == expected_steps
    assert sum(e.length for e in episodes) == expected_steps
    assert metrics["num_policy_rows"] == expected_steps  # one row per delivered action
    assert metrics["num_dropped_steps"] == 0 and metrics["memory_bytes"] == 0
    by_episode: dict[int, list[Any]] = {}
    for episode in episodes:
        by_episode.setdefault(episode.episode_id, []).append(episode)
    assert len(by_episode) == num_threads * per_thread
    # Each episode matches one reference: match them by a0's first observation.
    ref_by_first = {ref["a0"].obs[0].tobytes(): ref for ref in refs}
    for agent_episodes in by_episode.values():
        a0 = next(e for e in agent_episodes if e.agent_id == "a0")
        assert_matches(agent_episodes, ref_by_first[a0.obs[0].tobytes()])


def test_bad_input_is_refused_and_loses_nothing():
    with make_env(ComingAndGoing()) as env:
        pz = ComingAndGoing()
        obs, _ = pz.reset(seed=11)
        eid = env.start_episode()
        refs: dict[str, Ref] = {}
        actions = env.get_action(eid, obs)
        for agent in obs:
            refs.setdefault(agent, Ref()).act(obs[agent], actions[agent], 0)
        obs, rewards, *_ = pz.step({a: int(v) for a, v in actions.items()})
        with pytest.raises(InvalidArgumentError, match="unknown agent 'ghost'"):
            env.log_returns(eid, {**rewards, "ghost": 1.0})
        with pytest.raises(InvalidArgumentError, match="rewards\\['a0'\\]"):
            env.log_returns(eid, {**rewards, "a0": float("nan")})
        with pytest.raises(InvalidArgumentError, match=r"rewards\['a0'\]=1000.*must be finite"):
            env.log_returns(eid, {**rewards, "a0": 10**400})  # past float64: OverflowError before
        env.log_returns(eid, rewards)
        for agent, reward in rewards.items():
            refs[agent].pending += reward
        good = {a: obs[a] for a in pz.agents}
        with pytest.raises(InvalidArgumentError, match="unknown agent 'ghost'"):
            env.get_action(eid, {**good, "ghost": good["a0"]})
        with pytest.raises(SpaceMismatchError, match="obs\\['a1'\\]"):
            env.get_action(eid, {**good, "a1": np.zeros(4, np.float32)})
        with pytest.raises(SpaceMismatchError, match="finite"):
            env.get_action(eid, {**good, "a1": np.full(3, np.nan, np.float32)})
        with pytest.raises(InvalidArgumentTypeError, match="expected a dict"):
            env.get_action(eid, [good["a0"]])
        with pytest.raises(InvalidArgumentError, match="at least one agent"):
            env.get_action(eid, {})
        with pytest.raises(EpisodeNotFoundError, match="episode_id=999"):
            env.get_action(999, good)
        with pytest.raises(InvalidArgumentError, match="one action per observed agent"):
            env.log_action(eid, good, {"a0": 1})
        with pytest.raises(InvalidArgumentError, match="\\['a0', 'a1'\\] acted"):
            env.end_episode(eid, {})
        env.end_agents(eid, {"a1": obs["a1"]}, truncated=True)
        refs["a1"].end(obs["a1"], False, True)
        with pytest.raises(EpisodeConflictError, match="\\['a1'\\] have ended"):
            env.get_action(eid, good)
        with pytest.raises(EpisodeConflictError, match="have ended"):
            env.log_returns(eid, {"a1": 1.0})
        assert env.get_metrics()["num_policy_rows"] == 2  # no refused call reached a policy
        env.end_episode(eid, {"a0": obs["a0"]})
        refs["a0"].end(obs["a0"], True, False)
        with pytest.raises(EpisodeNotFoundError, match="has ended"):
            env.get_action(eid, {"a0": obs["a0"]})
        assert_matches(env.poll_episodes(), refs)


def test_construction_errors_name_the_fix():
    pz = ComingAndGoing()
    policy = mlp_policy(pz.action_space("a0"), hidden=(8,))
    params = policy.init(jax.random.key(0), pz.observation_space("a0"))
    with pytest.raises(InvalidArgumentError, match="exactly the policy ids \\['policy_0'\\]"):
        MultiAgentExternalEnv.from_pettingzoo(pz, policy, {"policy_O": params})
    with pytest.raises(InvalidArgumentTypeError, match="policy_id -> params"):
        MultiAgentExternalEnv.from_pettingzoo(pz, policy, [params])
    with pytest.raises(InvalidArgumentError, match="the same agents"):
        MultiAgentExternalEnv(
            {"a": pz.observation_space("a0")}, {"b": pz.action_space("a0")}, policy, {}
        )
    with MultiAgentExternalEnv.from_pettingzoo(pz, policy, {"policy_0": params}) as env:
        assert env.get_spaces() == {  # by policy id, as a multi-agent runner's
            "observation_space": {"policy_0": pz.observation_space("a0")},
            "action_space": {"policy_0": pz.action_space("a0")},
        }
    # The errors name this class and the argument, not ExternalEnv's.
    match = r"MultiAgentExternalEnv\(policies\['policy_0'\]=...\): expected a jaxrunner.Policy"
    with pytest.raises(InvalidArgumentTypeError, match=match):
        MultiAgentExternalEnv.from_pettingzoo(pz, {"policy_0": "mlp"}, {"policy_0": params})
    with pytest.raises(InvalidArgumentError, match=r"MultiAgentExternalEnv\(seed=-1\)"):
        MultiAgentExternalEnv.from_pettingzoo(pz, policy, {"policy_0": params}, seed=-1)


def test_memory_budget_refuses_before_anything_is_stored():
    with make_env(ComingAndGoing()) as env:
        # What one agent step is charged up front, and one agent's record while it lives.
        step, record = env._memory.step_estimate, env._memory.record_nbytes
    config = ExternalEnvConfig(max_memory_bytes=3 * step + 2 * record, max_batch=8, buckets=(8,))
    with make_env(ComingAndGoing(), config=config) as env:
        pz = ComingAndGoing()
        obs, _ = pz.reset(seed=0)
        eid = env.start_episode()
        env.get_action(eid, obs)  # two agent steps fit
        with pytest.raises(MemoryLimitError, match="max_memory_bytes"):
            env.get_action(eid, obs)  # two more do not
        env.end_episode(eid, obs, truncated=True)
        (e0, e1) = env.poll_episodes()
        assert (e0.length, e1.length) == (1, 1)
        assert env.get_metrics()["memory_bytes"] == 0


def test_reaper_truncates_each_agent_and_drops_waiting_steps():
    with make_env(ComingAndGoing()) as env:
        pz = ComingAndGoing()
        obs, _ = pz.reset(seed=0)
        eid = env.start_episode()
        first = env.get_action(eid, obs)
        obs2, rewards, *_ = pz.step({a: int(v) for a, v in first.items()})
        env.log_returns(eid, rewards)
        env.get_action(eid, {"a0": obs2["a0"]})  # a1 stays away
        assert env.reap(time.monotonic() + 1.0) == 1
        episodes = {e.agent_id: e for e in env.poll_episodes()}
        metrics = env.get_metrics()
    # a0's second action never had an outcome: dropped; it ends at its last observation.
    assert episodes["a0"].length == 1 and episodes["a0"].truncated
    np.testing.assert_array_equal(episodes["a0"].obs, np.stack([obs["a0"], obs2["a0"]]))
    assert episodes["a0"].reward.tolist() == [rewards["a0"]]
    # a1 waited for the outcome of its first action, which never came.
    assert "a1" not in episodes
    assert metrics["num_dropped_steps"] == 2 and metrics["num_abandoned_episodes"] == 1
    # ... so a1 has no episode in the statistics either (they counted one of length 0).
    assert metrics["num_episodes"] == metrics["num_training_episodes"] == 1
    assert metrics["episode_length_mean"] == 1.0
    assert metrics["episode_return_mean"] == rewards["a0"]


def test_reaping_keeps_the_rewards_of_the_dropped_steps():
    """Rewards logged after an agent's last action, whose next observation never came,
    go to its step before (its return keeps them), or are unassigned if that action was
    its only one; they were lost."""
    with make_env(ComingAndGoing()) as env:
        obs = np.zeros(3, np.float32)
        eid = env.start_episode()
        env.get_action(eid, {"a0": obs, "a1": obs})
        env.log_returns(eid, {"a0": 1.0, "a1": 2.0})
        env.get_action(eid, {"a0": obs})  # a1 stays away
        env.log_returns(eid, {"a0": 0.5})
        assert env.reap(time.monotonic() + 1.0) == 1
        (episode,) = env.poll_episodes()
        metrics = env.get_metrics()
    assert episode.agent_id == "a0" and episode.reward.tolist() == [1.5]
    assert metrics["episode_return_mean"] == 1.5
    assert metrics["unassigned_reward"] == 2.0  # a1's only action was dropped


def test_withdrawn_call_records_no_agent():
    """A caller that gives up before the batch runs gets nothing recorded, for every
    agent of the call; the episode goes on."""
    with make_env(ComingAndGoing(), config=ExternalEnvConfig(max_wait_ms=300.0)) as env:
        pz = ComingAndGoing()
        obs, _ = pz.reset(seed=0)
        eid = env.start_episode()
        env.start_episode()  # another live episode: the batch waits for its rows
        future = env.submit_action(eid, obs)
        assert future.cancel()
        deadline = time.monotonic() + 30
        while env.get_metrics()["num_undelivered_actions"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        metrics = env.get_metrics()
        assert metrics["num_undelivered_actions"] == 2 and metrics["num_dropped_steps"] == 2
        actions = env.get_action(eid, obs)  # the episode is free again
        obs2, rewards, *_ = pz.step({a: int(v) for a, v in actions.items()})
        env.log_returns(eid, rewards)
        env.end_episode(eid, {a: obs2[a] for a in actions})
        lengths = [e.length for e in env.poll_episodes()]
    assert lengths == [1, 1]


def test_retracted_call_takes_back_every_agent_step():
    """Actions computed for a client that hung up before getting them are taken back
    (what the server does), for every agent of the call; later ones go on exactly."""
    with make_env(ComingAndGoing()) as env:
        pz = ComingAndGoing()
        obs, _ = pz.reset(seed=0)
        eid = env.start_episode()
        refs: dict[str, Ref] = {}
        env.log_returns(eid, {"a1": 0.25})  # before a1's first action: stays with it
        future = env.submit_action(eid, obs)
        future.result(timeout=60)
        assert env.retract_action(eid, future)
        assert not env.retract_action(eid, future)  # once only
        metrics = env.get_metrics()
        assert metrics["num_undelivered_actions"] == 2 and metrics["num_env_steps"] == 0
        refs["a1"] = Ref(pending=0.25)
        actions = env.get_action(eid, obs)
        for agent in obs:
            refs.setdefault(agent, Ref()).act(obs[agent], actions[agent], 0)
        later = env.submit_action(eid, obs)  # ... whose answer is not the latest once
        later.result(timeout=60)
        assert env.retract_action(eid, later)
        obs2, rewards, *_ = pz.step({a: int(v) for a, v in actions.items()})
        env.log_returns(eid, rewards)
        for agent, reward in rewards.items():
            refs[agent].pending += reward
        env.end_episode(eid, {a: obs2[a] for a in actions})
        for agent in actions:
            refs[agent].end(obs2[agent], True, False)
        assert_matches(env.poll_episodes(), refs)
        assert env.get_metrics()["memory_bytes"] == 0


def test_a_withdrawn_call_is_taken_back_once():
    """Retracting a call still pending withdraws it; again, or after its waiter gave
    up, nothing is taken back (it said True each time)."""
    with make_env(ComingAndGoing(), config=ExternalEnvConfig(max_wait_ms=1_000.0)) as env:
        obs = {a: np.zeros(3, np.float32) for a in ("a0", "a1")}
        eid = env.start_episode()
        env.start_episode()  # another live episode: the batch waits for its rows
        future = env.submit_action(eid, obs)
        assert env.retract_action(eid, future)
        assert not env.retract_action(eid, future)
        other = env.start_episode()
        given_up = env.submit_action(other, obs)
        assert given_up.cancel()  # its waiter's timeout
        assert not env.retract_action(other, given_up)
        deadline = time.monotonic() + 30
        while env.get_metrics()["num_undelivered_actions"] < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert env.get_metrics()["num_undelivered_actions"] == 4  # each call counted once


def test_a_retracted_call_gives_no_later_call_its_env_step_again():
    """A call retracted after another agent's later call leaves a gap in the env steps:
    the next call got that later call's env step again."""
    with make_env(ComingAndGoing()) as env:
        obs = np.zeros(3, np.float32)
        eid = env.start_episode()
        future = env.submit_action(eid, {"a0": obs, "a1": obs})  # env step 0
        future.result(timeout=60)
        env.get_action(eid, {"a2": obs})  # env step 1
        assert env.retract_action(eid, future)  # still a0's and a1's latest
        env.get_action(eid, {"a0": obs})  # env step 2, not 1 again
        assert env.get_metrics()["num_env_steps"] == 2
        env.end_episode(eid, {"a0": obs, "a2": obs})
        env_steps = {e.agent_id: e.env_step.tolist() for e in env.poll_episodes()}
    assert env_steps == {"a0": [2], "a2": [1]}


def test_close_fails_waiting_calls_with_nothing_recorded():
    env = make_env(ComingAndGoing(), config=ExternalEnvConfig(max_wait_ms=5_000.0))
    pz = ComingAndGoing()
    obs, _ = pz.reset(seed=0)
    eid = env.start_episode()
    env.start_episode()  # another live episode: the batch waits for its rows
    future = env.submit_action(eid, obs)
    env.close()
    with pytest.raises(ClosedError):
        future.result(timeout=30)
    metrics = env.get_metrics()
    assert metrics["num_policy_rows"] == 0 and metrics["num_env_steps"] == 0
    # The reservation went back; the records of the agents it named are held.
    assert metrics["memory_bytes"] == 2 * env._memory.record_nbytes
    with pytest.raises(ClosedError, match="after close"):
        env.start_episode()


def test_recurrent_carry_is_per_agent():
    """Each agent of an episode carries its own recurrent state, from the initial
    one at its first action; logged actions advance it too."""

    def apply_fn(params, obs, carry, keys):
        return carry % 3, {"log_prob": jnp.zeros(obs.shape[0])}, carry + 1

    pz = ComingAndGoing()
    policy = Policy(apply_fn, initial_carry=jnp.int32(0))
    config = ExternalEnvConfig(max_batch=4, buckets=(4,))
    with MultiAgentExternalEnv.from_pettingzoo(pz, policy, {"policy_0": {}}, config=config) as env:
        obs = {a: np.zeros(3, np.float32) for a in pz.possible_agents}
        eid, other = env.start_episode(), env.start_episode()
        got = [env.get_action(eid, {"a0": obs["a0"]}) for _ in range(2)]
        got.append(env.get_action(eid, {"a0": obs["a0"], "a1": obs["a1"]}))
        got.append(env.get_action(other, {"a0": obs["a0"]}))  # another episode's a0
        env.log_action(eid, {"a1": obs["a1"]}, {"a1": 2})
        got.append(env.get_action(eid, {"a1": obs["a1"]}))
    assert [{a: int(v) for a, v in step.items()} for step in got] == [
        {"a0": 0},
        {"a0": 1},
        {"a0": 2, "a1": 0},
        {"a0": 0},
        {"a1": 2},
    ]


def test_finished_calls_are_not_kept():
    """The table that lets a call be retracted holds it only while its future lives."""
    with make_env(ComingAndGoing()) as env:
        pz = ComingAndGoing()
        obs, _ = pz.reset(seed=0)
        eid = env.start_episode()
        for _ in range(5):
            env.get_action(eid, obs)
        gc.collect()
        # At most the last batch's, which the batcher's loop still names until its next.
        assert len(env._delivery.calls) <= 1


def test_a_single_agent_env_is_the_one_agent_case():
    # ExternalEnv is the one-agent view of the same core: the same calls give the same
    # actions, log-probs and episodes, bit for bit, as a one-agent MultiAgentExternalEnv.
    game = gymnasium.make("CartPole-v1")
    obs_space, action_space = game.observation_space, game.action_space
    policy = mlp_policy(action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), obs_space)
    config = ExternalEnvConfig(max_batch=4)
    single = ExternalEnv(obs_space, action_space, policy, params, seed=3, config=config)
    multi = MultiAgentExternalEnv(
        {"a": obs_space}, {"a": action_space}, policy, {"policy_0": params}, seed=3, config=config
    )
    with single, multi:
        for eid in (0, 7):
            assert single.start_episode(eid) == multi.start_episode(eid) == eid
            obs, _ = game.reset(seed=eid)
            terminated = False
            for _ in range(30):
                action = single.get_action(eid, obs)
                np.testing.assert_array_equal(multi.get_action(eid, {"a": obs})["a"], action)
                obs, reward, terminated, _, _ = game.step(int(action))
                single.log_returns(eid, float(reward))
                multi.log_returns(eid, {"a": float(reward)})
                if terminated:
                    break
            single.end_episode(eid, obs, truncated=not terminated)
            multi.end_episode(eid, {"a": obs}, truncated=not terminated)
        singles, agents = single.poll_episodes(), multi.poll_episodes()
        assert [e.length for e in singles] == [e.length for e in agents] and singles
        for episode, agent in zip(singles, agents, strict=True):
            assert (episode.episode_id, episode.truncated) == (agent.episode_id, agent.truncated)
            for field in ("obs", "action", "reward"):
                np.testing.assert_array_equal(getattr(episode, field), getattr(agent, field))
            for key in episode.extras:
                np.testing.assert_array_equal(episode.extras[key], agent.extras[key])
            np.testing.assert_array_equal(agent.env_step, np.arange(agent.length))
        one, many = single.get_metrics(), multi.get_metrics()
        for key in ("num_env_steps", "num_episodes", "episode_return_mean", "num_policy_rows"):
            assert one[key] == many[key], key


def test_a_config_of_another_type_is_refused_by_name():
    with pytest.raises(InvalidArgumentTypeError, match=r"^MultiAgentExternalEnv\(config=\.\.\.\)"):
        make_env(ComingAndGoing(), config={"max_batch": 4})  # AttributeError before


@pytest.mark.parametrize("multi_agent", [False, True])
def test_close_wakes_sample_episodes_and_refuses_it_after(multi_agent):
    # close() makes every later call raise ClosedError, so no episode can end after it: a
    # learner waiting in sample_episodes must be woken with ClosedError at once (not sleep
    # out its timeout, forever with None, then blame the timeout), and a sample_episodes
    # after close() is refused the same way on both kinds; episodes held are still taken.
    if multi_agent:
        env = make_env(ComingAndGoing())
        pz = ComingAndGoing()
        obs, _ = pz.reset(seed=0)
        final = {a: obs[a] for a in pz.agents}
    else:
        game = gymnasium.make("CartPole-v1")
        policy = mlp_policy(game.action_space, hidden=(8,))
        params = policy.init(jax.random.key(0), game.observation_space)
        env = ExternalEnv(game.observation_space, game.action_space, policy, params)
        obs = final = game.reset(seed=0)[0]
    with env:
        eid = env.start_episode()
        env.get_action(eid, obs)
        env.end_episode(eid, final)
        waited: dict[str, Any] = {}

        def learner() -> None:
            started = time.monotonic()
            try:
                env.sample_episodes(5, timeout_s=20)
            except Exception as err:
                waited["error"] = err
            waited["s"] = time.monotonic() - started

        thread = threading.Thread(target=learner, daemon=True)
        thread.start()
        time.sleep(0.2)
        env.close()
        thread.join(timeout=10)
        assert not thread.is_alive(), "sample_episodes slept on after close()"
        assert waited["s"] < 10 and isinstance(waited["error"], ClosedError), waited
        assert "sample_episodes(5)" in str(waited["error"])
        with pytest.raises(ClosedError, match=r"sample_episodes\(5\): the env is closed"):
            env.sample_episodes(5, timeout_s=0.1)
        assert len(env.sample_episodes(1, timeout_s=0.1)) == 1  # what ended before is taken

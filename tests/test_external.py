"""ExternalEnv: inverted control, batching, determinism, limits, the reaper."""

from __future__ import annotations

import re
import threading
import time

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from external_helpers import (
    ACTION_SPACE,
    OBS_SPACE,
    assert_replays,
    make_external,
    play,
    run_threads,
)
from gated_policy import GatedPolicy, when_idle
from gymnasium import spaces

import jaxrunner as jr
import jaxrunner.errors as errors
from jaxrunner._src.space_arrays import check_value
from jaxrunner.models import mlp_policy


@pytest.fixture(scope="module")
def external():
    with make_external(max_wait_ms=20) as env:
        yield env


def test_concurrent_episodes_equal_the_envs_own_and_are_batched(external):
    before = external.get_metrics()
    seeds = list(range(100, 124))
    run_threads(play, [(external, s, s) for s in seeds])
    episodes = {e.episode_id: e for e in external.poll_episodes()}
    assert sorted(episodes) == seeds  # episode ids as given, none lost or duplicated
    for seed, episode in episodes.items():
        assert_replays(episode, seed)
        assert episode.extras["log_prob"].shape == (episode.length,)
        assert np.all(episode.extras["log_prob"] <= 0)
    after = external.get_metrics()
    steps = sum(e.length for e in episodes.values())
    assert after["num_env_steps"] - before["num_env_steps"] == steps
    assert after["num_episodes"] - before["num_episodes"] == len(seeds)
    rows = after["num_policy_rows"] - before["num_policy_rows"]
    batches = after["num_batches"] - before["num_batches"]
    assert rows == steps and rows / batches > 1  # batching happened
    assert after["num_traces"] == 1  # one bucket, compiled once


def test_actions_depend_on_seed_episode_and_step_only(external):
    """The same requests give the same actions, one at a time or batched."""
    ids = [1000, 1001, 1002, 1003]
    for eid in ids:  # one at a time
        play(external, seed=eid - 1000, episode_id=eid)
    alone = {e.episode_id: e.action for e in external.poll_episodes()}
    with make_external(max_wait_ms=20) as other:  # same seed and params, batched
        run_threads(play, [(other, eid - 1000, eid) for eid in reversed(ids)])
        batched = {e.episode_id: e.action for e in other.poll_episodes()}
        assert other.get_metrics()["mean_batch_size"] > 1
    for eid in ids:
        np.testing.assert_array_equal(alone[eid], batched[eid])


def test_log_action_stores_the_action_with_its_log_prob_under_current_params(external):
    policy = mlp_policy(ACTION_SPACE, hidden=(16,))
    env = gymnasium.make("CartPole-v1")
    obs0, _ = env.reset(seed=7)
    eid = external.start_episode()
    external.log_action(eid, obs0, 1)  # chosen elsewhere
    obs1, reward, *_ = env.step(1)
    external.log_returns(eid, reward)
    external.log_returns(eid, 0.5)  # rewards add up until the next action
    external.log_returns(eid, 1.7e308)
    with pytest.raises(errors.InvalidArgumentError, match="overflows to inf; nothing was added"):
        external.log_returns(eid, 1.7e308)  # two finite rewards, an infinite sum
    action = external.get_action(eid, obs1)
    obs2, *_ = env.step(int(action))
    external.end_episode(eid, obs2, truncated=True)
    (episode,) = external.poll_episodes()
    assert episode.action.tolist() == [1, int(action)]
    assert (
        episode.reward[0] == reward + 0.5 + 1.7e308 and episode.truncated and not episode.terminated
    )
    params, _ = external.get_params()
    expected = policy.log_prob_fn(params, obs0[None], None, jnp.array([1]))
    # A GPU's matmul of one row and of the server's padded batch may round apart.
    np.testing.assert_allclose(episode.extras["log_prob"][0], expected[0], rtol=1e-5)


def test_policy_without_log_prob_fn_marks_logged_actions_nan():
    base = mlp_policy(ACTION_SPACE, hidden=(4,))
    policy = jr.Policy(base.apply_fn, base.init_fn)  # no log_prob_fn
    params = policy.init(jax.random.key(0), OBS_SPACE)
    config = jr.ExternalEnvConfig(max_batch=2, buckets=(2,))
    with jr.ExternalEnv(OBS_SPACE, ACTION_SPACE, policy, params, config=config) as env:
        eid = env.start_episode()
        obs = np.zeros(4, np.float32)
        env.log_action(eid, obs, 0)
        env.log_returns(eid, 1.0)
        env.get_action(eid, obs)
        env.end_episode(eid, obs)
        (episode,) = env.poll_episodes()
    assert np.isnan(episode.extras["log_prob"][0]) and episode.extras["log_prob"][1] <= 0


def test_training_disabled_episodes_count_but_are_not_output(external):
    before = external.get_metrics()
    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    eid = external.start_episode(training_enabled=False)
    action = external.get_action(eid, obs)
    obs, *_ = env.step(int(action))
    external.log_returns(eid, 1.0)
    external.end_episode(eid, obs)
    after = external.get_metrics()
    assert external.poll_episodes() == []
    assert after["num_episodes"] == before["num_episodes"] + 1
    assert after["num_env_steps"] == before["num_env_steps"] + 1
    assert after["num_training_episodes"] == before["num_training_episodes"]


def test_an_episode_ended_before_any_action_counts_in_neither_kind():
    """No transition, no episode: the runners never give one, and the multi-agent env
    never counted one. ExternalEnv counted it (length 0, return 0) in ``num_episodes``
    and the means."""
    obs = np.zeros(OBS_SPACE.shape, OBS_SPACE.dtype)
    space = {"a": OBS_SPACE}
    policy = mlp_policy(ACTION_SPACE, hidden=(8,))
    params = {"policy_0": policy.init(jax.random.key(0), OBS_SPACE)}
    with (
        make_external() as one,
        jr.multi_agent.MultiAgentExternalEnv(space, {"a": ACTION_SPACE}, policy, params) as many,
    ):
        for env, final in ((one, obs), (many, {"a": obs})):
            before = env.get_metrics()
            env.end_episode(env.start_episode(), final)
            after = env.get_metrics()
            assert env.poll_episodes() == []
            for key in ("num_episodes", "num_env_steps", "num_training_episodes"):
                assert after[key] == before[key], (type(env).__name__, key)
            assert after["num_started_episodes"] == before["num_started_episodes"] + 1


class ConstantPolicy:
    """action = params["a"] for every row; extras log_prob 0."""

    @staticmethod
    def make() -> jr.Policy:
        def apply_fn(params, obs, carry, keys):
            n = obs.shape[0]
            return jnp.full((n,), params["a"]), {"log_prob": jnp.zeros(n)}, carry

        return jr.Policy(apply_fn)


def test_set_params_applies_to_next_batch_and_never_retraces():
    policy = ConstantPolicy.make()
    config = jr.ExternalEnvConfig(max_batch=16, buckets=(1, 4, 16), max_wait_ms=5)
    with jr.ExternalEnv(OBS_SPACE, ACTION_SPACE, policy, {"a": jnp.int32(0)}, config=config) as env:
        obs = np.zeros(4, np.float32)
        ids = [env.start_episode() for _ in range(11)]
        for count in (1, 3, 11, 2):  # batch sizes 1..11 pad to the buckets
            futures = [env.submit_action(eid, obs) for eid in ids[:count]]
            assert [int(f.result()) for f in futures] == [0] * count
        traces = env.get_metrics()["num_traces"]
        assert traces <= 3
        assert env.set_params({"a": jnp.int32(1)}) == 1
        assert int(env.get_action(ids[0], obs)) == 1  # the very next batch
        assert env.get_metrics()["num_traces"] == traces
        with pytest.raises(errors.SpaceMismatchError, match="structure, shape or dtype"):
            env.set_params({"a": jnp.zeros(2)})


def test_a_policy_that_returns_no_carry_is_named_when_the_env_is_built():
    def two(params, obs, carry, keys):
        return jnp.zeros(obs.shape[0], jnp.int32), {}

    with pytest.raises(TypeError, match=r"return \(action, extras, carry\).*got a tuple of 2"):
        jr.ExternalEnv(OBS_SPACE, ACTION_SPACE, jr.Policy(two), {})


def test_params_with_nan_are_refused_and_the_env_keeps_its_own():
    policy = ConstantPolicy.make()
    nan = {"a": jnp.int32(0), "w": jnp.float32(jnp.nan)}  # "w": a leaf the policy ignores
    with pytest.raises(errors.InvalidArgumentError, match=r"ExternalEnv\(params\).*NaN in \['w'\]"):
        jr.ExternalEnv(OBS_SPACE, ACTION_SPACE, policy, nan)
    good = {"a": jnp.int32(0), "w": jnp.float32(1)}
    with jr.ExternalEnv(OBS_SPACE, ACTION_SPACE, policy, good) as env:
        with pytest.raises(errors.InvalidArgumentError, match=r"set_params\(params\).*NaN"):
            env.set_params(nan)
        assert env.get_params()[1] == 0


def test_recurrent_carry_is_per_episode():
    def apply_fn(params, obs, carry, keys):
        return carry % 2, {"log_prob": jnp.zeros(obs.shape[0])}, carry + 1

    policy = jr.Policy(apply_fn, initial_carry=jnp.int32(0))
    config = jr.ExternalEnvConfig(max_batch=4, buckets=(4,), max_wait_ms=5)
    with jr.ExternalEnv(OBS_SPACE, ACTION_SPACE, policy, {}, config=config) as env:
        obs = np.zeros(4, np.float32)
        a, b = env.start_episode(), env.start_episode()
        got = [int(env.get_action(a, obs)) for _ in range(3)]
        got.append(int(env.get_action(b, obs)))  # b starts from the initial carry
        env.log_action(a, obs, 0)  # logged steps advance the carry too
        got.append(int(env.get_action(a, obs)))
    assert got == [0, 1, 0, 0, 0]


def test_a_returned_carry_of_another_dtype_is_refused_not_cast():
    def apply_fn(params, obs, carry, keys):
        return jnp.zeros(obs.shape[0], jnp.int32), {}, carry.astype(jnp.float32)

    policy = jr.Policy(apply_fn, initial_carry=jnp.int32(0))
    match = r"returned carry .*: expected int32\[1\], got float32\[1\]"
    with pytest.raises(errors.InvalidArgumentError, match=match):
        jr.ExternalEnv(OBS_SPACE, ACTION_SPACE, policy, {}).close()


@pytest.mark.parametrize("recurrent", [False, True])
def test_log_steps_past_max_episode_steps_records_none_of_them(recurrent):
    """Checked whole before anything is recorded, recurrent policies (a policy call per
    step) too: a local-inference client's refused report leaves no step behind."""

    def apply_fn(params, obs, carry, keys):
        return jnp.zeros(obs.shape[0], jnp.int32), {"log_prob": jnp.zeros(obs.shape[0])}, carry

    policy = jr.Policy(apply_fn, initial_carry=jnp.int32(0) if recurrent else None)
    config = jr.ExternalEnvConfig(max_episode_steps=3)
    obs = [np.full(4, 0.01 * t, np.float32) for t in range(5)]
    with jr.ExternalEnv(OBS_SPACE, ACTION_SPACE, policy, {}, config=config) as env:
        eid = env.start_episode()
        with pytest.raises(errors.InvalidArgumentError, match="max_episode_steps=3"):
            env.log_steps(eid, obs[:4], [0] * 4, [1.0] * 4)
        env.log_steps(eid, obs[:3], [0] * 3, [1.0] * 3)  # room for these
        env.end_episode(eid, obs[3])
        (episode,) = env.poll_episodes()
    np.testing.assert_array_equal(episode.obs, np.stack(obs[:4]))
    assert episode.reward.tolist() == [1.0] * 3


def test_sample_episodes_refuses_more_than_are_ever_held():
    refused = pytest.raises(errors.InvalidArgumentError, match=r"in \[1, 2\] \(no more are held")
    with make_external(max_output_episodes=2) as env, refused:
        env.sample_episodes(3, timeout_s=0.1)  # (without the check: a timeout)
    with make_external() as env:  # a NaN wait spun a core forever, a negative one timed out
        for bad in (-1, float("nan"), "1"):
            with pytest.raises(errors.InvalidArgumentError, match=r"sample_episodes\(timeout_s="):
                env.sample_episodes(1, timeout_s=bad)


def test_caps_and_ids():
    zeros = np.zeros(4, np.float32)
    with make_external(max_concurrent=3, max_episodes_per_client=2) as env:
        first = env.start_episode(client="a")
        env.start_episode(client="a")
        with pytest.raises(errors.TooManyEpisodesError, match="client 'a'"):
            env.start_episode(client="a")
        env.end_episode(first, zeros)
        assert env.start_episode(5, client="b") == 5
        with pytest.raises(errors.EpisodeConflictError, match="is live"):
            env.start_episode(5)
        assert env.start_episode(client="c") == 2  # auto ids skip used ones
        with pytest.raises(errors.TooManyEpisodesError, match="max_concurrent"):
            env.start_episode(client="d")
        assert env.get_metrics()["num_live_episodes"] == 3
        env.end_episode(5, zeros)
        with pytest.raises(errors.EpisodeConflictError, match="recently ended"):
            env.start_episode(5)
        with pytest.raises(
            errors.InvalidArgumentError,
            match=r"\(episode_id=-1\): expected an int in \[0, 9223372036854775807\] \(below 2",
        ):
            env.start_episode(-1)


def test_bad_calls_raise_and_change_nothing(external):
    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=11)
    eid = external.start_episode()
    before = external.get_metrics()
    bad_calls = [
        (errors.SpaceMismatchError, lambda: external.get_action(eid, np.full(4, 9.0, np.float32))),
        (errors.SpaceMismatchError, lambda: external.get_action(eid, obs.astype(np.float64))),
        (
            errors.SpaceMismatchError,
            lambda: external.get_action(eid, np.full(4, np.nan, np.float32)),
        ),
        (errors.SpaceMismatchError, lambda: external.log_action(eid, obs, 2)),
        (errors.SpaceMismatchError, lambda: external.log_action(eid, obs, True)),
        (errors.EpisodeConflictError, lambda: external.log_returns(eid, 1.0)),  # no action yet
        (errors.EpisodeNotFoundError, lambda: external.get_action(10**12, obs)),
        (errors.InvalidArgumentError, lambda: external.log_returns(eid, float("nan"))),
        (errors.InvalidArgumentTypeError, lambda: external.log_returns(eid, "1")),
        (errors.InvalidArgumentTypeError, lambda: external.end_episode(eid, obs, truncated=1)),
    ]
    for error, call in bad_calls:
        with pytest.raises(error):
            call()
    assert external.get_metrics()["num_policy_rows"] == before["num_policy_rows"]
    # The episode is intact: it goes on as if nothing happened.
    action = external.get_action(eid, obs)
    obs1, reward, *_ = env.step(int(action))
    external.log_returns(eid, reward)
    external.end_episode(eid, obs1)
    (episode,) = external.poll_episodes()
    assert episode.length == 1 and episode.reward.tolist() == [reward]
    with pytest.raises(errors.EpisodeNotFoundError, match="has ended") as info:
        external.get_action(eid, obs)
    assert info.value.ended


def test_in_flight_calls_conflict():
    release = threading.Event()

    def apply_fn(params, obs, carry, keys):
        jax.debug.callback(lambda: release.wait(5))
        return jnp.zeros(obs.shape[0], jnp.int32), {"log_prob": jnp.zeros(obs.shape[0])}, carry

    config = jr.ExternalEnvConfig(max_batch=1, buckets=(1,))
    with jr.ExternalEnv(OBS_SPACE, ACTION_SPACE, jr.Policy(apply_fn), {}, config=config) as env:
        obs = np.zeros(4, np.float32)
        eid = env.start_episode()
        future = env.submit_action(eid, obs)
        with pytest.raises(errors.EpisodeConflictError, match="in flight"):
            env.get_action(eid, obs)
        release.set()
        assert int(future.result(5)) == 0


def test_a_bool_is_no_episode_id():
    """As start_episode refuses them, the other calls do: True acted in episode 1."""
    with make_external() as env:
        env.start_episode()
        env.start_episode()  # id 1
        obs = np.zeros(4, np.float32)
        for flag in (True, np.bool_(True)):
            with pytest.raises(errors.EpisodeNotFoundError, match="no live episode has this id"):
                env.get_action(flag, obs)
            with pytest.raises(errors.EpisodeNotFoundError, match="no live episode"):
                env.end_episode(flag, obs)
        assert env.get_metrics()["num_live_episodes"] == 2


def test_reaper_ends_abandoned_episodes_as_truncated():
    with make_external(episode_timeout_s=0.3) as env:
        cartpole = gymnasium.make("CartPole-v1")
        obs0, _ = cartpole.reset(seed=0)
        eid = env.start_episode()
        a0 = env.get_action(eid, obs0)
        obs1, reward, *_ = cartpole.step(int(a0))
        env.log_returns(eid, reward)
        env.get_action(eid, obs1)  # its outcome never comes
        idle = env.start_episode()  # never acts
        deadline = time.monotonic() + 10
        while env.get_metrics()["num_live_episodes"] and time.monotonic() < deadline:
            time.sleep(0.05)
        metrics = env.get_metrics()
        (episode,) = env.poll_episodes()
        with pytest.raises(errors.EpisodeNotFoundError, match="has ended"):
            env.get_action(idle, obs0)
    assert metrics["num_abandoned_episodes"] == 2 and metrics["num_live_episodes"] == 0
    assert metrics["num_dropped_steps"] == 1  # the step whose outcome never came
    assert episode.episode_id == eid and episode.truncated and not episode.terminated
    assert episode.length == 1 and episode.action.tolist() == [int(a0)]
    np.testing.assert_array_equal(episode.obs, np.stack([obs0, obs1]))


def test_rewards_with_no_step_to_carry_them_are_in_the_metrics():
    """A one-agent episode whose only action is retracted, or dropped by the reaper,
    keeps the rewards logged after it in ``unassigned_reward``, as a multi-agent env
    does; ExternalEnv's metrics had no such key."""
    obs = np.zeros(4, np.float32)
    with make_external() as env:
        eid = env.start_episode()
        future = env.submit_action(eid, obs)
        future.result(timeout=60)
        env.log_returns(eid, 2.0)
        assert env.retract_action(eid, future)  # its only action: no step before
        env.end_episode(eid, obs)
        assert env.get_metrics()["unassigned_reward"] == 2.0
        eid = env.start_episode()
        env.get_action(eid, obs)
        env.log_returns(eid, 3.0)
        assert env.reap(time.monotonic() + 1.0) == 1  # its only action dropped
        metrics = env.get_metrics()
    assert metrics["unassigned_reward"] == 5.0 and metrics["num_episodes"] == 0


def test_rewards_moved_to_the_step_before_never_overflow_it():
    """Rewards logged after a retracted or reaped step go to the step before; where
    their sum would overflow, that step keeps its own (finite) reward and they count in
    ``unassigned_reward``, as log_returns refuses such a sum: the step got ``inf``."""
    obs = np.zeros(4, np.float32)
    with make_external() as env:
        eid = env.start_episode()
        env.get_action(eid, obs)
        env.log_returns(eid, 1e308)
        future = env.submit_action(eid, obs)
        future.result(timeout=60)
        env.log_returns(eid, 0.9e308)
        assert env.retract_action(eid, future)
        env.log_returns(eid, -0.5e308)  # its reward is 1e308 again, not inf: this adds
        env.end_episode(eid, obs)
        (retracted,) = env.poll_episodes()
        assert env.get_metrics()["unassigned_reward"] == 0.9e308
        eid = env.start_episode()
        env.get_action(eid, obs)
        env.log_returns(eid, 1e308)
        env.get_action(eid, obs)  # its outcome never comes
        env.log_returns(eid, 0.8e308)
        assert env.reap(time.monotonic() + 1.0) == 1
        (reaped,) = env.poll_episodes()
        metrics = env.get_metrics()
    assert retracted.reward.tolist() == [1e308 - 0.5e308]
    assert reaped.reward.tolist() == [1e308]
    assert metrics["unassigned_reward"] == 0.9e308 + 0.8e308


def test_run_thread_for_subclasses():
    class Driver(jr.ExternalEnv):
        def run(self) -> None:
            for seed in range(3):
                play(self, seed)

    policy = mlp_policy(ACTION_SPACE, hidden=(4,))
    params = policy.init(jax.random.key(0), OBS_SPACE)
    config = jr.ExternalEnvConfig(max_batch=1, buckets=(1,))
    with Driver(OBS_SPACE, ACTION_SPACE, policy, params, config=config) as env:
        env.start()
        episodes = env.sample_episodes(3, timeout_s=30)
        assert env.join(10)
    for seed, episode in enumerate(episodes):
        assert_replays(episode, seed)

    class Broken(jr.ExternalEnv):
        def run(self) -> None:
            raise KeyError("boom")

    with Broken(OBS_SPACE, ACTION_SPACE, policy, params, config=config) as env:
        env.start()
        with pytest.raises(KeyError, match="boom"):
            env.join(10)
        with pytest.raises(errors.InvalidArgumentError, match=r"^Broken.start\(\): the run"):
            env.start()  # named by its class: a MultiAgentExternalEnv's said ExternalEnv


def test_config_is_checked():
    for bad in (
        {"max_concurrent": 0},
        {"max_batch": 4, "buckets": (2, 8)},
        {"max_wait_ms": -1},
        {"episode_timeout_s": 0},
    ):
        with pytest.raises(errors.InvalidArgumentError, match="ExternalEnvConfig"):
            jr.ExternalEnvConfig(**bad)
    for max_batch in (1, 4, 64):  # the refusal's example is itself accepted
        with pytest.raises(errors.InvalidArgumentError, match=r"e\.g\. (\(.*\))\.$") as info:
            jr.ExternalEnvConfig(max_batch=max_batch, buckets=(max_batch + 1,))
        example = eval(re.search(r"e\.g\. (\(.*\))\.$", str(info.value)).group(1))
        jr.ExternalEnvConfig(max_batch=max_batch, buckets=example)
    policy = mlp_policy(ACTION_SPACE, hidden=(4,))
    params = policy.init(jax.random.key(0), OBS_SPACE)
    with pytest.raises(errors.InvalidArgumentTypeError, match=r"^ExternalEnv\(config=\.\.\.\)"):
        jr.ExternalEnv(OBS_SPACE, ACTION_SPACE, policy, params, config={"max_batch": 4})


def test_check_value_composite_spaces():
    space = spaces.Dict(
        {"pos": spaces.Box(-1, 1, (2,), np.float32), "mode": spaces.Tuple([spaces.Discrete(3)])}
    )
    value = {"pos": np.zeros(2, np.float32), "mode": (2,)}
    checked = check_value(space, value, "obs")
    assert checked["mode"][0].dtype == np.int64 and checked["mode"][0] == 2
    for bad, where in (
        ({"pos": np.zeros(2, np.float32)}, "keys"),
        ({"pos": np.zeros(3, np.float32), "mode": (0,)}, r"obs\['pos'\]"),
        ({"pos": np.zeros(2, np.float32), "mode": (3,)}, r"obs\['mode'\]\[0\]"),
        ({"pos": np.zeros(2, np.float32), "mode": 1}, "tuple"),
    ):
        with pytest.raises(errors.SpaceMismatchError, match=where):
            check_value(space, bad, "obs")


# -- only delivered actions become steps; failures never wedge an episode (issue 16) --------


def test_an_action_that_timed_out_is_never_recorded():
    with make_external(action_timeout_s=0.2) as env:
        gated = GatedPolicy(env)
        obs = np.zeros(4, np.float32)
        eid = env.start_episode()
        gated.gate.clear()
        with pytest.raises(errors.ActionTimeoutError):
            env.get_action(eid, obs)  # the agent never gets this action...
        gated.gate.set()
        action = when_idle(lambda: env.get_action(eid, obs))  # ...so it asks again
        env.log_returns(eid, 1.0)
        env.end_episode(eid, obs)
        (episode,) = env.poll_episodes()
        assert episode.length == 1  # one delivered action, one step
        np.testing.assert_array_equal(episode.action, [action])
        np.testing.assert_array_equal(episode.reward, [1.0])
        metrics = env.get_metrics()
        assert metrics["num_env_steps"] == 1
        assert metrics["num_dropped_steps"] == metrics["num_undelivered_actions"] == 1


def test_a_cancelled_submit_is_never_recorded():
    with make_external() as env:
        gated = GatedPolicy(env)
        obs = np.zeros(4, np.float32)
        eid = env.start_episode()
        gated.gate.clear()
        future = env.submit_action(eid, obs)
        gated.entered.wait(10)
        assert future.cancel()  # computing, but not delivered: still cancellable
        gated.gate.set()
        when_idle(lambda: env.get_action(eid, obs))
        env.end_episode(eid, obs)
        assert env.poll_episodes()[0].length == 1
        assert env.get_metrics()["num_dropped_steps"] == 1


def test_a_failed_policy_call_frees_the_episode():
    with make_external(max_concurrent=2) as env:
        gated = GatedPolicy(env)
        obs = np.zeros(4, np.float32)
        eid = env.start_episode()
        gated.fail = 1
        with pytest.raises(FloatingPointError, match="on purpose"):
            env.get_action(eid, obs)
        # Not wedged: the next call works (it got 409 forever before).
        env.get_action(eid, obs)
        env.log_returns(eid, 2.0)
        gated.fail = 1
        with pytest.raises(FloatingPointError):
            env.log_steps(eid, [obs, obs], [0, 1], [1.0, 1.0])
        env.end_episode(eid, obs)
        (episode,) = env.poll_episodes()
        assert episode.length == 1 and episode.reward.tolist() == [2.0]
        # The slot was freed: max_concurrent episodes start again.
        for _ in range(2):
            env.start_episode()
        assert env.get_metrics()["num_dropped_steps"] == 0


# -- memory is bounded in bytes (issue 16, defect 6) -----------------------------------------


def test_memory_limit_refuses_steps_before_memory_runs_out():
    budget = 40_000
    with make_external(max_memory_bytes=budget) as env:
        obs = np.zeros(4, np.float32)
        eids = [env.start_episode() for _ in range(4)]
        steps = 0
        with pytest.raises(errors.MemoryLimitError, match="max_memory_bytes=40000") as caught:
            while True:
                env.get_action(eids[steps % 4], obs)
                env.log_returns(eids[steps % 4], 1.0)
                steps += 1
                assert env.get_metrics()["memory_bytes"] <= budget
        assert isinstance(caught.value, errors.TooManyEpisodesError)  # HTTP 429
        # ~750 bytes a CartPole step: the budget held about 50 of them.
        assert 30 <= steps <= 60
        with pytest.raises(errors.MemoryLimitError):
            env.start_episode()
        for eid in eids:
            env.end_episode(eid, obs)
        assert 0 < env.get_metrics()["memory_bytes"] <= budget  # unpolled episodes count
        assert sum(e.length for e in env.poll_episodes()) == steps
        assert env.get_metrics()["memory_bytes"] == 0  # every byte given back
        env.start_episode()  # room again


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_observations_are_refused_even_where_the_space_is_unbounded(bad):
    # CartPole's velocity dimensions (1 and 3) are unbounded: inf lies inside the space.
    assert OBS_SPACE.high[1] == np.inf
    obs = np.array([0.0, bad, 0.0, 0.0], np.float32)
    good = np.zeros(4, np.float32)
    with make_external() as env:
        eid = env.start_episode()
        for call in (
            lambda: env.get_action(eid, obs),
            lambda: env.log_action(eid, obs, 0),
            lambda: env.log_steps(eid, [good, obs], [0, 1], [1.0, 1.0]),
            lambda: env.end_episode(eid, obs),
        ):
            with pytest.raises(errors.SpaceMismatchError, match="finite"):
                call()
        assert env.get_metrics()["num_live_episodes"] == 1  # nothing was recorded


@pytest.mark.usefixtures("cpu_defaults")
def test_a_costly_policy_is_batched_in_small_chunks():
    """A policy server's batches often hold one row, so a costly policy (a NatureCNN)
    keeps 8-row chunks on a CPU host, where a runner of 64 envs computes 32 rows a chunk
    (an accelerator's one chunk is every row, for both)."""
    from jaxrunner._src.samplers.batch_invariance import policy_chunk_rows
    from jaxrunner.models import nature_cnn_policy

    obs_space = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    policy = nature_cnn_policy(obs_space, spaces.Discrete(6))
    params = policy.init(jax.random.key(0), obs_space)
    assert policy_chunk_rows(policy, params, obs_space, 64) == 32  # a runner's chunk
    with jr.ExternalEnv(obs_space, spaces.Discrete(6), policy, params) as env:
        assert env._batchers["agent"]._chunk_rows == 8  # max_batch 64 by default


def test_params_none_is_refused_with_the_fix():
    with pytest.raises(
        errors.InvalidArgumentError, match=r"ExternalEnv\(params=None\): .*policy.init"
    ):
        jr.ExternalEnv(OBS_SPACE, ACTION_SPACE, mlp_policy(ACTION_SPACE), None)
    with pytest.raises(  # params of another structure: a raw KeyError from the first trace
        errors.InvalidArgumentError,
        match=r"^ExternalEnv\(params=\.\.\.\): the policy could not be applied .*KeyError.*"
        r"policy.init\(jax.random.key\(0\), observation_space\)",
    ):
        jr.ExternalEnv(OBS_SPACE, ACTION_SPACE, mlp_policy(ACTION_SPACE), {"x": 1})

"""FaultPlan tolerance of the in-process backend: failed sub-envs are restarted, nothing
good is lost, and every env.step call is accounted for (issue 4, sync backend)."""

from __future__ import annotations

import functools
from contextlib import closing

import gymnasium
import jax
import numpy as np
import pytest
from conftest import short_cartpole

import jaxrunner as jr
from jaxrunner._src.backends.sub_env_block import SubEnvRaised
from jaxrunner._src.core.seeds import restart_seed
from jaxrunner.errors import EnvError, InvalidArgumentError, InvalidStepError
from jaxrunner.models import mlp_policy
from jaxrunner.testing import (
    CallLog,
    CountingEnv,
    FaultPlan,
    InjectedError,
    counting_env_fns,
    faulty_env_fns,
)
from tests.multi_agent_envs import HOST_KINDS, ComingAndGoing, relay, zero_actions

RANDOM_FAULTS = [  # of every in-process kind, at random (seeded) calls
    FaultPlan(kind="raise", probability=0.03),
    FaultPlan(kind="nan_reward", probability=0.02),
    FaultPlan(kind="bad_obs", probability=0.02),
    FaultPlan(kind="raise", call="reset", probability=0.05),
]
NUM_ENVS, T = 4, 8  # env 1 fails once: its recreated instance would fail at t=9
FAILING_ENV, FAILING_CALL = 1, 5  # env 1's 5th step fails (0-based slot t=4)


def counting_base(env_id: int) -> gymnasium.Env:
    return CountingEnv(env_id=env_id, episode_length=7)


def make_runner(
    env_fns, restart: bool = True, restart_policy: jr.RestartPolicy | None = None, **kwargs
) -> jr.EnvRunner:
    """A runner on a sync env that restarts (as ``restart_policy`` says) if ``restart``."""
    policy = restart_policy or jr.RestartPolicy()
    envs = jr.SyncVectorEnv(env_fns, restart_policy=policy if restart else None)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    return jr.EnvRunner(envs, policy, params, T, 0, **kwargs)


def fns_with(faults_by_env: dict[int, list[FaultPlan]], log: CallLog | None = None):
    fns = []
    for i in range(NUM_ENVS):
        base = functools.partial(counting_base, i)
        fns += faulty_env_fns(base, 1, {0: faults_by_env.get(i, [])}, log, seed=i)
    return fns


@pytest.fixture(scope="module")
def clean_and_faulty():
    """The same runner config sampled twice: without faults, and with env 1's 5th step
    raising. Returns both trajectories and the faulty runner's metrics."""
    with make_runner(fns_with({})) as clean:
        clean_traj = clean.sample()
    fault = FaultPlan(kind="raise", at=(FAILING_CALL,))
    with make_runner(fns_with({FAILING_ENV: [fault]})) as faulty:
        traj = faulty.sample()
        metrics = faulty.get_metrics()
    return clean_traj, traj, metrics


def test_failed_step_is_an_invalid_slot_and_other_envs_are_untouched(clean_and_faulty):
    clean, traj, _ = clean_and_faulty
    t_fail = FAILING_CALL - 1
    expected_valid = np.ones((T, NUM_ENVS), bool)
    expected_valid[t_fail, FAILING_ENV] = False
    np.testing.assert_array_equal(traj.valid, expected_valid)
    others = [b for b in range(NUM_ENVS) if b != FAILING_ENV]
    for name in ("obs", "action", "reward", "terminated", "truncated", "next_obs", "step"):
        np.testing.assert_array_equal(
            getattr(traj, name)[:, others], getattr(clean, name)[:, others], err_msg=name
        )
    # The failing env itself is unchanged up to its failure.
    for name in ("obs", "action", "reward", "next_obs"):
        np.testing.assert_array_equal(
            getattr(traj, name)[:t_fail, FAILING_ENV], getattr(clean, name)[:t_fail, FAILING_ENV]
        )


def test_failed_slot_holds_the_new_envs_first_obs_and_starts_a_new_episode(clean_and_faulty):
    _, traj, _ = clean_and_faulty
    t, b = FAILING_CALL - 1, FAILING_ENV
    assert traj.reward[t, b] == 0 and not traj.terminated[t, b] and not traj.truncated[t, b]
    # A recreated CountingEnv: episode counter 0, t 0, reset with its first restart's
    # seed, derived from the seed the runner (seed 0) gave the env.
    fresh = traj.next_obs[t, b]
    seed = restart_seed(jr.env_seeds(0, NUM_ENVS)[b], 1)
    assert (fresh[CountingEnv.SEED], fresh[CountingEnv.EPISODE], fresh[CountingEnv.T]) == (
        seed,
        0,
        0,
    )
    np.testing.assert_array_equal(traj.obs[t + 1, b], fresh)
    assert traj.episode_id[t + 1, b] != traj.episode_id[t, b]
    assert traj.step[t + 1, b] == 0
    assert traj.episode_id[t, b] == traj.episode_id[t - 1, b]  # the slot names the cut episode


def test_cut_episode_is_faulty_truncated_and_ends_at_its_last_good_step(clean_and_faulty):
    _, traj, _ = clean_and_faulty
    t, b = FAILING_CALL - 1, FAILING_ENV
    episodes = [e for e in traj.split_episodes() if e.env_id == b]
    cut = next(e for e in episodes if e.faulty)
    assert cut.truncated and not cut.terminated and cut.is_done
    assert cut.length == t  # steps 0..t-1 are good
    np.testing.assert_array_equal(cut.obs, traj.obs[: t + 1, b])  # last obs: after step t-1
    np.testing.assert_array_equal(cut.obs[-1], traj.next_obs[t - 1, b])
    np.testing.assert_array_equal(cut.action, traj.action[:t, b])
    assert sum(e.length for e in episodes) == T - 1  # the failed slot is in no episode


def test_metrics_count_the_fault(clean_and_faulty):
    _, traj, metrics = clean_and_faulty
    assert metrics["num_faulty_episodes"] == 1
    assert metrics["num_dropped_steps"] == 1
    assert metrics["num_env_steps"] == int(traj.valid.sum()) == T * NUM_ENVS - 1
    # The cut episode stays out of the episode statistics; the others are in them.
    good = [e for e in traj.split_episodes() if e.is_done and not e.faulty]
    assert len(good) == NUM_ENVS - 1
    assert metrics["num_episodes"] == len(good)
    assert metrics["episode_return_mean"] == pytest.approx(np.mean([e.total_return for e in good]))
    assert metrics["episode_length_mean"] == np.mean([e.length for e in good])


def test_gae_bootstraps_the_step_before_a_failed_slot(clean_and_faulty):
    _, traj, _ = clean_and_faulty
    t, b = FAILING_CALL - 1, FAILING_ENV
    value = np.zeros((T, NUM_ENVS), np.float32)
    next_value = np.full((T, NUM_ENVS), 10.0, np.float32)
    advantages, _ = jr.gae(traj, value=value, next_value=next_value, gamma=0.5, lam=1.0)
    # Step t-1 is the cut episode's last: reward + gamma * V(next_obs), nothing after.
    assert float(advantages[t - 1, b]) == pytest.approx(traj.reward[t - 1, b] + 0.5 * 10.0)
    assert float(advantages[t, b]) == 0.0


@pytest.mark.parametrize(
    "fault",
    [
        FaultPlan(kind="raise", at=(3,)),
        FaultPlan(kind="nan_reward", at=(3,)),
        FaultPlan(kind="bad_obs", at=(3,)),
    ],
    ids=["raise", "nan_reward", "bad_obs"],
)
def test_every_in_process_step_fault_is_restarted(fault, tmp_path):
    log = CallLog(tmp_path)
    with make_runner(fns_with({0: [fault], 2: [fault]}, log)) as runner:
        traj = runner.sample()
        metrics = runner.get_metrics()
    # Each instance fails at its 3rd step: t=2, then (recreated at t=2) t=5.
    expected = np.ones((T, NUM_ENVS), bool)
    expected[[2, 5, 2, 5], [0, 0, 2, 2]] = False
    np.testing.assert_array_equal(traj.valid, expected)
    assert metrics["num_dropped_steps"] == log.count("step_failed") == 4
    assert metrics["num_env_steps"] == log.count("step_ok") == traj.valid.sum()


@pytest.mark.parametrize("kind", ["raise", "bad_obs"])
def test_a_failed_autoreset_keeps_the_finished_episodes_transition(kind):
    # Env 0 ends its episode at step 7; the reset that follows (its 2nd) fails.
    fault = FaultPlan(kind=kind, call="reset", at=(2,))
    with make_runner(fns_with({0: [fault]})) as runner:
        traj = runner.sample()
        metrics = runner.get_metrics()
    assert traj.valid.all()  # the step itself was good
    assert traj.terminated[6, 0]
    assert metrics["num_faulty_episodes"] == 0 and metrics["num_dropped_steps"] == 0
    fresh = traj.obs[7, 0]  # from the recreated env
    seed = restart_seed(jr.env_seeds(0, NUM_ENVS)[0], 1)
    assert (fresh[CountingEnv.SEED], fresh[CountingEnv.EPISODE]) == (seed, 0)
    assert runner.envs.num_restarts == 1


class _FirstInstanceFails:
    """A factory whose first env fails as ``plan`` says; later ones behave."""

    def __init__(self, plan: FaultPlan) -> None:
        self.plan, self.made = plan, 0

    def __call__(self) -> gymnasium.Env:
        self.made += 1
        return jr.testing.FaultyEnv(CountingEnv(), [self.plan] if self.made == 1 else [])


def test_a_failed_first_reset_is_restarted_too():
    factory = _FirstInstanceFails(FaultPlan(kind="raise", call="reset", at=(1,)))
    with make_runner([*counting_env_fns(3), factory]) as runner:
        assert runner.envs.num_restarts == 1 and factory.made == 2
        traj = runner.sample()
    assert traj.valid.all()
    # Seeded from the seed its failed reset was given, as a restart after a step is.
    seed = restart_seed(jr.env_seeds(0, 4)[3], 1)
    assert (traj.obs[0, 3][CountingEnv.SEED], traj.obs[0, 3][CountingEnv.EPISODE]) == (seed, 0)


def test_exact_accounting_with_random_faults_across_samples(tmp_path):
    log = CallLog(tmp_path)
    fns = faulty_env_fns(short_cartpole, 6, RANDOM_FAULTS, log, seed=3)
    envs = jr.SyncVectorEnv(fns, restart_policy=jr.RestartPolicy())
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    valid = 0
    with jr.EnvRunner(envs, policy, params, 50, 0) as runner:
        for _ in range(4):
            traj = runner.sample()
            valid += int(traj.valid.sum())
            # Rows stay aligned: a valid slot's obs continues the previous next_obs,
            # except after an episode end or a restart.
            cont = traj.valid[1:] & traj.valid[:-1] & ~traj.done[:-1]
            np.testing.assert_array_equal(traj.obs[1:][cont], traj.next_obs[:-1][cont])
        metrics = runner.get_metrics()
    assert log.count("step_failed") > 10  # faults really happened
    assert metrics["num_env_steps"] == valid == log.count("step_ok")
    assert metrics["num_dropped_steps"] == log.count("step_failed")
    assert metrics["num_dropped_steps"] + valid == 4 * 50 * 6


def test_sample_episodes_skips_faulty_episodes_unless_asked():
    fault = FaultPlan(kind="raise", at=(2, 9))
    with make_runner(fns_with({0: [fault], 1: [fault]})) as runner:
        episodes = runner.sample_episodes(6)
        assert not any(e.faulty for e in episodes)
    with make_runner(fns_with({0: [fault], 1: [fault]})) as runner:
        episodes = runner.sample_episodes(6, include_faulty=True)
        faulty = [e for e in episodes if e.faulty]
        assert faulty and all(e.truncated and e.length == 1 for e in faulty)


def test_faulty_episodes_kept_by_an_including_call_are_skipped_by_a_default_one():
    fault = FaultPlan(kind="raise", at=(2, 9))
    with make_runner(fns_with({0: [fault], 1: [fault]})) as runner:
        first = runner.sample_episodes(1, include_faulty=True)  # one sample: more are kept
        assert any(e.faulty for e in runner.state.finished)  # (the bug's precondition)
        later = runner.sample_episodes(6)
    assert len(first) == 1 and len(later) == 6 and not any(e.faulty for e in later)


def test_callbacks_see_the_faulty_episode_end():
    ended = []

    class Record(jr.Callbacks):
        def on_episode_end(self, runner, env_index, episode):
            ended.append((env_index, episode.faulty, episode.length))

    fault = FaultPlan(kind="raise", at=(FAILING_CALL,))
    with make_runner(fns_with({FAILING_ENV: [fault]}), callbacks=Record()) as runner:
        runner.sample()
    assert (FAILING_ENV, True, FAILING_CALL - 1) in ended


def test_restart_off_raises_promptly_with_the_original_chained():
    fault = FaultPlan(kind="raise", at=(FAILING_CALL,))
    runner = make_runner(fns_with({FAILING_ENV: [fault]}), restart=False)
    with runner, pytest.raises(EnvError, match=f"sub-env {FAILING_ENV}") as info:
        runner.sample()
    assert isinstance(info.value.__cause__, InjectedError)
    assert info.value.env_index == FAILING_ENV
    assert info.value.partial_trajectory.num_steps == FAILING_CALL - 1


def test_sample_episodes_error_keeps_the_episodes_its_failed_sample_completed():
    """3-step episodes, T=4, sub-env 1 raises at its 8th step: each env completed episodes
    at steps 3 and 6, the second inside the failed sample; the error carries all four."""
    cartpole = functools.partial(gymnasium.make, "CartPole-v1", max_episode_steps=3)
    crash = {1: [FaultPlan(kind="raise", at=(8,))]}
    envs = jr.make_vec(faulty_env_fns(cartpole, 2, faults=crash), num_envs=2)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    runner = jr.EnvRunner(envs, policy, params, rollout_length=4, seed=0)
    with runner, pytest.raises(EnvError, match="sub-env 1") as info:
        runner.sample_episodes(20)
    episodes = info.value.partial_episodes
    assert sorted((e.env_id, e.length) for e in episodes) == [(0, 3), (0, 3), (1, 3), (1, 3)]
    assert all(e.truncated and not e.faulty for e in episodes)


def test_restart_off_invalid_step_still_raises_its_own_error():
    runner = make_runner(fns_with({0: [FaultPlan(kind="nan_reward", at=(2,))]}), restart=False)
    with runner, pytest.raises(InvalidStepError, match="non-finite reward"):
        runner.sample()


class _Unrecreatable:
    """A factory whose first env works and fails at its 3rd step; every later env
    fails in reset."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self) -> gymnasium.Env:
        self.made += 1
        faults = (
            [FaultPlan(kind="raise", at=(3,))]
            if self.made == 1
            else [FaultPlan(kind="raise", call="reset", probability=1.0)]
        )
        return jr.testing.FaultyEnv(CountingEnv(), faults)


def test_an_env_that_cannot_be_recreated_raises_after_max_attempts():
    factory = _Unrecreatable()
    policy = jr.RestartPolicy(max_attempts=4)
    fns = [factory, *counting_env_fns(1)]
    runner = make_runner(fns, restart_policy=policy)
    with runner, pytest.raises(EnvError, match="4 attempts in a row") as info:
        runner.sample()
    assert isinstance(info.value.__cause__, InjectedError)  # the original failure
    assert isinstance(info.value.recreation_error, InjectedError)
    assert factory.made == 1 + 4
    assert info.value.partial_trajectory.num_steps == 2


def test_restart_policy_backoff_and_validation():
    assert jr.RestartPolicy(max_attempts=5, backoff_s=0.1, max_backoff_s=0.3).waits() == [
        0.0,
        0.1,
        0.2,
        0.3,
        0.3,
    ]
    with pytest.raises(InvalidArgumentError, match="max_attempts"):
        jr.RestartPolicy(max_attempts=0)
    with pytest.raises(InvalidArgumentError, match="backoff_s"):
        jr.RestartPolicy(backoff_s=-1.0)


def test_fault_validation():
    with pytest.raises(InvalidArgumentError, match="kind"):
        FaultPlan(kind="explode")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="only applies"):
        FaultPlan(kind="nan_reward", call="reset")
    with pytest.raises(InvalidArgumentError, match="probability"):
        FaultPlan(probability=2.0)


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_same_seed_same_trajectories_across_a_restart(backend):
    # A restarted sub-env is reset with a seed derived from its own (the runner's) seed
    # and its restart count: the same seed and the same faults give the same episodes.
    def run(seed: int) -> jr.Trajectory:
        faults = {1: [FaultPlan(kind="raise", at=(3,))], 2: [FaultPlan(kind="raise", at=(5, 6))]}
        fns = faulty_env_fns(short_cartpole, NUM_ENVS, faults)
        policy = jr.RestartPolicy()
        if backend == "sync":
            envs = jr.SyncVectorEnv(fns, restart_policy=policy)
        else:
            config = jr.ProcessConfig(num_workers=2)
            envs = jr.ProcessVectorEnv(fns, config, restart_policy=policy)
        actor = mlp_policy(envs.single_action_space, hidden=(8,))
        params = actor.init(jax.random.key(0), envs.single_observation_space)
        with jr.EnvRunner(envs, actor, params, T, seed) as runner:
            return jr.concatenate([runner.sample() for _ in range(3)])

    first, second = run(7), run(7)
    # Each recreated env fails again at its 3rd (5th, 6th) step: restarts in a row.
    assert (~first.valid).sum() >= 6
    jax.tree.map(np.testing.assert_array_equal, first, second)


@pytest.mark.parametrize("backend", ["sync", "process", "ray"])
@pytest.mark.parametrize("kind", HOST_KINDS)
@pytest.mark.parametrize("call", ["step", "reset"])
def test_a_steps_errors_hold_what_would_have_been_raised(kind, backend, call, request):
    """With a restart policy, ``errors[i]`` of a sub-env whose own code raised is the
    error raised without one, whatever the kind or backend: a ``SubEnvRaised`` naming
    the sub-env and the call, the env's exception as its ``__cause__``."""
    if backend == "ray":
        request.getfixturevalue("local_ray")
    base = {"gymnasium": CountingEnv, "parallel": ComingAndGoing, "aec": relay}[kind]
    plan = FaultPlan(kind="raise", call=call, at=(2,))  # reset #2: after the first episode

    def first_error(restart_policy):
        fns = faulty_env_fns(base, 2, {1: [plan]})
        with closing(jr.make_vec(fns, 2, backend=backend, restart_policy=restart_policy)) as vec:
            vec.reset_batch([0, 1])
            for _ in range(12):
                out = vec.step_batch(zero_actions(vec, 2))
                if out.errors:
                    return out.errors
        raise AssertionError("no step failed")

    ((index, held),) = first_error(jr.RestartPolicy()).items()
    with pytest.raises(EnvError) as raised:
        first_error(None)
    assert index == 1 and type(held) is type(raised.value) is SubEnvRaised
    assert str(held) == str(raised.value)
    # a turn-based env names the agent whose turn it was
    agent = f" (agent {held.agent_id!r})" if kind == "aec" else ""
    assert (held.agent_id is None) == (kind != "aec")
    assert str(held).startswith(f"sub-env 1{agent} raised in {call}(): InjectedError(")
    assert isinstance(held.__cause__, InjectedError)

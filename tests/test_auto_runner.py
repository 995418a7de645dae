"""``EnvRunner.from_env``: a runner on envs it builds, and ``backend="auto"`` with the
policy timed (a trial of sync against the rule's workers where the rule would start
workers). The trajectories must be exactly those of the chosen layout built by hand."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import gymnasium
import jax
import pytest
from conftest import ActorCritic, short_cartpole

import jaxrunner as jr
from jaxrunner._src.backends import auto
from jaxrunner._src.backends.auto import choose_layout
from jaxrunner._src.runner import auto_layout
from jaxrunner._src.runner.trial_layouts import (
    DROP_BEHIND,
    SHARE,
    SYNC_TIE,
    VARIANT_TIE,
    WORKERS_TRIED_FROM_US,
    envpool_options,
    envpool_variants,
    in_the_running,
    kept_key,
    pick_layout,
    share_layout,
    trial_rates,
    trial_workers,
    worth_timing,
)
from jaxrunner.errors import ClosedError, InvalidArgumentError, InvalidArgumentTypeError
from jaxrunner.multi_agent import AgentCallbacks
from jaxrunner.testing import FaultPlan, assert_trees_equal

ATARI_US = 1000.0  # per sub-env step: enough work for the rule to want workers


def costly(probe: Any, seed: int | None, **_: Any) -> float:
    """Stands in for the probe's measurement: a costly env (the probe closed, as it is)."""
    probe.close()
    return ATARI_US


def cheap(probe: Any, seed: int | None, **_: Any) -> float:
    """A cheap env's step, as CartPole's (5 us)."""
    probe.close()
    return 5.0


ROLLOUT = 16


def _policy_and_params() -> tuple[jr.Policy, Any]:
    env = short_cartpole()
    policy = jr.Policy.from_linen(ActorCritic(2), env.action_space)
    return policy, policy.init(jax.random.key(1), env.observation_space)


def _fields(traj: jr.Trajectory) -> dict[str, Any]:
    return {f.name: getattr(traj, f.name) for f in dataclasses.fields(traj)}


def _by_hand(backend: str, config: jr.ProcessConfig | None, num_envs: int) -> dict[str, Any]:
    policy, params = _policy_and_params()
    envs = jr.make_vec(short_cartpole, num_envs, backend=backend, config=config)
    with jr.EnvRunner(envs, policy, params, ROLLOUT, seed=3) as runner:
        return _fields(runner.sample())


def _wants_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe reports a costly env on 3 CPUs: the rule asks for 2 workers."""
    monkeypatch.setattr(auto, "measure_env_step_us", costly)
    monkeypatch.setattr(auto, "available_cpus", lambda: 3)


def test_a_named_backend_is_built_owned_and_closed_with_the_runner():
    policy, params = _policy_and_params()
    runner = jr.EnvRunner.from_env(short_cartpole, 3, policy, params, ROLLOUT, 3, backend="sync")
    assert isinstance(runner.envs, jr.SyncVectorEnv) and runner.envs.layout_choice is None
    got = _fields(runner.sample())
    runner.stop()
    assert_trees_equal(got, _by_hand("sync", None, 3), "from_env(sync) vs by hand")
    with pytest.raises(ClosedError):
        runner.envs.step_batch(None)  # stop() closed the envs it built


def test_cheap_envs_stay_in_one_process_without_a_trial(monkeypatch):
    def no_trial(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a trial where the rule keeps sync")

    monkeypatch.setattr(auto_layout, "_trial", no_trial)
    monkeypatch.setattr(auto_layout, "envpool_has", lambda *args: False)  # EnvPool has it
    monkeypatch.setattr(auto, "measure_env_step_us", cheap)  # (a loaded probe: not cheap)
    policy, params = _policy_and_params()
    with jr.EnvRunner.from_env("CartPole-v1", 4, policy, params, ROLLOUT, 3) as runner:
        choice = runner.envs.layout_choice
        assert choice is not None and choice.backend == "sync" and choice.tried == ()
        assert "under the 300 us" in choice.reason
        assert "policy_step_us" not in runner.get_metrics()["auto"]


def test_near_the_rules_line_the_trial_times_a_worker(monkeypatch):
    """4 envs of 30 us: 120 us of work, under the rule's 300 us but over the 75 us from
    which the trial times sync against a worker (and the share); the rates decide."""
    monkeypatch.setattr(auto, "measure_env_step_us", lambda probe, *a, **k: probe.close() or 30.0)
    monkeypatch.setattr(auto, "available_cpus", lambda: 2)
    timed: list[set[int | str]] = []
    real_pick = auto_layout.pick_layout

    def rigged(rule, rates, *, policy_step_us):
        timed.append(set(rates))
        return real_pick(rule, {0: 1.0, 1: 2.0, SHARE: 1.0}, policy_step_us=policy_step_us)

    monkeypatch.setattr(auto_layout, "pick_layout", rigged)
    policy, params = _policy_and_params()
    with jr.EnvRunner.from_env(short_cartpole, 4, policy, params, ROLLOUT, 3) as runner:
        choice = runner.envs.layout_choice
        got = _fields(runner.sample())
    assert timed == [{0, 1, SHARE}] and choice is not None
    assert (choice.backend, choice.num_workers, choice.main_process_envs) == ("process", 1, 0)
    assert "over the 75 us from which the trial times one" in choice.reason
    assert_trees_equal(got, _by_hand("process", choice.process_config(), 4), "near the line")


def test_worth_timing_makes_a_worker_of_sync_only_near_the_line_with_a_spare_cpu():
    unmeasured = dataclasses.replace(choose_layout(5.0, 4, 2), env_step_us=float("nan"))
    for rule in [choose_layout(5.0, 4, 2), choose_layout(30.0, 4, 1), unmeasured]:
        assert worth_timing(rule) is rule  # cheap, no spare CPU, unmeasured
    assert worth_timing(rule := choose_layout(ATARI_US, 4, 2)) is rule  # the rule's workers
    near = worth_timing(choose_layout(WORKERS_TRIED_FROM_US / 4, 4, 2))  # right on the line
    assert (near.backend, near.num_workers) == ("process", 1)


@pytest.mark.parametrize("winner", [0, 1, 2, SHARE])
def test_the_trial_builds_the_fastest_layout_and_samples_what_it_samples(monkeypatch, winner):
    _wants_workers(monkeypatch)  # the rule: 2 workers; the process default on 3 CPUs: 2
    picked: list[dict[int | str, float]] = []
    real_pick = auto_layout.pick_layout

    def rigged(rule, rates, *, policy_step_us):  # the real rates, then a set winner
        assert set(rates) == {0, 2, SHARE} and min(rates.values()) > 0 and policy_step_us > 0
        picked.append(dict(rates))
        rates = {0: 1.0, 1: 1.0, 2: 1.0, SHARE: 1.0, winner: 2.0}
        return real_pick(rule, rates, policy_step_us=policy_step_us)

    monkeypatch.setattr(auto_layout, "pick_layout", rigged)
    policy, params = _policy_and_params()
    with jr.EnvRunner.from_env(short_cartpole, 6, policy, params, ROLLOUT, 3) as runner:
        choice = runner.envs.layout_choice
        got = _fields(runner.sample())
        metrics = runner.get_metrics()["auto"]
    # The share: 2 workers (the main process has a CPU of its own), a third of the envs each.
    workers, share = (2, 2) if winner == SHARE else (winner, 0)
    assert len(picked) == 1 and choice is not None and choice.num_workers == workers
    assert choice.backend == ("process" if winner else "sync")
    config = choice.process_config()
    if winner:
        assert config is not None and config.num_workers == workers
        assert config.main_process_envs == share and runner.envs.num_workers == workers
    tried = "tried_share_steps_per_s" if winner == SHARE else f"tried_{winner}_workers_steps_per_s"
    assert metrics[tried] == 2.0 and metrics["main_process_envs"] == share
    assert metrics["policy_step_us"] == choice.policy_step_us
    backend = "process" if winner else "sync"
    assert_trees_equal(got, _by_hand(backend, config, 6), f"from_env(auto -> {winner} workers)")


def test_the_trial_adds_the_process_default_where_it_differs():
    # 256 sub-envs on 4 CPUs: the rule wants 2 workers for 600 us of work, the process
    # backend's default takes every CPU from 256 sub-envs.
    rule = choose_layout(2.4, 256, cpus=4)
    assert rule.num_workers == 2
    assert trial_workers(rule) == [0, 2, 4]
    assert trial_workers(choose_layout(ATARI_US, 8, cpus=2)) == [0, 1]
    # A multi-agent env's main process waits while its workers step: a worker per CPU.
    assert trial_workers(choose_layout(ATARI_US, 8, cpus=2), multi_agent=True) == [0, 1, 2]


def test_the_trial_leaves_callbacks_alone(monkeypatch):
    _wants_workers(monkeypatch)
    calls: list[int] = []

    class Count(jr.Callbacks):
        def on_episode_end(self, runner, env_index, episode):
            calls.append(env_index)

    policy, params = _policy_and_params()
    with jr.EnvRunner.from_env(
        short_cartpole, 4, policy, params, ROLLOUT, 3, Count(), num_splits=1
    ) as runner:
        assert calls == []  # the trial's episodes ended unseen
        assert runner.envs.layout_choice is not None and runner.envs.layout_choice.tried
        runner.sample()
    assert calls  # the runner's own sample reports its episodes


def test_pick_layout_takes_workers_only_past_the_tie():
    rule = choose_layout(ATARI_US, 8, cpus=4)
    past = pick_layout(rule, {0: 100.0, 1: 90.0, 3: 100.0 * SYNC_TIE + 0.4}, policy_step_us=5)
    assert (past.backend, past.num_workers) == ("process", 3)
    assert past.reason.endswith(
        "tried with the policy (env steps/s): sync 100, 1 worker 90, 3 workers 105; kept 3 workers"
    )
    tie = pick_layout(rule, {0: 100.0, 3: 100.0 * SYNC_TIE}, policy_step_us=5)
    assert (tie.backend, tie.num_workers, tie.process_config()) == ("sync", 0, None)
    assert tie.reason.endswith("kept sync") and dict(tie.tried) == {0: 100, 3: 100 * SYNC_TIE}
    assert tie.metrics()["tried_3_workers_steps_per_s"] == 100 * SYNC_TIE
    assert tie.metrics()["process"] == 0
    fewer = pick_layout(rule, {0: 100.0, 1: 150.0, 3: 150.0}, policy_step_us=5)
    assert fewer.num_workers == 1  # equal rates: the fewer workers


def test_pick_layout_takes_the_main_process_share_only_past_the_tie_with_every_other():
    rule = choose_layout(ATARI_US, 8, cpus=2)  # 1 worker; the share: 1 worker and 4 envs
    rates = {0: 100.0, 1: 120.0, SHARE: 120.0 * VARIANT_TIE + 0.4}
    past = pick_layout(rule, rates, policy_step_us=5)
    assert (past.backend, past.num_workers, past.main_process_envs) == ("process", 1, 4)
    assert kept_key(past) == SHARE and past.process_config() == jr.ProcessConfig(
        num_workers=1, main_process_envs=4
    )
    assert past.reason.endswith(
        "sync 100, 1 worker 120, workers with the main process's share 132; kept workers "
        "with the main process's share"
    )
    assert dict(past.tried) == {0: 100.0, 1: 120.0} and past.tried_share == rates[SHARE]
    assert past.metrics()["main_process_envs"] == 4
    near = pick_layout(rule, {**rates, SHARE: 120.0 * VARIANT_TIE}, policy_step_us=5)
    assert (kept_key(near), near.main_process_envs) == (1, 0)  # a near tie: the isolated one
    assert near.process_config() == jr.ProcessConfig(num_workers=1, main_process_envs=0)
    over_sync = pick_layout(rule, {0: 100.0, 1: 50.0, SHARE: 112.0}, policy_step_us=5)
    assert kept_key(over_sync) == SHARE  # past sync by 10% and 5%, the slower workers far
    assert kept_key(pick_layout(rule, {0: 100.0, SHARE: 104.0}, policy_step_us=5)) == 0
    assert "main_process_envs" not in pick_layout(rule, {0: 1.0}, policy_step_us=5).metrics()


def test_the_share_layout_takes_a_workers_place_where_the_cpus_are_all_taken():
    assert share_layout(choose_layout(ATARI_US, 8, cpus=2)) == (1, 4)
    assert share_layout(choose_layout(ATARI_US, 8, cpus=4)) == (3, 2)  # 8 ms: 3 workers
    assert share_layout(choose_layout(2.4, 4096, cpus=4)) == (3, 1024)  # the rule took 4
    assert share_layout(choose_layout(ATARI_US, 1, cpus=2)) is None  # no sub-env to share


def test_pick_layout_takes_envpool_past_the_tie_and_says_so():
    rule = choose_layout(1.0, 8, cpus=2)  # cheap envs: the rule keeps sync
    won = pick_layout(rule, {0: 100.0, "envpool": 100.0 * SYNC_TIE + 0.4}, policy_step_us=5)
    assert (won.backend, won.num_workers, won.process_config()) == ("envpool", 0, None)
    assert won.reason.endswith("sync 100, envpool 105; kept envpool")
    assert won.tried == ((0, 100.0),) and won.tried_envpool == 100.0 * SYNC_TIE + 0.4
    assert won.metrics()["envpool"] == 1 and won.metrics()["process"] == 0
    tie = pick_layout(rule, {0: 100.0, "envpool": 100.0 * SYNC_TIE}, policy_step_us=5)
    assert tie.backend == "sync" and tie.metrics()["tried_envpool_steps_per_s"] == 100 * SYNC_TIE
    even = pick_layout(rule, {0: 100.0, 1: 150.0, "envpool": 150.0}, policy_step_us=5)
    assert even.backend == "envpool"  # equal rates: no worker processes


def test_pick_layout_takes_envpool_on_one_thread_only_past_the_tie_and_says_so():
    rule = choose_layout(1.0, 64, cpus=2)
    rates = {0: 100.0, 1: 90.0, "envpool": 150.0, "envpool_one_thread": 170.0}
    one = pick_layout(rule, rates, policy_step_us=5)
    assert (one.backend, one.num_workers, one.envpool_options) == (
        "envpool", 0, (("num_threads", 1),)
    )  # fmt: skip
    assert one.reason.endswith(
        "sync 100, 1 worker 90, envpool 150, envpool on 1 thread 170; kept envpool on 1 thread"
    )
    assert one.tried == ((0, 100.0), (1, 90.0)) and one.tried_envpool == 150.0
    metrics = one.metrics()
    assert metrics["envpool_threads"] == 1
    assert metrics["tried_envpool_one_thread_steps_per_s"] == 170
    near = pick_layout(rule, {**rates, "envpool_one_thread": 150.0 * VARIANT_TIE}, policy_step_us=5)
    assert (near.backend, near.envpool_options) == ("envpool", ())  # a near tie: defaults
    assert near.metrics()["envpool_threads"] == 0
    sync = pick_layout(
        rule, {0: 100.0, "envpool": 90.0, "envpool_one_thread": 104.0}, policy_step_us=5
    )
    assert (sync.backend, sync.envpool_options) == ("sync", ())
    untried = pick_layout(rule, {0: 100.0, "envpool": 90.0}, policy_step_us=5)
    assert "envpool_threads" not in untried.metrics()


def test_pick_layout_a_variant_in_a_near_tie_leaves_the_fastest_of_the_rest():
    rule = choose_layout(1.0, 64, cpus=4)
    # One thread within VARIANT_TIE of EnvPool's defaults: not kept, and then 2 workers,
    # faster than EnvPool's defaults, are (not EnvPool, the slower of the two).
    rates = {0: 100.0, 2: 155.0, "envpool": 150.0, "envpool_one_thread": 160.0}
    got = pick_layout(rule, rates, policy_step_us=5)
    assert (got.backend, got.num_workers, got.envpool_options) == ("process", 2, ())
    assert got.reason.endswith("kept 2 workers")
    # Past the tie the variant is kept; EnvPool's defaults alone as before.
    past = pick_layout(rule, {**rates, "envpool_one_thread": 170.0}, policy_step_us=5)
    assert past.envpool_options == (("num_threads", 1),)
    only = {0: 100.0, "envpool": 150.0, "envpool_one_thread": 160.0}
    alone = pick_layout(rule, only, policy_step_us=5)
    assert (alone.backend, alone.envpool_options) == ("envpool", ())


def test_the_trial_times_envpool_on_one_thread_and_async_where_they_differ():
    assert envpool_variants(64, 2) == ["envpool_one_thread", "envpool_async", "envpool_pools"]
    assert envpool_options("envpool_pools", 64, 2) == {"num_pools": 2, "num_threads": 1}
    # Two pools take a split each: the trial leaves them out where num_splits says other.
    assert envpool_variants(64, 2, pools=False) == ["envpool_one_thread", "envpool_async"]
    assert envpool_variants(64, 1) == envpool_variants(1, 2) == []  # EnvPool's own is 1
    assert envpool_options("envpool_one_thread", 8, 2) == {"num_threads": 1}
    assert envpool_options("envpool", 8, 2) == {}
    # Async: half the envs per recv, on a thread fewer than the CPUs (the runner's own).
    assert envpool_options("envpool_async", 64, 2) == {"batch_size": 32, "num_threads": 1}
    assert envpool_options("envpool_async", 64, 16) == {"batch_size": 32, "num_threads": 15}
    assert envpool_options("envpool_async", 8, 16) == {"batch_size": 4, "num_threads": 4}


def test_the_trial_times_envpool_async_only_where_it_can_be_built_and_run():
    # EnvPool's async mode answers whole batches: 5 envs cannot go in batches of 2 (it
    # was timed, refused by make_vec, and warned about as a failed layout).
    assert (
        envpool_variants(5, 4) == envpool_variants(7, 16) == ["envpool_one_thread", "envpool_pools"]
    )
    assert envpool_variants(3, 4)[:2] == ["envpool_one_thread", "envpool_async"]  # batches of 1
    for num_envs in range(2, 40):
        if "envpool_async" in envpool_variants(num_envs, 4):
            batch = envpool_options("envpool_async", num_envs, 4)["batch_size"]
            assert 1 <= batch < num_envs and num_envs % batch == 0
    # Its ready-first loop refuses per-step callbacks and num_splits, which the trial's
    # runners leave out: chosen, the runner built with them would raise.
    assert envpool_variants(64, 2, ready_first=False) == ["envpool_one_thread", "envpool_pools"]
    assert auto_layout.takes_loop_options(None, None) and auto_layout.takes_loop_options(None, 1)
    assert auto_layout.takes_loop_options(AgentCallbacks(), None)  # no per-step hook
    assert not auto_layout.takes_loop_options(jr.Callbacks(), None)
    assert not auto_layout.takes_loop_options(None, 2)


def test_pick_layout_keeps_envpool_async_past_the_tie_and_says_so():
    rule = choose_layout(1.0, 256, cpus=2)
    rates = {0: 100.0, 2: 150.0, "envpool": 300.0, "envpool_one_thread": 320.0}
    got = pick_layout(rule, {**rates, "envpool_async": 400.0}, policy_step_us=5)
    assert (got.backend, got.num_workers) == ("envpool", 0)
    assert dict(got.envpool_options) == {"batch_size": 128, "num_threads": 1}
    assert kept_key(got) == "envpool_async"
    assert got.reason.endswith(
        "envpool 300, envpool on 1 thread 320, envpool async 400; kept envpool async"
    )
    metrics = got.metrics()
    assert (metrics["envpool_threads"], metrics["envpool_batch_size"]) == (1, 128)
    assert metrics["tried_envpool_async_steps_per_s"] == 400
    near = pick_layout(rule, {**rates, "envpool_async": 300.0 * VARIANT_TIE}, policy_step_us=5)
    assert kept_key(near) == "envpool" and near.metrics()["envpool_batch_size"] == 0
    slow = {**rates, "envpool_one_thread": 340.0, "envpool_async": 1.0}
    assert kept_key(pick_layout(rule, slow, policy_step_us=5)) == "envpool_one_thread"


def test_refusals_say_what_to_do():
    policy, params = _policy_and_params()
    with pytest.raises(InvalidArgumentTypeError, match="backend='process' with your config"):
        jr.EnvRunner.from_env(
            "CartPole-v1", 2, policy, params, ROLLOUT, 0, config=jr.ProcessConfig(num_workers=1)
        )
    with pytest.raises(InvalidArgumentError, match="rollout_length"):
        jr.EnvRunner.from_env("CartPole-v1", 2, policy, params, 0, 0, backend="sync")


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"num_envs": 0}, r"from_env\(num_envs=0\): expected an int >= 1"),
        ({"rollout_length": 0}, r"from_env\(rollout_length=0\): expected an int >= 1"),
        ({"num_split": 2}, r"from_env\(num_split=...\): not an option of EnvRunner.*num_splits"),
    ],
)
def test_bad_arguments_are_refused_before_any_trial(monkeypatch, bad, match):
    _wants_workers(monkeypatch)
    monkeypatch.setattr(auto_layout, "choose_auto_layout", lambda *a: pytest.fail("probed"))
    policy, params = _policy_and_params()
    args = {"num_envs": 2, "rollout_length": ROLLOUT, **bad}
    with pytest.raises(InvalidArgumentError, match=match):
        jr.EnvRunner.from_env(
            "CartPole-v1", args.pop("num_envs"), policy, params, args.pop("rollout_length"), 0,
            **args,
        )  # fmt: skip


def test_env_kwargs_that_are_not_a_dict_are_named():
    policy, params = _policy_and_params()
    with pytest.raises(InvalidArgumentTypeError, match=r"from_env\(env_kwargs=\[1\]\): expected"):
        jr.EnvRunner.from_env("CartPole-v1", 2, policy, params, ROLLOUT, 0, env_kwargs=[1])


def test_the_deprecated_alias_takes_the_runners_options():
    from jaxrunner._src.runner.env_runner import MultiAgentRunner

    policy, params = _policy_and_params()
    with (
        pytest.warns(DeprecationWarning),
        MultiAgentRunner.from_env(
            "CartPole-v1", 2, policy, params, 4, 0, backend="sync", num_splits=1
        ) as runner,
    ):
        assert runner.sample().num_steps == 4


def test_env_kwargs_reach_gymnasium_make():
    policy, params = _policy_and_params()
    with jr.EnvRunner.from_env(
        "CartPole-v1", 2, policy, params, 12, 0, backend="sync",
        env_kwargs={"max_episode_steps": 5},
    ) as runner:  # fmt: skip
        traj = runner.sample()
    assert traj.truncated[4].all() and traj.truncated[9].all()  # every 5th step


@pytest.mark.parametrize("key", ["seed", "config", "backend", "policy_mapping_fn"])
def test_env_kwargs_that_make_vec_would_take_as_its_own_are_refused(key):
    # "seed" would have seeded the vector env silently; the others were a TypeError.
    policy, params = _policy_and_params()
    with pytest.raises(InvalidArgumentError, match=rf"env_kwargs=\{{'{key}': ...\}}.*env factory"):
        jr.EnvRunner.from_env(
            "CartPole-v1", 2, policy, params, 4, 0, backend="sync", env_kwargs={key: 1}
        )


def test_close_layouts_are_undecided_and_clear_ones_are_not():
    from jaxrunner._src.runner.trial_layouts import undecided

    assert undecided({0: [1.0, 1.0], 1: [1.05, 1.05]})  # workers 5% slower
    assert undecided({0: [1.05], 1: [1.0], 2: [2.0]})  # the faster workers 5% faster
    assert not undecided({0: [1.0], 1: [1.2]})  # sync clearly faster
    assert not undecided({0: [1.2], 1: [2.0], 2: [1.0]})  # workers clearly faster
    # Each layout's fastest sample counts: workers slowed in most samples by other
    # work (median 1.5) are still clearly faster at their best.
    assert not undecided({0: [1.0, 1.0, 1.0], 1: [0.8, 1.5, 1.5]})


class DiesInWorkers:
    """A factory of short CartPoles that exit their process at their 2nd step, except
    in the process that made the factory (the trial's sync layout, and the probe)."""

    def __init__(self) -> None:
        self.main = os.getpid()

    def __call__(self) -> Any:
        faults = [] if os.getpid() == self.main else [FaultPlan(kind="exit", at=(2,))]
        return jr.testing.FaultyEnv(short_cartpole(), faults)


def test_the_trial_stops_timing_the_layouts_far_behind():
    times = {0: [2.0, 1.0], 1: [1.4], SHARE: [3.0, 1.51], "envpool_pools": [1.5, 1.4]}
    # Within 1.5x of the fastest, by the pick's own rates: EnvPool's median, not its best.
    times |= {"envpool": [1.0, 1.6, 1.7], "envpool_async": [1.6, 1.4, 1.0]}
    assert in_the_running(times) == [0, 1, "envpool_pools", "envpool_async"]
    assert in_the_running({0: [DROP_BEHIND], 2: [1.0]}) == [0, 2]  # right on the line


def test_the_trial_counts_a_layouts_fastest_timing_but_envpools_median():
    """EnvPool's threads step faster in a short burst after idling (the trial's
    timings): its fastest timing would overrate it."""
    times = {0: [4.0, 2.0, 5.0], 1: [1.0, 3.0, 2.0], "envpool": [1.0, 4.0, 5.0]}
    times |= {"envpool_pools": [0.5, 2.0, 2.5, 3.0]}
    rates = trial_rates(times)
    assert rates == {0: 0.5, 1: 1.0, "envpool": 0.25, "envpool_pools": 1 / 2.25}


class SleepsInWorkers:
    """A factory of short CartPoles whose steps take 3 ms, except in the process that
    made the factory (the trial's sync layout, and the probe)."""

    def __init__(self) -> None:
        self.main = os.getpid()

    def __call__(self) -> Any:
        env = short_cartpole()
        return env if os.getpid() == self.main else _Sleepy(env)


class _Sleepy(gymnasium.Wrapper):
    def step(self, action: Any) -> Any:
        time.sleep(0.003)
        return self.env.step(action)


def test_a_trial_times_layouts_far_behind_for_its_first_rounds_only(monkeypatch):
    _wants_workers(monkeypatch)  # the trial: sync, 2 workers and the share
    running: list[list[int | str]] = []

    def spied(times):
        running.append(in_the_running(times))
        return running[-1]

    monkeypatch.setattr(auto_layout, "in_the_running", spied)
    policy, params = _policy_and_params()
    with jr.EnvRunner.from_env(SleepsInWorkers(), 6, policy, params, ROLLOUT, 3) as runner:
        choice = runner.envs.layout_choice
    # The workers' layouts, far behind after the first rounds, were timed no more: with
    # sync alone in the running, the trial ended there.
    assert running == [[0]]
    assert choice is not None and (choice.backend, choice.num_workers) == ("sync", 0)
    assert [w for w, _ in choice.tried] == [0, 2] and choice.tried_share is not None


def test_a_process_layout_whose_workers_die_in_the_trial_is_dropped(monkeypatch):
    _wants_workers(monkeypatch)  # the trial: sync and 2 workers
    policy, params = _policy_and_params()
    with pytest.warns(RuntimeWarning, match=r"2 workers failed \(WorkerError"):
        runner = jr.EnvRunner.from_env(DiesInWorkers(), 6, policy, params, ROLLOUT, 3)
    with runner:
        choice = runner.envs.layout_choice
        assert choice is not None and (choice.backend, choice.num_workers) == ("sync", 0)
        assert [w for w, _ in choice.tried] == [0] and "2 workers failed" in choice.reason
        got = _fields(runner.sample())
    assert_trees_equal(got, _by_hand("sync", None, 6), "from_env(auto, workers died)")


def test_a_probe_that_fails_under_a_restart_policy_gives_sync_with_no_trial(monkeypatch):
    def no_trial(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a trial after the probe fell back to sync")

    monkeypatch.setattr(auto_layout, "_trial", no_trial)
    monkeypatch.setattr(auto, "available_cpus", lambda: 3)
    made: list[Any] = []

    def first_fails() -> Any:  # the probe (the first env made) raises at its 5th step
        made.append(jr.testing.FaultyEnv(short_cartpole(), [FaultPlan(at=(5,))] * (not made)))
        return made[-1]

    policy, params = _policy_and_params()
    with pytest.warns(RuntimeWarning, match=r"probe sub-env's step 5 raised InjectedError"):
        runner = jr.EnvRunner.from_env(
            first_fails, 4, policy, params, ROLLOUT, 3, restart_policy=jr.RestartPolicy()
        )
    with runner:
        assert runner.envs.layout_choice is not None
        assert runner.envs.layout_choice.backend == "sync"
        got = _fields(runner.sample())
    assert_trees_equal(got, _by_hand("sync", None, 4), "from_env(auto, the probe failed)")


@pytest.mark.parametrize("winner", [0, 2, SHARE])
def test_the_trial_times_a_pettingzoo_factory_too(monkeypatch, winner):
    """A multi-agent env's policy is timed on sync and the rule's workers as a
    single-agent env's is; the runner samples what the chosen layout built by hand does."""
    from tests.multi_agent_envs import coming_and_going
    from tests.test_multi_agent import random_policy, zero_params

    _wants_workers(monkeypatch)
    picked: list[dict[int, float]] = []
    real_pick = auto_layout.pick_layout

    def rigged(rule, rates, *, policy_step_us):
        picked.append(dict(rates))
        rates = {0: 1.0, 2: 1.0, SHARE: 1.0, winner: 2.0}
        return real_pick(rule, rates, policy_step_us=policy_step_us)

    monkeypatch.setattr(auto_layout, "pick_layout", rigged)
    policy, params = random_policy(3), zero_params(3)
    with jr.EnvRunner.from_env(coming_and_going, 4, policy, params, ROLLOUT, 3) as runner:
        choice = runner.envs.layout_choice
        got = runner.sample()
    # The process backend's default for a multi-agent env: a worker per CPU (3).
    assert len(picked) == 1 and set(picked[0]) == {0, 2, 3, SHARE} and min(picked[0].values()) > 0
    assert choice is not None and runner.multi_agent
    layout = (2, 1) if winner == SHARE else (winner, 0)  # the share: a third of 4 envs
    assert (choice.num_workers, choice.main_process_envs) == layout
    backend = "process" if winner else "sync"
    envs = jr.make_vec(coming_and_going, 4, backend, config=choice.process_config())
    with jr.EnvRunner(envs, policy, params, ROLLOUT, seed=3) as by_hand:
        assert_trees_equal(got, by_hand.sample(), f"from_env(auto -> {winner} workers)")


@pytest.mark.parametrize("backend", ["sync", "auto"])
def test_a_policy_mapping_reaches_make_vec_as_it_does_by_hand(monkeypatch, backend):
    """make_vec's multi-agent option, as from_env takes its single-agent ones
    (config, restart_policy, env_kwargs); "auto" with the trial of sync and workers."""
    from tests.multi_agent_envs import coming_and_going
    from tests.test_multi_agent import random_policy, zero_params

    def mapping(agent_id: str) -> str:
        return "even" if int(agent_id[1:]) % 2 == 0 else "odd"

    _wants_workers(monkeypatch)
    timed: list[dict[int, float]] = []
    real_pick = auto_layout.pick_layout

    def rigged(rule, rates, *, policy_step_us):
        timed.append(dict(rates))
        return real_pick(rule, {0: 2.0, 2: 1.0}, policy_step_us=policy_step_us)  # sync

    monkeypatch.setattr(auto_layout, "pick_layout", rigged)
    policy, params = random_policy(3), {"even": zero_params(3), "odd": zero_params(3)}
    with jr.EnvRunner.from_env(
        coming_and_going, 4, policy, params, ROLLOUT, 3, backend=backend, policy_mapping_fn=mapping
    ) as runner:
        assert runner.policy_ids == ("even", "odd")
        got = runner.sample()
    assert len(timed) == (backend == "auto")
    envs = jr.make_vec(coming_and_going, 4, policy_mapping_fn=mapping)
    with jr.EnvRunner(envs, policy, params, ROLLOUT, seed=3) as by_hand:
        assert_trees_equal(got, by_hand.sample(), f"from_env({backend}, policy_mapping_fn)")
    policy, params = _policy_and_params()
    with pytest.raises(InvalidArgumentTypeError, match="policy mapping is for multi-agent"):
        jr.EnvRunner.from_env(
            short_cartpole, 2, policy, params, ROLLOUT, 3, policy_mapping_fn=mapping
        )

"""``make_vec(backend="auto")``: the choice rule on synthetic measurements, the CPU
budget it reads (affinity, cgroup quota), and real builds that report their choice
and sample what the chosen backend samples."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
import types
from typing import Any, ClassVar

import gymnasium
import jax
import numpy as np
import pytest
from conftest import ActorCritic, short_cartpole

import jaxrunner as jr
from jaxrunner._src import bench, cli
from jaxrunner._src.backends import auto
from jaxrunner._src.backends.auto import choose_layout, measure_env_step_us
from jaxrunner._src.backends.process import launch
from jaxrunner._src.bench.report import format_choice
from jaxrunner._src.runner import auto_layout
from jaxrunner._src.services.metrics_writer import flatten_metrics
from jaxrunner.errors import EnvError, InvalidArgumentError, InvalidArgumentTypeError
from jaxrunner.testing import assert_trees_equal

F32_OBS = gymnasium.spaces.Box(-1, 1, (4,), np.float32)


def box_action(dtype: Any) -> gymnasium.spaces.Box:
    return gymnasium.spaces.Box(-1, 1, (2,), dtype)


CARTPOLE_US = 6.0  # a CartPole-v1 step as the probe measures it
ATARI_US = 1000.0  # an Atari step with frame skip (Pong here: ~400 us)


def costly(probe: Any, seed: int | None, **_: Any) -> float:
    """Stands in for the probe's measurement: a costly env (the probe closed, as it is)."""
    probe.close()
    return ATARI_US


@pytest.mark.parametrize("num_envs", [1, 8])
def test_little_env_work_stays_in_one_process(num_envs):
    # CartPole at 1 and 8 envs on 2 cores: one worker did 0.82x and 0.71x sync.
    choice = choose_layout(CARTPOLE_US, num_envs, cpus=2)
    assert (choice.backend, choice.num_workers) == ("sync", 0)
    assert choice.process_config() is None
    assert "under the 300 us" in choice.reason


def test_enough_env_work_takes_the_worker_two_cores_leave():
    # CartPole at 64 envs on 2 cores: one worker did 1.18x sync.
    choice = choose_layout(CARTPOLE_US, 64, cpus=2)
    assert (choice.backend, choice.num_workers) == ("process", 1)


def test_from_256_envs_the_workers_take_every_cpu():
    # As the process backend's default: at 256 CartPoles on 2 cores two workers did
    # 1.22-1.25x one worker.
    choice = choose_layout(CARTPOLE_US, 256, cpus=2)
    assert (choice.backend, choice.num_workers) == ("process", 2)
    assert "at most 2 of 2 CPUs" in choice.reason
    assert choose_layout(CARTPOLE_US, 255, cpus=2).num_workers == 1


@pytest.mark.parametrize("num_envs", [1, 8, 256])
def test_one_cpu_never_starts_a_worker(num_envs):
    choice = choose_layout(ATARI_US, num_envs, cpus=1)
    assert choice.backend == "sync" and "none left for a worker" in choice.reason


@pytest.mark.parametrize(("num_envs", "workers"), [(8, 8), (32, 15)])
def test_costly_env_on_16_cores_takes_a_worker_per_spare_cpu(num_envs, workers):
    choice = choose_layout(ATARI_US, num_envs, cpus=16)
    assert (choice.backend, choice.num_workers) == ("process", workers)
    config = choice.process_config()
    assert config is not None and config.num_workers == workers
    assert config.main_process_envs == 0 and config.spin_wait_us is None  # the defaults


def test_workers_grow_with_the_work_up_to_the_spare_cpus():
    # One worker per MIN_WORK_US of work: CartPole at 256 envs on 16 cores.
    work = CARTPOLE_US * 256
    choice = choose_layout(CARTPOLE_US, 256, cpus=16)
    assert choice.num_workers == int(work // auto.MIN_WORK_US) == 5
    assert choose_layout(CARTPOLE_US, 4096, cpus=16).num_workers == 16


def test_the_rule_switches_at_its_threshold():
    least = auto.MIN_WORK_US
    assert choose_layout(1.01 * least / 64, 64, cpus=2).backend == "process"
    assert choose_layout(0.99 * least / 64, 64, cpus=2).backend == "sync"


def test_metrics_are_numbers_a_logger_takes():
    choice = choose_layout(ATARI_US, 32, cpus=16)
    flat = flatten_metrics({"auto": choice.metrics()})
    assert flat == {
        "auto/process": 1,
        "auto/num_workers": 15,
        "auto/env_step_us": ATARI_US,
        "auto/cpus": 16,
    }


def test_cgroup_v2_quota_of_the_process_own_cgroup(tmp_path):
    own = tmp_path / "user.slice" / "job"
    own.mkdir(parents=True)
    (own / "cpu.max").write_text("250000 100000\n")
    (tmp_path / "self_cgroup").write_text("0::/user.slice/job\n")
    assert launch.cgroup_cpu_quota(str(tmp_path), str(tmp_path / "self_cgroup")) == 2.5


def test_cgroup_v1_quota(tmp_path):
    cpu = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("50000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "self_cgroup").write_text("4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n")
    assert launch.cgroup_cpu_quota(str(tmp_path), str(tmp_path / "self_cgroup")) == 0.5
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")  # no quota
    assert launch.cgroup_cpu_quota(str(tmp_path), str(tmp_path / "self_cgroup")) is None


def test_available_cpus_takes_the_smaller_of_affinity_and_quota(monkeypatch):
    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda _: {0, 1, 2}, raising=False)
    monkeypatch.setattr(launch, "cgroup_cpu_quota", lambda: None)
    assert launch.available_cpus() == 3  # affinity alone
    monkeypatch.setattr(launch, "cgroup_cpu_quota", lambda: 0.5)
    assert launch.available_cpus() == 1  # half a CPU still runs


def test_the_probe_times_a_step_and_closes_its_env():
    closed = []

    def make() -> Any:
        env = short_cartpole()
        env.close = lambda: closed.append(True)  # type: ignore[method-assign]
        return env

    us = measure_env_step_us(make(), seed=0, max_steps=50)
    assert 0 < us < 10_000 and closed == [True]


def _runner(envs: jr.VectorEnv) -> jr.EnvRunner:
    policy = jr.Policy.from_linen(ActorCritic(2), envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    return jr.EnvRunner(envs, policy, params, rollout_length=16, seed=0)


def _sample(envs: jr.VectorEnv) -> dict[str, Any]:
    with _runner(envs) as runner:
        traj = runner.sample()
        metrics = runner.get_metrics()
    tree = {f.name: getattr(traj, f.name) for f in dataclasses.fields(traj)}
    return {"trajectory": tree, "metrics": metrics}


def test_cartpole_builds_reports_its_choice_and_samples():
    envs = jr.make_vec("CartPole-v1", 4, backend="auto", seed=0)
    choice = envs.layout_choice
    assert choice is not None and choice.backend == "sync"  # 4 cheap envs
    assert choice.num_envs == 4 and choice.env_step_us > 0
    assert choice.cpus == launch.available_cpus()
    out = _sample(envs)
    assert out["metrics"]["auto"] == choice.metrics()
    assert out["trajectory"]["reward"].shape == (16, 4)


def test_the_process_branch_samples_what_sync_samples(monkeypatch):
    monkeypatch.setattr(auto, "measure_env_step_us", costly)
    monkeypatch.setattr(auto, "available_cpus", lambda: 3)
    envs = jr.make_vec(short_cartpole, 6, backend="auto", seed=0)
    choice = envs.layout_choice
    assert choice is not None and (choice.backend, choice.num_workers) == ("process", 2)
    assert isinstance(envs, jr.ProcessVectorEnv) and envs.num_workers == 2
    got = _sample(envs)
    assert got["metrics"]["auto"]["process"] == 1
    expected = _sample(jr.make_vec(short_cartpole, 6, backend="sync", seed=0))
    assert_trees_equal(got["trajectory"], expected["trajectory"], "auto (process) vs sync")


def test_auto_refuses_a_config():
    with pytest.raises(InvalidArgumentTypeError, match="backend='process' with your config"):
        jr.make_vec("CartPole-v1", 2, backend="auto", config=jr.ProcessConfig(num_workers=1))


def test_auto_refuses_an_id_gymnasium_cannot_make():
    with pytest.raises(InvalidArgumentError, match="backend='envpool'"):
        jr.make_vec("NoSuchTask-v9", 2, backend="auto")


def _vec_spaces(obs: gymnasium.Space, action: gymnasium.Space) -> Any:
    return types.SimpleNamespace(single_observation_space=obs, single_action_space=action)


@pytest.mark.parametrize(
    ("envpool_spaces", "same"),
    [
        ((F32_OBS, box_action(np.float64)), True),  # EnvPool's MuJoCo: float64 actions
        ((F32_OBS, box_action(np.float32)), True),
        ((F32_OBS, box_action(np.float16)), False),  # float32 actions would not fit
        ((gymnasium.spaces.Box(0, 255, (4,), np.uint8), box_action(np.float32)), False),
        ((F32_OBS, gymnasium.spaces.Discrete(2)), False),
        ((gymnasium.spaces.Box(-1, 1, (5,), np.float32), box_action(np.float32)), False),
    ],
)
def test_the_trial_takes_envpool_where_its_spaces_take_the_policys_actions(envpool_spaces, same):
    """``from_env`` times EnvPool only where the policy built for gymnasium's spaces fits
    its envs: the same observations, and actions that cast to EnvPool's safely."""
    sync = _vec_spaces(F32_OBS, box_action(np.float32))
    assert auto_layout._same_spaces(_vec_spaces(*envpool_spaces), sync) is same


def test_unknown_backend_lists_auto():
    with pytest.raises(InvalidArgumentError, match="'auto'"):
        jr.make_vec("CartPole-v1", 2, backend="fastest")


def test_bench_takes_auto_and_prints_the_choice():
    args = cli.build_parser().parse_args(["bench", "--backend", "auto"])
    assert args.backend == "auto" and bench.PLANS["auto"].reference == "sync"
    choice = choose_layout(ATARI_US, 32, cpus=16)
    text = format_choice(dataclasses.asdict(choice))
    assert text == f"process (15 workers): env step 1000.0 us, 16 CPUs; {choice.reason}"


# -- the probe: bounded in time, always closed, falling back to sync --------------------------


class ProbeFault(RuntimeError):
    """What the first-built CartPole (the probe) raises."""


class FirstFails(gymnasium.Wrapper):
    """CartPole (short episodes) whose first instance in this process, the probe, fails
    at ``call`` (``"reset"``, or step ``at``) as ``how`` says: ``"raise"`` once, or
    ``"hang"`` until ``RELEASE`` is set; later instances fail as ``later`` says
    (``"reset"``: every reset raises) or behave. Each instance's close is recorded."""

    RELEASE = threading.Event()
    made: ClassVar[list[FirstFails]] = []

    def __init__(self, how: str, call: str = "step", at: int = 36, later: str = "") -> None:
        super().__init__(short_cartpole())
        self.how, self.call, self.at, self.later = how, call, at, later
        self.first = not FirstFails.made
        self.steps, self.closed = 0, False
        FirstFails.made.append(self)

    def _fail(self, call: str) -> None:
        if self.first and call == self.call and (call == "reset" or self.steps == self.at):
            if self.how == "hang":
                FirstFails.RELEASE.wait()
            else:
                raise ProbeFault(f"{call} failed")
        if not self.first and self.later == call:
            raise ProbeFault(f"a new env's {call} failed too")

    def reset(self, **kwargs: Any) -> Any:
        self._fail("reset")
        return super().reset(**kwargs)

    def step(self, action: Any) -> Any:
        self._fail("step")
        self.steps += 1
        return super().step(action)

    def close(self) -> None:
        self.closed = True
        super().close()


@pytest.fixture
def first_fails():
    FirstFails.made.clear()
    FirstFails.RELEASE.clear()
    yield FirstFails
    FirstFails.RELEASE.set()  # lets an abandoned probe end


def _same_as_sync(envs: jr.VectorEnv, num_envs: int) -> None:
    assert isinstance(envs, jr.SyncVectorEnv)
    got = _sample(envs)["trajectory"]
    expected = _sample(jr.make_vec(short_cartpole, num_envs, backend="sync", seed=0))
    assert_trees_equal(got, expected["trajectory"], "auto's fallback vs sync")


@pytest.mark.parametrize(("call", "at"), [("reset", 0), ("step", 36)])
def test_a_probe_that_hangs_is_abandoned_sync_built_and_the_probe_closed_later(
    monkeypatch, first_fails, call, at
):
    monkeypatch.setattr(auto, "PROBE_DEADLINE_S", 0.5)
    where = "reset" if call == "reset" else "step 37"  # the probe's 37th step (from 1)
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match=f"probe sub-env's {where} did not return within 0.5 s"):
        envs = jr.make_vec(lambda: first_fails("hang", call, at), 3, backend="auto", seed=0)
    assert time.perf_counter() - start < 30  # not the hang's length: it has none
    choice = envs.layout_choice
    assert choice is not None and (choice.backend, choice.num_workers) == ("sync", 0)
    assert choice.reason.startswith("no measurement: the probe") and math.isnan(choice.env_step_us)
    probe = first_fails.made[0]
    assert not probe.closed  # still inside its hung call
    first_fails.RELEASE.set()
    deadline = time.perf_counter() + 10
    while not probe.closed and time.perf_counter() < deadline:
        time.sleep(0.01)
    assert probe.closed  # closed once its call returned
    _same_as_sync(envs, 3)


def test_a_probe_step_that_raises_falls_back_to_sync_under_a_restart_policy(first_fails):
    with pytest.warns(RuntimeWarning, match=r"step 37 raised ProbeFault\('step failed'\)"):
        envs = jr.make_vec(
            lambda: first_fails("raise"), 4, "auto", 0, restart_policy=jr.RestartPolicy()
        )
    choice = envs.layout_choice
    assert choice is not None and choice.backend == "sync" and "recovers" in choice.reason
    probe, recreated = first_fails.made[:2]
    assert probe.closed and recreated.closed  # the restart, tried as sync would, then closed
    _same_as_sync(envs, 4)


def test_a_probe_that_raises_with_no_restart_policy_raises_the_env_error(first_fails):
    with pytest.raises(ProbeFault, match="step failed") as info:
        jr.make_vec(lambda: first_fails("raise"), 4, backend="auto")
    (note,) = info.value.__notes__
    assert 'backend="auto" was probing the env' in note and "when its step 37 raised" in note
    assert [env.closed for env in first_fails.made] == [True]  # the probe, and no other


def test_an_env_that_sync_cannot_recreate_either_raises_the_policy_error(first_fails):
    policy = jr.RestartPolicy(max_attempts=2)
    with pytest.raises(EnvError, match="2 attempts in a row failed") as info:
        jr.make_vec(lambda: first_fails("raise", later="reset"), 4, "auto", restart_policy=policy)
    assert isinstance(info.value.__cause__, ProbeFault)  # the probe's own failure
    assert 'backend="auto" was probing' in info.value.__notes__[0]
    assert len(first_fails.made) == 3 and all(env.closed for env in first_fails.made)


# -- multi-agent envs: the same probe and rule -----------------------------------------------


def _multi_agent_sample(envs: jr.MultiAgentVectorEnv) -> Any:
    from tests.test_multi_agent import random_policy, zero_params

    policy = random_policy(envs.groups[0].action_space.n)
    params = zero_params(envs.groups[0].action_space.n)
    with jr.EnvRunner(envs, policy, params, rollout_length=12, seed=0) as runner:
        return runner.sample()


@pytest.mark.parametrize("rule", ["measured", "costly"])
def test_a_multi_agent_env_is_probed_and_built_as_the_chosen_layout(monkeypatch, rule):
    from jaxrunner.testing import coming_and_going

    if rule == "costly":
        monkeypatch.setattr(auto, "measure_env_step_us", costly)
        monkeypatch.setattr(auto, "available_cpus", lambda: 3)
    envs = jr.make_vec(coming_and_going, 4, backend="auto", seed=0)
    choice = envs.layout_choice
    assert isinstance(envs, jr.MultiAgentVectorEnv) and choice is not None
    if rule == "costly":
        assert (choice.backend, choice.num_workers) == ("process", 2)
    else:
        assert choice.backend == "sync" and choice.env_step_us > 0  # a cheap env
    got = _multi_agent_sample(envs)
    expected = _multi_agent_sample(jr.make_vec(coming_and_going, 4, seed=0))
    assert_trees_equal(got, expected, "auto vs sync")

"""Smoke tests of the benchmarks the performance page's figures come from, and of the
reference they measure against: they run end to end and report what their docstrings
promise. Tiny settings; nothing timed is asserted (speed is for the benchmarks
themselves, on a quiet machine)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import pathlib
import subprocess
import sys

import gymnasium
import jax
import numpy as np
import pytest

from jaxrunner._src import bench, cli
from jaxrunner._src.bench import rounds
from jaxrunner._src.bench.child import Child, ChildError

BENCHMARKS = pathlib.Path(__file__).parent.parent / "benchmarks"
# The scripts import this checkout's jaxrunner, whichever one is installed.
SCRIPT_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        filter(None, [str(BENCHMARKS.parent), os.environ.get("PYTHONPATH")])
    ),
}


def _run(script: str, *options: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *options],
        capture_output=True,
        text=True,
        timeout=600,
        env=SCRIPT_ENV,
    )
    assert done.returncode == 0, done.stderr


def test_recording_hand_loop_buffers_hold_what_the_env_returned():
    """One CartPole env: the loop's buffers against gymnasium stepped by hand with the
    recorded actions, over two rollouts that cross episode ends (SAME_STEP autoreset:
    the observation after an episode's last step is the next episode's first)."""
    envs = gymnasium.vector.SyncVectorEnv(
        [lambda: gymnasium.make("CartPole-v1")],
        autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP,
    )
    loop = bench.RecordingHandLoop(envs, rollout_length=40, seed=3)
    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=3)
    ends = 0
    for _ in range(2):
        assert loop.rollout() == 40
        for t in range(40):
            np.testing.assert_array_equal(loop.obs[t, 0], obs)
            obs, reward, terminated, truncated, _ = env.step(int(loop.action[t, 0]))
            assert (loop.reward[t, 0], loop.terminated[t, 0], loop.truncated[t, 0]) == (
                reward,
                terminated,
                truncated,
            )
            if terminated or truncated:
                obs, _ = env.reset()
                ends += 1
    assert ends >= 2  # random CartPole episodes last about 20 steps
    # The log-probs are the policy's, of the actions taken, on the recorded obs.
    log_prob = loop.policy.evaluate_fn(loop.params, loop.obs[:, 0], None, loop.action[:, 0])
    np.testing.assert_allclose(loop.log_prob[:, 0], log_prob["log_prob"], rtol=1e-5, atol=1e-6)
    assert len(set(loop.action[:, 0].tolist())) == 2  # stochastic actions
    envs.close()


def test_multi_agent_hand_loop_buffers_hold_what_the_envs_returned():
    """Two MPE simple_spread envs: the loop's [T, B, A] buffers against PettingZoo
    stepped by hand with the recorded actions, over two rollouts that cross episode
    ends (the hand loop resets an env once no agent is left)."""
    pytest.importorskip("mpe2")
    from tests.multi_agent_envs import simple_spread  # 10 steps per episode

    loop = bench.MultiAgentHandLoop(simple_spread, num_envs=2, rollout_length=8, seed=3)
    assert loop.agents == ("agent_0", "agent_1", "agent_2")
    assert loop.obs.shape == (8, 2, 3, 18) and loop.reward.shape == (8, 2, 3)
    envs = [simple_spread() for _ in range(2)]
    obs = [env.reset(seed=3 + b)[0] for b, env in enumerate(envs)]
    ends = 0
    for _ in range(2):
        assert loop.rollout() == 16
        for t, b in itertools.product(range(8), range(2)):
            for k, agent in enumerate(loop.agents):
                np.testing.assert_array_equal(loop.obs[t, b, k], obs[b][agent])
            actions = {a: int(loop.action[t, b, k]) for k, a in enumerate(loop.agents)}
            obs[b], reward, terminated, truncated, _ = envs[b].step(actions)
            for k, agent in enumerate(loop.agents):
                assert loop.reward[t, b, k] == reward[agent]
                assert loop.terminated[t, b, k] == terminated[agent]
                assert loop.truncated[t, b, k] == truncated[agent]
            if not envs[b].agents:
                obs[b], _ = envs[b].reset()
                ends += 1
    assert ends == 2  # each env's first episode ended at step 10 of 16
    # The log-probs are the policy's, of the actions taken, on the recorded obs.
    flat = loop.obs.reshape(-1, 18)
    log_prob = loop.policy.evaluate_fn(loop.params, flat, None, loop.action.reshape(-1))
    np.testing.assert_allclose(
        loop.log_prob.reshape(-1), log_prob["log_prob"], rtol=1e-5, atol=1e-6
    )
    assert len(set(loop.action.reshape(-1).tolist())) > 1  # stochastic actions
    loop.close()


def test_multi_agent_hand_loop_refuses_agents_it_cannot_stack():
    pytest.importorskip("mpe2")
    from tests.multi_agent_envs import coming_and_going, simple_adversary

    with pytest.raises(ValueError, match="agent 'agent_0' has other spaces than 'adversary_0'"):
        bench.MultiAgentHandLoop(simple_adversary, 1, 8, 0)
    # a2 and a3 are not there at the start
    with pytest.raises(ValueError, match=r"env 0 goes on with agents \['a0', 'a1'\], not all"):
        bench.MultiAgentHandLoop(coming_and_going, 1, 8, 0)


def test_multi_agent_hand_loop_closes_the_envs_it_built_when_one_fails():
    built: list[object] = []

    class Env:
        closed = False

        def close(self) -> None:
            self.closed = True

    def env_fn() -> Env:
        if len(built) == 2:
            raise RuntimeError("the third env fails")
        built.append(Env())
        return built[-1]

    with pytest.raises(RuntimeError, match="the third env fails"):
        bench.MultiAgentHandLoop(env_fn, 3, 8, 0)
    assert [env.closed for env in built] == [True, True]  # left open before


def test_a_failing_child_request_names_the_system_and_the_child_goes_on():
    with Child("test", jax_defaults=True) as child:
        spec = {"system": "hand", "backend": "sync", "env": "NoSuchEnv-v0", "num_envs": 1}
        with pytest.raises(ChildError, match=r"build hand: .*NoSuchEnv") as info:
            child.request(
                "build", name="hand", spec={**spec, "rollout_length": 8, "reference": "sync"}
            )
        assert isinstance(info.value, RuntimeError)
        # The peer libraries' loops are benchmarks/'s: this child says where they are built.
        peer = {**spec, "env": "CartPole-v1", "rollout_length": 8, "reference": "puffer_mp"}
        with pytest.raises(ChildError, match=r"'puffer_mp'.*benchmarks/peer_child\.py"):
            child.request("build", name="hand_puffer_mp", spec=peer)
        assert child.request("info")["cpu_dispatch"] == "async"


def test_the_peer_child_builds_the_benchs_systems_and_the_peer_libraries_loops(monkeypatch):
    """benchmarks/peer_child.py serves the bench child protocol: a system of `jaxrunner
    bench` is built and measured as in the bench's own child; a peer library's loop is
    built where the library is installed, and names the missing import where it is not."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # as the scripts import their siblings
    import peer_child

    spec = {"system": "hand", "backend": "sync", "env": "CartPole-v1", "num_envs": 2}
    spec["rollout_length"] = 8
    with peer_child.start(sys.executable) as child:
        child.request("build", name="hand", spec={**spec, "reference": "sync"})
        assert child.request("measure", name="hand", seconds=0.01)["steps_per_s"] > 0
        puffer = {**spec, "reference": "puffer_serial"}
        if importlib.util.find_spec("pufferlib") is None:
            with pytest.raises(ChildError, match=r"build hand_puffer_serial: .*pufferlib"):
                child.request("build", name="hand_puffer_serial", spec=puffer)
        else:
            child.request("build", name="hand_puffer_serial", spec=puffer)
            measured = child.request("measure", name="hand_puffer_serial", seconds=0.01)
            assert measured["steps_per_s"] > 0
        assert child.request("info")["cpu_dispatch"] == "async"


def test_hand_scan_and_jaxrunner_on_gymnax():
    pytest.importorskip("gymnax")
    rollout = bench.build_hand_scan(4, 8, 0)
    assert rollout() == 32
    from jaxrunner._src.bench.systems import Spec, build

    spec = Spec(system="jaxrunner", backend="jax", env="CartPole-v1", num_envs=4, rollout_length=8)
    system = build(spec)
    try:
        result = system.measure(0.01)
        assert result["steps_per_s"] > 0
    finally:
        system.close()
    jax.clear_caches()


def test_bench_on_the_process_backend_measures_the_sync_hand_loop_and_async_vector_env(
    capsys, monkeypatch, tmp_path
):
    """The figures' settings are `jaxrunner bench`'s own (benchmarks/core.py, which only
    changed its defaults, is gone): the process row's reference is the sync hand loop.
    Also the CLI's --json on this backend (once a test of its own in test_envs_process.py:
    one bench run serves both)."""
    # 16-step rollouts (the parent's T reaches every child): 1024 cost seconds of IPC.
    monkeypatch.setattr(rounds.timing, "rollout_length", lambda num_envs, steps: 16)
    out = tmp_path / "bench.json"
    options = ["--num-envs", "2", "--rounds", "1", "--seconds", "0.05", "--json"]
    assert cli.main(["bench", *options, "--backend", "process", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)  # stdout holds only the JSON
    assert json.loads(out.read_text()) == report
    assert report["config"]["backends"] == ["process"]
    (process,) = report["results"]
    assert (process["backend"], process["num_envs"]) == ("process", 2)
    assert process["errors"] == {} and process["systems"]["jaxrunner"]["median"] > 0
    # AsyncVectorEnv by hand is measured for information beside the reference.
    assert set(process["systems"]) == {"jaxrunner", "hand", "ceiling", "hand_async"}
    assert process["systems"]["hand"]["label"] == "hand loop: gymnasium SyncVectorEnv"
    assert process["layout"]["num_workers"] >= 1
    assert report["children"]["hand_loop"]["cpu_dispatch"] == "async"


def test_step_costs_times_every_part_of_the_runner_and_the_hand_loop(tmp_path):
    """It drives the runner's own compiled policy step, so it breaks when that moves."""
    out = tmp_path / "step_costs.json"
    _run("step_costs.py", "--num-envs", "2", "--rounds", "1", "--blocks", "1", "--out", str(out))
    (row,) = json.loads(out.read_text())["results"]
    parts = ["runner", "runner_policy", "runner_step_batch", "hand_loop", "hand_policy"]
    parts += ["gym_step", "warm_call"]
    assert row["num_envs"] == 2
    assert all(row[f"{part}_us_median"] > 0 for part in parts)


@pytest.mark.parametrize("env", [None, "mpe2:simple_spread_v3"])
def test_splits_times_the_default_one_and_two_splits_against_the_hand_loop(tmp_path, env):
    out = tmp_path / "splits.json"
    options = ["--widths", "2", "--rounds", "1", "--seconds", "0.01", "--out", str(out)]
    if env is not None:  # a PettingZoo env, against its hand loop
        pytest.importorskip("mpe2")
        options += ["--env", env, "--rollout-length", "4"]
    _run("splits.py", *options)
    (row,) = json.loads(out.read_text())["results"]
    assert row["num_splits"] == {"default": 1, "splits=1": 1, "splits=2": 2}  # CPU, inline
    assert set(row["rounds"]) == {"default", "splits=1", "splits=2", "hand"}
    assert all(ratio > 0 for ratio in row["vs_hand"].values())


@pytest.mark.parametrize("env", ["CartPole-v1", "mpe2:simple_spread_v3"])
def test_main_process_share_compares_both_layouts_on_either_kind(tmp_path, env):
    if ":" in env:
        pytest.importorskip("mpe2")
    out = tmp_path / "share.json"
    options = ["--env", env, "--num-envs", "2", "--blocks", "2", "--rollout-length", "8"]
    _run("main_process_share.py", *options, "--block-steps", "32", "--out", str(out))
    (row,) = json.loads(out.read_text())["results"]
    assert (row["num_envs"], row["main_process_envs"]) == (2, 1)
    assert row["identical_trajectories"] is True  # where the envs step changes no bit
    assert len(row["rounds"]["default"]) == len(row["rounds"]["share"]) == 2
    assert row["share_over_default_median"] > 0


def test_auto_backend_compares_auto_with_the_best_of_sync_process_and_envpool(tmp_path):
    """Its EnvPool half runs in CI's extras venv (`-k envpool`)."""
    out = tmp_path / "auto_backend.json"
    options = ["--workloads", "cartpole", "--num-envs", "2", "--seconds", "0.05"]
    _run("auto_backend.py", *options, "--rounds", "2", "--out", str(out))
    report = json.loads(out.read_text())
    (row,) = report["results"]
    # EnvPool's backend beside them where it is installed (auto's trial tries it too).
    others = ("sync", "process", *(("envpool",) if importlib.util.find_spec("envpool") else ()))
    assert set(row["steps_per_s"]) == {"auto", *others} and not row["errors"]
    assert row["auto_choice"]["num_envs"] == 2
    if "envpool" not in others:  # 2 CartPole envs: workers cost more than they bring
        assert row["auto_choice"]["backend"] == "sync"
    assert (row["auto_choice"]["tried_envpool"] is None) == ("envpool" not in others)
    assert row["layout"]["auto"]["backend"] == row["auto_choice"]["backend"]
    best = max(row["steps_per_s"][v]["median"] for v in others)
    ratio = row["auto_over_best"]
    assert ratio["median"] == pytest.approx(row["steps_per_s"]["auto"]["median"] / best)
    assert len(ratio["rounds"]) == 2 and len(row["loadavg_per_round"]) == 2
    assert set(row["build_s"]) == {"auto", *others}
    assert all(seconds > 0 for seconds in row["build_s"].values())
    assert report["machine"]["cpu_count"] and len(report["machine"]["loadavg_before"]) == 3


def test_peers_smoke_run_writes_json_and_plot(tmp_path):
    out = tmp_path / "peers.json"
    options = ["--widths", "2", "--rounds", "1", "--seconds", "0.05", "--no-rllib"]
    _run("peers.py", *options, "--kinds", "sync", "gymnasium", "--out", str(out))
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert [(row["backend"], row["num_envs"]) for row in report["results"]] == [
        ("sync", 2),
        ("gymnasium", 2),
    ]
    native = report["results"][1]
    assert native["systems"]["hand"]["label"] == "hand loop: gymnasium native vector env"
    for row in report["results"]:
        assert set(row["systems"]) == {"jaxrunner", "hand"}  # no ceiling in peers
        assert len(row["systems"]["hand"]["rounds"]) == 1
        assert row["ratios"]["hand"]["median"] > 0
    assert report["skipped"]["rllib"] == "off (--no-rllib)"
    assert report["children"]["hand_loop"]["JAX_CPU_ENABLE_ASYNC_DISPATCH"] == "true"
    assert report["verdict"].startswith("jaxrunner is ")
    assert "| sync | 2 |" in report["markdown_table"]


def test_ab_revision_isolated_runs_each_version_in_processes_of_its_own(tmp_path, monkeypatch):
    """``--isolate``: a child process per version and round (base first in the first
    round), whose samples compare as the two runners' of one process do."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCHMARKS).returncode != 0:
        pytest.skip("not a git checkout")
    out = tmp_path / "ab.json"
    options = ["--base", "HEAD", "--env", "null", "--num-envs", "2", "--blocks", "2"]
    options += ["--rollout-length", "8", "--isolate", "1", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "ab_revision.py"), *options],
        capture_output=True,
        text=True,
        timeout=300,
        env=SCRIPT_ENV,
    )
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(out.read_text())["results"]
    assert [r["base_first"] for r in row["rounds"]] == [True]
    speedups = [r["base_us_per_step_median"] / r["new_us_per_step_median"] for r in row["rounds"]]
    assert [r["speedup"] for r in row["rounds"]] == pytest.approx(speedups)
    assert row["speedup_median"] == pytest.approx(float(np.median(speedups)))
    assert row["identical_trajectories"] is True  # HEAD's code in both: the same seed's samples
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script's own imports
    spec = importlib.util.spec_from_file_location("ab_revision", BENCHMARKS / "ab_revision.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    sample = [np.arange(6.0).reshape(3, 2), np.zeros(3, np.bool_)]
    changed = [sample[0].copy(), sample[1]]
    assert ab.same_trajectories(changed, sample)
    changed[0][2, 1] = np.nextafter(5.0, 6.0)
    assert not ab.same_trajectories(changed, sample)


def test_ab_revision_against_head_finds_identical_trajectories(tmp_path):
    """HEAD against the working tree: in a clean checkout the same code, so the two
    runners must sample identical trajectories (the comparison itself is sound)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCHMARKS, capture_output=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "jaxrunner"],
        cwd=BENCHMARKS.parent,
        capture_output=True,
        text=True,
    ).stdout
    out = tmp_path / "ab.json"
    options = ["--base", "HEAD", "--num-envs", "3", "--blocks", "2", "--rollout-length", "8"]
    options += ["--workload", "cartpole", "--split"]  # a workload's env and policy, per package
    options += ["--repeats", "2", "--opcodes"]  # two runs, each in a fresh process
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "ab_revision.py"), *options, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=SCRIPT_ENV,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    commit = head.stdout.decode().strip()
    assert report["config"]["base_commit"] == commit  # "HEAD" resolved, as recorded
    assert report["config"]["workload"] == "cartpole"
    assert report["config"]["new"] == commit + (" with uncommitted changes" if dirty else "")
    (row,) = report["results"]
    runs = row["runs"]
    assert row["num_envs"] == 3 and len(runs) == 2
    for key in ("base_us_per_step_median", "new_us_per_step_median", "speedup_median"):
        assert row[key] == pytest.approx(float(np.median([run[key] for run in runs])))
        assert all(run[key] > 0 for run in runs)
    assert row["identical_trajectories"] == all(run["identical_trajectories"] for run in runs)
    # The second run built the working tree's runner first; each order's speed-up is
    # reported, and their geometric mean.
    assert [run["built_first"] for run in runs] == ["base", "new"]
    orders = [row[f"speedup_{first}_built_first"] for first in ("base", "new")]
    assert orders == [run["speedup_median"] for run in runs]
    assert row["speedup_both_orders"] == pytest.approx(np.sqrt(orders[0] * orders[1]))
    for run, name in itertools.product(runs, ("base", "new")):  # each phase, per step
        split = run[f"{name}_split_us_per_step"]
        assert set(split) == {"env_wait", "inference", "obs_processing", "action_processing"}
        assert 0 < sum(split.values()) < run[f"{name}_us_per_step_median"] * 2
    counts = row["opcodes_per_step"]  # each version's, counted in the same states
    assert counts == runs[0]["opcodes_per_step"] == runs[1]["opcodes_per_step"]
    assert counts["new"]["own"] > 0 and counts["new"]["other"] > 0
    if not dirty:  # uncommitted changes to the package may change the samples
        assert row["identical_trajectories"] is True
        assert counts["base"] == counts["new"]  # the same code: the same opcodes
        assert all(base == new for _, base, new in counts["changes"])


def test_runner_build_times_each_package_in_its_own_processes(tmp_path):
    """HEAD against the working tree, one round: each package's first build and
    rebuild are timed in children of its own, the base's children load the base."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCHMARKS, capture_output=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    out = tmp_path / "build.json"
    options = ["--base", "HEAD", "--rounds", "1", "--rebuilds", "1", "--num-envs", "2"]
    _run("runner_build.py", *options, "--out", str(out))
    (row,) = json.loads(out.read_text())["results"]
    assert row["base_commit"] == head.stdout.decode().strip()
    assert [r["package"] for r in row["rounds"]["base"]] == ["jaxrunner_base"]
    assert [r["package"] for r in row["rounds"]["new"]] == ["jaxrunner"]
    for key in ("first_s", "rebuild_s"):
        assert row[f"base_{key}"] > 0 and row[f"new_{key}"] > 0


def test_rllib_multi_agent_jaxrunner_half_writes_its_rows(tmp_path):
    """The RLlib comparison without RLlib (it lives in its own venv): jaxrunner, the
    hand loop and the bare env floor on simple_spread, agent steps at 3 per env step,
    RLlib recorded as left out."""
    pytest.importorskip("mpe2")
    out = tmp_path / "rllib.json"
    _run("rllib_multi_agent.py", "--quick", "--no-rllib", "--out", str(out))
    report = json.loads(out.read_text())
    [row] = report["results"]
    assert (row["backend"], row["num_envs"], row["rollout_length"]) == ("sync", 8, 16)
    assert set(row["systems"]) == {"jaxrunner", "hand", "floor"}
    for system in row["systems"].values():
        assert len(system["rounds"]) == 2
        assert system["agent_steps_per_s"] == pytest.approx(3 * system["median"])
        for measured in system["all_rounds"]:  # its process's CPU: at most every core's
            assert 0 < measured["cpu_s"] <= os.cpu_count() * measured["wall_s"]
    per_cpu = {k: s["env_steps_per_cpu_s"] for k, s in row["systems"].items()}
    assert row["ratios_per_cpu_s"] == {
        "hand": pytest.approx(per_cpu["jaxrunner"] / per_cpu["hand"]),
        "floor": pytest.approx(per_cpu["jaxrunner"] / per_cpu["floor"]),
    }
    assert "rllib" not in row["ratios"]
    assert report["skipped"] == {"rllib": "off (--no-rllib)"}
    assert report["verdict"] == "no verdict: RLlib was not measured"
    machine = report["machine"]
    assert machine["mpe2"] and machine["pettingzoo"] and machine["cpu_model"]
    assert len(report["loadavg_before"]) == len(report["loadavg_after"]) == 3


@pytest.mark.parametrize(
    "mode", [["--num-threads", "1"], ["--async-mode", "--bound", "--per-recv", "--lean"]]
)
def test_envpool_reset_steps_times_both_modes_and_the_hand_loop(tmp_path, mode):
    pytest.importorskip("envpool")
    out = tmp_path / "envpool_reset_steps.json"
    options = ["--num-envs", "4", "--rollout-length", "8", "--rounds", "2", "--out", str(out)]
    _run("envpool_reset_steps.py", *options, *mode)
    report = json.loads(out.read_text())
    threads = {"num_threads": 1} if "--num-threads" in mode else {}
    assert report["envpool_kwargs"] == threads  # every pool's (CartPole has no others)
    (row,) = report["results"]
    assert row["num_envs"] == 4
    extra = {"per_recv", "lean"} if "--per-recv" in mode else set()
    systems = {"default", "same_step", "hand"} | extra
    assert set(row["median_steps_per_s"]) == systems
    if "--per-recv" in mode:
        med = row["median_steps_per_s"]
        assert row["ratios"]["per_recv/default"] == pytest.approx(med["per_recv"] / med["default"])
        assert row["ratios"]["lean/hand"] == pytest.approx(med["lean"] / med["hand"])
    assert all(len(rates) == 2 and min(rates) > 0 for rates in row["rounds"].values())
    if "--bound" not in mode:
        assert "bound" not in row
        return
    parts, cores = row["bound"]["parts"], row["bound"]["cpu_count"]
    per_step = parts["env"]["cpu_us_per_step"] + parts["policy"]["cpu_us_per_step"]
    assert row["bound"]["bound_steps_per_s"] == pytest.approx(1e6 * cores / per_step)
    for name in systems:  # each system's CPU, and its share of the bound
        assert 0 < row["cpu"][name]["cores"] <= cores + 0.5  # (rusage ticks: a little over)
        assert row["cpu"][name]["cpu_us_per_step"] > 0
        share = row["median_steps_per_s"][name] / row["bound"]["bound_steps_per_s"]
        assert row["share_of_bound"][name] == pytest.approx(share)


def test_envpool_lean_bound_records_what_the_runner_records(monkeypatch):
    """The ``--lean`` bound does a runner's work, not less: each env's slots it filled
    hold the async runner's observations, actions, log-probs and valid flags for the same
    seed (its rewards are staged per recv, one slot later), across episode ends."""
    pytest.importorskip("envpool")
    import jaxrunner as jr
    from jaxrunner._src.bench.workloads import WORKLOADS

    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script's own imports
    path = BENCHMARKS / "envpool_reset_steps.py"
    spec = importlib.util.spec_from_file_location("envpool_reset_steps", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    work, length = WORKLOADS["cartpole"], 32
    lean = script._LeanLoop(work, 8, length)
    assert 0 < lean.rollout() <= 2 * length * 4
    envs = jr.make_vec(work.envpool_id, 8, backend="envpool", batch_size=4)
    policy = work.policy(envs.single_observation_space, envs.single_action_space)
    params = policy.init(jax.random.key(script.SEED), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, length, seed=script.SEED, chunk_rows=4) as runner:
        traj = runner.sample()
    obs, action, log_prob, reward, _, _, invalid = lean.traj
    assert invalid.any()  # episodes ended: reset slots compared too
    assert lean.counts.sum() == 2 * length * 4 and lean.counts.min() > length // 2
    for env, count in enumerate(lean.counts):
        n = min(int(count), length)
        np.testing.assert_array_equal(obs[:n, env], traj.obs[:n, env])
        np.testing.assert_array_equal(action[:n, env], traj.action[:n, env])
        np.testing.assert_array_equal(log_prob[:n, env], traj.extras["log_prob"][:n, env])
        np.testing.assert_array_equal(~invalid[:n, env], traj.valid[:n, env])
        np.testing.assert_array_equal(reward[1:n, env], traj.reward[: n - 1, env])


def test_bench_counts_envpool_transitions_not_its_reset_slots():
    """``jaxrunner bench`` on the "envpool" backend counts what the hand loop counts:
    real transitions, not the reset slots its default records (valid False)."""
    pytest.importorskip("envpool")
    from jaxrunner._src.bench.systems import Spec, build

    spec = Spec(system="jaxrunner", backend="envpool", env="CartPole-v1", num_envs=4,
                rollout_length=64)  # fmt: skip
    system = build(spec)
    try:
        runner = system._runner
        before = runner.get_metrics()["num_env_steps"]
        counted = system._sample()
        assert counted == runner.get_metrics()["num_env_steps"] - before < 4 * 64
    finally:
        system.close()


def test_envpool_step_overhead_times_each_part(tmp_path):
    pytest.importorskip("envpool")
    out = tmp_path / "envpool_step_overhead.json"
    options = ["--num-envs", "4", "--rounds", "2", "--calls", "20", "--gaps", "0", "50"]
    _run("envpool_step_overhead.py", *options, "--out", str(out))
    (row,) = json.loads(out.read_text())["results"]
    parts = {
        "envpool_step",
        "envpool_calls",
        "envpool_step_then_10us",
        "adapter_work",
        "step_batch",
        *(f"{call}_after_{gap}us" for call in ("send", "recv") for gap in (0, 50)),
    }
    assert row["num_envs"] == 4 and set(row["median_us"]) == parts
    assert all(len(us) == 2 for us in row["rounds_us"].values())
    assert row["median_us"]["step_batch"] > 0 and row["median_us"]["adapter_work"] > 0


def test_trial_time_builds_from_env_with_and_without_the_drop(tmp_path):
    out = tmp_path / "trial_time.json"
    _run("trial_time.py", "--cases", "cartpole:16", "--rounds", "1", "--out", str(out))
    (row,) = json.loads(out.read_text())["results"]
    assert row["case"] == "cartpole:16" and row["drop_over_no_drop"] > 0
    assert set(row["build_s"]) == set(row["kept"]) == {"drop", "no_drop"}
    assert all(len(s) == 1 and s[0] > 0 for s in row["build_s"].values())
    assert all(len(k) == 1 and k[0] for k in row["kept"].values())


def test_envpool_modes_times_each_mode_against_both_hand_loops(tmp_path):
    pytest.importorskip("envpool")
    out = tmp_path / "envpool_modes.json"
    _run("envpool_modes.py", "--num-envs", "4", "--rounds", "2", "--seconds", "0.05",
         "--out", str(out))  # fmt: skip
    (row,) = json.loads(out.read_text())["results"]
    names = {"hand_sync", "hand_async", "sync", "sync_one_thread", "async", "async_fewer_threads"}
    names |= {"two_pools", "two_pools_one_thread"}
    assert row["num_envs"] == 4 and set(row["steps_per_s"]) == set(row["over_best_hand"]) == names
    assert all(len(s["rounds"]) == 2 and s["median"] > 0 for s in row["steps_per_s"].values())
    assert row["async_fewer_threads_options"]["batch_size"] == 2
    assert (
        0 < row["over_best_hand"]["hand_sync"] <= 1 and 0 < row["over_best_hand"]["hand_async"] <= 1
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a layout needs 2 CPUs")
def test_envpool_thread_layouts_place_each_thread_where_the_layout_says(tmp_path):
    pytest.importorskip("envpool")
    out = tmp_path / "thread_layouts.json"
    _run("thread_layouts.py", "--workload", "cartpole", "--widths", "4", "--rounds", "2",
         "--seconds", "0.05", "--work-us", "20", "--out", str(out))  # fmt: skip
    (row,) = json.loads(out.read_text())["results"]
    layouts = {"free", "pinned", "split"}
    names = {"hand_sync", "hand_async", *layouts, *(f"{name}+work" for name in layouts)}
    names |= {"jaxrunner", "jaxrunner_pinned"}
    assert row["num_envs"] == 4 and set(row["median_steps_per_s"]) == names
    assert all(len(r) == 2 and min(r) > 0 for r in row["rounds"].values())
    med = row["median_steps_per_s"]
    best = row["best_hand"]
    assert med[best] == max(med["hand_sync"], med["hand_async"])
    assert row["ratio_to_best_hand"]["free"] == pytest.approx(med["free"] / med[best])
    cpus = sorted(os.sched_getaffinity(0))
    policy, envpool = cpus[:1], cpus[1:]
    placed = row["placement"]
    assert placed["free"]["loop_cpus"] == cpus and placed["free"]["thread_cpus"] == [cpus]
    assert placed["jaxrunner"]["loop_cpus"] == cpus
    for name in ("pinned", "pinned+work", "split", "split+work", "jaxrunner_pinned"):
        # The loop with JAX's threads (pinned) or beside EnvPool's (split); every thread
        # on the policy's CPU or, EnvPool's own, on the others.
        loop = placed[name]["loop_cpus"]
        assert loop == (envpool if name.startswith("split") else policy)
        sets = placed[name]["thread_cpus"]
        assert policy in sets and all(c == policy or set(c) <= set(envpool) for c in sets)
        assert any(set(c) <= set(envpool) for c in sets)


def test_peers_workload_times_jaxrunners_envpool_backend_against_envpool_by_hand(tmp_path):
    """Where EnvPool imports beside jaxrunner, a workload run has an ``envpool`` row:
    jaxrunner's EnvPool backend, EnvPool by hand in sync mode and (from the peers'
    venv, here this one) in async mode."""
    pytest.importorskip("envpool")
    out = tmp_path / "peers_workload.json"
    options = ["--workload", "cartpole", "--widths", "2", "--rounds", "1", "--seconds", "0.05"]
    _run("peers.py", *options, "--no-rllib", "--peers-python", sys.executable, "--out", str(out))
    report = json.loads(out.read_text())
    assert [row["backend"] for row in report["results"]] == ["sync", "process", "envpool"]
    envpool = report["results"][2]
    systems = {"jaxrunner", "jaxrunner_async", "jaxrunner_auto", "hand", "hand_envpool_async"}
    assert systems <= set(envpool["systems"])
    assert envpool["systems"]["jaxrunner_auto"]["label"].startswith("jaxrunner, EnvRunner.from_env")
    assert envpool["systems"]["hand"]["label"] == "hand loop: EnvPool, sync mode"
    assert envpool["systems"]["jaxrunner_async"]["label"].startswith("jaxrunner, EnvPool async")
    assert "envpool row" not in report["skipped"]


def test_envpool_spec_env_kwargs_reach_make_vec():
    """The envpool row's async variant is ``make_vec(..., batch_size=k)``: EnvPool's
    async mode."""
    pytest.importorskip("envpool")
    from jaxrunner._src.backends.envpool_async import EnvPoolAsyncVectorEnv
    from jaxrunner._src.bench.systems import Spec, build

    spec = Spec(system="jaxrunner", backend="envpool", env="CartPole-v1", num_envs=4,
                rollout_length=8, env_kwargs={"batch_size": 2})  # fmt: skip
    system = build(spec)
    try:
        assert isinstance(system._runner.envs, EnvPoolAsyncVectorEnv)
        assert system.measure(0.05)["steps_per_s"] > 0
    finally:
        system.close()


def test_sample_overhead_splits_step_and_sample_costs(tmp_path):
    out = tmp_path / "sample_overhead.json"
    options = ["--num-envs", "1", "--short", "8", "--long", "16", "--rounds", "1"]
    _run("sample_overhead.py", *options, "--out", str(out))
    (row,) = json.loads(out.read_text())["results"]
    assert row["num_envs"] == 1 and set(row["us_per_step_median"]) == {"8", "16"}
    assert all(us > 0 for us in row["us_per_step_median"].values())


def test_trajectory_memory_times_short_samples_outside_tracemalloc(tmp_path):
    out = tmp_path / "memory.json"
    options = ["--workload", "cartpole", "--num-envs", "2", "--rollout-length", "1"]
    _run(
        "trajectory_memory.py", *options, "--rounds", "1", "--timed-samples", "3", "--out", str(out)
    )
    report = json.loads(out.read_text())
    assert report["command"].endswith("--timed-samples 3")
    assert set(report["medians"]) == {"dense", "compact", "dense+release", "compact+release"}
    for m in report["medians"].values():
        assert m["seconds"] > 0 and m["steps_per_s"] == pytest.approx(2 / m["seconds"])
    # A released sample's buffers are the next one's: it allocates less than a new one.
    assert report["vs_dense"]["dense+release"]["peak_new_bytes"] < 1


def test_chunk_sizes_times_the_plain_call_and_each_chunk(tmp_path):
    out = tmp_path / "chunk_sizes.json"
    options = ["--policy", "mlp", "--rows", "8", "--chunks", "4", "8", "--blocks", "1"]
    _run("chunk_sizes.py", *options, "--calls", "1", "--out", str(out))
    (row,) = json.loads(out.read_text())["results"]
    assert row["rows"] == 8 and row["flops_per_row"] > 0
    assert row["plain_ms"] > 0 and set(row["chunked_ms"]) == {"4", "8"}
    assert all(ms > 0 for ms in row["chunked_ms"].values())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_suite_cpu_counts_each_kind_of_process_and_jax_compiles(tmp_path):
    # A child that burns 1 s of CPU: read twice a second, it loses at most 0.5 s of it.
    child = tmp_path / "child.py"
    child.write_text(
        "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end:\n    pass\n"
    )
    (tmp_path / "test_tiny.py").write_text(
        "import subprocess, sys\nimport jax\n\n\ndef test_tiny():\n"
        "    assert int(jax.jit(lambda x: x + 1)(1)) == 2\n"
        f"    subprocess.run([sys.executable, {str(child)!r}], check=True)\n"
    )
    out = tmp_path / "suite.json"
    _run(
        "suite_cpu.py", "--out", str(out), "--", "-n", "0", "-p", "no:cacheprovider", str(tmp_path)
    )
    report = json.loads(out.read_text())
    assert report["pytest_exit_code"] == 0
    assert report["kinds"]["other: child.py"]["cpu_s"] >= 0.5
    assert report["kinds"]["pytest"]["cpu_s"] > 0
    assert report["cpu_s"] == pytest.approx(sum(k["cpu_s"] for k in report["kinds"].values()))
    events = report["test_processes_jax_s"]
    assert events["cpu_s"] > 0 and events["/jax/core/compile/jaxpr_trace_duration"] > 0
    (test,) = report["slowest_tests_jax_compile_s"]  # the one test, which compiled
    assert test.endswith("test_tiny.py::test_tiny") and report["tests_jax_compile_s"]["tests"] == 1

"""Smoke tests of the benchmarks the README's figures come from: they run end to end
and report what their docstrings promise. Tiny settings; nothing timed is asserted
(speed is for the benchmarks themselves, on a quiet machine)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).parent.parent / "benchmarks"
CORE = BENCHMARKS / "core.py"
SYSTEMS = ("jaxrunner", "raw", "bare_loop", "hand_loop", "gym_raw", "hand_loop_jax_defaults")


def test_core_benchmark_reports_every_system_ratio_and_the_in_loop_costs(tmp_path):
    out = tmp_path / "core.json"
    options = ["--seconds", "0.05", "--rounds", "1", "--num-envs", "2", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(CORE), *options],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["machine"]["jax_cpu_dispatch"] == "inline"
    (row,) = report["results"]
    assert row["num_envs"] == 2
    for system in SYSTEMS:
        assert row[f"{system}_steps_per_s"] > 0
        assert len(row[f"{system}_all_rounds"]) == 1
    for system in SYSTEMS[1:]:
        expected = row["jaxrunner_steps_per_s"] / row[f"{system}_steps_per_s"]
        assert row[f"ratio_vs_{system}"] == expected
    costs = row["jaxrunner_us_per_step"]
    phases = {"env_wait_us", "inference_us", "obs_processing_us", "action_processing_us"}
    assert set(costs) == phases
    assert all(value > 0 for value in costs.values())
    raw_us = 1e6 * 2 / row["raw_steps_per_s"]
    assert row["policy_bound_vs_raw"] == raw_us / (raw_us + costs["inference_us"])


def test_ab_revision_against_head_finds_identical_trajectories(tmp_path):
    """HEAD against the working tree: in a clean checkout the same code, so the two
    runners must sample identical trajectories (the comparison itself is sound)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCHMARKS, capture_output=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "jaxrunner"],
        cwd=BENCHMARKS,
        capture_output=True,
        text=True,
    ).stdout
    out = tmp_path / "ab.json"
    options = ["--base", "HEAD", "--num-envs", "3", "--blocks", "2", "--rollout-length", "8"]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "ab_revision.py"), *options, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(out.read_text())["results"]
    assert row["num_envs"] == 3
    assert row["base_us_per_step_median"] > 0 and row["new_us_per_step_median"] > 0
    assert row["speedup_median"] > 0
    if not dirty:  # uncommitted changes to the package may change the samples
        assert row["identical_trajectories"] is True

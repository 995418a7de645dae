"""benchmarks/core.py, the benchmark of record for the sync backend, runs end to end and
reports what its docstring promises. A smoke test: tiny settings, nothing timed is
asserted (speed is for the benchmark itself, on a quiet machine)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

CORE = pathlib.Path(__file__).parent.parent / "benchmarks" / "core.py"
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

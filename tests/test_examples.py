"""The CleanRL-style examples (``examples/``), each run as a script with tiny settings;
skipped without EnvPool (and optax), which .ci/run installs in its second venv."""

from __future__ import annotations

import importlib.util
import math
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("envpool")
pytest.importorskip("optax")

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = ("--total-timesteps", "64", "--num-envs", "2", "--num-steps", "16")


def _script(script: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """Runs ``examples/<script>`` with this checkout's jaxrunner, whatever the venv has."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *flags],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": path},
    )


def _run(script: str, *flags: str) -> list[dict[str, float]]:
    """Runs a script to its end; returns its per-iteration lines as ``{name: value}``."""
    done = _script(script, *flags)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("global_step=")]
    return [
        {name: float(value) for name, value in re.findall(r"(\w+)=(\S+)", line)} for line in lines
    ]


def _check_trained(rows: list[dict[str, float]]) -> None:
    # 64 steps of 2 envs x 16 steps: two iterations, each counted in env steps.
    assert [row["global_step"] for row in rows] == [32, 64]
    for row in rows:
        for name in ("value_loss", "policy_loss", "entropy", "approx_kl", "clipfrac"):
            assert math.isfinite(row[name]), (name, row)
    # The update moved the policy away from the one that sampled.
    assert all(row["approx_kl"] > 0 for row in rows), rows


def test_ppo_atari_runs_and_updates() -> None:
    _check_trained(_run("ppo_atari.py", *TINY))


def test_ppo_continuous_runs_and_updates() -> None:
    # Two minibatches of 16 (CleanRL's 32 would leave one transition each, whose
    # normalised advantage is 0).
    _check_trained(_run("ppo_continuous.py", *TINY, "--num-minibatches", "2"))


def test_too_few_timesteps_for_one_iteration_is_refused() -> None:
    done = _script("ppo_continuous.py", "--total-timesteps", "8")
    assert done.returncode == 2  # argparse's usage error, before anything is built
    assert "--total-timesteps 8 must be at least --num-envs x --num-steps = 2048" in done.stderr


def test_game_stats_sums_every_life_and_restarts_at_game_over_or_time_limit() -> None:
    """ppo_atari's game returns: the unclipped info rewards summed over lives (life
    losses are no game end), a game ending at EnvPool's game over or a truncation."""
    spec = importlib.util.spec_from_file_location("ppo_atari", ROOT / "examples" / "ppo_atari.py")
    ppo_atari = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ppo_atari)
    games = ppo_atari.GameStats(num_envs=2)
    reward = np.array([[3.0, 1.0], [0.0, -2.0], [5.0, 4.0]])  # [T, B], unclipped
    game_over = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    truncated = np.zeros((3, 2), bool)
    valid = np.ones((3, 2), bool)
    assert games.update({"reward": reward, "terminated": game_over}, truncated, valid) == [
        (-1.0, 2),  # env 1: 1 - 2, over at its second step
        (8.0, 3),  # env 0: 3 + 0 + 5
    ]
    # Env 1's next game goes on across samples until cut by the time limit; its first
    # slot is EnvPool's reset step (invalid: no step of the game, whatever its info).
    truncated = np.array([[False, False], [False, True]])
    valid = np.array([[True, False], [True, True]])
    infos = {"reward": np.array([[1.0, 9.0], [1.0, 7.0]]), "terminated": np.ones((2, 2))}
    infos["terminated"][:, 0] = 0
    assert games.update(infos, truncated, valid) == [(11.0, 2)]  # 4 + 7: the 9 ignored
    assert list(games.returns) == [2.0, 0.0] and list(games.lengths) == [2, 0]

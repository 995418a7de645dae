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

import gymnasium
import numpy as np
import pytest
from gymnasium.wrappers import NormalizeObservation, NormalizeReward

import jaxrunner as jr

pytest.importorskip("envpool")
pytest.importorskip("optax")

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = ("--total-timesteps", "64", "--num-envs", "2", "--num-steps", "16")


def _script(script: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """Runs ``examples/<script>`` (or ``<dir>/<script>``) with this checkout's jaxrunner,
    whatever the venv has."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(ROOT / ("" if "/" in script else "examples") / script), *flags],
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


def test_ppo_continuous_hand_twin_runs_and_updates() -> None:
    # The example's hand-loop twin, whose learning is compared to the example's.
    _check_trained(_run("benchmarks/ppo_continuous_hand.py", *TINY, "--num-minibatches", "2"))


def _load(path: str):
    spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hand_twin_wrappers_match_gymnasiums_on_envpools_reset_steps() -> None:
    """The twin's CleanRL wrappers by hand against gymnasium's NormalizeObservation and
    NormalizeReward (CleanRL clips both to +-10) on two CartPole envs stepped by hand,
    across terminations and truncations, each done env reset a step later as EnvPool's
    reset step (its observation taken in, no reward)."""
    hand = _load("benchmarks/ppo_continuous_hand.py")

    limits = (10, 500)  # env 0 is mostly truncated, env 1 terminated

    def make(i):
        return gymnasium.make("CartPole-v1", max_episode_steps=limits[i])

    refs = [NormalizeReward(NormalizeObservation(make(i)), gamma=0.9) for i in range(2)]
    raws = [make(i) for i in range(2)]
    wrappers = hand.CleanRLWrappers(2, (4,), 0.9)
    first = [np.clip(ref.reset(seed=i)[0], -10, 10) for i, ref in enumerate(refs)]
    raw = np.stack([env.reset(seed=i)[0] for i, env in enumerate(raws)])
    np.testing.assert_allclose(wrappers.observation(raw), first, rtol=1e-5, atol=1e-6)
    rng = np.random.default_rng(0)
    after_done, ends = np.zeros(2, bool), {"term": 0, "trunc": 0}
    for _ in range(100):
        want_obs, want_reward = np.zeros((2, 4)), np.zeros(2)
        raw, raw_reward, term, trunc = (
            np.zeros((2, 4)),
            np.zeros(2),
            np.zeros(2, bool),
            np.zeros(2, bool),
        )
        for i, (ref, env) in enumerate(zip(refs, raws)):
            if after_done[i]:
                want_obs[i], raw[i] = ref.reset()[0], env.reset()[0]
                continue
            action = int(rng.integers(2))
            want_obs[i], want_reward[i], *_ = ref.step(action)
            raw[i], raw_reward[i], term[i], trunc[i], _ = env.step(action)
        valid = ~after_done
        reward = wrappers.reward(raw_reward, term, valid)
        np.testing.assert_allclose(reward, np.where(valid, np.clip(want_reward, -10, 10), 0.0))
        obs = wrappers.observation(raw)
        np.testing.assert_allclose(obs, np.clip(want_obs, -10, 10), rtol=1e-5, atol=1e-6)
        ends["term"] += int(np.sum(term & ~trunc))
        ends["trunc"] += int(np.sum(trunc))
        after_done = term | trunc
    assert ends["term"] >= 2 and ends["trunc"] >= 2, ends


def test_hand_twin_gae_equals_jaxrunners() -> None:
    """The twin's GAE (CleanRL's reverse loop, V(next obs) from the next slot) equals
    ``jr.gae`` on EnvPool's layout: a reset slot (no transition) after each episode end."""
    hand = _load("benchmarks/ppo_continuous_hand.py")
    rng = np.random.default_rng(0)
    T, B = 12, 3
    terminated, truncated = np.zeros((T, B), bool), np.zeros((T, B), bool)
    terminated[3, 0] = terminated[5, 2] = truncated[7, 1] = truncated[T - 1, 2] = True
    done = terminated | truncated
    valid = np.ones((T, B), bool)
    valid[1:] = ~done[:-1]
    reward = np.where(valid, rng.normal(size=(T, B)), 0.0).astype(np.float32)
    value = rng.normal(size=(T, B)).astype(np.float32)
    next_value = np.concatenate([value[1:], rng.normal(size=(1, B)).astype(np.float32)])
    flags = terminated.astype(np.float32), done.astype(np.float32)
    advantages, returns = hand.gae(reward, value, next_value, *flags, valid, 0.99, 0.95)
    want = jr.gae(
        next_value=next_value, value=value, reward=reward, terminated=terminated,
        truncated=truncated, valid=valid, gamma=0.99, lam=0.95,
    )  # fmt: skip
    np.testing.assert_allclose(advantages, want.advantages, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(returns, want.returns, rtol=1e-5, atol=1e-6)


def test_too_few_timesteps_for_one_iteration_is_refused() -> None:
    done = _script("ppo_continuous.py", "--total-timesteps", "8")
    assert done.returncode == 2  # argparse's usage error, before anything is built
    assert "--total-timesteps 8 must be at least --num-envs x --num-steps = 2048" in done.stderr


def test_game_stats_sums_every_life_and_restarts_at_game_over_or_time_limit() -> None:
    """ppo_atari's game returns: the unclipped info rewards summed over lives (life
    losses are no game end), a game ending at EnvPool's game over or a truncation."""
    ppo_atari = _load("examples/ppo_atari.py")
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

"""backend="envpool" gives EnvPool's own episodes in every mode (skipped without EnvPool).

With ``episodic_life=True`` (CleanRL's Atari setting) EnvPool ends an episode at each
lost life and its reset step goes on with the same game; an explicit
``reset(env_id=...)`` would start a new game instead. Each mode's episodes, returns
and lengths, and the infos recorded (``info_keys``), are checked against EnvPool
stepped by hand with the same actions.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing

import jax
import numpy as np
import pytest

import jaxrunner as jr

envpool = pytest.importorskip("envpool")

SEED = 3
NUM_ENVS = 2
TASK = "Breakout-v5"  # lives (Pong has none), and a lost life every ~25 random steps


def _hand_loop(actions: list[np.ndarray], **kwargs: object) -> list[np.ndarray]:
    """EnvPool by hand with its own NEXT_STEP autoreset: each env takes its own real
    actions in order (its reset steps, whose action EnvPool ignores, in between);
    returns each env's real transitions as ``[k, 4]`` rows (reward, terminated,
    truncated, ``info["lives"]``)."""
    seeds = jr.env_seeds(SEED, NUM_ENVS)
    pool = envpool.make_gymnasium(TASK, num_envs=NUM_ENVS, env_seed=seeds, **kwargs)
    rows: list[list[tuple]] = [[] for _ in range(NUM_ENVS)]
    with closing(pool):
        pool.reset()
        pending = np.zeros(NUM_ENVS, bool)
        while any(len(r) < len(a) for r, a in zip(rows, actions)):
            step = [a[min(len(r), len(a) - 1)] for r, a in zip(rows, actions)]
            _, reward, terminated, truncated, info = pool.step(np.array(step, np.int32))
            for i in range(NUM_ENVS):
                if pending[i]:  # EnvPool's reset step: no transition
                    assert reward[i] == 0 and not terminated[i] and not truncated[i]
                elif len(rows[i]) < len(actions[i]):
                    rows[i].append((reward[i], terminated[i], truncated[i], info["lives"][i]))
            pending = (terminated | truncated) & ~pending
    return [np.array(r, np.float64) for r in rows]


def _episodes(rows: np.ndarray) -> list[tuple[float, int]]:
    """(return, length) of each episode that ends within one env's transitions."""
    ends = np.flatnonzero(rows[:, 1] + rows[:, 2])
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [(float(rows[s : e + 1, 0].sum()), int(e - s + 1)) for s, e in zip(starts, ends)]


@pytest.mark.parametrize("episodic_life", [True, False])
@pytest.mark.parametrize(
    "mode",
    [
        {},
        {"keep_reset_steps": False},
        {"batch_size": 1},
        {"batch_size": 1, "keep_reset_steps": False},
    ],
    ids=["sync", "same_step", "async", "async-same_step"],
)
def test_episodes_are_envpools_own(mlp: Callable, mode: dict, episodic_life: bool) -> None:
    """The runner's transitions per env, and so its episodes (returns, lengths), are
    those of EnvPool's own autoreset for the same actions: with ``episodic_life`` a
    lost life ends an episode and the game goes on (fewer lives, the score kept). The
    infos are EnvPool's too, in async mode as well (it recorded none)."""
    kwargs = {"episodic_life": episodic_life, "max_episode_steps": 80}
    envs = jr.make_vec(TASK, NUM_ENVS, backend="envpool", **mode, **kwargs)
    policy = mlp(envs.single_action_space)
    params = policy.init(jax.random.key(1), envs.single_observation_space)
    with jr.EnvRunner(
        envs, policy, params, rollout_length=60, seed=SEED, info_keys=("lives",)
    ) as runner:
        traj = jr.concatenate([runner.sample() for _ in range(3)])
        metrics = runner.get_metrics()
    valid = np.asarray(traj.valid)
    assert traj.extras["infos_present"]["lives"][valid].all()
    lives = traj.extras["infos"]["lives"]
    got = [
        np.stack([traj.reward[:, i], traj.terminated[:, i], traj.truncated[:, i], lives[:, i]], 1)
        for i in range(NUM_ENVS)
    ]
    got = [rows[valid[:, i]] for i, rows in enumerate(got)]
    expected = _hand_loop([traj.action[valid[:, i], i] for i in range(NUM_ENVS)], **kwargs)
    for i in range(NUM_ENVS):
        np.testing.assert_array_equal(got[i], expected[i], f"env {i}")
    by_env = [
        [(float(e.reward.sum()), len(e.reward)) for e in traj.split_episodes() if e.env_id == i]
        for i in range(NUM_ENVS)
    ]
    for i in range(NUM_ENVS):
        assert by_env[i][: len(_episodes(expected[i]))] == _episodes(expected[i]), f"env {i}"
    ends = sum(len(_episodes(e)) for e in expected)
    assert ends >= 2 * NUM_ENVS and metrics["num_episodes"] == ends
    lengths = [length for e in expected for _, length in _episodes(e)]
    assert metrics["episode_length_mean"] == pytest.approx(np.mean(lengths))

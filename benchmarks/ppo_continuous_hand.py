"""The hand-loop twin of ``examples/ppo_continuous.py``: the example's network, optimizer,
hyperparameters, flags and PPO learner (imported from it), with the sampling written by
hand as a CleanRL user writes it: EnvPool stepped by hand, the jitted policy called per
step, numpy ``[T, B]`` buffers, CleanRL's gymnasium wrappers done by hand in numpy.

    python benchmarks/ppo_continuous_hand.py --env-id HalfCheetah-v4 --total-timesteps 1000000
"""

from __future__ import annotations

import sys
import time
from collections import deque
from pathlib import Path

import envpool
import gymnasium
import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import ppo_continuous as example

import jaxrunner as jr


class RunningMeanStd:
    """gymnasium's ``RunningMeanStd`` (count from 1e-4, variance 1), one per env, as
    each sub-env of CleanRL's vector env has its own wrappers: rows of ``x`` are envs."""

    def __init__(self, num_envs: int, shape: tuple[int, ...] = ()):
        self.mean = np.zeros((num_envs, *shape))
        self.var = np.ones((num_envs, *shape))
        self.count = np.full((num_envs, *(1,) * len(shape)), 1e-4)

    def update(self, x: np.ndarray, rows: np.ndarray) -> None:
        """One sample per env, for the envs in ``rows`` (a boolean mask)."""
        delta = x - self.mean
        total = self.count + 1
        mean = self.mean + delta / total
        var = (self.var * self.count + delta**2 * self.count / total) / total
        keep = rows.reshape(-1, *(1,) * (x.ndim - 1))
        self.mean, self.var = np.where(keep, mean, self.mean), np.where(keep, var, self.var)
        self.count = np.where(keep, total, self.count)


class CleanRLWrappers:
    """CleanRL's gymnasium wrappers of each sub-env, done by hand on ``[B]`` rows:
    ``NormalizeObservation`` then clip to +-10, ``NormalizeReward(gamma)`` then clip to
    +-10 (its discounted return carried over a truncation, as gymnasium's)."""

    def __init__(self, num_envs: int, obs_shape: tuple[int, ...], gamma: float):
        self.obs_rms = RunningMeanStd(num_envs, obs_shape)
        self.return_rms = RunningMeanStd(num_envs)
        self.discounted, self.gamma = np.zeros(num_envs), gamma

    def observation(self, obs: np.ndarray) -> np.ndarray:
        """Every observation an env returns (reset ones too) updates the statistics."""
        self.obs_rms.update(obs, np.ones(len(obs), bool))
        return np.clip((obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8), -10, 10)

    def reward(self, reward: np.ndarray, terminated: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """The scaled rewards of the envs stepped (``valid``); 0 elsewhere."""
        d = self.discounted * self.gamma * (1 - terminated) + reward
        self.discounted = np.where(valid, d, self.discounted)
        self.return_rms.update(self.discounted, valid)
        scaled = reward / np.sqrt(self.return_rms.var + 1e-8)
        return np.where(valid, np.clip(scaled, -10, 10), 0.0)


def gae(reward, value, next_value, terminated, done, valid, gamma, lam):
    """CleanRL's reverse loop, bootstrapping every step from ``V(next obs)`` (a
    truncation too, as the example's ``jr.gae``); 0 at the slots holding no transition."""
    advantages = np.zeros_like(reward)
    last = np.zeros_like(reward[0])
    for t in reversed(range(len(reward))):
        delta = reward[t] + gamma * next_value[t] * (1.0 - terminated[t]) - value[t]
        last = np.where(valid[t], delta + gamma * lam * (1.0 - done[t]) * last, 0.0)
        advantages[t] = last
    return advantages, np.where(valid, advantages + value, 0.0)


def main() -> None:
    args = example.parse_args()
    T, B = args.num_steps, args.num_envs
    envs = envpool.make_gymnasium(args.env_id, num_envs=B, seed=args.seed)
    space = envs.action_space
    obs_shape = envs.observation_space.shape
    policy = jr.Policy.from_linen(example.ActorCritic(int(np.prod(space.shape))), space)
    key, init_key = jax.random.split(jax.random.key(args.seed))
    params = policy.init(init_key, gymnasium.spaces.Box(-10, 10, obs_shape, np.float32))
    optimizer = example.make_optimizer(args)
    opt_state = optimizer.init(params)
    update = jax.jit(example.make_learner(policy, optimizer, args))

    @jax.jit
    def act(params, obs, key):
        key, step_key = jax.random.split(key)
        action, extras, _ = policy.apply_fn(params, obs, None, jax.random.split(step_key, B))
        return action, extras["log_prob"], extras["value"], key

    key, act_key = jax.random.split(key)
    wrappers = CleanRLWrappers(B, obs_shape, args.gamma)
    buf = {
        "obs": np.zeros((T, B, *obs_shape), np.float32),
        "action": np.zeros((T, B, *space.shape), np.float32),
        "log_prob": np.zeros((T, B), np.float32),
        "value": np.zeros((T, B), np.float32),
        "valid": np.zeros((T, B), bool),
    }
    reward, terminated, done = (np.zeros((T, B), np.float32) for _ in range(3))
    episode_return, episode_returns = np.zeros(B), deque(maxlen=10)
    num_episodes = global_step = 0
    obs = wrappers.observation(envs.reset()[0])
    after_done = np.zeros(B, bool)  # the next step is EnvPool's reset step: no transition
    start = time.perf_counter()
    for _ in range(args.num_iterations):
        for t in range(T):
            action, log_prob, value, act_key = act(params, obs, act_key)
            action = np.asarray(action)
            buf["obs"][t], buf["action"][t] = obs, action
            buf["log_prob"][t], buf["value"][t] = log_prob, value
            next_obs, r, term, trunc, _ = envs.step(np.clip(action, space.low, space.high))
            valid = ~after_done
            buf["valid"][t] = valid
            reward[t] = wrappers.reward(r, term, valid)
            terminated[t], done[t] = term, term | trunc
            episode_return += np.where(valid, r, 0.0)
            for i in np.flatnonzero(term | trunc):
                episode_returns.append(episode_return[i])
                episode_return[i] = 0.0
            num_episodes += int(np.sum(term | trunc))
            global_step += int(np.sum(valid))
            after_done = term | trunc
            obs = wrappers.observation(next_obs)
        # V(next obs) of each step: the next slot's value (EnvPool returns the final
        # observation at an episode's end, the reset one a step later).
        last_value = np.asarray(act(params, obs, act_key)[2])
        next_value = np.concatenate([buf["value"][1:], last_value[None]])
        advantages, returns = gae(
            reward, buf["value"], next_value, terminated, done, buf["valid"],
            args.gamma, args.gae_lambda,
        )  # fmt: skip
        key, update_key = jax.random.split(key)
        data = {**buf, "advantages": advantages, "returns": returns}
        params, opt_state, stats = update(params, opt_state, data, update_key)
        stats = {name: float(x) for name, x in stats.items()}
        sps = global_step / (time.perf_counter() - start)
        mean_return = np.mean(episode_returns) if episode_returns else float("nan")
        print(
            f"global_step={global_step} episodic_return={mean_return:.1f} "
            f"episodes={num_episodes} value_loss={stats['value_loss']:.4f} "
            f"policy_loss={stats['policy_loss']:.4f} entropy={stats['entropy']:.3f} "
            f"approx_kl={stats['approx_kl']:.4f} clipfrac={stats['clipfrac']:.3f} "
            f"explained_variance={stats['explained_variance']:.3f} SPS={sps:.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()

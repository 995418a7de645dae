"""PPO with continuous actions on MuJoCo, sampled by jaxrunner: CleanRL's
``ppo_continuous_action.py``.

The same network (separate 64-64 tanh actor and critic, orthogonal init, a learned
state-independent log-std), hyperparameters and flags as CleanRL's; its gymnasium
wrappers are jaxrunner connectors: ``NormalizeObservation`` (clipped to +-10) and
``ScaleReward.cleanrl`` (``NormalizeReward`` then clipped to +-10), and ``ClipAction``
is the runner's own (Box actions are recorded as sampled and clipped for the env only).
The env is EnvPool's MuJoCo task, the sampling a ``jr.EnvRunner``, the whole PPO update
(GAE, then ``--update-epochs`` passes over ``--num-minibatches`` minibatches) one
jitted call. Left out: ``--target-kl`` (off by default in CleanRL) and TensorBoard/W&B.

Run it (``pip install "jaxrunner[envpool]" optax``)::

    python examples/ppo_continuous.py --env-id HalfCheetah-v4 --total-timesteps 1000000

The returns printed are the runner's: the mean undiscounted return of the last 10
episodes, in the env's own rewards (the scaled ones are only what the learner trains on).
"""

from __future__ import annotations

import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxrunner as jr
from jaxrunner import connectors as C


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="HalfCheetah-v4", help="an EnvPool MuJoCo task id")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--total-timesteps", type=int, default=1_000_000)
    p.add_argument("--learning-rate", type=float, default=3e-4)
    p.add_argument("--num-envs", type=int, default=1)
    p.add_argument("--num-steps", type=int, default=2048, help="steps per env per rollout")
    p.add_argument("--anneal-lr", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--num-minibatches", type=int, default=32)
    p.add_argument("--update-epochs", type=int, default=10)
    p.add_argument("--norm-adv", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--clip-vloss", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--ent-coef", type=float, default=0.0)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    args = p.parse_args()
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations < 1 or args.minibatch_size < 1:
        p.error(
            f"--total-timesteps {args.total_timesteps} must be at least --num-envs x "
            f"--num-steps = {args.batch_size}, and that at least --num-minibatches "
            f"({args.num_minibatches})"
        )
    return args


class ActorCritic(nn.Module):
    """CleanRL's ``Agent``: the Gaussian's mean and the value, from separate MLPs."""

    action_dim: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        def mlp(x, out, scale):
            for _ in range(2):
                x = nn.tanh(nn.Dense(64, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
            return nn.Dense(out, kernel_init=nn.initializers.orthogonal(scale))(x)

        return mlp(obs, self.action_dim, 0.01), mlp(obs, 1, 1.0)[..., 0]


def masked_mean(x, valid):
    """The mean over the slots that hold a transition: EnvPool's reset steps (the slot
    after each episode end, ``traj.valid`` False) do not."""
    return jnp.sum(jnp.where(valid, x, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


def make_optimizer(args) -> optax.GradientTransformation:
    """CleanRL's Adam: gradients clipped by global norm, the rate annealed to 0."""

    def learning_rate(count):  # CleanRL's: annealed once per iteration, not per step
        iteration = count // (args.num_minibatches * args.update_epochs)
        return args.learning_rate * (1.0 - iteration / args.num_iterations)

    return optax.chain(
        optax.clip_by_global_norm(args.max_grad_norm),
        optax.adam(learning_rate if args.anneal_lr else args.learning_rate, eps=1e-5),
    )


def make_learner(policy: jr.Policy, optimizer: optax.GradientTransformation, args):
    """The PPO update of one rollout, given its advantages: ``learn(params, opt_state,
    data, key)``, ``data`` a dict of ``[T, B, ...]`` arrays. Not jitted: called inside
    the caller's jitted update (``benchmarks/ppo_continuous_hand.py`` shares it)."""

    def ppo_loss(params, mb):
        new = policy.evaluate(params, mb["obs"], mb["action"])  # log_prob, entropy, value
        logratio = new["log_prob"] - mb["log_prob"]
        ratio = jnp.exp(logratio)
        adv, valid = mb["advantages"], mb["valid"]
        if args.norm_adv:
            adv = adv - masked_mean(adv, valid)
            adv = adv / (jnp.sqrt(masked_mean(adv**2, valid)) + 1e-8)
        clipped = jnp.clip(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = masked_mean(jnp.maximum(-adv * ratio, -adv * clipped), valid)
        v_loss = (new["value"] - mb["returns"]) ** 2
        if args.clip_vloss:
            v_clipped = mb["value"] + jnp.clip(
                new["value"] - mb["value"], -args.clip_coef, args.clip_coef
            )
            v_loss = jnp.maximum(v_loss, (v_clipped - mb["returns"]) ** 2)
        v_loss = 0.5 * masked_mean(v_loss, valid)
        entropy = masked_mean(new["entropy"], valid)
        loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
        stats = {
            "policy_loss": pg_loss,
            "value_loss": v_loss,
            "entropy": entropy,
            "approx_kl": masked_mean((ratio - 1) - logratio, valid),
            "clipfrac": masked_mean(jnp.abs(ratio - 1) > args.clip_coef, valid),
        }
        return loss, stats

    def learn(params, opt_state, data, key):
        data = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), data)  # [T * B, ...]

        def minibatch_step(state, index):
            params, opt_state = state
            mb = jax.tree.map(lambda x: x[index], data)
            grads, stats = jax.grad(ppo_loss, has_aux=True)(params, mb)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), stats

        def epoch(state, key):
            order = jax.random.permutation(key, args.batch_size)
            order = order[: args.num_minibatches * args.minibatch_size]
            return jax.lax.scan(minibatch_step, state, order.reshape(args.num_minibatches, -1))

        keys = jax.random.split(key, args.update_epochs)
        (params, opt_state), stats = jax.lax.scan(epoch, (params, opt_state), keys)
        stats = jax.tree.map(jnp.mean, stats)
        valid, targets = data["valid"], data["returns"]
        errors = targets - data["value"]

        def var(x):
            return masked_mean((x - masked_mean(x, valid)) ** 2, valid)

        stats["explained_variance"] = 1 - var(errors) / var(targets)
        return params, opt_state, stats

    return learn


def make_update(policy: jr.Policy, optimizer: optax.GradientTransformation, args):
    """The whole PPO update of one Trajectory, jitted: GAE, then the learner."""
    learn = make_learner(policy, optimizer, args)

    @jax.jit
    def update(params, opt_state, traj, key):
        # What the policy saw (normalized observations) and the rewards it learns from.
        obs, next_obs = traj.extras[C.POLICY_OBS], traj.extras[C.POLICY_NEXT_OBS]
        advantages, returns = jr.gae(
            traj,
            reward=traj.extras[C.SCALED_REWARD],
            next_value=policy.value(params, next_obs, batch_ndim=2),  # V(true next obs)
            gamma=args.gamma,
            lam=args.gae_lambda,
        )
        data = {
            "obs": obs,
            "action": traj.action,
            "log_prob": traj.extras["log_prob"],
            "value": traj.extras["value"],
            "advantages": advantages,
            "returns": returns,
            "valid": traj.valid,  # False at EnvPool's reset steps (gae gave them zeros)
        }
        return learn(params, opt_state, data, key)

    return update


def main() -> None:
    args = parse_args()
    envs = jr.make_vec(args.env_id, args.num_envs, backend="envpool")
    connectors = C.Connectors(
        obs=[C.NormalizeObservation()], reward=C.ScaleReward.cleanrl(args.gamma)
    )
    action_dim = int(np.prod(envs.single_action_space.shape))
    policy = jr.Policy.from_linen(ActorCritic(action_dim), envs.single_action_space)
    key, init_key = jax.random.split(jax.random.key(args.seed))
    params = policy.init(init_key, connectors.observation_space(envs.single_observation_space))

    optimizer = make_optimizer(args)
    opt_state = optimizer.init(params)
    update = make_update(policy, optimizer, args)
    runner = jr.EnvRunner(
        envs,
        policy,
        params,
        rollout_length=args.num_steps,
        seed=args.seed,
        connectors=connectors,
        metrics=jr.MetricsConfig(episode_window=10),  # returns: mean of the last 10 episodes
    )
    start = time.perf_counter()
    with runner:
        for traj in runner.iterate(args.num_iterations, reuse_buffers=True):
            key, update_key = jax.random.split(key)
            params, opt_state, stats = update(params, opt_state, traj, update_key)
            runner.set_params(params)
            stats = {name: float(x) for name, x in stats.items()}  # waits for the update
            metrics = runner.get_metrics()
            global_step = metrics["num_env_steps"]
            sps = global_step / (time.perf_counter() - start)
            print(
                f"global_step={global_step} episodic_return={metrics['episode_return_mean']:.1f} "
                f"episodes={metrics['num_episodes']} value_loss={stats['value_loss']:.4f} "
                f"policy_loss={stats['policy_loss']:.4f} entropy={stats['entropy']:.3f} "
                f"approx_kl={stats['approx_kl']:.4f} clipfrac={stats['clipfrac']:.3f} "
                f"explained_variance={stats['explained_variance']:.3f} SPS={sps:.0f}",
                flush=True,  # for logs written to a file
            )


if __name__ == "__main__":
    main()

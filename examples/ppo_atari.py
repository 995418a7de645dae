"""PPO on Atari with EnvPool, sampled by jaxrunner: CleanRL's ``ppo_atari_envpool.py``.

The same environment set-up (EnvPool's Atari preprocessing with ``episodic_life`` and
``reward_clip``), network (NatureCNN, from ``jr.models``), hyperparameters and flags
as CleanRL's; the sampling is a ``jr.EnvRunner`` and the whole PPO update (GAE, then
``--update-epochs`` passes over ``--num-minibatches`` minibatches) one jitted call.
Left out: ``--target-kl`` (off by default in CleanRL) and TensorBoard/W&B logging.

Run it (``pip install "jaxrunner[envpool]" optax``)::

    python examples/ppo_atari.py --env-id Pong-v5 --total-timesteps 10000000

Returns: with ``episodic_life`` EnvPool ends an episode at every lost life and the
runner's rewards are clipped to {-1, 0, 1}, so the runner's own episode statistics
are those of lives, in clipped reward. The game return that CleanRL logs is summed
here from EnvPool's ``info["reward"]`` (the unclipped reward) over every life, and
a game ends where ``info["terminated"]`` (game over) or the time limit says so.
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxrunner as jr


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="Pong-v5", help="an EnvPool Atari task id")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--total-timesteps", type=int, default=10_000_000)
    p.add_argument("--learning-rate", type=float, default=2.5e-4)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--num-steps", type=int, default=128, help="steps per env per rollout")
    p.add_argument("--anneal-lr", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--norm-adv", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--clip-coef", type=float, default=0.1)
    p.add_argument("--clip-vloss", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--ent-coef", type=float, default=0.01)
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


class GameStats:
    """CleanRL's ``RecordEpisodeStatistics`` for EnvPool: game returns and lengths,
    from the unclipped ``info["reward"]``, over every life of a game."""

    def __init__(self, num_envs: int) -> None:
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs, np.int64)

    def update(
        self, infos: dict, truncated: np.ndarray, valid: np.ndarray
    ) -> list[tuple[float, int]]:
        """Takes one sample's ``[T, B]`` infos, truncations and ``valid`` mask (False at
        EnvPool's reset steps, which are no step of a game); returns the games that
        ended in it."""
        finished = []
        rows = zip(infos["reward"], infos["terminated"], truncated, valid)
        for reward, game_over, cut, real in rows:
            self.returns += np.where(real, reward, 0.0)
            self.lengths += real
            for b in np.flatnonzero(((game_over > 0) | cut) & real):
                finished.append((float(self.returns[b]), int(self.lengths[b])))
                self.returns[b], self.lengths[b] = 0.0, 0
        return finished


def masked_mean(x, valid):
    """The mean over the slots that hold a transition: EnvPool's reset steps (the slot
    after each episode end, ``traj.valid`` False) do not."""
    return jnp.sum(jnp.where(valid, x, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


def make_update(policy: jr.Policy, optimizer: optax.GradientTransformation, args):
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

    @jax.jit
    def update(params, opt_state, batch, key):
        advantages, returns = jr.gae(
            reward=batch["reward"],
            terminated=batch["terminated"],
            truncated=batch["truncated"],
            valid=batch["valid"],  # EnvPool's reset steps: no transition, zero advantage
            value=batch["value"],
            next_value=batch["next_value"],
            gamma=args.gamma,
            lam=args.gae_lambda,
        )
        data = {name: batch[name] for name in ("obs", "action", "log_prob", "value", "valid")}
        data.update(advantages=advantages, returns=returns)
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

    return update


def main() -> None:
    args = parse_args()
    envs = jr.make_vec(
        args.env_id, args.num_envs, backend="envpool", episodic_life=True, reward_clip=True
    )
    policy = jr.models.nature_cnn_policy(envs.single_observation_space, envs.single_action_space)
    key, init_key = jax.random.split(jax.random.key(args.seed))
    params = policy.init(init_key, envs.single_observation_space)

    def learning_rate(count):  # CleanRL's: annealed once per iteration, not per step
        iteration = count // (args.num_minibatches * args.update_epochs)
        return args.learning_rate * (1.0 - iteration / args.num_iterations)

    optimizer = optax.chain(
        optax.clip_by_global_norm(args.max_grad_norm),
        optax.adam(learning_rate if args.anneal_lr else args.learning_rate, eps=1e-5),
    )
    opt_state = optimizer.init(params)
    update = make_update(policy, optimizer, args)
    critic = jax.jit(policy.value)
    games = GameStats(args.num_envs)
    runner = jr.EnvRunner(
        envs,
        policy,
        params,
        rollout_length=args.num_steps,
        seed=args.seed,
        info_keys=("reward", "terminated"),
        compact_next_obs=True,  # next_obs stored at episode ends and the last step only
    )
    start = time.perf_counter()
    with runner:
        for traj in runner.iterate(args.num_iterations, reuse_buffers=True):
            ended = games.update(traj.extras["infos"], traj.truncated, traj.valid)
            for game_return, game_length in ended:
                print(
                    f"episodic_return={game_return:.0f} episodic_length={game_length}", flush=True
                )
            # V(next_obs): the critic runs only on the rows where next_obs is not the
            # next step's obs (episode ends, the last step).
            value = traj.extras["value"]
            next_value = traj.next_value(value, functools.partial(critic, params))
            batch = {
                "obs": traj.obs,
                "action": traj.action,
                "log_prob": traj.extras["log_prob"],
                "value": value,
                "reward": traj.reward,  # clipped by EnvPool, as CleanRL trains on
                "terminated": traj.terminated,  # every lost life (episodic_life)
                "truncated": traj.truncated,
                "valid": traj.valid,  # False at EnvPool's reset steps
                "next_value": next_value,
            }
            key, update_key = jax.random.split(key)
            params, opt_state, stats = update(params, opt_state, batch, update_key)
            runner.set_params(params)
            stats = {name: float(x) for name, x in stats.items()}  # waits for the update
            global_step = runner.get_metrics()["num_env_steps"]
            sps = global_step / (time.perf_counter() - start)
            print(
                f"global_step={global_step} value_loss={stats['value_loss']:.4f} "
                f"policy_loss={stats['policy_loss']:.4f} entropy={stats['entropy']:.3f} "
                f"approx_kl={stats['approx_kl']:.4f} clipfrac={stats['clipfrac']:.3f} "
                f"explained_variance={stats['explained_variance']:.3f} SPS={sps:.0f}",
                flush=True,  # for logs written to a file
            )


if __name__ == "__main__":
    main()

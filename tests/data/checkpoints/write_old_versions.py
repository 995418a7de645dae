"""Wrote the checkpoints of the earlier formats here (EnvRunner version 2,
MultiAgentRunner version 1), run at commit 784c8bb with the runners of the tests
that restore them: ``PYTHONPATH=. python tests/data/checkpoints/write_old_versions.py``."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp

import jaxrunner as jr
from tests import test_checkpoint as single
from tests import test_multi_agent_checkpoint as multi

HERE = pathlib.Path(__file__).parent

if __name__ == "__main__":
    with jr.make_vec(single.short_cartpole, 1) as envs:  # the gru fixture's policy
        policy = jr.Policy.from_linen(
            single.Recurrent(), envs.single_action_space, initial_carry=jnp.zeros(8)
        )
        params = policy.init(jax.random.key(0), envs.single_observation_space)
    with single.cartpole_runner((policy, params)) as runner:
        runner.sample_episodes(4)
        runner.save(HERE / "env_runner_v2_sync.ckpt")
    with single.walk_runner() as runner:
        runner.sample_episodes(3)
        runner.save(HERE / "env_runner_v2_jax.ckpt")
    with multi.make(callbacks=multi.Recorder()) as runner:
        runner.sample_episodes(3)
        runner.save(HERE / "multi_agent_runner_v1_sync.ckpt")

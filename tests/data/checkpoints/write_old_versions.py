"""Wrote the checkpoints of the earlier formats here (EnvRunner version 2,
MultiAgentRunner version 1), run at commit 784c8bb with the runners of the tests
that restore them: ``PYTHONPATH=. python tests/data/checkpoints/write_old_versions.py``."""

from __future__ import annotations

import pathlib

from tests import test_checkpoint as single
from tests import test_multi_agent_checkpoint as multi
from tests.test_checkpoint_versions import gru_policy

HERE = pathlib.Path(__file__).parent

if __name__ == "__main__":
    with single.cartpole_runner(gru_policy()) as runner:
        runner.sample_episodes(4)
        runner.save(HERE / "env_runner_v2_sync.ckpt")
    with single.walk_runner() as runner:
        runner.sample_episodes(3)
        runner.save(HERE / "env_runner_v2_jax.ckpt")
    with multi.make(callbacks=multi.Recorder()) as runner:
        runner.sample_episodes(3)
        runner.save(HERE / "multi_agent_runner_v1_sync.ckpt")

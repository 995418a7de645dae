"""Wrote the checkpoints of the earlier formats here (EnvRunner version 2,
MultiAgentRunner version 1), run at commit 784c8bb with the runners of the tests
that restore them (since merged into tests/test_checkpoint.py, as imported here):
``PYTHONPATH=. python tests/data/checkpoints/write_old_versions.py``."""

from __future__ import annotations

import pathlib

from tests import test_checkpoint as checkpoints

HERE = pathlib.Path(__file__).parent

if __name__ == "__main__":
    with checkpoints.make("cartpole") as runner:  # the GRU policy of checkpoints.gru()
        runner.sample_episodes(4)
        runner.save(HERE / "env_runner_v2_sync.ckpt")
    with checkpoints.walk_runner() as runner:
        runner.sample_episodes(3)
        runner.save(HERE / "env_runner_v2_jax.ckpt")
    with checkpoints.make("coming_and_going", callbacks=checkpoints.Recorder()) as runner:
        runner.sample_episodes(3)
        runner.save(HERE / "multi_agent_runner_v1_sync.ckpt")

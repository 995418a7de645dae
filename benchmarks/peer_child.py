"""The peers' benchmark child: ``jaxrunner bench``'s child protocol
(``jaxrunner._src.bench.child``) serving the peer libraries' loops (``peer_loops.py``)
beside jaxrunner's own systems. ``peers.py`` starts it under ``--peers-python``, the
venv with EnvPool, PufferLib and RLlib: ``PYTHON benchmarks/peer_child.py``.
"""

from __future__ import annotations

from typing import Any

from peer_loops import (
    PEER_REFERENCES,
    RLLIB_HIDDEN,
    EnvPoolAsyncLoop,
    RLlibLoop,
    puffer_envs,
)

from jaxrunner._src.bench import child, systems
from jaxrunner._src.bench.hand_loop import env_makers


def build(spec: systems.Spec) -> Any:
    """Builds and warms up ``spec``'s system: a peer library's loop for a hand system
    whose reference is one of ``PEER_REFERENCES``, else ``jaxrunner bench``'s own."""
    if spec.system != "hand" or spec.reference not in PEER_REFERENCES:
        return systems.build(spec)
    make, envpool_id, envpool_kwargs = env_makers(spec.env, spec.workload)
    if spec.reference == "rllib":
        hidden = RLLIB_HIDDEN[spec.workload or "cartpole"]
        loop = RLlibLoop(spec.env, spec.num_envs, spec.rollout_length, spec.seed, hidden)
        return systems.RolloutSystem(loop.rollout, loop.close)
    if spec.reference == "envpool_async":
        loop = EnvPoolAsyncLoop(
            envpool_id,
            envpool_kwargs,
            spec.num_envs,
            spec.rollout_length,
            spec.seed,
            lambda obs_space, action_space: systems.spec_policy(spec, obs_space, action_space),
        )
        return systems.RolloutSystem(loop.rollout, loop.close)
    envs = puffer_envs(str(spec.reference), make, spec.num_envs, spec.seed)
    # PufferLib resets an ended episode on the step after its end: no transition.
    return systems.recording_loop(spec, envs, next_step_reset=True)


# Under the guard: the process backend's workers import this module again.
if __name__ == "__main__":
    child.main(build)

"""The peers' venv (EnvPool, PufferLib and RLlib, which conflict with the main venv):
what imports there (:func:`probe`), and the benchmark child that runs there
(:func:`start`): ``jaxrunner bench``'s child protocol (``jaxrunner._src.bench.child``)
serving the peer libraries' loops (``peer_loops.py``) beside jaxrunner's own systems,
as ``PYTHON benchmarks/peer_child.py``. ``peers.py`` uses both under ``--peers-python``.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
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

PEERS_PYTHON = "/work/venv-peers/bin/python"
"""The default interpreter of the peer libraries' venv (EnvPool, PufferLib)."""
PEER_MODULES = {
    "envpool": "envpool",
    "envpool_async": "envpool",
    "puffer_serial": "pufferlib",
    "puffer_mp": "pufferlib",
    "rllib": "ray.rllib",
}
"""The module each peer needs in the peers' venv (RLlib runs there when it imports, in
this process otherwise)."""

_PROBE = """
import importlib, importlib.metadata, json
found = {}
modules = (("envpool", "envpool"), ("pufferlib", "pufferlib-core"), ("ray.rllib", "ray"))
for module, dist in modules:
    try:
        importlib.import_module(module)
        found[module] = importlib.metadata.version(dist)
    except Exception as err:
        found[module] = None
        found[module + "_error"] = f"{type(err).__name__}: {err}"
print(json.dumps(found))
"""


def probe(python: str) -> tuple[dict[str, Any], dict[str, str]]:
    """What imports under the peers' interpreter: (module versions, reason per peer
    that cannot run there)."""
    if not pathlib.Path(python).exists():
        reason = (
            f"--peers-python {python}: no such interpreter; make the peers' venv as "
            "benchmarks/README.md says"
        )
        return {}, dict.fromkeys(PEER_MODULES, reason)
    done = subprocess.run(
        [python, "-c", _PROBE], capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        return {}, dict.fromkeys(PEER_MODULES, f"{python}: probe failed: {done.stderr[-500:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    reasons = {
        peer: f"{python}: import {module} failed: {found.get(module + '_error')}"
        for peer, module in PEER_MODULES.items()
        if found.get(module) is None
    }
    return found, reasons


def start(python: str) -> child.Child:
    """This script as a benchmark child under the interpreter ``python``, at JAX's
    defaults (as the hand loops run)."""
    return child.Child("peers", jax_defaults=True, command=[python, str(pathlib.Path(__file__))])


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

"""gymnasium's vector wrappers, which a runner never steps: the hint that says to unwrap
them, and what replaces each."""

from __future__ import annotations

from typing import Any

import gymnasium

from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.jax_env import JaxVectorEnv

# What replaces each of gymnasium's vector wrappers on a runner (which steps its envs
# itself, so a wrapper's step would never run).
REPLACEMENTS = {
    "NormalizeObservation": "the connector jaxrunner.connectors.NormalizeObservation()",
    "NormalizeReward": "the connector jaxrunner.connectors.ScaleReward()",
    "FrameStackObservation": "the connector jaxrunner.connectors.FrameStack(n)",
    "ClipAction": "nothing: Box actions are clipped for the env already (the trajectory "
    "keeps them as sampled)",
    "RescaleAction": "the connector jaxrunner.connectors.RescaleActions()",
    "RecordEpisodeStatistics": "runner.get_metrics() (episode_return_mean, "
    "episode_length_mean) and traj.split_episodes()",
    "DictInfoToList": "EnvRunner(..., info_keys=[...]) (infos as [T, B] arrays)",
}


def vector_wrapper_hint(envs: Any) -> str:
    """What to do with gymnasium vector wrappers around a vector env: unwrap them, and
    which connector or runner feature replaces each."""
    names = []
    inner = envs
    while isinstance(inner, gymnasium.vector.VectorWrapper):
        names.append(type(inner).__name__)
        inner = inner.env
    other = "the wrapper on each sub-env inside its factory (gymnasium.wrappers) or a connector"
    fixes = [f"{name} -> {REPLACEMENTS.get(name, other)}" for name in names]
    unwrap = (
        "pass the jaxrunner vector env itself (envs.unwrapped)"
        if isinstance(inner, (VectorEnv, JaxVectorEnv))
        else "pass jaxrunner.from_gymnasium(envs.unwrapped) (the gymnasium vector env under them)"
    )
    return (
        f"The runner steps its envs itself, so gymnasium vector wrappers ({', '.join(names)}) "
        f"would never run: {unwrap}, and replace {'; '.join(fixes)}."
    )

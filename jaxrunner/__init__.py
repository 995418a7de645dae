"""jaxrunner: a JAX-accelerated vectorized sampler for reinforcement learning.

The public API is this module and its namespaces (``connectors``, ``multi_agent``, ``serve``,
``testing``, ``models``, ``errors``, ``cpu_dispatch``); ``jaxrunner._src`` is private."""

# First, before any submodule can start JAX (see jaxrunner.cpu_dispatch).
from jaxrunner._src.cpu_dispatch import default_to_inline_cpu_dispatch  # isort: skip

default_to_inline_cpu_dispatch()

import importlib
from typing import TYPE_CHECKING, Any

# Public names load on first use (``__getattr__``): a worker skips the rest (~1 s of CPU).
if TYPE_CHECKING:
    from jaxrunner import connectors, cpu_dispatch, errors, models, multi_agent, serve, testing
    from jaxrunner._src.backends.base import MultiAgentVectorEnv, VectorEnv
    from jaxrunner._src.backends.envpool import EnvPoolVectorEnv
    from jaxrunner._src.backends.gymnasium_adapter import GymnasiumVectorEnv, from_gymnasium
    from jaxrunner._src.backends.jax_env import JaxVectorEnv
    from jaxrunner._src.backends.make_vec import make_multi_agent_vec, make_vec
    from jaxrunner._src.backends.process import ProcessConfig, ProcessVectorEnv
    from jaxrunner._src.backends.ray import RayConfig, RayVectorEnv
    from jaxrunner._src.backends.restarts import RestartPolicy
    from jaxrunner._src.backends.steps import BatchStep
    from jaxrunner._src.backends.sub_env_handle import SubEnvHandle
    from jaxrunner._src.backends.sync import SyncVectorEnv
    from jaxrunner._src.checkpoints.checkpoint import RestoreReport
    from jaxrunner._src.core.episode import AgentEpisode, Episode, concatenate_episodes
    from jaxrunner._src.core.metrics import MetricsConfig
    from jaxrunner._src.core.multi_agent_trajectory import MultiAgentTrajectory
    from jaxrunner._src.core.policy import Policy
    from jaxrunner._src.core.returns import GAE, discounted_returns, gae
    from jaxrunner._src.core.seeds import env_seeds
    from jaxrunner._src.core.time_major import concatenate
    from jaxrunner._src.core.trajectory import Trajectory
    from jaxrunner._src.runner.env_runner import EnvRunner, MultiAgentRunner
    from jaxrunner._src.samplers.callbacks import Callbacks, LiveEpisode
    from jaxrunner._src.services.datasets import from_minari, to_minari
    from jaxrunner._src.services.distributed import EnvRunnerGroup, EnvRunnerGroupConfig
    from jaxrunner._src.services.evaluation import EvaluationResult, evaluate
    from jaxrunner._src.services.external import ExternalEnv, ExternalEnvConfig
    from jaxrunner._src.services.metrics_writer import MetricsWriter, flatten_metrics

__version__ = "0.1.0"

# Where each public name lives, as imported above for type checkers.
_SOURCES = {
    "jaxrunner._src.backends.base": "MultiAgentVectorEnv VectorEnv",
    "jaxrunner._src.backends.steps": "BatchStep",
    "jaxrunner._src.backends.envpool": "EnvPoolVectorEnv",
    "jaxrunner._src.backends.gymnasium_adapter": "GymnasiumVectorEnv from_gymnasium",
    "jaxrunner._src.backends.jax_env": "JaxVectorEnv",
    "jaxrunner._src.backends.make_vec": "make_multi_agent_vec make_vec",
    "jaxrunner._src.backends.process": "ProcessConfig ProcessVectorEnv",
    "jaxrunner._src.backends.ray": "RayConfig RayVectorEnv",
    "jaxrunner._src.backends.restarts": "RestartPolicy",
    "jaxrunner._src.backends.sub_env_handle": "SubEnvHandle",
    "jaxrunner._src.backends.sync": "SyncVectorEnv",
    "jaxrunner._src.checkpoints.checkpoint": "RestoreReport",
    "jaxrunner._src.core.episode": "AgentEpisode Episode concatenate_episodes",
    "jaxrunner._src.core.metrics": "MetricsConfig",
    "jaxrunner._src.core.policy": "Policy",
    "jaxrunner._src.core.returns": "GAE discounted_returns gae",
    "jaxrunner._src.core.seeds": "env_seeds",
    "jaxrunner._src.core.multi_agent_trajectory": "MultiAgentTrajectory",
    "jaxrunner._src.core.time_major": "concatenate",
    "jaxrunner._src.core.trajectory": "Trajectory",
    "jaxrunner._src.runner.env_runner": "EnvRunner MultiAgentRunner",
    "jaxrunner._src.samplers.callbacks": "Callbacks LiveEpisode",
    "jaxrunner._src.services.datasets": "from_minari to_minari",
    "jaxrunner._src.services.distributed": "EnvRunnerGroup EnvRunnerGroupConfig",
    "jaxrunner._src.services.evaluation": "EvaluationResult evaluate",
    "jaxrunner._src.services.external": "ExternalEnv ExternalEnvConfig",
    "jaxrunner._src.services.metrics_writer": "MetricsWriter flatten_metrics",
}
_NAMESPACES = ("connectors", "cpu_dispatch", "errors", "models", "multi_agent", "serve", "testing")
_WHERE = {name: module for module, names in _SOURCES.items() for name in names.split()}


def __getattr__(name: str) -> Any:
    if name in _NAMESPACES:
        return importlib.import_module(f"jaxrunner.{name}")  # sets itself on the package
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'jaxrunner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE, *_NAMESPACES})


__all__ = [
    # vector envs
    "BatchStep",
    "EnvPoolVectorEnv",
    "GymnasiumVectorEnv",
    "JaxVectorEnv",
    "ProcessConfig",
    "ProcessVectorEnv",
    "RayConfig",
    "RayVectorEnv",
    "RestartPolicy",
    "SubEnvHandle",
    "SyncVectorEnv",
    "VectorEnv",
    "from_gymnasium",
    "make_vec",
    # the runner and what it gives
    "Callbacks",
    "EnvRunner",
    "Episode",
    "LiveEpisode",
    "MetricsConfig",
    "Policy",
    "RestoreReport",
    "Trajectory",
    "concatenate",
    "concatenate_episodes",
    "env_seeds",
    # returns
    "GAE",
    "discounted_returns",
    "gae",
    # services
    "EnvRunnerGroup",
    "EnvRunnerGroupConfig",
    "EvaluationResult",
    "ExternalEnv",
    "ExternalEnvConfig",
    "MetricsWriter",
    "evaluate",
    "flatten_metrics",
    "from_minari",
    "to_minari",
    # multi-agent entry points (the rest: jaxrunner.multi_agent)
    "AgentEpisode",
    "MultiAgentRunner",
    "MultiAgentTrajectory",
    "MultiAgentVectorEnv",
    "make_multi_agent_vec",
    # namespaces
    "connectors",
    "cpu_dispatch",
    "errors",
    "models",
    "multi_agent",
    "serve",
    "testing",
    "__version__",
]

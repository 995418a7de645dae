"""jaxrunner: a JAX-accelerated vectorized sampler for reinforcement learning.

The public API, in one place::

    import jaxrunner as jr

    envs = jr.make_vec("CartPole-v1", num_envs=64)
    policy = jr.Policy.from_linen(module, envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length=128, seed=0) as runner:
        traj = runner.sample()
"""

# First, before any submodule can start JAX: inline CPU dispatch by default, where safe.
from jaxrunner.cpu_dispatch import (  # isort: skip
    default_to_inline_cpu_dispatch,
    inline_cpu_dispatch,
    use_async_cpu_dispatch,
    use_inline_cpu_dispatch,
)

default_to_inline_cpu_dispatch()

from jaxrunner import connectors, errors, models, multi_agent, serve
from jaxrunner.callbacks import Callbacks, LiveEpisode
from jaxrunner.datasets import from_minari, to_minari
from jaxrunner.envs import (
    BACKENDS,
    BatchStep,
    GymnasiumVectorEnv,
    LocalShareVectorEnv,
    ProcessConfig,
    ProcessVectorEnv,
    RayConfig,
    RayEnvConfig,
    RayVectorEnv,
    SyncVectorEnv,
    VectorEnv,
    from_gymnasium,
    make_vec,
)
from jaxrunner.envs.jax_env import JaxVectorEnv
from jaxrunner.evaluation import EvaluationResult, evaluate
from jaxrunner.external import ExternalEnv, ExternalEnvConfig
from jaxrunner.faults import RestartPolicy
from jaxrunner.metrics import MetricsConfig
from jaxrunner.metrics_log import MetricsWriter, flatten_metrics
from jaxrunner.multi_agent import (
    AgentEpisode,
    MultiAgentRunner,
    MultiAgentTrajectory,
    MultiAgentVectorEnv,
    make_multi_agent_vec,
)
from jaxrunner.policy import Policy
from jaxrunner.returns import GAE, discounted_returns, gae
from jaxrunner.sampling import EnvRunner
from jaxrunner.sampling.checkpoint import RestoreReport
from jaxrunner.sampling.seeds import env_seeds
from jaxrunner.trajectory import Episode, Trajectory, concatenate, concatenate_episodes

__version__ = "0.1.0"

_LAZY = {"EnvRunnerGroup", "EnvRunnerGroupConfig"}  # jaxrunner.distributed (Ray, optional)


def __getattr__(name: str) -> object:
    # Ray is an optional extra: these names load jaxrunner.distributed on first use,
    # and even that imports ray only when a group is built.
    if name in _LAZY:
        from jaxrunner import distributed

        return getattr(distributed, name)
    # Test utilities (chex, fake envs) load on first use of jr.testing, not with jaxrunner.
    if name == "testing":
        import jaxrunner.testing

        return jaxrunner.testing
    raise AttributeError(f"module 'jaxrunner' has no attribute {name!r}")


__all__ = [
    "BACKENDS",
    "AgentEpisode",
    "BatchStep",
    "Callbacks",
    "EnvRunner",
    "EnvRunnerGroup",
    "EnvRunnerGroupConfig",
    "Episode",
    "EvaluationResult",
    "ExternalEnv",
    "ExternalEnvConfig",
    "GAE",
    "GymnasiumVectorEnv",
    "JaxVectorEnv",
    "LiveEpisode",
    "LocalShareVectorEnv",
    "MetricsConfig",
    "MetricsWriter",
    "MultiAgentRunner",
    "MultiAgentTrajectory",
    "MultiAgentVectorEnv",
    "Policy",
    "ProcessConfig",
    "ProcessVectorEnv",
    "RayConfig",
    "RayEnvConfig",
    "RayVectorEnv",
    "RestoreReport",
    "RestartPolicy",
    "SyncVectorEnv",
    "Trajectory",
    "VectorEnv",
    "__version__",
    "concatenate",
    "concatenate_episodes",
    "connectors",
    "discounted_returns",
    "env_seeds",
    "errors",
    "evaluate",
    "flatten_metrics",
    "from_minari",
    "from_gymnasium",
    "gae",
    "inline_cpu_dispatch",
    "make_multi_agent_vec",
    "make_vec",
    "models",
    "multi_agent",
    "serve",
    "testing",
    "to_minari",
    "use_async_cpu_dispatch",
    "use_inline_cpu_dispatch",
]

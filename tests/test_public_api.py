"""The public surface, pinned: a change to it is deliberate, made here and in the README.

The public modules are listed below with their names; every other module lives under
``jaxrunner._src`` and is private.
"""

import importlib
import pathlib
import subprocess
import sys

import pytest

import jaxrunner

PUBLIC = {
    "jaxrunner": [
        "AgentEpisode",
        "BatchStep",
        "Callbacks",
        "EnvPoolVectorEnv",
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
        "MetricsConfig",
        "MetricsWriter",
        "MultiAgentRunner",
        "MultiAgentTrajectory",
        "MultiAgentVectorEnv",
        "Policy",
        "ProcessConfig",
        "ProcessVectorEnv",
        "RayConfig",
        "RayVectorEnv",
        "RestartPolicy",
        "RestoreReport",
        "SubEnvHandle",
        "SyncVectorEnv",
        "Trajectory",
        "VectorEnv",
        "__version__",
        "concatenate",
        "concatenate_episodes",
        "connectors",
        "cpu_dispatch",
        "discounted_returns",
        "env_seeds",
        "errors",
        "evaluate",
        "flatten_metrics",
        "from_gymnasium",
        "from_minari",
        "gae",
        "make_multi_agent_vec",
        "make_vec",
        "models",
        "multi_agent",
        "serve",
        "testing",
        "to_minari",
    ],
    "jaxrunner.connectors": [
        "ActionConnector",
        "ConnectorState",
        "Connectors",
        "ConnectorsState",
        "FrameStack",
        "Moments",
        "NormalizeObservation",
        "ObsConnector",
        "POLICY_NEXT_OBS",
        "POLICY_OBS",
        "RescaleActions",
        "RewardConnector",
        "RunningMoments",
        "SCALED_REWARD",
        "SampleEnd",
        "ScaleReward",
        "freeze",
        "set_statistics",
        "unfreeze",
    ],
    "jaxrunner.cpu_dispatch": [
        "ENV_VAR",
        "inline_cpu_dispatch",
        "use_async_cpu_dispatch",
        "use_inline_cpu_dispatch",
    ],
    "jaxrunner.errors": [
        "ActionTimeoutError",
        "ClosedError",
        "DispatchConfigError",
        "EnvError",
        "EnvIndexError",
        "EpisodeConflictError",
        "EpisodeNotFoundError",
        "EvaluationIncompleteError",
        "InvalidActionError",
        "InvalidArgumentError",
        "InvalidArgumentTypeError",
        "InvalidStepError",
        "JaxRunnerError",
        "MemoryLimitError",
        "MissingDependencyError",
        "RemoteTimeoutError",
        "RunnerFailedError",
        "SpaceMismatchError",
        "TooManyEpisodesError",
        "WorkerError",
        "WorkerTimeoutError",
    ],
    "jaxrunner.models": [
        "GaussianMLP",
        "MLP",
        "NatureCNN",
        "gaussian_mlp_policy",
        "mlp_policy",
        "nature_cnn_policy",
    ],
    "jaxrunner.multi_agent": [
        "AgentCallbacks",
        "AgentGroup",
        "GroupTrajectory",
        "JaxMultiAgentVectorEnv",
        "MultiAgentEvaluationResult",
        "MultiAgentExternalEnv",
        "PolicyMappingFn",
        "build_groups",
        "concatenate_agent_episodes",
        "default_policy_mapping",
        "group_gae",
        "pool_params",
        "pooled_policy",
        "to_gymnasium_space",
    ],
    "jaxrunner.serve": [
        "MultiAgentPolicyClient",
        "PolicyClient",
        "PolicyServer",
        "PolicyServerError",
        "ReportError",
        "ServerConfig",
    ],
    "jaxrunner.testing": [
        "AutoResetWrapper",
        "BraxPoint",
        "BraxState",
        "CallLog",
        "CountingEnv",
        "DictObsEnv",
        "DoneOnlyRandomWalk",
        "Drift",
        "EnvFactory",
        "FaultKind",
        "FaultPlan",
        "FaultSchedule",
        "FaultyEnv",
        "InjectedError",
        "RandomWalk",
        "STEP_ONLY_KINDS",
        "StepCounter",
        "VectorEnvContract",
        "WalkParams",
        "WalkState",
        "assert_trees_equal",
        "break_returns",
        "counting_env_fns",
        "faulty_env_fns",
        "gymnasium_reference",
        "make_counting_env",
    ],
}

# jr.testing's multi-agent utilities load PettingZoo on first use, outside ``__all__``.
TESTING_MULTI_AGENT = [
    "ComingAndGoing",
    "FaultyAECEnv",
    "FaultyMultiAgentEnv",
    "FaultyParallelEnv",
    "MultiAgentVectorEnvContract",
    "Relay",
    "coming_and_going",
    "faulty_multi_agent_env_fns",
    "relay",
    "tictactoe",
]


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_are_pinned(module):
    loaded = importlib.import_module(module)
    assert sorted(loaded.__all__) == PUBLIC[module], (
        f"{module}.__all__ changed: update PUBLIC here and the README's list of renames"
    )
    for name in loaded.__all__:
        getattr(loaded, name)  # every listed name resolves (lazy ones included)


def test_the_top_level_loads_its_names_on_first_use():
    # A Ray actor or process worker imports one backend module: it must not pay for the
    # runner, the services, flax or JAX (jaxrunner/__init__.py loads those on first use,
    # and jaxrunner._src.cpu_dispatch sets its default once JAX loads).
    code = (
        "import sys, jaxrunner._src.backends.ray.env_actor\n"
        "print(sorted(m for m in ('jax', 'flax', 'optax', 'jaxrunner._src.runner', "
        "'jaxrunner._src.services', 'jaxrunner.connectors') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert set(jaxrunner.__all__) <= set(dir(jaxrunner))


def test_testing_multi_agent_names_resolve():
    pytest.importorskip("pettingzoo")
    import jaxrunner.testing

    assert sorted(jaxrunner.testing.MULTI_AGENT_NAMES) == TESTING_MULTI_AGENT
    for name in TESTING_MULTI_AGENT:
        getattr(jaxrunner.testing, name)


def test_every_other_module_is_private():
    root = pathlib.Path(jaxrunner.__file__).parent
    public = {name.removeprefix("jaxrunner.") + ".py" for name in PUBLIC if name != "jaxrunner"}
    public |= {"__init__.py", "__main__.py"}
    outside = {
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if path.relative_to(root).parts[0] != "_src"
    }
    assert outside == public, (
        "a module outside jaxrunner/_src is public: add it to PUBLIC or move it under _src"
    )

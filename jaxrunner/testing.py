"""Test utilities: small deterministic envs (host and pure-JAX), a fault injector, and the
contract test mixin every vector-env backend inherits. Reach it as ``jr.testing``; the
PettingZoo names need the ``multiagent`` extra (without it they raise
``MissingDependencyError``)."""

import importlib
from typing import Any

from jaxrunner._src.testing.assertions import assert_trees_equal
from jaxrunner._src.testing.broken_returns import break_returns
from jaxrunner._src.testing.contract import VectorEnvContract
from jaxrunner._src.testing.envs import (
    CountingEnv,
    DictObsEnv,
    EnvFactory,
    StepCounter,
    counting_env_fns,
    make_counting_env,
)
from jaxrunner._src.testing.fault_plans import (
    STEP_ONLY_KINDS,
    CallLog,
    FaultKind,
    FaultPlan,
    FaultSchedule,
    InjectedError,
)
from jaxrunner._src.testing.faults import FaultyEnv, faulty_env_fns
from jaxrunner._src.testing.jax_envs import (
    AutoResetWrapper,
    BraxPoint,
    BraxState,
    DoneOnlyRandomWalk,
    Drift,
    RandomWalk,
    WalkParams,
    WalkState,
)
from jaxrunner._src.testing.pettingzoo_bases import HAVE_PETTINGZOO
from jaxrunner._src.testing.reference import gymnasium_reference
from jaxrunner.errors import MissingDependencyError

__all__ = [
    "STEP_ONLY_KINDS",
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
]

# Names that need PettingZoo: looked up by ``__getattr__``, which refuses them without it.
MULTI_AGENT_NAMES: dict[str, str] = {
    "ComingAndGoing": "envs",
    "Relay": "envs",
    "coming_and_going": "envs",
    "relay": "envs",
    "tictactoe": "envs",
    "FaultyParallelEnv": "faults",
    "FaultyAECEnv": "faults",
    # Deprecated aliases (docs/changes.md): the one contract and fault injector serve both.
    "FaultyMultiAgentEnv": "faults",
    "faulty_multi_agent_env_fns": "faults",
    "MultiAgentVectorEnvContract": "contract",
}


def __getattr__(name: str) -> Any:
    module = MULTI_AGENT_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'jaxrunner.testing' has no attribute {name!r}")
    if not HAVE_PETTINGZOO:
        raise MissingDependencyError(
            f'jaxrunner.testing.{name} needs PettingZoo: pip install "jaxrunner[multiagent]".'
        )
    value = getattr(importlib.import_module(f"jaxrunner._src.testing.{module}"), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *MULTI_AGENT_NAMES])

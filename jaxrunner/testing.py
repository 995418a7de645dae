"""Test utilities: small deterministic envs, one fault injector, the contract test mixin.

* small envs: :class:`CountingEnv`, :class:`DictObsEnv`, :class:`StepCounter` and
  picklable factories of them;
* faults: :class:`FaultyEnv`, :class:`FaultPlan`, :class:`CallLog`: envs that crash,
  hang, die or break gymnasium's API on purpose;
* the contract: :class:`VectorEnvContract`, the tests every vector-env backend
  inherits, and :func:`assert_trees_equal`;
* small pure-JAX envs (gymnax and brax style): :class:`RandomWalk`,
  :class:`DoneOnlyRandomWalk`, :class:`BraxPoint`.

Multi-agent (PettingZoo, an optional extra: these names import it on first use, so
``import jaxrunner.testing`` works without it; they are not in ``__all__``):

* ``ComingAndGoing`` (agents leave and appear), ``Relay`` (turn-based) and picklable
  factories;
* ``FaultyMultiAgentEnv`` and ``faulty_multi_agent_env_fns``, the same fault
  vocabulary on PettingZoo envs;
* ``MultiAgentVectorEnvContract``, the tests every multi-agent backend inherits,
  against the same envs stepped by hand.

Reach it as ``jr.testing`` after ``import jaxrunner as jr`` (loaded on first use).
"""

import importlib
from typing import Any

from jaxrunner._src.testing.assertions import assert_trees_equal
from jaxrunner._src.testing.broken_returns import break_returns
from jaxrunner._src.testing.contract import VectorEnvContract, gymnasium_reference
from jaxrunner._src.testing.envs import (
    CountingEnv,
    DictObsEnv,
    EnvFactory,
    StepCounter,
    counting_env_fns,
    make_counting_env,
)
from jaxrunner._src.testing.faults import (
    STEP_ONLY_KINDS,
    CallLog,
    FaultKind,
    FaultPlan,
    FaultSchedule,
    FaultyEnv,
    InjectedError,
    faulty_env_fns,
)
from jaxrunner._src.testing.jax_envs import (
    AutoResetWrapper,
    BraxPoint,
    BraxState,
    DoneOnlyRandomWalk,
    RandomWalk,
    WalkParams,
    WalkState,
)
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

# Names whose modules import PettingZoo: loaded by ``__getattr__`` on first use.
MULTI_AGENT_NAMES: dict[str, str] = {
    "ComingAndGoing": "multi_agent_envs",
    "Relay": "multi_agent_envs",
    "coming_and_going": "multi_agent_envs",
    "relay": "multi_agent_envs",
    "tictactoe": "multi_agent_envs",
    "FaultyMultiAgentEnv": "multi_agent_faults",
    "FaultyParallelEnv": "multi_agent_faults",
    "FaultyAECEnv": "multi_agent_faults",
    "faulty_multi_agent_env_fns": "multi_agent_faults",
    "MultiAgentVectorEnvContract": "multi_agent_contract",
}


def __getattr__(name: str) -> Any:
    module = MULTI_AGENT_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'jaxrunner.testing' has no attribute {name!r}")
    try:
        loaded = importlib.import_module(f"jaxrunner._src.testing.{module}")
    except ImportError as err:
        if err.name != "pettingzoo" and not (err.name or "").startswith("pettingzoo."):
            raise
        raise MissingDependencyError(
            f'jaxrunner.testing.{name} needs PettingZoo: pip install "jaxrunner[multiagent]".'
        ) from err
    value = getattr(loaded, name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *MULTI_AGENT_NAMES])

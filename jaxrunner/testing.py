"""Test utilities: small deterministic envs, one fault injector, one contract test mixin.

* small host envs: gymnasium's :class:`CountingEnv`, :class:`DictObsEnv`,
  :class:`StepCounter` and picklable factories of them; PettingZoo's ``ComingAndGoing``
  (agents leave and appear), ``Relay`` (turn-based), ``coming_and_going``, ``relay``,
  ``tictactoe``;
* faults: :class:`FaultyEnv`, :class:`FaultPlan`, :class:`CallLog`: envs of any kind
  that crash, hang, die or break their API on purpose (``FaultyParallelEnv`` and
  ``FaultyAECEnv`` are what ``FaultyEnv`` makes of PettingZoo envs);
* the contract: :class:`VectorEnvContract`, the tests every vector-env backend inherits,
  run once per kind of env it serves (gymnasium, PettingZoo parallel and AEC), and
  :func:`assert_trees_equal`;
* small pure-JAX envs (gymnax, brax and JaxMARL style): :class:`RandomWalk`,
  :class:`DoneOnlyRandomWalk`, :class:`BraxPoint`, :class:`Drift`.

The PettingZoo names need PettingZoo (an optional extra): they are not in ``__all__``, and
without it they raise ``MissingDependencyError`` naming the extra, while the rest works.

Reach it as ``jr.testing`` after ``import jaxrunner as jr`` (loaded on first use).
"""

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

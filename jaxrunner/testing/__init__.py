"""Test utilities: small deterministic envs, one fault injector, the contract test mixin.

* :mod:`~jaxrunner.testing.envs`: :class:`CountingEnv`, :class:`DictObsEnv`,
  :class:`StepCounter` and picklable factories of them;
* :mod:`~jaxrunner.testing.faults`: :class:`FaultyEnv`, :class:`FaultPlan`,
  :class:`CallLog`: envs that crash, hang, die or break gymnasium's API on purpose;
* :mod:`~jaxrunner.testing.contract`: :class:`VectorEnvContract`, the tests every
  vector-env backend inherits, and :func:`assert_trees_equal`;
* :mod:`~jaxrunner.testing.jax_envs`: small pure-JAX envs (gymnax and brax style).

Reach it as ``jr.testing`` after ``import jaxrunner as jr`` (loaded on first use).
"""

from jaxrunner.testing.contract import VectorEnvContract, assert_trees_equal, gymnasium_reference
from jaxrunner.testing.envs import (
    CountingEnv,
    DictObsEnv,
    EnvFactory,
    StepCounter,
    counting_env_fns,
    make_counting_env,
)
from jaxrunner.testing.faults import (
    STEP_ONLY_KINDS,
    CallLog,
    FaultKind,
    FaultPlan,
    FaultyEnv,
    InjectedError,
    faulty_env_fns,
)
from jaxrunner.testing.jax_envs import (
    AutoResetWrapper,
    BraxPoint,
    BraxState,
    DoneOnlyRandomWalk,
    RandomWalk,
    WalkParams,
    WalkState,
)

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
    "FaultyEnv",
    "InjectedError",
    "RandomWalk",
    "StepCounter",
    "VectorEnvContract",
    "WalkParams",
    "WalkState",
    "assert_trees_equal",
    "counting_env_fns",
    "faulty_env_fns",
    "gymnasium_reference",
    "make_counting_env",
]

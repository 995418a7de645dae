"""What gymnasium's API asks of a sub-env, checked where it is first broken: a factory
that returns no env, or an old-gym-API env, gets an error that says how to fix it."""

from __future__ import annotations

import importlib.util
from typing import Any

from jaxrunner._src.space_arrays.checks import _describe
from jaxrunner.errors import InvalidArgumentTypeError, InvalidStepError

OLD_GYM_FIX = (
    "that is the old gym API (before gym 0.26): wrap such an env with "
    "shimmy.GymV21CompatibilityV0 (pip install shimmy) or port it to gymnasium."
)


def check_env(env: Any, index: object) -> Any:
    """``env`` (what sub-env ``index``'s factory returned) if it has ``reset`` and ``step``."""
    if callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None)):
        return env
    raise InvalidArgumentTypeError(
        f"the env factory of sub-env {index} returned {_describe(env)}, not an env (it has "
        "no reset() and step()). Pass zero-argument callables that return a gymnasium.Env, "
        'e.g. lambda: gymnasium.make("CartPole-v1").'
    )


def reset_result(result: Any, index: object) -> tuple[Any, Any]:
    """``(obs, info)`` from what sub-env ``index``'s ``reset()`` returned."""
    if isinstance(result, (tuple, list)) and len(result) == 2:
        return result[0], result[1]
    raise InvalidStepError(
        f"sub-env {index}'s reset() returned {_describe(result)}: expected a tuple "
        f"(obs, info) (gymnasium's API). If it returned the observation alone: {OLD_GYM_FIX}"
    )


def step_result(result: Any, index: object) -> tuple[Any, Any, Any, Any, Any]:
    """``(obs, reward, terminated, truncated, info)`` from what sub-env ``index``'s
    ``step()`` returned (the step loop calls it only when that is not a 5-tuple)."""
    if isinstance(result, (tuple, list)) and len(result) == 5:
        return tuple(result)  # type: ignore[return-value]
    four = isinstance(result, (tuple, list)) and len(result) == 4
    raise InvalidStepError(
        f"sub-env {index}'s step() returned {_describe(result)}: expected a tuple (obs, "
        "reward, terminated, truncated, info) (gymnasium's API). "
        + (f"Four values are (obs, reward, done, info): {OLD_GYM_FIX}" if four else "")
    )


def is_multi_agent_env(env: Any) -> bool:
    """Whether ``env`` is multi-agent (PettingZoo: it declares ``possible_agents``), the
    one test of an env's kind."""
    return hasattr(env, "possible_agents")


# Namespaces of gymnasium ids that a package registers only when imported (gymnasium >= 1.0).
_REGISTERING_PACKAGES = {"ALE": ("ale_py", "ale-py")}


def with_namespace_hint(err: Exception, env_id: str) -> Exception:
    """gymnasium's ``NamespaceNotFound`` for ``env_id``, its message extended with how to
    register the namespace where a known package provides it (same type, so callers that
    catch gymnasium's error still do)."""
    namespace = env_id.split("/", 1)[0] if "/" in env_id else None
    if namespace not in _REGISTERING_PACKAGES:
        return err
    module, dist = _REGISTERING_PACKAGES[namespace]
    if importlib.util.find_spec(module) is None:
        fix = f"{module} is not installed: pip install {dist}."
    else:
        fix = (
            f"{module} is installed but not imported: gymnasium >= 1.0 registers its envs "
            f"only on import. Add `import {module}` and `gymnasium.register_envs({module})` "
            "at the top of your script (before make_vec)."
        )
    return type(err)(f"{err} make_vec({env_id!r}): {fix}")

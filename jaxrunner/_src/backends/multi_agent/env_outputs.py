"""What a PettingZoo env returns, checked: its dicts keyed by agent, each agent's flags
and infos; the errors name the sub-env and the agent."""

from __future__ import annotations

from typing import Any

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.multi_agent.layout import agent_label
from jaxrunner.errors import EnvError, InvalidStepError


def check_infos(infos: Any, index: int, call: str) -> dict[str, Any]:
    """A PettingZoo env's infos: a dict of one dict per agent (gymnasium's rule for
    infos, per agent), or the error that names the sub-env and agent."""
    for agent, info in check_dict(infos, call, "infos", index).items():
        if type(info) is not dict:
            space_arrays.check_info(info, agent_label(index, agent), call)
    return infos


def check_dict(value: Any, call: str, name: str, index: int) -> dict:
    if not isinstance(value, dict):
        raise EnvError(
            f"sub-env {index}: {call}() returned {name} of type {type(value).__name__}; a "
            "PettingZoo env returns a dict keyed by agent id.",
            index,
        )
    return value


def no_flags(env_index: int, agent: str) -> InvalidStepError:
    """The error for an agent whose termination or truncation flag the env left out."""
    return InvalidStepError(
        f"sub-env {agent_label(env_index, agent)}: step() left no termination or truncation "
        "flag for it. A PettingZoo env gives both flags of every agent that acted or acts."
    )


def came_back(env_index: int, agent: str) -> InvalidStepError:
    """The error for an agent that acts again in the episode it left (terminated or
    truncated): its episode has ended, and PettingZoo's API ends it for good."""
    return InvalidStepError(
        f"sub-env {agent_label(env_index, agent)} is back after its episode ended (it was "
        "terminated or truncated earlier in the env's episode). An agent that is done "
        "stays done until the env resets; give a returning agent another agent id."
    )

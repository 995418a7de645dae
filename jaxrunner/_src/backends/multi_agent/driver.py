"""The driver of one PettingZoo sub-env (its API-independent part), and the checks of what
a PettingZoo env returns."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.multi_agent.layout import AgentSlot, Layout, agent_label
from jaxrunner.errors import EnvError, InvalidArgumentError


class Driver(abc.ABC):
    """Steps one sub-env, writing row ``index`` of the buffers."""

    def __init__(self, env: Any, index: int, layout: Layout) -> None:
        self.env, self.index, self.layout = env, index, layout
        self.env_index = layout.offset + index
        """The sub-env's index in its vector env (errors name it)."""
        self._slots: dict[str, AgentSlot] = {}
        self.pending_reward: dict[str, float] = {}
        """Rewards each agent received since its last action (or episode start)."""
        self.acted: set[str] = set()
        """Agents with an action whose transition has not completed yet (AEC)."""
        self.started: set[str] = set()
        """Agents that acted in the current episode."""

    @abc.abstractmethod
    def reset(self, seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
        """Resets the env and writes who acts first; returns the reset infos."""

    @abc.abstractmethod
    def step(self, actions: Sequence[Any]) -> tuple[bool, float, float, dict[str, Any]]:
        """Steps the env with the acting agents' actions (``actions[g]`` is group
        ``g``'s ``[B, A_g, ...]`` batch); returns ``(env_done, env_reward,
        unassigned_reward, infos)``. Where the episode ended (``env_done``) the caller
        resets the env next (:meth:`reset`: SAME_STEP). The caller has cleared the
        row's masks and outcomes (:meth:`AgentBlock.step_rows` clears every row at once)."""

    # -- state, for snapshots ---------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """What the driver carries between steps besides the env (plain values, for a
        pickle next to the env's): each agent's pending reward, who acted and who
        started in the current episode."""
        return {
            "pending_reward": dict(self.pending_reward),
            "acted": sorted(self.acted),
            "started": sorted(self.started),
        }

    def set_state(self, state: Any) -> None:
        """Takes a :meth:`get_state` (of a driver of the same kind) as its own."""
        keys = set(self.get_state())
        if not isinstance(state, dict) or set(state) != keys:
            raise InvalidArgumentError(
                f"sub-env {self.env_index}: a {type(self).__name__} state must be a dict of "
                f"the keys {sorted(keys)}, got {type(state).__name__}"
                f"{sorted(map(str, state)) if isinstance(state, dict) else ''}."
            )
        agents = set(self.layout.slot)
        rewards = state["pending_reward"]
        if not isinstance(rewards, dict) or not all(
            a in agents and isinstance(r, float) and np.isfinite(r) for a, r in rewards.items()
        ):
            raise self._bad_state("pending_reward", "a dict agent id -> finite float")
        for field in ("acted", "started"):
            if not isinstance(state[field], list) or not set(state[field]) <= agents:
                raise self._bad_state(field, "a list of agent ids")
        self.pending_reward = dict(rewards)
        self.acted, self.started = set(state["acted"]), set(state["started"])

    def _bad_state(self, field: str, expected: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"sub-env {self.env_index}: the driver state's {field} is not {expected} of "
            f"possible_agents {list(self.layout.slot)}."
        )

    # -- shared bookkeeping -----------------------------------------------------------

    def _clear_rows(self) -> None:
        for buf in self.layout.buffers:
            buf.acting[self.index] = False
            buf.agent_start[self.index] = False

    def _begin_episode(self) -> None:
        self._clear_rows()
        self.pending_reward.clear()
        self.acted.clear()
        self.started.clear()

    def _slot(self, agent: str) -> AgentSlot:
        slot = self._slots.get(agent)
        if slot is None:
            slot = self._slots[agent] = AgentSlot(self.layout, agent, self.index)
        return slot

    def _set_acting(self, agent: str, obs: Any) -> AgentSlot:
        slot = self._slot(agent)
        slot.write_obs(slot.row, obs)
        self.layout.obs_apart = True
        slot.acting[slot.a] = True
        slot.start[slot.a] = agent not in self.started
        return slot

    def _add_reward(self, agent: str, reward: Any) -> float:
        if type(reward) is float and reward - reward == 0.0:  # a finite float: fast path
            value = reward
        else:
            value = space_arrays.check_reward(reward, agent_label(self.env_index, agent))
        pending = self.pending_reward
        pending[agent] = pending.get(agent, 0.0) + value
        return value

    def _complete(self, agent: str, next_obs: Any, terminated: bool, truncated: bool) -> None:
        """Writes the outcome of ``agent``'s last action."""
        slot = self._slot(agent)
        a = slot.a
        slot.write_next(slot.row, next_obs)
        slot.completed[a] = True
        slot.reward[a] = self.pending_reward.pop(agent, 0.0)
        slot.terminated[a] = terminated
        slot.truncated[a] = truncated
        self.acted.discard(agent)

    def _action(self, actions: Sequence[Any], agent: str) -> Any:
        slot = self._slot(agent)
        return actions[slot.g][self.index, slot.a]

    def _unassigned(self) -> float:
        """At the end of an episode, once every action's transition has completed: the
        rewards no transition carries (see :mod:`.drivers`)."""
        return float(sum(self.pending_reward.values()))


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

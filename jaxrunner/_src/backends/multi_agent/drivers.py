"""Stepping one PettingZoo sub-env (parallel or AEC) into row ``b`` of the group buffers,
for every multi-agent backend: the API-independent :class:`Driver`, its two APIs, and
the checks of what a PettingZoo env returns. See docs/multi-agent.md."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.multi_agent.env_outputs import (
    came_back,
    check_dict,
    check_infos,
    no_flags,
)
from jaxrunner._src.backends.multi_agent.layout import AgentSlot, Layout, agent_label, unknown_agent
from jaxrunner.errors import EnvError, InvalidArgumentError, InvalidStepError


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
        """Steps the env with the acting agents' actions (``actions[g]`` is group ``g``'s
        ``[B, A_g, ...]`` batch) into a row the caller cleared; returns ``(env_done,
        env_reward, unassigned_reward, infos)`` (the caller resets an ended env next)."""

    def get_state(self) -> dict[str, Any]:
        """What the driver carries between steps besides the env, as plain values."""
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

    def _begin_episode(self) -> None:
        for buf in self.layout.buffers:
            buf.acting[self.index] = False
            buf.agent_start[self.index] = False
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

    def _unassigned(self) -> float:
        """At the end of an episode, once every action's transition has completed: the
        rewards no transition carries (``MultiAgentStep.unassigned_reward``)."""
        return float(sum(self.pending_reward.values()))


class ParallelDriver(Driver):
    """A PettingZoo ``ParallelEnv`` (every live agent acts; see docs/multi-agent.md)."""

    def __init__(self, env: Any, index: int, layout: Layout) -> None:
        super().__init__(env, index, layout)
        self.live: list[tuple[str, AgentSlot]] = []
        """The agents that act at the next step, with their slots."""
        self._newcomers = False
        """Some of ``live`` act for the first time in the episode."""

    def get_state(self) -> dict[str, Any]:
        """:meth:`Driver.get_state` plus who acts next (``live``) and whether some of
        them act for the first time in the episode (``newcomers``)."""
        return {
            **super().get_state(),
            "live": [agent for agent, _ in self.live],
            "newcomers": self._newcomers,
        }

    def set_state(self, state: Any) -> None:
        super().set_state(state)
        live = state["live"]
        if not isinstance(live, list) or not set(live) <= set(self.layout.slot):
            raise self._bad_state("live", "a list of agent ids")
        if not isinstance(state["newcomers"], bool):
            raise self._bad_state("newcomers", "a bool, of agents")
        self.live = [(agent, self._slot(agent)) for agent in live]
        self._newcomers = state["newcomers"]

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
        obs, infos = self.env.reset(seed=seed, options=options)
        self._begin_episode()
        self.live = [
            (agent, self._set_acting(agent, obs[agent]))
            for agent in check_dict(obs, "reset", "observations", self.env_index)
        ]
        self._newcomers = True
        check_infos(infos, self.env_index, "reset")
        if not self.live:
            raise EnvError(
                f"sub-env {self.env_index}: reset() returned no observation; a multi-agent env "
                "must start an episode with at least one agent.",
                self.env_index,
            )
        return infos

    def step(self, actions: Sequence[Any]) -> tuple[bool, float, float, dict[str, Any]]:
        # The hot loop of the host backends: per agent, dict look-ups and writes through
        # the slots resolved once; the checks' slow paths only for unusual values.
        live, b, i = self.live, self.index, self.env_index
        obs, rewards, terms, truncs, infos = self.env.step(
            {agent: actions[slot.g][b, slot.a] for agent, slot in live}
        )
        if not (
            isinstance(obs, dict)
            and isinstance(rewards, dict)
            and isinstance(terms, dict)
            and isinstance(truncs, dict)
        ):
            for name, value in (
                ("observations", obs),
                ("rewards", rewards),
                ("terminations", terms),
                ("truncations", truncs),
            ):
                check_dict(value, "step", name, i)
        if self._newcomers:
            self.started.update(agent for agent, _ in live)
            self._newcomers = False
        env_reward, pending, slots = 0.0, self.pending_reward, self.layout.slot
        for agent, r in rewards.items():
            if type(r) is not float or r - r != 0.0:  # not a finite float: check it
                r = space_arrays.check_reward(r, agent_label(i, agent))
            if agent not in slots:  # (its reward would count as unassigned)
                raise unknown_agent(self.layout, i, agent)
            pending[agent] = pending.get(agent, 0.0) + r
            env_reward += r
        # The buffers hold every acting agent as completed and still acting
        # (GroupBuffers.clear_step); only who stops acting is written.
        next_live = []
        for agent, slot in live:
            try:
                next_obs = obs[agent]
            except KeyError:
                raise EnvError(
                    f"sub-env {i}: agent {agent!r} acted but step() returned no observation "
                    "for it. A ParallelEnv must return the observation, reward and flags of "
                    "every agent that acted (its final observation where it leaves).",
                    i,
                ) from None
            if agent not in rewards:
                raise InvalidStepError(
                    f"sub-env {agent_label(i, agent)} acted but step() returned no reward for "
                    "it. A ParallelEnv must return the reward of every agent that acted "
                    "(0.0 where it gets none)."
                )
            try:  # (not read as False: it would act on)
                term, trunc = terms[agent], truncs[agent]
            except KeyError:
                raise no_flags(i, agent) from None
            if type(term) is not bool:
                term = space_arrays.check_flag(term, agent_label(i, agent), "terminated")
            if type(trunc) is not bool:
                trunc = space_arrays.check_flag(trunc, agent_label(i, agent), "truncated")
            a, row = slot.a, slot.row
            slot.write_next(row, next_obs)
            slot.reward[a] = pending.pop(agent, 0.0)
            if term or trunc:  # the buffers' flags were cleared before the step
                slot.terminated[a], slot.truncated[a] = term, trunc
                slot.acting[a] = False
            else:  # it acts next, on the observation just checked
                if slot.obs_rows is not None:
                    slot.obs_rows[row] = next_obs
                else:
                    slot.write_obs(row, next_obs)
                next_live.append((agent, slot))
        if len(obs) > len(live):  # agents that appeared (every one that acted is in obs)
            acted = {agent for agent, _ in live}
            for agent in obs:
                if agent not in acted and not (terms.get(agent, False) or truncs.get(agent, False)):
                    if agent in self.started:  # it acted in the episode, and left
                        raise came_back(i, agent)
                    next_live.append((agent, self._set_acting(agent, obs[agent])))
                    self._newcomers = True
        self.live = next_live
        check_infos(infos, i, "step")
        if next_live:
            return False, env_reward, 0.0, infos
        return True, env_reward, self._unassigned(), infos


class AECDriver(Driver):
    """A PettingZoo ``AECEnv`` (one agent acts per turn; see docs/multi-agent.md)."""

    def __init__(self, env: Any, index: int, layout: Layout) -> None:
        super().__init__(env, index, layout)
        self._last_obs: dict[str, Any] = {}  # each agent's latest observation
        # The infos of agents whose dead step removed them (with their infos) in this
        # call: their final transition's info, as env.last() gives it at that turn.
        self._final_infos: dict[str, Any] = {}

    def get_state(self) -> dict[str, Any]:
        """:meth:`Driver.get_state` plus each agent's latest observation (``last_obs``:
        an agent the env removes without its dead step ends on it)."""
        return {**super().get_state(), "last_obs": dict(self._last_obs)}

    def set_state(self, state: Any) -> None:
        super().set_state(state)
        last_obs = state["last_obs"]
        if not isinstance(last_obs, dict) or not set(last_obs) <= set(self.layout.slot):
            raise self._bad_state("last_obs", "a dict agent id -> observation")
        self._last_obs = dict(last_obs)

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
        self.env.reset(seed=seed, options=options)
        self._begin_episode()
        self._last_obs.clear()
        self._final_infos.clear()
        self._settle()
        if not self.env.agents:
            raise EnvError(
                f"sub-env {self.env_index}: reset() left no agent to act; a multi-agent env "
                "must start an episode with at least one agent.",
                self.env_index,
            )
        return dict(check_infos(self.env.infos, self.env_index, "reset"))

    def step(self, actions: Sequence[Any]) -> tuple[bool, float, float, dict[str, Any]]:
        env = self.env
        agent = env.agent_selection
        self.acted.add(agent)
        self.started.add(agent)
        self._final_infos.clear()
        slot = self._slot(agent)
        env.step(actions[slot.g][self.index, slot.a])
        env_reward = self._collect_rewards()
        env_reward += self._settle()
        infos = {**self._final_infos, **check_dict(env.infos, "step", "infos", self.env_index)}
        infos = check_infos(infos, self.env_index, "step")
        if env.agents:
            return False, env_reward, 0.0, infos
        # Agents the env removed without their dead step: their episode was cut with
        # the env's (truncated), from the last observation the env gave them.
        for agent in list(self.acted):
            self._complete(agent, self._last_obs[agent], False, True)
        return True, env_reward, self._unassigned(), infos

    def _collect_rewards(self) -> float:
        """Adds each agent's reward to its pending one; returns their sum."""
        total, pending, i, slots = 0.0, self.pending_reward, self.env_index, self.layout.slot
        for agent, r in check_dict(self.env.rewards, "step", "rewards", i).items():
            if type(r) is not float or r - r != 0.0:  # not a finite float: check it
                r = space_arrays.check_reward(r, agent_label(i, agent))
            if agent not in slots:
                raise unknown_agent(self.layout, i, agent)
            pending[agent] = pending.get(agent, 0.0) + r
            total += r
        return total

    def _settle(self) -> float:
        """Completes what the env's new state decides: dead agents' transitions (and
        their ``step(None)``), then the selected agent's previous turn; marks who acts.
        Returns the rewards handed out by the dead steps."""
        env, i = self.env, self.env_index
        reward = 0.0
        while env.agents:
            agent = env.agent_selection
            if agent not in self.layout.slot:
                raise unknown_agent(self.layout, i, agent)
            try:
                term = check_dict(env.terminations, "step", "terminations", i)[agent]
                trunc = check_dict(env.truncations, "step", "truncations", i)[agent]
            except KeyError:
                raise no_flags(i, agent) from None
            term = space_arrays.check_flag(term, agent_label(i, agent), "terminated")
            trunc = space_arrays.check_flag(trunc, agent_label(i, agent), "truncated")
            if not (term or trunc):
                break
            if agent in self.acted:
                self._complete(agent, env.observe(agent), term, trunc)
                self._final_infos[agent] = env.infos.get(agent, {})
            self._last_obs.pop(agent, None)
            env.step(None)
            reward += self._collect_rewards()
        if env.agents:
            agent = env.agent_selection
            obs = env.observe(agent)
            if agent in self.acted:
                self._complete(agent, obs, False, False)
            elif agent in self.started:  # its final transition has completed
                raise came_back(i, agent)
            self._last_obs[agent] = obs
            self._set_acting(agent, obs)
        return reward


def make_driver(env: Any, index: int, layout: Layout) -> Driver:
    """The driver for ``env``'s API: parallel if it has ``agents`` and a ``step`` taking
    a dict (PettingZoo ``ParallelEnv``), AEC if it has ``agent_selection``."""
    from pettingzoo.utils.env import AECEnv, ParallelEnv

    if isinstance(env, ParallelEnv):
        return ParallelDriver(env, index, layout)
    if isinstance(env, AECEnv):
        return AECDriver(env, index, layout)
    raise InvalidArgumentError(
        f"multi-agent sub-env {index}: expected a PettingZoo ParallelEnv or AECEnv, got "
        f"{type(env).__name__}. Wrap other envs as one of these."
    )

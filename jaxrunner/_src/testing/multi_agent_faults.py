"""Fault injection for PettingZoo envs: the :class:`~.faults.FaultPlan` kinds and call
numbering of :class:`~.faults.FaultyEnv`, applied to one agent's returns. It imports
PettingZoo (optional), so ``jaxrunner.testing`` loads it only on first use."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.wrappers import BaseParallelWrapper, BaseWrapper

from jaxrunner._src.testing.broken_returns import break_returns
from jaxrunner._src.testing.faults import (
    CallLog,
    FaultPlan,
    FaultSchedule,
    faulty_factories,
)
from jaxrunner.errors import InvalidArgumentTypeError


class FaultyMultiAgentEnv:
    """Wraps a PettingZoo env and injects ``faults``; counts calls in ``log`` if given.

    ``FaultyMultiAgentEnv(env, ...)`` returns a :class:`FaultyParallelEnv` for a
    ``ParallelEnv`` and a :class:`FaultyAECEnv` for an ``AECEnv`` (both are
    ``FaultyMultiAgentEnv``\\ s, and the PettingZoo API they wrap).

    Calls misbehave as :class:`~jaxrunner._src.testing.faults.FaultyEnv`'s do: the first of
    ``faults`` whose ``call`` it is and that is due (its 1-based number, counted per env
    instance, is in ``at``, or the probability draw hit). Faults that never return
    (``raise``, ``hang``, ``exit``, ``kill``, ``segfault``) happen before the inner env
    is called; garbage faults call it, then break one agent's returns as
    :func:`~jaxrunner._src.testing.broken_returns.break_returns` says (its observation, reward,
    ``terminated`` flag or info). That agent is ``agent`` if it is among the agents the
    call returns, else the first of them (parallel: the first key of the returned
    observations; AEC: the agent selected after the call, whose observation, flags and
    rewards a driver reads next).

    An AEC env's dead steps (``step(None)`` for an agent that left) are calls of
    ``step`` too, numbered with the others.

    Events logged (as :class:`~jaxrunner._src.testing.faults.FaultyEnv`'s): ``step_ok``,
    ``step_failed``, ``reset_ok``, ``reset_failed`` and ``made``.

    Args:
        env: the PettingZoo env to wrap.
        faults: what goes wrong and when.
        log: optional cross-process counter.
        seed: seeds the draws of probabilistic faults (see
            :class:`~jaxrunner._src.testing.faults.FaultSchedule`).
        agent: whose returns garbage faults break (None: the first agent returned).

    Raises:
        InvalidArgumentTypeError: ``env`` is neither a ``ParallelEnv`` nor an ``AECEnv``.
    """

    env: Any
    schedule: FaultSchedule
    agent: str | None

    def __new__(cls, env: Any = None, *args: Any, **kwargs: Any) -> FaultyMultiAgentEnv:
        # ``env`` has a default: unpickling calls ``cls.__new__(cls)`` on the subclass.
        kind: type[FaultyMultiAgentEnv] = cls
        if cls is FaultyMultiAgentEnv:  # pick the wrapper for env's API (as pathlib.Path)
            if isinstance(env, ParallelEnv):
                kind = FaultyParallelEnv
            elif isinstance(env, AECEnv):
                kind = FaultyAECEnv
            else:
                raise InvalidArgumentTypeError(
                    f"FaultyMultiAgentEnv(env=...): expected a PettingZoo ParallelEnv or "
                    f"AECEnv, got {type(env).__name__}. Wrap gymnasium envs with "
                    "jaxrunner.testing.FaultyEnv."
                )
        # Typeshed's object.__new__ takes type[Self]; handing it a subclass is the point.
        return super().__new__(kind)  # type: ignore[arg-type]

    def _init_faults(
        self,
        faults: Sequence[FaultPlan],
        log: CallLog | None,
        seed: int,
        agent: str | None,
    ) -> None:
        self.schedule = FaultSchedule(faults, log, seed, type(self).__name__)
        self.faults, self.log, self.agent = self.schedule.faults, log, agent
        self.calls = self.schedule.calls
        """How many times each method was called (failed calls included)."""


class FaultyParallelEnv(FaultyMultiAgentEnv, BaseParallelWrapper):
    """:class:`FaultyMultiAgentEnv` for a PettingZoo ``ParallelEnv``."""

    def __init__(
        self,
        env: ParallelEnv,
        faults: Sequence[FaultPlan] = (),
        log: CallLog | None = None,
        seed: int = 0,
        agent: str | None = None,
    ) -> None:
        BaseParallelWrapper.__init__(self, env)
        self._init_faults(faults, log, seed, agent)

    def _target(self, agents: Iterable[str]) -> str | None:
        """The agent whose returns a garbage fault breaks (None: no agent returned)."""
        agents = list(agents)
        if self.agent in agents:
            return self.agent
        return agents[0] if agents else None

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        fault = self.schedule.due("reset")
        obs, infos = self.env.reset(seed=seed, options=options)
        if fault is None:
            self.schedule.ok("reset")
            return obs, infos
        agent = self._target(obs)
        if agent is not None:
            obs, infos = dict(obs), dict(infos)
            obs[agent], _, _, infos[agent] = break_returns(
                fault.kind, obs[agent], 0.0, False, infos.get(agent, {})
            )
        return obs, infos

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        fault = self.schedule.due("step")
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        if fault is None:
            self.schedule.ok("step")
            return obs, rewards, terms, truncs, infos
        agent = self._target(obs)
        if agent is not None:
            obs, rewards, terms, infos = dict(obs), dict(rewards), dict(terms), dict(infos)
            obs[agent], rewards[agent], terms[agent], infos[agent] = break_returns(
                fault.kind,
                obs[agent],
                rewards.get(agent, 0.0),
                terms.get(agent, False),
                infos.get(agent, {}),
            )
        return obs, rewards, terms, truncs, infos


class FaultyAECEnv(FaultyMultiAgentEnv, BaseWrapper):
    """:class:`FaultyMultiAgentEnv` for a PettingZoo ``AECEnv``.

    An AEC env's returns are its state (``observe``, ``rewards``, ``terminations``,
    ``infos``): after a garbage fault they read broken for the target agent until the
    next ``step`` or ``reset``; the inner env's own state is never changed.
    """

    def __init__(
        self,
        env: AECEnv,
        faults: Sequence[FaultPlan] = (),
        log: CallLog | None = None,
        seed: int = 0,
        agent: str | None = None,
    ) -> None:
        BaseWrapper.__init__(self, env)
        self._init_faults(faults, log, seed, agent)
        self._broken: tuple[str, tuple[Any, Any, Any, Any], Any] | None = None
        """Until the next call: the target agent, its broken (obs, reward, terminated,
        info), and its broken reward since its last turn (what ``last()`` reads)."""

    def _call(self, call: str, inner: Callable[[], None]) -> None:
        self._broken = None
        fault = self.schedule.due(call)
        inner()
        if fault is None:
            self.schedule.ok(call)
            return
        env = self.env
        if self.agent is not None and self.agent in env.agents:
            agent = self.agent
        elif env.agents:
            agent = env.agent_selection
        else:  # the episode ended: an agent paid last
            agent = next(iter(env.rewards), None)
            if agent is None:
                return
        obs, term, info = (
            env.observe(agent),
            env.terminations.get(agent, False),
            env.infos.get(agent, {}),
        )
        broken = break_returns(fault.kind, obs, env.rewards.get(agent, 0.0), term, info)
        # last() reads the reward since the agent's last turn: broken alike.
        cumulative = env._cumulative_rewards.get(agent, 0.0)
        self._broken = agent, broken, break_returns(fault.kind, obs, cumulative, term, info)[1]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self._call("reset", lambda: self.env.reset(seed=seed, options=options))

    def step(self, action: Any) -> None:
        self._call("step", lambda: self.env.step(action))

    def _read(self, field: int, values: Mapping[str, Any]) -> dict[str, Any]:
        if self._broken is None:
            return values  # type: ignore[return-value]
        agent, broken, _ = self._broken
        return {**values, agent: broken[field]}

    def observe(self, agent: str) -> Any:
        if self._broken is not None and self._broken[0] == agent:
            return self._broken[1][0]
        return self.env.observe(agent)

    @property
    def rewards(self) -> dict[str, Any]:  # type: ignore[override]
        return self._read(1, self.env.rewards)

    @property
    def terminations(self) -> dict[str, Any]:  # type: ignore[override]
        return self._read(2, self.env.terminations)

    @property
    def infos(self) -> dict[str, Any]:  # type: ignore[override]
        return self._read(3, self.env.infos)

    def last(self, observe: bool = True) -> tuple[Any, Any, Any, Any, Any]:
        agent = self.env.agent_selection
        if self._broken is None or self._broken[0] != agent:
            return self.env.last(observe)
        _, (obs, _, term, info), cumulative = self._broken
        return obs if observe else None, cumulative, term, self.env.truncations[agent], info


def _make_faulty_multi_agent(
    base: Callable[[], Any],
    faults: tuple[FaultPlan, ...],
    log: CallLog | None,
    seed: int,
    agent: str | None = None,
) -> FaultyMultiAgentEnv:
    return FaultyMultiAgentEnv(base(), faults, log, seed, agent)


def faulty_multi_agent_env_fns(
    base: Callable[[], Any] | Sequence[Callable[[], Any]],
    num_envs: int | None = None,
    faults: Sequence[FaultPlan] | Mapping[int, Sequence[FaultPlan]] = (),
    log: CallLog | None = None,
    seed: int = 0,
    agent: str | None = None,
) -> list[Callable[[], FaultyMultiAgentEnv]]:
    """Picklable factories of :class:`FaultyMultiAgentEnv`, one per sub-env (the
    multi-agent twin of :func:`~jaxrunner._src.testing.faults.faulty_env_fns`).

    Args:
        base: a picklable zero-argument factory of a PettingZoo env (e.g.
            :func:`~jaxrunner._src.testing.multi_agent_envs.coming_and_going`) used for every
            sub-env, or a sequence of them, one per sub-env.
        num_envs: how many factories; ``None`` (only with a sequence ``base``) for
            ``len(base)``.
        faults: the same faults for every env, or a mapping ``{env index: faults}``
            (envs not in it behave).
        log: optional cross-process counter shared by all of them.
        seed: seeds probabilistic faults (mixed with the env index).
        agent: whose returns garbage faults break (None: the first agent returned; see
            :class:`FaultyMultiAgentEnv`).

    Raises:
        InvalidArgumentError: ``num_envs`` is missing for a single ``base``, or differs
            from the length of a sequence ``base``.
    """
    wrap = functools.partial(_make_faulty_multi_agent, agent=agent)
    return faulty_factories(wrap, base, num_envs, faults, log, seed, "faulty_multi_agent_env_fns")

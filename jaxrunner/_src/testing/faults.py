"""Fault injection: envs of every kind (gymnasium, PettingZoo parallel and AEC) that crash,
hang, die or break their API on purpose, as a :class:`~.fault_plans.FaultPlan` says."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium

from jaxrunner._src.arg_checks import check_int, is_int
from jaxrunner._src.testing.broken_returns import break_returns
from jaxrunner._src.testing.fault_plans import (
    CallLog,
    FaultPlan,
    FaultSchedule,
    check_log_and_seed,
    check_plans,
)
from jaxrunner._src.testing.pettingzoo_bases import (
    HAVE_PETTINGZOO,
    AECEnv,
    BaseParallelWrapper,
    BaseWrapper,
    ParallelEnv,
)
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


class _Faulty:
    """What the wrappers of :class:`FaultyEnv` (of every kind) share."""

    env: Any

    def __init__(
        self,
        env: Any,
        faults: Sequence[FaultPlan] = (),
        log: CallLog | None = None,
        seed: int = 0,
        agent: str | None = None,
        *,
        _run: str | None = None,
    ) -> None:
        one_agent = isinstance(self, gymnasium.Env)
        if one_agent and agent is not None:
            raise InvalidArgumentError(
                f"FaultyEnv(agent={agent!r}): a gymnasium env has one agent; pass agent=None."
            )
        super().__init__(env)  # type: ignore[call-arg]  # the gymnasium or PettingZoo wrapper's
        self.schedule = FaultSchedule(faults, log, seed, type(self).__name__, _run)
        self.faults, self.log = self.schedule.faults, log
        self.calls = self.schedule.calls
        """How many times each method was called (failed calls included)."""
        if not one_agent:  # (a gymnasium env's get_attr("agent") still reaches the env)
            self.agent = agent

    def _run(self, call: str, inner: Callable[[], Any]) -> tuple[FaultPlan | None, Any]:
        """``inner()`` as the schedule says: the garbage fault due (None: it behaved, and is
        logged so) and what ``inner`` returned."""
        fault = self.schedule.due(call)
        out = inner()
        if fault is None:
            self.schedule.ok(call)
        return fault, out

    _break = staticmethod(break_returns)  # one agent's returns (FaultyParallelEnv: of which)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        fault, (obs, info) = self._run("reset", lambda: self.env.reset(seed=seed, options=options))
        if fault is not None:  # reset faults break no rewards or flags
            obs, _, _, info = self._break(fault.kind, obs, {}, {}, info)
        return obs, info

    def step(self, action: Any) -> Any:
        fault, (obs, reward, terminated, truncated, info) = self._run(
            "step", lambda: self.env.step(action)
        )
        if fault is not None:
            obs, reward, terminated, info = self._break(fault.kind, obs, reward, terminated, info)
        return obs, reward, terminated, truncated, info


class FaultyEnv(_Faulty, gymnasium.Wrapper):
    """Wraps an env of any kind and injects ``faults``; counts calls in ``log`` if given.

    A PettingZoo ``ParallelEnv`` is wrapped in a :class:`FaultyParallelEnv`, an ``AECEnv``
    in a :class:`FaultyAECEnv`. Calls misbehave as :class:`FaultSchedule` says; others pass
    through. Garbage faults break what the inner env returned (for a multi-agent env, one
    agent's returns). Events logged: ``step_ok``, ``step_failed`` (hangs and deaths logged
    before they happen), ``reset_ok``, ``reset_failed`` and ``made`` (instances).

    Args:
        env: the env to wrap.
        faults: what goes wrong and when.
        log: optional cross-process counter.
        seed: seeds the draws of probabilistic faults (see :class:`FaultSchedule`).
        agent: a multi-agent env's agent whose returns garbage faults break (None: the
            first agent returned); must be None for a gymnasium env.

    Raises:
        InvalidArgumentTypeError: ``env`` is neither a gymnasium env nor a PettingZoo
            ``ParallelEnv`` or ``AECEnv``.
    """

    def __new__(cls, env: Any = None, *args: Any, **kwargs: Any) -> Any:
        # ``env`` has a default: unpickling calls ``cls.__new__(cls)``.
        if cls is not FaultyEnv or env is None or isinstance(env, gymnasium.Env):
            return super().__new__(cls)
        if HAVE_PETTINGZOO and isinstance(env, ParallelEnv):
            return FaultyParallelEnv(env, *args, **kwargs)
        if HAVE_PETTINGZOO and isinstance(env, AECEnv):
            return FaultyAECEnv(env, *args, **kwargs)
        raise InvalidArgumentTypeError(
            f"FaultyEnv(env=...): expected a gymnasium Env or a PettingZoo ParallelEnv or "
            f"AECEnv, got {type(env).__name__}."
        )


class FaultyParallelEnv(_Faulty, BaseParallelWrapper):
    """:class:`FaultyEnv` for a PettingZoo ``ParallelEnv``: a garbage fault breaks the
    returns of ``agent`` if returned, else of the first key of the returned observations."""

    def _break(
        self, kind: str, obs: Any, rewards: Any, terms: Any, infos: Any
    ) -> tuple[Any, Any, Any, Any]:
        """The returns with the target agent's broken by a fault of ``kind`` (copies)."""
        if not obs:
            return obs, rewards, terms, infos
        agent = self.agent if self.agent in obs else next(iter(obs))
        obs, rewards, terms, infos = dict(obs), dict(rewards), dict(terms), dict(infos)
        obs[agent], rewards[agent], terms[agent], infos[agent] = break_returns(
            kind,
            obs[agent],
            rewards.get(agent, 0.0),
            terms.get(agent, False),
            infos.get(agent, {}),
        )
        return obs, rewards, terms, infos


class FaultyAECEnv(_Faulty, BaseWrapper):
    """:class:`FaultyEnv` for a PettingZoo ``AECEnv``: a garbage fault breaks the returns
    of ``agent`` if live, else of the agent selected after the call, else of an agent paid
    last. They read broken (``observe``, ``rewards``, ``terminations``, ``infos``,
    ``last``) until the next ``step`` or ``reset``; the inner env is never changed. Dead
    steps are calls of ``step`` too.
    """

    _broken: tuple[str, tuple[Any, Any, Any, Any], Any] | None = None
    """Until the next call: the agent, its broken (obs, reward, terminated, info), and its
    broken reward since its last turn (``last()``'s)."""

    def _call(self, call: str, inner: Callable[[], None]) -> None:
        self._broken = None
        fault, _ = self._run(call, inner)
        if fault is None:
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


def _make_faulty(
    base: Callable[[], Any],
    faults: tuple[FaultPlan, ...],
    log: CallLog | None,
    seed: int,
    agent: str | None = None,
    run: str | None = None,
) -> Any:
    return FaultyEnv(base(), faults, log, seed, agent, _run=run)


def faulty_env_fns(
    base: Callable[[], Any] | Sequence[Callable[[], Any]],
    num_envs: int | None = None,
    faults: Sequence[FaultPlan] | Mapping[int, Sequence[FaultPlan]] = (),
    log: CallLog | None = None,
    seed: int = 0,
    agent: str | None = None,
) -> list[Callable[[], Any]]:
    """Picklable factories of :class:`FaultyEnv` (of any kind of env), one per sub-env.

    Args:
        base: a picklable zero-argument env factory (e.g. ``functools.partial(
            gymnasium.make, "CartPole-v1")``, or a PettingZoo env's) used for every
            sub-env, or a sequence of them, one per sub-env.
        num_envs: how many factories; ``None`` (only with a sequence ``base``) for
            ``len(base)``.
        faults: the same faults for every env, or a mapping ``{env index: faults}``
            (envs not in it behave).
        log: optional cross-process counter shared by all of them.
        seed: seeds probabilistic faults (mixed with the env index).
        agent: a multi-agent env's agent whose returns garbage faults break (see
            :class:`FaultyEnv`).

    Raises:
        InvalidArgumentError: ``num_envs`` is missing for a single ``base``, or differs
            from the length of a sequence ``base``.
    """
    check_log_and_seed("faulty_env_fns", log, seed)
    if num_envs is not None:
        check_int("faulty_env_fns", "num_envs", num_envs)
    if callable(base):
        if num_envs is None:
            raise InvalidArgumentError(
                "faulty_env_fns(num_envs=None): expected how many envs to make from one base "
                "factory; pass num_envs, or a sequence of factories as base."
            )
        bases = [base] * num_envs
    elif isinstance(base, Sequence) and not isinstance(base, str):
        bases = list(base)
        if num_envs is not None and num_envs != len(bases):
            raise InvalidArgumentError(
                f"faulty_env_fns(num_envs={num_envs}): expected {len(bases)}, the number of "
                "factories in base (or None)."
            )
    else:
        raise InvalidArgumentTypeError(
            f"faulty_env_fns(base={base!r:.60}): expected a zero-argument env factory, or a "
            "list of them (one per sub-env)."
        )
    per_env = faults if isinstance(faults, Mapping) else dict.fromkeys(range(len(bases)), faults)
    # A fault for an env that is not there would never fire.
    stray = next((i for i in per_env if not is_int(i, 0, len(bases) - 1)), None)
    if stray is not None:
        raise InvalidArgumentError(
            f"faulty_env_fns(faults={{{stray!r:.40}: ...}}): expected env indices 0 to "
            f"{len(bases) - 1}, one of the {len(bases)} envs."
        )
    per_env = {i: check_plans("faulty_env_fns", plans) for i, plans in per_env.items()}
    run = uuid.uuid4().hex  # numbers this call's instances from 0 (without a log)
    return [
        functools.partial(_make_faulty, fn, per_env.get(i, ()), log, seed * 100_003 + i, agent, run)
        for i, fn in enumerate(bases)
    ]


FaultyMultiAgentEnv = FaultyEnv
"""Deprecated: :class:`FaultyEnv` wraps PettingZoo envs too."""
faulty_multi_agent_env_fns = faulty_env_fns
"""Deprecated: :func:`faulty_env_fns` makes PettingZoo envs' factories too."""

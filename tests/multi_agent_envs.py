"""PettingZoo envs for the multi-agent tests (module-level: picklable factories).

The small ones every backend is tested on are public, in
:mod:`jaxrunner._src.testing.envs`; this module adds the tests' own: MPE and classic
envs, the contract's cases on them, and one that returns what the backends must refuse
(:class:`BadOutputs`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from jaxrunner._src.testing.envs import (  # (re-exported for the tests)
    ComingAndGoing,
    Relay,
    coming_and_going,
    relay,
    tictactoe,
)
from jaxrunner._src.testing.pettingzoo_bases import (
    HAVE_PETTINGZOO,
    BaseParallelWrapper,
    BaseWrapper,
)


def simple_spread():
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, max_cycles=10)


def simple_tag():
    # Two groups (adversaries and the good agent see different observations).
    from mpe2 import simple_tag_v3

    return simple_tag_v3.parallel_env(num_good=1, num_adversaries=2, num_obstacles=1, max_cycles=8)


def simple_adversary():
    from mpe2 import simple_adversary_v3

    return simple_adversary_v3.parallel_env(N=2, max_cycles=8)


def connect_four():
    from pettingzoo.classic import connect_four_v3

    return connect_four_v3.env()


class WithInfos(BaseParallelWrapper):
    """A ``ParallelEnv`` whose agents report numbers in their infos at every step: ``t``
    (the env's step count) and ``x`` (their new observation's first entry); at their
    last step, ``episode.r`` too (their return), as RecordEpisodeStatistics does."""

    def reset(self, seed=None, options=None):
        self.t, self.returns = 0, {}
        return self.env.reset(seed=seed, options=options)

    def step(self, actions):
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        self.t += 1
        infos = {a: dict(infos.get(a, {})) for a in obs}
        for a, info in infos.items():
            self.returns[a] = self.returns.get(a, 0.0) + rewards.get(a, 0.0)
            info.update(t=self.t, x=float(obs[a][0]))
            if terms.get(a) or truncs.get(a):
                info["episode"] = {"r": self.returns[a]}
        return obs, rewards, terms, truncs, infos


class ActionBits(BaseParallelWrapper):
    """Each agent's info reports the bits of the action's dtype it received."""

    def step(self, actions):
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        infos = {a: dict(infos.get(a, {})) for a in obs}
        for a, info in infos.items():
            info["bits"] = np.asarray(actions[a]).dtype.itemsize * 8 if a in actions else 0
        return obs, rewards, terms, truncs, infos


class NestedActions(BaseParallelWrapper):
    """ComingAndGoing with a nested action space, ``Dict(move: its Discrete(3), aim:
    Tuple(Box of shape ()))``; each agent's info reports the action it received."""

    def __init__(self, env):
        super().__init__(env)
        from gymnasium import spaces

        aim = spaces.Tuple((spaces.Box(-1.0, 1.0, (), np.float32),))
        self._space = spaces.Dict({"move": env.action_space("a0"), "aim": aim})

    def action_space(self, agent):
        return self._space

    def step(self, actions):
        for a, action in actions.items():
            assert self._space.contains(action), (a, action)
        moves = {a: int(action["move"]) for a, action in actions.items()}
        obs, rewards, terms, truncs, infos = self.env.step(moves)
        infos = {a: dict(infos.get(a, {})) for a in obs}
        for a, action in actions.items():
            infos[a].update(move=moves[a], aim=float(action["aim"][0]))
        return obs, rewards, terms, truncs, infos


def coming_and_going_with_nested_actions():
    return NestedActions(coming_and_going())


class _ActionsFromOne:
    """The wrapped env's ``Discrete(n)`` actions moved to start at 1: ``Discrete(n,
    start=1)``, so an action of 0 lies outside the space."""

    def action_space(self, agent):
        from gymnasium import spaces

        return spaces.Discrete(int(self.env.action_space(agent).n), start=1)


class RelayFromOne(_ActionsFromOne, BaseWrapper):
    def step(self, action):
        self.env.step(None if action is None else int(action) - 1)


class ComingAndGoingFromOne(_ActionsFromOne, BaseParallelWrapper):
    def step(self, actions):
        return self.env.step({a: int(v) - 1 for a, v in actions.items()})


def relay_from_one():
    return RelayFromOne(relay())


def coming_and_going_from_one():
    return ComingAndGoingFromOne(coming_and_going())


def spread_with_action_bits():
    return ActionBits(simple_spread())


def simple_tag_with_infos():
    return WithInfos(simple_tag())


class CountedMoves(BaseWrapper):
    """An ``AECEnv`` whose infos give every agent ``moves``: the actions taken in the
    episode so far (dead steps aside)."""

    def reset(self, seed=None, options=None):
        self.moves = 0
        self.env.reset(seed=seed, options=options)

    def step(self, action):
        self.moves += action is not None
        self.env.step(action)

    @property
    def infos(self):
        return {a: {**info, "moves": self.moves} for a, info in self.env.infos.items()}


def tictactoe_with_infos():
    return CountedMoves(tictactoe())


HOST_KINDS: Any = ("gymnasium", "parallel", "aec") if HAVE_PETTINGZOO else ("gymnasium",)
"""The kinds of env every host backend serves: the contract runs on each."""


def make_kind(kind: str, num_envs: int, backend: str = "sync", **kwargs: Any) -> Any:
    """``make_vec`` of a small env of ``kind`` (one of :data:`HOST_KINDS`): CountingEnv,
    ComingAndGoing or Relay sub-envs, each with ``Discrete`` actions from 0."""
    import jaxrunner as jr
    from jaxrunner.testing import CountingEnv

    factory = {"gymnasium": CountingEnv, "parallel": ComingAndGoing, "aec": relay}[kind]
    return jr.make_vec(factory, num_envs, backend=backend, **kwargs)


def zero_actions(vec: Any, rows: int) -> Any:
    """Valid actions (all 0) for ``rows`` sub-envs of ``vec``, of either kind."""
    if vec.multi_agent:
        return [np.zeros((rows, g.num_agents), np.int64) for g in vec.groups]
    return np.zeros(rows, np.int64)


class PettingZooCases:
    """The contract's parity test also on PettingZoo's MPE and classic envs (mixed in
    before the contract, whose ``env_cases`` it extends)."""

    kind: str

    def env_cases(self) -> dict[str, Any]:
        more = {
            "parallel": {"simple_spread": simple_spread, "simple_tag": simple_tag},
            "aec": {"connect_four": connect_four},
        }
        return {**super().env_cases(), **more.get(self.kind, {})}  # type: ignore[misc]


class BadOutputs(ComingAndGoing):
    """:class:`ComingAndGoing` that returns one kind of output the backends must refuse,
    once, in the episode of its first reset with seed ``arm_seed``; a recreated instance
    (reset with a restart seed) behaves:

    * ``nan_obs``: at step 4, ``a1``'s observation holds a NaN;
    * ``nan_newcomer_obs``: at step 2, the observation of ``a2`` (arriving) holds a NaN;
    * ``missing_reward``: at step 4, no reward for ``a1``, who acted;
    * ``comeback``: at step 4, ``a0`` (terminated at step 3) is back;
    * ``missing_flags``: at step 4, no termination flag for ``a1``, who acted;
    * ``nan_first_obs``: the first reset gives ``a0`` a NaN observation;
    * ``nan_reset_obs``: the reset after the first episode ends does.
    """

    STEP: ClassVar[dict[str, int]] = {
        "nan_obs": 4,
        "nan_newcomer_obs": 2,
        "missing_reward": 4,
        "comeback": 4,
        "missing_flags": 4,
    }

    def __init__(self, kind: str, arm_seed: int) -> None:
        super().__init__()
        self.kind, self.arm_seed, self.armed = kind, arm_seed, False

    def reset(self, seed=None, options=None):
        first = self.episode == -1
        obs, infos = super().reset(seed, options)
        if first:
            self.armed = seed == self.arm_seed
        if self.armed and self.kind == ("nan_first_obs" if first else "nan_reset_obs"):
            self.armed = False
            obs["a0"] = np.full(3, np.nan, np.float32)
        return obs, infos

    def step(self, actions):
        obs, rewards, terms, truncs, infos = super().step(actions)
        if not (self.armed and self.t == self.STEP.get(self.kind)):
            return obs, rewards, terms, truncs, infos
        self.armed = False
        if self.kind == "nan_obs":
            obs["a1"] = np.array([np.nan, 1, 0], np.float32)
        elif self.kind == "nan_newcomer_obs":
            obs["a2"] = np.array([np.inf, 2, 0], np.float32)
        elif self.kind == "missing_reward":
            del rewards["a1"]
        elif self.kind == "missing_flags":  # (read as False, a1 would act on)
            del terms["a1"]
        else:  # comeback
            self.agents.append("a0")
            obs["a0"], infos["a0"] = self._obs("a0"), {}
            terms["a0"] = truncs["a0"] = False
        return obs, rewards, terms, truncs, infos


class UnlistedOutputs(Relay):
    """:class:`Relay` whose step 2 leaves one output of PettingZoo's AEC API malformed
    (``kind``): ``selection`` an undeclared agent selected, ``rewards`` or ``infos`` not
    a dict, ``flags`` the selected agent's termination flag gone, ``reward`` a reward
    for an undeclared agent."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def step(self, action):
        super().step(action)
        if self.t != 2:
            return
        if self.kind == "selection":
            self.agent_selection = "zz"
        elif self.kind == "rewards":
            self.rewards = None
        elif self.kind == "infos":
            self.infos = None
        elif self.kind == "flags":
            del self.terminations[self.agent_selection]
        else:  # reward
            self.rewards["zz"] = 1.0

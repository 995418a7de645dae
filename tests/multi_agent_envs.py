"""PettingZoo envs for the multi-agent tests (module-level: picklable factories).

The small ones every backend is tested on are public, in
:mod:`jaxrunner.testing.multi_agent_envs`; this module adds the tests' own: MPE and
classic envs, and ones that fail on a given seed.
"""

from __future__ import annotations

import functools

import numpy as np

from jaxrunner.testing.multi_agent_envs import (  # noqa: F401  (re-exported for the tests)
    ComingAndGoing,
    Relay,
    coming_and_going,
    relay,
    tictactoe,
)


def simple_spread():
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, max_cycles=10)


def simple_adversary():
    from mpe2 import simple_adversary_v3

    return simple_adversary_v3.parallel_env(N=2, max_cycles=8)


def connect_four():
    from pettingzoo.classic import connect_four_v3

    return connect_four_v3.env()


class FaultyComingAndGoing(ComingAndGoing):
    """:class:`ComingAndGoing` that misbehaves at step ``at_step`` of the episodes reset
    with seed ``trigger_seed`` (so only the sub-env that gets that seed faults):
    ``"raise"``, ``"hang"``, ``"exit"`` (the process ends), ``"bad_obs"`` (agent
    ``a1``'s observation in float64)."""

    def __init__(self, kind: str, trigger_seed: int, at_step: int) -> None:
        super().__init__()
        self.kind, self.trigger_seed, self.at_step = kind, trigger_seed, at_step
        self.armed = False

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.armed = seed == self.trigger_seed
        return super().reset(seed, options)

    def step(self, actions):
        if not (self.armed and self.t + 1 == self.at_step):
            return super().step(actions)
        if self.kind == "raise":
            raise ValueError("boom")
        if self.kind == "hang":
            import time

            time.sleep(600)
        if self.kind == "exit":
            import os

            os._exit(3)
        obs, rewards, terms, truncs, infos = super().step(actions)
        obs["a1"] = obs["a1"].astype(np.float64)  # "bad_obs"
        return obs, rewards, terms, truncs, infos


def faulty_coming_and_going(kind: str, trigger_seed: int, at_step: int = 2):
    """A factory of :class:`FaultyComingAndGoing` (picklable)."""
    return functools.partial(FaultyComingAndGoing, kind, trigger_seed, at_step)


class FaultyRelay(Relay):
    """:class:`Relay` whose step raises at turn ``at_step`` of the episodes reset with
    seed ``trigger_seed``."""

    def __init__(self, trigger_seed: int, at_step: int) -> None:
        super().__init__()
        self.trigger_seed, self.at_step, self.armed = trigger_seed, at_step, False

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.armed = seed == self.trigger_seed
        return super().reset(seed, options)

    def step(self, action):
        if self.armed and self.t + 1 == self.at_step:
            raise ValueError("boom")
        return super().step(action)

"""PettingZoo envs for the multi-agent tests (module-level: picklable factories).

The small ones every backend is tested on are public, in
:mod:`jaxrunner._src.testing.multi_agent_envs`; this module adds the tests' own: MPE and
classic envs, and ones that fail on a given seed.
"""

from __future__ import annotations

from jaxrunner._src.testing.multi_agent_envs import (  # noqa: F401  (re-exported for the tests)
    ComingAndGoing,
    Relay,
    coming_and_going,
    relay,
    tictactoe,
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

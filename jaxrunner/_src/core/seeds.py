"""The reset seeds a runner gives its sub-envs (:func:`env_seeds`), and a restarted
sub-env (:func:`restart_seed`): one rule each, in one place."""

from __future__ import annotations

import numpy as np

from jaxrunner._src.arg_checks import check_int, is_int
from jaxrunner.errors import InvalidArgumentError

MAX_SEED = 2**63 - 1
"""The largest runner seed: its policy keys' root is ``jax.random.key(seed)``, an int64."""
SEED_BASE_BITS = 30
"""Bases are below ``2**30``, so base + i stays a non-negative int32 (EnvPool's seed
type) for up to ``2**30`` sub-envs."""


def env_seeds(seed: int | list[int] | tuple[int, ...], num_envs: int) -> list[int]:
    """The reset seeds of sub-envs ``0..num_envs-1`` of a runner with seed ``seed``.

    Args:
        seed: the runner's seed (an int >= 0), or a list or tuple of such ints (entropy
            for ``SeedSequence``, e.g. ``(seed, steps_done)`` for fresh resets later on).
        num_envs: how many seeds.

    Returns:
        ``[base, base + 1, ..., base + num_envs - 1]`` with ``base`` drawn from
        ``numpy.random.SeedSequence(seed)``, consecutive as gymnasium's ``reset(seed=b)``
        seeds sub-env ``i`` with ``b + i``. Different runner seeds give unrelated bases
        (two blocks of ``n`` seeds overlap by a chance of about ``2n / 2**30``). Sub-env
        ``i``'s seed does not depend on ``num_envs``.
    """
    entropy = [seed] if not isinstance(seed, (list, tuple)) else list(seed)
    if not entropy or not all(is_int(s, low=0) for s in entropy):
        raise InvalidArgumentError(
            f"env_seeds(seed={seed!r}): expected an int >= 0 (or a non-empty sequence of them)."
        )
    check_int("env_seeds", "num_envs", num_envs, low=0)
    word = int(np.random.SeedSequence([int(s) for s in entropy]).generate_state(1, np.uint32)[0])
    base = word >> (32 - SEED_BASE_BITS)
    return [base + i for i in range(int(num_envs))]


_RESTART_TAG = 0x5E5EED
"""Keeps restart seeds apart from :func:`env_seeds` of the same numbers."""


def restart_seed(reset_seed: int, restart: int) -> int:
    """The reset seed of a sub-env's ``restart``-th recreation (1, 2, ...) since it was
    reset with ``reset_seed``, below ``2**30``: the same seed and the same faults give
    the same episodes."""
    return env_seeds([reset_seed, restart, _RESTART_TAG], 1)[0]

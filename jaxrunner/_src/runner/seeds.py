"""The reset seeds a runner gives its sub-envs: one rule, in one place.

An :class:`~jaxrunner.EnvRunner` with seed ``s`` resets sub-env ``i`` with
``env_seeds(s, num_envs)[i]``: a base drawn from ``numpy.random.SeedSequence(s)``, plus
``i``. So:

* The seeds stay consecutive within a runner (gymnasium's ``reset(seed=b)`` -> ``b + i``
  convention), which backends with one generator for all their sub-envs (gymnasium's
  natively vectorized envs, EnvPool) need: they are seeded with ``b``.
* Different runner seeds give unrelated bases, so the runners' blocks of seeds do not
  overlap (a raw ``s + i`` gave runner seeds 0 and 1 the same seeds for all but one
  sub-env). Two blocks of ``n`` seeds overlap only if their bases fall within ``n`` of
  each other: a chance of about ``2n / 2**30`` per pair of runner seeds (1.2e-7 for
  64 envs), whatever the seeds are.
* Sub-env ``i``'s seed does not depend on ``num_envs``.

A user who calls ``envs.reset(seed=b)`` directly still gets gymnasium's ``b + i``.

A sub-env recreated after a failure (``restart_policy``) is reset with
:func:`restart_seed` of the seed it was last reset with and the count of its restarts
since, so two runs with the same seed and the same (deterministic) faults restart into
the same episodes.
"""

from __future__ import annotations

import numpy as np

from jaxrunner.errors import InvalidArgumentError

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
        ``numpy.random.SeedSequence(seed)`` (see the module docstring).
    """
    entropy = [seed] if not isinstance(seed, (list, tuple)) else list(seed)
    if not entropy or any(
        isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0 for s in entropy
    ):
        raise InvalidArgumentError(
            f"env_seeds(seed={seed!r}): expected an int >= 0 (or a non-empty sequence of them)."
        )
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 0:
        raise InvalidArgumentError(f"env_seeds(num_envs={num_envs!r}): expected an int >= 0.")
    word = int(np.random.SeedSequence([int(s) for s in entropy]).generate_state(1, np.uint32)[0])
    base = word >> (32 - SEED_BASE_BITS)
    return [base + i for i in range(int(num_envs))]


_RESTART_TAG = 0x5E5EED
"""Keeps restart seeds apart from :func:`env_seeds` of the same numbers."""


def restart_seed(reset_seed: int, restart: int) -> int:
    """The reset seed of a sub-env's ``restart``-th recreation (1, 2, ...) since it was
    reset with ``reset_seed``: drawn from ``SeedSequence([reset_seed, restart, tag])``,
    below ``2**30``."""
    return env_seeds([reset_seed, restart, _RESTART_TAG], 1)[0]


__all__ = ["SEED_BASE_BITS", "env_seeds", "restart_seed"]

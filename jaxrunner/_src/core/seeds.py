"""The reset seeds a runner gives its sub-envs (:func:`env_seeds`), a restarted sub-env
(:func:`restart_seed`), and a vector env's ``reset(seed=...)`` (:func:`normalize_seeds`):
one rule each, in one place."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxrunner._src.arg_checks import check_int, is_int, is_seed, refusal
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

MAX_SEED = 2**63 - 1
"""The largest runner seed, an int64: its policy keys' root takes all 64 bits."""
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


def normalize_seeds(seed: int | Sequence[int | None] | None, num_envs: int) -> list[int | None]:
    """gymnasium's seeding rule: ``int`` s -> ``[s, s+1, ...]``; a list is taken as is."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return [check_int("reset", "seed", seed, low=0) + i for i in range(num_envs)]
    if isinstance(seed, str) or not isinstance(seed, (Sequence, np.ndarray)):
        what = "an int >= 0 (sub-env i gets seed + i), one seed per sub-env, or None"
        raise InvalidArgumentTypeError(refusal("reset", "seed", seed, what, None, "", False))
    seeds = list(seed)
    bad = next((s for s in seeds if not is_seed(s)), None)
    if len(seeds) != num_envs or bad is not None:
        got = f"{len(seeds)}" if len(seeds) != num_envs else f"{bad!r:.40} ({type(bad).__name__})"
        raise InvalidArgumentError(
            f"reset(seed=[...]): a list of seeds needs one per sub-env (num_envs={num_envs}), "
            f"each an int >= 0 or None; got {got}. Pass an int to seed sub-env i with seed+i."
        )
    return seeds

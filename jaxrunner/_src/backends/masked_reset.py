"""Masked resets: resetting some sub-envs of a gymnasium vector env, and no other.
See docs/backends/gymnasium.md."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode, VectorEnv

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.vector_infos import SplitInfos
from jaxrunner.errors import InvalidArgumentError

Seeds = list[int | None] | None
"""Per sub-env seeds of a masked reset (``None``: unseeded)."""
Options = dict[str, Any] | None
"""Reset options of a masked reset."""
ResetRows = tuple[Any, Sequence[dict[str, Any]]]
"""The reset observations of the masked sub-envs (``[mask.sum(), ...]``, in index
order) and their infos (one dict each)."""

MaskedReset = Callable[[VectorEnv, np.ndarray, Seeds, Options], ResetRows]
"""``masked_reset(env, mask, seeds, options) -> (obs, infos)``: resets the sub-envs where
the bool array ``mask`` is True (sub-env ``i`` with ``seeds[i]`` when ``seeds`` is given)
and no other, so that the env's next ``step`` is a real step for every sub-env (a NEXT_STEP
env must forget that those episodes ended). Returns the masked sub-envs' rows only
(:data:`ResetRows`)."""


def reset_with_mask(env: VectorEnv, mask: np.ndarray, seeds: Seeds, options: Options) -> ResetRows:
    """A :data:`MaskedReset` through gymnasium's ``reset(options={"reset_mask": mask})``
    (``SyncVectorEnv``, ``AsyncVectorEnv`` and envs that follow them)."""
    # VectorEnv.reset's stub types one int seed; Sync/AsyncVectorEnv take a list too.
    obs, merged = env.reset(seed=seeds, options={**(options or {}), "reset_mask": mask})  # type: ignore[arg-type]
    indices = np.flatnonzero(mask)
    infos = SplitInfos(merged, env.num_envs)
    return space_arrays.rows(env.single_observation_space, obs, indices), [
        infos[i] for i in indices.tolist()
    ]


def reset_cartpole_vector(
    env: VectorEnv, mask: np.ndarray, seeds: Seeds, options: Options
) -> ResetRows:
    """A :data:`MaskedReset` for gymnasium's ``CartPoleVectorEnv``, whose ``reset``
    ignores ``reset_mask``: it does to the ended envs what the env's next ``step`` would
    (the same random draws) and clears their pending-reset flags."""
    if (seeds is not None and any(s is not None for s in seeds)) or options:
        raise InvalidArgumentError(
            "CartPoleVectorEnv draws every sub-env's start state from one generator, so one "
            "sub-env cannot be reset with its own seed or options. Reset the whole vector env "
            "(reset(seed=...)), or use vectorization_mode='sync' for per-env seeding."
        )
    # A CartPoleVectorEnv (MASKED_RESETS keys this reset by class) past its first reset.
    cartpole: Any = env.unwrapped
    # Indices, not the mask: the ended envs are few, and each boolean index scans all.
    ended = np.flatnonzero(mask)
    cartpole.state[:, ended] = cartpole.np_random.uniform(
        low=cartpole.low, high=cartpole.high, size=(4, len(ended))
    )
    cartpole.steps[ended] = 0
    cartpole.prev_done[ended] = False
    return cartpole.state[:, ended].T.astype(np.float32), SplitInfos({}, len(ended))


MASKED_RESETS: dict[type, MaskedReset] = {
    gymnasium.vector.SyncVectorEnv: reset_with_mask,
    gymnasium.vector.AsyncVectorEnv: reset_with_mask,
    CartPoleVectorEnv: reset_cartpole_vector,
}
"""Known masked resets, by the class of the wrapped env's ``unwrapped``."""


def masked_reset_for(
    env: VectorEnv, mode: AutoresetMode, given: MaskedReset | None
) -> MaskedReset | None:
    """``given``, else the :data:`MASKED_RESETS` entry for ``env``'s type, else
    :func:`reset_with_mask` if DISABLED. With none known, None for a SAME_STEP env (it
    resets by itself) and an error for a NEXT_STEP one."""
    unwrapped = env.unwrapped
    if (
        isinstance(unwrapped, gymnasium.vector.AsyncVectorEnv)
        and mode == AutoresetMode.NEXT_STEP
        and not unwrapped.shared_memory
    ):  # its workers keep their autoreset flag through a masked reset (gymnasium 1.x)
        raise InvalidArgumentError(
            "from_gymnasium: an AsyncVectorEnv autoresetting on the NEXT_STEP without shared "
            "memory resets an ended sub-env twice, and the second reset would be recorded "
            "as a transition. Build it with shared_memory=True, or with autoreset_mode="
            "AutoresetMode.DISABLED (or SAME_STEP)."
        )
    masked_reset = given if given is not None else MASKED_RESETS.get(type(unwrapped))
    if masked_reset is None and mode == AutoresetMode.DISABLED:
        masked_reset = reset_with_mask
    if masked_reset is None and mode == AutoresetMode.NEXT_STEP:
        raise InvalidArgumentError(
            f"from_gymnasium: {type(env.unwrapped).__name__} autoresets on the NEXT_STEP, "
            "and jaxrunner does not know how to reset some of its sub-envs only, which it "
            "needs to skip the reset steps (their action is ignored and their reward is 0; "
            "emitting them would fabricate transitions). Pass masked_reset="
            "jaxrunner._src.backends.masked_reset.reset_with_mask if the env honours "
            "reset(options={'reset_mask': mask}), or your own MaskedReset; or build the "
            "env with autoreset_mode=AutoresetMode.SAME_STEP."
        )
    return masked_reset

"""``backend="gymnasium"`` and :func:`from_gymnasium`: any gymnasium ``VectorEnv`` behind
jaxrunner's SAME_STEP contract. See docs/backends/gymnasium.md."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.gymnasium_sub_envs import GymnasiumSubEnvs
from jaxrunner._src.backends.in_process import InProcessSends
from jaxrunner._src.backends.masked_reset import MaskedReset, masked_reset_for
from jaxrunner._src.backends.steps import BatchStep
from jaxrunner._src.backends.vector_infos import (
    EMPTY_RESET_INFOS,
    ResetInfos,
    SplitInfos,
    same_step_infos,
)
from jaxrunner._src.backends.vector_wrappers import vector_wrapper_hint
from jaxrunner._src.backends.wrapped_outputs import WrappedOutputs
from jaxrunner._src.space_arrays.checks import check_finite_observations
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError, InvalidStepError


def gymnasium_seed(seeds: Sequence[int | None]) -> int | list[int | None] | None:
    """``seeds`` as gymnasium's ``reset(seed=...)`` takes it: ``None`` if all are None, the
    int ``s`` for ``[s, s+1, ...]`` (what natively vectorized envs accept), else the list."""
    seeds = list(seeds)
    if all(s is None for s in seeds):
        return None
    first = seeds[0]
    if isinstance(first, (int, np.integer)) and seeds == list(range(first, first + len(seeds))):
        return int(first)
    return seeds


class GymnasiumVectorEnv(InProcessSends, GymnasiumSubEnvs, WrappedOutputs, VectorEnv):
    """Adopts a gymnasium ``VectorEnv`` (semantics: docs/backends/gymnasium.md).

    Every ``step_batch`` steps the wrapped env once with the whole action batch. The
    wrapped env cannot step a subset of its sub-envs, so ``step_batch(rows=...)`` accepts
    only all rows; an :class:`~jaxrunner.EnvRunner` over it uses one group by default.

    Args:
        env: the gymnasium vector env; the adapter owns it and closes it.
        masked_reset: how to reset some sub-envs only (a
            :data:`~jaxrunner._src.backends.masked_reset.MaskedReset`); ``None`` picks a known one
            (:func:`~jaxrunner._src.backends.masked_reset.masked_reset_for`).
        copy: if True, ``reset``/``step`` return copies of the observation buffer.

    Raises:
        InvalidArgumentError: for a NEXT_STEP env with no known masked reset.
    """

    capabilities = Capabilities(whole_batch=True)

    def __init__(
        self,
        env: gymnasium.vector.VectorEnv,
        *,
        masked_reset: MaskedReset | None = None,
        copy: bool = True,
    ) -> None:
        super().__init__(copy=copy)
        self._closed_reason = "construction failed"  # until built
        if not isinstance(env, gymnasium.vector.VectorEnv):
            raise InvalidArgumentTypeError(
                f"from_gymnasium(vector_env=...): expected a gymnasium.vector.VectorEnv, got "
                f"{type(env).__name__}. Wrap a single env with gymnasium.vector.SyncVectorEnv"
                "([make_env] * n), or use jaxrunner.make_vec(make_env, n)."
            )
        if isinstance(env, gymnasium.vector.VectorWrapper):
            raise InvalidArgumentTypeError(
                f"from_gymnasium(vector_env=...): {vector_wrapper_hint(env)}"
            )
        if getattr(env, "closed", False) is True:  # (a closed SyncVectorEnv still steps)
            raise InvalidArgumentError(
                f"from_gymnasium(vector_env=...): this {type(env).__name__} is closed; pass "
                "a new one."
            )
        self.env = env  # typed Any by GymnasiumSubEnvs: it calls call/get_attr/set_attr
        try:
            self._init_from(env, masked_reset)
        except BaseException:
            env.close()
            raise
        self._closed_reason = None

    def _init_from(self, env: gymnasium.vector.VectorEnv, masked_reset: MaskedReset | None) -> None:
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        try:
            self.wrapped_autoreset_mode = AutoresetMode(mode)
        except ValueError as err:
            raise InvalidArgumentError(
                f"from_gymnasium: the env's metadata['autoreset_mode'] is {mode!r}; expected "
                f"one of {[m.value for m in AutoresetMode]}."
            ) from err
        self._masked_reset = masked_reset_for(env, self.wrapped_autoreset_mode, masked_reset)
        self.num_envs = int(env.num_envs)
        obs_space, action_space = env.single_observation_space, env.single_action_space
        space_arrays.check_supported(obs_space, "single_observation_space")
        space_arrays.check_supported(action_space, "single_action_space")
        self._take_spaces(obs_space, action_space, env.metadata, env.render_mode)
        self.spec = env.spec

        n, space = self.num_envs, self.single_observation_space
        self._obs = space_arrays.allocate(space, (n,))
        self._next_obs = space_arrays.allocate(space, (n,))
        self._write_next_obs = space_arrays.make_writer(space, self._next_obs, "final_obs")
        self._reward = np.zeros(n, dtype=np.float64)
        self._terminated = np.zeros(n, dtype=np.bool_)
        self._truncated = np.zeros(n, dtype=np.bool_)
        self._composite_actions = isinstance(self.single_action_space, (spaces.Dict, spaces.Tuple))
        self._action_check = space_arrays.action_batch_check(self.single_action_space, n)

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, Sequence[dict[str, Any]]]:
        self._begin_reset(seeds)
        obs, merged = self._call(
            "reset", self.env.reset, seed=gymnasium_seed(seeds), options=options
        )
        self._store(self._obs, obs, "reset")
        check_finite_observations(self.single_observation_space, self._obs, "reset")
        return self._obs, SplitInfos(merged, self.num_envs)

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._check_open("reset_at")
        self._check_reset_at(index, seed, options)
        if self._masked_reset is None:
            raise InvalidArgumentError(
                f"reset_at({index}): {type(self.env.unwrapped).__name__} has no known way to "
                "reset one sub-env only; pass masked_reset to from_gymnasium, or reset all "
                "sub-envs with reset()."
            )
        mask = np.zeros(self.num_envs, dtype=np.bool_)
        mask[index] = True
        seeds = None if seed is None else [seed if i == index else None for i in range(len(mask))]
        obs, infos = self._call("reset", self._masked_reset, self.env, mask, seeds, options)
        self._store_rows(self._obs, obs, np.array([index]), "reset")
        return space_arrays.take(self.single_observation_space, self._obs, index), infos[0]

    def _checked(self, actions: Any, rows: slice | None) -> Any:
        self._check_all_rows(rows)
        return self._check_actions(actions)

    def _passed(self, actions: Any, rows: slice | None) -> Any:
        if self._composite_actions:  # (a composite batch is never vouched for)
            return self._checked(actions, rows)
        self._check_all_rows(rows)
        return actions  # (as the check returns a batch that passes)

    def _check_all_rows(self, rows: slice | None) -> None:
        n = self.num_envs
        if rows is not None and (rows.start, rows.stop) != (0, n):
            raise InvalidArgumentError(
                f"step_batch(rows={rows}): a gymnasium vector env steps all {n} sub-envs at "
                "once and cannot step a subset. Drive it with EnvRunner(..., num_splits=1)."
            )

    def _step(self, actions: Any, rows: slice | None) -> BatchStep:
        n = self.num_envs
        obs, reward, terminated, truncated, merged = self._vector_step(actions)
        self._store(self._next_obs, obs, "step")
        self._store_flags(reward, terminated, truncated)
        done = self._terminated | self._truncated
        space = self.single_observation_space
        space_arrays.copy_into(space, self._obs, self._next_obs)
        if not done.any():
            infos = SplitInfos(merged, n)
            reset_infos: Mapping[int, dict[str, Any]] = EMPTY_RESET_INFOS
        elif self.wrapped_autoreset_mode == AutoresetMode.SAME_STEP:
            infos, reset_infos = self._same_step_finals(merged, done)
        else:
            indices = np.flatnonzero(done)
            reset_obs, infos_k = self._reset_ended(done)
            self._store_rows(self._obs, reset_obs, indices, "reset")
            infos = SplitInfos(merged, n)
            reset_infos = ResetInfos(
                indices.tolist(), lambda i: infos_k[int(np.searchsorted(indices, i))]
            )
        for buffer, call in ((self._next_obs, "step"), (self._obs, "reset")):
            check_finite_observations(space, buffer, call)  # as a non-finite reward
        return BatchStep(
            self._obs, self._next_obs, self._reward, self._terminated, self._truncated,
            infos, reset_infos,
        )  # fmt: skip

    def _reset_ended(self, done: np.ndarray) -> tuple[Any, Sequence[dict[str, Any]]]:
        """Resets the sub-envs ``done`` (as a masked reset returns them)."""
        # masked_reset_for gives one to every mode but SAME_STEP.
        assert self._masked_reset is not None
        return self._call("reset", self._masked_reset, self.env, done, None, None)

    def _same_step_finals(
        self, merged: Mapping[str, Any], done: np.ndarray
    ) -> tuple[SplitInfos, ResetInfos]:
        """SAME_STEP: ``obs`` already holds the reset observations; the final ones are in
        ``info["final_obs"]`` (the final step infos: :func:`.vector_infos.same_step_infos`)."""
        indices = np.flatnonzero(done).tolist()
        final_obs = merged.get("final_obs")
        if not isinstance(final_obs, np.ndarray) or final_obs.shape != (self.num_envs,):
            raise InvalidStepError(
                f"{type(self.env).__name__} (SAME_STEP) ended episodes in sub-envs {indices} "
                "but its info has no per-env 'final_obs' object array; gymnasium's SAME_STEP "
                "envs report the final observations there."
            )
        for i in indices:
            self._write_next_obs(i, final_obs[i])
        return same_step_infos(merged, self.num_envs, indices)

    def _vector_step(self, actions: Any) -> tuple[Any, Any, Any, Any, Mapping[str, Any]]:
        """The wrapped env's ``step(actions)`` (an adapter over faster calls overrides it)."""
        return self._call("step", self.env.step, actions)

    def _check_actions(self, actions: Any) -> Any:
        """The whole batch validated (composites as given)."""
        checked = self._action_check(actions)
        return actions if self._composite_actions else checked

    def _close_backend(self) -> None:
        self.env.close()


def from_gymnasium(
    vector_env: gymnasium.vector.VectorEnv,
    *,
    masked_reset: MaskedReset | None = None,
    copy: bool = True,
) -> GymnasiumVectorEnv:
    """Adopts an existing gymnasium ``VectorEnv`` as a jaxrunner vector env.

    Whatever the env's autoreset mode (NEXT_STEP, SAME_STEP or DISABLED), the result has
    jaxrunner's SAME_STEP contract: true final observations, and no reset step (ignored
    action, zero reward) ever emitted. The adapter owns ``vector_env`` and closes it.

    Args:
        vector_env: the env, e.g. ``gymnasium.make_vec("CartPole-v1", 1024)``.
        masked_reset: how to reset some sub-envs only; see :class:`GymnasiumVectorEnv`.
        copy: if True, ``reset``/``step`` return copies of the observation buffer.
    """
    return GymnasiumVectorEnv(vector_env, masked_reset=masked_reset, copy=copy)

"""``backend="envpool"`` in sync mode: EnvPool's C++ vector envs behind jaxrunner's
contract (reset steps kept as invalid rows, or taken at once; seeded rebuilds, checked
actions). See docs/backends/envpool.md."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode

from jaxrunner._src import space_arrays
from jaxrunner._src.arg_checks import check_bool, check_seed_count
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.envpool_calls import (
    EnvPoolActions,
    EnvPoolCalls,
    EnvPoolStep,
    NoSubEnvAccess,
    every_seed,
    pool_builder,
)
from jaxrunner._src.backends.gymnasium_adapter import GymnasiumVectorEnv, gymnasium_seed
from jaxrunner._src.backends.steps import BatchStep, EnvIds, block_rows
from jaxrunner._src.backends.vector_infos import EMPTY_RESET_INFOS, SplitInfos
from jaxrunner._src.space_arrays.checks import (
    check_finite_observations,
    finite_batch_test,
    surely_finite,
)
from jaxrunner.errors import InvalidArgumentError


def _check_order(got: np.ndarray, ids: np.ndarray) -> None:
    if not np.array_equal(got, ids):
        raise RuntimeError(
            f"EnvPool returned sub-envs {np.asarray(got)[:8]}... where {ids[:8]}... were "
            "expected (sync mode keeps env_id order); this EnvPool version is not supported."
        )


class EnvPoolVectorEnv(NoSubEnvAccess, GymnasiumVectorEnv):
    """An EnvPool pool in sync mode (see docs/backends/envpool.md).

    Args:
        task_id: an EnvPool task id (``envpool.list_all_envs()``), e.g. ``"CartPole-v1"``.
        num_envs: number of sub-envs.
        seed: the pool's seed until a seeded ``reset``: sub-env ``i`` gets ``seed + i``.
        copy: if True, ``reset``/``step`` return copies of the observation buffer.
        keep_reset_steps: True (the default): step with EnvPool's own NEXT_STEP
            autoreset and return its reset steps as ``BatchStep.reset_rows``
            (``valid=False`` slots, no faults). False: take each ended sub-env's reset
            step at once, in a second call, so every row is a transition (gymnasium's
            SAME_STEP); see docs/backends/envpool.md.
        **envpool_kwargs: for ``envpool.make_gymnasium`` (``num_threads``,
            ``max_episode_steps``, ...).
    """

    def __init__(
        self,
        task_id: str,
        num_envs: int,
        *,
        seed: int = 0,
        copy: bool = True,
        keep_reset_steps: bool = True,
        **envpool_kwargs: Any,
    ) -> None:
        self.task_id = task_id
        check_bool("EnvPoolVectorEnv", "keep_reset_steps", keep_reset_steps)
        self._build = pool_builder("EnvPoolVectorEnv", task_id, num_envs, envpool_kwargs)
        pool = self._build(seed)
        self._calls = EnvPoolCalls(pool)  # EnvPool's C++ calls, without its Python layer
        super().__init__(pool, masked_reset=self._reset_masked, copy=copy)
        self._action_check = EnvPoolActions(task_id, self.single_action_space)
        self._obs_finite = finite_batch_test(self.single_observation_space)
        self.keep_reset_steps = bool(keep_reset_steps)
        # Sub-envs whose episode ended in the last call, reset in the next (a new array
        # each call: a BatchStep keeps the last one as its reset rows).
        self._ended = np.zeros(num_envs, dtype=np.bool_)
        self._sending = False  # keep_reset_steps: a send is stepping in EnvPool
        if self.keep_reset_steps:
            self.capabilities = Capabilities(
                whole_batch=True, reset_steps=True, steps_in_background=True, answers_held=True
            )
            self.metadata = {**self.metadata, "autoreset_mode": AutoresetMode.NEXT_STEP}

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, Sequence[dict[str, Any]]]:
        self._check_open("reset")
        check_seed_count(seeds, self.num_envs, type(self).__name__)
        self._check_not_sending("reset_batch")
        if options:
            raise InvalidArgumentError(
                f"reset(options={options!r}): EnvPool takes no reset options."
            )
        seed = gymnasium_seed(seeds)
        if seed is not None:
            # The seed is fixed when the pool is built: build a new pool with these seeds.
            seed = seed if isinstance(seed, int) else every_seed(seed)
            old, self.env = self.env, self._build(seed)
            self._calls = EnvPoolCalls(self.env)
            old.close()
        obs, infos = super().reset_batch([None] * self.num_envs)
        if isinstance(infos, SplitInfos) and "env_id" in infos.merged:
            _check_order(infos.merged["env_id"], np.arange(self.num_envs))
        self._ended[:] = False
        return obs, infos

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._check_not_sending("reset_at")
        out = super().reset_at(index, seed=seed, options=options)
        self._ended[index] = False  # reset(env_id=...) cleared EnvPool's pending reset
        return out

    def _reset_masked(
        self,
        env: gymnasium.vector.VectorEnv,
        mask: np.ndarray,
        seeds: list[int | None] | None,
        options: dict[str, Any] | None,
    ) -> tuple[Any, Sequence[dict[str, Any]]]:
        """This pool's :data:`~jaxrunner._src.backends.masked_reset.MaskedReset`."""
        if (seeds is not None and any(s is not None for s in seeds)) or options:
            given = "seed" if seeds is not None and any(s is not None for s in seeds) else "options"
            raise InvalidArgumentError(
                f"{type(self).__name__}: a reset of some sub-envs (reset_at, or a reset_mask) "
                f"with {given}=...: EnvPool seeds its sub-envs when the pool is built and "
                "takes no reset options; reset them without seed/options, or reset them all "
                "with reset(seed=...)."
            )
        ids = np.flatnonzero(mask).astype(np.int32)
        got, obs, info = self._calls.reset(ids)
        _check_order(got, ids)
        return obs, SplitInfos(info, len(ids))  # split on access: most steps never read them

    def _reset_ended(self, done: np.ndarray) -> tuple[Any, Sequence[dict[str, Any]]]:
        """EnvPool's own reset step of the sub-envs ``done`` ended (their actions are
        ignored), not ``reset(env_id=...)``: with ``episodic_life`` an Atari reset step
        after a lost life goes on with the game, where an explicit reset starts a new one."""
        ids = np.flatnonzero(done).astype(np.int32)
        ignored = space_arrays.allocate(self.single_action_space, (len(ids),))
        out = self._call("reset", self._calls.step, ignored, ids)
        _check_order(out.env_id, ids)
        return out.obs, SplitInfos(out.info, len(ids))

    def _check_actions(self, actions: Any) -> Any:
        """As every adapter, and in range: EnvPool's C++ trusts the values."""
        checked = self._action_check(actions, self._calls.all_ids)
        return actions if self._composite_actions else checked

    def _vector_step(self, actions: Any) -> tuple[Any, Any, Any, Any, Mapping[str, Any]]:
        out = self._call("step", self._calls.step, actions)
        return out.obs, out.reward, out.terminated, out.truncated, out.info

    def _send_actions(self, actions: Any, env_ids: EnvIds, checked: bool) -> None:
        """With ``keep_reset_steps``, hands the actions to EnvPool at once (its threads
        step while the runner records them)."""
        if not self.keep_reset_steps:  # (its send keeps the actions for its recv)
            super()._send_actions(actions, env_ids, checked)
            return
        self._check_open("step")
        n = self.num_envs
        if env_ids is not None and block_rows(env_ids, n, type(self).__name__) != (0, n):
            raise InvalidArgumentError(
                f"EnvPoolVectorEnv.send(env_ids={env_ids!r}): sync mode steps all {n} sub-envs "
                "at once; pass None (async mode, make_vec(..., batch_size=k), steps subsets)."
            )
        if not checked:
            actions = self._check_actions(actions)
        self._check_not_sending("send")
        self._call("step", self._calls.send, actions)
        self._sending = True

    def recv(self) -> BatchStep:
        if not self.keep_reset_steps:
            return super().recv()
        self._check_open("step")
        if not self._sending:
            raise InvalidArgumentError(
                "EnvPoolVectorEnv.recv(): no send() is waiting for its results; call "
                "send(actions) first, once per recv()."
            )
        self._sending = False
        return self._answer(self._call("step", self._calls.recv))

    def _check_not_sending(self, call: str) -> None:
        if self._sending:
            raise InvalidArgumentError(
                f"EnvPoolVectorEnv.{call}(): the last send() is still stepping in EnvPool; "
                "recv() its results first."
            )

    def step_batch(self, actions: Any, rows: slice | None = None) -> BatchStep:
        if not self.keep_reset_steps:
            return super().step_batch(actions, rows)
        self.send(actions, rows)
        return self.recv()

    def _answer(self, out: EnvPoolStep) -> BatchStep:
        """A step of EnvPool's own NEXT_STEP autoreset, with its reset rows, in this
        adapter's own buffers (the runner's views of them hold from step to step)."""
        space = self.single_observation_space
        if self._calls.direct:  # EnvPool's fresh arrays of its spec: values checked only
            reward = self._reward
            reward[:] = out.reward
            if not surely_finite(reward):
                self._store_flags(out.reward, out.terminated, out.truncated)  # raises, naming it
            if self._obs_finite is not None and not self._obs_finite(out.obs):
                check_finite_observations(space, out.obs, "step")
            self._terminated[:] = out.terminated
            self._truncated[:] = out.truncated
            space_arrays.copy_into(space, self._obs, out.obs)
            next_obs = self._obs
        else:
            self._store(self._next_obs, out.obs, "step")
            self._store_flags(out.reward, out.terminated, out.truncated)
            check_finite_observations(space, self._next_obs, "step")
            space_arrays.copy_into(space, self._obs, self._next_obs)  # for reset_at
            next_obs = self._next_obs
        # A new array each step: the next step's reset rows.
        reset, self._ended = self._ended, self._terminated | self._truncated
        return BatchStep(
            next_obs, next_obs, self._reward, self._terminated, self._truncated,
            SplitInfos(out.info, self.num_envs), EMPTY_RESET_INFOS,
            reset_rows=reset if reset.any() else None,
        )  # fmt: skip

"""``backend="envpool"`` with ``batch_size < num_envs``: EnvPool's async mode, sampled
ready-first, its NEXT_STEP reset steps kept as invalid rows (or paired into SAME_STEP
rows). See docs/backends/envpool.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from gymnasium.vector import AutoresetMode

from jaxrunner._src import space_arrays
from jaxrunner._src.arg_checks import check_seed_count
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.checked_sends import ChecksOnSend
from jaxrunner._src.backends.envpool_calls import (
    EnvPoolActions,
    EnvPoolCalls,
    NoSubEnvAccess,
    check_env_ids,
    every_seed,
    pool_builder,
)
from jaxrunner._src.backends.steps import BatchStep, EnvIds, block_rows
from jaxrunner._src.backends.vector_infos import ResetInfos, SplitInfos
from jaxrunner._src.backends.wrapped_outputs import check_finite_rewards
from jaxrunner._src.space_arrays.checks import nonfinite_observations
from jaxrunner.errors import InvalidArgumentError


class EnvPoolAsyncVectorEnv(ChecksOnSend, NoSubEnvAccess, VectorEnv):
    """An EnvPool pool in async mode: ``batch_size`` envs per ``recv`` (docs/backends/envpool.md).

    ``keep_reset_steps``: True answers EnvPool's own reset steps as
    ``BatchStep.reset_rows``; False sends them itself and holds each final step until
    its reset step answers. ``envpool_kwargs`` go to ``envpool.make_gymnasium``.
    """

    def __init__(
        self,
        task_id: str,
        num_envs: int,
        batch_size: int,
        *,
        seed: int = 0,
        copy: bool = True,
        keep_reset_steps: bool = True,
        **envpool_kwargs: Any,
    ) -> None:
        super().__init__(copy=copy)
        if not 1 <= batch_size < num_envs or num_envs % batch_size:
            self._closed_reason = "construction failed"
            # Whole batches: EnvPool's recv waits for batch_size answers, so the first
            # observations of a reset can only be collected batch by batch.
            raise InvalidArgumentError(
                f"make_vec(backend='envpool', batch_size={batch_size}): async mode needs "
                f"1 <= batch_size < num_envs={num_envs}, with num_envs a multiple of "
                "batch_size; leave batch_size unset for sync mode."
            )
        self._build = pool_builder(
            "EnvPoolAsyncVectorEnv", task_id, num_envs, envpool_kwargs, batch_size
        )
        self.keep_reset_steps = bool(keep_reset_steps)
        self.capabilities = Capabilities(
            ready_first=True,
            recv_batch_size=batch_size,
            reset_steps=self.keep_reset_steps,
            any_order=True,
        )
        self.task_id = task_id
        self._seeds = [seed + i for i in range(num_envs)]  # the pool's, as last built
        self.env = self._build(self._seeds)
        self._calls = EnvPoolCalls(self.env)  # EnvPool's C++ calls, without its Python layer
        self.num_envs, self.batch_size = num_envs, batch_size
        space_arrays.check_supported(self.env.observation_space, "single_observation_space")
        self._take_spaces(self.env.observation_space, self.env.action_space, {}, None)
        if self.keep_reset_steps:
            self.metadata = {**self.metadata, "autoreset_mode": AutoresetMode.NEXT_STEP}
        self._action_check = EnvPoolActions(task_id, self.single_action_space)
        # reset_batch's answer (steps answer arrays of their own).
        self._obs = space_arrays.allocate(self.single_observation_space, (num_envs,))
        # The final step of each env whose reset step EnvPool has yet to return.
        self._awaiting_reset = np.zeros(num_envs, np.bool_)
        # keep_reset_steps: the envs whose episode ended at their last answer.
        self._ended = np.zeros(num_envs, np.bool_)
        self._final_obs = space_arrays.allocate(self.single_observation_space, (num_envs,))
        self._final_reward = np.zeros(num_envs, np.float64)
        self._final_terminated = np.zeros(num_envs, np.bool_)
        self._final_truncated = np.zeros(num_envs, np.bool_)
        self._final_infos: dict[int, tuple[SplitInfos, int]] = {}  # env -> (infos, row)
        # Sent and not yet answered (held final steps included): what EnvPool has in flight.
        self._in_flight = np.zeros(num_envs, np.bool_)
        self._num_in_flight = 0
        # recv's env_ids arrays (read-only) not yet sent again, by id(): sent back whole,
        # their envs are known distinct, in range and answered, so they skip the checks.
        self._answered: dict[int, np.ndarray] = {}
        self._action_shape, action_dtype = space_arrays.leaf_spec(self.single_action_space)
        # Actions of reset steps, which EnvPool ignores.
        self._reset_actions = np.zeros((batch_size, *self._action_shape), action_dtype)

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, list[dict[str, Any]]]:
        self._check_open("reset")
        check_seed_count(seeds, self.num_envs, type(self).__name__)
        if options:
            raise InvalidArgumentError(f"reset(options={options!r}): EnvPool takes no options.")
        if self._num_in_flight:  # before anything changes: the pool stays as it was
            raise InvalidArgumentError(
                f"EnvPool async reset_batch(): envs {np.flatnonzero(self._in_flight).tolist()} "
                "are still stepping; recv() their results first, or build a new vector env."
            )
        if not all(s is None for s in seeds):  # the seed is fixed when the pool is built
            self._rebuild(every_seed(seeds))
        self._awaiting_reset[:] = False
        self._final_infos.clear()
        self._ended[:] = False
        self.env.async_reset()
        seen, infos = 0, [{} for _ in range(self.num_envs)]
        while seen < self.num_envs:
            out = self._calls.recv()
            space_arrays.copy_into(self.single_observation_space, self._obs, out.obs, out.env_id)
            split = SplitInfos(out.info, len(out.env_id))  # EnvPool's, as in sync mode
            for row, env in enumerate(out.env_id.tolist()):
                infos[env] = split[row]
            seen += len(out.env_id)
        return self._obs, infos

    def _rebuild(self, seeds: list[int]) -> None:
        """A new pool of sub-env seeds ``seeds``, the old one closed (with whatever it had
        in flight): a new, unreset pool, as ``make_vec`` builds one."""
        old, self.env = self.env, self._build(seeds)
        self._seeds, self._calls = seeds, EnvPoolCalls(self.env)
        old.close()

    def drop_in_flight(self) -> None:
        """Drops the steps sent and not yet received (a runner handing its envs back
        open: it steps envs up to a sample ahead), by building the pool again; the envs
        are then as ``make_vec`` left them, to be reset before they step. EnvPool's
        ``recv`` waits for ``batch_size`` envs, so fewer in flight cannot be received."""
        if self._num_in_flight and self._closed_reason is None:
            self._rebuild(self._seeds)
            self._in_flight[:] = self._awaiting_reset[:] = self._ended[:] = False
            self._num_in_flight = 0
            self._final_infos.clear()

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        raise InvalidArgumentError(
            "EnvPool async mode cannot reset one sub-env alone (its recv waits for "
            "batch_size envs); reset them all with reset_batch(), or use sync mode."
        )

    def _send_actions(self, actions: Any, env_ids: EnvIds, checked: bool) -> None:
        self._check_open("step")
        answered = self._answered.pop(id(env_ids), None)
        if answered is not None:
            ids = answered.astype(np.int32)  # (a copy: EnvPool may read it later)
        else:  # other ids: checked; an answer partly sent is no longer known free
            self._answered.clear()
            ids = check_env_ids(env_ids, self.num_envs, self._in_flight, type(self).__name__)
        if not checked:
            actions = self._action_check(actions, ids)
        self._calls.send(actions, ids)
        self._in_flight[ids] = True
        self._num_in_flight += len(ids)

    def recv(self) -> BatchStep:
        self._check_open("step")
        if self._num_in_flight < self.batch_size:  # EnvPool's recv would wait forever
            raise InvalidArgumentError(
                f"EnvPoolAsyncVectorEnv.recv(): {self._num_in_flight} envs are stepping, but "
                f"EnvPool answers batch_size={self.batch_size} at a time; send() at least "
                f"{self.batch_size - self._num_in_flight} more envs first."
            )
        out = self._recv_with_reset_steps() if self.keep_reset_steps else self._recv_real_steps()
        answered = cast(np.ndarray, out.env_ids)  # (an array: EnvPool's answer)
        self._in_flight[answered] = False
        self._num_in_flight -= len(answered)
        self._check_finite(out, answered)
        answered.flags.writeable = False  # (a caller's edit would void what send trusts)
        self._answered[id(answered)] = answered
        return out

    def _check_finite(self, out: BatchStep, ids: np.ndarray) -> None:
        """A NaN or infinite reward or observation raises, naming its sub-env, as in sync
        mode (EnvPool cannot restart one sub-env)."""
        check_finite_rewards(out.reward, type(self.env).__name__, ids)
        space, n = self.single_observation_space, len(ids)
        for obs in (out.next_obs,) if out.obs is out.next_obs else (out.obs, out.next_obs):
            leaves = (obs,) if type(obs) is np.ndarray else space_arrays.leaves(obs)
            for leaf in leaves:
                if leaf.dtype.kind == "f" and not np.isfinite(leaf).all():
                    bad = nonfinite_observations(space, obs, 0, n, "step", where=lambda i: ids[i])
                    raise bad[min(bad)]

    def step_batch(self, actions: Any, rows: slice | None = None) -> BatchStep:
        """One lockstep step of envs ``rows`` (None: all; whole batches, none in flight):
        sent at once, then each of EnvPool's answers put in env order. With EnvPool's
        reset steps kept only: an ended env's paired reset step is answered only in a
        batch with envs sent after it."""
        self._check_open("step")
        lo, hi = block_rows(rows, self.num_envs, type(self).__name__)
        if not self.keep_reset_steps:
            raise InvalidArgumentError(
                "EnvPoolAsyncVectorEnv.step_batch(): with keep_reset_steps=False each ended "
                "env's reset step waits for a batch of envs sent after it, so no lockstep "
                "step can finish; step ready-first with send() and recv(), keep the reset "
                "steps, or use sync mode (no batch_size)."
            )
        if self._num_in_flight or (hi - lo) % self.batch_size:
            raise InvalidArgumentError(
                f"EnvPoolAsyncVectorEnv.step_batch(rows={rows!r}): a lockstep step of whole "
                f"batches of batch_size={self.batch_size} envs with none in flight; step "
                "envs ready-first with send() and recv()."
            )
        self.send(actions, slice(lo, hi))
        space, n = self.single_observation_space, hi - lo
        obs, next_obs = (space_arrays.allocate(space, (n,)) for _ in range(2))
        reward, terminated, truncated, reset = np.zeros(n), *np.zeros((3, n), np.bool_)
        infos: list[dict[str, Any]] = [{}] * n
        reset_infos: dict[int, dict[str, Any]] = {}
        while self._num_in_flight:
            out = self.recv()
            at = np.asarray(out.env_ids) - lo
            space_arrays.copy_into(space, obs, out.obs, at)
            space_arrays.copy_into(space, next_obs, out.next_obs, at)
            reward[at], terminated[at], truncated[at] = out.reward, out.terminated, out.truncated
            if out.reset_rows is not None:
                reset[at] = out.reset_rows
            for j, i in enumerate(at.tolist()):
                infos[i] = out.infos[j]
            reset_infos.update(out.reset_infos)
        return BatchStep(
            obs, next_obs, reward, terminated, truncated, infos, reset_infos,
            env_ids=rows, reset_rows=reset if reset.any() else None,
        )  # fmt: skip

    def _recv_real_steps(self) -> BatchStep:
        """An ended env's final step held until its reset step answers, both as one row."""
        space = self.single_observation_space
        while True:
            ids, obs, reward, terminated, truncated, info = self._calls.recv()
            ids = ids.astype(np.int64)
            step_infos = SplitInfos(info, len(ids))  # split on read
            resets = self._awaiting_reset[ids]  # reset steps of ended episodes: pair them
            ended = np.logical_or(terminated, truncated) & ~resets
            if ended.any():  # hold the final steps; EnvPool resets on the next step
                rows = np.flatnonzero(ended)
                held = ids[rows]
                space_arrays.copy_into(
                    space, self._final_obs, space_arrays.take(space, obs, ended), held
                )
                self._final_reward[held] = reward[ended]
                self._final_terminated[held] = terminated[ended]
                self._final_truncated[held] = truncated[ended]
                for e, r in zip(held.tolist(), rows.tolist()):
                    self._final_infos[e] = (step_infos, r)
                self._awaiting_reset[held] = True
                self._calls.send(self._reset_actions[: len(held)], held.astype(np.int32))
            rows = ~ended
            if rows.all():
                rows = slice(None)
            elif not rows.any():
                continue
            break
        env_ids = ids[rows]
        positions = None if isinstance(rows, slice) else np.flatnonzero(rows)
        next_obs = space_arrays.take(space, obs, rows)
        # Copies: EnvPool's own arrays are not ours to write the final steps into.
        reward_out = np.array(reward[rows], np.float64)
        term_out = np.array(terminated[rows], np.bool_)
        trunc_out = np.array(truncated[rows], np.bool_)
        pairs = resets[rows]
        finals: dict[int, tuple[SplitInfos, int]] = {}
        reset_infos: Any = {}
        if pairs.any():  # the final step in place of the reset step
            k, finished = np.flatnonzero(pairs), env_ids[pairs]
            final = space_arrays.take(space, self._final_obs, finished)
            space_arrays.copy_into(space, next_obs, final, k)
            reward_out[k] = self._final_reward[finished]
            term_out[k] = self._final_terminated[finished]
            trunc_out[k] = self._final_truncated[finished]
            self._awaiting_reset[finished] = False
            finals = {int(j): self._final_infos.pop(int(e)) for j, e in zip(k, finished)}
            row_of = {
                int(e): int(j if positions is None else positions[j]) for j, e in zip(k, finished)
            }
            reset_infos = ResetInfos(list(row_of), lambda e: step_infos[row_of[e]])
        infos = SplitInfos(
            info, len(env_ids), rows=positions,
            override=ResetInfos(list(finals), lambda j: finals[j][0][finals[j][1]]),
        )  # fmt: skip
        obs_out = space_arrays.take(space, obs, rows)
        return BatchStep(
            obs_out, next_obs, reward_out, term_out, trunc_out, infos, reset_infos, None, None,
            env_ids,
        )  # fmt: skip

    def _recv_with_reset_steps(self) -> BatchStep:
        """EnvPool's answer as it is (envs that ended at their last answer reset now)."""
        space = self.single_observation_space
        ids, obs, reward, terminated, truncated, info = self._calls.recv()
        env_ids = ids.astype(np.int64)
        reset = self._ended[env_ids]
        self._ended[env_ids] = np.logical_or(terminated, truncated)
        obs_out = space_arrays.map_structure(space, np.array, obs)  # ours, not EnvPool's
        return BatchStep(
            obs_out, obs_out, np.array(reward, np.float64), np.array(terminated, np.bool_),
            np.array(truncated, np.bool_), SplitInfos(info, len(env_ids)), {}, None, None,
            env_ids, reset if reset.any() else None,
        )  # fmt: skip

    def _close_backend(self) -> None:
        self.env.close()

    def render(self) -> Any:
        raise self._no_sub_envs("render")

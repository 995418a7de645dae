"""The step loop of gymnasium sub-envs (one agent each, every one steps: the dense path):
checked in place, written to the block's rows of the stacked buffers once per block."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.env_api import reset_result, step_result
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.steps import StepBuffers, fail_slot
from jaxrunner._src.backends.sub_env_block import (
    DONE,
    RUNNING,
    EnvFactory,
    Marks,
    StepResult,
    SubEnvBlock,
    SubEnvRaised,
    original,
    with_env_index,
)
from jaxrunner._src.space_arrays import check_flag, check_info, check_reward
from jaxrunner._src.space_arrays.checks import all_finite_test, nonfinite_observations
from jaxrunner.errors import JaxRunnerError, SpaceMismatchError


class GymnasiumBlock(SubEnvBlock):
    """Gymnasium sub-envs ``[offset, offset + len(envs))`` stepped into the stacked
    ``buffers`` (indexed by global index); ``obs_space`` validates every observation.
    See :class:`~jaxrunner._src.backends.sub_env_block.SubEnvBlock` for the rest."""

    def __init__(
        self,
        envs: list[gymnasium.Env],
        fns: Sequence[EnvFactory],
        offset: int,
        buffers: StepBuffers,
        obs_space: gymnasium.Space,
        restart_policy: RestartPolicy | None,
        status: Marks | None = None,
    ) -> None:
        super().__init__(envs, fns, offset, restart_policy, status)
        self.buffers, self.obs_space = buffers, obs_space
        self.write_obs = space_arrays.make_writer(obs_space, buffers.obs)
        self.write_next_obs = space_arrays.make_writer(obs_space, buffers.next_obs)
        # Array observations (Box, MultiBinary, MultiDiscrete) are checked inline and
        # written in one slice assignment per step: a numpy write per row costs more.
        # (None: Discrete's observations are ints, Dict's and Tuple's are trees.)
        self._obs_leaf: tuple[np.dtype, tuple[int, ...]] | None = None
        if isinstance(obs_space, (spaces.Box, spaces.MultiBinary, spaces.MultiDiscrete)):
            shape, dtype = space_arrays.leaf_spec(obs_space)
            # The fast path compares dtypes by identity: take numpy's own instance, the one
            # an env's arrays carry. A space that was pickled (a process worker's) holds a
            # copy, which would send every observation down the slow path.
            self._obs_leaf = np.dtype(dtype.str), shape
        # NaN and inf observations are invalid steps: one sum per float leaf and block
        # (None: no float leaf), the exact check only when a sum is not finite.
        self._all_finite = all_finite_test(obs_space, buffers.next_obs)

    def step(self, lo: int, hi: int, actions: Sequence[Any]) -> StepResult:
        """Steps sub-envs ``[lo, hi)`` (global indices) with ``actions[i - lo]``, SAME_STEP
        autoreset included: where an episode ended, ``next_obs`` keeps the final
        observation and ``obs`` gets the reset's. Each sub-env's results are checked as
        it returns them and written to the buffers once the block has stepped."""
        b = self.buffers
        write_next_obs, envs, offset = self.write_next_obs, self.envs, self.offset
        status, policy = self.status, self.restart_policy
        dtype, shape = self._obs_leaf or (None, None)  # None: every obs goes to the writer
        infos: list[dict[str, Any]] = []
        ended: list[int] = []
        errors: dict[int, BaseException] = {}
        next_obs: list[Any] = []  # the results of the sub-envs that stepped fine:
        rewards: list[float] = []
        terms: list[bool] = []
        truncs: list[bool] = []
        for i, action in zip(range(lo, hi), actions):
            status[i] = RUNNING
            try:
                result = envs[i - offset].step(action)
            except Exception as err:
                error = SubEnvRaised(err, i, "step")
                if policy is None:
                    raise error from err
                errors[i] = error  # what would be raised, as for every failure
                infos.append({})
                continue
            try:  # the unpacking and the checks: one try, not two, per sub-env
                obs, r, term, trunc, info = result
                # Fast paths for the common types (r - r is NaN for NaN and inf); the
                # checks explain anything else, and the writer writes what it accepts.
                if type(obs) is not np.ndarray or obs.dtype is not dtype or obs.shape != shape:
                    write_next_obs(i, obs)
                    if dtype is not None:  # the block write below keeps what it wrote
                        obs = b.next_obs[i]
                if type(r) is not float or r - r != 0.0:
                    r = check_reward(r, i)
                if type(term) is not bool:
                    term = check_flag(term, i, "terminated")
                if type(trunc) is not bool:
                    trunc = check_flag(trunc, i, "truncated")
                if type(info) is not dict:
                    info = check_info(info, i, "step")
            except JaxRunnerError as err:  # an invalid step, already explained...
                if type(result) is not tuple:  # ...unless five values, not gymnasium's tuple:
                    step_result(result, i)  # the wrong API, not a fault (a list of five is fine)
                with_env_index(err, i)
                if policy is None:
                    raise
                errors[i] = err
                infos.append({})
                continue
            except (ValueError, TypeError):  # not five values: the wrong API, not a fault
                step_result(result, i)  # (it raises; with five values, a check's own error:)
                raise
            next_obs.append(obs)
            rewards.append(r)
            terms.append(term)
            truncs.append(trunc)
            infos.append(info)
            if term or trunc:
                ended.append(i)
            status[i] = DONE
        if hi - lo == 1 and next_obs:  # one sub-env: item writes (a list costs ~2 us more)
            if dtype is not None:
                b.next_obs[lo] = next_obs[0]
            b.reward[lo], b.terminated[lo], b.truncated[lo] = r, term, trunc
        elif next_obs:
            written = slice(lo, hi) if not errors else [i for i in range(lo, hi) if i not in errors]
            if dtype is not None:
                b.next_obs[written] = next_obs
            b.reward[written] = rewards
            b.terminated[written] = terms
            b.truncated[written] = truncs
        finite = self._all_finite
        bad = (
            nonfinite_observations(self.obs_space, b.next_obs, lo, hi, "step", errors)
            if finite is not None and not finite(lo, hi)
            else None
        )
        if bad:  # a NaN or inf observation is an invalid step, as a NaN reward is
            if policy is None:
                raise next(iter(bad.values()))
            errors.update(bad)
            ended = [i for i in ended if i not in bad]
            for i in bad:
                infos[i - lo], status[i] = {}, RUNNING  # as any invalid step: no transition
        failed = list(errors)
        for i in failed:
            self.restart(i, original(errors[i]), failed_step=True)
        space, part = self.obs_space, slice(lo, hi)
        if dtype is not None:
            b.obs[part] = b.next_obs[part]
        else:
            space_arrays.copy_into(space, b.obs, space_arrays.rows(space, b.next_obs, part), part)
        reset_infos = {}
        for i in ended:
            try:
                reset_infos[i] = self.reset_one(i, None, None)
            except JaxRunnerError as err:
                if policy is None:
                    raise
                errors[i] = err
                reset_infos[i] = self.restart(i, original(err), failed_step=False)
        return StepResult(infos, reset_infos, failed, errors)

    def reset_one(self, i: int, seed: int | None, options: dict[str, Any] | None) -> dict:
        """Resets sub-env ``i`` (global index) into ``obs``; returns its checked info."""
        try:
            result = self.envs[i - self.offset].reset(seed=seed, options=options)
        except Exception as err:
            raise SubEnvRaised(err, i, "reset") from err
        if type(result) is not tuple or len(result) != 2:  # gymnasium's pair: no call
            result = reset_result(result, i)  # (the rest: a list of two, or its error)
        obs, info = result
        if seed is not None:  # an autoreset (None) keeps the restart seed
            self._seeded(i, seed)
        self.write_obs(i, obs)
        self._check_finite_reset(i)
        return check_info(info, i, "reset")

    def _check_finite_reset(self, i: int) -> None:
        bad = nonfinite_observations(self.obs_space, self.buffers.obs, i, i + 1, "reset")
        if bad:
            raise bad[i]

    def _fresh(self, j: int, env: Any, seed: int | None) -> dict[str, Any]:
        i = self.offset + j
        for name, expected in (
            ("observation_space", self.obs_space),
            ("action_space", self.envs[j].action_space),  # the env it replaces: checked
        ):
            got = getattr(env, name)
            if got != expected:
                raise SpaceMismatchError(
                    f"sub-env {i} was recreated with {name}={got}, but the vector env's is "
                    f"{expected}; a restarted sub-env must have the spaces of the one it "
                    "replaces. Check the factory."
                )
        obs, info = reset_result(env.reset(seed=seed), i)
        self.write_obs(i, obs)
        self._check_finite_reset(i)  # a new sub-env's first observation too
        info = check_info(info, i, "reset")
        self.envs[j] = env
        return info

    def _fail_slot(self, i: int) -> None:
        fail_slot(self.buffers, self.obs_space, i)

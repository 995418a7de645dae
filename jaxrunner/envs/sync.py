"""``backend="sync"``: every sub-env in this process, stepped in turn."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector.utils import batch_space

from jaxrunner import spaces as jr_spaces
from jaxrunner.envs.base import BatchStep, Capabilities, InProcessVectorEnv, VectorEnv
from jaxrunner.errors import (
    EnvError,
    InvalidArgumentError,
    JaxRunnerError,
    SpaceMismatchError,
)
from jaxrunner.faults import RestartPolicy, recreate
from jaxrunner.spaces import check_flag, check_info, check_reward

EnvFactory = Callable[[], gymnasium.Env]


def _step_error(err: Exception, index: int) -> EnvError:
    return EnvError(f"sub-env {index} raised in step(): {err!r}", index)


class SyncVectorEnv(InProcessVectorEnv):
    """Sub-envs in this process, stepped one after another, with validated,
    in-place writes into stacked buffers.

    Step for step equal to ``gymnasium.vector.SyncVectorEnv(env_fns,
    autoreset_mode=SAME_STEP)`` for the same seeds and actions.

    Args:
        env_fns: zero-argument factories, one per sub-env.
        copy: if True, ``reset``/``step`` return copies of the observation buffer
            (as gymnasium's does); the runner's batch methods never copy.
        restart_policy: if given, a sub-env that fails is recreated and reset as this
            policy says, and sampling goes on (see :mod:`jaxrunner.faults`); if None
            (default), the failure raises.
    """

    capabilities = Capabilities(can_restart=True)

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        *,
        copy: bool = True,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        super().__init__(copy=copy)
        self.restart_policy = restart_policy
        self.num_restarts = 0
        """Sub-envs recreated after a failure (with a ``restart_policy``)."""
        if len(env_fns) == 0:
            raise InvalidArgumentError("SyncVectorEnv needs at least one env factory, got none.")
        self.env_fns = list(env_fns)
        self.envs: list[gymnasium.Env] = []
        try:
            for fn in self.env_fns:
                self.envs.append(fn())
        except BaseException:
            # Do not leak the sub-envs built so far.
            for env in self.envs:
                env.close()
            self._closed_reason = "construction failed"
            raise
        first = self.envs[0]
        self.num_envs = len(self.envs)
        self.metadata = {**first.metadata, "autoreset_mode": VectorEnv.metadata["autoreset_mode"]}
        self.render_mode = first.render_mode
        self.spec = None
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        for i, env in enumerate(self.envs):
            for name in ("observation_space", "action_space"):
                expected, got = getattr(first, name), getattr(env, name)
                if got != expected:
                    self.close()
                    raise SpaceMismatchError(
                        f"sub-env {i} has {name}={got}, but sub-env 0 has {expected}; every "
                        "sub-env of a vector env must have equal spaces. Check the factory."
                    )
        try:
            jr_spaces.check_supported(self.single_observation_space, "single_observation_space")
            jr_spaces.check_supported(self.single_action_space, "single_action_space")
        except SpaceMismatchError:
            self.close()
            raise
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        n, obs_space = self.num_envs, self.single_observation_space
        self._obs = jr_spaces.allocate(obs_space, (n,))
        self._next_obs = jr_spaces.allocate(obs_space, (n,))
        self._write_obs = jr_spaces.make_writer(obs_space, self._obs)
        self._write_next_obs = jr_spaces.make_writer(obs_space, self._next_obs)
        self._reward = np.zeros(n, dtype=np.float64)
        self._terminated = np.zeros(n, dtype=np.bool_)
        self._truncated = np.zeros(n, dtype=np.bool_)
        self._splitters: dict[int, Callable[[Any], list[Any]]] = {}

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, list[dict[str, Any]]]:
        self._check_open("reset")
        infos = []
        for i in range(self.num_envs):
            try:
                infos.append(self._reset_one(i, seeds[i], options))
            except Exception as err:
                if self.restart_policy is None:
                    raise
                infos.append(self._restart(i, err, keep_next_obs=True))
        return self._obs, infos

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._check_open("reset_at")
        self._check_index(index, "reset_at")
        info = self._reset_one(index, seed, options)
        return jr_spaces.take(self.single_observation_space, self._obs, index), info

    def _reset_one(self, i: int, seed: int | None, options: dict[str, Any] | None) -> dict:
        try:
            obs, info = self.envs[i].reset(seed=seed, options=options)
        except Exception as err:
            raise EnvError(f"sub-env {i} raised in reset(): {err!r}", i) from err
        self._write_obs(i, obs)
        return check_info(info, i, "reset")

    def _step(self, actions: Any, rows: slice | None) -> BatchStep:
        lo, hi = (0, self.num_envs) if rows is None else (rows.start, rows.stop)
        per_env = self._splitter(hi - lo)(actions)  # validates before any sub-env steps
        reward, terminated, truncated = self._reward, self._terminated, self._truncated
        write_next_obs = self._write_next_obs
        infos: list[dict[str, Any]] = []
        ended: list[int] = []
        errors: dict[int, BaseException] = {}
        for i, env, action in zip(range(lo, hi), self.envs[lo:hi], per_env):
            try:
                obs, r, term, trunc, info = env.step(action)
                write_next_obs(i, obs)
                # Fast paths for the common types (r - r is NaN for NaN and inf); the
                # checks explain anything else.
                reward[i] = r if type(r) is float and r - r == 0.0 else check_reward(r, i)
                terminated[i] = term if type(term) is bool else check_flag(term, i, "terminated")
                truncated[i] = trunc if type(trunc) is bool else check_flag(trunc, i, "truncated")
                infos.append(info if type(info) is dict else check_info(info, i, "step"))
            except Exception as err:
                if self.restart_policy is None:
                    if isinstance(err, JaxRunnerError):  # an invalid step, already explained
                        raise
                    raise _step_error(err, i) from err
                errors[i] = err
                del infos[i - lo :]  # the failed step's info, if it got that far
                infos.append({})
                continue
            if term or trunc:
                ended.append(i)
        failed = None
        if errors:
            failed = np.zeros(self.num_envs, np.bool_)
            failed[list(errors)] = True
            for i, error in errors.items():
                self._restart(i, error)
        space, part = self.single_observation_space, slice(lo, hi)
        jr_spaces.copy_into(space, self._obs, jr_spaces.rows(space, self._next_obs, part), part)
        reset_infos = {}
        for i in ended:
            try:
                reset_infos[i] = self._reset_one(i, None, None)
            except Exception as err:
                if self.restart_policy is None:
                    raise
                errors[i] = err
                reset_infos[i] = self._restart(i, err, keep_next_obs=True)
        if rows is None:
            return BatchStep(
                self._obs,
                self._next_obs,
                reward,
                terminated,
                truncated,
                infos,
                reset_infos,
                failed,
                errors or None,
            )
        return BatchStep(
            jr_spaces.rows(space, self._obs, part),
            jr_spaces.rows(space, self._next_obs, part),
            reward[part],
            terminated[part],
            truncated[part],
            infos,
            reset_infos,
            None if failed is None else failed[part],
            errors or None,
            part,
        )

    def _restart(self, i: int, cause: BaseException, keep_next_obs: bool = False) -> dict:
        """Replaces sub-env ``i`` by a new, reset one (see :mod:`jaxrunner.faults`)."""
        assert self.restart_policy is not None  # internal: only called with a policy
        self.envs[i], info = recreate(
            self.envs[i], self.env_fns[i], i, self.restart_policy, cause, self._write_obs
        )
        self.num_restarts += 1
        if not keep_next_obs:  # a failed step: its slot holds the new env's first obs
            self._reward[i], self._terminated[i], self._truncated[i] = 0.0, False, False
            jr_spaces.copy_into(
                self.single_observation_space,
                self._next_obs,
                jr_spaces.take(self.single_observation_space, self._obs, i),
                i,
            )
        return info

    def _splitter(self, size: int) -> Callable[[Any], list[Any]]:
        if size not in self._splitters:
            self._splitters[size] = jr_spaces.make_action_splitter(self.single_action_space, size)
        return self._splitters[size]

    def _obs_buffer(self) -> Any:
        return self._obs

    def render(self) -> tuple[Any, ...]:
        self._check_open("render")
        return tuple(env.render() for env in self.envs)

    def get_sub_environments(self) -> list[gymnasium.Env]:
        """The sub-envs themselves (the ``gymnasium.Env`` objects, in index order)."""
        self._check_open("get_sub_environments")
        return list(self.envs)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` (or reads attribute ``name``) on every sub-env."""
        self._check_open("call")
        results = []
        for env in self.envs:
            attr = env.get_wrapper_attr(name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        return tuple(results)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        self._check_open("get_attr")
        return tuple(env.get_wrapper_attr(name) for env in self.envs)

    def set_attr(self, name: str, values: Any) -> None:
        self._check_open("set_attr")
        values = self._values_per_env(name, values)
        for env, value in zip(self.envs, values):
            env.set_wrapper_attr(name, value)

    def _close_backend(self) -> None:
        for env in self.envs:
            env.close()

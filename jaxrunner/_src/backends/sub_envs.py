"""The one per-sub-env step loop (step, validate, restart, SAME_STEP autoreset) of the
sync backend, the process worker and the Ray actor."""

from __future__ import annotations

from collections.abc import Callable, MutableSequence, Sequence
from typing import Any, NamedTuple

import gymnasium
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.env_api import check_env, reset_result, step_result
from jaxrunner._src.backends.restarts import RestartPolicy, recreate
from jaxrunner._src.backends.step_buffers import StepBuffers, fail_slot
from jaxrunner._src.backends.sub_env_handle import run_on_env
from jaxrunner._src.core.seeds import restart_seed
from jaxrunner._src.space_arrays import check_flag, check_info, check_reward
from jaxrunner._src.space_arrays.checks import all_finite_test, nonfinite_observations
from jaxrunner.errors import EnvError, JaxRunnerError

EnvFactory = Callable[[], gymnasium.Env]

# Per sub-env progress of a step, written to the caller's ``status`` array: a process
# worker's shared marks tell the main process which steps a dead worker had done.
NOT_RUN, RUNNING, DONE = 0, 1, 2


class ActionSplitters:
    """Validating splitters of action batches into per-sub-env actions, built once per
    batch size (:func:`jaxrunner._src.space_arrays.make_action_splitter`)."""

    def __init__(self, action_space: gymnasium.Space) -> None:
        self.action_space = action_space
        self._by_size: dict[int, Callable[[Any], list[Any]]] = {}

    def split(self, actions: Any, size: int) -> list[Any]:
        """``actions`` (a batch of ``size``) as one action per sub-env; raises
        InvalidActionError before anything steps if the batch does not fit."""
        splitter = self._by_size.get(size)
        if splitter is None:
            splitter = space_arrays.make_action_splitter(self.action_space, size)
            self._by_size[size] = splitter
        return splitter(actions)


class SubEnvRaised(EnvError):
    """A sub-env's own code raised in ``call`` (``"step"``, ``"reset"``, ``"factory"``);
    the original is chained. ``agent_id``: in a turn-based multi-agent env, the agent
    whose turn it was (None otherwise)."""

    def __init__(
        self, err: BaseException, env_index: int, call: str, agent_id: str | None = None
    ) -> None:
        who = (
            f"sub-env {env_index}"
            if agent_id is None
            else f"sub-env {env_index} (agent {agent_id!r})"
        )
        super().__init__(f"{who} raised in {call}(): {err!r}", env_index)
        self.call = call
        self.agent_id = agent_id


def original(err: BaseException) -> BaseException:
    """The sub-env's own exception behind a :class:`SubEnvRaised` (else ``err``)."""
    return err.__cause__ if isinstance(err, SubEnvRaised) and err.__cause__ else err


class StepResult(NamedTuple):
    """What :meth:`SubEnvs.step` returns besides what it wrote to the buffers."""

    infos: list[dict[str, Any]]
    """Step infos of ``[lo, hi)`` in order (``{}`` for a failed step)."""
    reset_infos: dict[int, dict[str, Any]]
    """Infos of the autoresets, by global index."""
    failed: list[int]
    """Global indices whose step failed (restarted; their slots hold no transition)."""
    errors: dict[int, BaseException]
    """Every failure (step, or autoreset after a good step), by global index."""

    def failed_mask(self, lo: int, hi: int) -> np.ndarray | None:
        """The failed steps of ``[lo, hi)`` as a bool mask (None: none failed)."""
        return failed_mask(self.failed, lo, hi)


def failed_mask(failed: Sequence[int], lo: int, hi: int) -> np.ndarray | None:
    """Sub-envs ``failed`` (global indices in ``[lo, hi)``) as a ``[hi - lo]`` bool
    mask, as ``BatchStep.failed`` holds them; None when ``failed`` is empty."""
    if not failed:
        return None
    mask = np.zeros(hi - lo, np.bool_)
    mask[np.asarray(failed) - lo] = True
    return mask


class SubEnvs:
    """Sub-envs ``[offset, offset + len(envs))`` of a vector env, stepped in turn.

    Args:
        envs: the sub-envs (owned: replaced on restarts, closed by :meth:`close`).
        fns: their factories (for restarts).
        offset: the global index of ``envs[0]``.
        buffers: where results go, indexed by global index.
        obs_space: the single observation space (validates every observation).
        restart_policy: with one, a failing sub-env is recreated and its step
            failed; without, the failure raises (:class:`SubEnvRaised` for the env's
            own exceptions, the check's error for an invalid step).
        status: per global index, the progress marks (``RUNNING``, ``DONE``); None:
            not kept.
    """

    def __init__(
        self,
        envs: list[gymnasium.Env],
        fns: Sequence[EnvFactory],
        offset: int,
        buffers: StepBuffers,
        obs_space: gymnasium.Space,
        restart_policy: RestartPolicy | None,
        status: MutableSequence[int] | None = None,
    ) -> None:
        self.envs, self.fns, self.offset = envs, list(fns), offset
        self.buffers, self.obs_space, self.restart_policy = buffers, obs_space, restart_policy
        self.status = status if status is not None else bytearray(offset + len(envs))
        self.write_obs = space_arrays.make_writer(obs_space, buffers.obs)
        self.write_next_obs = space_arrays.make_writer(obs_space, buffers.next_obs)
        # Array observations (Box, MultiBinary, MultiDiscrete) are checked inline and
        # written in one slice assignment per step: a numpy write per row costs more.
        self._obs_leaf = _array_leaf(obs_space)
        # NaN and inf observations are invalid steps: one sum per float leaf and block
        # (None: no float leaf), the exact check only when a sum is not finite.
        self._all_finite = all_finite_test(obs_space, buffers.next_obs)
        self.num_restarts = 0
        """Sub-envs recreated after a failure."""
        self._seeds: list[int | None] = [None] * len(envs)
        """Each sub-env's last reset seed (None: never seeded)."""
        self._restarts = [0] * len(envs)
        """Each sub-env's restarts since that seeded reset (its restarts' seeds)."""

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
                if policy is None:
                    raise SubEnvRaised(err, i, "step") from err
                errors[i] = err
                infos.append({})
                continue
            if type(result) is not tuple or len(result) != 5:  # not a fault: the wrong API
                result = step_result(result, i)
            obs, r, term, trunc, info = result
            try:
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
            except JaxRunnerError as err:  # an invalid step, already explained
                if policy is None:
                    raise
                errors[i] = err
                infos.append({})
                continue
            next_obs.append(obs)
            rewards.append(r)
            terms.append(term)
            truncs.append(trunc)
            infos.append(info)
            if term or trunc:
                ended.append(i)
            status[i] = DONE
        if next_obs:
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
            self.restart(i, errors[i], failed_step=True)
        space, part = self.obs_space, slice(lo, hi)
        space_arrays.copy_into(space, b.obs, space_arrays.rows(space, b.next_obs, part), part)
        reset_infos = {}
        for i in ended:
            try:
                reset_infos[i] = self.reset_one(i, None, None)
            except JaxRunnerError as err:
                if policy is None:
                    raise
                errors[i] = cause = original(err)
                reset_infos[i] = self.restart(i, cause, failed_step=False)
        return StepResult(infos, reset_infos, failed, errors)

    def reset_one(self, i: int, seed: int | None, options: dict[str, Any] | None) -> dict:
        """Resets sub-env ``i`` (global index) into ``obs``; returns its checked info."""
        try:
            result = self.envs[i - self.offset].reset(seed=seed, options=options)
        except Exception as err:
            raise SubEnvRaised(err, i, "reset") from err
        obs, info = reset_result(result, i)
        if seed is not None:
            self._seeds[i - self.offset], self._restarts[i - self.offset] = seed, 0
        self.write_obs(i, obs)
        bad = nonfinite_observations(self.obs_space, self.buffers.obs, i, i + 1, "reset")
        if bad:
            raise bad[i]
        return check_info(info, i, "reset")

    def reset(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> list[dict]:
        """Resets every sub-env (``seeds[j]`` for ``envs[j]``); restarts one that fails
        when there is a restart policy."""
        infos = []
        for j, seed in enumerate(seeds):
            i = self.offset + j
            try:
                infos.append(self.reset_one(i, seed, options))
            except JaxRunnerError as err:
                if self.restart_policy is None:
                    raise
                infos.append(self.restart(i, original(err), failed_step=False))
        return infos

    def restart(self, i: int, cause: BaseException, failed_step: bool) -> dict:
        """Replaces sub-env ``i`` by a new, reset one
        (:func:`jaxrunner._src.backends.restarts.recreate`);
        for a failed step, its slot then holds no transition
        (:func:`~jaxrunner._src.backends.step_buffers.fail_slot`)."""
        assert self.restart_policy is not None  # internal: only called with a policy
        j = i - self.offset
        self._restarts[j] += 1
        seed = self._seeds[j]  # a seeded env restarts seeded: runs stay reproducible
        self.envs[j], info = recreate(
            self.envs[j], self.fns[j], i, self.restart_policy, cause, self.write_obs,
            None if seed is None else restart_seed(seed, self._restarts[j]),
        )  # fmt: skip
        self.num_restarts += 1
        if failed_step:
            fail_slot(self.buffers, self.obs_space, i)
        return info

    def restart_state(self, j: int) -> tuple[int | None, int]:
        """``envs[j]``'s last reset seed and its restarts since: what its next restart's
        seed is drawn from (a checkpoint keeps them, so a resumed run restarts as the
        unbroken one does)."""
        return self._seeds[j], self._restarts[j]

    def set_restart_state(self, j: int, state: tuple[int | None, int]) -> None:
        """Takes a :meth:`restart_state` as ``envs[j]``'s."""
        self._seeds[j], self._restarts[j] = state

    def call(self, name: str, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        """Calls method ``name`` (or reads attribute ``name``) on every sub-env."""
        results = []
        for env in self.envs:
            attr = env.get_wrapper_attr(name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        return results

    def get_attr(self, name: str) -> list[Any]:
        return [env.get_wrapper_attr(name) for env in self.envs]

    def set_attr(self, name: str, values: Sequence[Any]) -> None:
        for env, value in zip(self.envs, values):
            env.set_wrapper_attr(name, value)

    def render(self) -> list[Any]:
        return [env.render() for env in self.envs]

    def on_sub_env(self, index: int, method: str, args: tuple) -> Any:
        """A :class:`~jaxrunner._src.backends.sub_env_handle.SubEnvHandle` request, run on
        sub-env ``index`` (global) alone."""
        return run_on_env(self.envs[index - self.offset], method, args)

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []


def _array_leaf(space: gymnasium.Space) -> tuple[np.dtype, tuple[int, ...]] | None:
    """The dtype and shape of an array observation space's elements; None for the others
    (Discrete's observations are ints, Dict's and Tuple's are trees)."""
    if isinstance(
        space, (gymnasium.spaces.Box, gymnasium.spaces.MultiBinary, gymnasium.spaces.MultiDiscrete)
    ):
        shape, dtype = space_arrays.leaf_spec(space)
        # The fast path compares dtypes by identity: take numpy's own instance, the one
        # an env's arrays carry. A space that was pickled (a process worker's) holds a
        # copy, which would send every observation down the slow path.
        return np.dtype(dtype.str), shape
    return None


def build_envs(fns: Sequence[EnvFactory], offset: int) -> list[gymnasium.Env]:
    """Calls the factories (``fns[j]`` is sub-env ``offset + j``); on failure closes
    what it built and raises :class:`SubEnvRaised` (call ``"factory"``)."""
    envs: list[gymnasium.Env] = []
    try:
        for j, fn in enumerate(fns):
            try:
                env = fn()
            except Exception as err:
                raise SubEnvRaised(err, offset + j, "factory") from err
            envs.append(check_env(env, offset + j))
    except BaseException:
        for env in envs:
            env.close()
        raise
    return envs

"""The contract every jaxrunner vector-env backend keeps.

A backend subclasses :class:`VectorEnv` and implements :meth:`VectorEnv.reset_batch`,
:meth:`VectorEnv.step_batch` and :meth:`VectorEnv.reset_at`. Gymnasium's ``reset``
and ``step`` are derived from them, so every backend is a
``gymnasium.vector.VectorEnv`` with autoreset mode ``SAME_STEP``. The runner uses the
batch methods directly: they return views of preallocated buffers and per-env info
lists, with no per-step dict merging.

Contract (``jaxrunner.testing.VectorEnvContract`` checks it for any backend):

* ``reset_batch(seeds)`` resets sub-env ``i`` with ``seeds[i]``.
* ``step_batch(actions)`` validates the whole action batch before stepping any
  sub-env, then steps each sub-env once. Where a sub-env ended (terminated or
  truncated), ``next_obs`` holds its final observation and ``obs`` the observation
  of the reset that followed in the same call (SAME_STEP autoreset); elsewhere the
  two are equal.
* Observations are validated against the single observation space; rewards must be
  finite scalars and infos dicts.
* Resetting one sub-env touches no other.
* Restarts (backends with ``supports_restart``): with ``restart_policy`` set, a
  sub-env that raises in ``step()``/``reset()`` or returns an invalid step is closed,
  recreated from its factory and reset (see :mod:`jaxrunner.faults`); the failed step
  yields no transition (``BatchStep.failed``) and no other sub-env is touched. With
  no policy (the default), the failure raises :class:`~jaxrunner.errors.EnvError`.
* After ``close()`` every call raises :class:`~jaxrunner.errors.ClosedError`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode

from jaxrunner import spaces as jr_spaces
from jaxrunner.errors import ClosedError, EnvIndexError, InvalidArgumentError
from jaxrunner.faults import RestartPolicy


class BatchStep(NamedTuple):
    """What one ``step_batch`` call returns. Arrays are views of the env's buffers:
    valid until its next call; copy what you keep."""

    obs: Any
    """[B, ...] observations to act on next (reset ones where an episode ended)."""
    next_obs: Any
    """[B, ...] true next observations (the final one where an episode ended)."""
    reward: np.ndarray
    """[B] float64."""
    terminated: np.ndarray
    """[B] bool."""
    truncated: np.ndarray
    """[B] bool."""
    infos: list[dict[str, Any]]
    """Per-env step infos (the final info where an episode ended)."""
    reset_infos: dict[int, dict[str, Any]]
    """Infos of the resets done in this call, by env index."""
    failed: np.ndarray | None = None
    """[B] bool, or None when no sub-env failed: the sub-envs whose step failed and
    were restarted (only with a ``restart_policy``). Their slots hold no transition:
    reward 0, both flags False, and ``obs`` and ``next_obs`` the new sub-env's reset
    observation. Their step infos are ``{}``; ``errors`` holds what went wrong."""
    errors: dict[int, BaseException] | None = None
    """The failures of this call, by env index: step failures (``failed``) and
    reset failures after a good step (that transition stays valid)."""


def normalize_seeds(seed: int | Sequence[int | None] | None, num_envs: int) -> list[int | None]:
    """gymnasium's seeding rule: ``int`` s -> ``[s, s+1, ...]``; a list is taken as is."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in range(num_envs)]
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise InvalidArgumentError(
            f"reset(seed=...): a list of seeds needs one per sub-env (num_envs={num_envs}), "
            f"got {len(seeds)}. Pass an int to seed sub-env i with seed+i."
        )
    return seeds


class VectorEnv(gymnasium.vector.VectorEnv, abc.ABC):
    """Base of jaxrunner's vector envs (see the module docstring for the contract)."""

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.SAME_STEP}
    supports_restart: ClassVar[bool] = False
    """Whether the backend can restart failed sub-envs (``restart_policy``)."""
    restart_policy: RestartPolicy | None = None
    """Set (e.g. by ``EnvRunner(restart_failed_sub_envs=True)``) to restart failed
    sub-envs instead of raising; only where ``supports_restart``."""

    # Set by subclasses in __init__.
    num_envs: int
    single_observation_space: gymnasium.Space
    single_action_space: gymnasium.Space

    def __init__(self, *, copy: bool = True) -> None:
        self.copy = copy
        self._closed_reason: str | None = None

    # -- the backend contract -------------------------------------------------------

    @abc.abstractmethod
    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, list[dict[str, Any]]]:
        """Resets every sub-env; returns the obs buffer view and per-env infos."""

    @abc.abstractmethod
    def step_batch(self, actions: Any, rows: slice | None = None) -> BatchStep:
        """Steps every sub-env once (SAME_STEP autoreset); see :class:`BatchStep`.

        With ``rows`` (a ``slice(start, stop)``), steps only those sub-envs:
        ``actions`` then holds ``stop - start`` actions, the returned arrays are those
        rows, and no other sub-env or row is touched (the runner pipelines groups).
        """

    # Optional split of step_batch, for backends whose sub-envs step in the background.
    steps_in_background: ClassVar[bool] = False
    """True if ``step_batch_async`` returns while the sub-envs step (other processes):
    the runner then sends a group's actions as soon as they are ready and waits for a
    group's results only when it needs them."""
    default_num_groups: ClassVar[int | None] = None
    """The runner's number of pipelining groups when none is given (None: its own rule)."""

    def step_batch_async(self, actions: Any, rows: slice | None = None) -> None:
        """Starts ``step_batch(actions, rows)``; :meth:`step_batch_wait` with the same
        ``rows`` returns its result. Calls for disjoint rows may be in flight together.
        This default only keeps ``actions`` (unchanged until the wait): the step runs
        in ``step_batch_wait``."""
        pending = self.__dict__.setdefault("_async_steps", {})
        key = (0, self.num_envs) if rows is None else (rows.start, rows.stop)
        if key in pending:
            raise InvalidArgumentError(
                f"step_batch_async(rows={rows}): a step of these rows is already in flight; "
                "call step_batch_wait(rows) first."
            )
        pending[key] = actions

    def step_batch_wait(self, rows: slice | None = None) -> BatchStep:
        """The result of the :meth:`step_batch_async` call with the same ``rows``."""
        key = (0, self.num_envs) if rows is None else (rows.start, rows.stop)
        try:
            actions = self.__dict__.get("_async_steps", {}).pop(key)
        except KeyError:
            raise InvalidArgumentError(
                f"step_batch_wait(rows={rows}): no step_batch_async call for these rows is "
                "in flight. Call step_batch_async(actions, rows) first, once per wait."
            ) from None
        return self.step_batch(actions, rows)

    @abc.abstractmethod
    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets sub-env ``index`` only; returns its observation and info."""

    @abc.abstractmethod
    def _obs_buffer(self) -> Any:
        """The current observations, ``[B, ...]`` (a view of the env's buffer)."""

    @abc.abstractmethod
    def _close_backend(self) -> None:
        """Releases the sub-envs (called once)."""

    # -- gymnasium's API, derived -----------------------------------------------------

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """gymnasium ``reset``: sub-env ``i`` is seeded with ``seed + i``. As in
        gymnasium, ``options["reset_mask"]`` (a bool array) resets only those envs."""
        seeds = normalize_seeds(seed, self.num_envs)
        options = dict(options) if options else None
        mask = options.pop("reset_mask", None) if options else None
        if mask is None:
            obs, infos = self.reset_batch(seeds, options)
            indices = list(range(self.num_envs))
        else:
            indices = np.flatnonzero(self._check_reset_mask(mask)).tolist()
            infos = [self.reset_at(i, seed=seeds[i], options=options)[1] for i in indices]
            obs = self._obs_buffer()
        merged: dict[str, Any] = {}
        for i, info in zip(indices, infos):
            merged = self._add_info(merged, info, i)
        return self._maybe_copy(obs), merged

    def _check_reset_mask(self, mask: Any) -> np.ndarray:
        if not (
            isinstance(mask, np.ndarray)
            and mask.dtype == np.bool_
            and mask.shape == (self.num_envs,)
            and mask.any()
        ):
            raise InvalidArgumentError(
                f"reset(options={{'reset_mask': ...}}): expected a numpy bool array of shape "
                f"({self.num_envs},) with at least one True, got {mask!r:.80}."
            )
        return mask

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """gymnasium ``step`` with SAME_STEP autoreset: where an episode ended, ``obs``
        is the reset observation and ``info["final_obs"]``/``info["final_info"]`` hold
        the final ones, exactly as ``gymnasium.vector.SyncVectorEnv`` reports them."""
        out = self.step_batch(actions)
        merged: dict[str, Any] = {}
        for i, info in enumerate(out.infos):
            if i in out.reset_infos:
                final_obs = jr_spaces.take(self.single_observation_space, out.next_obs, i)
                merged = self._add_info(merged, {"final_obs": final_obs, "final_info": info}, i)
                info = out.reset_infos[i]
            merged = self._add_info(merged, info, i)
        return (
            self._maybe_copy(out.obs),
            out.reward.copy(),
            out.terminated.copy(),
            out.truncated.copy(),
            merged,
        )

    def close_extras(self, **kwargs: Any) -> None:
        if self._closed_reason is None:
            self._closed_reason = "close() was called"
            self._close_backend()

    def __enter__(self) -> VectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # gymnasium's base has no finalizer; backends holding processes need one.
        # (No contextlib here: module globals may be gone at interpreter exit.)
        try:  # noqa: SIM105
            self.close()
        except Exception:
            pass

    # -- helpers for subclasses ----------------------------------------------------------

    def _check_open(self, what: str) -> None:
        if self._closed_reason is not None:
            raise ClosedError(
                f"{type(self).__name__}.{what}() called after the vector env was closed "
                f"({self._closed_reason}). Create a new one with jaxrunner.make_vec()."
            )

    def _check_index(self, index: int, what: str) -> None:
        if not 0 <= index < self.num_envs:
            raise EnvIndexError(f"{what}(index={index}): index must be in [0, {self.num_envs}).")

    def _values_per_env(self, name: str, values: Any) -> list[Any]:
        """``set_attr``'s values: one per sub-env, or one value for all."""
        if not isinstance(values, (list, tuple)):
            return [values] * self.num_envs
        if len(values) != self.num_envs:
            raise InvalidArgumentError(
                f"set_attr({name!r}, values): need one value per sub-env ({self.num_envs}), "
                f"got {len(values)}."
            )
        return list(values)

    def _maybe_copy(self, obs: Any) -> Any:
        if not self.copy:
            return obs
        return jr_spaces.map_structure(self.single_observation_space, np.copy, obs)

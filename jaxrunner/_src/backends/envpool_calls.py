"""EnvPool's C++ calls without its Python layer, for pools of the common single-player
layout, and what that C++ trusts, checked before it is sent (``Discrete`` actions in
range, async env ids). See docs/backends/envpool.md."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces

from jaxrunner._src.arg_checks import check_int
from jaxrunner._src.backends.malloc_arenas import allow_an_arena_per_thread
from jaxrunner._src.backends.steps import EnvIds
from jaxrunner._src.space_arrays.actions import check_action_batch, passing_batch_test
from jaxrunner.errors import EnvIndexError, InvalidActionError, InvalidArgumentError

_ACTION_KEYS = ("env_id", "players.env_id", "action")
_STATE_KEYS = ("info:env_id", "obs", "reward", "done", "trunc")


class EnvPoolStep(NamedTuple):
    """One ``recv`` of EnvPool: the answering envs' rows, in ``env_id`` order.

    The arrays are EnvPool's own, fresh at every call (the pool never writes them
    again)."""

    env_id: np.ndarray
    """[k] int32: which sub-envs answered."""
    obs: Any
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: Mapping[str, Any]
    """EnvPool's gymnasium info dict, built on first access."""


class _InfoOnRead(Mapping[str, Any]):
    """EnvPool's info dict of one call, converted by EnvPool when first read (most steps
    never read it; Atari's holds each env's 128-byte RAM)."""

    def __init__(self, pool: Any, state: list[np.ndarray], reset: bool) -> None:
        self._pool, self._state, self._reset = pool, state, reset

    @functools.cached_property
    def _built(self) -> dict[str, Any]:
        return self._pool._to(self._state, self._reset, True)[-1]

    def __getitem__(self, key: str) -> Any:
        return self._built[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._built)

    def __len__(self) -> int:
        return len(self._built)


class EnvPoolCalls:
    """``send``/``recv``/``reset`` of an ``envpool.make_gymnasium`` pool, through its C++
    calls where the pool has the common layout, else its public methods."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        config = pool.config
        self.all_ids = np.arange(int(config["num_envs"]), dtype=np.int32)
        """Every sub-env's id, in order."""
        state_keys: list[str] = list(getattr(pool, "_state_keys", ()))
        self.direct = (
            tuple(getattr(pool, "_action_keys", ())) == _ACTION_KEYS
            and config.get("max_num_players", 1) == 1
            and all(key in state_keys for key in _STATE_KEYS)
        )
        """True where the C++ calls are driven directly, False through the public API."""
        if self.direct:
            self._at = [state_keys.index(key) for key in _STATE_KEYS]
            self._take = operator.itemgetter(*self._at)
            self._action_dtype = np.dtype(pool._spec._action_spec[-1][0])

    def send(self, actions: Any, env_ids: np.ndarray | None = None) -> None:
        """Steps sub-envs ``env_ids`` (int32; None: all) with ``actions`` (one row each,
        already checked against the action space: EnvPool's C++ trusts their shape)."""
        if not self.direct:
            self.pool.send(actions, env_ids)
            return
        ids = self.all_ids if env_ids is None else env_ids
        # A copy of EnvPool's own dtype, as its send makes: the pool may read it later.
        action = np.array(actions, dtype=self._action_dtype, order="C")
        self.pool._send([ids, ids, action])

    def recv(self) -> EnvPoolStep:
        """The next answer of the pool (sync mode: the envs of the last ``send``)."""
        if not self.direct:
            obs, reward, terminated, truncated, info = self.pool.recv()
            return EnvPoolStep(np.asarray(info["env_id"]), obs, reward, terminated, truncated, info)
        state = self.pool._recv()
        ids, obs, reward, done, trunc = self._take(state)
        info = _InfoOnRead(self.pool, state, False)
        return EnvPoolStep(ids, obs, reward, done & ~trunc, trunc, info)

    def step(self, actions: Any, env_ids: np.ndarray | None = None) -> EnvPoolStep:
        """:meth:`send` then :meth:`recv`: one sync-mode step."""
        self.send(actions, env_ids)
        return self.recv()

    def reset(self, env_ids: np.ndarray) -> tuple[np.ndarray, Any, Mapping[str, Any]]:
        """Resets sub-envs ``env_ids`` (int32); returns the ids that answered, their
        first observations and their info (sync mode: in ``env_ids`` order)."""
        if not self.direct:
            obs, info = self.pool.reset(env_ids)
            return np.asarray(info["env_id"]), obs, info
        self.pool._reset(env_ids)
        state = self.pool._recv()
        return state[self._at[0]], state[self._at[1]], _InfoOnRead(self.pool, state, True)


def import_envpool() -> Any:
    try:
        import envpool  # type: ignore[import-not-found]  # the optional extra, absent in CI
    except ImportError as err:
        raise ImportError(
            "make_vec(backend='envpool') needs EnvPool: pip install 'jaxrunner[envpool]' "
            "(Linux x86_64/aarch64 wheels)."
        ) from err
    return envpool


def pool_builder(
    where: str, task_id: str, num_envs: int, kwargs: dict[str, Any], batch_size: int | None = None
) -> Callable[[int | list[int]], Any]:
    """``envpool.make_gymnasium`` of this pool, by seed (an int: sub-env ``i`` gets
    ``seed + i``) or one seed per sub-env; refuses the arguments jaxrunner sets itself."""
    envpool = import_envpool()
    # The classes are built without make_vec too: EnvPool's C++ asserts on num_envs < 1
    # and aborts the whole process on a negative thread count.
    check_int(where, "num_envs", num_envs)
    check_int(where, "num_threads", kwargs.get("num_threads", 0), low=0, hint="0: EnvPool's own")
    for name in ("env_seed", "batch_size", "num_envs"):
        if name in kwargs:
            raise InvalidArgumentError(
                f"{where}({name}=...): set by jaxrunner (seeds come from seed= and reset, "
                "num_envs and batch_size from make_vec's arguments)."
            )
    sizes = {"num_envs": num_envs}
    if batch_size is not None:  # async mode
        sizes["batch_size"] = batch_size

    def build(seeds: int | list[int]) -> Any:
        each = [seeds, seeds + num_envs - 1] if isinstance(seeds, int) else seeds
        outside = [s for s in each if not -(2**31) <= s < 2**31]
        if outside:  # EnvPool's own check is a bare assert
            raise InvalidArgumentError(
                f"{where}: EnvPool seeds each sub-env with an int32, and these seeds reach "
                f"{max(outside, key=abs)} (sub-env i gets seed + i); pass seeds in "
                "[-2**31, 2**31 - 1]."
            )
        by = {"seed": seeds} if isinstance(seeds, int) else {"env_seed": seeds}
        if task_id not in envpool.list_all_envs():  # EnvPool's own check is a bare assert
            raise InvalidArgumentError(
                f"{where}({task_id!r}): not an EnvPool task; envpool.list_all_envs() names "
                "them (for a gymnasium id, use another backend, e.g. 'sync')."
            )
        allow_an_arena_per_thread()  # before the pool's threads first allocate
        return envpool.make_gymnasium(task_id, **sizes, **by, **kwargs)

    return build


def every_seed(seeds: Sequence[int | None]) -> list[int]:
    """``seeds`` for EnvPool, which seeds every sub-env when the pool is built: one per
    sub-env, or an error naming the fix."""
    given = [int(s) for s in seeds if s is not None]
    if len(given) < len(seeds):
        raise InvalidArgumentError(
            "reset(seed=[...]): EnvPool needs a seed for every sub-env or none."
        )
    return given


class EnvPoolActions:
    """Checks one pool's action batches before EnvPool's C++, which trusts them: the
    common batch passes inline (one ``passing_batch_test`` per batch size); any other goes
    through ``check_action_batch`` (its range checks come before any cast could wrap a
    value), whose error names the task, the row, its sub-env and the value."""

    def __init__(self, task_id: str, space: spaces.Space) -> None:
        self.task_id, self.space = task_id, space
        self._passes: dict[int, Callable[[Any], bool] | None] = {}

    def __call__(self, actions: Any, rows: np.ndarray) -> Any:
        n = len(rows)
        if n not in self._passes:
            self._passes[n] = passing_batch_test(self.space, (n,))
        passes = self._passes[n]
        if passes is not None and passes(actions):
            return actions
        try:
            return check_action_batch(
                self.space, actions, n, row_name=lambda i: f"sub-env {rows[i]}"
            )
        except InvalidActionError as err:
            raise InvalidActionError(
                f"EnvPool {self.task_id}: {err} EnvPool's C++ does not check actions (one far "
                "out of range crashes the process)."
            ) from None


def check_env_ids(env_ids: EnvIds, num_envs: int, in_flight: np.ndarray, who: str) -> np.ndarray:
    """The ``env_ids`` of an async ``send`` (None: all, a slice, or distinct ids in
    range) as an int32 array, refusing any still ``in_flight``."""
    if env_ids is None or isinstance(env_ids, slice):
        ids = np.arange(num_envs)[slice(None) if env_ids is None else env_ids]
    else:
        ids = np.asarray(env_ids)
        if ids.ndim == 0:  # one id
            ids = ids.reshape(1)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise InvalidArgumentError(
                f"{who}.send(env_ids={env_ids!r}): expected None, a slice or a 1-d array of "
                "integer env ids."
            )
        if len(ids) and (ids.min() < 0 or ids.max() >= num_envs):
            bad = ids[(ids < 0) | (ids >= num_envs)][0]
            raise EnvIndexError(
                f"{who}.send(env_ids=...): env id {bad} is not in [0, {num_envs}); pass the "
                "ids of the envs to step."
            )
    if len(ids) == 0:
        raise InvalidArgumentError(f"{who}.send(env_ids={env_ids!r}): no env to step.")
    ids = ids.astype(np.int32)  # a copy (EnvPool may read it later), in range: its dtype
    if np.bincount(ids, minlength=num_envs).max() > 1:  # (a fifth of np.unique's cost)
        raise InvalidArgumentError(
            f"{who}.send(env_ids={ids.tolist()}): an env id is repeated; each env steps once "
            "per send."
        )
    busy = in_flight[ids]
    if busy.any():
        raise InvalidArgumentError(
            f"{who}.send(env_ids=...): envs {ids[busy].tolist()} are still stepping; recv() "
            "their results before sending them again."
        )
    return ids


class NoSubEnvAccess:
    """EnvPool's sub-envs live in its C++ threads: no per-sub-env calls or attributes,
    in either mode (its pool has no ``call``/``get_attr``/``set_attr`` to forward to)."""

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        raise self._no_sub_envs("call")

    def get_attr(self, name: str) -> tuple[Any, ...]:
        raise self._no_sub_envs("get_attr")

    def set_attr(self, name: str, values: Any) -> None:
        raise self._no_sub_envs("set_attr")

    def get_sub_environments(self) -> list[Any]:
        self._check_open("get_sub_environments")  # type: ignore[attr-defined]
        raise self._no_sub_envs("get_sub_environments")

    def _no_sub_envs(self, what: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{type(self).__name__}.{what}(): EnvPool's sub-envs are not Python objects "
            "this process can reach; use the 'sync' or 'process' backend for per-sub-env "
            "access."
        )

"""``backend="envpool"`` with ``num_pools=k``: the envs in ``k`` EnvPool pools in sync mode,
one per pipelining split, so the runner computes one pool's actions while the others'
threads step (docs/backends/envpool.md, "Pools stepped in turn")."""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.arg_checks import check_seed_count
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.checked_sends import ChecksOnSend
from jaxrunner._src.backends.envpool import EnvPoolVectorEnv
from jaxrunner._src.backends.envpool_calls import EnvPoolActions, NoSubEnvAccess
from jaxrunner._src.backends.steps import BatchStep, EnvIds, block_rows
from jaxrunner._src.backends.vector_infos import SplitInfos
from jaxrunner.errors import InvalidArgumentError


class EnvPoolPoolsVectorEnv(ChecksOnSend, NoSubEnvAccess, VectorEnv):
    """``num_envs`` sub-envs in ``num_pools`` EnvPool pools of (nearly) equal size, each
    an :class:`~jaxrunner._src.backends.envpool.EnvPoolVectorEnv` in sync mode; sub-env
    ``i`` is seeded ``seed + i`` as in one pool, so the trajectories are one pool's.
    ``send`` takes all envs or one pool's (a slice at its edges); ``recv`` answers in the
    order sent."""

    def __init__(
        self, task_id: str, num_envs: int, num_pools: int, *, seed: int = 0, **kwargs: Any
    ) -> None:
        super().__init__(copy=kwargs.get("copy", True))
        if not 2 <= num_pools <= num_envs:
            self._closed_reason = "construction failed"
            raise InvalidArgumentError(
                f"make_vec(backend='envpool', num_pools={num_pools}): expected 1 (one pool) "
                f"or 2..num_envs={num_envs} pools."
            )
        self.task_id, self.num_envs = task_id, num_envs
        self.bounds = tuple(np.linspace(0, num_envs, num_pools + 1).round().astype(int).tolist())
        self.pools: list[EnvPoolVectorEnv] = []
        try:
            for lo, hi in zip(self.bounds, self.bounds[1:]):
                self.pools.append(EnvPoolVectorEnv(task_id, hi - lo, seed=seed + lo, **kwargs))
        except BaseException:
            self._close_backend()
            self._closed_reason = "construction failed"
            raise
        first = self.pools[0]
        self._take_spaces(first.single_observation_space, first.single_action_space, {}, None)
        self.metadata = {**self.metadata, **first.metadata}
        self.keep_reset_steps = first.keep_reset_steps
        self.capabilities = Capabilities(
            reset_steps=first.capabilities.reset_steps,
            steps_in_background=first.capabilities.steps_in_background,
            answers_held=first.capabilities.answers_held,  # (each pool's rows: its own)
            pipeline_bounds=self.bounds,
            whole_blocks=True,
        )
        # The observations every step writes (the runner's views of them hold from step
        # to step, as of one pool's), and each pool's rows of them.
        self._obs = space_arrays.allocate(self.single_observation_space, (num_envs,))
        self._pool_obs = [
            space_arrays.rows(self.single_observation_space, self._obs, slice(lo, hi))
            for lo, hi in zip(self.bounds, self.bounds[1:])
        ]
        self._sent: collections.deque[list[int]] = collections.deque()  # pools per send
        self._action_check = EnvPoolActions(task_id, self.single_action_space)
        self._ids = np.arange(num_envs)

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, list[dict[str, Any]]]:
        self._check_open("reset")
        check_seed_count(seeds, self.num_envs, type(self).__name__)
        infos: list[dict[str, Any]] = []
        for k, pool in enumerate(self.pools):
            lo, hi = self.bounds[k], self.bounds[k + 1]
            obs, pool_infos = pool.reset_batch(list(seeds[lo:hi]), options)
            space_arrays.copy_into(self.single_observation_space, self._obs, obs, slice(lo, hi))
            infos.extend(_global_info(info, lo) for info in pool_infos)
        self._sent.clear()  # a reset drops what was in flight, as each pool's does
        return self._obs, infos

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._check_reset_at(index, seed, options)
        k = int(np.searchsorted(self.bounds, index, side="right")) - 1
        obs, info = self.pools[k].reset_at(index - self.bounds[k], seed=seed, options=options)
        space_arrays.copy_into(self.single_observation_space, self._obs, obs, index)
        return obs, _global_info(info, self.bounds[k])

    def _send_actions(self, actions: Any, env_ids: EnvIds, checked: bool) -> None:
        self._check_open("step")
        lo, hi = block_rows(env_ids, self.num_envs, type(self).__name__)
        first = self.bounds.index(lo) if lo in self.bounds else -1
        if first < 0 or hi not in self.bounds:
            raise InvalidArgumentError(
                f"{type(self).__name__}.send(env_ids={env_ids!r}): each pool steps all its "
                f"sub-envs at once; send None or whole pools, a slice at the pool edges "
                f"{list(self.bounds)}."
            )
        # Checked whole, once, before any pool steps (an error names the sub-env, not its
        # row in its pool).
        if not checked:
            actions = self._action_check(actions, self._ids[lo:hi])  # (a list: as an array)
        pools = list(range(first, self.bounds.index(hi)))
        busy = sorted({k for sent in self._sent for k in sent} & set(pools))
        if busy:
            b_lo, b_hi = self.bounds[busy[0]], self.bounds[busy[0] + 1]
            raise InvalidArgumentError(
                f"{type(self).__name__}.send(env_ids={env_ids!r}): sub-envs {b_lo}..{b_hi - 1} "
                "(a pool) are still stepping; recv() their results before sending them again."
            )
        parts = [
            space_arrays.tree_map(
                lambda a, k=k: a[self.bounds[k] - lo : self.bounds[k + 1] - lo], actions
            )
            for k in pools
        ]
        for k, part in zip(pools, parts):
            self.pools[k].send_checked(part)
        self._sent.append(pools)

    def recv(self) -> BatchStep:
        self._check_open("step")
        if not self._sent:
            raise InvalidArgumentError(
                f"{type(self).__name__}.recv(): no send() is waiting for its results; call "
                "send(actions) first, once per recv()."
            )
        pools = self._sent.popleft()
        if len(pools) == 1:  # the runner's split
            return self._answer(pools[0])
        outs = [self._answer(k) for k in pools]
        rows = slice(self.bounds[pools[0]], self.bounds[pools[-1] + 1])
        return self._joined(outs, pools, rows)

    def _answer(self, k: int) -> BatchStep:
        """Pool ``k``'s answer as this env's rows: its observations in this env's buffer,
        its infos' EnvPool env ids made this env's (read on access, as the pool's)."""
        out, lo, hi = self.pools[k].recv(), self.bounds[k], self.bounds[k + 1]
        obs = self._pool_obs[k]
        space_arrays.copy_into(self.single_observation_space, obs, out.obs)
        infos, reset_infos = out.infos, out.reset_infos
        if lo and isinstance(infos, SplitInfos):
            infos = SplitInfos(_GlobalIds(infos.merged, lo), len(infos))
        elif lo:
            infos = [_global_info(info, lo) for info in infos]
        if lo and reset_infos:
            reset_infos = {i: _global_info(info, lo) for i, info in reset_infos.items()}
        next_obs = obs if out.next_obs is out.obs else out.next_obs
        return out._replace(
            obs=obs, next_obs=next_obs, infos=infos, reset_infos=reset_infos,
            env_ids=slice(lo, hi),
        )  # fmt: skip

    def _joined(self, outs: list[BatchStep], pools: list[int], rows: slice) -> BatchStep:
        """The answers of several pools as one step of their envs ``rows``."""
        space = self.single_observation_space

        def joined(*trees: Any) -> Any:
            return space_arrays.map_structure(space, lambda *xs: np.concatenate(xs), *trees)

        reset_infos = {
            self.bounds[k] - rows.start + i: info
            for k, out in zip(pools, outs)
            for i, info in out.reset_infos.items()
        }
        resets = [out.reset_rows for out in outs]
        if any(r is not None for r in resets):
            reset_rows = np.concatenate(
                [
                    np.zeros(len(o.reward), np.bool_) if r is None else r
                    for o, r in zip(outs, resets)
                ]
            )
        else:
            reset_rows = None
        obs = space_arrays.rows(space, self._obs, rows)
        next_obs = obs if outs[0].next_obs is outs[0].obs else joined(*(o.next_obs for o in outs))
        return BatchStep(
            obs, next_obs,
            np.concatenate([o.reward for o in outs]), np.concatenate([o.terminated for o in outs]),
            np.concatenate([o.truncated for o in outs]), [i for o in outs for i in o.infos],
            reset_infos, env_ids=None if rows == slice(0, self.num_envs) else rows,
            reset_rows=reset_rows,
        )  # fmt: skip

    def _close_backend(self) -> None:
        for pool in self.pools:
            pool.close()

    def render(self) -> Any:
        raise self._no_sub_envs("render")


def _global_info(info: Mapping[str, Any], lo: int) -> Any:
    """A pool's info dict with EnvPool's env ids (``env_id``, and ``players``' own) offset
    by the pool's first sub-env ``lo``."""
    if not lo:
        return info
    return {k: _global_value(k, v, lo) for k, v in info.items()}


def _global_value(key: str, value: Any, lo: int) -> Any:
    if isinstance(value, Mapping):
        return _global_info(value, lo)
    return value + lo if key == "env_id" else value


class _GlobalIds(Mapping[str, Any]):
    """A pool's merged infos, its env ids offset by ``lo`` when read."""

    def __init__(self, merged: Mapping[str, Any], lo: int) -> None:
        self._merged, self._lo = merged, lo

    def __getitem__(self, key: str) -> Any:
        return _global_value(key, self._merged[key], self._lo)

    def __iter__(self) -> Iterator[str]:
        return iter(self._merged)

    def __len__(self) -> int:
        return len(self._merged)

"""``backend="envpool"``: EnvPool's C++ vector envs behind jaxrunner's contract.

EnvPool (extra ``jaxrunner[envpool]``) steps its sub-envs in C++ threads and speaks
gymnasium's vector API with NEXT_STEP autoreset. :class:`EnvPoolVectorEnv` adopts it
like :class:`~jaxrunner._src.backends.gymnasium_adapter.GymnasiumVectorEnv` does any gymnasium
vector env, with EnvPool's own tools for what gymnasium lacks:

* Masked reset: ``reset(env_id=ids)`` resets exactly those sub-envs (EnvPool clears
  their pending autoreset), so NEXT_STEP's reset step is never taken nor emitted.
* Seeds: EnvPool seeds sub-env ``i`` with ``seed + i`` (or ``env_seed[i]``) when the
  pool is built and ignores ``reset(seed=...)``. A seeded ``reset_batch`` therefore
  rebuilds the pool with those seeds (cheap: about 50 ms for 4096 CartPoles), which
  gives gymnasium's semantics: the same seed, the same episodes.

This module is sync mode (``batch_size`` equal to ``num_envs``); async mode, sampled
ready-first, is :mod:`jaxrunner._src.backends.envpool_async`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np

from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.gymnasium_adapter import GymnasiumVectorEnv, _gymnasium_seed
from jaxrunner._src.backends.vector_infos import SplitInfos
from jaxrunner.errors import InvalidArgumentError


def _import_envpool() -> Any:
    try:
        import envpool  # type: ignore[import-not-found]  # the optional extra, absent in CI
    except ImportError as err:
        raise ImportError(
            "make_vec(backend='envpool') needs EnvPool: pip install 'jaxrunner[envpool]' "
            "(Linux x86_64/aarch64 wheels)."
        ) from err
    return envpool


def every_seed(seeds: Sequence[int | None]) -> list[int]:
    """``seeds`` for EnvPool, which seeds every sub-env when the pool is built: one per
    sub-env, or an error naming the fix."""
    given = [int(s) for s in seeds if s is not None]
    if len(given) < len(seeds):
        raise InvalidArgumentError(
            "reset(seed=[...]): EnvPool needs a seed for every sub-env or none."
        )
    return given


def reset_envpool(
    env: gymnasium.vector.VectorEnv,
    mask: np.ndarray,
    seeds: list[int | None] | None,
    options: dict[str, Any] | None,
) -> tuple[Any, Sequence[dict[str, Any]]]:
    """A :data:`~jaxrunner._src.backends.masked_reset.MaskedReset` for EnvPool's gymnasium
    envs: ``reset(env_id=...)`` resets those sub-envs and returns their rows only."""
    if (seeds is not None and any(s is not None for s in seeds)) or options:
        raise InvalidArgumentError(
            "EnvPool seeds its sub-envs when the pool is built and takes no reset options; "
            "reset one sub-env without seed/options, or reset them all with reset(seed=...)."
        )
    ids = np.flatnonzero(mask).astype(np.int32)
    envpool_env: Any = env  # EnvPool's reset takes env ids, unlike gymnasium's
    obs, info = envpool_env.reset(ids)
    _check_order(info, ids)
    return obs, SplitInfos(info, len(ids))  # split on access: most steps never read them


def _check_order(info: dict[str, Any], ids: np.ndarray) -> None:
    got = info.get("env_id")
    if got is not None and not np.array_equal(got, ids):
        raise RuntimeError(
            f"EnvPool returned sub-envs {np.asarray(got)[:8]}... where {ids[:8]}... were "
            "expected (sync mode keeps env_id order); this EnvPool version is not supported."
        )


class EnvPoolVectorEnv(GymnasiumVectorEnv):
    """An EnvPool pool in sync mode (see the module docstring).

    Args:
        task_id: an EnvPool task id (``envpool.list_all_envs()``), e.g. ``"CartPole-v1"``.
        num_envs: number of sub-envs.
        seed: the pool's seed until a seeded ``reset``: sub-env ``i`` gets ``seed + i``.
        copy: if True, ``reset``/``step`` return copies of the observation buffer.
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
        **envpool_kwargs: Any,
    ) -> None:
        envpool = _import_envpool()
        for name in ("env_seed", "batch_size", "num_envs"):
            if name in envpool_kwargs:
                raise InvalidArgumentError(
                    f"EnvPoolVectorEnv({name}=...): set by jaxrunner (seeds come from reset, "
                    "num_envs from the argument, and only sync mode is supported)."
                )
        self.task_id, self._envpool_kwargs = task_id, envpool_kwargs

        def build(seeds: int | list[int]) -> Any:
            by = {"seed": seeds} if isinstance(seeds, int) else {"env_seed": seeds}
            return envpool.make_gymnasium(task_id, num_envs=num_envs, **by, **envpool_kwargs)

        self._build = build
        self._stepped = False
        super().__init__(build(seed), masked_reset=reset_envpool, copy=copy)

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, Sequence[dict[str, Any]]]:
        self._check_open("reset")
        if options:
            raise InvalidArgumentError(
                f"reset(options={options!r}): EnvPool takes no reset options."
            )
        seed = _gymnasium_seed(seeds)
        if seed is not None:
            # The seed is fixed when the pool is built: build a new pool with these seeds.
            seed = seed if isinstance(seed, int) else every_seed(seed)
            old, self.env = self.env, self._build(seed)
            old.close()
        obs, infos = super().reset_batch([None] * self.num_envs)
        if isinstance(infos, SplitInfos):
            _check_order(dict(infos.merged), np.arange(self.num_envs))
        return obs, infos


def make_envpool_vec(
    task_id: str, num_envs: int, batch_size: int | None = None, **kwargs: Any
) -> VectorEnv:
    """``make_vec(task_id, num_envs, backend="envpool", **kwargs)``: sync mode, or with
    ``batch_size < num_envs`` EnvPool's async mode
    (:class:`~jaxrunner._src.backends.envpool_async.EnvPoolAsyncVectorEnv`), which the runner
    samples ready-first."""
    if not isinstance(task_id, str):
        raise InvalidArgumentError(
            f"make_vec(env=..., backend='envpool'): expected an EnvPool task id (str), got "
            f"{type(task_id).__name__}."
        )
    if batch_size is not None and batch_size != num_envs:
        from jaxrunner._src.backends.envpool_async import EnvPoolAsyncVectorEnv

        return EnvPoolAsyncVectorEnv(task_id, num_envs, batch_size, **kwargs)
    return EnvPoolVectorEnv(task_id, num_envs, **kwargs)


__all__ = ["EnvPoolVectorEnv", "make_envpool_vec", "reset_envpool"]

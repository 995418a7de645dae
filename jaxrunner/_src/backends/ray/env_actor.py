"""The body of one env actor of ``backend="ray"``: a block of sub-envs in a
:class:`~jaxrunner.SyncVectorEnv` (so the shared step loop of
:mod:`jaxrunner._src.backends.gymnasium_block`: validation, SAME_STEP autoreset, restarts)."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium

from jaxrunner._src.backends.batch_step import BatchStep
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.sub_env_block import SubEnvBlock
from jaxrunner._src.backends.sync import SyncVectorEnv

EnvFactory = Callable[[], gymnasium.Env]


def _portable(err: BaseException) -> BaseException:
    """``err`` if it survives pickling (it crosses a process boundary), else a
    RuntimeError carrying its repr."""
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:
        return RuntimeError(repr(err))
    return err


class ActorBody:
    """What every env actor does with its block of sub-envs (``block``) beside stepping."""

    block: SubEnvBlock

    def num_restarts(self) -> int:
        return self.block.num_restarts

    def call(self, name: str, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        return self.block.call(name, args, kwargs)

    def get_attr(self, name: str) -> list[Any]:
        return self.block.get_attr(name)

    def set_attr(self, name: str, values: list[Any]) -> None:
        self.block.set_attr(name, values)

    def render(self) -> list[Any]:
        return self.block.render()

    def on_sub_env(self, index: int, method: str, args: tuple) -> Any:
        """A sub-env handle's request, run on the block's sub-env ``index`` alone."""
        return self.block.on_sub_env(self.block.offset + index, method, args)

    def close(self) -> None:
        self.block.close()


class EnvWorker(ActorBody):
    """The body of one env actor: a SyncVectorEnv over a block of sub-envs. Returns
    copies of its buffers (Ray serializes return values) and portable errors."""

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        restart_policy: RestartPolicy | None,
        offset: int = 0,  # the caller re-indexes errors (the actor pool's convention)
    ) -> None:
        self.envs = SyncVectorEnv(env_fns, copy=False, restart_policy=restart_policy)
        self.block = self.envs._block

    def describe(self) -> tuple[gymnasium.Space, gymnasium.Space, dict[str, Any], Any]:
        envs = self.envs
        return (
            envs.single_observation_space,
            envs.single_action_space,
            envs.metadata,
            envs.render_mode,
        )

    def reset(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None
    ) -> tuple[Any, list[dict[str, Any]]]:
        return self.envs.reset_batch(seeds, options)

    def reset_at(
        self, index: int, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[Any, dict[str, Any]]:
        return self.envs.reset_at(index, seed=seed, options=options)

    def step(self, lo: int, hi: int, actions: Any) -> BatchStep:
        """Steps rows ``[lo, hi)`` of the block (``actions`` holds those rows)."""
        whole = (lo, hi) == (0, self.envs.num_envs)
        out = self.envs.step_batch(actions, None if whole else slice(lo, hi))
        if out.errors:
            out = out._replace(errors={i: _portable(e) for i, e in out.errors.items()})
        return out

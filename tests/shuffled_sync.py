"""Ready-first test doubles: the sync backends, answering envs in a seeded random order."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

import jaxrunner as jr
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.steps import BatchStep
from jaxrunner._src.backends.sync import SyncMultiAgentVectorEnv


class ShuffledSync(jr.SyncVectorEnv):
    """A ready-first backend in one process: each send is split into single envs, and
    ``recv`` steps pending envs in a seeded random order, ``batch`` at a time (an int
    array of env ids), or one at a time (a slice) without a batch size."""

    def __init__(self, env_fns: Any, batch: int | None, buckets: tuple[int, ...]) -> None:
        super().__init__(env_fns)
        self.capabilities = Capabilities(
            ready_first=True, recv_batch_size=batch, batch_buckets=buckets, any_order=True
        )
        self._batch = batch
        self._rng = np.random.default_rng(0)
        self._waiting: dict[int, Any] = {}

    def send(self, actions: Any, env_ids: Any = None) -> None:
        index = np.arange(self.num_envs)[slice(None) if env_ids is None else env_ids]
        for j, i in enumerate(np.atleast_1d(index).tolist()):
            self._waiting[i] = np.asarray(actions)[j]

    def recv(self) -> BatchStep:
        pending = sorted(self._waiting)
        count = 1 if self._batch is None else self._batch
        chosen = self._rng.choice(pending, size=count, replace=False)
        outs, infos = [], []
        for i in chosen.tolist():
            out = self.step_batch(self._waiting.pop(i)[None], slice(i, i + 1))
            infos.append(dict(out.infos[0]))
            outs.append(
                jax.tree.map(np.copy, out._replace(infos=None, reset_infos=None, env_ids=None))
            )
        stack = jax.tree.map(lambda *xs: np.concatenate(xs), *outs)
        env_ids: Any = slice(int(chosen[0]), int(chosen[0]) + 1) if self._batch is None else chosen
        return stack._replace(infos=infos, reset_infos={}, env_ids=env_ids)


class ShuffledMultiAgentSync(SyncMultiAgentVectorEnv):
    """:class:`ShuffledSync` for multi-agent envs: ``recv`` steps one pending env, in a
    seeded random order, and answers it as a block of one."""

    def __init__(self, env_fns: Any, buckets: tuple[int, ...]) -> None:
        super().__init__(env_fns)
        self.capabilities = Capabilities(ready_first=True, batch_buckets=buckets, any_order=True)
        self._rng = np.random.default_rng(0)
        self._waiting: dict[int, list[Any]] = {}

    def send(self, actions: Any, env_ids: Any = None) -> None:
        index = np.arange(self.num_envs)[slice(None) if env_ids is None else env_ids]
        for j, i in enumerate(np.atleast_1d(index).tolist()):
            self._waiting[i] = [np.asarray(a)[j : j + 1] for a in actions]

    def recv(self) -> Any:
        i = int(self._rng.choice(sorted(self._waiting)))
        super().send(self._waiting.pop(i), slice(i, i + 1))
        return super().recv()

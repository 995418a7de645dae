"""``RayConfig``: the options of ``backend="ray"``, checked once; and Ray's import."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrunner._src.arg_checks import check_bool, check_int, check_number, is_int
from jaxrunner.errors import InvalidArgumentError


def import_ray() -> Any:
    """The ``ray`` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as err:
        raise ImportError(
            f"jaxrunner's Ray support needs Ray: pip install 'jaxrunner[ray]' ({err})"
        ) from err
    return ray


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayConfig:
    """How ``backend="ray"`` places sub-envs in actors and how the runner batches them.

    Give it to :class:`~jaxrunner.RayVectorEnv` or to
    ``make_vec(..., backend="ray", config=...)``.
    """

    envs_per_actor: int = 4
    """Sub-envs per Ray actor (the last actor may hold fewer). They step together: more
    per actor means fewer messages, fewer means finer-grained dynamic batching."""
    num_cpus_per_actor: float = 1.0
    """Ray CPU resources each env actor reserves (fractions allowed, e.g. 0.5)."""
    remote_env_batch_wait_ms: float = 0.0
    """Ready-first gymnasium envs: after the first actor's results arrive, how long the
    runner waits for more before computing actions, all of them in one step (0: take
    whatever is ready now). Longer waits give larger policy batches, shorter ones lower
    latency. Multi-agent envs take each actor's step on its own."""
    batch_buckets: tuple[int, ...] | None = None
    """Ready-first envs' policy batch sizes: the ready envs are padded to the smallest
    bucket that holds them, and each bucket is compiled once, up front. None: gymnasium
    envs get the default buckets (multiples of the policy's chunk), multi-agent envs act
    per actor's block. Any buckets give the sync backend's bits: the policy runs in
    fixed-size chunks whatever the batch (batch invariance)."""
    step_timeout_s: float | None = None
    """An actor whose step has not answered after this long is treated as dead (killed,
    and replaced if restarts are on); so is one whose ``call``, ``get_attr``, ``set_attr``
    or ``render`` has not (killed, a RemoteTimeoutError). None: wait forever."""
    actor_start_timeout_s: float = 120.0
    """How long to wait for a new actor to start and reset its sub-envs (the cluster may
    lack the resources to place it)."""
    ready_first: bool | None = None
    """How ``recv()`` answers. True: ready-first, ``send`` covers whole actors and
    ``recv()`` answers whichever actor is ready (``batch_buckets`` applies, and for
    gymnasium envs ``remote_env_batch_wait_ms``). False: lockstep, ``recv()`` answers the
    sends in order and a send may be any block of envs. None (default): ready-first for
    gymnasium envs, lockstep for multi-agent (PettingZoo) envs."""

    def __post_init__(self) -> None:
        check_int("RayConfig", "envs_per_actor", self.envs_per_actor)
        if self.ready_first is not None:
            check_bool("RayConfig", "ready_first", self.ready_first)
        for name in ("actor_start_timeout_s", "step_timeout_s"):
            none = "to wait forever" if name == "step_timeout_s" else None
            check_number("RayConfig", name, getattr(self, name), low_open=True, none=none)
        for name in ("num_cpus_per_actor", "remote_env_batch_wait_ms"):
            check_number("RayConfig", name, getattr(self, name))
        if self.batch_buckets is not None and (
            not isinstance(self.batch_buckets, tuple)
            or not self.batch_buckets
            or not all(is_int(b) for b in self.batch_buckets)
        ):
            raise InvalidArgumentError(
                f"RayConfig(batch_buckets={self.batch_buckets!r}): expected None or a "
                "non-empty tuple of ints >= 1, e.g. (8, 16, 32)."
            )

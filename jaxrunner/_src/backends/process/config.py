"""``ProcessConfig``: the options of ``backend="process"``, checked once."""

from __future__ import annotations

import dataclasses

from jaxrunner._src.arg_checks import check_bool, check_int, check_number
from jaxrunner._src.backends.process.launch import (
    DEFAULT_STEP_TIMEOUT_S,
    START_METHODS,
    available_cpus,
)
from jaxrunner.errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProcessConfig:
    """How ``backend="process"`` places sub-envs in worker processes and steps them.

    Give it to :class:`~jaxrunner.ProcessVectorEnv` or to
    ``make_vec(..., backend="process", config=...)``.
    """

    envs_per_worker: int | None = None
    """Sub-envs per worker process (the last may have fewer). Give this or
    ``num_workers``, not both."""
    num_workers: int | None = None
    """Alternatively, the number of worker processes (sub-envs are split evenly).
    Default (both None): one per CPU but one (the main process runs the policy), or one
    per CPU from 256 sub-envs; at least one, at most one per sub-env."""
    start_method: str = "forkserver"
    """``"forkserver"`` (workers start in milliseconds) or ``"spawn"``; never ``"fork"``
    (forking a process that has started JAX's threads can deadlock the child)."""
    step_timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S
    """How long a worker may take to answer a command (a step of its sub-envs, restarts
    of failed ones included; a reset; a call), counted from when it was sent. None
    waits forever. The default, 300 s, only catches real hangs; lower it to what your
    envs need, since a hang costs this long. Building a worker's sub-envs may take
    ``max(60 s, step_timeout_s)``."""
    ready_first: bool = False
    """False (default): lockstep; ``recv()`` answers the sends in order, and the runner
    pipelines splits of the workers. True: ``recv()`` returns whichever worker answers
    first (``BatchStep.env_ids`` is its slice); ``send`` then takes whole workers."""
    main_process_envs: int | None = None
    """Sub-envs (the first ones) stepped in the main process itself, as worker 0, while
    the workers step the rest; lockstep only. It pays where env steps cost more than the
    policy, e.g. ``num_envs // 2`` with one worker on 2 cores (``docs/performance.md``,
    process layouts); those sub-envs are not isolated: a hang or a hard crash there stops
    the main process. 0 or None (default): every sub-env in a worker process."""
    spin_wait_us: float | None = None
    """How long, in microseconds, each side busy-waits for the other's message before it
    sleeps (a wake-up costs tens of microseconds). None (default): ``DEFAULT_SPIN_WAIT_US``
    (2 ms) where every process has a CPU of its own (workers < available CPUs), else 0.
    0: always sleep. The budget backs off while spinning does not pay or the machine is
    loaded."""

    def __post_init__(self) -> None:
        for name in ("envs_per_worker", "num_workers"):
            check_int("ProcessConfig", name, getattr(self, name), none="for a default from CPUs")
        if self.envs_per_worker is not None and self.num_workers is not None:
            raise InvalidArgumentError(
                f"ProcessConfig(envs_per_worker={self.envs_per_worker}, num_workers="
                f"{self.num_workers}): give one of them; the other follows from num_envs."
            )
        if self.start_method not in START_METHODS:
            raise InvalidArgumentError(
                f"ProcessConfig(start_method={self.start_method!r}): expected one of "
                f"{START_METHODS}. 'fork' is refused: forking a process that has started "
                "JAX's threads can deadlock the child."
            )
        check_number(
            "ProcessConfig", "step_timeout_s", self.step_timeout_s, low_open=True,
            hint="seconds", none="to wait for the workers forever",
        )  # fmt: skip
        check_bool("ProcessConfig", "ready_first", self.ready_first)
        check_number(
            "ProcessConfig", "spin_wait_us", self.spin_wait_us, high_open=True,
            hint="microseconds; 0: never spin", none="for the default",
        )  # fmt: skip
        share = self.main_process_envs
        check_int(
            "ProcessConfig", "main_process_envs", share, low=0,
            hint="0: every sub-env in a worker", none="for the default",
        )  # fmt: skip
        if share and self.ready_first:
            raise InvalidArgumentError(
                f"ProcessConfig(main_process_envs={share}, ready_first=True): the main process "
                "steps its share in lockstep, which a ready-first env cannot wait for. Use "
                "main_process_envs=0 (or None) with ready_first=True, or ready_first=False."
            )


DEFAULT_SPIN_WAIT_US = 2000.0  # longer than a step of cheap envs, short beside slow ones


def spin_wait_s(config: ProcessConfig, num_workers: int) -> float:
    """The spin budget in seconds: ``config.spin_wait_us``, with None as
    :data:`DEFAULT_SPIN_WAIT_US` where the workers leave the main process a CPU, else 0."""
    if config.spin_wait_us is not None:
        return float(config.spin_wait_us) * 1e-6
    return DEFAULT_SPIN_WAIT_US * 1e-6 if num_workers < available_cpus() else 0.0


def main_process_share(num_envs: int, config: ProcessConfig) -> int:
    """How many sub-envs (the first ones) step in the main process; None is 0 (whether the
    share pays is unknown at build time, and it gives up the workers' isolation)."""
    share = config.main_process_envs
    if share is None:
        return 0
    share = int(share)
    if share >= num_envs:
        raise InvalidArgumentError(
            f"ProcessConfig(main_process_envs={share}) with num_envs={num_envs}: the workers "
            f"need at least one sub-env; give main_process_envs < {num_envs}, or use "
            "backend='sync' to step every sub-env in the main process."
        )
    if config.num_workers is not None and config.num_workers > num_envs - share:
        raise InvalidArgumentError(
            f"ProcessConfig(main_process_envs={share}, num_workers={config.num_workers}) with "
            f"num_envs={num_envs}: only {num_envs - share} sub-envs are left for the workers, "
            "fewer than workers; lower num_workers or main_process_envs."
        )
    return share

"""What ``backend="auto"`` chose, and from what measurements."""

from __future__ import annotations

import dataclasses

from jaxrunner._src.backends.process.config import ProcessConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayoutChoice:
    """What ``backend="auto"`` chose, from what it measured."""

    backend: str
    """``"sync"``, ``"process"`` or (chosen by ``EnvRunner.from_env``'s trial)
    ``"envpool"``."""
    num_workers: int
    """Worker processes (0 for sync)."""
    env_step_us: float
    """The measured median cost of one sub-env's step, in microseconds."""
    num_envs: int
    cpus: int
    """CPUs this process may use (affinity, bounded by the cgroup quota)."""
    reason: str
    """Why, in one line."""
    tried: tuple[tuple[int, float], ...] = ()
    """Env steps/s of each layout tried with the policy (``EnvRunner.from_env``), as
    ``(num_workers, rate)`` pairs, 0 workers being sync; empty where the choice came
    from the env alone."""
    tried_envpool: float | None = None
    """Env steps/s of the ``"envpool"`` backend in that trial; None where it was not
    tried (EnvPool not installed, the id not EnvPool's, or its spaces not the env's)."""
    policy_step_us: float | None = None
    """The policy's time per vector step in that trial (sync), in microseconds."""

    def process_config(self) -> ProcessConfig | None:
        """The ``ProcessConfig`` that builds this layout (None for sync): its workers,
        every sub-env in one (no main process share), spin at its adaptive default."""
        if self.backend != "process":
            return None
        return ProcessConfig(num_workers=self.num_workers, main_process_envs=0)

    def metrics(self) -> dict[str, int | float]:
        """The choice as numbers, for ``get_metrics()`` and metric loggers (which take
        no strings): ``process`` is 1 where the workers were chosen, else 0 (and, where
        EnvPool was tried, ``envpool`` 1 where it was chosen)."""
        metrics: dict[str, int | float] = {
            "process": int(self.backend == "process"),
            "num_workers": self.num_workers,
            "env_step_us": self.env_step_us,
            "cpus": self.cpus,
        }
        if self.policy_step_us is not None:
            metrics["policy_step_us"] = self.policy_step_us
        for workers, rate in self.tried:
            metrics[f"tried_{workers}_workers_steps_per_s"] = rate
        if self.tried_envpool is not None:
            metrics["envpool"] = int(self.backend == "envpool")
            metrics["tried_envpool_steps_per_s"] = self.tried_envpool
        return metrics

"""EnvRunnerGroupConfig: what an EnvRunnerGroup builds, checked once."""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium

from jaxrunner._src.arg_checks import check_dict, check_int, check_number
from jaxrunner._src.backends.make_vec import check_vec_options
from jaxrunner._src.backends.process import ProcessConfig
from jaxrunner._src.backends.ray import RayConfig
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.core.policy import Policy
from jaxrunner._src.runner.env_runner import EnvRunner
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

EPISODE_ID_BITS = 40
"""Low bits of a group episode id that hold the runner-local id."""

PolicyFactory = Callable[[gymnasium.Space], Policy]

_RUNNER_OPTIONS = frozenset(inspect.signature(EnvRunner).parameters) - {
    "envs", "policy", "params", "rollout_length", "seed",
}  # fmt: skip
"""The EnvRunner arguments ``runner_options`` may set (the group sets the others)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvRunnerGroupConfig:
    """What each runner of an :class:`EnvRunnerGroup` runs, and where."""

    num_runners: int = 2
    """Runners (Ray actors)."""
    num_envs_per_runner: int = 8
    """Sub-envs of each runner's vector env."""
    rollout_length: int = 128
    """T of every runner's ``sample()``."""
    seed: int = 0
    """Base seed: runner ``i``'s ``k``-th incarnation uses ``seed + (k * num_runners + i)
    * num_envs_per_runner`` (:meth:`runner_seed`)."""
    backend: str = "sync"
    """Each runner's ``make_vec`` backend."""
    env_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments for the env (``gymnasium.make``), passed untouched."""
    vec_config: ProcessConfig | RayConfig | None = None
    """The backend's options (``make_vec(config=...)``): a ProcessConfig for
    ``backend="process"``, a RayConfig for ``"ray"``; None: its defaults."""
    restart_policy: RestartPolicy | None = None
    """How each runner's envs recreate failed sub-envs (``make_vec(restart_policy=...)``);
    None: a failure fails the runner (which the group then replaces)."""
    runner_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments for each runner, of either kind of env: :class:`~jaxrunner.EnvRunner`'s
    (``metrics``, ``num_splits``...)."""
    multi_agent: bool | None = None
    """Deprecated and ignored (a ``DeprecationWarning``): each runner learns the kind
    from the env it builds."""
    policy_mapping_fn: Callable[[str], str] | None = None
    """For a multi-agent (PettingZoo) env: ``agent_id -> policy_id`` (picklable; None:
    the default mapping). A single-agent env refuses one."""
    num_cpus_per_runner: float = 1.0
    """Ray CPU resources each runner reserves."""
    num_gpus_per_runner: float = 0.0
    """Ray GPU resources each runner reserves (fractions share a GPU); JAX in the actor
    then sees the GPU Ray assigned."""
    sample_timeout_s: float | None = None
    """A runner that has not returned a sample (or acknowledged new params) after this
    long is treated as failed: killed and replaced. None: wait forever."""
    start_timeout_s: float = 300.0
    """How long to wait for a runner to start (import, build its envs, compile)."""
    max_restarts: int = 100
    """Runner restarts the group allows in all, before it gives up and raises."""

    def __post_init__(self) -> None:
        where = "EnvRunnerGroupConfig"
        check_vec_options(self.backend, self.vec_config, self.restart_policy, where)
        if self.multi_agent is not None:
            warnings.warn(
                "EnvRunnerGroupConfig(multi_agent=...) is deprecated and ignored: each runner "
                "learns the kind from the env it builds (a PettingZoo env factory gives "
                "multi-agent runners). Leave it out.",
                DeprecationWarning,
                stacklevel=3,
            )
        for name, of in (("env_options", "make_vec"), ("runner_options", "EnvRunner")):
            check_dict(where, name, getattr(self, name), f"keyword arguments of {of}", none=False)
        unknown = sorted(set(self.runner_options) - _RUNNER_OPTIONS)
        if unknown:  # refused here, not in each runner's process after Ray started it
            raise InvalidArgumentError(
                f"{where}(runner_options=...): EnvRunner takes no {unknown}; it takes "
                f"{sorted(_RUNNER_OPTIONS)}."
            )
        if self.policy_mapping_fn is not None and not callable(self.policy_mapping_fn):
            raise InvalidArgumentTypeError(
                f"{where}(policy_mapping_fn=...): expected a function agent_id -> policy_id, "
                f"got {type(self.policy_mapping_fn).__name__}."
            )
        for name in ("num_runners", "num_envs_per_runner", "rollout_length"):
            check_int(where, name, getattr(self, name))
        for name in ("seed", "max_restarts"):
            check_int(where, name, getattr(self, name), low=0)
        for name in ("num_cpus_per_runner", "num_gpus_per_runner"):
            check_number(where, name, getattr(self, name))
        for name in ("sample_timeout_s", "start_timeout_s"):
            none = "to wait forever" if name == "sample_timeout_s" else None
            check_number(where, name, getattr(self, name), low_open=True, hint="seconds", none=none)

    def runner_seed(self, index: int, incarnation: int) -> int:
        """The seed of runner ``index``'s ``incarnation``-th instance."""
        return self.seed + (incarnation * self.num_runners + index) * self.num_envs_per_runner

"""The whole ``jaxrunner bench`` run: every chosen backend at its widths, measured in
interleaved rounds by two long-lived children, gathered into one report."""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from gymnasium.envs.registration import _find_spec  # how gymnasium.make finds an id

from jaxrunner._src.arg_checks import check_int, check_number, is_int
from jaxrunner._src.bench.multi_agent import describe, parallel_env_module
from jaxrunner._src.bench.report import verdict
from jaxrunner._src.bench.rounds import MULTI_AGENT_PLANS, PLANS, Harness, Plan, measure_width
from jaxrunner._src.bench.systems import JAX_BACKEND
from jaxrunner._src.bench.timing import autogroup
from jaxrunner._src.bench.workloads import get_workload, steps_per_rollout
from jaxrunner.errors import InvalidArgumentError


def plans_for(env: str) -> dict[str, Plan]:
    """``MULTI_AGENT_PLANS`` for a PettingZoo env (``module:name``), else ``PLANS``."""
    return MULTI_AGENT_PLANS if parallel_env_module(env) else PLANS


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What ``jaxrunner bench`` measures: ``env``, a gymnasium id (EnvPool's and gymnax's
    too) or a PettingZoo parallel env as ``module:name`` (then against the multi-agent
    hand loop); ``backends``, keys of :func:`plans_for`'s plans, each at the ``widths``
    that fit it when there are several (a backend whose library is missing is skipped);
    ``seconds`` per system per round; ``workload``, a key of ``WORKLOADS`` whose env and
    policy every system runs (:meth:`for_workload` fills ``env`` and the widths)."""

    env: str = "CartPole-v1"
    widths: tuple[int, ...] = (1, 8, 64, 256)
    backends: tuple[str, ...] = ("sync",)
    seconds: float = 1.0
    rounds: int = 3
    seed: int = 0
    workload: str | None = None

    @classmethod
    def for_workload(
        cls,
        workload: str,
        *,
        widths: tuple[int, ...] | None = None,
        backends: tuple[str, ...] = ("sync", "process"),
        **options: Any,
    ) -> BenchConfig:
        spec = get_workload(workload)
        return cls(
            env=spec.env_id,
            widths=spec.widths if widths is None else widths,
            backends=backends,
            workload=workload,
            **options,
        )

    def __post_init__(self) -> None:
        if self.workload is not None:
            where = f"BenchConfig(workload={self.workload!r})"
            expected = get_workload(self.workload, where).env_id
            if self.env != expected or self.backends == (JAX_BACKEND,):
                raise InvalidArgumentError(
                    f"BenchConfig(workload={self.workload!r}, env={self.env!r}, backends="
                    f"{self.backends}): a workload runs its own env ({expected!r}) on host "
                    "backends; build it with BenchConfig.for_workload."
                )
        if not self.widths or not all(is_int(w) for w in self.widths):
            raise InvalidArgumentError(f"BenchConfig(widths={self.widths}): expected ints >= 1.")
        check_number("BenchConfig", "seconds", self.seconds, low_open=True, high_open=True)
        check_int("BenchConfig", "rounds", self.rounds)
        plans = plans_for(self.env)
        unknown = [b for b in self.backends if b not in plans]
        if not self.backends or unknown:
            kind = " (those that step PettingZoo envs)" if plans is MULTI_AGENT_PLANS else ""
            raise InvalidArgumentError(
                f"BenchConfig(env={self.env!r}, backends={self.backends}): expected some of "
                f"{list(plans)}{kind}."
            )

    def plan_widths(self) -> dict[str, tuple[int, ...]]:
        if len(self.backends) == 1:
            return {self.backends[0]: self.widths}
        plans = plans_for(self.env)
        return {b: tuple(w for w in self.widths if w <= plans[b].max_width) for b in self.backends}


def check_env_id(config: BenchConfig, said: str) -> None:
    """Refuses ``config.env`` (``said`` names it) before anything is measured where no
    library that a chosen backend makes its envs with knows the id: gymnasium, and
    EnvPool's or gymnax's registry where those backends are chosen and installed (a
    workload or a PettingZoo env is not checked)."""
    if config.workload is not None or plans_for(config.env) is MULTI_AGENT_PLANS:
        return
    own_ids = [b for b in config.backends if b in _REGISTRIES]
    installed = [b for b in own_ids if not PLANS[b].unavailable()]
    if any(config.env in _REGISTRIES[b][1]() for b in installed):
        return
    if len(own_ids) == len(config.backends):
        if not installed:  # each is skipped, and the report says why
            return
        names = " or ".join(_REGISTRIES[b][0] for b in installed)
        raise InvalidArgumentError(
            f"{said} {config.env}: {names} has no such env; give an id it lists."
        )
    try:
        with warnings.catch_warnings():  # resolving only: gymnasium.make warns where it runs
            warnings.simplefilter("ignore")
            _find_spec(config.env)
    except Exception as err:  # not found, malformed, or its module:EnvId module fails
        also = "".join(f", nor {_REGISTRIES[b][0]}" for b in installed)
        raise InvalidArgumentError(
            f"{said} {config.env}: gymnasium has no such env ({type(err).__name__}: {err})"
            f"{also}; give an id it knows (e.g. CartPole-v1, or module:EnvId to import the "
            "module that registers it) or a PettingZoo parallel env as module:name (e.g. "
            "mpe2:simple_spread_v3)."
        ) from err


# The backends whose envs come from a library's own ids: where it lists them, and how.
_REGISTRIES: dict[str, tuple[str, Callable[[], Any]]] = {
    "envpool": (
        "EnvPool (envpool.list_all_envs())",
        lambda: importlib.import_module("envpool").list_all_envs(),
    ),
    JAX_BACKEND: (
        "gymnax (gymnax.registered_envs)",
        lambda: importlib.import_module("gymnax").registered_envs,
    ),
}


def run(config: BenchConfig, log: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """Runs the benchmark; returns its report: config, machine, each child's CPU
    dispatch, every row with every round, the skipped backends and why, the verdict."""
    started = time.perf_counter()
    plans = plans_for(config.env)
    report: dict[str, Any] = {
        "benchmark": "jaxrunner bench",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "config": dataclasses.asdict(config),
        "policy": "jaxrunner._src.bench.mlp_policy: 64-64 tanh MLP, stochastic actions, jitted",
        "rollout_length": f"max(8, {steps_per_rollout(config.workload)} // num_envs), for "
        "jaxrunner and the hand loops",
        "autogroup": autogroup(),
        "loadavg_before": list(os.getloadavg()),
        "skipped": {},
        "results": [],
    }
    if plans is MULTI_AGENT_PLANS:
        report["multi_agent"] = describe(config.env)
    if config.workload is not None:
        workload = get_workload(config.workload)
        report["workload"] = config.workload
        report["policy"] = f"{workload.policy_label}, stochastic actions, jitted"
    with Harness() as harness:
        children = harness.info()
        report["machine"] = children["jaxrunner"]["machine"]
        report["children"] = {
            name: {k: v for k, v in info.items() if k != "machine"}
            for name, info in children.items()
        }
        log(
            f"children started: jaxrunner at {children['jaxrunner']['cpu_dispatch']} CPU "
            f"dispatch, hand loops at {children['hand_loop']['cpu_dispatch']}"
        )
        for backend, widths in config.plan_widths().items():
            plan = plans[backend]
            reason = plan.unavailable() or (None if widths else "no width fits")
            if config.workload is not None:
                reason = reason or get_workload(config.workload).unavailable()
            if reason:
                report["skipped"][backend] = reason
                log(f"skip {backend}: {reason}")
                continue
            for num_envs in widths:
                report["results"].append(
                    measure_width(
                        harness,
                        plan,
                        config.env,
                        num_envs,
                        rounds=config.rounds,
                        seconds=config.seconds,
                        seed=config.seed,
                        log=log,
                        workload=config.workload,
                    )
                )
    report["loadavg_after"] = list(os.getloadavg())
    report["wall_s"] = time.perf_counter() - started
    report["verdict"] = verdict(report["results"])
    return report

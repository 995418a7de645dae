"""Interleaved rounds: each system timed in turn, round after round, reported as medians
and ratios of medians. See docs/performance.md."""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import jaxrunner._src.bench.timing as timing  # measure_width's argument hides rollout_length
from jaxrunner._src.bench.child import Child, ChildError
from jaxrunner._src.bench.hand_loop import REFERENCES
from jaxrunner._src.bench.systems import JAX_BACKEND, Spec
from jaxrunner._src.bench.workloads import not_installed, steps_per_rollout


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """How one kind of env is compared: jaxrunner's ``backend`` (``make_vec``'s, or
    ``"jax"``: gymnax in a ``JaxVectorEnv``) against the hand loop ``reference`` (a key
    of ``REFERENCES``), up to ``max_width`` envs when every backend runs; ``extras``:
    more hand loops shown, as (reference, widest width); ``needs``: modules it is skipped
    without; ``ceiling``: whether the policy-bound ceiling applies."""

    backend: str
    reference: str
    max_width: int
    extras: tuple[tuple[str, int], ...] = ()
    needs: tuple[str, ...] = ()
    ceiling: bool = True
    multi_agent: bool = False  # a PettingZoo env, against the multi-agent hand loop

    def unavailable(self) -> str | None:
        return not_installed(self.needs)


PLANS: dict[str, Plan] = {
    "sync": Plan(backend="sync", reference="sync", max_width=1024),
    # The process backend's reference is the loop a user writes: the sync one.
    "process": Plan(backend="process", reference="sync", max_width=1024, extras=(("async", 64),)),
    # make_vec's choice of sync or process: measured against the same hand loop.
    "auto": Plan(backend="auto", reference="sync", max_width=1024),
    "gymnasium": Plan(backend="gymnasium", reference="native", max_width=4096),
    "envpool": Plan(backend="envpool", reference="envpool", max_width=4096, needs=("envpool",)),
    JAX_BACKEND: Plan(
        backend=JAX_BACKEND, reference="scan", max_width=4096, needs=("gymnax",), ceiling=False
    ),
}

MULTI_AGENT_PLANS: dict[str, Plan] = {
    backend: Plan(
        backend=backend,
        reference="pettingzoo",
        max_width=256,
        needs=("pettingzoo",),
        ceiling=False,
        multi_agent=True,
    )
    for backend in ("sync", "process", "auto")
}
"""The plans for a PettingZoo env: its hand loop is the reference of every backend
(``auto``: the layout ``EnvRunner.from_env`` keeps)."""


class Harness:
    """The two children, started once for the whole benchmark: ``defaults`` runs
    jaxrunner as a user runs it, ``jax_defaults`` the hand loops at JAX's defaults."""

    def __init__(self) -> None:
        self.defaults = Child("jaxrunner", jax_defaults=False)
        try:
            self.jax_defaults = Child("hand loop", jax_defaults=True)
        except BaseException:
            self.defaults.close()
            raise

    def info(self) -> dict[str, Any]:
        children = {"jaxrunner": self.defaults, "hand_loop": self.jax_defaults}
        for child in children.values():
            child.send("info")
        return {name: child.receive() for name, child in children.items()}

    def close(self) -> None:
        self.defaults.close()
        self.jax_defaults.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def label(name: str, plan: Plan) -> str:
    if name == "jaxrunner":
        return f"jaxrunner EnvRunner.sample(), backend {plan.backend}"
    if name == "ceiling":
        return "policy-bound ceiling: raw env + one bare policy call"
    if name.startswith("hand"):
        reference = plan.reference if name == "hand" else name.removeprefix("hand_")
        return f"hand loop: {REFERENCES.get(reference, reference)}"
    return name


def measure_width(
    harness: Harness,
    plan: Plan,
    env: str,
    num_envs: int,
    *,
    rounds: int,
    seconds: float,
    seed: int = 0,
    ceiling: bool = True,
    local: Mapping[str, Any] | None = None,
    log: Callable[[str], None] = lambda message: None,
    workload: str | None = None,
    peers: Mapping[str, Child] | None = None,
    labels: Mapping[str, str] | None = None,
    variants: Mapping[str, dict[str, Any]] | None = None,
    rollout_length: int | None = None,
    auto: bool = False,
) -> dict[str, Any]:
    """Builds every system of ``plan`` at ``num_envs``, then times them, and the
    parent's own ``local`` ones (``measure(seconds)``), in ``rounds`` interleaved rounds
    of ``seconds`` each; a system that fails is left out, its error recorded. For
    ``benchmarks/``: ``peers`` (``reference -> child``) are timed as ``hand_<reference>``,
    ``variants`` (``name -> make_vec options``) as ``jaxrunner_<name>``, with ``auto``
    ``EnvRunner.from_env(backend="auto")`` as ``jaxrunner_auto``; ``labels`` name
    systems for the report."""
    length = rollout_length
    if length is None:
        length = timing.rollout_length(num_envs, steps_per_rollout(workload))
    common = {"backend": plan.backend, "env": env, "num_envs": num_envs, "seed": seed}
    common.update(rollout_length=length, multi_agent=plan.multi_agent, workload=workload)
    builds: dict[str, tuple[Child, Spec]] = {}
    if auto:  # built first in its child: its trial runs with no other runner's envs alive
        spec = Spec(system="jaxrunner", **{**common, "backend": "auto"})
        builds["jaxrunner_auto"] = (harness.defaults, spec)
    builds |= {
        "jaxrunner": (harness.defaults, Spec(system="jaxrunner", **common)),
        "hand": (harness.jax_defaults, Spec(system="hand", reference=plan.reference, **common)),
    }
    if ceiling and plan.ceiling:
        builds["ceiling"] = (harness.defaults, Spec(system="ceiling", **common))
    extras = {r: harness.jax_defaults for r, widest in plan.extras if num_envs <= widest}
    for reference, child in {**extras, **(peers or {})}.items():
        spec = Spec(system="hand", reference=reference, **common)
        builds[f"hand_{reference}"] = (child, spec)
    for name, env_kwargs in (variants or {}).items():
        spec = Spec(system="jaxrunner", env_kwargs=env_kwargs, **common)
        builds[f"jaxrunner_{name}"] = (harness.defaults, spec)
    row: dict[str, Any] = {
        "backend": plan.backend,
        "num_envs": num_envs,
        "rollout_length": length,
        "errors": {},
    }
    for name, (child, spec) in builds.items():  # the two children build at once
        child.send("build", name=name, spec=dataclasses.asdict(spec))
    built: dict[str, Callable[[], dict[str, Any]]] = {}
    in_child: list[str] = []  # systems alive in a child: closed at the end, failed or not
    for name, (child, _) in builds.items():
        try:
            child.receive()
        except ChildError as err:
            row["errors"][name] = f"build: {err}"
            log(f"  {plan.backend} x{num_envs} {name}: build failed: {err}")
            continue
        built[name] = lambda c=child, n=name: c.request("measure", name=n, seconds=seconds)
        in_child.append(name)
    for name, system in (local or {}).items():
        built[name] = lambda s=system: s.measure(seconds)

    results: dict[str, list[dict[str, Any]]] = {name: [] for name in built}
    row["loadavg_per_round"] = []
    for index in range(rounds):
        if not built:
            break
        row["loadavg_per_round"].append(os.getloadavg())
        names = list(built)
        shift = index % len(names)  # no system always first or always last
        for name in names[shift:] + names[:shift]:
            try:
                results[name].append(built[name]())
            except Exception as err:  # keep the other systems' figures; record why
                row["errors"][name] = f"round {index}: {type(err).__name__}: {err}"
                log(f"  {plan.backend} x{num_envs} {name}: failed: {err}")
                del built[name], results[name]
        log(
            f"  {plan.backend} x{num_envs} round {index + 1}/{rounds}: "
            + "  ".join(f"{k}={v[-1]['steps_per_s']:,.0f}" for k, v in results.items())
        )
    for name in in_child:
        try:
            builds[name][0].request("close", name=name)
        except ChildError as err:
            row["errors"].setdefault(name, f"close: {err}")
    return {**row, **summarize(results, plan, labels or {})}


def _spread(values: list[float], median: float) -> dict[str, Any]:
    return {"median": median, "min": min(values), "max": max(values), "rounds": values}


def summarize(
    results: Mapping[str, list[dict[str, Any]]], plan: Plan, labels: Mapping[str, str]
) -> dict[str, Any]:
    systems: dict[str, dict[str, Any]] = {}
    for name, rounds in results.items():
        rates = [r["steps_per_s"] for r in rounds]
        systems[name] = {"label": labels.get(name) or label(name, plan)}
        systems[name].update(_spread(rates, statistics.median(rates)), all_rounds=rounds)
    out: dict[str, Any] = {"systems": systems, "ratios": {}, "split_us": None, "ceiling": None}
    ours = systems.get("jaxrunner")
    for name, theirs in systems.items():
        if ours is None or name == "jaxrunner":
            continue
        per_round = [a / b for a, b in zip(ours["rounds"], theirs["rounds"])]
        # the ratio of the medians, and the spread of the per-round ratios
        out["ratios"][name] = _spread(per_round, ours["median"] / theirs["median"])
    splits = [r["split_us"] for r in results.get("jaxrunner", []) if r.get("split_us")]
    if splits:
        out["split_us"] = {k: statistics.median(s[k] for s in splits) for k in splits[0]}
    if results.get("jaxrunner"):
        first = results["jaxrunner"][0]
        out["layout"] = {k: first.get(k) for k in ("num_workers", "num_splits")}
        if "auto" in first:  # what backend="auto" chose, and why
            out["layout"]["auto"] = first["auto"]
    if results.get("ceiling"):
        keys = (
            "steps_per_s",
            "raw_env_us",
            "policy_us",
            "policy_compute_us",
            "in_turn_steps_per_s",
            "in_turn_us",
        )
        out["ceiling"] = {k: statistics.median(r[k] for r in results["ceiling"]) for k in keys}
    return out

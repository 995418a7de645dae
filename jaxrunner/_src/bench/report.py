"""What ``jaxrunner bench`` prints: its tables and its one-line verdict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxrunner._src.bench.hand_loop import REFERENCES
from jaxrunner._src.bench.rounds import MULTI_AGENT_PLANS, PLANS, Plan
from jaxrunner._src.bench.workloads import steps_per_rollout


def _si(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e4:
        return f"{value / 1e3:.0f}k"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def _cell(spread: dict[str, Any], number: Any = _si) -> str:
    return f"{number(spread['median'])} [{number(spread['min'])}-{number(spread['max'])}]"


def _ratio(value: float) -> str:
    return f"{value:.2f}"


def format_report(report: dict[str, Any]) -> str:
    """A ``jaxrunner bench`` report (:func:`jaxrunner._src.bench.run`) as text: what was
    measured, a table per backend, the skipped backends and the verdict."""
    config, children = report["config"], report["children"]
    steps = f"T = max(8, {steps_per_rollout(report.get('workload'))} // envs) steps per rollout"
    rounds = f"{config['rounds']} interleaved round{'s' if config['rounds'] > 1 else ''}"
    plans = MULTI_AGENT_PLANS if "multi_agent" in report else PLANS
    if plans is MULTI_AGENT_PLANS:
        agents = report["multi_agent"]["agents"]
        lines = [
            f"{config['env']} ({len(agents)} agents: {', '.join(agents)}); "
            f"{report['policy']}, one per policy group;",
            f"{steps}; env steps/s (agent steps/s = {len(agents)} x env steps/s);",
        ]
        hand = "a list of the PettingZoo envs, every agent's obs stacked,\n  the same jitted "
        hand += "policy, [T, B, A] numpy buffers"
    else:
        lines = [f"{config['env']}; {report['policy']};", f"{steps};"]
        hand = "the same jitted policy, np.asarray on its outputs,\n  [T, B] numpy buffers"
    lines += [
        f"{rounds} of {config['seconds']:g} s per system, each in its own process.",
        "jaxrunner: EnvRunner.sample() as a user runs it "
        f"(JAX CPU dispatch: {children['jaxrunner']['cpu_dispatch']}).",
        f"hand loop: the loop a user writes: {hand}, JAX at its defaults "
        f"(CPU dispatch: {children['hand_loop']['cpu_dispatch']}).",
        "ratio: jaxrunner / hand loop, the ratio of medians [min-max of per-round ratios].",
    ]
    if plans is PLANS:
        lines.append(
            "ceiling: the env stepped with random actions + one bare policy call per step;\n"
            "  vs ceiling: jaxrunner / ceiling; in turn: the env stepped with the policy's actions."
        )
    lines.append("What each column holds: docs/performance.md (Where the time goes).")
    for backend in dict.fromkeys(row["backend"] for row in report["results"]):
        rows = [row for row in report["results"] if row["backend"] == backend]
        lines += ["", format_backend(rows, plans)]
    for backend, reason in report["skipped"].items():
        lines.append(f"skipped {backend}: {reason}")
    return "\n".join([*lines, "", report["verdict"]])


def format_backend(rows: Sequence[dict[str, Any]], plans: dict[str, Plan] = PLANS) -> str:
    """One backend's rows as two tables: steps/s, then where a jaxrunner step goes
    (``plans``: ``MULTI_AGENT_PLANS`` for a PettingZoo env)."""
    plan = plans[rows[0]["backend"]]
    extras = sorted({n for row in rows for n in row["systems"] if n.startswith("hand_")})
    extra_heads = [f"{n.removeprefix('hand_')} hand loop" for n in extras]
    head = ["envs", "T", "jaxrunner", "hand loop", "ratio", "ceiling", "vs ceiling", *extra_heads]
    table = [head]
    for row in rows:
        systems, ratios = row["systems"], row["ratios"]
        table.append(
            [
                str(row["num_envs"]),
                str(row["rollout_length"]),
                _cell(systems["jaxrunner"]) if "jaxrunner" in systems else "failed",
                _cell(systems["hand"]) if "hand" in systems else "failed",
                _cell(ratios["hand"], _ratio) if "hand" in ratios else "-",
                _si(row["ceiling"]["steps_per_s"]) if row["ceiling"] else "-",
                _ratio(ratios["ceiling"]["median"]) if "ceiling" in ratios else "-",
                *(_si(systems[n]["median"]) if n in systems else "-" for n in extras),
            ]
        )
    if not plan.ceiling:  # no ceiling measured: no columns for it
        table = [line[:5] + line[7:] for line in table]
    runner = "EnvRunner " if plan.multi_agent else ""
    lines = [
        f"backend {plan.backend}: jaxrunner {runner}against the hand loop over "
        f"{REFERENCES[plan.reference]}",
        "env steps/s, median [min-max] of rounds",
        *_columns(table),
    ]
    if any(row["split_us"] for row in rows):
        lines.append("where a jaxrunner step goes, us per vector step (medians):")
        heads = ["env", "policy", "record", "other", "total", "ceiling: env", "policy", "in turn"]
        split = [["envs", *heads]]
        for row in rows:
            s, c = row["split_us"], row["ceiling"]
            keys = ("env_us", "policy_us", "record_us", "other_us", "total_us")
            cells = [f"{s[k]:.1f}" for k in keys] if s else ["-"] * len(keys)
            if c:
                cells += [
                    f"{c['raw_env_us']:.1f}",
                    f"{c['policy_us']:.1f} ({c['policy_compute_us']:.1f})",
                    f"{c['in_turn_us']:.1f}",
                ]
            else:
                cells += ["-", "-", "-"]
            split.append([str(row["num_envs"]), *cells])
        lines += _columns(split if plan.ceiling else [line[:6] for line in split])
    for row in rows:
        choice = (row.get("layout") or {}).get("auto")
        if choice:
            lines.append(f"  x{row['num_envs']} auto chose {format_choice(choice)}")
    for row in rows:
        for name, error in row["errors"].items():
            lines.append(f"  x{row['num_envs']} {name}: {error.splitlines()[0]}")
    return "\n".join(lines)


def format_choice(choice: dict[str, Any]) -> str:
    """A ``LayoutChoice`` (as a dict) in one line: the layout, then why."""
    layout = choice["backend"]
    if layout == "process":
        workers = choice["num_workers"]
        layout += f" ({workers} worker{'s' if workers > 1 else ''})"
    return (
        f"{layout}: env step {choice['env_step_us']:.1f} us, {choice['cpus']} CPUs; "
        f"{choice['reason']}"
    )


def _columns(table: list[list[str]]) -> list[str]:
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    return ["  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in table]


def verdict(rows: Sequence[dict[str, Any]]) -> str:
    """One plain-language line: where jaxrunner beats the hand loop and by how much,
    where it loses and by how much (ratios of medians), where the rounds disagree."""
    pairs = [
        (r["backend"], r["num_envs"], r["ratios"]["hand"]) for r in rows if "hand" in r["ratios"]
    ]
    if not pairs:
        return "no verdict: no width measured both jaxrunner and the hand loop"
    several = len({backend for backend, _, _ in pairs}) > 1

    def where(items: list[tuple[str, int, dict[str, Any]]]) -> str:
        if several:
            return ", ".join(f"{b} x{w}" for b, w, _ in items)
        widths = [w for _, w, _ in items]
        return ", ".join(map(str, widths)) + (" env" if widths == [1] else " envs")

    def span(items: list[tuple[str, int, dict[str, Any]]]) -> str:
        low, high = (f(r["median"] for _, _, r in items) for f in (min, max))
        return f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"

    wins = [p for p in pairs if p[2]["median"] >= 1.0]
    losses = [p for p in pairs if p[2]["median"] < 1.0]
    failed = [(r["backend"], r["num_envs"], {}) for r in rows if "hand" not in r["ratios"]]
    if failed:
        scope = "where compared"
    else:
        scope = "on every backend at every width" if several else "at every width"
    if not losses:
        line = (
            f"jaxrunner is {span(wins)} faster than the hand-written loop {scope} ({where(wins)})"
        )
    elif not wins:
        line = (
            f"jaxrunner is slower than the hand-written loop {scope} ({where(losses)}): "
            f"{span(losses)} its speed"
        )
    else:
        lost = ", ".join(
            f"{where([p])} ({p[2]['median']:.2f}x, {100 * (1 - p[2]['median']):.0f}% slower)"
            for p in losses
        )
        line = (
            f"jaxrunner is {span(wins)} faster than the hand-written loop at {where(wins)}, "
            f"and loses at {lost}"
        )
    unsure = [p for p in pairs if p[2]["min"] < 1.0 < p[2]["max"]]
    if unsure:
        line += f"; the rounds disagree at {where(unsure)}"
    if failed:
        line += f"; not compared at {where(failed)} (a system failed: see its errors)"
    return line

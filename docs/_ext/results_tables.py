"""The performance page's tables, generated from the committed ``benchmarks/results/*.json``.

A marker ``<!-- table: NAME -->`` on a page is replaced, when Sphinx reads the page, by
the Markdown table that ``TABLES[NAME]`` builds from the JSON, followed by a line naming
the file, its date and the command that recorded it. So a figure on the page is always
the one in the file, and rerunning that command and committing its JSON updates the page.

The table functions need only the standard library (``tests/test_performance_tables.py``
runs them without Sphinx); Sphinx is imported in :func:`setup` only.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
MARKER = re.compile(r"<!--\s*table:\s*([\w-]+)\s*-->")

# The systems a peers-style row may hold, in the order the tables show them.
SYSTEM_ORDER = [
    "jaxrunner",
    "hand",
    "hand_puffer_serial",
    "hand_puffer_mp",
    "hand_async",
    "hand_envpool",
    "hand_envpool_async",
    "hand_rllib",
    "rllib",
    "floor",
]
# The headline's peer columns: a column title and the system keys that fill it (PufferLib's
# Serial in the sync rows, its Multiprocessing in the process rows; RLlib's key changed).
HEADLINE_PEERS = [
    ("hand loop", ("hand",)),
    ("PufferLib", ("hand_puffer_serial", "hand_puffer_mp")),
    ("EnvPool (sync)", ("hand_envpool",)),
    ("EnvPool (async)", ("hand_envpool_async",)),
    ("gymnasium async", ("hand_async",)),
    ("RLlib", ("hand_rllib", "rllib")),
]
# Labels for the systems whose report names them by their key only.
LABELS = {
    "rllib": "RLlib's env runner",
    "floor": "floor: the envs alone, random actions, no policy",
}
HEADLINE_RUNS = [
    ("CartPole-v1", "peers_cartpole_cpu.json"),
    ("Pong", "peers_pong_20261201_cpu.json"),
    ("HalfCheetah-v5", "peers_halfcheetah_20261201_cpu.json"),
]
README_RUNS = [
    ("CartPole-v1", "peers_cartpole_stop112_cpu.json"),
    ("Pong", "peers_pong_stop112_cpu.json"),
    ("HalfCheetah-v5", "peers_halfcheetah_stop112_cpu.json"),
]
"""The latest full runs: the README's table (:func:`readme_table`)."""
# In an "envpool" row the hand loop is EnvPool's sync mode driven by hand.
ENVPOOL_ROW_PEERS = {"hand loop": (), "EnvPool (sync)": ("hand",)}


def load(name: str) -> dict[str, Any]:
    """One result file of ``benchmarks/results/``, parsed."""
    return json.loads((RESULTS / name).read_text())


def rate(value: float) -> str:
    return f"{value:,.0f}"


def ratio(value: float) -> str:
    return f"{value:.2f}"


def markdown(header: list[str], rows: list[list[str]], right_from: int = 1) -> str:
    """A Markdown table; columns from ``right_from`` on are right-aligned (numbers)."""
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    lines = [header, align, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def source_line(name: str, report: dict[str, Any]) -> str:
    """Where a table's figures come from: the file, its date, the load and the command."""
    date = str(report.get("date", "undated"))[:10]
    load_note = ""
    before = report.get("loadavg_before") or report.get("loadavg_start")
    after = report.get("loadavg_after") or report.get("loadavg_end")
    if before and after:
        load_note = f", load average {before[0]:.1f} before and {after[0]:.1f} after"
    command = report.get("command", "")
    return f"\n\n*From `benchmarks/results/{name}` ({date}{load_note}): `{command}`*\n"


def system_ratio(row: dict[str, Any], key: str) -> float:
    """jaxrunner's median steps/s over the other system's: the ratio of the medians."""
    systems = row["systems"]
    return systems["jaxrunner"]["median"] / systems[key]["median"]


def ordered_systems(row: dict[str, Any]) -> list[str]:
    known = [key for key in SYSTEM_ORDER if key in row["systems"]]
    return known + sorted(key for key in row["systems"] if key not in SYSTEM_ORDER)


def systems_table(name: str) -> str:
    """Every system of a peers-style report (``peers.py``, ``rllib_multi_agent.py``), a row
    each, per backend and width: its median steps/s and jaxrunner's ratio to it, with the
    range of the per-round ratios."""
    report = load(name)
    rows = []
    for row in report["results"]:
        for key in ordered_systems(row):
            system = row["systems"][key]
            if key == "jaxrunner":
                cell = ""
            else:
                spread = row["ratios"][key]
                cell = (
                    f"{ratio(system_ratio(row, key))} "
                    f"[{ratio(spread['min'])}-{ratio(spread['max'])}]"
                )
            label = system.get("label", key)
            label = LABELS.get(key, label) if label == key else label
            rows.append([row["backend"], str(row["num_envs"]), label, rate(system["median"]), cell])
    header = ["backend", "envs", "system", "steps/s", "jaxrunner / it [per-round range]"]
    return markdown(header, rows, right_from=3) + source_line(name, report)


def headline_table(
    runs: list[tuple[str, str]] = HEADLINE_RUNS, backends: tuple[str, ...] = ("sync", "process")
) -> str:
    """jaxrunner against the loop a user writes and the peer libraries, on three workloads:
    ratios of median env steps/s (above 1: jaxrunner is faster); a dash where the peer was
    not in that run. ``runs``: (workload, result file); ``backends``: the rows kept."""
    rows = []
    sources = []
    for workload, name in runs:
        report = load(name)
        sources.append(f"`{name}` ({str(report['date'])[:10]})")
        for row in report["results"]:
            if row["backend"] not in backends:
                continue
            cells = [workload, row["backend"], str(row["num_envs"])]
            cells.append(rate(row["systems"]["jaxrunner"]["median"]))
            for title, keys in HEADLINE_PEERS:
                if row["backend"] == "envpool":
                    keys = ENVPOOL_ROW_PEERS.get(title, keys)
                found = [key for key in keys if key in row["systems"]]
                cells.append(f"{ratio(system_ratio(row, found[0]))}x" if found else "-")
            rows.append(cells)
    header = ["workload", "backend", "envs", "jaxrunner steps/s"]
    header += [f"/ {title}" for title, _keys in HEADLINE_PEERS]
    note = "\n\n*From `benchmarks/results/`: " + ", ".join(sources) + ".*\n"
    return markdown(header, rows, right_from=2) + note


def readme_table() -> str:
    """The README's performance table: :func:`headline_table` of :data:`README_RUNS`, with
    the ``"envpool"`` backend's rows, without the source line (the README names its files)."""
    table = headline_table(README_RUNS, ("sync", "process", "envpool"))
    return table.split("\n\n*From", 1)[0]


def multi_agent_host_table() -> str:
    """MPE simple_spread on the host backends against the multi-agent hand loop: medians of
    the per-round ratios, as ``multi_agent.py`` reports them."""
    name = "multi_agent_host_quiet_cpu.json"
    report = load(name)
    columns = [
        ("jaxrunner", "sync backend / hand"),
        ("jaxrunner_process", "process, one split / hand"),
        ("jaxrunner_process_2splits", "process, two splits (default) / hand"),
    ]
    rows = []
    for row in report["results"]:
        cells = [str(row["num_envs"]), rate(row["hand_loop_env_steps_per_s"])]
        for key, _title in columns:
            per_round = row[f"{key}_ratios_vs_hand_loop_per_round"]
            cells.append(
                f"{ratio(row[f'{key}_ratio_vs_hand_loop'])} "
                f"[{ratio(min(per_round))}-{ratio(max(per_round))}]"
            )
        rows.append(cells)
    header = ["envs", "hand loop env steps/s", *(title for _key, title in columns)]
    return markdown(header, rows) + source_line(name, report)


def multi_agent_jaxmarl_table() -> str:
    """JaxMARL's MPE simple_spread: jaxrunner's scan against a hand-written ``lax.scan``."""
    name = "multi_agent_jaxmarl_cpu.json"
    report = load(name)
    rows = []
    for row in report["results"]:
        per_round = row["jaxrunner_ratios_vs_hand_scan_per_round"]
        rows.append(
            [
                str(row["num_envs"]),
                rate(row["jaxrunner_agent_steps_per_s"]),
                rate(row["hand_scan_agent_steps_per_s"]),
                f"{ratio(row['jaxrunner_ratio_vs_hand_scan'])} "
                f"[{ratio(min(per_round))}-{ratio(max(per_round))}]",
            ]
        )
    header = ["envs", "jaxrunner agent steps/s", "hand scan agent steps/s", "ratio [range]"]
    return markdown(header, rows) + source_line(name, report)


def serve_load_table(name: str) -> str:
    """The policy server under load, per system (batched or not, alone or beside hostile
    sockets or a CPU placebo): medians over the run's rounds."""
    report = load(name)
    rows = []
    for key, summary in report["summary_median"].items():
        if not isinstance(summary, dict):
            continue  # the batched / unbatched throughput ratio
        # Older runs did not record the server's CPU time.
        cpu = summary.get("server_cpu_ms_per_request")
        cpu_ms = "-" if cpu is None else f"{cpu:.2f}"
        rows.append(
            [
                key,
                rate(summary["requests_per_s"]),
                f"{summary['action_p50_ms']:.0f}",
                f"{summary['action_p99_ms']:.0f}",
                cpu_ms,
                str(summary["num_5xx_total"]),
                str(summary["lost_steps_total"]),
            ]
        )
    header = ["system", "requests/s", "action p50 ms", "action p99 ms", "server CPU ms/request"]
    header += ["5xx", "lost steps"]
    return markdown(header, rows) + source_line(name, report)


def ray_scaling_table() -> str:
    """EnvRunnerGroup of 1 and 2 Ray runners against one local EnvRunner."""
    name = "ray_scaling_cpu.json"
    report = load(name)
    medians = report["median_env_steps_per_s"]
    local = medians["local_runner"]
    rows = [[system, rate(steps), ratio(steps / local)] for system, steps in medians.items()]
    header = ["system", "env steps/s (median)", "/ local runner"]
    return markdown(header, rows) + source_line(name, report)


def splits_table(*names: str) -> str:
    """``splits.py`` reports: per backend, workload and width, the runner at one and two
    splits and the hand loop (median steps/s), and one split's speed over two's."""
    rows, sources = [], []
    for name in names:
        report = load(name)
        config = report["config"]
        for row in report["results"]:
            m = row["median_steps_per_s"]
            rows.append(
                [
                    config["backend"],
                    config["workload"],
                    str(row["num_envs"]),
                    rate(m["splits=1"]),
                    rate(m["splits=2"]),
                    rate(m["hand"]),
                    ratio(m["splits=1"] / m["splits=2"]),
                ]
            )
        sources.append(source_line(name, report).strip())
    header = ["backend", "workload", "envs", "1 split", "2 splits", "hand loop", "1 / 2"]
    return markdown(header, rows, right_from=2) + "\n\n" + "\n\n".join(sources) + "\n"


def thread_layouts_table(*names: str) -> str:
    """``thread_layouts.py`` reports: per workload and width, each system's median steps/s,
    the CPUs it kept busy and its speed over the faster hand loop at EnvPool's defaults."""
    rows, sources = [], []
    for name in names:
        report = load(name)
        for row in report["results"]:
            for system, steps in row["median_steps_per_s"].items():
                cells = [rate(steps), f"{row['cores'][system]:.2f}"]
                cells.append(ratio(row["ratio_to_best_hand"][system]))
                rows.append([report["config"]["workload"], str(row["num_envs"]), system, *cells])
        sources.append(source_line(name, report).strip())
    header = ["workload", "envs", "system", "steps/s", "CPUs busy", "/ best hand loop"]
    return markdown(header, rows, right_from=3) + "\n\n" + "\n\n".join(sources) + "\n"


TABLES: dict[str, Callable[[], str]] = {
    "headline": headline_table,
    "peers_cartpole": lambda: systems_table("peers_host_cpu.json"),
    "peers_cartpole_rllib": lambda: systems_table("peers_cpu.json"),
    "peers_cartpole_latest": lambda: systems_table("peers_host_cpu_rerun6.json"),
    "peers_envpool_jax": lambda: systems_table("peers_envpool_jax_cpu.json"),
    "peers_cartpole_workload": lambda: systems_table("peers_cartpole_cpu.json"),
    "peers_pong": lambda: systems_table("peers_pong_20261201_cpu.json"),
    "peers_halfcheetah": lambda: systems_table("peers_halfcheetah_20261201_cpu.json"),
    "peers_cartpole_stop100": lambda: systems_table("peers_cartpole_stop100_cpu.json"),
    "peers_pong_stop100": lambda: systems_table("peers_pong_stop100_cpu.json"),
    "peers_halfcheetah_stop100": lambda: systems_table("peers_halfcheetah_stop100_cpu.json"),
    "peers_cartpole_stop101": lambda: systems_table("peers_cartpole_stop101_cpu.json"),
    "peers_halfcheetah_stop101": lambda: systems_table("peers_halfcheetah_stop101_cpu.json"),
    "peers_cartpole_stop102": lambda: systems_table("peers_cartpole_stop102_cpu.json"),
    "peers_cartpole_stop102_rerun": lambda: systems_table("peers_cartpole_stop102_rerun_cpu.json"),
    "peers_cartpole_stop103": lambda: systems_table("peers_cartpole_stop103_cpu.json"),
    "peers_halfcheetah_stop103": lambda: systems_table("peers_halfcheetah_stop103_cpu.json"),
    "peers_pong_stop103": lambda: systems_table("peers_pong_stop103_cpu.json"),
    "peers_cartpole_stop109": lambda: systems_table("peers_cartpole_stop109_cpu.json"),
    "peers_halfcheetah_stop109": lambda: systems_table("peers_halfcheetah_stop109_cpu.json"),
    "peers_pong_stop109": lambda: systems_table("peers_pong_stop109_cpu.json"),
    "peers_cartpole_stop110": lambda: systems_table("peers_cartpole_stop110_cpu.json"),
    "peers_halfcheetah_stop110": lambda: systems_table("peers_halfcheetah_stop110_cpu.json"),
    "peers_cartpole_stop112": lambda: systems_table("peers_cartpole_stop112_cpu.json"),
    "peers_pong_stop112": lambda: systems_table("peers_pong_stop112_cpu.json"),
    "peers_halfcheetah_stop112": lambda: systems_table("peers_halfcheetah_stop112_cpu.json"),
    "multi_agent_rllib_stop112": lambda: systems_table("multi_agent_rllib_stop112_cpu.json"),
    "peers_pong_first": lambda: systems_table("peers_pong_cpu.json"),
    "peers_halfcheetah_first": lambda: systems_table("peers_halfcheetah_cpu.json"),
    "peers_pong_gpu": lambda: systems_table("peers_pong_gpu.json"),
    "peers_halfcheetah_gpu": lambda: systems_table("peers_halfcheetah_gpu.json"),
    "peers_pong8_gpu": lambda: systems_table("peers_pong8_gpu.json"),
    "peers_pong32_gpu": lambda: systems_table("peers_pong32_gpu.json"),
    "splits_gpu": lambda: splits_table(
        "splits_cartpole_gpu.json",
        "splits_halfcheetah_gpu.json",
        "splits_halfcheetah_wide_gpu.json",
        "splits_process_cartpole_gpu.json",
        "splits_halfcheetah_process_gpu.json",
        "splits_halfcheetah_process_wide_gpu.json",
    ),
    "multi_agent_host": multi_agent_host_table,
    "multi_agent_jaxmarl": multi_agent_jaxmarl_table,
    "multi_agent_rllib": lambda: systems_table("multi_agent_rllib_quiet_cpu.json"),
    "multi_agent_rllib_loaded": lambda: systems_table("multi_agent_rllib_cpu.json"),
    "multi_agent_rllib_latest": lambda: systems_table("multi_agent_rllib_20261201_cpu.json"),
    "serve_load": lambda: serve_load_table("serve_load_hostile_quiet_cpu.json"),
    "serve_load_before": lambda: serve_load_table("serve_load_hostile_placebo_quiet_cpu.json"),
    "serve_load_loaded": lambda: serve_load_table("serve_load_hostile_cpu.json"),
    "ray_scaling": ray_scaling_table,
    "thread_layouts": lambda: thread_layouts_table(
        "thread_layouts_pong_stop104_cpu.json",
        "thread_layouts_halfcheetah_stop104_cpu.json",
        "thread_layouts_cartpole_stop104_cpu.json",
    ),
}


def fill(text: str) -> str:
    """``text`` with every table marker replaced by its table; an unknown name raises."""

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in TABLES:
            raise KeyError(f"no results table named {name!r}; known: {sorted(TABLES)}")
        return TABLES[name]()

    return MARKER.sub(table, text)


def _on_source_read(_app: Any, _docname: str, source: list[str]) -> None:
    source[0] = fill(source[0])


def setup(app: Any) -> dict[str, Any]:
    import sphinx  # noqa: F401  (only a Sphinx build loads this hook)

    app.connect("source-read", _on_source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

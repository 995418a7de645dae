"""The performance page's tables (docs/_ext/results_tables.py) say what the committed
benchmark results say: every system and width of a result file is in its table, and
each ratio shown is the one computed from the file's medians."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import statistics

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "performance.md"


def _load_tables():
    spec = importlib.util.spec_from_file_location(
        "results_tables", ROOT / "docs" / "_ext" / "results_tables.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tables = _load_tables()


def _rows(table: str) -> list[list[str]]:
    """The body rows of the first Markdown table in ``table``, cell by cell."""
    lines = [line for line in table.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def _ratio_cell(value: float) -> str:
    return f"{value:.2f}"


PEER_FILES = [
    "peers_host_cpu.json",
    "peers_cpu.json",
    "peers_host_cpu_rerun6.json",
    "peers_envpool_jax_cpu.json",
    "peers_pong_cpu.json",
    "peers_halfcheetah_cpu.json",
    "peers_cartpole_cpu.json",
    "peers_pong_20261201_cpu.json",
    "peers_halfcheetah_20261201_cpu.json",
    "multi_agent_rllib_quiet_cpu.json",
    "multi_agent_rllib_cpu.json",
    "multi_agent_rllib_20261201_cpu.json",
]


@pytest.mark.parametrize("name", PEER_FILES)
def test_systems_table_has_every_system_and_width_with_the_ratio_of_medians(name):
    report = tables.load(name)
    rows = _rows(tables.systems_table(name))
    by_key = {(row[0], row[1], row[2]): row for row in rows}
    expected = 0
    for result in report["results"]:
        systems = result["systems"]
        ours = systems["jaxrunner"]["median"]
        for key, system in systems.items():
            expected += 1
            label = system["label"]
            if label == key:  # reports that name a system by its key only
                label = tables.LABELS[key]
            row = by_key[(result["backend"], str(result["num_envs"]), label)]
            assert row[3] == f"{system['median']:,.0f}"
            if key == "jaxrunner":
                assert row[4] == ""
                continue
            # The file's own ratio is jaxrunner's median over the other's, and so is ours.
            assert result["ratios"][key]["median"] == pytest.approx(ours / system["median"])
            spread = result["ratios"][key]
            assert row[4] == (
                f"{_ratio_cell(ours / system['median'])} "
                f"[{_ratio_cell(spread['min'])}-{_ratio_cell(spread['max'])}]"
            )
    assert len(rows) == expected
    assert f"`benchmarks/results/{name}`" in tables.systems_table(name)
    assert report["command"] in tables.systems_table(name)


def test_headline_has_every_host_row_of_its_runs_and_their_ratios():
    rows = _rows(tables.headline_table())
    header = [title for title, _keys in tables.HEADLINE_PEERS]
    checked = 0
    for (workload, name), expected_rows in zip(
        tables.HEADLINE_RUNS, _group(rows, [w for w, _ in tables.HEADLINE_RUNS])
    ):
        report = tables.load(name)
        host = [r for r in report["results"] if r["backend"] in ("sync", "process")]
        assert [(row[1], row[2]) for row in expected_rows] == [
            (r["backend"], str(r["num_envs"])) for r in host
        ]
        for row, result in zip(expected_rows, host):
            systems = result["systems"]
            assert row[3] == f"{systems['jaxrunner']['median']:,.0f}"
            for cell, (title, keys) in zip(row[4:], tables.HEADLINE_PEERS):
                present = [key for key in keys if key in systems]
                if not present:
                    assert cell == "-", (workload, title)
                    continue
                (key,) = present  # a row never holds two systems for one column
                assert cell == _ratio_cell(result["ratios"][key]["median"]) + "x"
                checked += 1
    assert len(header) == 6 and checked >= 30


def test_the_readme_table_is_the_latest_runs_with_the_envpool_rows():
    """The README's table is ``readme_table()`` (``README_RUNS``); an ``envpool`` row sets
    the backend against EnvPool driven by hand (its ``hand``) in sync and async mode."""
    table = tables.readme_table()
    assert table in (ROOT / "README.md").read_text()
    rows = _rows(table)
    checked = 0
    for workload, name in tables.README_RUNS:
        pools = [r for r in tables.load(name)["results"] if r["backend"] == "envpool"]
        got = [row for row in rows if row[0] == workload and row[1] == "envpool"]
        assert [row[2] for row in got] == [str(r["num_envs"]) for r in pools]
        for row, result in zip(got, pools):
            ratios = result["ratios"]
            assert row[4] == row[5] == row[8] == row[9] == "-"  # no other system there
            assert row[6] == _ratio_cell(ratios["hand"]["median"]) + "x"
            assert row[7] == _ratio_cell(ratios["hand_envpool_async"]["median"]) + "x"
            checked += 1
    assert checked == 8


def _group(rows: list[list[str]], workloads: list[str]) -> list[list[list[str]]]:
    return [[row for row in rows if row[0] == workload] for workload in workloads]


def test_multi_agent_host_ratios_are_the_medians_of_the_rounds_in_the_file():
    report = tables.load("multi_agent_host_quiet_cpu.json")
    rows = _rows(tables.multi_agent_host_table())
    assert [row[0] for row in rows] == [str(r["num_envs"]) for r in report["results"]]
    for row, result in zip(rows, report["results"]):
        assert row[1] == f"{result['hand_loop_env_steps_per_s']:,.0f}"
        keys = ["jaxrunner", "jaxrunner_process", "jaxrunner_process_2splits"]
        for cell, key in zip(row[2:], keys):
            per_round = result[f"{key}_ratios_vs_hand_loop_per_round"]
            assert result[f"{key}_ratio_vs_hand_loop"] == pytest.approx(
                statistics.median(per_round)
            )
            assert cell.startswith(_ratio_cell(statistics.median(per_round)) + " [")


def test_jaxmarl_table_holds_the_files_rates_and_ratio():
    report = tables.load("multi_agent_jaxmarl_cpu.json")
    ((envs, ours, hand, cell),) = _rows(tables.multi_agent_jaxmarl_table())
    (result,) = report["results"]
    assert envs == str(result["num_envs"])
    assert ours == f"{result['jaxrunner_agent_steps_per_s']:,.0f}"
    assert hand == f"{result['hand_scan_agent_steps_per_s']:,.0f}"
    per_round = result["jaxrunner_ratios_vs_hand_scan_per_round"]
    assert cell.startswith(_ratio_cell(statistics.median(per_round)) + " [")


@pytest.mark.parametrize(
    "name",
    [
        "serve_load_hostile_quiet_cpu.json",
        "serve_load_hostile_placebo_quiet_cpu.json",
        "serve_load_hostile_cpu.json",
    ],
)
def test_serve_load_table_has_every_system_with_its_medians(name):
    report = tables.load(name)
    rows = {row[0]: row for row in _rows(tables.serve_load_table(name))}
    systems = {k: v for k, v in report["summary_median"].items() if isinstance(v, dict)}
    assert set(rows) == set(systems)
    for key, summary in systems.items():
        per_run = [run["requests_per_s"] for run in report["runs"][key]]
        assert summary["requests_per_s"] == pytest.approx(statistics.median(per_run))
        assert rows[key][1] == f"{summary['requests_per_s']:,.0f}"
        assert rows[key][5] == str(summary["num_5xx_total"]) == "0"
        assert rows[key][6] == str(summary["lost_steps_total"]) == "0"


def test_ray_scaling_table_matches_the_files_ratios():
    report = tables.load("ray_scaling_cpu.json")
    rows = {row[0]: row for row in _rows(tables.ray_scaling_table())}
    medians = report["median_env_steps_per_s"]
    assert set(rows) == set(medians)
    assert rows["group_1_runner"][2] == _ratio_cell(report["ratio_1_runner_vs_local"])
    for system, steps in medians.items():
        per_round = report["env_steps_per_s"][system]
        assert steps == pytest.approx(statistics.median(per_round))
        assert rows[system][1] == f"{steps:,.0f}"


def test_thread_layouts_table_holds_each_systems_median_cpus_and_ratio():
    names = (
        "thread_layouts_pong_stop104_cpu.json",
        "thread_layouts_halfcheetah_stop104_cpu.json",
        "thread_layouts_cartpole_stop104_cpu.json",
    )
    rows = {(r[0], r[1], r[2]): r for r in _rows(tables.thread_layouts_table(*names))}
    expected = 0
    for name in names:
        report = tables.load(name)
        for row in report["results"]:
            best = row["median_steps_per_s"][row["best_hand"]]
            for system, per_round in row["rounds"].items():
                expected += 1
                steps = row["median_steps_per_s"][system]
                assert steps == pytest.approx(statistics.median(per_round))
                cells = rows[report["config"]["workload"], str(row["num_envs"]), system]
                assert cells[3] == f"{steps:,.0f}"
                assert cells[4] == f"{row['cores'][system]:.2f}"
                assert cells[5] == f"{steps / best:.2f}"
    assert len(rows) == expected


def test_every_marker_on_the_page_names_a_table_and_every_table_is_on_the_page():
    text = PAGE.read_text()
    markers = tables.MARKER.findall(text)
    assert sorted(set(markers)) == sorted(tables.TABLES)
    filled = tables.fill(text)
    assert "<!-- table:" not in filled
    with pytest.raises(KeyError, match="no results table named"):
        tables.fill("<!-- table: no_such_table -->")


def test_every_result_file_the_page_cites_is_committed():
    """Pruning results/ must not leave the page pointing at nothing. The page cites
    removed files only through a commit (git show COMMIT:path)."""
    text = PAGE.read_text()
    cited = set(re.findall(r"\b([a-z0-9_]+_cpu(?:_[a-z0-9_]+)?\.(?:json|png))", text))
    in_history = set(re.findall(r"git show\s+[0-9a-f]{7,}:benchmarks/results/([\w.]+)", text))
    missing = sorted(name for name in cited - in_history if not (tables.RESULTS / name).exists())
    assert cited and missing == []

"""The README's set-up is two commands; the CLI's main job works end to end (the
README's examples run in tests/test_docs_examples.py)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys

import pytest

from jaxrunner._src import bench, cli
from jaxrunner._src.bench import plot, rounds

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_setup_has_exactly_two_commands():
    section = README.read_text().split("## Set-up", 1)[1].split("##", 1)[0]
    commands = re.search(r"```bash\n(.*?)```", section, re.S).group(1).strip().splitlines()
    assert len(commands) == 2
    assert "jaxrunner bench" in commands[0] and "pytest" in commands[1]


def _fresh_process_dispatch(**env: str) -> str:
    """JAX's CPU dispatch in a new process after ``import jaxrunner``: what a user gets."""
    code = (
        "import jaxrunner; from jaxrunner._src.cpu_dispatch import inline_cpu_dispatch; "
        "print('inline' if inline_cpu_dispatch() else 'async')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    return done.stdout.strip()


def test_bench_report_holds_every_round_and_each_system_ran_at_its_dispatch(
    capsys, monkeypatch, tmp_path
):
    assert [bench.rollout_length(n) for n in (1, 3, 256, 1024)] == [2048, 682, 8, 8]
    # Shorter rollouts by the same kind of rule: the parent's T reaches every child.
    monkeypatch.setattr(rounds.timing, "rollout_length", lambda n, steps: max(8, 64 // n))
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = ["bench", "--num-envs", "1", "3", "--rounds", "2", "--seconds", "0.01"]
    assert cli.main([*argv, "--json", "--out", str(out), "--plot", str(png)]) == 0
    report = json.loads(capsys.readouterr().out)  # stdout holds only the JSON
    assert json.loads(out.read_text()) == report
    # jaxrunner as a user runs it; the hand loop at JAX's defaults, in its own process.
    children = report["children"]
    assert children["jaxrunner"]["cpu_dispatch"] == _fresh_process_dispatch()
    if "JAX_CPU_ENABLE_ASYNC_DISPATCH" not in os.environ:  # jaxrunner's own default
        assert children["jaxrunner"]["cpu_dispatch"] == "inline"
    assert report["machine"]["jax_cpu_dispatch"] == children["jaxrunner"]["cpu_dispatch"]
    assert children["hand_loop"]["cpu_dispatch"] == "async"
    assert children["hand_loop"]["JAX_CPU_ENABLE_ASYNC_DISPATCH"] == "true"
    assert report["config"]["backends"] == ["sync"] and report["skipped"] == {}
    assert [row["num_envs"] for row in report["results"]] == [1, 3]
    for row in report["results"]:
        assert row["backend"] == "sync" and row["errors"] == {}
        assert row["rollout_length"] == max(8, 64 // row["num_envs"])
        assert len(row["loadavg_per_round"]) == 2
        systems = row["systems"]
        assert set(systems) == {"jaxrunner", "hand", "ceiling"}
        for system in systems.values():
            assert len(system["rounds"]) == len(system["all_rounds"]) == 2
            assert system["min"] <= system["median"] <= system["max"]
            assert all(value > 0 for value in system["rounds"])
        jr_rate, hand_rate = systems["jaxrunner"]["median"], systems["hand"]["median"]
        ratio = row["ratios"]["hand"]
        assert ratio["median"] == pytest.approx(jr_rate / hand_rate)  # ratio of medians
        assert ratio["rounds"] == pytest.approx(
            [a / b for a, b in zip(systems["jaxrunner"]["rounds"], systems["hand"]["rounds"])]
        )
        split = row["split_us"]
        assert set(split) == {"env_us", "policy_us", "record_us", "other_us", "total_us"}
        assert split["env_us"] > 0 and split["policy_us"] > 0 and split["record_us"] > 0
        for measured in systems["jaxrunner"]["all_rounds"]:  # the parts add up per round
            parts = measured["split_us"]
            assert sum(parts[k] for k in ("env_us", "policy_us", "record_us", "other_us")) == (
                pytest.approx(parts["total_us"])
            )
            assert parts["total_us"] == pytest.approx(
                1e6 * row["num_envs"] / measured["steps_per_s"]
            )
        ceiling = row["ceiling"]
        assert ceiling["raw_env_us"] > 0 and ceiling["policy_us"] > 0
        for measured in systems["ceiling"]["all_rounds"]:  # the in-turn loop's own rate
            assert measured["in_turn_us"] == pytest.approx(
                1e6 * row["num_envs"] / measured["in_turn_steps_per_s"]
            )
        assert ceiling["in_turn_us"] > 0
        assert ceiling["steps_per_s"] == pytest.approx(
            statistics.median(r["steps_per_s"] for r in systems["ceiling"]["all_rounds"])
        )
        assert row["layout"] == {"num_workers": 0, "num_splits": row["layout"]["num_splits"]}
    assert report["verdict"].startswith("jaxrunner is ")
    text = bench.format_report(report)
    assert "hand loop" in text and "ceiling" in text and "in turn" in text
    assert text.splitlines()[-1] == report["verdict"]
    # --plot: a line per system through its medians at each width, in a PNG that reads back.
    medians = {
        name: [(row["num_envs"], row["systems"][name]["median"]) for row in report["results"]]
        for name in ("jaxrunner", "hand", "ceiling")
    }
    assert plot.series(report["results"]) == {
        "jaxrunner sync": medians["jaxrunner"],
        "hand loop: gymnasium SyncVectorEnv": medians["hand"],
        "ceiling sync: env + bare policy call": medians["ceiling"],
    }
    import matplotlib.image

    height, width, channels = matplotlib.image.imread(png).shape
    assert height > 100 and width > 100 and channels in (3, 4)


def test_bench_plot_without_matplotlib_names_the_extra_before_measuring(
    capsys, monkeypatch, tmp_path
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails

    def no_run(*args, **kwargs):
        raise AssertionError("measured although the plot could not be drawn")

    monkeypatch.setattr(bench, "run", no_run)
    assert cli.main(["bench", "--plot", str(tmp_path / "bench.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxrunner bench: jaxrunner bench --plot draws with matplotlib")
    assert "pip install 'jaxrunner[plot]'" in err
    assert not (tmp_path / "bench.png").exists()


def test_bench_on_a_pettingzoo_env_times_the_multi_agent_runner_on_every_backend(
    capsys, monkeypatch, tmp_path
):
    pytest.importorskip("mpe2")
    # The rule's own 1024 steps at 2 envs cost seconds of PettingZoo steps per measurement.
    monkeypatch.setattr(rounds.timing, "rollout_length", lambda num_envs, steps: 16)
    out = tmp_path / "bench.json"
    argv = ["bench", "--env", "mpe2:simple_spread_v3", "--num-envs", "2", "--backend", "all"]
    argv += ["--rounds", "2", "--seconds", "0.01", "--out", str(out)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["multi_agent"] == {
        "module": "mpe2.simple_spread_v3",
        "agents": ["agent_0", "agent_1", "agent_2"],
    }
    assert report["config"]["backends"] == ["sync", "process", "auto"]
    assert report["skipped"] == {}
    assert [(row["backend"], row["num_envs"]) for row in report["results"]] == [
        ("sync", 2),
        ("process", 2),
        ("auto", 2),  # EnvRunner.from_env: its trial's choice
    ]
    for row in report["results"]:
        assert row["errors"] == {} and row["rollout_length"] == 16
        systems = row["systems"]
        assert set(systems) == {"jaxrunner", "hand"}  # no ceiling for a multi-agent env
        assert systems["jaxrunner"]["label"] == (
            f"jaxrunner EnvRunner.sample(), backend {row['backend']}"
        )
        assert systems["hand"]["label"] == (
            "hand loop: a list of PettingZoo parallel envs, stepped one by one"
        )
        for system in systems.values():
            assert len(system["rounds"]) == 2 and all(r > 0 for r in system["rounds"])
        ratio = row["ratios"]["hand"]
        assert ratio["median"] == pytest.approx(
            systems["jaxrunner"]["median"] / systems["hand"]["median"]
        )
        split = row["split_us"]
        assert split["env_us"] > 0 and split["policy_us"] > 0 and split["total_us"] > 0
        assert row["ceiling"] is None
    assert report["results"][1]["layout"]["num_workers"] >= 1
    choice = report["results"][2]["layout"]["auto"]  # what from_env chose, and why
    assert choice["backend"] in ("sync", "process") and "tried with the policy" in choice["reason"]
    # The text: what was measured, a table per backend without ceiling columns, the verdict.
    assert text.startswith("mpe2:simple_spread_v3 (3 agents: agent_0, agent_1, agent_2);")
    assert "jaxrunner: EnvRunner.sample() as a user runs it" in text
    for backend in ("sync", "process", "auto"):
        assert f"backend {backend}: jaxrunner EnvRunner against the hand loop" in text
    assert "ceiling" not in text
    assert text.rstrip().splitlines()[-1] == report["verdict"]
    assert report["verdict"].startswith("jaxrunner is ")


def test_bench_on_a_pettingzoo_env_refuses_a_single_agent_backend(capsys):
    pytest.importorskip("mpe2")
    assert cli.main(["bench", "--env", "mpe2:simple_spread_v3", "--backend", "gymnasium"]) == 2
    err = capsys.readouterr().err
    assert "expected some of ['sync', 'process', 'auto'] (those that step PettingZoo envs)" in err
    assert err.rstrip().endswith("Check --backend (sync, process, auto or all for this env).")


def test_bench_tells_a_pettingzoo_env_from_a_gymnasium_id():
    pytest.importorskip("mpe2")
    assert bench.plans_for("mpe2:simple_spread_v3") is bench.MULTI_AGENT_PLANS
    assert bench.plans_for("CartPole-v1") is bench.PLANS
    # gymnasium's own module:EnvId form names no submodule
    assert bench.plans_for("gymnasium.envs.classic_control:CartPole-v1") is bench.PLANS
    assert bench.plans_for("no_such_package:simple_spread_v3") is bench.PLANS


def _row(backend: str, num_envs: int, ratio: float, low: float, high: float) -> dict:
    return {
        "backend": backend,
        "num_envs": num_envs,
        "ratios": {"hand": {"median": ratio, "min": low, "max": high}},
    }


def test_verdict_says_where_jaxrunner_wins_and_loses_and_by_how_much():
    wins = [_row("sync", 1, 1.4, 1.3, 1.5), _row("sync", 8, 1.8, 1.7, 1.9)]
    assert bench.verdict(wins) == (
        "jaxrunner is 1.40-1.80x faster than the hand-written loop at every width (1, 8 envs)"
    )
    mixed = [*wins, _row("sync", 64, 0.9, 0.8, 1.05)]
    assert bench.verdict(mixed) == (
        "jaxrunner is 1.40-1.80x faster than the hand-written loop at 1, 8 envs, and loses "
        "at 64 envs (0.90x, 10% slower); the rounds disagree at 64 envs"
    )
    losses = [_row("sync", 1, 0.5, 0.4, 0.6), _row("process", 64, 0.8, 0.7, 0.9)]
    assert bench.verdict(losses) == (
        "jaxrunner is slower than the hand-written loop on every backend at every width "
        "(sync x1, process x64): 0.50-0.80x its speed"
    )
    failed = {"backend": "sync", "num_envs": 256, "ratios": {}}
    assert bench.verdict([*wins, failed]) == (
        "jaxrunner is 1.40-1.80x faster than the hand-written loop where compared (1, 8 envs)"
        "; not compared at 256 envs (a system failed: see its errors)"
    )
    assert bench.verdict([]).startswith("no verdict")


def test_python_dash_m_entry_point():
    done = subprocess.run(
        [sys.executable, "-m", "jaxrunner", "bench", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--num-envs" in done.stdout


def test_bench_output_paths_are_checked_before_measuring(capsys, monkeypatch, tmp_path):
    drawn = []
    monkeypatch.setattr(bench, "run", lambda *a: {"results": []})  # measures nothing
    monkeypatch.setattr(bench, "format_report", lambda report: "")
    monkeypatch.setattr(plot, "title", lambda report: "")
    monkeypatch.setattr(plot, "plot", lambda rows, title, path: drawn.append(path))
    for flag in ("--out", "--plot"):  # a folder: refused before anything runs
        monkeypatch.setattr(bench, "run", lambda *a: pytest.fail("measured"))
        assert cli.main(["bench", flag, str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"{flag} {tmp_path} is a folder; give a file's path" in err
    monkeypatch.setattr(bench, "run", lambda *a: {"results": []})
    cli.main(["bench", "--plot", str(tmp_path / "fig")])  # matplotlib's own default suffix
    assert drawn == [tmp_path / "fig.png"]
    assert f"wrote {tmp_path / 'fig.png'}" in capsys.readouterr().err


def test_bench_output_paths_inside_a_file_are_refused_before_measuring(
    capsys, monkeypatch, tmp_path
):
    """``--out a_file/bench.json`` measured for minutes, then died in ``mkdir`` with a
    FileExistsError traceback, the report lost."""
    (tmp_path / "a_file").write_text("")
    monkeypatch.setattr(bench, "run", lambda *a: pytest.fail("measured"))
    for flag, name in (("--out", "bench.json"), ("--plot", "bench.png")):
        path = tmp_path / "a_file" / "sub" / name
        assert cli.main(["bench", flag, str(path)]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"jaxrunner bench: {flag} {path}: {tmp_path / 'a_file'} is a file, not a folder; "
            f"give a path in a folder, e.g. {tmp_path / name}.\n"
        )


def test_bench_refuses_an_env_gymnasium_does_not_know_before_measuring(capsys, monkeypatch):
    monkeypatch.setattr(bench, "run", lambda *a: pytest.fail("measured"))
    assert cli.main(["bench", "--env", "NoSuchEnv-v9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "jaxrunner bench: --env NoSuchEnv-v9: gymnasium has no such env (NameNotFound: "
    )
    assert "give an id it knows (e.g. CartPole-v1" in err and len(err.splitlines()) == 1
    measured = []  # ids gymnasium.make resolves, and a PettingZoo module:name, still run
    monkeypatch.setattr(bench, "run", lambda c, log: measured.append(c.env) or {"results": []})
    envs = ["CartPole", "gymnasium.envs.classic_control:CartPole-v1"]
    if importlib.util.find_spec("mpe2") is not None:
        envs.append("mpe2:simple_spread_v3")
    for env in envs:
        assert cli.main(["bench", "--env", env, "--json"]) == 1  # (nothing measured)
    assert measured == envs


def test_bench_refuses_an_env_no_chosen_backends_library_knows(capsys, monkeypatch):
    """With EnvPool or gymnax installed, any id was let through (it might be theirs), so
    ``--backend all --env NoSuchEnv-v9`` measured, every system failing at every width.
    Now each installed library's own list is asked too."""
    from jaxrunner._src.bench import benchmark

    monkeypatch.setattr(rounds, "not_installed", lambda needs: None)  # as if all installed
    for backend, (name, _) in list(benchmark._REGISTRIES.items()):
        ids = [f"{backend}-Only-v0"]
        monkeypatch.setitem(benchmark._REGISTRIES, backend, (name, lambda ids=ids: ids))
    monkeypatch.setattr(bench, "run", lambda *a: pytest.fail("measured"))
    assert cli.main(["bench", "--backend", "all", "--env", "NoSuchEnv-v9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxrunner bench: --env NoSuchEnv-v9: gymnasium has no such env (")
    assert "nor EnvPool (envpool.list_all_envs()), nor gymnax (gymnax.registered_envs); " in err
    assert cli.main(["bench", "--backend", "envpool", "--env", "NoSuchEnv-v9"]) == 2
    assert capsys.readouterr().err == (
        "jaxrunner bench: --env NoSuchEnv-v9: EnvPool (envpool.list_all_envs()) has no such "
        "env; give an id it lists.\n"
    )
    measured = []  # an id one chosen library lists still runs
    monkeypatch.setattr(bench, "run", lambda c, log: measured.append(c.backends) or {"results": []})
    for backend in ("all", "envpool", "jax"):
        env = "jax-Only-v0" if backend == "jax" else "envpool-Only-v0"
        assert cli.main(["bench", "--backend", backend, "--env", env, "--json"]) == 1
    assert [len(b) for b in measured] == [len(rounds.PLANS), 1, 1]


def test_bench_rejects_unknown_backend():
    with pytest.raises(SystemExit):
        cli.main(["bench", "--backend", "nope"])


@pytest.mark.parametrize("flag", [["--num-envs", "0"], ["--seconds", "0"], ["--rounds", "0"]])
def test_bench_bad_numbers_are_a_clear_error_naming_the_flags(capsys, flag):
    assert cli.main(["bench", *flag]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxrunner bench: BenchConfig(") and flag[0] in err


def test_bench_seconds_must_be_finite():
    """``--seconds inf`` measured forever: refused with the other bad numbers."""
    from jaxrunner._src import bench
    from jaxrunner.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match=r"seconds=inf\): expected a number in"):
        bench.BenchConfig(seconds=float("inf"))


def test_version(capsys):
    import jaxrunner

    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"jaxrunner {jaxrunner.__version__}"


@pytest.mark.parametrize("command", ["bench", "serve"])
def test_every_option_has_help_with_its_default(command):
    parser = cli.build_parser()
    sub = next(
        action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    ).choices[command]
    options = [a for a in sub._actions if a.option_strings and a.dest != "help"]
    assert options
    for action in options:
        assert action.help, f"{command} {action.option_strings[0]} has no help"
        assert "default" in action.help, f"{command} {action.option_strings[0]}: no default"
    text = sub.format_help()
    assert "%(" not in text  # every placeholder expanded

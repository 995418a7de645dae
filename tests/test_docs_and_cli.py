"""The README's quickstart runs as written; the CLI's main job works end to end."""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys

import jax
import pytest

from jaxrunner import cli

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_quickstart_runs(capsys):
    text = README.read_text()
    section = text.split("## Quickstart", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README quickstart", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "(128, 16, 4) (128, 16) (128, 16)"


def test_readme_setup_has_exactly_two_commands():
    section = README.read_text().split("## Set-up", 1)[1].split("##", 1)[0]
    commands = re.search(r"```bash\n(.*?)```", section, re.S).group(1).strip().splitlines()
    assert len(commands) == 2
    assert "jaxrunner bench" in commands[0] and "pytest" in commands[1]


def test_bench_json(capsys):
    # Once JAX has started, its CPU dispatch is fixed (inline in the test processes, the
    # default after ``import jaxrunner``).
    jax.numpy.zeros(1).block_until_ready()
    argv = ["bench", "--num-envs", "1", "3", "--seconds", "0.05", "--json", "--cpu-dispatch"]
    assert cli.main([*argv, "async"]) == 2
    assert "before any JAX computation" in capsys.readouterr().err
    assert cli.main([*argv, "inline"]) == 0
    report = json.loads(capsys.readouterr().out)  # stdout holds only the JSON
    assert report["config"]["cpu_dispatch"] == report["machine"]["jax_cpu_dispatch"] == "inline"
    assert [row["num_envs"] for row in report["results"]] == [1, 3]
    for row in report["results"]:
        assert row["jaxrunner_steps_per_s"] > 0 and row["raw_steps_per_s"] > 0
        assert row["ratio_vs_raw"] == pytest.approx(
            row["jaxrunner_steps_per_s"] / row["raw_steps_per_s"]
        )
    assert report["machine"]["cpu_count"] >= 1


def test_bench_runs_inline_by_default_in_a_fresh_process():
    argv = ["bench", "--num-envs", "2", "--seconds", "0.05", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "jaxrunner", *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(done.stdout)
    assert report["config"]["cpu_dispatch"] == report["machine"]["jax_cpu_dispatch"] == "inline"
    assert report["results"][0]["jaxrunner_steps_per_s"] > 0


def test_python_dash_m_entry_point():
    done = subprocess.run(
        [sys.executable, "-m", "jaxrunner", "bench", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--num-envs" in done.stdout


def test_bench_rejects_unknown_backend():
    with pytest.raises(SystemExit):
        cli.main(["bench", "--backend", "nope"])


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


def test_bench_runs_without_tqdm_and_shows_its_layout(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if not installed
    argv = ["bench", "--num-envs", "2", "--seconds", "0.05"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "[1/3] jaxrunner x2" in captured.err and "[3/3]" in captured.err
    header, row = captured.out.strip().splitlines()[-2:]
    assert header.split()[-2:] == ["workers", "groups"]
    assert row.split()[-2] == "0"  # the sync backend steps in this process

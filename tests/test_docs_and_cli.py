"""The README's quickstart runs as written; the CLI's main job works end to end."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

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
    argv = ["bench", "--num-envs", "1", "3", "--seconds", "0.05", "--json"]
    assert cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out)  # stdout holds only the JSON
    assert [row["num_envs"] for row in report["results"]] == [1, 3]
    for row in report["results"]:
        assert row["jaxrunner_steps_per_s"] > 0 and row["raw_steps_per_s"] > 0
        assert row["ratio_vs_raw"] == pytest.approx(
            row["jaxrunner_steps_per_s"] / row["raw_steps_per_s"]
        )
    assert report["machine"]["cpu_count"] >= 1


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

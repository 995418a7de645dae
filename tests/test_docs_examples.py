"""Every ```python block of README.md and the docs pages runs as a reader runs it:
pasted into a file and run with ``python file.py``, in a temporary directory.

A page's blocks continue one another, so they run in order as one file. A block with
its own ``if __name__ == "__main__":`` guard is a script of its own (the process
backend's workers import the main script, and a reader pastes such a block alone), so
it runs as a file of its own. Each file keeps the page's line numbers: a traceback's
line is the page's. Blocks in any other language (bash, console, text) are shown, not
run. A page whose examples need an optional extra says so on its first line,
``<!-- requires: pettingzoo, ray -->``, and is skipped where one of them is missing.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# An opening fence of three or more backticks with its info string, up to the same fence.
FENCE = re.compile(
    r"^(?P<fence>`{3,})(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S
)
REQUIRES = re.compile(r"^<!--\s*requires:\s*(?P<names>[\w.,\s-]+?)\s*-->")
MAIN_GUARD = re.compile(r"""^if __name__ == ["']__main__["']:""", re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """The page's blocks whose info string is exactly ``python``, with their line numbers."""
    return [
        (text.count("\n", 0, match.start()) + 1, match["body"])
        for match in FENCE.finditer(text)
        if match["info"].strip() == "python"
    ]


def required_modules(text: str) -> list[str]:
    """The modules the page's first line declares it needs, in order."""
    lines = text.splitlines()
    match = REQUIRES.match(lines[0]) if lines else None
    if match is None:
        return []
    return [name.strip() for name in match["names"].split(",") if name.strip()]


def scripts(text: str) -> list[tuple[int, str]]:
    """The files a reader makes of a page: the blocks without a ``__main__`` guard
    together (number 0), then each guarded block alone (1, 2, ...). Every file has the
    page's line count, its code on the page's lines and blank lines elsewhere."""
    blocks = python_blocks(text)
    together = [block for block in blocks if not MAIN_GUARD.search(block[1])]
    alone = [[block] for block in blocks if MAIN_GUARD.search(block[1])]
    files = list(enumerate([together, *alone])) if together else list(enumerate(alone, 1))
    return [(number, _on_page_lines(text, chosen)) for number, chosen in files]


def _on_page_lines(text: str, blocks: list[tuple[int, str]]) -> str:
    lines = [""] * (text.count("\n") + 1)
    for fence_line, body in blocks:  # the body starts on the line after the fence
        lines[fence_line : fence_line + body.count("\n")] = body.splitlines()
    return "\n".join(lines) + "\n"


def pages_with_examples() -> list[Path]:
    """README.md and every docs page (not the built site) that has a python block."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [
        page
        for page in pages
        if "_build" not in page.relative_to(ROOT).parts
        and python_blocks(page.read_text(encoding="utf-8"))
    ]


def case_id(name: str, number: int) -> str:
    """The page, with ``#script-<k>`` for its k-th guarded block (``-k envpool`` still
    selects every file of the EnvPool page)."""
    return name if number == 0 else f"{name}#script-{number}"


def script_cases() -> list[pytest.param]:
    """One case per file a reader makes of a page."""
    return [
        pytest.param(page, number, id=case_id(str(page.relative_to(ROOT)), number))
        for page in pages_with_examples()
        for number, _ in scripts(page.read_text(encoding="utf-8"))
    ]


# What pages tell the reader a file prints, checked line by line in order (each pattern
# matches a whole line after the previous one's): regular expressions, by case id.
PRINTS = {
    "README.md": [r"\(128, 16, 4\) \(128, 16\) \(128, 16\)", r"\(25, 4, 3, 18\) True"],
    # gae on a group leaves invalid slots at zero; evaluation; an exact resume.
    "docs/multi-agent.md": [
        r"\(16, 4, 3, 18\) True \(16, 4\)",
        r"\(12, 2, 3\) True",
        r"4 \['agent_0', 'agent_1', 'agent_2'\]",
        r"True True",
    ],
    "docs/multi-agent.md#script-1": [r"True"],  # agent steps counted on the process backend
    "docs/multi-agent.md#script-2": [r"2 \['spread-episode-0\.mp4'\]"],  # env 0's video
    "docs/backends/process.md#script-1": [r"True True"],  # the sync backend's, bit for bit
    "docs/fault-tolerance.md#script-1": [r"True True"],  # a hung worker replaced
    "docs/connectors.md": [r"\(64, 8, 3\) 1024\.0 \[.*", r"\(16, 4, 3, 2, 18\) 384\.0"],
    # Four whole CartPole episodes through the server; every agent of ComingAndGoing.
    "docs/serving.md": [
        r"episodes: \[[1-9]\d*, [1-9]\d*, [1-9]\d*, [1-9]\d*\] mean batch: .*",
        r"agent episodes: \{(?=.*'a0': [1-9])(?=.*'a1': [1-9])(?=.*'a2': [1-9]).*\}",
    ],
}


def check_prints(out: str, patterns: list[str]) -> None:
    """Each pattern matches a whole line of ``out``, in order."""
    lines = iter(out.splitlines())
    for pattern in patterns:
        if not any(re.fullmatch(pattern, line) for line in lines):
            pytest.fail(f"no line after the last matched one is /{pattern}/ in:\n{out}")


def test_finds_python_blocks_only() -> None:
    page = "\n".join(
        [
            "<!-- requires: ray, pettingzoo -->",
            "```python",
            "x = 1",
            "```",
            "```bash",
            "echo no",
            "```",
            "````python",
            "y = x + 1",
            "```text",
            "nested",
            "```",
            "````",
            "```python title",
            "z = 3",
            "```",
        ]
    )
    blocks = python_blocks(page)
    assert [line for line, _ in blocks] == [2, 8]
    assert blocks[0][1] == "x = 1\n"
    assert blocks[1][1].startswith("y = x + 1\n```text")
    assert required_modules(page) == ["ray", "pettingzoo"]
    assert required_modules("# Title\n<!-- requires: ray -->") == []


def test_guarded_blocks_are_files_of_their_own_on_the_page_lines() -> None:
    page = "\n".join(
        [
            "# Title",
            "```python",
            "x = 1",
            "```",
            "```python",
            "def main():",
            "    pass",
            "",
            'if __name__ == "__main__":',
            "    main()",
            "```",
            "```python",
            "y = x",
            "```",
        ]
    )
    files = scripts(page)
    assert [number for number, _ in files] == [0, 1]
    together, guarded = (source.splitlines() for _, source in files)
    assert len(together) == len(guarded) == len(page.splitlines())
    assert (together[2], together[12]) == ("x = 1", "y = x")
    assert "".join(together[4:11]) == ""  # the guarded block is not in the page's file
    assert guarded[5:10] == page.splitlines()[5:10] and "".join(guarded[:5]) == ""


@pytest.mark.parametrize(("page", "number"), script_cases())
def test_page_examples_run(page: Path, number: int, tmp_path: Path) -> None:
    text = page.read_text(encoding="utf-8")
    name = str(page.relative_to(ROOT))
    for module in required_modules(text):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{name} needs {module}, which is not installed")
    source = dict(scripts(text))[number]
    # Named for the page, never for a module it imports (jax.md as jax.py would shadow jax).
    script = tmp_path / (re.sub(r"\W", "_", case_id(name, number)) + ".py")
    script.write_text(source, encoding="utf-8")
    # This checkout's jaxrunner, as the tests import it (in CI also the installed one).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, script.name],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        pytest.fail(
            f"python {script.name} (the examples of {name}; its line numbers are the "
            f"page's) exited with {done.returncode}:\n{done.stderr[-6000:]}"
        )
    check_prints(done.stdout, PRINTS.get(case_id(name, number), []))


def test_prints_are_checked_on_files_that_exist() -> None:
    ids = {case.id for case in script_cases()}
    assert set(PRINTS) <= ids, set(PRINTS) - ids

"""Every ```python block of README.md and the docs pages runs, page by page.

A page's blocks run in order in one fresh namespace (a later block uses what an
earlier one defined), with a temporary directory as the working directory, since
pages may write files. Blocks in any other language (bash, console, text) are shown,
not run. A page whose examples need an optional extra says so on its first line,
``<!-- requires: pettingzoo, ray -->``, and is skipped where one of them is missing.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import cloudpickle
import pytest

ROOT = Path(__file__).resolve().parent.parent


# An opening fence of three or more backticks with its info string, up to the same fence.
FENCE = re.compile(
    r"^(?P<fence>`{3,})(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S
)
REQUIRES = re.compile(r"^<!--\s*requires:\s*(?P<names>[\w.,\s-]+?)\s*-->")


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


def pages_with_examples() -> list[Path]:
    """README.md and every docs page (not the built site) that has a python block."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [
        page
        for page in pages
        if "_build" not in page.relative_to(ROOT).parts
        and python_blocks(page.read_text(encoding="utf-8"))
    ]


PAGES = pages_with_examples()

# Pages whose every block a test of their feature runs, checking what they print: run
# once there, not twice. The count guards it: a block added to such a page runs here too.
RUN_BY_FEATURE_TESTS = {
    "docs/multi-agent.md": (5, "tests/test_multi_agent.py"),
    "docs/connectors.md": (2, "tests/test_connectors.py, tests/test_connectors_multi_agent.py"),
    "docs/serving.md": (2, "tests/test_serve.py, tests/test_serve_multi_agent.py"),
}


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


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = page.read_text(encoding="utf-8")
    count, tests = RUN_BY_FEATURE_TESTS.get(str(page.relative_to(ROOT)), (None, ""))
    if count == len(python_blocks(text)):
        pytest.skip(f"its {count} blocks run in {tests}, with their output checked")
    for module in required_modules(text):
        pytest.importorskip(module)
    if "ray.init(" in text and "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()  # the Ray tests' shared instance; the page starts its own
    monkeypatch.chdir(tmp_path)
    # The page's namespace is a module of its own, as a script's or a notebook's is: a
    # dataclass defined there finds its module, and cloudpickle sends what the page
    # defines to worker processes by value. Not "__main__": a page's
    # `if __name__ == "__main__":` block is for a script of its own.
    page_module = types.ModuleType("docs_example")
    monkeypatch.setitem(sys.modules, page_module.__name__, page_module)
    cloudpickle.register_pickle_by_value(page_module)
    try:
        # An example that raises fails the page, its traceback naming the page and line.
        for line, body in python_blocks(text):
            code = compile("\n" * line + body, str(page.relative_to(ROOT)), "exec")
            exec(code, page_module.__dict__)
    finally:
        cloudpickle.unregister_pickle_by_value(page_module)

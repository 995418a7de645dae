"""The performance page's figures, drawn from the committed ``benchmarks/results/*.json``.

A marker ``<!-- figure: NAME -->`` on a page is replaced, when Sphinx reads the page, by
the figure of ``FIGURES[NAME]``'s result file: env steps/s against the number of envs,
a line per system, as ``jaxrunner bench --plot`` draws it (``jaxrunner._src.bench.plot``,
matplotlib's Agg backend), written into the build's ``_figures/`` folder, with a caption
naming the file. So the pictures, like the tables (``results_tables.py``), are always
those of the files.
"""

from __future__ import annotations

import html
import pathlib
import re
from typing import Any

from results_tables import LABELS, load

from jaxrunner._src.bench import plot

MARKER = re.compile(r"<!--\s*figure:\s*([\w-]+)\s*-->")
FOLDER = "_figures"
"""The figures' folder in the build's output."""

FIGURES: dict[str, str] = {
    "peers_cartpole": "peers_cartpole_cpu.json",
    "peers_pong": "peers_pong_20261201_cpu.json",
    "peers_halfcheetah": "peers_halfcheetah_20261201_cpu.json",
    "peers_every_kind": "peers_host_cpu.json",
    "peers_envpool_jax": "peers_envpool_jax_cpu.json",
    "bench_sync": "bench_sync_cpu.json",
}
"""Each figure's result file in ``benchmarks/results/``."""


def fill(text: str, folder: pathlib.Path, prefix: str = "") -> str:
    """``text`` with every figure marker replaced by its figure, drawn into ``folder``
    and linked as ``prefix + _figures/NAME.png``; an unknown name raises."""

    def figure(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in FIGURES:
            raise KeyError(f"no results figure named {name!r}; known: {sorted(FIGURES)}")
        report = load(FIGURES[name])
        plot.plot(report["results"], plot.title(report), folder / f"{name}.png", labels=LABELS)
        alt = html.escape(f"env steps/s against envs: {plot.title(report)}", quote=True)
        caption = (
            f"From <code>benchmarks/results/{FIGURES[name]}</code> "
            f"({str(report.get('date', 'undated'))[:10]}): medians of interleaved rounds, "
            "jaxrunner solid, hand loops and peers dashed, the ceiling dotted."
        )
        return (
            f'<figure><img src="{prefix}{FOLDER}/{name}.png" alt="{alt}" style="width:100%">'
            f"<figcaption>{caption}</figcaption></figure>"
        )

    return MARKER.sub(figure, text)


def _on_source_read(app: Any, docname: str, source: list[str]) -> None:
    if MARKER.search(source[0]):
        prefix = "../" * docname.count("/")  # the page's way back to the output root
        source[0] = fill(source[0], pathlib.Path(app.outdir) / FOLDER, prefix)


def setup(app: Any) -> dict[str, Any]:
    import sphinx  # noqa: F401  (only a Sphinx build loads this hook)

    app.connect("source-read", _on_source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

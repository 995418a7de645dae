"""The performance page's figures (docs/_ext/results_figures.py): each marker on the page
names a figure, and a figure is drawn from its result file into the build as a PNG
that reads back, linked from the page."""

from __future__ import annotations

import pathlib

import matplotlib.image
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "performance.md"


@pytest.fixture
def figures(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "docs" / "_ext"))  # as docs/conf.py does
    import results_figures

    return results_figures


def test_every_figure_marker_on_the_page_names_a_figure_and_every_figure_is_on_it(figures):
    markers = figures.MARKER.findall(PAGE.read_text())
    assert sorted(markers) == sorted(figures.FIGURES)
    assert all((ROOT / "benchmarks" / "results" / f).exists() for f in figures.FIGURES.values())
    with pytest.raises(KeyError, match="no results figure named"):
        figures.fill("<!-- figure: no_such_figure -->", ROOT)


def test_a_figure_is_drawn_into_the_build_and_linked_from_the_page(figures, tmp_path):
    text = figures.fill("before\n\n<!-- figure: peers_pong -->\n\nafter", tmp_path, "../")
    assert text.startswith('before\n\n<figure><img src="../_figures/peers_pong.png"')
    assert "<code>benchmarks/results/peers_pong_20261201_cpu.json</code>" in text
    assert text.endswith("</figure>\n\nafter")
    height, width, _ = matplotlib.image.imread(tmp_path / "peers_pong.png").shape
    assert height > 100 and width > 100

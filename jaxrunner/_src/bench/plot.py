"""The benchmarks' picture: env steps/s against the number of envs, a line per system
(matplotlib, the ``plot`` extra)."""

from __future__ import annotations

import pathlib
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrunner.errors import MissingDependencyError


def require_matplotlib(what: str = "jaxrunner bench --plot") -> None:
    """Raises :class:`MissingDependencyError`, naming the extra, without matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise MissingDependencyError(
            f"{what} draws with matplotlib, which is not installed: "
            f"pip install 'jaxrunner[plot]' ({err})"
        ) from err


def series(
    rows: Sequence[dict[str, Any]], labels: Mapping[str, str] | None = None
) -> dict[str, list[tuple[int, float]]]:
    """(envs, median steps/s) per line: jaxrunner and the ceiling per backend, every
    other system by its label, once; ``labels`` name systems older reports key only."""
    lines: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for name, system in row["systems"].items():
            if name == "jaxrunner":
                line = f"jaxrunner {row['backend']}"
            elif name == "ceiling":
                line = f"ceiling {row['backend']}: env + bare policy call"
            else:
                line = str(system.get("label", name))
                if line == name and labels and name in labels:  # an older report's bare key
                    line = labels[name]
            points = lines.setdefault(line, [])
            if all(width != row["num_envs"] for width, _ in points):
                points.append((row["num_envs"], system["median"]))
    return {line: sorted(points) for line, points in lines.items()}


def plot(rows: Sequence[dict[str, Any]], title: str, path: pathlib.Path, **options: Any) -> None:
    """Draws :func:`series` of ``rows`` (``options``: its ``labels``), log-log, into the
    PNG ``path``."""
    require_matplotlib(f"plotting {path}")
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for line, points in series(rows, **options).items():
        x, y = zip(*points)
        style = "-" if line.startswith("jaxrunner") else ":" if line.startswith("ceiling") else "--"
        ax.plot(x, y, style, marker="o", markersize=4, label=line)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("number of envs")
    ax.set_ylabel("env steps / s (median of rounds)")
    ax.set_title(textwrap.fill(title, 70), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def title(report: dict[str, Any]) -> str:
    machine = report["machine"]
    # "jr.models.mlp_policy: 64-64 tanh MLP, stochastic actions, jitted" -> "64-64 tanh MLP"
    policy = re.sub(r"^[\w.]+:?\s*", "", report.get("policy", "")).split(", stochastic")[0]
    rounds = report["config"].get("rounds")
    env = report.get("env") or report["config"].get("env")
    return (
        f"{env}, {policy}; {', '.join(machine['jax_devices'])}, {machine['cpu_count']} CPUs; "
        f"median of {rounds} interleaved round{'s' if rounds != 1 else ''}"
    )

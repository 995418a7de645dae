"""The episode book's ``close()`` at a git revision against the working tree: what
numbering a sample's episodes (ids, steps, returns) costs per sample.

Both versions of ``jaxrunner/_src/samplers/episode_ids.py`` (the base's from ``git
show``; their jaxrunner imports are type annotations only) close the same random samples
in interleaved rounds, so the ratio holds on a busy machine. In each sample, each step
ends its env's episode with probability ``--end-rate`` (CartPole under a random policy:
about 0.05); every step is valid.

Usage::

    python benchmarks/episode_book.py --base d660c28 \\
        --out benchmarks/results/episode_book_d660c28_cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re
import statistics
import subprocess
import sys
import time
import types
from typing import Any

import numpy as np

from jaxrunner._src.bench import machine_info

REPO = pathlib.Path(__file__).resolve().parent.parent
MODULE = "jaxrunner/_src/samplers/episode_ids.py"
JAXRUNNER_IMPORT = re.compile(r"^from jaxrunner\S* import (\w+)$", re.MULTILINE)


def load(source: str, name: str) -> types.ModuleType:
    """The module in ``source``, its jaxrunner imports (annotations) replaced by ``Any``."""
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses looks the module up
    exec(JAXRUNNER_IMPORT.sub(r"from typing import Any as \1", source), module.__dict__)
    return module


def samples(rng: np.random.Generator, t: int, b: int, rate: float, n: int) -> list[Any]:
    return [
        types.SimpleNamespace(
            terminated=rng.random((t, b)) < rate,
            truncated=np.zeros((t, b), np.bool_),
            valid=np.ones((t, b), np.bool_),
            reward=np.ones((t, b), np.float32),
            episode_id=np.zeros((t, b), np.int64),
            step=np.zeros((t, b), np.int64),
        )
        for _ in range(n)
    ]


def numbering(module: types.ModuleType, data: list[Any], t: int, b: int) -> list[np.ndarray]:
    """Every sample's episode ids and steps, and the returns and lengths of the episodes
    that ended (integer rewards: both versions' sums are exact)."""
    book, out = module.EpisodeBook(b), []
    for buf in data:
        counts = book.close(buf, t)
        out += [buf.episode_id.copy(), buf.step.copy(), counts.returns, counts.lengths]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--shapes", nargs="+", default=["4x8", "16x8", "64x8", "4x64", "64x64"])
    parser.add_argument("--end-rate", type=float, default=0.05)
    parser.add_argument("--samples", type=int, default=50, help="samples closed per round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    base_source = subprocess.run(
        ["git", "show", f"{args.base}:{MODULE}"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    versions = {
        "base": load(base_source, "episode_ids_base"),
        "new": load((REPO / MODULE).read_text(), "episode_ids_new"),
    }
    rng = np.random.default_rng(0)
    rows = []
    for shape in args.shapes:
        t, b = (int(x) for x in shape.split("x"))
        data = samples(rng, t, b, args.end_rate, args.samples)
        us: dict[str, list[float]] = {name: [] for name in versions}
        for _ in range(args.rounds):
            for name, module in versions.items():
                book = module.EpisodeBook(b)
                start = time.perf_counter()
                for buf in data:
                    book.close(buf, t)
                us[name].append(1e6 * (time.perf_counter() - start) / len(data))
        base, new = (statistics.median(us[name]) for name in ("base", "new"))
        numbered = [numbering(module, data, t, b) for module in versions.values()]
        rows.append(
            {
                "rollout_length": t,
                "num_envs": b,
                "base_us_per_sample_median": base,
                "new_us_per_sample_median": new,
                "speedup_median": base / new,
                "same_numbering": all(np.array_equal(x, y) for x, y in zip(*numbered, strict=True)),
                "us_per_sample": us,
            }
        )
        same = "same numbering" if rows[-1]["same_numbering"] else "NUMBERING DIFFERS"
        print(f"T={t:3d} x {b:3d} envs: base {base:6.1f} us a sample, new {new:6.1f}; {same}")
    report = {
        "benchmark": "episode_book",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "base": args.base,
        "machine": machine_info(),
        "results": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

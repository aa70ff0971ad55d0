"""Measure the course's budgets: each solution notebook's wall time and its kernel's peak memory.

``python -m attn_course bench-course`` runs every solution notebook in a fresh kernel (the way a
learner's first "Run All" does) and prints one row per notebook against the budgets (docs/maintainers.md, "Budgets"):
at most 30 s and 1 GB on a 2-core CPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import nbformat

from .cli import positive
from .runner import execute

TIME_BUDGET_S = 30.0
MEMORY_BUDGET_BYTES = 10**9  # 1 GB, as the budget says (1 GiB would allow 7 % more)


def measure(paths: list[Path], *, repeats: int = 1, out=sys.stdout) -> list[dict]:
    """Run each notebook ``repeats`` times; report its slowest run and largest peak RSS."""
    results = []
    print(
        f"# {platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()} · "
        f"budgets: {TIME_BUDGET_S:.0f} s, {MEMORY_BUDGET_BYTES / 1e9:.0f} GB",
        file=out,
    )
    print(f"{'notebook':<32} {'seconds':>8} {'peak MiB':>8}  verdict", file=out)
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        runs = []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory(prefix="attn-bench-") as tmp:
                runs.append(execute(nb, cwd=Path(tmp), measure_memory=True, allow_errors=False))
        seconds = max(r.seconds for r in runs)
        peaks = [r.peak_rss_bytes for r in runs if r.peak_rss_bytes is not None]
        peak = max(peaks) if peaks else None
        problem = next((r.problem for r in runs if r.problem), None)
        over = []
        if seconds > TIME_BUDGET_S:
            over.append("over time")
        if peak is not None and peak > MEMORY_BUDGET_BYTES:
            over.append("over memory")
        verdict = f"FAILED: {problem}" if problem else (", ".join(over) if over else "ok")
        peak_mb = f"{peak / 2**20:8.0f}" if peak is not None else f"{'n/a':>8}"
        print(f"{path.name:<32} {seconds:8.1f} {peak_mb}  {verdict}", file=out)
        results.append({"notebook": path.name, "seconds": round(seconds, 2),
                        "peak_rss_mb": None if peak is None else round(peak / 2**20, 1), "verdict": verdict})
    total = sum(r["seconds"] for r in results)
    print(f"{'all notebooks':<32} {total:8.1f}", file=out)
    return results


def main(paths: list[str], *, repeats: int, json_path: str | None, out=sys.stdout) -> int:
    notebooks = []
    for p in map(Path, paths or ["solutions"]):
        notebooks.extend(sorted(p.glob("*.ipynb")) if p.is_dir() else [p])
    if not notebooks:
        print("No notebooks to measure.", file=out)
        return 2
    results = measure(notebooks, repeats=repeats, out=out)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {json_path}", file=out)
    return 0 if all(r["verdict"] == "ok" for r in results) else 1


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", help="notebooks or folders (default: solutions/)")
    parser.add_argument("--repeats", type=positive(int), default=1, help="runs per notebook; the worst is reported")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")


def run(args: argparse.Namespace) -> int:
    return main(args.paths, repeats=args.repeats, json_path=args.json)

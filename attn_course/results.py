"""Recorded GPU results, shown in notebooks 09 (forward) and 10 (forward + backward).

``scripts/gpu_finale.py`` writes each GPU's results to ``docs/results/<gpu-name>/``:
``attention-bench.json`` (the benchmark's rows and its stamp: GPU model, driver, CUDA, torch and
Triton versions, dtypes, shapes) and ``triton-tests.json`` (the Triton kernels' tests run natively).
:func:`show` prints, for every recorded GPU, the stamp, the Triton tests' verdicts, the results table
and the time-vs-n figure; when nothing is recorded it says so plainly, and how to record one.
:func:`summary` is the same text without figures. The folder is passed in by the notebook
(``Path("..") / "docs" / "results"`` from ``solutions/`` or ``notebooks/``): this module never works
out repository paths itself.

A recording whose stamp has a ``"fixture"`` entry is test data, not a measurement: it is labelled
as such wherever it is shown (the tests' fixture lives in ``tests/fixtures/``, never in ``docs/``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from . import benchmark, datasheet, timing

__all__ = ["Recorded", "load", "summary", "standing", "show", "NONE_RECORDED"]

NONE_RECORDED = ("No GPU results are recorded yet: nothing in {root} was measured on a GPU.\n"
                 "With a CUDA GPU, run `python scripts/gpu_finale.py` (docs/gpu-results.md) and re-run this cell.")


@dataclass
class Recorded:
    """One GPU's recorded results: its folder, the benchmark's ``stamp`` and ``rows``, and the Triton
    tests' summary (None when that file is absent)."""

    folder: Path
    stamp: dict[str, Any]
    rows: list[dict[str, Any]]
    triton_tests: dict[str, Any] | None

    @property
    def fixture(self) -> str | None:
        """Why this is test data and not a measurement (None for a real recording)."""
        return self.stamp.get("fixture")


def load(root: str | Path) -> list[Recorded]:
    """Every recording under ``root`` (``<root>/*/attention-bench.json``), sorted by folder name;
    unreadable files are left out."""
    found = []
    for path, data in benchmark.load_recorded(root):
        tests = None
        tests_path = path.parent / "triton-tests.json"
        if tests_path.exists():
            try:
                tests = json.loads(tests_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                tests = None
        found.append(Recorded(path.parent, data.get("stamp", {}), data["results"], tests))
    return found


def _stamp_lines(rec: Recorded) -> list[str]:
    s = rec.stamp
    lines = [f"{rec.folder.name}: {timing.describe_stamp(s)}"]
    if rec.fixture:
        lines[0] = f"[FIXTURE, not a measurement: {rec.fixture}] " + lines[0]
    versions = [f"{key} {s[key]}" for key in ("driver", "cuda", "cudnn") if s.get(key)]
    if versions:
        lines.append("  " + " · ".join(versions))
    shapes = s.get("shapes") or {}
    if isinstance(shapes.get("pieces"), dict):  # merged from several runs of `bench`: each run's sizes
        for piece, o in shapes["pieces"].items():
            lines.append(f"  {piece}: " + ("not run" if not o else
                         f"n = {', '.join(map(str, o['ns']))}; d_k = {', '.join(map(str, o['head_dims']))}; "
                         f"B·n = {o['tokens']} tokens, A·d_k = {o['hidden']}; {', '.join(o['dtypes'])}; "
                         f"{', '.join(o['modes'])}"))
    elif shapes:
        lines.append("  shapes: " + ", ".join(f"{k} = {v}" for k, v in shapes.items()))
    if s.get("peak_source"):
        lines.append(f"  peaks: {s['peak_source']}")
    gpu = datasheet.lookup(str(s.get("device", "")))
    if gpu:
        lines.append(f"  datasheet: {gpu.model}, {gpu.tflops.get('float16')} TFLOP/s float16, "
                     f"{gpu.bandwidth} TB/s ({gpu.source})")
    if rec.triton_tests:
        t = rec.triton_tests
        lines.append(f"  Triton kernels' tests, run natively: {t.get('passed', 0)} passed, {t.get('failed', 0)} failed, "
                     f"{t.get('skipped', 0)} skipped ({', '.join(t.get('dtypes', [])) or 'dtypes not recorded'})")
    return lines


def _selected(rec: Recorded, mode: str, min_n: int) -> list[dict[str, Any]]:
    rows = [r for r in rec.rows if r.get("mode") == mode and r.get("n", 0) >= min_n]
    return sorted(rows, key=lambda r: (r["dtype"], r["head_dim"], r["causal"], r["n"], r["impl"]))


def summary(root: str | Path, *, mode: str = "fwd", min_n: int = 0) -> str:
    """The text :func:`show` prints: per recorded GPU its stamp and the table of ``mode`` ("fwd" or
    "fwd+bwd") rows with n ≥ ``min_n``; or the plain statement that none is recorded."""
    recorded = load(root)
    if not recorded:
        return NONE_RECORDED.format(root=Path(root).as_posix())
    parts = []
    for rec in recorded:
        lines = _stamp_lines(rec)
        rows = _selected(rec, mode, min_n)
        lines.append(benchmark.results_table(rows) if rows else f"  (no {mode} rows with n ≥ {min_n} recorded)")
        lines += standing(rec, mode=mode, min_n=min_n)
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def standing(rec: Recorded, *, mode: str = "fwd", min_n: int = 0) -> list[str]:
    """Where the course's Triton kernel stands: at each recorded point with n ≥ ``min_n``, its TFLOP/s and its
    share of the fastest PyTorch backend (``sdpa-*``) on the same inputs; then, from ``triton-tuning.json``
    when recorded, the same share for the kernel's own tiles and for the best other tiles it tried."""
    rows = [r for r in _selected(rec, mode, min_n) if r.get("status") == "ok" and r.get("tflops")]
    lines = []
    for r in (r for r in rows if r["impl"] == "triton"):
        rivals = [o for o in rows if o["impl"].startswith("sdpa-") and all(
            o[key] == r[key] for key in ("dtype", "n", "head_dim", "causal", "batch", "heads"))]
        if rivals:
            best = max(rivals, key=lambda o: o["tflops"])
            kind = "causal" if r["causal"] else "non-causal"
            lines.append(f"  triton at n = {r['n']}, d_k = {r['head_dim']}, {kind}, B×A = {r['batch'] * r['heads']}: "
                         f"{r['tflops']:.0f} TFLOP/s, {r['tflops'] / best['tflops']:.0%} of {best['impl']} "
                         f"({best['tflops']:.0f})")
    if lines:
        lines.insert(0, f"The course's Triton kernel against the fastest fused backend ({mode}, n ≥ {min_n}):")
    path = rec.folder / "triton-tuning.json"
    part = "forward" if mode == "fwd" else "backward"
    try:
        tuning = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
    except (OSError, ValueError):
        tuning = None
    if tuning and tuning.get("rows"):
        lines.append(f"Other tiles for the {part} kernel{'s' if part == 'backward' else ''} (triton-tuning.json: "
                     f"{tuning.get('dtype')}, {tuning.get('timing')}; {part} TFLOP/s as a share of the fastest "
                     f"backend's {part}; every configuration first checked against float64):")
        for row in tuning["rows"]:
            timed = [e for e in row.get(part, []) if "share_of_best_backend" in e]
            if not timed:
                continue
            own, best = timed[0], max(timed, key=lambda e: e["share_of_best_backend"])
            kind = "causal" if row["causal"] else "non-causal"
            lines.append(f"  n = {row['n']}, d_k = {row['d_head']}, {kind}: own tiles "
                         f"{own['share_of_best_backend']:.0%}, best tried {best['share_of_best_backend']:.0%} "
                         f"({_config_text(best['config'])})")
    return lines


def _config_text(config: Any) -> str:
    if not isinstance(config, dict):
        return str(config)
    if "blocks" in config:
        blocks = "; ".join(f"{k} {tuple(v)}" for k, v in config["blocks"].items())
        return f"{blocks}; {config['num_warps']} warps, {config['num_stages']} stages"
    return (f"BLOCK_M {config['BLOCK_M']}, BLOCK_N {config['BLOCK_N']}, {config['num_warps']} warps, "
            f"{config['num_stages']} stages")


def show(root: str | Path, *, mode: str = "fwd", min_n: int = 0) -> list[plt.Figure]:
    """Print :func:`summary` and draw each recorded GPU's time-vs-n figure for ``mode`` (one per dtype
    recorded). Returns the figures (empty when nothing is recorded)."""
    print(summary(root, mode=mode, min_n=min_n))
    figures = []
    for rec in load(root):
        for dtype in dict.fromkeys(r["dtype"] for r in rec.rows):
            fig = benchmark.plot_results(rec.rows, rec.stamp, dtype=dtype, mode=mode)
            if fig is not None:
                if rec.fixture:
                    fig.text(0.5, 0.5, "FIXTURE: not a measurement", ha="center", va="center", alpha=0.25,
                             fontsize=28, rotation=20, transform=fig.transFigure)
                figures.append(fig)
    if figures:
        plt.show()
    return figures

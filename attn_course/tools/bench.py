"""``python -m attn_course bench``: the attention benchmark of notebook 09 on this machine's best device.

Arguments become :class:`attn_course.benchmark.BenchOptions` (defaults from ``BenchOptions.preset``:
the FlashAttention papers' sizes on a CUDA GPU, a smaller float32 sweep on the CPU), the sweep runs
(:func:`attn_course.benchmark.run_sweep`: every implementation checked against float64 before it is
timed), and the results are printed and written to ``--out`` (default ``bench-results/`` in the
current folder) as ``attention-bench.csv``, ``attention-bench.json`` (rows + stamp: device, versions,
shapes, how everything was counted) and one ``attention-bench-<dtype>-<mode>.png`` per dtype and
mode. Record a GPU's results for the course with ``--out docs/results/<gpu-name>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from .. import benchmark, timing
from .cli import positive
from .tables import write_csv, write_json

__all__ = ["configure", "options_from_args", "run", "main"]

PROG = "python -m attn_course bench"
DESCRIPTION = ("Time naive, tiled, SDPA (each backend), torch.compile and Triton attention on this machine's "
               "best device; check each against float64 first; write CSV, JSON and plots.")
QUICK = "under a minute on a 2-core CPU, even a busy one"  # measured: 30 s
# measured on a 2-core CPU, one torch thread: 363 s at load 1, 380 s with another busy process beside it
CPU_DEFAULT = "about 6-7 minutes on a 2-core CPU, on one torch thread, longer when other work shares the machine"
EPILOG = (f"Examples: `python -m attn_course bench --quick` ({QUICK}); `python -m attn_course bench` on a CPU "
          f"({CPU_DEFAULT}); on a GPU, record results for the course "
          "with `python scripts/gpu_finale.py` (docs/gpu-results.md), which writes docs/results/<gpu-name>/.")


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The bench command's arguments, on the course CLI's sub-parser (or a parser of its own)."""
    p.epilog = p.epilog or EPILOG
    p.add_argument("--device", default="auto", help="auto (CUDA if present, else CPU), cpu, cuda or cuda:N")
    p.add_argument("--quick", action="store_true",
                   help=f"a small sweep to see that everything works ({QUICK}): 3 lengths, d_k = 64, forward only, "
                        "no torch.compile")
    p.add_argument("--n", type=int, nargs="+", metavar="N",
                   help="sequence lengths (default: 512…16384 on a GPU, 256…2048 on the CPU)")
    p.add_argument("--head-dims", type=int, nargs="+", metavar="D", help="head dims d_k (default: 64 128)")
    p.add_argument("--dtypes", nargs="+", choices=list(benchmark.DTYPES),
                   help="default: float16 bfloat16 on a GPU, float32 on the CPU")
    p.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    p.add_argument("--modes", nargs="+", choices=list(benchmark.MODES),
                   help="default: fwd fwd+bwd (fwd with --quick)")
    p.add_argument("--impls", nargs="+", choices=list(benchmark.IMPLEMENTATIONS), metavar="IMPL",
                   help=f"implementations, from: {' '.join(benchmark.IMPLEMENTATIONS)} "
                        "(default: all on a GPU; on the CPU all but compile, which compiles afresh at every "
                        "point and is opt-in there; --quick leaves out compile)")
    p.add_argument("--tokens", type=int, help="B·n held fixed (default: 16384 on a GPU, 2048 on the CPU)")
    p.add_argument("--hidden", type=int, help="A·d_k held fixed (default: 2048 on a GPU, 256 on the CPU)")
    p.add_argument("--tiled-block", type=int, help="block size of the course's tiled loop (default: 1024 GPU, 256 CPU)")
    p.add_argument("--min-run-time", type=positive(float),
                   help="seconds of timed runs at least, per measurement (default 0.2 on a GPU, 0.1 on the CPU, "
                        "0.05 with --quick)")
    p.add_argument("--max-run-time", type=positive(float),
                   help="seconds after which a measurement whose spread (IQR) is still over 10%% of its median stops "
                        "and is marked unstable (default: 1 on the CPU, 2 on a GPU; with --quick or --min-run-time: "
                        "10 × that, at least 1)")
    p.add_argument("--roofline-size", type=positive(int), default=2048,
                   help="CPU only: the size of the square matmul whose measured GFLOP/s is the roofline for %% of peak "
                        "(default 2048)")
    p.add_argument("--threads", type=positive(int),
                   help="CPU only: torch threads (default 1, whatever else the machine runs, so that two runs "
                        "rank the implementations alike)")
    p.add_argument("--max-memory", type=positive(float), metavar="GB",
                   help="CPU only: skip implementations holding an n × n matrix when predicted to need more "
                        "(default: half of the RAM)")
    p.add_argument("--out", default="bench-results",
                   help="folder for CSV/JSON/PNG, relative to the current folder (default: bench-results)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNGs")
    return p


def build_parser() -> argparse.ArgumentParser:
    return configure(argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG))


def _memory_total() -> float | None:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not POSIX (Windows)
        return None


def options_from_args(args: argparse.Namespace) -> benchmark.BenchOptions:
    """The command line's arguments over the device's preset. Raises ValueError on bad values."""
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    try:
        kind = torch.device(device).type
    except RuntimeError as exc:
        raise ValueError(f"--device {device!r}: {exc}") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but no CUDA GPU is available")
    preset = benchmark.BenchOptions.preset(device, quick=args.quick)
    max_memory = args.max_memory * 1e9 if args.max_memory else (
        None if kind == "cuda" else (_memory_total() or 8e9) / 2)
    changes = dict(ns=args.n, head_dims=args.head_dims, dtypes=args.dtypes, modes=args.modes, impls=args.impls,
                   tokens=args.tokens, hidden=args.hidden, tiled_block=args.tiled_block,
                   min_run_time=args.min_run_time, max_run_time=args.max_run_time, threads=args.threads,
                   roofline_size=args.roofline_size)
    values = {**vars(preset), **{k: v for k, v in changes.items() if v is not None}}
    if args.min_run_time is not None and args.max_run_time is None:
        values["max_run_time"] = None  # the limit follows --min-run-time (10 × it, at least 1 s)
    values.update(causal={"both": [False, True], "yes": [True], "no": [False]}[args.causal], max_memory=max_memory)
    return benchmark.BenchOptions(**values)


def write_results(results: list[benchmark.Result], info: dict, out: Path, *, plot: bool = True) -> list[Path]:
    """attention-bench.csv, attention-bench.json and (unless ``plot=False``) one PNG per dtype and mode."""
    rows = [vars(r) for r in results]
    paths = [write_csv(out / "attention-bench.csv", rows, benchmark.FIELDS),
             write_json(out / "attention-bench.json", {"stamp": info, "results": rows})]
    if plot:
        import matplotlib.pyplot as plt

        for dtype in dict.fromkeys(r.dtype for r in results):
            for mode in dict.fromkeys(r.mode for r in results):
                fig = benchmark.plot_results(results, info, dtype=dtype, mode=mode)
                if fig is None:
                    continue
                path = out / f"attention-bench-{dtype}-{mode}.png"
                fig.savefig(path)
                plt.close(fig)
                paths.append(path)
    return paths


def run(args: argparse.Namespace) -> int:
    """Run the sweep the parsed ``args`` ask for; 0 when every measured implementation was right, 1
    when one was WRONG, 2 on bad arguments."""
    try:
        options = options_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    left_out = {name: why for name, why in benchmark.CPU_OPT_IN.items()
                if args.impls is None and not args.quick and torch.device(options.device).type == "cpu"}
    for name, why in left_out.items():
        print(f"not measured: {name}: {why}")
    started = time.perf_counter()
    results, info = benchmark.run_sweep(options, progress=not args.no_progress)
    info["not_measured"].update(left_out)
    print(f"# {info['device']} · torch {torch.__version__}"  # the device as measured (threads included)
          + (f" · triton {timing.triton_version()}" if timing.triton_version() else " · no triton"))
    info["wall_s"] = round(time.perf_counter() - started, 1)
    print(benchmark.results_table(results))
    unstable = sum(1 for r in results if r.stable is False)
    print(f"ms: median; IQR: the middle half of the timed runs as a % of the median (! = still over "
          f"{timing.STABLE_IQR:.0%} when the time limit came: {unstable} such rows); rank =k: tied, the spreads overlap")
    paths = write_results(results, info, Path(args.out), plot=not args.no_plot)
    print(f"peaks: {info['peak_source']}")
    print("wrote " + ", ".join(str(p) for p in paths) + f" in {info['wall_s']} s")
    return 1 if any(r.status == "WRONG" for r in results) else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m attn_course bench`` without the course CLI around it."""
    return run(build_parser().parse_args(argv))

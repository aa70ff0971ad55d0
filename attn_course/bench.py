"""``python -m attn_course bench``: time attention implementations on this machine's best device.

Sweeps the sequence length N with the number of tokens B·N and the model width H·D held fixed (the
FlashAttention papers' setup), for head dims 64 and 128, causal and not, forward and forward +
backward, in float16/bfloat16 on a CUDA GPU (float32 on the CPU). Implementations:

* ``naive`` — :func:`attn_course.fast.naive_attention` (the full score matrix);
* ``tiled`` — the course's tiled loop, :func:`attn_course.fast.tiled_attention` (forward only);
* ``sdpa-math``, ``sdpa-flash``, ``sdpa-efficient``, ``sdpa-cudnn`` — ``F.scaled_dot_product_attention``
  pinned to one backend with ``torch.nn.attention.sdpa_kernel`` (those this device has);
* ``compile`` — ``torch.compile(naive_attention)``; its compile time is reported separately;
* ``triton`` — the course's Triton kernel (forward only; CUDA with Triton installed).

Before timing anything, each implementation's output is compared with a float64 reference (batch 0,
the first two heads); a wrong one is reported as WRONG and not timed. Out-of-memory is a result
("OOM at N=…"), not a crash. Times are medians after warm-up (CUDA: ``triton.testing.do_bench`` or
CUDA events; CPU: ``torch.utils.benchmark``). FLOPs follow the papers: 4·B·H·N²·D forward (half when
causal), 3.5× that for forward + backward. Results go to CSV, JSON (with a stamp: device, dtype,
shapes, versions) and a PNG plot under ``--out`` (default ``bench-results/``, git-ignored); record a
GPU's results for the course with ``--out docs/results/<gpu-name>``.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from . import fast, timing

PROG = "python -m attn_course bench"

# Dense (no sparsity) float16/bfloat16 tensor-core peaks from the vendors' datasheets, in TFLOP/s,
# at boost clock. Real sustained clocks are lower, so no kernel reaches 100 %. First match wins.
PEAK_TFLOPS: list[tuple[str, str, dict[str, float]]] = [
    (r"H100.*PCIe", "NVIDIA H100 PCIe", {"float16": 756.0, "bfloat16": 756.0}),
    (r"H100.*NVL", "NVIDIA H100 NVL", {"float16": 835.0, "bfloat16": 835.0}),
    (r"H100", "NVIDIA H100 SXM5", {"float16": 989.4, "bfloat16": 989.4}),
    (r"H200.*NVL", "NVIDIA H200 NVL", {"float16": 835.0, "bfloat16": 835.0}),
    (r"H200", "NVIDIA H200 SXM", {"float16": 989.4, "bfloat16": 989.4}),
    (r"A100", "NVIDIA A100", {"float16": 312.0, "bfloat16": 312.0}),
    (r"L40S", "NVIDIA L40S", {"float16": 362.0, "bfloat16": 362.0}),
    (r"\bL4\b", "NVIDIA L4", {"float16": 121.0, "bfloat16": 121.0}),
    (r"\bA10\b", "NVIDIA A10", {"float16": 125.0, "bfloat16": 125.0}),
    (r"\bT4\b", "NVIDIA T4", {"float16": 65.0}),
    (r"V100", "NVIDIA V100 SXM2", {"float16": 125.0}),
]
PEAK_SOURCE = "vendor datasheet, dense (no sparsity) tensor-core peak at boost clock"

TOLERANCE = {torch.float32: 2e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float64: 1e-9}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
SDPA_BACKENDS = {"sdpa-math": "MATH", "sdpa-flash": "FLASH_ATTENTION",
                 "sdpa-efficient": "EFFICIENT_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION"}
ALL_IMPLS = ["naive", "tiled", *SDPA_BACKENDS, "compile", "triton"]


def device_peak_tflops(name: str, dtype: torch.dtype) -> tuple[float | None, str | None]:
    """The datasheet dense peak for this GPU model and dtype, and which entry matched (or None)."""
    key = str(dtype).replace("torch.", "")
    for pattern, label, peaks in PEAK_TFLOPS:
        if re.search(pattern, name):
            return peaks.get(key), label
    return None, None


# ----------------------------------------------------------------------------- implementations


@dataclass
class Impl:
    """One attention implementation: ``run(q, k, v, causal)`` → output (..., N, D)."""

    name: str
    run: Callable[..., torch.Tensor]
    backward: bool = True
    note: str = ""


def _sdpa(backend_name: str) -> Callable[..., torch.Tensor]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def _sdpa_works(backend_name: str, device: torch.device, dtype: torch.dtype) -> bool:
    try:
        from torch.nn.attention import SDPBackend  # noqa: F401
    except ImportError:
        return False
    q = torch.randn(1, 1, 32, 64, device=device, dtype=dtype)
    try:
        _sdpa(backend_name)(q, q, q, False)
        return True
    except (RuntimeError, AttributeError):
        return False


def implementations(device: torch.device, dtype: torch.dtype, wanted: list[str], *,
                    tiled_block: int) -> tuple[list[Impl], dict[str, str]]:
    """The implementations in ``wanted`` that can run here, and why each other one cannot."""
    found: list[Impl] = []
    missing: dict[str, str] = {}
    for name in wanted:
        if name == "naive":
            found.append(Impl("naive", lambda q, k, v, causal: fast.naive_attention(q, k, v, causal=causal)))
        elif name == "tiled":
            def tiled(q, k, v, causal, _b=tiled_block):
                fn = fast.causal_tiled_attention if causal else fast.tiled_attention
                return fn(q, k, v, _b)
            found.append(Impl("tiled", tiled, backward=False, note=f"block {tiled_block}"))
        elif name in SDPA_BACKENDS:
            if _sdpa_works(SDPA_BACKENDS[name], device, dtype):
                found.append(Impl(name, _sdpa(SDPA_BACKENDS[name])))
            else:
                missing[name] = f"backend {SDPA_BACKENDS[name]} has no kernel for {device.type}/{str(dtype)[6:]}"
        elif name == "compile":
            found.append(Impl("compile", _Compiled(), note="torch.compile(naive_attention)"))
        elif name == "triton":
            from . import triton_attention

            reason = triton_attention.unavailable_reason(device) if device.type == "cuda" else \
                "the Triton kernel runs on CUDA GPUs (the CPU interpreter is for tests only)"
            if reason:
                missing[name] = reason
            else:
                found.append(Impl("triton", lambda q, k, v, causal: triton_attention.attention(q, k, v, causal=causal),
                                  backward=False, note="forward only"))
        else:
            missing[name] = "unknown implementation"
    return found, missing


class _Compiled:
    """torch.compile of the naive attention, recompiled (and timed) once per configuration."""

    def __init__(self) -> None:
        self.fn: Callable[..., torch.Tensor] | None = None

    def reset(self) -> None:
        import torch._dynamo

        torch._dynamo.reset()  # forget earlier shapes: no recompile limit, an honest compile time
        self.fn = torch.compile(fast.naive_attention, dynamic=False)

    def __call__(self, q, k, v, causal):
        if self.fn is None:
            self.reset()
        return self.fn(q, k, v, causal=causal)


# ----------------------------------------------------------------------------- one measurement


@dataclass
class Config:
    n: int
    head_dim: int
    batch: int
    heads: int
    dtype: str
    causal: bool
    mode: str  # "fwd" or "fwd+bwd"


@dataclass
class Result:
    impl: str
    device: str
    dtype: str
    batch: int
    heads: int
    n: int
    head_dim: int
    causal: bool
    mode: str
    status: str  # ok, WRONG, OOM, unsupported, skipped, error
    ms: float | None = None
    tflops: float | None = None
    pct_of_peak: float | None = None
    peak_memory_bytes: int | None = None
    compile_s: float | None = None
    max_abs_error: float | None = None
    note: str = ""


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, getattr(torch, "OutOfMemoryError", ())) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        "out of memory" in text or "can't allocate memory" in text or isinstance(exc, MemoryError))


def reference_output(q, k, v, causal: bool) -> torch.Tensor:
    """float64 output for batch 0, heads 0–1, computed tile by tile (little memory even for long N)."""
    q0, k0, v0 = (t[0, :2].detach().double() for t in (q, k, v))
    block = min(q.shape[-2], 1024)
    return (fast.causal_tiled_attention if causal else fast.tiled_attention)(q0, k0, v0, block)


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(impl: Impl, cfg: Config, device: torch.device, *, reference: torch.Tensor | None,
            inputs: tuple[torch.Tensor, ...], peak: float | None, min_run_time: float,
            memory_limit: float | None, warmup: int = 2) -> Result:
    """Check one implementation on one configuration, then time it and measure its peak memory."""
    dtype = DTYPES[cfg.dtype]
    res = Result(impl.name, device.type, cfg.dtype, cfg.batch, cfg.heads, cfg.n, cfg.head_dim, cfg.causal,
                 cfg.mode, "ok", note=impl.note)
    if cfg.mode == "fwd+bwd" and not impl.backward:
        res.status, res.note = "unsupported", "forward only"
        return res
    materialises = impl.name in ("naive", "compile", "sdpa-math")
    if device.type == "cpu" and memory_limit and materialises:
        # Linux may grant a huge allocation and then kill the process: refuse before trying.
        need = 3 * fast.score_bytes(cfg.batch, cfg.heads, cfg.n, dtype) * (2 if cfg.mode == "fwd+bwd" else 1)
        if need > memory_limit:
            res.status = "skipped"
            res.note = f"would need about {timing.format_bytes(need)} > --max-memory {timing.format_bytes(memory_limit)}"
            return res
    q, k, v = inputs
    try:
        if cfg.mode == "fwd":
            def step():
                return impl.run(q, k, v, cfg.causal)

            def first():
                return impl.run(q, k, v, cfg.causal)
        else:
            qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
            grad = torch.randn_like(q)

            def step():
                o = impl.run(qg, kg, vg, cfg.causal)
                return torch.autograd.grad(o, (qg, kg, vg), grad)

            def first():  # the output to check, after one backward (torch.compile compiles both here)
                o = impl.run(qg, kg, vg, cfg.causal)
                torch.autograd.grad(o, (qg, kg, vg), grad)
                return o.detach()
        if isinstance(impl.run, _Compiled):
            impl.run.reset()
        start = time.perf_counter()
        out = first()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if isinstance(impl.run, _Compiled):
            res.compile_s = time.perf_counter() - start  # compiling + one run
        if reference is not None:
            got = out[0, :2].double()
            err = (got - reference).abs()
            res.max_abs_error = float(err.max())
            tol = TOLERANCE[dtype]
            if not bool((err <= tol + tol * reference.abs()).all()) or not torch.isfinite(got).all():
                res.status = "WRONG"
                res.note = f"max |error| {res.max_abs_error:.3g} vs float64 > tolerance {tol:g}: not timed"
                return res
        del out
        res.ms = timing.time_ms(step, device=device, warmup=warmup, min_run_time=min_run_time)
        flops = fast.attention_flops(cfg.batch, cfg.heads, cfg.n, cfg.head_dim, causal=cfg.causal,
                                     backward=cfg.mode == "fwd+bwd")
        res.tflops = flops / (res.ms * 1e-3) / 1e12
        if peak:
            res.pct_of_peak = 100.0 * res.tflops / peak
        res.peak_memory_bytes = timing.peak_memory_bytes(step, device=device)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row, never a crash
        if _is_oom(exc):
            res.status, res.note = "OOM", f"OOM at N={cfg.n}"
        elif "No available kernel" in str(exc) or "No viable backend" in str(exc):
            res.status, res.note = "unsupported", "no kernel for this configuration"
        else:
            res.status, res.note = "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        res.ms = res.tflops = res.pct_of_peak = None
    finally:
        _free(device)
    return res


# ----------------------------------------------------------------------------- the sweep


@dataclass
class Settings:
    device: str
    ns: list[int]
    head_dims: list[int]
    dtypes: list[str]
    causal: list[bool]
    modes: list[str]
    impls: list[str]
    tokens: int
    hidden: int
    tiled_block: int
    min_run_time: float
    max_memory: float | None
    out: str
    warmup: int = 2
    extra: dict[str, Any] = field(default_factory=dict)


def configs(s: Settings) -> list[Config]:
    """Every (N, D, dtype, causal, mode) point, with B = tokens // N and H = hidden // D."""
    out = []
    for dtype in s.dtypes:
        for d in s.head_dims:
            for causal in s.causal:
                for mode in s.modes:
                    for n in s.ns:
                        out.append(Config(n, d, max(1, s.tokens // n), max(1, s.hidden // d), dtype, causal, mode))
    return out


def run_sweep(s: Settings, *, progress: bool = True, log: Callable[[str], None] = print) -> tuple[list[Result], dict]:
    """Measure every implementation on every configuration; returns the rows and the run's stamp."""
    from tqdm.auto import tqdm

    device = torch.device(s.device)
    points = configs(s)
    impls_by_dtype = {}
    missing_all: dict[str, str] = {}
    for dt in s.dtypes:
        found, missing = implementations(device, DTYPES[dt], s.impls, tiled_block=s.tiled_block)
        impls_by_dtype[dt] = found
        missing_all.update({f"{k} ({dt})": v for k, v in missing.items()})
    for name, why in missing_all.items():
        log(f"not measured: {name}: {why}")
    results: list[Result] = []
    oom_at: dict[tuple, int] = {}
    total = sum(len(impls_by_dtype[c.dtype]) for c in points)
    bar = tqdm(total=total, desc="bench", unit="run", disable=not progress, file=sys.stderr)
    gen = torch.Generator(device="cpu").manual_seed(0)
    for cfg in points:
        dtype = DTYPES[cfg.dtype]
        shape = (cfg.batch, cfg.heads, cfg.n, cfg.head_dim)
        try:
            inputs = tuple(torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for _ in range(3))
            reference = reference_output(*inputs, cfg.causal)
        except Exception as exc:  # noqa: BLE001
            if not _is_oom(exc):
                raise
            for impl in impls_by_dtype[cfg.dtype]:
                results.append(Result(impl.name, device.type, cfg.dtype, cfg.batch, cfg.heads, cfg.n, cfg.head_dim,
                                      cfg.causal, cfg.mode, "OOM", note=f"OOM at N={cfg.n} (inputs)"))
                bar.update(1)
            _free(device)
            continue
        peak, _ = device_peak_tflops(timing.device_name(device), dtype) if device.type == "cuda" else (None, None)
        for impl in impls_by_dtype[cfg.dtype]:
            key = (impl.name, cfg.head_dim, cfg.dtype, cfg.causal, cfg.mode)
            bar.set_postfix_str(f"{impl.name} N={cfg.n} D={cfg.head_dim} {cfg.dtype} "
                                f"{'causal' if cfg.causal else 'full'} {cfg.mode}")
            if key in oom_at and cfg.n > oom_at[key]:
                res = Result(impl.name, device.type, cfg.dtype, cfg.batch, cfg.heads, cfg.n, cfg.head_dim,
                             cfg.causal, cfg.mode, "skipped", note=f"already OOM at N={oom_at[key]}")
            else:
                res = measure(impl, cfg, device, reference=reference, inputs=inputs, peak=peak,
                              min_run_time=s.min_run_time, memory_limit=s.max_memory, warmup=s.warmup)
                if res.status == "OOM":
                    oom_at[key] = cfg.n
                    bar.write(f"{impl.name}: OOM at N={cfg.n} (D={cfg.head_dim}, {cfg.dtype}, "
                              f"{'causal' if cfg.causal else 'non-causal'}, {cfg.mode})")
                elif res.status == "WRONG":
                    bar.write(f"{impl.name}: WRONG at N={cfg.n}: {res.note}")
            results.append(res)
            bar.update(1)
        del inputs, reference
        _free(device)
    bar.close()
    first_dtype = DTYPES[s.dtypes[0]]
    info = timing.stamp(device, None, {"tokens (B·N)": s.tokens, "hidden (H·D)": s.hidden,
                                       "N": s.ns, "head_dims": s.head_dims, "dtypes": s.dtypes})
    peak, label = device_peak_tflops(info["device"], first_dtype) if device.type == "cuda" else (None, None)
    info["peak_tflops"] = {dt: device_peak_tflops(info["device"], DTYPES[dt])[0] for dt in s.dtypes} \
        if device.type == "cuda" else None
    info["peak_source"] = f"{PEAK_SOURCE} ({label})" if label else "no known peak for this device"
    info["not_measured"] = missing_all
    info["flops"] = "4·B·H·N²·D forward, half when causal; forward+backward = 3.5 × forward"
    info["correctness"] = "each output compared with float64 on batch 0, heads 0-1 before timing"
    info["memory"] = ("torch.cuda.max_memory_allocated above the memory allocated before the call"
                      if device.type == "cuda" else
                      "peak of PyTorch CPU allocations recorded by torch.profiler (profile_memory=True)")
    return results, info


# ----------------------------------------------------------------------------- output


def write_results(results: list[Result], info: dict, out: Path, *, plot: bool = True) -> list[Path]:
    """attention-bench.csv, .json and (unless ``plot=False``) .png in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [asdict(r) for r in results]
    paths = [out / "attention-bench.csv", out / "attention-bench.json"]
    with paths[0].open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else list(Result.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(rows)
    paths[1].write_text(json.dumps({"stamp": info, "results": rows}, indent=1) + "\n", encoding="utf-8")
    png = plot_results(rows, info, out / "attention-bench.png") if plot else None
    if png:
        paths.append(png)
    return paths


def plot_results(rows: list[dict], info: dict, path: Path | None = None, *, dtype: str | None = None,
                 mode: str = "fwd"):
    """TFLOP/s (top) and peak memory (bottom) vs N, one column per (head dim, causal). Returns the
    saved path, or the figure when ``path`` is None."""
    ok = [r for r in rows if r["status"] == "ok" and r["mode"] == mode]
    dtype = dtype or (ok[0]["dtype"] if ok else None)
    ok = [r for r in ok if r["dtype"] == dtype]
    if not ok:
        return None
    panels = sorted({(r["head_dim"], r["causal"]) for r in ok})
    size = (4.6 * len(panels), 7.2)
    if path is None:
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=size)
    else:  # no pyplot: saving a file must not change the caller's matplotlib backend
        from matplotlib.figure import Figure

        fig = Figure(figsize=size)
    axes = fig.subplots(2, len(panels), squeeze=False)
    impls = list(dict.fromkeys(r["impl"] for r in ok))
    for col, (d, causal) in enumerate(panels):
        for impl in impls:
            pts = sorted((r["n"], r["tflops"], r["peak_memory_bytes"]) for r in ok
                         if r["impl"] == impl and r["head_dim"] == d and r["causal"] == causal)
            if not pts:
                continue
            ns = [p[0] for p in pts]
            axes[0][col].plot(ns, [p[1] for p in pts], marker="o", label=impl)
            mem = [(p[0], p[2] / 2**20) for p in pts if p[2] is not None]
            if mem:
                axes[1][col].plot(*zip(*mem), marker="o", label=impl)
        for row, ylabel in ((0, "TFLOP/s"), (1, "peak extra memory (MiB)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length N")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
        axes[1][col].set_yscale("log")
        axes[0][col].set_title(f"D={d}, {'causal' if causal else 'non-causal'}, {dtype}, {mode}")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{info.get('device', '?')} · torch {info.get('torch', '?')}"
                 + (f" · triton {info['triton']}" if info.get("triton") else ""), fontsize=10)
    fig.tight_layout()
    if path is None:
        return fig
    fig.savefig(path, dpi=110)
    return path


def format_table(results: list[Result] | list[dict]) -> str:
    """A plain-text table, one row per measurement."""
    rows = [asdict(r) if isinstance(r, Result) else r for r in results]
    head = f"{'impl':<15}{'dtype':<9}{'N':>6}{'D':>5}{'B×H':>7} {'causal':<7}{'mode':<8}{'ms':>9}{'TFLOP/s':>9}{'%peak':>7}{'peak mem':>11}{'compile s':>10}  status"
    lines = [head, "-" * len(head)]
    for r in rows:
        def num(x, f):
            width = int(f.split(".")[0])
            return f"{x:{f}}" if x is not None else f"{'—':>{width}}"
        lines.append(
            f"{r['impl']:<15}{r['dtype']:<9}{r['n']:>6}{r['head_dim']:>5}{r['batch'] * r['heads']:>7} "
            f"{'yes' if r['causal'] else 'no':<7}{r['mode']:<8}{num(r['ms'], '9.3f')}{num(r['tflops'], '9.4f')}"
            f"{num(r['pct_of_peak'], '7.1f')}{timing.format_bytes(r['peak_memory_bytes']) if r['peak_memory_bytes'] is not None else '—':>11}"
            f"{num(r['compile_s'], '10.1f')}  {r['status']}{(' (' + r['note'] + ')') if r['note'] and r['status'] != 'ok' else ''}"
        )
    return "\n".join(lines)


RESULTS_DIR = Path(__file__).resolve().parents[1] / "docs" / "results"


def load_recorded(root: Path | str = RESULTS_DIR) -> list[tuple[Path, dict]]:
    """Every recorded run under ``root`` (``*/attention-bench.json``), sorted by path."""
    found = []
    for path in sorted(Path(root).glob("*/attention-bench.json")):
        try:
            found.append((path, json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            continue
    return found


def describe_stamp(info: dict) -> str:
    """One line: device, torch/triton/CUDA versions, date."""
    parts = [str(info.get("device", "?")), f"torch {info.get('torch', '?')}"]
    if info.get("cuda"):
        parts.append(f"CUDA {info['cuda']}")
    parts.append(f"triton {info['triton']}" if info.get("triton") else "no triton")
    parts.append(f"Python {info.get('python', '?')}")
    if info.get("date"):
        parts.append(str(info["date"])[:10])
    return " · ".join(parts)


# ----------------------------------------------------------------------------- command line


def _memory_total() -> float | None:
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Time naive, tiled, SDPA (each backend), torch.compile and Triton attention on this "
                    "machine's best device; check each against float64 first; write CSV, JSON and a plot.",
        epilog="Examples: `python -m attn_course bench --quick` (under a minute on a CPU); on a GPU, "
               "record results for the course with `python -m attn_course bench --out docs/results/h100`.",
    )
    p.add_argument("--device", default="auto", help="auto (CUDA if present, else CPU), cpu, cuda or cuda:N")
    p.add_argument("--quick", action="store_true",
                   help="a small sweep (3 lengths, D=64, forward only, no torch.compile)")
    p.add_argument("--n", type=int, nargs="+", metavar="N", help="sequence lengths (default: 512…16384 on GPU, 256…4096 on CPU)")
    p.add_argument("--head-dims", type=int, nargs="+", metavar="D", help="head dims (default: 64 128)")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), help="default: float16 bfloat16 on GPU, float32 on CPU")
    p.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    p.add_argument("--modes", nargs="+", choices=["fwd", "fwd+bwd"], help="default: fwd fwd+bwd (fwd with --quick)")
    p.add_argument("--impls", nargs="+", choices=ALL_IMPLS, metavar="IMPL",
                   help=f"implementations, from: {' '.join(ALL_IMPLS)} (default: all; --quick leaves out compile)")
    p.add_argument("--tokens", type=int, help="B·N held fixed (default: 16384 on GPU, 4096 on CPU)")
    p.add_argument("--hidden", type=int, help="H·D held fixed (default: 2048 on GPU, 256 on CPU)")
    p.add_argument("--tiled-block", type=int, help="block size of the course's tiled loop (default: 1024 GPU, 256 CPU)")
    p.add_argument("--min-run-time", type=float, help="seconds of timed runs per measurement on CPU (default 0.2; 0.05 with --quick)")
    p.add_argument("--max-memory", type=float, metavar="GB",
                   help="CPU only: skip naive-style runs predicted to need more (default: half of RAM)")
    p.add_argument("--out", default="bench-results", help="folder for CSV/JSON/PNG (default: bench-results/)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    return p


def settings_from_args(a: argparse.Namespace) -> Settings:
    if a.device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        device = a.device
    gpu = torch.device(device).type == "cuda"
    if a.quick:
        ns, dims, modes = ([1024, 2048, 4096] if gpu else [256, 512, 1024]), [64], ["fwd"]
        impls = [i for i in ALL_IMPLS if i != "compile"]
        tokens, hidden = (8192, 1024) if gpu else (1024, 128)
        dtypes = ["float16"] if gpu else ["float32"]
        min_run = 0.05
    else:
        ns = [512, 1024, 2048, 4096, 8192, 16384] if gpu else [256, 512, 1024, 2048, 4096]
        dims, modes, impls = [64, 128], ["fwd", "fwd+bwd"], list(ALL_IMPLS)
        tokens, hidden = (16384, 2048) if gpu else (4096, 256)
        dtypes = ["float16", "bfloat16"] if gpu else ["float32"]
        min_run = 0.2
    mem = a.max_memory * 1e9 if a.max_memory else (None if gpu else (_memory_total() or 8e9) / 2)
    return Settings(
        device=device, ns=a.n or ns, head_dims=a.head_dims or dims, dtypes=a.dtypes or dtypes,
        causal={"both": [False, True], "yes": [True], "no": [False]}[a.causal], modes=a.modes or modes,
        impls=a.impls or impls, tokens=a.tokens or tokens, hidden=a.hidden or hidden,
        tiled_block=a.tiled_block or (1024 if gpu else 256), min_run_time=a.min_run_time or min_run,
        max_memory=mem, out=a.out,
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    if argv[:1] == ["--"]:  # `python -m attn_course bench -- --quick` passes the separator through
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    try:
        s = settings_from_args(args)
        torch.device(s.device)
        if torch.device(s.device).type == "cuda" and not torch.cuda.is_available():
            print("error: --device cuda asked for, but no CUDA GPU is available", file=sys.stderr)
            return 2
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    print(f"# {timing.device_name(s.device)} · torch {torch.__version__}"
          + (f" · triton {timing.triton_version()}" if timing.triton_version() else " · no triton"))
    results, info = run_sweep(s, progress=not args.no_progress)
    info["settings"] = {k: v for k, v in asdict(s).items() if k != "extra"}
    info["wall_s"] = round(time.perf_counter() - started, 1)
    print(format_table(results))
    ooms = sorted({(r.impl, r.n) for r in results if r.status == "OOM"})
    for impl, n in ooms:
        print(f"{impl}: OOM at N={n}")
    wrong = [r for r in results if r.status == "WRONG"]
    paths = write_results(results, info, Path(s.out), plot=not args.no_plot)
    print(f"peaks: {info['peak_source']}")
    print("wrote " + ", ".join(str(p) for p in paths) + f" in {info['wall_s']} s")
    return 1 if wrong else 0

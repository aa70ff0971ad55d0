"""The attention benchmark (notebook 09; ``python -m attn_course bench`` is its command line).

A sweep over the sequence length n with the number of tokens B·n and the model width A·d_k held
fixed (the FlashAttention papers' setup), so that every point does the same amount of projection
work and only attention's n² part grows. Implementations (:data:`IMPLEMENTATIONS`):

* ``naive`` — :func:`attn_course.fast.naive_attention` (the full score matrix);
* ``tiled`` — the course's tiled loop, :func:`attn_course.fast.tiled_attention` (forward); its
  forward + backward is :func:`attn_course.backward.flash_attention` (notebook 10), whose backward
  recomputes the tiles instead of storing them;
* ``sdpa-math``, ``sdpa-flash``, ``sdpa-efficient``, ``sdpa-cudnn`` — ``F.scaled_dot_product_attention``
  pinned to one backend with ``torch.nn.attention.sdpa_kernel`` (those this device has);
* ``compile`` — ``torch.compile(naive_attention)``; its compile time is reported in its own column;
* ``triton`` — the course's Triton kernels, forward and backward (:mod:`attn_course.triton_attention`;
  a CUDA GPU with Triton installed, or Triton's CPU interpreter for a dry run).

Each :class:`Impl` says how to run its forward and, separately, what to differentiate for the
forward + backward mode: autograd through the forward itself, a function with its own backward
(a ``torch.autograd.Function``), or nothing (forward only).

**Correctness first**: before anything is timed, each output (batch 0, heads 0–1) is compared with a
float64 reference computed tile by tile; in forward + backward mode the gradients are compared too.
A wrong implementation is reported as ``WRONG`` and not timed. Out of memory is a result (``OOM``),
not a crash.

**Numbers that hold on a busy machine**: every time is a median *with its spread* (the quartiles of
the timed runs), repeated until the interquartile range is under 10 % of the median or a time limit
passes — then the row says *unstable*. On a CPU the implementations of a point are timed together, in
interleaved rounds (:func:`attn_course.timing.interleaved`), on one torch thread (:data:`CPU_THREADS`),
so a busy stretch of the machine slows all of them alike; on a GPU each is timed on its own
(:func:`attn_course.timing.measure`). :func:`results_table` ranks the implementations at each point and
calls two of them *tied* when the data cannot tell them apart (:func:`attn_course.timing.paired_order`:
round by round on a CPU, overlapping middle halves [q1, q3] otherwise), rather than ranking them on noise. Memory is the peak above what was allocated
before the call (:func:`attn_course.timing.peak_memory_bytes`). FLOPs follow the papers
(:func:`attn_course.fast.attention_flops`); throughput is shown in GFLOP/s on a CPU and TFLOP/s on a
GPU, and "% of peak" compares it with the GPU's datasheet peak (:mod:`attn_course.datasheet`) or, on
a CPU, with this machine's own measured matrix-multiply throughput
(:func:`attn_course.timing.cpu_matmul_flops`). ``compile``'s first call (compiling included) is
reported on its own, with whether inductor's on-disk cache was warm or cold.

Use: ``results, stamp = run_sweep(BenchOptions(ns=[256, 512]))``, then :func:`results_table` and
:func:`plot_results`. :class:`BenchOptions` has a default for everything (a small CPU sweep), so
pass only what you change.
"""

from __future__ import annotations

import json
import os
from collections import Counter
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from . import datasheet, fast, timing
from .attention import score_matrix_bytes
from .plots import styled
from .tables import format_table

__all__ = [
    "IMPLEMENTATIONS",
    "SDPA_BACKENDS",
    "DTYPES",
    "TOLERANCE",
    "Impl",
    "implementations",
    "BenchOptions",
    "Config",
    "Result",
    "configs",
    "reference",
    "measure",
    "run_sweep",
    "results_table",
    "plot_results",
    "load_recorded",
    "rankings",
    "ranking_disagreements",
]

SDPA_BACKENDS = {"sdpa-math": "MATH", "sdpa-flash": "FLASH_ATTENTION",
                 "sdpa-efficient": "EFFICIENT_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION"}
IMPLEMENTATIONS = ("naive", "tiled", *SDPA_BACKENDS, "compile", "triton")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
#: Largest |error| allowed against the float64 reference, per element: tol · (1 + |reference|).
TOLERANCE = {torch.float32: 2e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float64: 1e-9}
#: Gradients: largest |error| allowed, relative to the largest |reference gradient|.
GRAD_TOLERANCE = {torch.float32: 1e-3, torch.float16: 5e-2, torch.bfloat16: 1e-1, torch.float64: 1e-9}
MODES = ("fwd", "fwd+bwd")
#: Implementations the CPU's default sweep leaves out, and why (``--impls`` adds them back).
CPU_OPT_IN = {"compile": "opt-in on a CPU (add it with --impls): torch.compile compiles afresh at every point of "
                         "the sweep (32 points by default), tens of seconds each on a busy 2-core CPU"}

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]


# ============================================================================ implementations
@dataclass
class Impl:
    """One attention implementation.

    ``forward(q, k, v, causal)`` → output (B, A, n, d_v). ``differentiable`` is what the forward +
    backward mode runs and differentiates: by default (``"autograd"``) ``forward`` itself; an
    implementation with its own backward gives a function built on a ``torch.autograd.Function``;
    None means forward only. ``prepare()``, when given, runs before each configuration (e.g. a fresh
    ``torch.compile``); with ``compiles`` the first call's time is reported as compile time.
    ``materialises``: it holds an n × n matrix (the CPU memory guard skips it when that cannot fit).
    """

    name: str
    forward: Attention
    differentiable: Attention | None | str = "autograd"
    note: str = ""
    materialises: bool = False
    prepare: Callable[[], None] | None = None
    compiles: bool = False

    def __post_init__(self) -> None:
        if self.differentiable == "autograd":
            self.differentiable = self.forward


def _sdpa(backend_name: str) -> Attention:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def _sdpa_works(backend_name: str, device: torch.device, dtype: torch.dtype) -> bool:
    q = torch.randn(1, 1, 32, 64, device=device, dtype=dtype)
    try:
        with warnings.catch_warnings():  # CUDA explains at length why a backend declines: not our output
            warnings.simplefilter("ignore")
            _sdpa(backend_name)(q, q, q, False)
        return True
    except RuntimeError:
        return False


class _Compiled:
    """``torch.compile(naive_attention)``, compiled afresh (and timed) once per configuration."""

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


def _tiled(block: int) -> Impl:
    def forward(q, k, v, causal):
        return (fast.causal_tiled_attention if causal else fast.tiled_attention)(q, k, v, block)

    try:
        from .backward import flash_attention
    except ImportError:  # notebook 10's module absent: forward only
        return Impl("tiled", forward, differentiable=None, note=f"block {block}")

    def differentiable(q, k, v, causal):
        return flash_attention(q, k, v, block, causal)

    return Impl("tiled", forward, differentiable=differentiable, note=f"block {block}")


def implementations(names: Iterable[str], device: str | torch.device, dtype: torch.dtype, *,
                    tiled_block: int = 256) -> tuple[list[Impl], dict[str, str]]:
    """The implementations in ``names`` that can run on ``device`` in ``dtype``, and for each one that
    cannot, why not."""
    device = torch.device(device)
    found: list[Impl] = []
    missing: dict[str, str] = {}
    for name in names:
        if name == "naive":
            found.append(Impl("naive", lambda q, k, v, causal: fast.naive_attention(q, k, v, causal=causal),
                              materialises=True))
        elif name == "tiled":
            found.append(_tiled(tiled_block))
        elif name in SDPA_BACKENDS:
            backend = SDPA_BACKENDS[name]
            if _sdpa_works(backend, device, dtype):
                found.append(Impl(name, _sdpa(backend), materialises=name == "sdpa-math"))
            else:
                missing[name] = f"backend {backend} has no kernel for {device.type}/{str(dtype).replace('torch.', '')}"
        elif name == "compile":
            compiled = _Compiled()
            found.append(Impl("compile", compiled, note="torch.compile(naive_attention)", materialises=True,
                              prepare=compiled.reset, compiles=True))
        elif name == "triton":
            from . import triton_attention

            interpreted = device.type == "cpu" and triton_attention._interpreting()
            reason = (triton_attention.unavailable_reason(device) if device.type == "cuda" or interpreted else
                      "the Triton kernel runs on CUDA GPUs (its CPU interpreter, TRITON_INTERPRET=1, is for tests "
                      "and the GPU script's dry run)")
            if reason:
                missing[name] = reason
            else:  # forward + backward through the kernels' autograd.Function (notebook 10)
                found.append(Impl("triton", lambda q, k, v, causal: triton_attention.attention(q, k, v, causal=causal),
                                  differentiable=lambda q, k, v, causal: triton_attention.flash_attention(q, k, v, causal),
                                  note="Triton's CPU interpreter: a dry run, not a speed" if interpreted else ""))
        else:
            missing[name] = f"unknown implementation (known: {', '.join(IMPLEMENTATIONS)})"
    return found, missing


# ============================================================================ what to measure
@dataclass
class BenchOptions:
    """What a sweep measures. Every field has a default (a small CPU sweep that takes seconds).

    ``ns``: sequence lengths; ``head_dims``: d_k (= d_v); ``tokens``: B·n held fixed (B = tokens // n,
    at least 1); ``hidden``: A·d_k held fixed (A = hidden // d_k, at least 1); ``modes``: "fwd" and/or
    "fwd+bwd"; ``tiled_block``: the block size of the course's tiled loop; ``min_run_time``: seconds
    of timed calls at least, per measurement; ``max_run_time``: seconds after which a measurement whose
    spread is still large stops and is marked unstable (default: 10 × ``min_run_time``, at least 1 s);
    ``max_memory``: on the CPU, skip implementations that hold an n × n matrix when they would need
    more bytes than this (Linux may grant a huge allocation and then kill the process); ``threads``: CPU
    threads for torch (default on a CPU: :data:`CPU_THREADS`, one, whatever the load); ``roofline_size``: the CPU roofline's matmul size; ``seed``: of the random
    inputs.
    """

    device: str = "cpu"
    ns: Sequence[int] = (256, 512, 1024)
    head_dims: Sequence[int] = (64,)
    dtypes: Sequence[str] = ("float32",)
    causal: Sequence[bool] = (False, True)
    modes: Sequence[str] = ("fwd",)
    impls: Sequence[str] = ("naive", "tiled", *SDPA_BACKENDS)
    tokens: int = 1024
    hidden: int = 128
    tiled_block: int = 256
    min_run_time: float = 0.05
    warmup: int = 1
    max_memory: float | None = None
    seed: int = 0
    max_run_time: float | None = None
    threads: int | None = None
    roofline_size: int = 2048

    def __post_init__(self) -> None:
        for name in ("ns", "head_dims", "dtypes", "causal", "modes", "impls"):
            value = getattr(self, name)
            if isinstance(value, (str, int, bool)) or not len(value):
                raise ValueError(f"{name} must be a non-empty list, got {value!r}")
            setattr(self, name, list(value))
        if any(not isinstance(n, int) or n < 1 for n in [*self.ns, *self.head_dims, self.tokens, self.hidden,
                                                          self.tiled_block, self.threads or 1]):
            raise ValueError("ns, head_dims, tokens, hidden, tiled_block and threads must be positive integers")
        unknown = [d for d in self.dtypes if d not in DTYPES] + [m for m in self.modes if m not in MODES]
        if unknown:
            raise ValueError(f"unknown dtype or mode {unknown}: dtypes from {list(DTYPES)}, modes from {list(MODES)}")
        torch.device(self.device)  # raises on a malformed device string

    @classmethod
    def preset(cls, device: str, *, quick: bool = False) -> "BenchOptions":
        """The command line's defaults: on a CUDA GPU the papers' sizes in float16/bfloat16, on the CPU a
        smaller float32 sweep; ``quick`` is a small sweep to see that everything works."""
        gpu = torch.device(device).type == "cuda"
        if quick:
            return cls(device=device, ns=[1024, 2048, 4096] if gpu else [256, 512, 1024], head_dims=[64],
                       dtypes=["float16"] if gpu else ["float32"], modes=["fwd"],
                       impls=[i for i in IMPLEMENTATIONS if i != "compile"],
                       tokens=8192 if gpu else 1024, hidden=1024 if gpu else 128,
                       tiled_block=1024 if gpu else 256, min_run_time=0.05)
        if gpu:
            return cls(device=device, ns=[512, 1024, 2048, 4096, 8192, 16384], head_dims=[64, 128],
                       dtypes=["float16", "bfloat16"], modes=list(MODES), impls=list(IMPLEMENTATIONS), tokens=16384,
                       hidden=2048, tiled_block=1024, min_run_time=0.2, warmup=2)
        # The CPU's default is sized to finish in minutes on 2 busy cores (tools/bench.py's CPU_DEFAULT): every
        # point costs B·n = tokens times n, so lengths stop at 2048; each measurement stops after 1 s of
        # timed runs (then marked unstable if its spread is still large); torch.compile is left out
        # (CPU_OPT_IN says why) and can be added with impls.
        return cls(device=device, ns=[256, 512, 1024, 2048], head_dims=[64, 128], dtypes=["float32"],
                   modes=list(MODES), impls=[i for i in IMPLEMENTATIONS if i not in CPU_OPT_IN], tokens=2048,
                   hidden=256, tiled_block=256, min_run_time=0.1, max_run_time=1.0, warmup=1)


@dataclass
class Config:
    """One point of a sweep."""

    n: int
    head_dim: int
    batch: int
    heads: int
    dtype: str
    causal: bool
    mode: str  # "fwd" or "fwd+bwd"


@dataclass
class Result:
    """One implementation at one :class:`Config`: a row of the CSV."""

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
    ms: float | None = None  # median
    tflops: float | None = None  # at the median time; shown as GFLOP/s on a CPU
    pct_of_peak: float | None = None
    peak_memory_bytes: int | None = None
    compile_s: float | None = None  # compile's first call: compiling + one run
    max_abs_error: float | None = None
    note: str = ""
    ms_q1: float | None = None  # 25th and 75th percentiles of the timed runs: the spread
    ms_q3: float | None = None
    runs: int | None = None  # timed runs behind the median
    stable: bool | None = None  # IQR ≤ 10 % of the median before the time limit
    compile_cache: str | None = None  # compile: inductor's on-disk cache "warm" (hits only) or "cold" (wrote)
    rounds_ms: list[float] | None = None  # CPU: per-call ms in each interleaved round (same rounds for every impl)


#: The CSV's columns (the per-round times are in the JSON only).
FIELDS = [f.name for f in fields(Result) if f.name != "rounds_ms"]


def configs(options: BenchOptions) -> list[Config]:
    """Every (n, d_k, dtype, causal, mode) point, with B = tokens // n and A = hidden // d_k."""
    return [Config(n, d, max(1, options.tokens // n), max(1, options.hidden // d), dtype, causal, mode)
            for dtype in options.dtypes for d in options.head_dims for causal in options.causal
            for mode in options.modes for n in options.ns]


# ============================================================================ one measurement
def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


#: Up to this length the reference gradients come from autograd through float64 SDPA (it holds n × n
#: matrices); beyond it, from notebook 10's tiled backward in float64, which does not.
AUTOGRAD_REFERENCE_MAX_N = 2048


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              dout: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """float64 output for batch 0, heads 0–1, computed tile by tile (little memory even for long n), and,
    given ``dout`` (the upstream gradient), the gradients for q, k, v of those heads: from autograd
    through ``F.scaled_dot_product_attention`` up to :data:`AUTOGRAD_REFERENCE_MAX_N`, beyond it from
    :func:`attn_course.backward.tiled_attention_backward` (None when that module is absent)."""
    q0, k0, v0 = (t[0, :2].detach().double() for t in (q, k, v))
    block = min(q.shape[-2], 1024)
    out = (fast.causal_tiled_attention if causal else fast.tiled_attention)(q0, k0, v0, block)
    if dout is None:
        return out, None
    d0 = dout[0, :2].double()
    if q.shape[-2] <= AUTOGRAD_REFERENCE_MAX_N:
        leaves = [t.requires_grad_(True) for t in (q0.clone(), k0.clone(), v0.clone())]
        with torch.enable_grad():
            o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
            return out, torch.autograd.grad(o, leaves, d0)
    try:
        from .backward import tiled_attention_backward, tiled_attention_forward
    except ImportError:
        return out, None
    o, lse = tiled_attention_forward(q0, k0, v0, block, causal=causal)
    return out, tiled_attention_backward(q0, k0, v0, o, lse, d0, block, causal=causal)


def _inductor_cache_files() -> int | None:
    """How many files inductor's on-disk cache holds (None when it cannot be found): a compile that
    adds files found its caches cold; one that adds none was served from them (warm)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        root = Path(cache_dir())
        return sum(1 for p in root.rglob("*") if p.is_file()) if root.exists() else 0
    except Exception:  # noqa: BLE001 - a private module that may move: then say nothing
        return None


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _first_error(what: str, got: torch.Tensor, want: torch.Tensor, tol: float, *, relative_to_max: bool) -> str | None:
    """Why ``got`` is not close enough to ``want`` (None when it is)."""
    got = got.double()
    if not torch.isfinite(got).all():
        return f"{what}: NaN or inf"
    err = (got - want).abs()
    bound = tol * float(want.abs().max()) if relative_to_max else tol * (1 + want.abs())
    if bool((err <= bound).all()):
        return None
    return f"{what}: max |error| {float(err.max()):.3g} vs float64"


def measure(impl: Impl, cfg: Config, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor], *,
            device: str | torch.device, peak: float | None = None, options: BenchOptions | None = None) -> Result:
    """Check ``impl`` on one configuration against float64, then time it and measure its peak memory."""
    options = options or BenchOptions()
    res, step, warmup = _prepare(impl, cfg, inputs, device=device, options=options)
    try:
        if step is not None:
            t = timing.measure(step, device=device, warmup=warmup, min_run_time=options.min_run_time,
                               max_run_time=options.max_run_time)
            _timed(res, step, t, cfg, peak, torch.device(device))
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row, never a crash
        _failed(res, exc)
    finally:
        _free(torch.device(device))
    return res


def _prepare(impl: Impl, cfg: Config, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor], *,
             device: str | torch.device, options: BenchOptions) -> tuple[Result, Callable[[], Any] | None, int]:
    """The row for ``impl`` at ``cfg``, checked against float64 (and its compile time measured), with the
    call to time and how many warm-up calls it still needs; the call is None when it must not be timed
    (unsupported, skipped, wrong, failed: the row says why)."""
    device = torch.device(device)
    dtype = DTYPES[cfg.dtype]
    res = Result(impl.name, device.type, cfg.dtype, cfg.batch, cfg.heads, cfg.n, cfg.head_dim, cfg.causal,
                 cfg.mode, "ok", note=impl.note)
    backward = cfg.mode == "fwd+bwd"
    if backward and impl.differentiable is None:
        res.status, res.note = "unsupported", "forward only"
        return res, None, 0
    if device.type == "cpu" and options.max_memory and impl.materialises:
        need = 3 * score_matrix_bytes(cfg.n, batch=cfg.batch, heads=cfg.heads, dtype=dtype) * (2 if backward else 1)
        if need > options.max_memory:
            res.status = "skipped"
            res.note = f"would need about {timing.format_bytes(need)} > max_memory {timing.format_bytes(options.max_memory)}"
            return res, None, 0
    q, k, v = inputs
    try:
        if backward:
            qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
            dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(options.seed + 1)).to(device, dtype)

            def step():
                o = impl.differentiable(qg, kg, vg, cfg.causal)
                return torch.autograd.grad(o, (qg, kg, vg), dout)

            def first():  # the output and gradients to check (torch.compile compiles both passes here)
                o = impl.differentiable(qg, kg, vg, cfg.causal)
                return o.detach(), torch.autograd.grad(o, (qg, kg, vg), dout)
        else:
            dout = None

            def step():
                return impl.forward(q, k, v, cfg.causal)

            def first():
                return step(), None
        if impl.prepare is not None:
            impl.prepare()
        want_out, want_grads = reference(q, k, v, cfg.causal, dout)
        cache_before = _inductor_cache_files() if impl.compiles else None
        start = time.perf_counter()
        out, grads = first()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        first_s = time.perf_counter() - start
        if impl.compiles:
            res.compile_s = first_s  # compiling + one run
            after = _inductor_cache_files()
            if cache_before is not None and after is not None:
                res.compile_cache = "cold" if after > cache_before else "warm"
        res.max_abs_error = float((out[0, :2].double() - want_out).abs().max())
        problems = [_first_error("output", out[0, :2], want_out, TOLERANCE[dtype], relative_to_max=False)]
        if grads is not None and want_grads is not None:
            problems += [_first_error(f"d{name}", g[0, :2], w, GRAD_TOLERANCE[dtype], relative_to_max=True)
                         for name, g, w in zip("qkv", grads, want_grads)]
        problems = [p for p in problems if p]
        if problems:
            res.status = "WRONG"
            res.note = "; ".join(problems) + ": not timed"
            return res, None, 0
        del out, grads
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row, never a crash
        _failed(res, exc)
        return res, None, 0
    # A first call slower than 0.2 s (not compiling) already warmed up what a warm-up call would.
    return res, step, (options.warmup if first_s < 0.2 else 0)


def _timed(res: Result, step: Callable[[], Any], t: timing.Timing, cfg: Config, peak: float | None,
           device: torch.device) -> None:
    """Fill ``res`` from its timing ``t``: median and spread, FLOP/s, % of peak, peak memory."""
    res.ms, res.ms_q1, res.ms_q3, res.runs, res.stable = t.median, t.q1, t.q3, t.runs, t.stable
    res.rounds_ms = list(t.rounds) or None
    if not t.stable:
        res.note = (f"unstable: IQR {100 * t.relative_spread:.0f}% of the median after {t.runs} runs"
                    + (f"; {res.note}" if res.note else ""))
    flops = fast.attention_flops(cfg.batch, cfg.heads, cfg.n, cfg.head_dim, causal=cfg.causal,
                                 backward=cfg.mode == "fwd+bwd")
    res.tflops = flops / (res.ms * 1e-3) / 1e12
    if peak:
        res.pct_of_peak = 100.0 * res.tflops / peak
    res.peak_memory_bytes = timing.peak_memory_bytes(step, device=device)


def _failed(res: Result, exc: BaseException) -> None:
    if _is_oom(exc):
        res.status, res.note = "OOM", f"OOM at n={res.n}"
    elif "No available kernel" in str(exc) or "No viable backend" in str(exc):
        res.status, res.note = "unsupported", "no kernel for this configuration"
    else:
        first_line = str(exc).splitlines()[0][:160] if str(exc) else ""
        res.status, res.note = "error", f"{type(exc).__name__}: {first_line}"
    res.ms = res.tflops = res.pct_of_peak = res.ms_q1 = res.ms_q3 = res.runs = res.stable = res.rounds_ms = None


# ============================================================================ the sweep
def run_sweep(options: BenchOptions | None = None, *, progress: bool = True,
              log: Callable[[str], None] = print) -> tuple[list[Result], dict[str, Any]]:
    """Measure every implementation on every configuration of ``options``; returns the rows and the
    run's stamp (device, versions, shapes, how FLOPs, memory and peaks were counted). ``log`` gets one
    line per implementation that cannot run here, per out-of-memory and per wrong result."""
    from tqdm.auto import tqdm

    options = options or BenchOptions()
    device = torch.device(options.device)
    threads_before = torch.get_num_threads()
    busy = _busy_note(device)
    if busy:
        log(busy)
    if device.type == "cpu":
        torch.set_num_threads(options.threads or CPU_THREADS)
    try:
        return _sweep(options, device, progress, log, tqdm, busy)
    finally:
        torch.set_num_threads(threads_before)


#: Torch threads for a CPU sweep unless ``threads`` says otherwise. One thread, whatever else the machine
#: runs: with several, each parallel operation waits until all its threads are scheduled at once, which on
#: a busy machine costs the many small operations of a tiled loop far more than one large SDPA call (a
#: sweep on 2 threads at load 1.9 on 2 cores timed one point at 16 s where the others at that n took
#: 0.08–1.6 s), so the ranking would depend on the load. A thread count chosen from the load would
#: make two runs measure different things.
CPU_THREADS = 1


def _busy_note(device: torch.device) -> str | None:
    """A line when other work keeps more than half of the CPU's cores busy (load average above half the
    core count): times then spread more. The load is read once, at the start; it changes nothing measured."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # Windows
        return None
    cores = os.cpu_count() or 1
    if device.type != "cpu" or load <= cores / 2:
        return None
    return (f"this machine is busy (load average {load:.1f} on {cores} cores): times spread more; the "
            "implementations of each point are timed in interleaved rounds, so a busy stretch slows all of "
            "them alike, and results the rounds cannot tell apart are called tied")


#: The forecast's seconds for one torch.compile (a fresh compile per point; tens of seconds on a CPU).
COMPILE_FORECAST_S = 20.0


def _work_seconds(cfg: Config, flops_per_s: float, options: BenchOptions) -> float:
    """A rough forecast of one measurement's seconds, for the progress bar's ETA: the timed runs
    (at least ``min_run_time``) plus about six untimed calls (reference, first call, warm-up, block
    estimate, memory), each at an assumed 20 % of the roofline. Only ratios matter: the bar learns the
    real rate as it goes, and points far apart in n weigh what their FLOPs say."""
    flops = fast.attention_flops(cfg.batch, cfg.heads, cfg.n, cfg.head_dim, causal=cfg.causal,
                                 backward=cfg.mode == "fwd+bwd")
    call = flops / (0.2 * flops_per_s)
    return max(options.min_run_time, 4 * call) + 6 * call


def _sweep(options: BenchOptions, device: torch.device, progress: bool, log: Callable[[str], None],
           tqdm: Any, busy: str | None) -> tuple[list[Result], dict[str, Any]]:
    points = configs(options)
    impls_by_dtype: dict[str, list[Impl]] = {}
    missing_all: dict[str, str] = {}
    for dt in options.dtypes:
        found, missing = implementations(options.impls, device, DTYPES[dt], tiled_block=options.tiled_block)
        impls_by_dtype[dt] = found
        missing_all.update({f"{name} ({dt})": why for name, why in missing.items()})
    for name, why in missing_all.items():
        log(f"not measured: {name}: {why}")
    name = timing.device_name(device)
    peaks = {dt: _peak_flops(name, device, dt, options.roofline_size) for dt in options.dtypes}  # (FLOP/s or None, source)
    results: list[Result] = []
    oom_at: dict[tuple, int] = {}
    rate = next((p for p, _ in peaks.values() if p), 1e11)  # FLOP/s, only for the forecast
    work = {(id(c), impl.name): _work_seconds(c, rate, options) + (COMPILE_FORECAST_S if impl.compiles else 0.0)
            for c in points for impl in impls_by_dtype[c.dtype]}
    total = sum(work.values())
    # The bar counts forecast seconds of work, not measurements: a point at n = 4096 weighs 64 of one at
    # n = 512, so the ETA does not assume that the last points cost what the first did.
    bar = tqdm(total=total, desc="bench", unit="s of work", unit_scale=False, disable=not progress,
               file=sys.stderr, bar_format="{l_bar}{bar}| {percentage:3.0f}% of the forecast work "
                                           "[{elapsed} so far, about {remaining} left{postfix}]")
    gen = torch.Generator(device="cpu").manual_seed(options.seed)
    for cfg in points:
        dtype = DTYPES[cfg.dtype]
        shape = (cfg.batch, cfg.heads, cfg.n, cfg.head_dim)  # (B, A, n, d_k)
        try:
            inputs = tuple(torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for _ in range(3))
        except Exception as exc:  # noqa: BLE001
            if not _is_oom(exc):
                raise
            for impl in impls_by_dtype[cfg.dtype]:
                results.append(Result(impl.name, device.type, cfg.dtype, cfg.batch, cfg.heads, cfg.n, cfg.head_dim,
                                      cfg.causal, cfg.mode, "OOM", note=f"OOM at n={cfg.n} (inputs)"))
                bar.update(work[(id(cfg), impl.name)])
            _free(device)
            continue
        peak = peaks[cfg.dtype][0] / 1e12 if peaks[cfg.dtype][0] else None  # TFLOP/s
        where = f"n={cfg.n} d={cfg.head_dim} {cfg.dtype} {'causal' if cfg.causal else 'full'} {cfg.mode}"
        rows, steps = [], {}
        for impl in impls_by_dtype[cfg.dtype]:
            key = (impl.name, cfg.head_dim, cfg.dtype, cfg.causal, cfg.mode)
            bar.set_postfix_str(f"{impl.name} {where}")
            if key in oom_at and cfg.n > oom_at[key]:
                res = Result(impl.name, device.type, cfg.dtype, cfg.batch, cfg.heads, cfg.n, cfg.head_dim,
                             cfg.causal, cfg.mode, "skipped", note=f"already OOM at n={oom_at[key]}")
            elif device.type == "cpu":  # checked now, timed below with the others in interleaved rounds
                res, step, warmup = _prepare(impl, cfg, inputs, device=device, options=options)
                if step is not None:
                    steps[impl.name] = (res, step, warmup)
                bar.update(work[(id(cfg), impl.name)] / 2)
            else:
                res = measure(impl, cfg, inputs, device=device, peak=peak, options=options)
            if res.status == "OOM":
                oom_at[key] = cfg.n
            if res.status in ("OOM", "WRONG", "error"):
                log(f"{impl.name}: {res.status} at n={cfg.n} (d={cfg.head_dim}, {cfg.dtype}, "
                    f"{'causal' if cfg.causal else 'non-causal'}, {cfg.mode}): {res.note}")
            rows.append((impl, res))
            if device.type != "cpu":
                bar.update(work[(id(cfg), impl.name)])
        if steps:
            bar.set_postfix_str(f"{len(steps)} implementations in interleaved rounds, {where}")
            _time_together(steps, cfg, peak, device, options)
            for impl, res in rows:
                if impl.name in steps:
                    bar.update(work[(id(cfg), impl.name)] / 2)
        results += [res for _, res in rows]
        del inputs, steps
        _free(device)
    bar.close()
    info = _stamp(options, device, name, missing_all, peaks)
    if busy:
        info["load_note"] = busy
    return results, info


def _time_together(steps: dict[str, tuple[Result, Callable[[], Any], int]], cfg: Config, peak: float | None,
                   device: torch.device, options: BenchOptions) -> None:
    """Time the implementations of one CPU point in interleaved rounds (:func:`timing.interleaved`), so
    that a busy stretch of the machine slows all of them alike and their order holds."""
    try:
        timings = timing.interleaved({name: step for name, (_, step, _) in steps.items()},
                                     warmup=max(w for _, _, w in steps.values()),
                                     min_run_time=options.min_run_time, max_run_time=options.max_run_time)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row, never a crash
        for res, _, _ in steps.values():
            _failed(res, exc)
        return
    for name, (res, step, _) in steps.items():
        try:
            _timed(res, step, timings[name], cfg, peak, device)
        except Exception as exc:  # noqa: BLE001
            _failed(res, exc)


#: The CPU's roofline: a (size × size) @ (size × size) float matrix product, measured on this machine.
CPU_ROOFLINE_SIZE = 2048


def _peak_flops(name: str, device: torch.device, dtype_name: str,
                size: int = CPU_ROOFLINE_SIZE) -> tuple[float | None, str]:
    """(peak FLOP/s or None, where it comes from) for "% of peak": the datasheet on a GPU, this
    machine's own measured matrix product on a CPU."""
    dtype = DTYPES[dtype_name]
    if device.type == "cuda":
        peak, model = datasheet.peak_tflops(name, dtype)
        if peak is None:
            return None, (f"no {dtype_name} tensor-core peak for {model}" if model else "no known peak for this GPU")
        return peak * 1e12, f"{datasheet.PEAK_SOURCE} ({model})"
    if device.type == "cpu" and dtype in (torch.float32, torch.float64):
        size = min(size, CPU_ROOFLINE_SIZE)
        flops = timing.cpu_matmul_flops(size, dtype)
        return flops, (f"this CPU's measured {dtype_name} matmul ({size}×{size}, "
                       f"{torch.get_num_threads()} threads): {flops / 1e9:.1f} GFLOP/s")
    return None, f"no roofline for {device.type}/{dtype_name}"


def _stamp(options: BenchOptions, device: torch.device, name: str, missing: dict[str, str],
           peaks: dict[str, tuple[float | None, str]]) -> dict[str, Any]:
    info = timing.stamp(device, None, {"tokens (B·n)": options.tokens, "hidden (A·d_k)": options.hidden,
                                       "n": list(options.ns), "head_dims": list(options.head_dims),
                                       "dtypes": list(options.dtypes)})
    info["threads"] = torch.get_num_threads() if device.type == "cpu" else None
    info["peak_tflops"] = {dt: (p / 1e12 if p else None) for dt, (p, _) in peaks.items()}
    info["peak_source"] = "; ".join(dict.fromkeys(source for _, source in peaks.values()))
    info["timing"] = (f"median of the timed runs with their quartiles, repeated until IQR ≤ {timing.STABLE_IQR:.0%} "
                      "of the median or the time limit (then 'unstable'); implementations whose [q1, q3] overlap "
                      "are tied; compile_s: compile's first call, compiling included (compile_cache: inductor's "
                      "on-disk cache warm or cold)")
    info["not_measured"] = missing
    info["flops"] = "4·B·A·n²·d_k forward, half when causal; forward+backward = 3.5 × forward"
    info["correctness"] = ("each output (and, forward+backward, each gradient) compared with float64 on batch 0, "
                           f"heads 0-1, before timing; reference gradients from autograd up to n = "
                           f"{AUTOGRAD_REFERENCE_MAX_N}, from the tiled float64 backward beyond")
    info["memory"] = ("torch.cuda.max_memory_allocated above the memory allocated before the call"
                      if device.type == "cuda" else
                      "peak of PyTorch CPU allocations recorded by torch.profiler (profile_memory=True)")
    info["options"] = asdict(options)
    return info


# ============================================================================ showing results
def _rows(results: Iterable[Result | dict]) -> list[dict[str, Any]]:
    return [asdict(r) if isinstance(r, Result) else dict(r) for r in results]


def _point(r: dict[str, Any]) -> tuple:
    return (r["dtype"], r["head_dim"], r["batch"], r["heads"], r["causal"], r["mode"], r["n"])


def _interval(r: dict[str, Any]) -> tuple[float, float]:
    q1, q3 = r.get("ms_q1"), r.get("ms_q3")
    return (r["ms"] if q1 is None else q1, r["ms"] if q3 is None else q3)


def rankings(results: Iterable[Result | dict]) -> dict[tuple, list[list[str]]]:
    """At each point (dtype, d_k, B, A, causal, mode, n), the measured implementations fastest first, in
    groups of ties: sorted by median time, an implementation joins the group before it when the data
    cannot tell it from the previous one (:func:`timing.paired_order`: round by round when both were timed
    in the same interleaved rounds, else by whether their middle halves [q1, q3] overlap)."""
    by_point: dict[tuple, list[dict[str, Any]]] = {}
    for r in _rows(results):
        if r["status"] == "ok" and r["ms"] is not None:
            by_point.setdefault(_point(r), []).append(r)
    ranked: dict[tuple, list[list[str]]] = {}
    for point, rows in by_point.items():
        rows.sort(key=lambda r: r["ms"])
        groups: list[list[str]] = []
        previous: timing.Timing | None = None
        for r in rows:
            q1, q3 = _interval(r)
            this = timing.Timing(r["ms"], q1, q3, r.get("runs") or 0, bool(r.get("stable")), "",
                                 tuple(r.get("rounds_ms") or ()))
            if previous is not None and timing.paired_order(previous, this) == 0:
                groups[-1].append(r["impl"])
            else:
                groups.append([r["impl"]])
            previous = this
        ranked[point] = groups
    return ranked


def ranking_disagreements(first: Iterable[Result | dict], second: Iterable[Result | dict]) -> list[str]:
    """Where two runs rank two implementations in opposite orders, each time *outside* their spreads
    (a pair tied in either run never disagrees). One line per disagreement; [] when the rankings agree."""
    a, b = rankings(first), rankings(second)
    found = []
    for point in sorted(set(a) & set(b), key=str):
        place_a = {impl: i for i, group in enumerate(a[point]) for impl in group}
        place_b = {impl: i for i, group in enumerate(b[point]) for impl in group}
        common = [impl for impl in place_a if impl in place_b]
        for x in common:
            for y in common:
                if place_a[x] < place_a[y] and place_b[x] > place_b[y]:
                    dtype, d, batch, heads, causal, mode, n = point
                    found.append(f"{dtype} d={d} n={n} {'causal' if causal else 'full'} {mode}: "
                                 f"{x} < {y} in the first run, {y} < {x} in the second")
    return found


def results_table(results: Iterable[Result | dict], *, max_width: int | None = None) -> str:
    """A text table, one row per measurement: the median time with its spread (IQR as a percentage of
    the median, ``!`` when the measurement never became stable), the rank at that point (``=2``: tied
    with another, their spreads overlap), throughput in GFLOP/s on a CPU or TFLOP/s on a GPU, % of
    peak, peak memory and compile's first call."""
    rows_in = _rows(results)
    gpu = any(r.get("device") == "cuda" for r in rows_in)
    unit, factor = ("TFLOP/s", 1.0) if gpu else ("GFLOP/s", 1e3)
    ranks: dict[tuple[tuple, str], str] = {}
    for point, groups in rankings(rows_in).items():
        place = 1
        for group in groups:
            for impl in group:
                ranks[(point, impl)] = f"={place}" if len(group) > 1 else str(place)
            place += len(group)
    headers = ["impl", "dtype", "n", "d", "B×A", "causal", "mode", "ms", "IQR", "rank", unit, "% peak", "memory",
               "1st call s", "status"]
    rows = []
    for r in rows_in:
        status = r["status"] + (f" ({r['note']})" if r.get("note") and r["status"] != "ok" else "")
        if r["status"] == "ok" and r.get("stable") is False:
            status = "ok, unstable"  # the IQR column has the spread; the CSV/JSON note says after how many runs
        spread = None
        if r["ms"] is not None and r.get("ms_q1") is not None:
            spread = f"{100 * (r['ms_q3'] - r['ms_q1']) / r['ms']:.0f}%" + ("" if r.get("stable", True) else "!")
        first_call = None
        if r.get("compile_s") is not None:
            first_call = f"{r['compile_s']:.1f}" + (f" ({r['compile_cache']} cache)" if r.get("compile_cache") else "")
        rows.append([r["impl"], r["dtype"], r["n"], r["head_dim"], r["batch"] * r["heads"], r["causal"], r["mode"],
                     r["ms"], spread, ranks.get((_point(r), r["impl"])),
                     None if r["tflops"] is None else r["tflops"] * factor, r["pct_of_peak"],
                     None if r["peak_memory_bytes"] is None else timing.format_bytes(r["peak_memory_bytes"]),
                     first_call, status])
    for optional in ("1st call s", "% peak", "IQR"):  # columns nothing was measured for are left out
        j = headers.index(optional)
        if all(row[j] is None for row in rows):
            headers.pop(j)
            for row in rows:
                row.pop(j)
    return format_table(headers, rows, formats={"ms": ".3f", unit: ".1f" if gpu else ".2f", "% peak": ".1f"},
                        align={h: ">" for h in ("n", "d", "B×A", "ms", "IQR", "rank", unit, "% peak", "memory",
                                                "1st call s")},
                        max_width=max_width, flex="status")


@styled
def plot_results(results: Iterable[Result | dict], info: dict[str, Any], *, dtype: str | None = None,
                 mode: str = "fwd") -> plt.Figure | None:
    """Time (ms, median with the quartiles as error bars) and peak extra memory vs n, log–log: a pair
    of rows per head dim, one column per causal setting. None when there is no successful measurement of ``dtype`` (default: the first
    measured) in ``mode``."""
    ok = [r for r in _rows(results) if r["status"] == "ok" and r["mode"] == mode]
    dtype = dtype or (ok[0]["dtype"] if ok else None)
    ok = [r for r in ok if r["dtype"] == dtype]
    if not ok:
        return None
    # A line joins points of one sweep: B·n tokens and A·d_k held fixed. Rows merged from runs at other
    # sizes (a recorded GPU's notebook cell beside its sweep) stay in the table, not in the figure.
    sizes = Counter((r["batch"] * r["n"], r["heads"] * r["head_dim"]) for r in ok)
    (tokens, hidden), _ = sizes.most_common(1)[0]
    left_out = sum(count for size, count in sizes.items() if size != (tokens, hidden))
    ok = [r for r in ok if (r["batch"] * r["n"], r["heads"] * r["head_dim"]) == (tokens, hidden)]
    dims = sorted({r["head_dim"] for r in ok})
    causals = sorted({r["causal"] for r in ok})
    fig, axes = plt.subplots(2 * len(dims), len(causals), figsize=(4.7 * len(causals), 3.4 * 2 * len(dims)),
                             squeeze=False)
    impls = list(dict.fromkeys(r["impl"] for r in ok))
    markers = "osD^vP*X"
    fixed = f"B·n = {tokens} tokens, A·d_k = {hidden} held fixed" + (
        f" (the table's {left_out} measurements at other sizes are not drawn)" if left_out else "")
    for i, d in enumerate(dims):
        for j, causal in enumerate(causals):
            time_ax, mem_ax = axes[2 * i][j], axes[2 * i + 1][j]
            for m, impl in enumerate(impls):
                pts = sorted((r["n"], r["ms"], r["peak_memory_bytes"], *_interval(r)) for r in ok
                             if r["impl"] == impl and r["head_dim"] == d and r["causal"] == causal)
                if not pts:
                    continue
                style = dict(marker=markers[m % len(markers)], label=impl)
                # error bars: the middle half of the timed runs (q1 to q3)
                time_ax.errorbar([p[0] for p in pts], [p[1] for p in pts], capsize=3,
                                 yerr=[[p[1] - p[3] for p in pts], [p[4] - p[1] for p in pts]], **style)
                mem = [(p[0], p[2] / 2**20) for p in pts if p[2] is not None]
                if mem:
                    mem_ax.plot(*zip(*mem), **style)
            time_ax.set_title(f"d_k = {d}, {'causal' if causal else 'non-causal'}, {dtype}, {mode}")
            for ax, ylabel in ((time_ax, "median time (ms)"), (mem_ax, "peak extra memory (MiB)")):
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_xlabel("sequence length n")
                ax.set_ylabel(ylabel)
                ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=9)
    fig.suptitle(f"{info.get('device', '?')} · torch {info.get('torch', '?')}"
                 + (f" · triton {info['triton']}" if info.get("triton") else "")
                 + f"\n{fixed}", fontsize=10)
    fig.tight_layout()
    return fig


def load_recorded(root: str | Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every recorded run under ``root`` (``<root>/*/attention-bench.json``), sorted by path; files that
    cannot be read are left out."""
    found = []
    for path in sorted(Path(root).glob("*/attention-bench.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("results"), list):
            found.append((path, data))
    return found

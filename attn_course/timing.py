"""Timing and peak memory, the one way every notebook and tool of the course measures them (notebooks
05, 09 and 10, the ``bench`` command), and a stamp saying where and how a measurement was taken.

* :func:`measure` — a call's time with its spread (:class:`Timing`: median, quartiles, interquartile
  range, number of timed runs), repeated until the spread is small (IQR ≤ 10 % of the median) or a
  time limit is reached, and then marked *unstable* rather than trusted. On the CPU:
  ``torch.utils.benchmark.Timer.adaptive_autorange`` (it also handles thread settings). On a CUDA
  GPU: ``triton.testing.do_bench`` when Triton is installed, otherwise CUDA events around each repeat
  (a GPU runs asynchronously: wall-clock time without synchronising measures nothing).
* :func:`time_ms` — just the median, in milliseconds (what the notebooks print).
* :func:`cpu_matmul_flops` — this machine's measured float32 matrix-multiply throughput: the CPU's
  roofline, so that "% of peak" means something on a CPU too (GPUs use the vendor's datasheet).
* :func:`peak_memory_bytes` — the most memory a call held *on top of* what was allocated before it
  (its result included). On CUDA: ``torch.cuda.max_memory_allocated`` (the caching allocator's exact
  peak of live tensor bytes). On the CPU: PyTorch's profiler with ``profile_memory=True`` records every
  allocation and free made through PyTorch's CPU allocator (buffers inside operators included); the
  peak of their running total is reported. Python's ``tracemalloc`` cannot do this: PyTorch allocates
  tensor memory in C++, outside Python's allocator.
* :func:`stamp` / :func:`describe_stamp` — device, dtype, shapes and library versions, to keep (and
  print) next to every result; :func:`format_bytes` — 1536 → "1.5 KiB".
"""

from __future__ import annotations

import contextlib
import math
import datetime as _dt
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import torch

__all__ = ["Timing", "measure", "interleaved", "paired_order", "time_ms", "cpu_matmul_flops", "STABLE_IQR", "peak_memory_bytes", "stamp", "describe_stamp", "device_name", "triton_version",
           "format_bytes"]


def triton_version() -> str | None:
    """Triton's version when it is installed, else None (Triton is optional in this course)."""
    try:
        import triton
    except Exception:  # noqa: BLE001 - ImportError, or a broken install
        return None
    return getattr(triton, "__version__", "unknown")


def device_name(device: str | torch.device) -> str:
    """A readable name: the GPU model for CUDA devices, the processor for the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU: {name} ({os.cpu_count()} logical cores, {(t := torch.get_num_threads())} torch thread{'s' * (t != 1)})"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ============================================================================ time
#: A measurement is *stable* when its interquartile range is at most this fraction of its median.
STABLE_IQR = 0.10
#: Fewest timed runs (blocks of calls) behind a median and its quartiles.
MIN_RUNS = 4


@dataclass(frozen=True)
class Timing:
    """One call's time with its spread, in milliseconds: ``median``; ``q1`` and ``q3`` (the 25th and
    75th percentiles); ``runs`` timed; ``stable`` when IQR = q3 − q1 ≤ :data:`STABLE_IQR` · median
    over at least :data:`MIN_RUNS` runs;
    ``method`` says how it was timed."""

    median: float
    q1: float
    q3: float
    runs: int
    stable: bool
    method: str
    rounds: tuple[float, ...] = ()  # per-call ms of each interleaved round (see :func:`interleaved`), else empty

    @property
    def iqr(self) -> float:
        """Interquartile range (ms): the middle half of the timed runs lies within it."""
        return self.q3 - self.q1

    @property
    def relative_spread(self) -> float:
        """IQR / median (0.05 = the middle half of the runs within 5 % of the median's size)."""
        return self.iqr / self.median if self.median > 0 else float("inf")

    def overlaps(self, other: "Timing") -> bool:
        """True when the two middle halves [q1, q3] overlap: neither is measurably faster (a tie)."""
        return self.q1 <= other.q3 and other.q1 <= self.q3


def _quartiles(times_ms: list[float]) -> tuple[float, float, float]:
    t = torch.tensor(times_ms, dtype=torch.float64)
    q1, med, q3 = (float(t.quantile(p)) for p in (0.25, 0.5, 0.75))
    return med, q1, q3


def _timing(times_ms: list[float], method: str) -> Timing:
    med, q1, q3 = _quartiles(times_ms)
    return Timing(med, q1, q3, len(times_ms), len(times_ms) >= MIN_RUNS and (q3 - q1) <= STABLE_IQR * med, method)


def measure(fn: Callable[[], Any], *, device: str | torch.device = "cpu", warmup: int = 2,
            min_run_time: float = 0.2, max_run_time: float | None = None) -> Timing:
    """Time ``fn()`` after ``warmup`` untimed calls, repeating until the spread is small.

    CPU: ``torch.utils.benchmark.Timer.adaptive_autorange`` — blocks of calls until at least
    ``min_run_time`` seconds and 4 blocks are timed *and* the IQR is under 10 % of the median, or
    ``max_run_time`` (default: 10 × ``min_run_time``, at least 1 s) has passed; then
    ``stable`` is False. At least :data:`MIN_RUNS` runs are always timed. CUDA: ``triton.testing.do_bench`` (all its runs, quartiles from them) when
    Triton is installed, else CUDA events around each call, in rounds until stable or out of time.
    """
    device = torch.device(device)
    max_run_time = max(10 * min_run_time, 1.0) if max_run_time is None else max_run_time
    for _ in range(warmup):
        fn()
    _sync(device)
    if device.type == "cuda":
        return _cuda_measure(fn, device, min_run_time, max_run_time)
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    m = timer.adaptive_autorange(threshold=STABLE_IQR, min_run_time=min_run_time, max_run_time=max_run_time)
    times = list(m.times)
    while len(times) < MIN_RUNS:  # slow calls reach the time limit first: quartiles need a few runs
        times += timer.timeit(m.number_per_run).times
    return _timing([t * 1e3 for t in times], "torch.utils.benchmark adaptive_autorange (per call, blocks of "
                                             f"{m.number_per_run})")


def interleaved(fns: dict[str, Callable[[], Any]], *, warmup: int = 1, min_run_time: float = 0.2,
                max_run_time: float | None = None, min_rounds: int = 6) -> dict[str, Timing]:
    """Time several functions on the CPU in *interleaved rounds*: each round times one block of calls of
    every function, in an order that rotates from round to round. What slows the machine down for a
    while (another program, a frequency change) then slows every function in the same rounds, so their
    comparison, round by round, holds where separately timed medians would not.

    Each function's block holds enough calls for about ``min_run_time / min_rounds`` seconds (at least
    one call; ``torch.utils.benchmark.Timer.timeit`` times it). Rounds go on until ``min_rounds`` are
    done and every function's IQR is within :data:`STABLE_IQR` of its median, or until ``max_run_time``
    (default: 10 × ``min_run_time``, at least 1 s) per function has passed; then the still-spread ones
    are not ``stable``. Each :class:`Timing` keeps its per-round times in ``rounds`` (round i of every
    function ran in the same stretch of time), which :func:`paired_order` compares."""
    from torch.utils import benchmark

    max_run_time = max(10 * min_run_time, 1.0) if max_run_time is None else max_run_time
    timers, number = {}, {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        timers[name] = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
        one = timers[name].timeit(1).median  # seconds for one call, to size the blocks
        number[name] = max(1, int(min_run_time / min_rounds / max(one, 1e-9)))
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    started = time.perf_counter()
    for round_ in range(10_000):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            times[name].append(timers[name].timeit(number[name]).median * 1e3)
        done = round_ + 1 >= max(min_rounds, MIN_RUNS)
        if done and (all(_timing(t, "").stable for t in times.values())
                     or time.perf_counter() - started > max_run_time * len(names)):
            break
    method = f"interleaved rounds of torch.utils.benchmark Timer.timeit blocks ({len(names)} functions)"
    return {name: replace(_timing(t, method), rounds=tuple(t)) for name, t in times.items()}


#: Paired rounds order two functions only when one is faster in so many rounds that a coin would do it
#: less than 5 % of the time (a two-sided sign test) *and* by at least 5 % in the median round: smaller
#: gaps shift with the kind of load a shared machine has (two runs disagreed on such gaps).
PAIRED_P, PAIRED_GAP = 0.05, 0.05


def paired_order(a: Timing, b: Timing) -> int:
    """-1 when ``a`` is measurably faster than ``b``, 1 when slower, 0 when the data cannot tell (a tie).

    With interleaved rounds of the same length (:func:`interleaved`), round i of both ran in the same
    stretch of time, so the rounds are compared pair by pair: one is faster only when it wins enough
    rounds for a sign test (:data:`PAIRED_P`) and its median per-round ratio is at least
    :data:`PAIRED_GAP` away from 1. Otherwise the two middle halves [q1, q3] are compared: overlapping
    means tied."""
    if a.rounds and len(a.rounds) == len(b.rounds) and len(a.rounds) >= MIN_RUNS:
        ratios = [x / y for x, y in zip(a.rounds, b.rounds) if x > 0 and y > 0]
        wins, losses = sum(r < 1 for r in ratios), sum(r > 1 for r in ratios)
        median = statistics.median(ratios) if ratios else 1.0
        if _sign_test(wins, losses) <= PAIRED_P and abs(median - 1) >= PAIRED_GAP:
            return -1 if median < 1 else 1
        return 0
    if a.overlaps(b):
        return 0
    return -1 if a.median < b.median else 1


def _sign_test(wins: int, losses: int) -> float:
    """Two-sided p-value of ``wins`` against ``losses`` if each round were a fair coin."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def time_ms(fn: Callable[[], Any], *, device: str | torch.device = "cpu", warmup: int = 2,
            repeats: int = 10, min_run_time: float = 0.2) -> float:
    """Median time of ``fn()`` in milliseconds, after ``warmup`` untimed calls: :func:`measure`'s median
    with its time limit at ``min_run_time`` (about that long, like ``blocked_autorange``; no repeats
    for stability — use :func:`measure` to get the spread).

    ``repeats`` is kept for callers of earlier versions; :func:`measure` decides how many runs it needs.
    """
    return measure(fn, device=device, warmup=warmup, min_run_time=min_run_time, max_run_time=min_run_time).median


def _cuda_measure(fn: Callable[[], Any], device: torch.device, min_run_time: float, max_run_time: float) -> Timing:
    try:
        from triton.testing import do_bench
    except Exception:  # noqa: BLE001 - Triton absent or broken: CUDA events do the same job
        do_bench = None
    if do_bench is not None:
        times: list[float] = []
        started = time.perf_counter()
        while True:  # do_bench times ~rep ms of calls, flushing the L2 cache before each
            times += [float(t) for t in do_bench(fn, warmup=25, rep=max(100, int(min_run_time * 1e3)),
                                                 return_mode="all")]
            result = _timing(times, "triton.testing.do_bench (L2 flushed before each call)")
            if result.stable or time.perf_counter() - started > max_run_time:
                return result
    times = []
    started = time.perf_counter()
    while True:
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        result = _timing(times, "CUDA events around each call")
        elapsed = time.perf_counter() - started
        if (result.stable and elapsed >= min_run_time) or elapsed > max_run_time:
            return result


_MATMUL_CACHE: dict[tuple[int, int, str], float] = {}


def cpu_matmul_flops(size: int = 2048, dtype: torch.dtype = torch.float32, *, min_run_time: float = 1.0) -> float:
    """This CPU's measured matrix-multiply throughput (FLOP/s) with the current number of torch threads:
    2·size³ FLOPs per (size × size) @ (size × size) product, over the 25th-percentile time (a roofline
    is what the machine *can* do, so the faster runs count). Measured once per process, size, thread
    count and dtype, for ``min_run_time`` to 2 × ``min_run_time`` seconds: the faster quarter of the runs
    needs no small spread, so a busy machine does not make it wait for one."""
    key = (size, torch.get_num_threads(), str(dtype))
    if key not in _MATMUL_CACHE:
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(size, size, generator=g).to(dtype) for _ in range(2))
        t = measure(lambda: a @ b, warmup=1, min_run_time=min_run_time, max_run_time=2 * min_run_time)
        _MATMUL_CACHE[key] = 2.0 * size**3 / (t.q1 * 1e-3)
    return _MATMUL_CACHE[key]


# ============================================================================ peak memory
@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Silence C++ log lines (the profiler's start/stop banner) by pointing file descriptor 2 away."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)  # a bare descriptor, closed at once: no file object left to finalise
    try:
        os.dup2(null, 2)
    finally:
        os.close(null)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _allocations_from_event_tree(prof: Any) -> list[tuple[int, int]]:
    """(time, signed size) of every CPU allocation event, from the profiler's event tree.

    The event tree's types live in the private ``torch._C._profiler``: imported here, lazily, so that a
    torch release that moves them breaks only this route (see :func:`_allocations`)."""
    from torch._C._profiler import _EventType

    sizes: list[tuple[int, int]] = []

    def walk(event: Any) -> None:
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            sizes.append((int(event.start_time_ns), int(event.extra_fields.alloc_size)))
        for child in event.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    return sizes


def _allocations_from_events(prof: Any) -> list[tuple[int, int]]:
    """The same from the flat event list (the ``[memory]`` records ``torch.autograd.profiler`` parses)."""
    sizes = []
    for event in prof.profiler.kineto_results.events():
        if event.name() == "[memory]" and "CPU" in str(event.device_type()):
            sizes.append((int(event.start_ns()), int(event.nbytes())))
    return sizes


def _allocations(prof: Any) -> list[tuple[int, int]] | None:
    """Allocation events of a finished profile, by the first route that works on this torch (or None)."""
    for route in (_allocations_from_event_tree, _allocations_from_events):
        try:
            return route(prof)
        except Exception:  # noqa: BLE001 - the profiler's internals moved: try the next route
            continue
    return None


def _cpu_peak_bytes(fn: Callable[[], Any]) -> int | None:
    from torch.profiler import ProfilerActivity, profile

    with _quiet_native_stderr():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = fn()
            del result
    sizes = _allocations(prof)
    if sizes is None:
        return None
    total = peak = 0
    for _, size in sorted(sizes):
        total += size
        peak = max(peak, total)
    return peak


def peak_memory_bytes(fn: Callable[[], Any], *, device: str | torch.device = "cpu") -> int | None:
    """Peak bytes allocated during ``fn()`` above what was allocated before it (the result included).

    CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``. CPU: the running
    total of PyTorch's allocation events recorded by the profiler (``profile_memory=True``).
    Returns None when it cannot be measured on this setup (another device type, or a torch whose
    profiler no longer exposes allocation events).
    """
    device = torch.device(device)
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        result = fn()
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        del result
        return int(peak)
    if device.type == "cpu":
        return _cpu_peak_bytes(fn)
    return None


def format_bytes(n: float | None) -> str:
    """1536 → '1.5 KiB' (binary units: KiB = 1024 B, MiB = 1024 KiB, …); None → 'n/a'."""
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns at TiB


# ============================================================================ where and how
def stamp(device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
          shapes: dict[str, Any] | None = None, *, when: bool = True) -> dict[str, Any]:
    """Where and how a measurement was taken: device model, dtype, shapes, library versions, time."""
    device = torch.device(device)
    info: dict[str, Any] = {
        "device": device_name(device),
        "device_type": device.type,
        "dtype": None if dtype is None else str(dtype).replace("torch.", ""),
        "shapes": shapes or {},
        "torch": torch.__version__,
        "triton": triton_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if device.type == "cuda":
        info["cuda"] = torch.version.cuda
        info["cudnn"] = torch.backends.cudnn.version()
        props = torch.cuda.get_device_properties(device)
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    if when:
        info["date"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return info


def describe_stamp(info: dict[str, Any]) -> str:
    """One line from a :func:`stamp`: device · torch (· CUDA) · triton · Python · date."""
    parts = [str(info.get("device", "?")), f"torch {info.get('torch', '?')}"]
    if info.get("cuda"):
        parts.append(f"CUDA {info['cuda']}")
    parts.append(f"triton {info['triton']}" if info.get("triton") else "no triton")
    parts.append(f"Python {info.get('python', '?')}")
    if info.get("date"):
        parts.append(str(info["date"])[:10])
    return " · ".join(parts)

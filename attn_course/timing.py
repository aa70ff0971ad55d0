"""Timing and peak-memory measurement for attention implementations, and a stamp saying where and how.

* :func:`time_ms` — median milliseconds of a call after warm-up. On a CUDA GPU it uses
  ``triton.testing.do_bench`` when Triton is installed, otherwise CUDA events around each repeat
  (the GPU runs asynchronously: wall-clock time without synchronising measures nothing). On the CPU
  it uses ``torch.utils.benchmark.Timer`` (which handles warm-up and thread settings).
* :func:`peak_memory_bytes` — the most memory a call held *on top of* what was allocated before it.
  On CUDA: ``torch.cuda.max_memory_allocated`` (the caching allocator's exact peak of live tensor
  bytes). On the CPU: PyTorch's profiler with ``profile_memory=True``, which records every allocation
  and free made through PyTorch's CPU allocator (including buffers allocated inside operators); the
  peak of their running total is reported. Python's ``tracemalloc`` cannot do this: PyTorch allocates
  tensor memory in C++, outside the Python allocator, so tracemalloc sees none of it.
* :func:`stamp` — device, dtype, shapes and library versions, to print next to every result.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import statistics
import sys
from typing import Any, Callable

import torch

__all__ = ["time_ms", "peak_memory_bytes", "stamp", "device_name", "triton_version", "format_bytes"]


def triton_version() -> str | None:
    """Triton's version when it is installed, else None (Triton is optional in this course)."""
    try:
        import triton
    except Exception:
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
    return f"CPU: {name} ({os.cpu_count()} logical cores, {torch.get_num_threads()} torch threads)"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], Any], *, device: str | torch.device = "cpu", warmup: int = 2,
            repeats: int = 10, min_run_time: float = 0.2) -> float:
    """Median time of ``fn()`` in milliseconds, after ``warmup`` untimed calls.

    CPU: ``torch.utils.benchmark.Timer.blocked_autorange`` (runs at least ``min_run_time`` seconds,
    reports the median per call). CUDA: ``triton.testing.do_bench`` (median) when Triton is present,
    else ``repeats`` pairs of CUDA events recorded around each call, median.
    """
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    _sync(device)
    if device.type == "cuda":
        try:
            from triton.testing import do_bench
        except Exception:
            do_bench = None
        if do_bench is not None:
            return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return float(statistics.median(times))
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return float(timer.blocked_autorange(min_run_time=min_run_time).median * 1e3)


@contextlib.contextmanager
def _quiet_native_stderr():
    """Silence C++ log lines (the profiler's start/stop banner) by pointing file descriptor 2 away."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _cpu_peak_bytes(fn: Callable[[], Any]) -> int | None:
    from torch.profiler import ProfilerActivity, profile

    with _quiet_native_stderr():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = fn()
        del result
    try:  # every allocation event, in order, with its signed size
        from torch._C._profiler import _EventType

        sizes: list[tuple[int, int]] = []

        def walk(event: Any) -> None:
            if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
                sizes.append((event.start_time_ns, int(event.extra_fields.alloc_size)))
            for child in event.children:
                walk(child)

        for root in prof.profiler.kineto_results.experimental_event_tree():
            walk(root)
    except Exception:  # the profiler's internals moved: say "not measured" rather than guess
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
    Returns None when it cannot be measured on this setup.
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
    """1536 → '1.5 KiB'; None → 'n/a'."""
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


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

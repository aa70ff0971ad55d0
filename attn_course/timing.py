"""Timing and peak memory, the one way every notebook and tool of the course measures them (notebooks
05, 09 and 10, the ``bench`` command), and a stamp saying where and how a measurement was taken.

* :func:`time_ms` — median milliseconds of a call after warm-up. On a CUDA GPU: ``triton.testing.do_bench``
  when Triton is installed, otherwise CUDA events around each repeat (a GPU runs asynchronously:
  wall-clock time without synchronising measures nothing). On the CPU: ``torch.utils.benchmark.Timer``
  (which handles warm-up and thread settings).
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
import datetime as _dt
import os
import platform
import statistics
import sys
from typing import Any, Callable, Iterator

import torch

__all__ = ["time_ms", "peak_memory_bytes", "stamp", "describe_stamp", "device_name", "triton_version",
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
    return f"CPU: {name} ({os.cpu_count()} logical cores, {torch.get_num_threads()} torch threads)"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ============================================================================ time
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
        return _cuda_time_ms(fn, repeats)
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return float(timer.blocked_autorange(min_run_time=min_run_time).median * 1e3)


def _cuda_time_ms(fn: Callable[[], Any], repeats: int) -> float:
    try:
        from triton.testing import do_bench
    except Exception:  # noqa: BLE001 - Triton absent or broken: CUDA events do the same job
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
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
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

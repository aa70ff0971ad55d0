"""attn_course.timing: the one timing and peak-memory path (CPU here; the CUDA paths are exercised by the
bench on a GPU), its fallbacks when the profiler's internals move, and the stamp."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from attn_course import timing


def test_time_ms_is_a_positive_median():
    x = torch.randn(64, 64)
    assert 0 < timing.time_ms(lambda: x @ x, min_run_time=0.01) < 1000


def _allocate_twice(size: int):
    def allocate():
        a = torch.ones(size // 4)  # size bytes of float32
        b = a * 2  # as many again while a is alive
        return b.sum()

    return allocate


def test_peak_memory_sees_torch_allocations():
    size = 4 * 2**20
    peak = timing.peak_memory_bytes(_allocate_twice(size))
    assert peak is not None, "torch 2.5–2.13 expose allocation events: the CPU peak must be measurable"
    assert 2 * size <= peak < 2 * size + 2**20


def test_when_the_event_tree_moves_the_flat_events_still_give_the_peak(monkeypatch):
    broken = types.ModuleType("torch._C._profiler")  # no _EventType any more
    monkeypatch.setitem(sys.modules, "torch._C._profiler", broken)
    size = 4 * 2**20
    peak = timing.peak_memory_bytes(_allocate_twice(size))
    assert peak is not None and 2 * size <= peak < 2 * size + 2**20


def test_when_no_route_works_memory_is_not_measured_rather_than_guessed(monkeypatch):
    def fail(prof):
        raise AttributeError("moved")

    monkeypatch.setattr(timing, "_allocations_from_event_tree", fail)
    monkeypatch.setattr(timing, "_allocations_from_events", fail)
    assert timing.peak_memory_bytes(_allocate_twice(2**20)) is None
    assert timing.peak_memory_bytes(lambda: None, device="meta") is None


def test_format_bytes_uses_binary_units():
    assert timing.format_bytes(1536) == "1.5 KiB"
    assert timing.format_bytes(3 * 2**30) == "3.0 GiB"
    assert timing.format_bytes(512) == "512 B"
    assert timing.format_bytes(None) == "n/a"


def test_stamp_says_where_and_how():
    s = timing.stamp("cpu", torch.float32, {"n": 8})
    assert s["device"].startswith("CPU") and s["dtype"] == "float32" and s["shapes"] == {"n": 8}
    assert s["torch"] == torch.__version__ and s["python"] and s["date"]
    line = timing.describe_stamp(s)
    assert line.startswith("CPU") and f"torch {torch.__version__}" in line and s["date"][:10] in line
    assert "no triton" in line or "triton " in line
    assert "date" not in timing.stamp("cpu", when=False)


def test_measure_reports_the_spread_and_whether_it_settled():
    x = torch.randn(32, 32)
    t = timing.measure(lambda: x @ x, min_run_time=0.01, max_run_time=0.2)
    assert t.runs >= timing.MIN_RUNS and 0 < t.q1 <= t.median <= t.q3
    assert t.stable == (t.iqr <= timing.STABLE_IQR * t.median) and "adaptive_autorange" in t.method


def test_stability_and_ties_follow_the_quartiles():
    steady = timing._timing([1.0, 1.01, 0.99, 1.0, 1.02], "test")
    shaky = timing._timing([1.0, 2.0, 0.5, 3.0, 1.0], "test")
    too_few = timing._timing([1.0, 1.0, 1.0], "test")
    assert steady.stable and not shaky.stable and not too_few.stable  # fewer than MIN_RUNS runs: not trusted
    assert steady.overlaps(shaky) and not steady.overlaps(timing._timing([2.0, 2.1, 2.05, 2.0], "test"))
    assert steady.relative_spread == pytest.approx(steady.iqr / steady.median)


def test_slow_calls_still_get_enough_runs_for_quartiles():
    import time

    t = timing.measure(lambda: time.sleep(0.03), warmup=0, min_run_time=0.01, max_run_time=0.05)
    assert t.runs >= timing.MIN_RUNS and t.median >= 30


def test_cpu_roofline_is_a_measured_matmul(monkeypatch):
    monkeypatch.setattr(timing, "_MATMUL_CACHE", {})
    flops = timing.cpu_matmul_flops(64, min_run_time=0.01)
    assert flops > 0 and timing.cpu_matmul_flops(64, min_run_time=0.01) == flops  # measured once, then kept

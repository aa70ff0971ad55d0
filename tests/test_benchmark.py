"""attn_course.benchmark: the sweep checks before it times, refuses wrong implementations (forward and
gradients), turns out-of-memory into a result, lets an implementation bring its own backward, reports
every time with its spread and calls overlapping spreads a tie, compares CPU throughput with this
machine's own matmul, and its figure is readable. Everything runs on the CPU in seconds."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course import benchmark, fast
from attn_course.plots import readability_problems


@pytest.fixture(autouse=True)
def small_roofline(monkeypatch):
    """The CPU roofline from a 128 × 128 matmul: the same code path as the 2048 × 2048 one, in milliseconds."""
    monkeypatch.setattr(benchmark, "CPU_ROOFLINE_SIZE", 128)  # the cap on roofline_size


def tiny(**over) -> benchmark.BenchOptions:
    values = dict(ns=[32, 64], head_dims=[16], impls=["naive", "tiled", "sdpa-math", "sdpa-flash"], tokens=64,
                  hidden=32, tiled_block=16, min_run_time=0.005, max_run_time=0.05, max_memory=1e9)
    values.update(over)
    return benchmark.BenchOptions(**values)


def quiet(line: str) -> None:
    pass


def test_options_have_defaults_and_refuse_nonsense():
    defaults = benchmark.BenchOptions()
    assert defaults.device == "cpu" and defaults.modes == ["fwd"] and defaults.causal == [False, True]
    assert benchmark.BenchOptions(ns=[64]).ns == [64]  # pass only what changes
    for bad in (dict(ns=[]), dict(ns=[0]), dict(dtypes=["float8"]), dict(modes=["bwd"]), dict(tiled_block=0),
                dict(ns=64)):
        with pytest.raises(ValueError):
            benchmark.BenchOptions(**bad)


def test_presets_for_the_command_line():
    quick = benchmark.BenchOptions.preset("cpu", quick=True)
    assert quick.ns == [256, 512, 1024] and quick.head_dims == [64] and quick.modes == ["fwd"]
    assert "compile" not in quick.impls and quick.dtypes == ["float32"]
    full_gpu = benchmark.BenchOptions.preset("cuda", quick=False)
    assert full_gpu.dtypes == ["float16", "bfloat16"] and full_gpu.modes == ["fwd", "fwd+bwd"]
    assert max(full_gpu.ns) == 16384 and full_gpu.tokens == 16384 and "compile" in full_gpu.impls
    assert full_gpu.max_run_time is None  # a GPU's limit: 10 × min_run_time, as before
    # the CPU's default is bounded: 32 points with B·n fixed, 1 s of timed runs at most per measurement,
    # torch.compile opt-in (it compiles afresh at every point)
    full_cpu = benchmark.BenchOptions.preset("cpu")
    assert full_cpu.dtypes == ["float32"] and full_cpu.modes == ["fwd", "fwd+bwd"] and full_cpu.head_dims == [64, 128]
    assert "compile" not in full_cpu.impls and set(benchmark.CPU_OPT_IN) == {"compile"}
    assert full_cpu.max_run_time == 1.0 and max(full_cpu.ns) <= full_cpu.tokens  # B = tokens // n ≥ 1: B·n held
    assert len(benchmark.configs(full_cpu)) == 32


def test_sweep_keeps_tokens_and_width_fixed():
    points = benchmark.configs(tiny(ns=[16, 32, 64], head_dims=[8, 16]))
    assert {(c.n * c.batch, c.heads * c.head_dim) for c in points} == {(64, 32)}
    assert len(points) == 3 * 2 * 2  # n × head dims × causal


@pytest.mark.slow
def test_every_implementation_is_checked_and_timed():
    impls = ["naive", "tiled", "sdpa-math", "sdpa-flash", "sdpa-cudnn"]
    results, info = benchmark.run_sweep(tiny(impls=impls), progress=False, log=quiet)
    assert {r.status for r in results} == {"ok"}
    for r in results:
        flops = fast.attention_flops(r.batch, r.heads, r.n, r.head_dim, causal=r.causal)
        assert r.tflops == pytest.approx(flops / (r.ms * 1e-3) / 1e12)
        assert r.peak_memory_bytes is not None and r.peak_memory_bytes > 0 and r.max_abs_error < 2e-4
        assert r.ms_q1 <= r.ms <= r.ms_q3 and r.runs >= 4 and isinstance(r.stable, bool)  # the spread
        assert r.stable == (r.ms_q3 - r.ms_q1 <= 0.10 * r.ms)  # with at least 4 runs
        assert r.pct_of_peak == pytest.approx(100 * r.tflops / info["peak_tflops"]["float32"])
    # the CPU's roofline is this machine's measured matmul, named in the stamp
    assert info["peak_tflops"]["float32"] > 0 and "measured float32 matmul (128×128" in info["peak_source"]
    assert "sdpa-cudnn (float32)" in info["not_measured"]  # no such backend on a CPU: said, not hidden
    for key in ("device", "torch", "python", "shapes", "flops", "memory", "correctness", "date", "options", "timing",
                "threads"):
        assert key in info


def _wrong(q, k, v, causal):
    return fast.naive_attention(q, k, v, causal=causal, scale=1.0)


def test_a_wrong_implementation_is_refused_not_timed(monkeypatch):
    wrong = benchmark.Impl("wrong", _wrong)
    real = benchmark.implementations
    monkeypatch.setattr(benchmark, "implementations", lambda *a, **kw: (real(*a, **kw)[0] + [wrong], {}))
    lines = []
    results, _ = benchmark.run_sweep(tiny(impls=["naive"]), progress=False, log=lines.append)
    rows = [r for r in results if r.impl == "wrong"]
    assert rows and all(r.status == "WRONG" and r.ms is None and "not timed" in r.note for r in rows)
    assert all(r.status == "ok" for r in results if r.impl == "naive")
    assert any(line.startswith("wrong: WRONG at n=32") for line in lines)


class _BadBackward(torch.autograd.Function):
    """Right forward, gradients off by a factor of 2."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return fast.naive_attention(q, k, v)

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            q2, k2, v2 = (t.detach().requires_grad_(True) for t in (q, k, v))
            grads = torch.autograd.grad(fast.naive_attention(q2, k2, v2), (q2, k2, v2), dout)
        return tuple(2 * g for g in grads)


@pytest.mark.slow
def test_forward_and_backward_mode_checks_gradients_and_uses_an_implementations_own_backward(monkeypatch):
    own = benchmark.Impl("own-backward", lambda q, k, v, causal: fast.naive_attention(q, k, v),
                         differentiable=lambda q, k, v, causal: _BadBackward.apply(q, k, v))
    forward_only = benchmark.Impl("forward-only", lambda q, k, v, causal: fast.naive_attention(q, k, v),
                                  differentiable=None)
    real = benchmark.implementations
    monkeypatch.setattr(benchmark, "implementations",
                        lambda *a, **kw: (real(*a, **kw)[0] + [own, forward_only], {}))
    results, _ = benchmark.run_sweep(tiny(impls=["naive", "tiled"], causal=[False], modes=["fwd", "fwd+bwd"]),
                                     progress=False, log=quiet)
    status = {(r.impl, r.mode): r for r in results if r.n == 32}
    assert status[("naive", "fwd+bwd")].status == "ok"
    tiled = status[("tiled", "fwd+bwd")]
    assert tiled.status == "ok" and tiled.ms > 0  # notebook 10's tiled backward, through flash_attention
    assert status[("own-backward", "fwd")].status == "ok"
    bad = status[("own-backward", "fwd+bwd")]
    assert bad.status == "WRONG" and "dq" in bad.note and "not timed" in bad.note
    assert status[("forward-only", "fwd+bwd")].status == "unsupported"
    flops = fast.attention_flops(tiled.batch, tiled.heads, tiled.n, tiled.head_dim, backward=True)
    assert tiled.tflops == pytest.approx(flops / (tiled.ms * 1e-3) / 1e12)


@pytest.mark.slow
def test_tiled_backward_uses_far_less_memory_than_autograd_through_the_naive_version():
    results, _ = benchmark.run_sweep(tiny(ns=[512], impls=["naive", "tiled"], causal=[False], modes=["fwd+bwd"],
                                          tokens=512, hidden=16, tiled_block=64), progress=False, log=quiet)
    peak = {r.impl: r.peak_memory_bytes for r in results}
    assert peak["tiled"] * 4 < peak["naive"]


def test_out_of_memory_is_a_result(monkeypatch):
    def hungry(q, k, v, causal):
        if q.shape[-2] >= 64:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64 GiB")
        return fast.naive_attention(q, k, v, causal=causal)

    monkeypatch.setattr(benchmark, "implementations", lambda *a, **kw: ([benchmark.Impl("hungry", hungry)], {}))
    lines = []
    results, _ = benchmark.run_sweep(tiny(ns=[32, 64, 128], causal=[False]), progress=False, log=lines.append)
    status = {r.n: (r.status, r.note) for r in results}
    assert status[32][0] == "ok"
    assert status[64] == ("OOM", "OOM at n=64")
    assert status[128] == ("skipped", "already OOM at n=64")
    assert any(line.startswith("hungry: OOM at n=64") for line in lines)


def test_other_failures_are_rows_too(monkeypatch):
    def broken(q, k, v, causal):
        raise ValueError("no such thing")

    monkeypatch.setattr(benchmark, "implementations", lambda *a, **kw: ([benchmark.Impl("broken", broken)], {}))
    results, _ = benchmark.run_sweep(tiny(ns=[32], causal=[False]), progress=False, log=quiet)
    assert [(r.status, r.note) for r in results] == [("error", "ValueError: no such thing")]


def test_cpu_memory_guard_skips_instead_of_thrashing():
    results, _ = benchmark.run_sweep(tiny(impls=["naive", "tiled"], max_memory=1000), progress=False, log=quiet)
    naive = [r for r in results if r.impl == "naive"]
    assert naive and all(r.status == "skipped" and "max_memory" in r.note for r in naive)
    assert all(r.status == "ok" for r in results if r.impl == "tiled")


def test_unknown_and_unavailable_implementations_say_why():
    found, missing = benchmark.implementations(["naive", "nonsense", "triton", "sdpa-efficient"], "cpu", torch.float32)
    assert [impl.name for impl in found] == ["naive"]
    assert "unknown implementation" in missing["nonsense"]
    assert "CUDA" in missing["triton"] and "EFFICIENT_ATTENTION" in missing["sdpa-efficient"]


@pytest.mark.parametrize("autograd_up_to", [2048, 8])  # autograd through SDPA, or the tiled backward beyond
def test_reference_is_float64_and_gives_gradients(autograd_up_to, monkeypatch):
    monkeypatch.setattr(benchmark, "AUTOGRAD_REFERENCE_MAX_N", autograd_up_to)
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(2, 3, 40, 8, generator=g) for _ in range(4))
    out, grads = benchmark.reference(q, k, v, True, dout)
    assert out.dtype == torch.float64 and out.shape == (2, 40, 8)
    q0, k0, v0 = (t[0, :2].double().requires_grad_(True) for t in (q, k, v))
    expected = torch.nn.functional.scaled_dot_product_attention(q0, k0, v0, is_causal=True)
    assert torch.allclose(out, expected, atol=1e-12)
    for got, want in zip(grads, torch.autograd.grad(expected, (q0, k0, v0), dout[0, :2].double())):
        assert torch.allclose(got, want, atol=1e-10)


@pytest.mark.slow
def test_results_table_and_figure():
    results, info = benchmark.run_sweep(tiny(ns=[32, 64, 128], impls=["naive", "tiled"]), progress=False, log=quiet)
    table = benchmark.results_table(results)
    assert table.splitlines()[0].split()[:3] == ["impl", "dtype", "n"] and "naive" in table
    assert max(len(line) for line in benchmark.results_table(results, max_width=120).splitlines()) <= 120
    fig = benchmark.plot_results(results, info)
    assert readability_problems(fig) == []
    assert fig.axes[0].get_ylabel() == "median time (ms)"
    assert "B·n = 64 tokens, A·d_k = 32 held fixed" in fig._suptitle.get_text()
    assert benchmark.plot_results(results, info, mode="fwd+bwd") is None  # nothing measured in that mode
    two_dims, info2 = benchmark.run_sweep(tiny(ns=[32], head_dims=[8, 16], impls=["naive"]), progress=False, log=quiet)
    assert readability_problems(benchmark.plot_results(two_dims, info2)) == []
    # Rows of another run at other sizes (a recorded GPU's notebook cell beside its sweep) are not joined
    # to the sweep's lines: the figure draws the sweep and says how many table rows it leaves out.
    other, _ = benchmark.run_sweep(tiny(ns=[64], impls=["naive"], tokens=256), progress=False, log=quiet)
    fig = benchmark.plot_results(results + other, info)
    title = fig._suptitle.get_text()
    # n = 128 > B·n = 64 tokens: there B is 1, so those rows hold 128 tokens, not 64, and are not drawn either
    apart = len(other) + sum(r.status == "ok" and r.mode == "fwd" and r.n == 128 for r in results)
    assert "B·n = 64 tokens, A·d_k = 32 held fixed" in title and f"{apart} measurements at other sizes" in title
    assert {x for line in fig.axes[0].lines for x in line.get_xdata()} == {32, 64}


def test_recorded_results_are_found(tmp_path):
    from attn_course.tools.tables import write_json

    results, info = benchmark.run_sweep(tiny(ns=[32], causal=[False], impls=["naive"]), progress=False, log=quiet)
    write_json(tmp_path / "some-gpu" / "attention-bench.json", {"stamp": info, "results": results})
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "attention-bench.json").write_text("{not json", encoding="utf-8")
    (found_path, data), = benchmark.load_recorded(tmp_path)
    assert found_path.parent.name == "some-gpu" and data["results"][0]["impl"] == "naive"
    assert benchmark.plot_results(data["results"], data["stamp"]) is not None
    assert "naive" in benchmark.results_table(data["results"])
    assert benchmark.load_recorded(tmp_path / "nowhere") == []


@pytest.mark.slow  # a first torch.compile generates and builds C++: tens of seconds on a busy CPU
def test_torch_compile_reports_its_compile_time_separately():
    results, _ = benchmark.run_sweep(tiny(ns=[64], causal=[False], impls=["compile"]), progress=False, log=quiet)
    (r,) = results
    if r.status != "ok":
        pytest.skip(f"torch.compile does not work on this machine: {r.note}")
    assert r.compile_s is not None and r.compile_s > r.ms / 1e3
    assert r.max_abs_error < 2e-4
    assert not math.isnan(r.ms)


def _row(impl, ms, q1, q3, n=64, **over):
    row = dict(impl=impl, device="cpu", dtype="float32", batch=1, heads=1, n=n, head_dim=16, causal=False,
               mode="fwd", status="ok", ms=ms, tflops=1e-3, pct_of_peak=None, peak_memory_bytes=None, compile_s=None,
               max_abs_error=0.0, note="", ms_q1=q1, ms_q3=q3, runs=10, stable=(q3 - q1) <= 0.1 * ms)
    row.update(over)
    return row


def test_overlapping_spreads_are_ties_not_ranks():
    rows = [_row("a", 1.0, 0.95, 1.05), _row("b", 1.04, 1.0, 1.08), _row("c", 2.0, 1.9, 2.1),
            _row("d", 5.0, 4.9, 5.1, status="WRONG")]
    assert benchmark.rankings(rows) == {("float32", 16, 1, 1, False, "fwd", 64): [["a", "b"], ["c"]]}
    table = benchmark.results_table(rows)
    ranks = {line.split()[0]: line.split()[9] for line in table.splitlines()[2:]}  # no "% peak", "1st call s"
    assert ranks["a"] == ranks["b"] == "=1" and ranks["c"] == "3" and ranks["d"] == "—"
    assert "GFLOP/s" in table.splitlines()[0] and "TFLOP/s" not in table  # a CPU's units
    assert "1.0" in table.splitlines()[2].split()[10]  # 1e-3 TFLOP/s shown as 1.00 GFLOP/s
    gpu = benchmark.results_table([_row("a", 1.0, 0.95, 1.05, device="cuda", tflops=123.4)])
    assert "TFLOP/s" in gpu.splitlines()[0] and "123.4" in gpu


def test_two_runs_disagree_only_outside_their_spreads():
    first = [_row("a", 1.0, 0.95, 1.05), _row("b", 2.0, 1.9, 2.1)]
    swapped = [_row("a", 2.0, 1.9, 2.1), _row("b", 1.0, 0.95, 1.05)]
    tied = [_row("a", 1.5, 1.0, 2.0), _row("b", 1.4, 1.2, 1.6)]
    assert benchmark.ranking_disagreements(first, first) == []
    assert benchmark.ranking_disagreements(first, tied) == []  # b ahead of a, but within the spread: a tie
    (line,) = benchmark.ranking_disagreements(first, swapped)
    assert line == "float32 d=16 n=64 full fwd: a < b in the first run, b < a in the second"


def test_an_unstable_measurement_says_so(monkeypatch):
    from attn_course import timing

    shaky = timing.Timing(median=1.0, q1=0.5, q3=2.0, runs=5, stable=False, method="test")
    monkeypatch.setattr(timing, "interleaved", lambda fns, **kw: {name: shaky for name in fns})
    results, _ = benchmark.run_sweep(tiny(ns=[32], causal=[False], impls=["naive"]), progress=False, log=quiet)
    (r,) = results
    assert r.status == "ok" and r.stable is False and r.note.startswith("unstable: IQR 150% of the median after 5 runs")
    table = benchmark.results_table(results)
    assert "150%!" in table and "unstable" in table


def test_a_cpu_sweep_runs_on_one_thread_whatever_the_load_and_says_when_the_machine_is_busy(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(benchmark.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(benchmark.os, "getloadavg", lambda: (1.2, 0.0, 0.0))  # more than one of 2 cores taken
    assert "load average 1.2 on 2 cores" in benchmark._busy_note(cpu) and "interleaved" in benchmark._busy_note(cpu)
    assert benchmark._busy_note(gpu) is None  # a GPU's timing does not depend on the CPU's load
    monkeypatch.setattr(benchmark.os, "getloadavg", lambda: (0.9, 0.0, 0.0))
    assert benchmark._busy_note(cpu) is None
    seen = []
    monkeypatch.setattr(benchmark, "_sweep", lambda *a: seen.append(torch.get_num_threads()) or ([], {}))
    before = torch.get_num_threads()
    for load in (0.0, 1.9):  # the same thread count on a quiet and on a busy machine
        monkeypatch.setattr(benchmark.os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        benchmark.run_sweep(tiny(), progress=False, log=quiet)
    benchmark.run_sweep(tiny(threads=2), progress=False, log=quiet)
    assert seen == [benchmark.CPU_THREADS, benchmark.CPU_THREADS, 2] and torch.get_num_threads() == before


def test_a_cpu_point_times_its_implementations_in_the_same_interleaved_rounds():
    results, _ = benchmark.run_sweep(tiny(ns=[32], causal=[False], impls=["naive", "tiled"], min_run_time=0.01,
                                          max_run_time=0.05), progress=False, log=quiet)
    naive, tiled = results
    assert naive.status == tiled.status == "ok"
    assert len(naive.rounds_ms) == len(tiled.rounds_ms) >= 6 and naive.runs == len(naive.rounds_ms)
    assert naive.ms_q1 <= naive.ms <= naive.ms_q3 and tiled.ms_q1 <= tiled.ms <= tiled.ms_q3


def test_paired_rounds_rank_what_overlapping_spreads_cannot():
    from attn_course import timing

    drift = [1.0, 3.0, 1.2, 2.8, 1.1, 3.1]  # a machine whose speed swings from round to round
    a = timing.Timing(2.0, 1.1, 2.9, 6, False, "", tuple(drift))
    b = timing.Timing(2.2, 1.2, 3.1, 6, False, "", tuple(1.1 * t for t in drift))  # 10 % slower in every round
    noisy = timing.Timing(2.1, 1.1, 3.0, 6, False, "", (1.1, 2.8, 1.1, 3.0, 1.3, 2.9))  # ahead in 1 round of 6
    close = timing.Timing(2.0, 1.1, 2.9, 6, False, "", tuple(1.02 * t for t in drift))  # 2 % slower every round
    assert a.overlaps(b) and timing.paired_order(a, b) == -1 and timing.paired_order(b, a) == 1
    assert timing.paired_order(a, noisy) == 0  # 5 wins of 6: a coin does that 22 % of the time
    assert timing.paired_order(a, close) == 0  # consistent, but a gap this small shifts with the load
    five = timing.Timing(2.0, 1.1, 2.9, 5, False, "", tuple(drift[:5]))
    assert timing.paired_order(five, timing.Timing(2.2, 1.2, 3.1, 5, False, "", tuple(2 * t for t in drift[:5]))) == 0
    rows = [dict(_row("a", 2.0, 1.1, 2.9), rounds_ms=list(a.rounds)),
            dict(_row("b", 2.2, 1.2, 3.1), rounds_ms=list(b.rounds))]
    assert benchmark.rankings(rows) == {("float32", 16, 1, 1, False, "fwd", 64): [["a"], ["b"]]}
    assert benchmark.rankings([dict(r, rounds_ms=None) for r in rows]) == {
        ("float32", 16, 1, 1, False, "fwd", 64): [["a", "b"]]}  # without rounds: overlapping spreads tie


def test_the_progress_forecast_weighs_points_by_their_work():
    options = tiny(ns=[256, 1024], min_run_time=0.0)
    small, large = (benchmark.Config(n, 16, 1, 1, "float32", False, "fwd") for n in (256, 1024))
    ratio = benchmark._work_seconds(large, 1e10, options) / benchmark._work_seconds(small, 1e10, options)
    assert ratio == pytest.approx(16)  # n² work: four times the length, sixteen times the forecast


def test_learner_runtime_never_imports_the_tools():
    import ast
    from pathlib import Path

    for module in ("benchmark", "timing", "datasheet", "results", "tables", "triton_attention"):
        tree = ast.parse(Path(benchmark.__file__).with_name(f"{module}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith(("tools", "attn_course.tools")), (module, node.module)

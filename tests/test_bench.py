"""`python -m attn_course bench` and the timing helpers: the sweep checks before it times, refuses wrong
implementations, turns out-of-memory into a result, writes stamped CSV/JSON/PNG, and measures memory
honestly. Everything here runs on the CPU in a few seconds."""

import csv
import json

import pytest
import torch

from attn_course import bench, fast, timing


def tiny(tmp_path, **over):
    values = dict(device="cpu", ns=[32, 64], head_dims=[16], dtypes=["float32"], causal=[False, True], modes=["fwd"],
                  impls=["naive", "tiled", "sdpa-math", "sdpa-flash"], tokens=64, hidden=32, tiled_block=16,
                  min_run_time=0.005, max_memory=1e9, out=str(tmp_path), warmup=1)
    values.update(over)
    return bench.Settings(**values)


def test_help_names_the_command(capsys):
    with pytest.raises(SystemExit) as info:
        bench.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m attn_course bench") and "--quick" in out and "--out" in out


def test_the_course_cli_reaches_bench(capsys):
    from attn_course.__main__ import main

    with pytest.raises(SystemExit):
        main(["bench", "--", "--help"])
    assert "python -m attn_course bench" in capsys.readouterr().out


def test_cli_writes_stamped_csv_json_and_plot(tmp_path, capsys):
    code = bench.main(["--n", "32", "64", "--head-dims", "16", "--tokens", "64", "--hidden", "32",
                       "--impls", "naive", "tiled", "sdpa-math", "--min-run-time", "0.005", "--no-progress",
                       "--out", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "naive" in printed and "wrote" in printed
    rows = list(csv.DictReader((tmp_path / "attention-bench.csv").open()))
    assert len(rows) == 2 * 2 * 2 * 3  # N × causal × modes (fwd, fwd+bwd) × implementations
    data = json.loads((tmp_path / "attention-bench.json").read_text())
    stamp = data["stamp"]
    for key in ("device", "torch", "python", "shapes", "flops", "memory", "correctness", "date"):
        assert key in stamp
    assert (tmp_path / "attention-bench.png").stat().st_size > 1000
    ok = [r for r in data["results"] if r["status"] == "ok"]
    assert ok and all(r["ms"] > 0 and r["tflops"] > 0 and r["max_abs_error"] < 2e-4 for r in ok)
    tiled_bwd = [r for r in data["results"] if r["impl"] == "tiled" and r["mode"] == "fwd+bwd"]
    assert tiled_bwd and all(r["status"] == "unsupported" for r in tiled_bwd)


def test_sweep_keeps_tokens_and_width_fixed(tmp_path):
    points = bench.configs(tiny(tmp_path, ns=[16, 32, 64], head_dims=[8, 16]))
    assert {(c.n * c.batch, c.heads * c.head_dim) for c in points} == {(64, 32)}


def test_every_implementation_is_checked_and_timed(tmp_path):
    impls = ["naive", "tiled", "sdpa-math", "sdpa-flash", "sdpa-cudnn"]
    results, info = bench.run_sweep(tiny(tmp_path, impls=impls), progress=False, log=lambda line: None)
    assert {r.status for r in results} == {"ok"}
    for r in results:
        flops = fast.attention_flops(r.batch, r.heads, r.n, r.head_dim, causal=r.causal)
        assert r.tflops == pytest.approx(flops / (r.ms * 1e-3) / 1e12)
        assert r.peak_memory_bytes is not None and r.peak_memory_bytes > 0
        assert r.pct_of_peak is None  # no datasheet peak for a CPU
    assert "sdpa-cudnn (float32)" in info["not_measured"]  # no such backend on a CPU: said, not hidden


def test_a_wrong_implementation_is_refused_not_timed(tmp_path, monkeypatch):
    wrong = bench.Impl("wrong", lambda q, k, v, causal: fast.naive_attention(q, k, v, causal=causal, scale=1.0))
    real = bench.implementations
    monkeypatch.setattr(bench, "implementations",
                        lambda *a, **kw: (real(*a, **kw)[0] + [wrong], {}))
    results, _ = bench.run_sweep(tiny(tmp_path, impls=["naive"]), progress=False, log=lambda line: None)
    rows = [r for r in results if r.impl == "wrong"]
    assert rows and all(r.status == "WRONG" and r.ms is None and "not timed" in r.note for r in rows)
    assert all(r.status == "ok" for r in results if r.impl == "naive")


def test_out_of_memory_is_a_result(tmp_path, monkeypatch, capsys):
    def hungry(q, k, v, causal):
        if q.shape[-2] >= 64:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64 GiB")
        return fast.naive_attention(q, k, v, causal=causal)

    monkeypatch.setattr(bench, "implementations", lambda *a, **kw: ([bench.Impl("hungry", hungry)], {}))
    results, _ = bench.run_sweep(tiny(tmp_path, ns=[32, 64, 128], causal=[False]), progress=False,
                                 log=lambda line: None)
    status = {r.n: (r.status, r.note) for r in results}
    assert status[32][0] == "ok"
    assert status[64] == ("OOM", "OOM at N=64")
    assert status[128] == ("skipped", "already OOM at N=64")
    captured = capsys.readouterr()
    assert "hungry: OOM at N=64" in captured.out + captured.err


def test_cpu_memory_guard_skips_instead_of_thrashing(tmp_path):
    results, _ = bench.run_sweep(tiny(tmp_path, impls=["naive", "tiled"], max_memory=1000), progress=False,
                                 log=lambda line: None)
    naive = [r for r in results if r.impl == "naive"]
    assert naive and all(r.status == "skipped" and "--max-memory" in r.note for r in naive)
    assert all(r.status == "ok" for r in results if r.impl == "tiled")


def test_torch_compile_reports_its_compile_time_separately(tmp_path):
    results, _ = bench.run_sweep(tiny(tmp_path, ns=[64], causal=[False], impls=["compile"]), progress=False,
                                 log=lambda line: None)
    (r,) = results
    if r.status != "ok":
        pytest.skip(f"torch.compile does not work on this machine: {r.note}")
    assert r.compile_s is not None and r.compile_s > r.ms / 1e3
    assert r.max_abs_error < 2e-4


def test_quick_settings_are_small():
    s = bench.settings_from_args(bench.build_parser().parse_args(["--quick", "--device", "cpu"]))
    assert s.ns == [256, 512, 1024] and s.head_dims == [64] and s.modes == ["fwd"] and "compile" not in s.impls
    assert s.dtypes == ["float32"]


@pytest.mark.parametrize("name, dtype, peak", [
    ("NVIDIA H100 80GB HBM3", torch.float16, 989.4),
    ("NVIDIA H100 PCIe", torch.bfloat16, 756.0),
    ("NVIDIA H100 NVL", torch.float16, 835.0),
    ("NVIDIA H200", torch.bfloat16, 989.4),
    ("NVIDIA A100-SXM4-80GB", torch.float16, 312.0),
    ("NVIDIA A10", torch.float16, 125.0),
    ("NVIDIA L4", torch.float16, 121.0),
    ("Tesla T4", torch.bfloat16, None),
    ("Some Future GPU", torch.float16, None),
])
def test_datasheet_peaks(name, dtype, peak):
    assert bench.device_peak_tflops(name, dtype)[0] == peak


def test_recorded_results_are_found_and_drawn(tmp_path):
    results, info = bench.run_sweep(tiny(tmp_path, ns=[32], causal=[False], impls=["naive"]), progress=False,
                                    log=lambda line: None)
    bench.write_results(results, info, tmp_path / "some-gpu")
    (found_path, data), = bench.load_recorded(tmp_path)
    assert found_path.parent.name == "some-gpu" and data["results"][0]["impl"] == "naive"
    assert "torch" in bench.describe_stamp(data["stamp"])
    assert bench.plot_results(data["results"], data["stamp"]) is not None
    assert "naive" in bench.format_table(data["results"])


# ------------------------------------------------------------------------- timing


def test_time_ms_is_a_positive_median():
    x = torch.randn(64, 64)
    assert 0 < timing.time_ms(lambda: x @ x, min_run_time=0.01) < 1000


def test_peak_memory_sees_torch_allocations():
    size = 4 * 2**20

    def allocate():
        a = torch.ones(size // 4)  # 4 MiB of float32
        b = a * 2  # another 4 MiB while a is alive
        return b.sum()

    peak = timing.peak_memory_bytes(allocate)
    if peak is None:
        pytest.skip("the profiler's allocation events are not available in this torch version")
    assert 2 * size <= peak < 2 * size + 2**20


def test_tiled_needs_a_small_fraction_of_naives_memory():
    q, k, v = (torch.randn(1, 1, 1024, 64) for _ in range(3))
    naive = timing.peak_memory_bytes(lambda: fast.naive_attention(q, k, v))
    tiled = timing.peak_memory_bytes(lambda: fast.tiled_attention(q, k, v, 128))
    if naive is None:
        pytest.skip("memory not measurable here")
    assert naive >= 2 * fast.score_bytes(1, 1, 1024)  # scores and their softmax
    assert tiled < naive / 4


def test_stamp_says_where_and_how():
    s = timing.stamp("cpu", torch.float32, {"N": 8})
    assert s["device"].startswith("CPU") and s["dtype"] == "float32" and s["shapes"] == {"N": 8}
    assert s["torch"] == torch.__version__ and s["python"]
    assert timing.format_bytes(1536) == "1.5 KiB" and timing.format_bytes(None) == "n/a"

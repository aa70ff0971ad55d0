"""``python -m attn_course bench`` (attn_course.tools.bench): arguments → BenchOptions, stamped CSV, JSON
and PNGs written through the one table writer, exit codes, and no library warnings."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from attn_course.tools import bench, cli

# Small enough for a test: what is checked is the files and their columns, not the timings' quality.
SMALL = ["--device", "cpu", "--n", "32", "64", "--head-dims", "16", "--tokens", "64", "--hidden", "32",
         "--min-run-time", "0.005", "--max-run-time", "0.1", "--roofline-size", "256", "--no-progress"]


def test_help_through_the_course_cli(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m attn_course bench") and "--quick" in out and "--out" in out
    assert "docs/results" in out and "gpu_finale.py" in out  # the epilog says how to record a GPU's results
    assert " ".join(out.split()).count(bench.QUICK) == 2  # one stated duration for --quick, in its help and in the examples
    assert " ".join(out.split()).count(bench.CPU_DEFAULT) == 1  # and one for the default CPU sweep
    assert "--threads" in out and "--max-run-time" in out


def test_arguments_override_the_preset_and_nothing_else():
    args = bench.build_parser().parse_args(["--quick", "--device", "cpu", "--n", "64", "--causal", "no"])
    options = bench.options_from_args(args)
    assert options.ns == [64] and options.causal == [False] and options.head_dims == [64]
    assert options.modes == ["fwd"] and "compile" not in options.impls and options.max_memory > 0
    full = bench.options_from_args(bench.build_parser().parse_args(["--device", "cpu", "--max-memory", "2"]))
    assert full.ns == [256, 512, 1024, 2048] and full.max_memory == 2e9 and full.max_run_time == 1.0
    assert "compile" not in full.impls  # opt-in on the CPU ...
    named = bench.options_from_args(bench.build_parser().parse_args(["--device", "cpu", "--impls", "naive", "compile"]))
    assert named.impls == ["naive", "compile"]  # ... where --impls adds it
    longer = bench.options_from_args(bench.build_parser().parse_args(["--device", "cpu", "--min-run-time", "0.3"]))
    assert longer.min_run_time == 0.3 and longer.max_run_time is None  # the limit follows --min-run-time (--help)


def test_bad_arguments_are_a_message_and_exit_code_2(capsys):
    import torch

    if not torch.cuda.is_available():
        assert bench.main(["--device", "cuda"] + SMALL[2:]) == 2
        assert "no CUDA GPU is available" in capsys.readouterr().err
    code = bench.main(["--device", "nonsense"])
    assert code == 2 and "error: --device" in capsys.readouterr().err
    assert bench.main(["--device", "cpu", "--n", "0"]) == 2


@pytest.mark.slow  # a fresh process, kernel or fork server: seconds
def test_cli_writes_stamped_csv_json_and_plots(tmp_path, capsys):
    code = cli.main(["bench", *SMALL, "--impls", "naive", "tiled", "sdpa-math", "--modes", "fwd", "fwd+bwd",
                     "--out", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "naive" in printed and "wrote" in printed and "peaks: this CPU's measured float32 matmul" in printed
    raw = (tmp_path / "attention-bench.csv").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf")  # the package's CSV: UTF-8 with a byte-order mark
    rows = list(csv.DictReader((tmp_path / "attention-bench.csv").open(encoding="utf-8-sig")))
    assert len(rows) == 2 * 2 * 2 * 3  # n × causal × modes × implementations
    assert {r["status"] for r in rows} == {"ok"}  # tiled has a backward (notebook 10's tiled backward)
    data = json.loads((tmp_path / "attention-bench.json").read_text(encoding="utf-8"))
    for key in ("device", "torch", "python", "shapes", "flops", "memory", "correctness", "date", "wall_s"):
        assert key in data["stamp"]
    for mode in ("fwd", "fwd+bwd"):
        assert (tmp_path / f"attention-bench-float32-{mode}.png").stat().st_size > 1000


def test_the_cpu_default_says_why_compile_is_left_out(tmp_path, monkeypatch, capsys):
    from attn_course import benchmark

    seen = {}

    def no_sweep(options, **kw):  # what the sweep was asked to measure, without measuring it
        seen["impls"] = options.impls
        return [], {"device": "cpu", "not_measured": {}, "peak_source": "none"}

    monkeypatch.setattr(benchmark, "run_sweep", no_sweep)
    assert bench.main(["--device", "cpu", "--no-plot", "--out", str(tmp_path)]) == 0
    assert "compile" not in seen["impls"]
    assert f"not measured: compile: {benchmark.CPU_OPT_IN['compile']}" in capsys.readouterr().out
    stamp = json.loads((tmp_path / "attention-bench.json").read_text(encoding="utf-8"))["stamp"]
    assert stamp["not_measured"] == {"compile": benchmark.CPU_OPT_IN["compile"]}  # in the record too
    assert bench.main(["--device", "cpu", "--impls", "compile", "--no-plot", "--out", str(tmp_path)]) == 0
    assert seen["impls"] == ["compile"] and "not measured: compile" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_wrong_result_makes_the_exit_code_1(tmp_path, monkeypatch):
    from attn_course import benchmark, fast

    wrong = benchmark.Impl("wrong", lambda q, k, v, causal: fast.naive_attention(q, k, v, causal=causal, scale=1.0))
    monkeypatch.setattr(benchmark, "implementations", lambda *a, **kw: ([wrong], {}))
    assert bench.main([*SMALL, "--no-plot", "--out", str(tmp_path)]) == 1


@pytest.mark.slow  # a fresh Python process imports torch and runs the quick benchmark
def test_quick_runs_from_a_fresh_process_without_library_warnings(tmp_path):
    done = subprocess.run([sys.executable, "-W", "error::UserWarning", "-m", "attn_course", "bench", "--quick",
                           "--device", "cpu", "--n", "64", "--min-run-time", "0.005", "--max-run-time", "0.1",
                           "--roofline-size", "256", "--no-progress",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr and "warn" not in done.stdout.lower()
    assert "wrote" in done.stdout and (tmp_path / "attention-bench.csv").exists()

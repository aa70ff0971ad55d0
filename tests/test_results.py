"""attn_course.results: recorded GPU results rendered for notebooks 09 and 10, from the fixture in
tests/fixtures/results/ (made-up data, labelled as such), and a plain statement when none exist."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from attn_course import results
from attn_course.plots import readability_problems

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "results"


def test_nothing_recorded_is_said_plainly(tmp_path, capsys):
    assert results.load(tmp_path) == [] and results.load(tmp_path / "absent") == []
    text = results.summary(tmp_path)
    assert text.startswith("No GPU results are recorded yet") and "scripts/gpu_finale.py" in text
    assert results.show(tmp_path) == []
    assert capsys.readouterr().out.startswith("No GPU results are recorded yet")


@pytest.mark.slow
def test_the_fixture_renders_as_a_table_and_a_figure_labelled_as_a_fixture():
    (rec,) = results.load(FIXTURE)
    assert rec.folder.name == "example-gpu" and rec.fixture and rec.triton_tests["passed"] == 20
    text = results.summary(FIXTURE)
    first = text.splitlines()[0]
    assert first.startswith("[FIXTURE, not a measurement") and "example-gpu" in first
    assert "driver 0.0" in text and "Triton kernels' tests, run natively: 20 passed, 0 failed" in text
    assert "datasheet: NVIDIA H100 SXM5" in text  # the datasheet row, with its source
    table = [line for line in text.splitlines() if line.startswith(("naive", "sdpa", "triton"))]
    assert table and all(" fwd " in line and "fwd+bwd" not in line for line in table)
    assert "TFLOP/s" in text and "OOM" in text
    backward = results.summary(FIXTURE, mode="fwd+bwd", min_n=4096)
    rows = [line for line in backward.splitlines() if line.startswith(("naive", "sdpa", "triton"))]
    assert rows and all("fwd+bwd" in line and " 4096 " in line for line in rows)
    figures = results.show(FIXTURE)
    try:
        assert len(figures) == 1 and readability_problems(figures[0]) == []
        assert any("FIXTURE" in t.get_text() for t in figures[0].texts)
    finally:
        for fig in figures:
            plt.close(fig)


def test_a_real_recording_is_not_labelled_a_fixture_and_broken_files_are_skipped(tmp_path):
    shutil.copytree(FIXTURE / "example-gpu", tmp_path / "real-gpu")
    path = tmp_path / "real-gpu" / "attention-bench.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    del data["stamp"]["fixture"]
    path.write_text(json.dumps(data), encoding="utf-8")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "attention-bench.json").write_text("{", encoding="utf-8")
    (rec,) = results.load(tmp_path)
    assert rec.fixture is None and "FIXTURE" not in results.summary(tmp_path)


def test_docs_results_holds_no_fixture():
    for path in (ROOT / "docs" / "results").glob("*/*.json"):
        assert "fixture" not in json.loads(path.read_text(encoding="utf-8")).get("stamp", {}), path


def test_the_kernels_standing_is_its_share_of_the_fastest_backend_at_the_same_point(tmp_path):
    shutil.copytree(FIXTURE / "example-gpu", tmp_path / "gpu")
    (rec,) = results.load(tmp_path)
    lines = results.standing(rec, mode="fwd", min_n=4096)
    ok = [r for r in rec.rows if r["status"] == "ok" and r["mode"] == "fwd" and r["n"] >= 4096 and r.get("tflops")]
    kernel = [r for r in ok if r["impl"] == "triton"]
    assert lines[0].startswith("The course's Triton kernel against the fastest fused backend") and kernel
    for r, line in zip(kernel, lines[1:]):
        best = max((o for o in ok if o["impl"].startswith("sdpa-") and o["n"] == r["n"] and o["head_dim"] == r["head_dim"]
                    and o["causal"] == r["causal"] and o["batch"] == r["batch"]), key=lambda o: o["tflops"])
        assert f"{r['tflops'] / best['tflops']:.0%} of {best['impl']}" in line, line
    # A tuning file adds the kernel's own tiles and the best tried, as shares of the fastest backend.
    tuning = {"dtype": "float16", "timing": "do_bench", "rows": [{"n": 4096, "d_head": 64, "causal": False, "forward": [
        {"config": "the kernel's own choice", "share_of_best_backend": 0.5},
        {"config": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}, "share_of_best_backend": 0.75},
        {"config": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3}, "error": "OutOfResources"}],
        "backward": []}]}
    (tmp_path / "gpu" / "triton-tuning.json").write_text(json.dumps(tuning), encoding="utf-8")
    (rec,) = results.load(tmp_path)
    tail = results.standing(rec, mode="fwd", min_n=4096)[len(lines):]
    assert tail[0].startswith("Other tiles for the forward kernel")
    assert tail[1:] == ["  n = 4096, d_k = 64, non-causal: own tiles 50%, best tried 75% (BLOCK_M 64, BLOCK_N 64, "
                        "4 warps, 3 stages)"]
    assert results.standing(rec, mode="fwd+bwd", min_n=4096)[-1].startswith("Other tiles for the backward")

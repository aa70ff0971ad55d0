"""The schedule is computed from the notebooks with a stated model, and docs/schedule.md is its output."""

from __future__ import annotations

import shutil

import json
from pathlib import Path

import nbformat
import pytest

from attn_course.tools.cli import main as cli
from attn_course.tools.schedule import Estimate, _title, build, count_words, estimate, load_timings, render

ROOT = Path(__file__).resolve().parents[2]


def _notebook(path: Path, *, words: int, code_lines: int, exercises: int) -> Path:
    cells = [nbformat.v4.new_markdown_cell("# 07 · Toy topic\n" + " ".join(["word"] * (words - 3)))]
    cells.append(nbformat.v4.new_code_cell("\n".join(f"x{i} = {i}" for i in range(code_lines)) + "\n# a comment\n"))
    for i in range(exercises):
        cell = nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION")
        cell.metadata["tags"] = ["exercise"]
        cells.append(cell)
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


def test_title_is_the_first_heading_even_after_plain_lines():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("[![Colab](badge.svg)](link)\n\n# 03 · Softmax, stably")])
    assert _title(nb) == "Softmax, stably"
    assert _title(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("no heading at all")])) == ""


def test_count_words_ignores_markup_and_links():
    assert count_words("## Title here\n\nSome **bold** text, [a link](http://x.y/z) and ![img](a.png).") == 8
    assert count_words("<b>two words</b>") == 2
    assert count_words(r"$\sqrt{d_k}$") == 3  # \sqrt read as one symbol, then d_k


def test_estimate_follows_the_stated_model(tmp_path):
    path = _notebook(tmp_path / "07_toy.ipynb", words=260, code_lines=30, exercises=3)
    e = estimate(path, 90.0, wpm=130, code_lpm=15, exercise_minutes=8)
    assert (e.words, e.code_lines, e.exercises) == (260, 30, 3)
    assert (e.reading_min, e.code_min, e.exercise_min, e.run_min) == (2.0, 2.0, 24.0, 1.5)
    assert e.minutes == 30  # ceil(2 + 2 + 24 + 1.5)
    assert e.title == "Toy topic"  # the number is dropped from the title
    slower = estimate(path, 90.0, wpm=65, code_lpm=15, exercise_minutes=8)
    assert slower.reading_min == 4.0


def _estimates(minutes):
    return [Estimate(f"{i:02d}_nb.ipynb", f"topic {i}", 0, 0, 0, 0.0, 0, 0, 0, 0, m) for i, m in enumerate(minutes)]


def test_schedule_fits_its_length_and_places_breaks_at_notebook_boundaries():
    estimates = _estimates([10, 40, 40, 40, 40, 40])  # 145 min of room: 10 + 3 × 40 fit
    slots, left = build(estimates, length=180, opening=10, closing=10, breaks=[(80, 15, "Break")],
                        priority=["00", "01", "02", "03", "04", "05"])
    assert slots[-1].start + slots[-1].minutes == 180
    assert sum(s.minutes for s in slots) == 180
    for a, b in zip(slots, slots[1:]):
        assert a.start + a.minutes == b.start  # back to back, no overlaps
    brk = next(s for s in slots if s.what == "Break")
    assert brk.start >= 80  # at the first boundary after its planned time
    taken = [s.what for s in slots if "topic" in s.what]
    assert len(taken) == 4 and [e.notebook for e in left] == ["04_nb.ipynb", "05_nb.ipynb"]


def test_priority_decides_what_a_short_workshop_covers():
    estimates = _estimates([10, 60, 60, 30])
    slots, left = build(estimates, length=120, opening=0, closing=0, breaks=[], priority=["00", "03", "01", "02"])
    assert [s.what.split(" · ")[0] for s in slots if "topic" in s.what] == ["00_nb", "01_nb", "03_nb"]
    assert [e.notebook for e in left] == ["02_nb.ipynb"]


def test_render_states_the_model():
    text = render(_estimates([10, 40]), wpm=130, code_lpm=15, exercise_minutes=8, source="test")
    assert "130 words per minute" in text and "8 minutes per exercise" in text and "15 lines per minute" in text
    assert "## 3-hour workshop" in text and "## Full-day workshop" in text


def test_load_timings_reads_bench_course_output_and_plain_maps(tmp_path):
    rows = tmp_path / "bench.json"
    rows.write_text(json.dumps([{"notebook": "01_a.ipynb", "seconds": 4.5, "peak_rss_mb": 300, "verdict": "ok"}]))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"01_a.ipynb": 4.5}))
    assert load_timings(rows) == load_timings(plain) == {"01_a.ipynb": 4.5}


def test_cli_writes_the_schedule(tmp_path, capsys):
    folder = tmp_path / "solutions"
    folder.mkdir()
    _notebook(folder / "00_a.ipynb", words=130, code_lines=15, exercises=0)
    _notebook(folder / "01_b.ipynb", words=260, code_lines=30, exercises=2)
    timings = tmp_path / "t.json"
    timings.write_text(json.dumps({"00_a.ipynb": 3.0, "01_b.ipynb": 6.0}))
    out = tmp_path / "schedule.md"
    assert cli(["schedule", "--notebooks", str(folder), "--timings", str(timings), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| 01_b · Toy topic | 260 | 30 | 2 | 6 |" in text
    assert "Take-home (does not fit): nothing." in text


SCHEDULE_MD = ROOT / "docs" / "schedule.md"
TIMINGS = ROOT / "docs" / "schedule-timings.json"


@pytest.mark.skipif(not SCHEDULE_MD.exists() or not TIMINGS.exists(), reason="docs/schedule.md not generated yet")
def test_docs_schedule_is_what_the_script_computes_from_the_notebooks_now(tmp_path):
    solutions = sorted((ROOT / "solutions").glob("*.ipynb"))
    timings = load_timings(TIMINGS)
    missing = [p.name for p in solutions if p.name not in timings]
    assert not missing, f"no measured time for {missing}: run `python -m attn_course schedule --measure`"
    out = tmp_path / "schedule.md"  # the timings beside it, as docs/ has them
    shutil.copy(TIMINGS, tmp_path / TIMINGS.name)
    assert cli(["schedule", "--notebooks", str(ROOT / "solutions"), "--timings", str(tmp_path / TIMINGS.name),
                "--out", str(out)]) == 0
    assert out.read_text() == SCHEDULE_MD.read_text(), (
        "docs/schedule.md is stale (a notebook changed): run `python -m attn_course schedule`")


def test_the_readme_syllabus_gives_the_minutes_of_docs_schedule():
    import re

    computed = {m.group(1): m.group(2) for m in re.finditer(r"^\| (\d\d)_\S+ · .*?\*\*(\d+)\*\* \|$",
                                                            SCHEDULE_MD.read_text(), re.M)}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    stated = {m.group(1): m.group(2) for m in re.finditer(r"^\| (\d\d) \| \[.*\| (\d+) \|$", readme, re.M)}
    assert computed and stated == computed, "README's syllabus minutes differ from docs/schedule.md: copy them over"

"""The grades as people read them (attn_course.tools.grading.report)."""

from __future__ import annotations

from attn_course.tools.grading.journal import ClassInfo
from attn_course.tools.grading.model import Row
from attn_course.tools.grading.report import class_rows, learner_table, result_text, write_class

LONG = ("your weights are NaN for a fully masked row: a query whose every key is blocked gets a zero row in this course "
        "(as F.scaled_dot_product_attention returns from PyTorch 2.5 on)")


def _rows():
    return [Row("you", "05_attention", "attention", "passed", "matches F.scaled_dot_product_attention on 12 cases"),
            Row("you", "05_attention", "score_matrix_bytes", "failed", "syntax error in line 3: '(' was never closed"),
            Row("you", "06_masks", "padding_mask_from_lengths", "failed", LONG),
            Row("you", "06_masks", "causal_mask", "not attempted", "not attempted yet"),
            Row("you", "06_masks", "decoder_mask", "error", "the check itself failed (not your fault)")]


def test_result_text_never_repeats_the_status():
    rows = _rows()
    assert result_text(rows[0]) == "passed"
    assert result_text(rows[1]) == "failed: syntax error in line 3: '(' was never closed"
    assert result_text(rows[3]) == "not attempted"


def test_the_learner_table_fits_100_columns_with_subtotals_and_a_total():
    text = learner_table(_rows())
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100, text
    assert sum("── " in line for line in lines) == 2
    assert "── 1 of 2 passed" in text and "── 0 of 3 passed" in text
    assert "Total: 1 of 5 exercises passed (2 failed, 1 not attempted, 1 error)" in text
    assert "padding_mask_from_lengths" in text  # exercise ids, the one name used everywhere
    assert any(line.endswith("…") for line in lines)  # the long message was cut to fit


def test_class_files_hold_every_learner_with_a_bom_and_not_submitted_rows(tmp_path):
    info = ClassInfo(learners=["José María Ñúñez", "bob"], assigned=["05_attention"],
                     exercises={"05_attention": ["attention", "score_matrix_bytes"]}, warnings=["bob: no notebook"])
    entry = {"rows": [r.to_json() for r in [Row("José María Ñúñez", "05_attention", "attention", "passed"),
                                            Row("José María Ñúñez", "05_attention", "score_matrix_bytes", "failed",
                                                "off by a factor of 2", ["a flag"])]]}
    rows = class_rows(info, [entry])
    assert [(r.learner, r.status) for r in rows] == [("José María Ñúñez", "passed"), ("José María Ñúñez", "failed"),
                                                    ("bob", "not submitted"), ("bob", "not submitted")]
    paths = write_class(rows, info, tmp_path)
    for name in ("grades", "table"):
        data = paths[name].read_bytes()
        assert data.startswith(b"\xef\xbb\xbf") and "José María Ñúñez" in data.decode("utf-8-sig")
    table = paths["table"].read_text(encoding="utf-8-sig").splitlines()
    assert table[0] == "learner,passed,of,05_attention:attention,05_attention:score_matrix_bytes,flagged"
    assert table[2] == "bob,0,2,not submitted,not submitted,"
    summary = paths["summary"].read_text(encoding="utf-8")
    assert "| bob | 0 of 2 |" in summary and "- bob: no notebook" in summary
    assert "| José María Ñúñez | 05_attention | a flag |" in summary
    assert "| score_matrix_bytes (05_attention) | 1 | off by a factor of 2 (1) |" in summary


def test_identical_answers_of_different_learners_are_flagged():
    info = ClassInfo(learners=["ada", "bob", "cy"], assigned=["05_attention"], exercises={"05_attention": ["attention"]})

    def entry(who, sha, code, attempted=1):
        return {"rows": [Row(who, "05_attention", "attention", "passed").to_json()], "sha": sha, "code": code,
                "attempted": attempted}

    rows = {r.learner: r for r in class_rows(info, [entry("ada", "s1", "c1"), entry("bob", "s2", "c1"),
                                                    entry("cy", "s3", "c3")])}
    assert rows["ada"].flags == ["the same exercise code as bob's 05_attention"]
    assert rows["cy"].flags == []
    unattempted = {r.learner: r for r in class_rows(info, [entry("ada", "s", "c", 0), entry("bob", "s", "c", 0)])}
    assert unattempted["ada"].flags == []  # two untouched notebooks are not a copy

"""The verdict as data (attn_course.checks.result): JSON round trip, one template, an exception that
renders as the diagnosis alone (IPython's _render_traceback_)."""

from __future__ import annotations

import json

import pytest

from attn_course.checks.result import (MIME, CheckCrashed, CheckFailed, CheckResult, Diagnosis, NotAttempted, Status,
                                       result_from_output)

FAILED = CheckResult("attention", Status.FAILED, "mask applied after the softmax",
                     Diagnosis("mask applied after the softmax", tried="attention(Q, K, V, mask)", got="rows summing to 0.3",
                               expected="rows summing to 1", cause="you masked the weights", fix="mask the scores"))


def test_json_round_trip_and_mime_bundle():
    data = json.loads(json.dumps(FAILED.to_json()))
    assert CheckResult.from_json(data) == FAILED
    bundle = FAILED.mimebundle()
    assert bundle[MIME]["status"] == "failed" and bundle["text/plain"] == "✗ attention: mask applied after the softmax"
    output = {"output_type": "display_data", "data": bundle, "metadata": {}}
    assert result_from_output(output) == FAILED
    assert result_from_output({"output_type": "display_data", "data": {MIME: json.dumps(bundle[MIME])}}) == FAILED
    for bad in ({"output_type": "stream", "text": "✓ attention"}, {"output_type": "display_data", "data": {MIME: {"x": 1}}},
                {"output_type": "display_data", "data": {MIME: "{not json"}}):
        assert result_from_output(bad) is None


def test_from_json_refuses_what_is_not_a_result():
    for bad in (None, [], {"schema": 99}, {"schema": 1, "status": "great", "exercise": "x", "summary": ""}):
        with pytest.raises(ValueError):
            CheckResult.from_json(bad)


def test_text_is_the_template_in_order_and_wrapped():
    lines = FAILED.text().splitlines()
    assert lines[0] == "✗ attention: mask applied after the softmax"
    assert [line.split()[0] for line in lines[1:]] == ["tried", "got", "expected", "cause", "to"]
    long = CheckResult("x", Status.FAILED, "s", Diagnosis("s", got="word " * 60))
    assert all(len(line) <= 100 for line in long.text().splitlines())


def test_exceptions_render_only_the_diagnosis():
    exc = FAILED.exception()
    assert isinstance(exc, CheckFailed) and isinstance(exc, AssertionError)
    rendered = exc._render_traceback_()
    assert any("you masked the weights" in line for line in rendered)
    assert not any("File " in line or "attn_course" in line for line in rendered)
    assert str(exc) == FAILED.text()
    assert isinstance(CheckResult("x", Status.NOT_ATTEMPTED, "not attempted yet").exception(), NotAttempted)
    assert isinstance(CheckResult("x", Status.ERROR, "broken").exception(), CheckCrashed)
    assert CheckResult("x", Status.PASSED, "ok").exception() is None

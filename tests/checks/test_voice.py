"""One voice: every check's every diagnosis follows the course's template (tried → got → expected →
cause → to do), in the second person, with a short summary for grade tables — for the classic wrong
answers each check's own tests feed it, for generic wrong answers (None, a string, an exception, a
SystemExit, a hang-free endless loop is covered in test_core) and for mutants of every solution."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import nbformat
import pytest

from attn_course import registry
from attn_course.checks.result import CheckResult, Status
from attn_course.tools.mutants import run_exercise

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = [
    r"\bIt looks like\b", r"\bIt seems\b", r"\bthe learner\b", r"\bthe student\b", r"\bthe user\b",
    r"does not match the expected values", r"\[largest difference", r"\bAssertionError\b",
]


def assert_voice(result: CheckResult) -> None:
    """The template's rules for one verdict (anything but passed)."""
    assert result.status is not Status.PASSED
    text = result.text()
    assert result.summary and "\n" not in result.summary and len(result.summary) <= 90, result.summary
    d = result.diagnosis
    assert d is not None, text
    assert d.got, f"no 'got' part:\n{text}"
    if result.status is Status.FAILED:
        assert d.expected or d.cause, f"a failure names what was expected or the cause:\n{text}"
        assert d.tried, f"a failure says what was tried:\n{text}"
    assert d.fix, f"every diagnosis says what to do:\n{text}"
    for pattern in FORBIDDEN:
        assert not re.search(pattern, text), f"{pattern!r} in:\n{text}"
    for part in (d.cause, d.fix):
        assert not part.startswith(("It ", "The learner")), part


def _generic_answers():
    def returns_none(*args, **kwargs):
        return None

    def returns_text(*args, **kwargs):
        return "answer"

    def raises(*args, **kwargs):
        raise ValueError("something went wrong")

    def exits(*args, **kwargs):
        raise SystemExit(3)

    class Custom(BaseException):
        pass

    def raises_base(*args, **kwargs):
        raise Custom("custom")

    return [returns_none, returns_text, raises, exits, raises_base, 42]


CHECKS = [pytest.param(nb, ex, id=f"{nb.number}-{ex}") for nb in registry.NOTEBOOKS for ex in nb.exercises]


@pytest.mark.parametrize("nb,exercise", CHECKS)
def test_generic_wrong_answers_get_a_diagnosis_in_the_template(nb, exercise):
    check = getattr(importlib.import_module(nb.checks), registry.check_name(exercise))
    for answer in _generic_answers():
        result = check.evaluate(answer)
        assert result.status in (Status.FAILED, Status.ERROR) or (
            result.status is Status.NOT_ATTEMPTED and answer is None), result.text()
        assert result.status is not Status.ERROR, f"a wrong answer made the check itself fail:\n{result.text()}"
        assert_voice(result)


@pytest.mark.slow
@pytest.mark.parametrize("nb,exercise", CHECKS)
def test_mutants_get_a_diagnosis_in_the_template(nb, exercise):
    solution = nbformat.read(ROOT / "solutions" / nb.filename, as_version=4)
    check = getattr(importlib.import_module(nb.checks), registry.check_name(exercise))
    killed = [o for o in run_exercise(solution, exercise, check, sample=8) if not o.survived and o.result]
    assert killed, "no mutant was killed"
    for o in killed:
        assert o.result.status is not Status.ERROR, f"{o.mutant.id} made the check itself fail:\n{o.result.text()}"
        assert_voice(o.result)

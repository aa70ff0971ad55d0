"""The result of a check, as data: what the notebook shows, what the grader reads, what tests assert on.

Every check produces one :class:`CheckResult`. In a notebook it becomes one ``display_data`` output
whose ``data`` holds the result as JSON under :data:`MIME` (what the grader and the course's pytest
plugin read: no decision ever parses the human text) and, for people,

* the verdict line and, when the exercise is not passed, the diagnosis under it, as ``text/plain`` and
  as ``text/html`` (a box with a red edge: seen at once, in every front-end), and the cell goes on;
* or, where something judges the cell by its error (grader, nbgrader: :func:`~.core.raises`), the
  verdict line alone followed by an exception (:class:`CheckFailed`, :class:`NotAttempted` or
  :class:`CheckCrashed`) whose ``_render_traceback_`` is the diagnosis itself, so IPython shows it in
  place of a traceback: no frame of the course's code, nothing to scroll past.

A diagnosis always has the same parts, in the same order (one voice for every check):

    tried     what the check ran
    got       what came back
    expected  what should have come back
    cause     the likely mistake (only when the evidence supports it)
    to do     what to change
"""

from __future__ import annotations

import enum
import html
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MIME",
    "SCHEMA",
    "Status",
    "Diagnosis",
    "CheckResult",
    "CheckOutcome",
    "CheckFailed",
    "NotAttempted",
    "CheckCrashed",
    "result_from_output",
]

#: The MIME type under which a check cell's output carries its result as JSON.
MIME = "application/vnd.attn-course.check+json"
SCHEMA = 1


class Status(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    NOT_ATTEMPTED = "not attempted"
    ERROR = "error"  # the check itself broke, or the exercise could not be run: never the learner's fault

    def __str__(self) -> str:  # "passed", not "Status.PASSED"
        return self.value


SYMBOL = {Status.PASSED: "✓", Status.FAILED: "✗", Status.NOT_ATTEMPTED: "○", Status.ERROR: "⚠"}
#: The parts of a diagnosis, in order, with the label each is shown under.
PARTS = (("tried", "tried"), ("got", "got"), ("expected", "expected"), ("cause", "cause"), ("fix", "to do"))


@dataclass
class Diagnosis:
    """Why an exercise is not passed, in the course's one template. Every part is a short sentence
    fragment in the second person ("you …"); ``summary`` is the one line a grade table shows."""

    summary: str
    tried: str = ""
    got: str = ""
    expected: str = ""
    cause: str = ""
    fix: str = ""

    def parts(self) -> list[tuple[str, str]]:
        return [(label, getattr(self, name)) for name, label in PARTS if getattr(self, name)]


@dataclass
class CheckResult:
    """One exercise's verdict. ``summary`` is one short line (grade tables, the verdict line);
    ``diagnosis`` holds the template's parts when the exercise is not passed."""

    exercise: str
    status: Status
    summary: str
    diagnosis: Diagnosis | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED

    # ------------------------------------------------------------------ text
    def headline(self) -> str:
        """The verdict line: ``✓ attention: matches … on 9 cases``."""
        return f"{SYMBOL[self.status]} {self.exercise}: {self.summary}"

    def body_lines(self) -> list[str]:
        """The diagnosis, one labelled part per line (long parts wrapped under their label)."""
        if self.diagnosis is None:
            return []
        width = max(len(label) for _, label in PARTS)
        lines = []
        for label, text in self.diagnosis.parts():
            for i, chunk in enumerate(_wrap(text, 96 - width - 4)):
                lines.append(f"  {label if i == 0 else '':<{width}}  {chunk}")
        return lines

    def text(self) -> str:
        return "\n".join([self.headline(), *self.body_lines()])

    # ------------------------------------------------------------------ data
    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema": SCHEMA,
            "exercise": self.exercise,
            "status": self.status.value,
            "summary": self.summary,
        }
        if self.diagnosis is not None:
            data["diagnosis"] = {name: getattr(self.diagnosis, name) for name in ("summary", *dict(PARTS))
                                 if getattr(self.diagnosis, name)}
        if self.details:
            data["details"] = self.details
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CheckResult":
        """Rebuild a result from :meth:`to_json`'s output; raises ValueError on anything else."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError("not a check result of this course")
        try:
            status = Status(data["status"])
            exercise, summary = str(data["exercise"]), str(data["summary"])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"malformed check result: {exc}") from None
        diagnosis = None
        if isinstance(data.get("diagnosis"), dict):
            d = data["diagnosis"]
            diagnosis = Diagnosis(**{k: str(d.get(k, "")) for k in ("summary", *dict(PARTS))})
        details = data.get("details") if isinstance(data.get("details"), dict) else {}
        return cls(exercise, status, summary, diagnosis, details)

    def mimebundle(self, diagnosis: bool = False) -> dict[str, Any]:
        """What a check cell displays: the data for the grader and the verdict line for people; with
        ``diagnosis`` (a check that does not raise) also the diagnosis, as text and as a red box."""
        if not diagnosis or self.passed:
            return {MIME: self.to_json(), "text/plain": self.headline()}
        return {MIME: self.to_json(), "text/plain": self.text(), "text/html": self.html()}

    def html(self) -> str:
        """The verdict and the diagnosis as a box with a coloured edge (red: failed or not attempted)."""
        colour = {Status.PASSED: "#2e7d32", Status.ERROR: "#b26a00"}.get(self.status, "#c62828")
        rows = "".join(
            f'<tr><th style="text-align:left;vertical-align:top;padding:1px 12px 1px 0;font-weight:600;'
            f'white-space:nowrap">{html.escape(label)}</th><td style="text-align:left;padding:1px 0;'
            f'white-space:pre-wrap;font-family:var(--jp-code-font-family,monospace)">{html.escape(text)}</td></tr>'
            for label, text in (self.diagnosis.parts() if self.diagnosis else []))
        return (f'<div class="attn-course-check attn-course-{self.status.name.lower()}" style="border-left:6px solid '
                f'{colour};background:rgba(198,40,40,0.06);padding:6px 10px;margin:2px 0">'
                f'<div style="color:{colour};font-weight:700">{html.escape(self.headline())}</div>'
                f'<table style="border-collapse:collapse;margin:4px 0 0 0">{rows}</table></div>')

    def exception(self) -> "CheckOutcome | None":
        """The exception a notebook raises for this result (None when passed)."""
        kind = {Status.FAILED: CheckFailed, Status.NOT_ATTEMPTED: NotAttempted, Status.ERROR: CheckCrashed}
        return None if self.passed else kind[self.status](self)


def _wrap(text: str, width: int) -> list[str]:
    """Wrap ``text`` at spaces to ``width`` columns, keeping its own line breaks."""
    out: list[str] = []
    for paragraph in text.splitlines() or [""]:
        if len(paragraph) <= width:  # as it is: a code line keeps its indentation, a caret its column
            out.append(paragraph)
            continue
        line = ""
        for word in paragraph.split(" "):
            if line and len(line) + 1 + len(word) > width:
                out.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        out.append(line)
    return out


# ---------------------------------------------------------------------------------------- exceptions
_RED, _BOLD, _RESET = "\x1b[31m", "\x1b[1m", "\x1b[0m"


class CheckOutcome(Exception):
    """Raised by a check cell whose exercise is not passed, so that the cell counts as failed (pytest,
    nbval, nbgrader) while IPython shows only the diagnosis (``_render_traceback_``)."""

    def __init__(self, result: CheckResult):
        super().__init__(result.text())
        self.result = result

    def _render_traceback_(self) -> list[str]:
        lines = self.result.body_lines() or [f"  {self.result.summary}"]
        return [f"{_RED}{line}{_RESET}" for line in lines]


class CheckFailed(CheckOutcome, AssertionError):
    """The exercise's answer is wrong; the diagnosis says how and, where it can, why."""


class NotAttempted(CheckFailed):
    """The exercise still raises NotImplementedError (or is not defined yet)."""


class CheckCrashed(CheckOutcome):
    """The check itself broke: not a verdict on the learner's code."""


def result_from_output(output: dict[str, Any]) -> CheckResult | None:
    """The check result carried by one notebook output, or None if it carries none (or a malformed one)."""
    if output.get("output_type") not in ("display_data", "execute_result"):
        return None
    data = output.get("data", {}).get(MIME)
    if isinstance(data, str):  # some writers store JSON MIME types as text
        try:
            data = json.loads(data)
        except ValueError:
            return None
    try:
        return CheckResult.from_json(data)
    except ValueError:
        return None

"""The grader's data: one :class:`Row` per learner and exercise, and the statuses a row can have.

A row's ``status`` is one of the check statuses (passed, failed, not attempted, error — see
:class:`attn_course.checks.result.Status`) or ``not submitted`` (no notebook of that learner holds
the exercise). ``message`` is the check's one-line summary (or the grader's own short reason);
``flags`` are things for the instructor to look at that do not change the status (copied code, the
course's own functions, tampering); ``note`` says what else happened while the notebook ran.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ...checks.result import Status

__all__ = ["PASSED", "FAILED", "NOT_ATTEMPTED", "ERROR", "NOT_SUBMITTED", "STATUSES", "Row"]

PASSED, FAILED = Status.PASSED.value, Status.FAILED.value
NOT_ATTEMPTED, ERROR = Status.NOT_ATTEMPTED.value, Status.ERROR.value
NOT_SUBMITTED = "not submitted"
#: Every status, in the order tables count them.
STATUSES = (PASSED, FAILED, NOT_ATTEMPTED, ERROR, NOT_SUBMITTED)


@dataclass
class Row:
    learner: str
    notebook: str  # the course notebook's slug ("05_attention"), from the exercises it holds
    exercise: str  # the exercise id (nbgrader grade_id): the one name used everywhere
    status: str
    message: str = ""
    flags: list[str] = field(default_factory=list)
    note: str = ""
    source: str = ""  # the file graded, relative to the class folder
    seconds: float | None = None  # the learner process's run time for the whole notebook (wall clock)
    cpu_seconds: float | None = None  # its CPU time
    peak_mb: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Row":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        known["flags"] = list(known.get("flags") or [])
        return cls(**known)

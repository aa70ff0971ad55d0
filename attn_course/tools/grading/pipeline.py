"""One submission from file to rows: plan the cells, run them in a learner process, replay the checks.

:class:`Grader` is the same for one learner and for a class; only what surrounds it differs
(:mod:`.commands`). It holds the course (loaded, checks imported, before any learner code runs) and a
:class:`~.run.Runner`.
"""

from __future__ import annotations

from .collect import Submission
from .course import Course
from .model import Row
from .plan import plan
from .watch import Runner
from .sandbox import Limits
from .verdict import judge, unreadable_rows

__all__ = ["Grader"]


class Grader:
    def __init__(self, course: Course, limits: Limits | None = None, *, jobs: int = 1, confine: bool = True,
                 threads: int | None = None, runner: Runner | None = None):
        """``runner``: one made (and started, :meth:`Runner.start`) before the course was loaded, so that
        the fork servers import PyTorch while this process loads the course."""
        self.course = course
        self.limits = runner.limits if runner else (limits or Limits())
        self.runner = runner or Runner(self.limits, jobs=jobs, confine=confine, threads=threads)

    def __enter__(self) -> "Grader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.runner.close()

    def grade(self, sub: Submission, *, slot: int = 0, limits: Limits | None = None) -> list[Row]:
        """The rows of one submission (never raises for anything the submission holds); ``limits``
        replaces the grader's own for this one."""
        if sub.notebook is None:
            return []
        if sub.problem or sub.nb is None:
            return unreadable_rows(sub)
        cells = plan(sub.nb, sub.notebook)
        run = self.runner.run(cells, sub.notebook.exercise_ids(), slot=slot, label=sub.rel, limits=limits)
        try:
            return judge(sub, cells, run)
        finally:
            self.runner.forget(run)

"""Grading: a learner's own notebooks, or a whole class, with verdicts no submission can forge.

``python -m attn_course grade`` (:mod:`.commands`). The pipeline, one job per module:

* :mod:`.files` — read what learners hand in safely; scan a class folder, every entry accounted for;
* :mod:`.course` — the course's solutions, exercises and checks (imported before any learner code);
* :mod:`.collect` — which course notebook a file is (by its exercise ids), which copy is graded;
* :mod:`.static` — what a cell's source says without running it (syntax errors, names, flags);
* :mod:`.plan` — which cells the learner's process runs (set-up, exercises, the course's checks);
* :mod:`.sandbox` — confinement and limits of a learner process (Landlock, rlimits, kill);
* :mod:`.zygote` — the fork server: the course imported once, a fresh learner process per notebook;
* :mod:`.learner` — the learner process: runs the planned cells in IPython, checks recording;
* :mod:`.watch` — one notebook in a learner process, watched, ended, its outputs read back safely;
* :mod:`.verdict` — every check replayed in the grader from the logs: the only place verdicts are made;
* :mod:`.pipeline` — the above for one submission (:class:`~.pipeline.Grader`);
* :mod:`.journal` — results written as they come: resume, shards, merge;
* :mod:`.report` — the learner's terminal table; a class's grades.csv, table.csv, summary.md;
* :mod:`.model` — the row and its statuses.
"""


def configure(parser):
    """Add the ``grade`` command's arguments (see :mod:`.commands`)."""
    from .commands import configure as _configure

    _configure(parser)


def run(args) -> int:
    from .commands import run as _run

    return _run(args)

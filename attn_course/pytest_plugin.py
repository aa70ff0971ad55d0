"""The course's pytest plugin (an entry point, active wherever ``attn_course`` is installed).

In a notebook a check that is not passed shows its diagnosis and does not raise, so *Run All* reaches
the last cell in every front-end (JupyterLab, VS Code, Colab, nbclient), whatever it makes of cell
tags. Under nbval this plugin judges every check cell by the result it displayed — the data under
:data:`attn_course.checks.result.MIME`, never its text: a cell whose check is not passed (or that shows no
result) fails. So ``pytest --nbval-lax notebooks/`` fails on every exercise that is not passed, and
the strict run over ``solutions/`` fails on any solution that does not pass its check.

Exercise and check cells also carry the ``raises-exception`` tag (JupyterLab and nbclient go on past
an exercise cell with an error); nbval reads that tag as "this cell is expected to raise", and this
plugin withdraws that licence for exercise and check cells, so such an error fails too.
"""

from __future__ import annotations

import os


def pytest_configure(config) -> None:
    # Kernels started by nbval inherit this: checks show no live progress, so outputs are reproducible.
    os.environ.setdefault("ATTN_COURSE_QUIET", "1")


def pytest_collection_modifyitems(session, config, items) -> None:
    from attn_course.tools.nbmeta import CHECK, EXERCISE, role

    for item in items:
        cell, options = getattr(item, "cell", None), getattr(item, "options", None)
        if cell is None or not isinstance(options, dict) or not hasattr(item, "raise_cell_error"):
            continue  # not an nbval cell
        kind = role(cell)
        if kind in (EXERCISE, CHECK):
            options["check_exception"] = False
        if kind == CHECK and callable(getattr(item, "runtest", None)):
            item.runtest = _judged_by_result(item, item.runtest)


def _judged_by_result(item, runtest):
    """``runtest`` of a check cell, then: fail unless the result it displayed says passed."""

    def run() -> None:
        from attn_course.checks.result import result_from_output

        runtest()
        results = [r for r in map(result_from_output, getattr(item, "test_outputs", None) or []) if r]
        if not results:
            item.raise_cell_error("the check cell displayed no check result")
        failed = [r for r in results if not r.passed]
        if failed:
            item.raise_cell_error(f"check not passed: {failed[0].headline()}",
                                  "\n" + "\n".join(r.text() for r in failed))

    return run

"""The course's pytest plugin (an entry point, active wherever ``attn_course`` is installed).

Exercise and check cells carry the ``raises-exception`` tag so that Run All in JupyterLab (and
nbclient) goes on past an unfinished or wrong exercise. nbval reads the same tag as "this cell is
expected to raise" and would then pass a wrong answer; this plugin withdraws that licence for
exercise and check cells, so ``pytest --nbval-lax notebooks/`` fails on every exercise that is
not passed, and the strict run over ``solutions/`` fails on any solution that does not pass its check.
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
        if cell is None or not isinstance(options, dict) or "check_exception" not in options:
            continue  # not an nbval cell
        if role(cell) in (EXERCISE, CHECK):
            options["check_exception"] = False

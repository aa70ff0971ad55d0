"""attn_course: the helper package of *Attention from Scratch*.

Reference implementations of everything the notebooks build (tested against PyTorch's own),
one check per exercise (``attn_course.checks``), plots and widgets, timing tools, and the course
tooling behind ``python -m attn_course`` (exercise generation, grading, budgets, benchmarks).

Modules are imported on demand, so ``import attn_course`` stays cheap.
"""

__version__ = "0.1.0"


def _watch_cells() -> None:
    """Inside IPython, let the checks know how each cell's last run ended (:mod:`attn_course.checks.cells`):
    every notebook's set-up cell imports the package, before any exercise cell runs."""
    try:
        from .checks import cells

        cells.install()
    except Exception:  # noqa: BLE001 - an import of the package never fails for this
        pass


_watch_cells()

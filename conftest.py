"""Test-suite wiring that spans tests/ and solutions/ (this file sits at the root, so it also sees solutions/).

Every solution-notebook cell that nbval collects is marked ``slow`` (it belongs to a whole-notebook
run), so ``pytest -m "not slow"`` is the quick loop: package, checks and tools tests only. (Run in
parallel with pytest-xdist's ``--dist loadfile``, as ``python3 course.py test`` does, a notebook's cells
stay together, in order, on one worker; so a file of long tests holds one worker for its whole length:
keep such files short. In file order the longest files are handed out first — the browser's, then
whole notebooks, then tools tests, then check tests, each group largest file first — so that short files
fill the end of the run rather than one worker finishing a long file alone (2 cores: the last worker
finished 50 s after the others when the browser tests came last). `course.py test` passes
``--no-loadscope-reorder`` so that pytest-xdist keeps this order.)

A notebook's cells run top to bottom whatever reorders the tests: under ``-p randomly`` (test files
and tests in an order drawn from a seed) each notebook's cells are put back in their own order.

A kernel that does not answer its first message within nbval's startup timeout is started once more
before its notebook's cells are reported as errors: with several workers starting kernels at once, one
in many runs (once in ten CI runs here) was left waiting; that says nothing about the notebook.
"""

from __future__ import annotations

from collections import Counter

import nbval.kernel
import pytest

_start_new_kernel = nbval.kernel.start_new_kernel


def _start_new_kernel_twice(*args, **kwargs):
    try:
        return _start_new_kernel(*args, **kwargs)
    except RuntimeError:  # "Kernel didn't respond in N seconds" (nbval has shut that kernel down)
        return _start_new_kernel(*args, **kwargs)


nbval.kernel.start_new_kernel = _start_new_kernel_twice


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    # Before every other plugin (-m selects on it): every nbval cell is slow.
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.slow)
    yield
    # After every other plugin (pytest-randomly's shuffle): each notebook's cells back in their order.
    cells = [k for k, item in enumerate(items) if item.path.suffix == ".ipynb"]
    notebooks: dict = {}  # each notebook where its first cell now stands (dicts keep insertion order)
    for k in cells:
        notebooks.setdefault(items[k].path, []).append(items[k])
    in_order = [cell for group in notebooks.values() for cell in sorted(group, key=lambda c: getattr(c, "cell_num", 0))]
    for k, cell in zip(cells, in_order):
        items[k] = cell
    if not config.pluginmanager.hasplugin("randomly"):  # a drawn order stays as drawn
        tests_in = Counter(item.path for item in items)
        items.sort(key=lambda item: (_tier(item), -tests_in[item.path]))  # stable: a file's tests keep their order


def _tier(item) -> int:
    """Files handed out first to last: browsers; whole notebooks; tools and reference tests (subprocesses,
    figures); check tests (many short tests, the best filling for the end of a parallel run)."""
    if item.get_closest_marker("browser"):
        return 0
    if item.path.suffix == ".ipynb" or item.path.parent.name == "notebooks":
        return 1
    return 3 if item.path.parent.name == "checks" else 2

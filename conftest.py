"""How the test suite is laid out over processes (this file sits at the root, so it also sees solutions/).

* Every solution notebook cell that nbval collects is marked ``slow`` (it belongs to a whole-notebook
  run), so ``pytest -m "not slow"`` is the quick loop: package, checks and tools tests only.
* With pytest-xdist's ``--dist loadgroup`` (what ``python course.py test`` uses), a notebook's cells
  stay together, in order, on one worker (one kernel per notebook), and so do the browser tests (one
  JupyterLab server); every other test is handed out on its own, which keeps both workers busy.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.path.suffix == ".ipynb":  # an nbval cell
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.xdist_group(f"notebook:{item.path.name}"))
        elif item.path.name == "test_browser.py":
            item.add_marker(pytest.mark.xdist_group("browser"))

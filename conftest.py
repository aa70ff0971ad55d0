"""Test-suite wiring that spans tests/ and solutions/ (this file sits at the root, so it also sees solutions/).

Every solution-notebook cell that nbval collects is marked ``slow`` (it belongs to a whole-notebook
run), so ``pytest -m "not slow"`` is the quick loop: package, checks and tools tests only. (Run in
parallel with pytest-xdist's ``--dist loadfile``, as ``python course.py test`` does, a notebook's cells
stay together, in order, on one worker.)
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.path.suffix == ".ipynb":  # an nbval cell
            item.add_marker(pytest.mark.slow)

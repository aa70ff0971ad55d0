"""The other half of test_notebooks.py's unfilled-notebook runs: under ``--dist loadfile`` a test file
runs on one worker, and the fourteen runs are the suite's longest file when kept together."""

from __future__ import annotations

import pytest

from tests.notebooks.test_notebooks import WITH_EXERCISES, check_unfilled_notebook


@pytest.mark.slow
@pytest.mark.parametrize("solution", WITH_EXERCISES[1::2], ids=lambda p: p.stem)
def test_unfilled_notebook_runs_to_the_end_and_reports_not_attempted(solution, tmp_path):
    check_unfilled_notebook(solution, tmp_path)

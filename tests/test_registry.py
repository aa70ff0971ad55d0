"""The registry (attn_course/registry.py) is true: every notebook, module, check and test file it names
exists; every exercise in a solution notebook is listed, in order, with its check; each module's
docstring names its notebook."""

from __future__ import annotations

import importlib
from pathlib import Path

import nbformat
import pytest

from attn_course import registry
from attn_course.checks.core import Check
from attn_course.tools import nbmeta

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = registry.NOTEBOOKS


def test_every_solution_notebook_is_registered_and_every_registered_notebook_exists():
    on_disk = sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb"))
    assert on_disk == sorted(nb.filename for nb in NOTEBOOKS)
    assert [nb.number for nb in NOTEBOOKS] == sorted(nb.number for nb in NOTEBOOKS), "keep the registry in order"
    for nb in NOTEBOOKS:
        assert (ROOT / "notebooks" / nb.filename).exists(), f"notebooks/{nb.filename} is missing"
        assert nb.slug.startswith(nb.number + "_")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda nb: nb.slug)
def test_modules_exist_and_name_their_notebook(nb):
    for name in filter(None, (nb.reference, nb.checks)):
        module = importlib.import_module(name)
        doc = (module.__doc__ or "").lower()
        assert f"notebook {nb.number}" in doc or f"notebooks {nb.number}" in doc, \
            f"{name}'s docstring does not name notebook {nb.number}"
    for path in nb.test_files():
        assert (ROOT / path).exists(), f"{path} (the tests of {nb.slug}'s module) is missing"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda nb: nb.slug)
def test_exercises_in_the_solution_match_the_registry_and_have_checks(nb):
    solution = nbformat.read(ROOT / "solutions" / nb.filename, as_version=4)
    found = nbmeta.exercises(solution)
    assert tuple(e.id for e in found) == nb.exercises
    if not nb.exercises:
        return
    checks = importlib.import_module(nb.checks)
    for exercise in found:
        check = getattr(checks, registry.check_name(exercise.id), None)
        assert isinstance(check, Check), f"{nb.checks} has no check {registry.check_name(exercise.id)}"
        assert check.exercise == exercise.id
        assert exercise.check_cell == exercise.cell + 1, f"{exercise.id}: its check cell must follow it"
        source = solution.cells[exercise.check_cell].source.strip().splitlines()
        assert source == [f"from {nb.checks} import {registry.check_name(exercise.id)}",
                          f"{registry.check_name(exercise.id)}()"], f"{exercise.id}: the check cell is not the two-line form"


def test_lookups():
    assert registry.by_slug("05_attention.ipynb").number == "05"
    assert registry.by_number("05").slug == "05_attention"
    assert "00" not in [nb.number for nb in registry.assigned()]
    with pytest.raises(KeyError):
        registry.by_slug("99_nothing")

"""The mutation harness (attn_course.tools.mutants): its operators make the mutants the course's
pitfalls are made of, and every check kills every mutant of its solution that is not listed as
equivalent (a fixed sample here; `python -m attn_course mutants` runs them all)."""

from __future__ import annotations

import importlib
from pathlib import Path

import nbformat
import pytest

from attn_course import registry
from attn_course.checks.core import check, expect_close, as_tensor
from attn_course.tools import nbmeta
from attn_course.tools.mutants import load_equivalents, message_slips, mutants_of, result_slips, run_exercise

ROOT = Path(__file__).resolve().parents[2]

CELL = '''def softmax(x, dim=-1, keepdims=True):
    """x: (..., n)"""
    ### BEGIN SOLUTION
    m = x.amax(dim=dim, keepdim=True)
    e = torch.exp(x - m)
    return e / e.sum(dim=dim, keepdim=True)
    ### END SOLUTION
'''


def test_operators_make_the_classic_mistakes():
    mutants = list(mutants_of("softmax", CELL))
    ids = {m.id.split(":")[0] for m in mutants}
    assert {"binop", "keyword", "call", "stmt", "default", "transpose"} <= ids
    sources = [m.source for m in mutants]
    assert any("torch.exp(x)" in s for s in sources), "the max shift dropped"
    assert any("x.amin(" in s for s in sources), "max -> min"
    assert any("e.mean(" in s for s in sources), "sum -> mean"
    assert any("amax(dim=-1," in s for s in sources), "the dim argument ignored (its default used)"
    assert any("x.amax(dim=dim)" in s for s in sources), "keepdim dropped"
    assert any("e.sum(dim=-2, keepdim=True)" in s for s in sources), "the axis replaced"
    assert all("keepdims=True" in s for s in sources), "the signature is never mutated"
    assert len({m.id for m in mutants}) == len(mutants), "mutant ids must be unique"
    assert all(m.source != CELL for m in mutants)


def test_a_check_kills_the_mutants_it_should_and_survivors_are_reported():
    import torch

    @check("softmax", expects="a function softmax(x, dim=-1)")
    def check_softmax(fn):
        x = torch.tensor([[1.0, 2.0, 30.0], [0.5, -1.0, 2.0]], dtype=torch.float64)
        for dim in (-1, 0):
            out = as_tensor(fn(x, dim=dim), tried=f"softmax(x, dim={dim})")
            expect_close(out, torch.softmax(x, dim), tried=f"softmax(x, dim={dim})")
        return "ok"

    solution = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch"),
                                               nbformat.v4.new_code_cell(CELL)])
    solution.cells[0].metadata["tags"] = ["setup"]
    solution.cells[1].metadata["tags"] = ["exercise"]
    from attn_course.tools import nbmeta

    nbmeta.normalize(solution)
    outcomes = run_exercise(solution, "softmax", check_softmax)
    assert len(outcomes) >= 20
    survivors = {o.mutant.id for o in outcomes if o.survived}
    # Dropping the max shift is invisible on these inputs only if no entry overflows: here one is 30,
    # which float64 handles, so that mutant survives — the kind of gap the harness exists to show.
    assert any(s.startswith("binop") or s.startswith("call") for s in survivors)
    killed = [o for o in outcomes if not o.survived]
    assert killed and all(o.summary for o in killed)


def _sample():
    for nb in registry.NOTEBOOKS:
        for exercise in nb.exercises:
            yield pytest.param(nb, exercise, id=f"{nb.number}-{exercise}")


_OUTCOMES: dict[str, list] = {}


def _sampled_outcomes(nb, exercise) -> list:
    """The check's verdicts on a fixed sample of 12 mutants of ``exercise`` (computed once per process)."""
    if exercise not in _OUTCOMES:
        solution = nbformat.read(ROOT / "solutions" / nb.filename, as_version=4)
        checker = getattr(importlib.import_module(nb.checks), registry.check_name(exercise))
        _OUTCOMES[exercise] = run_exercise(solution, exercise, checker, sample=12)
    return _OUTCOMES[exercise]


@pytest.mark.slow
@pytest.mark.parametrize("nb,exercise", list(_sample()))
def test_every_check_kills_a_sample_of_its_mutants(nb, exercise):
    equivalent = load_equivalents()
    outcomes = _sampled_outcomes(nb, exercise)
    survivors = [o.mutant for o in outcomes if o.survived and (exercise, o.mutant.id) not in equivalent]
    assert not survivors, "mutants the check passes (kill them with a stronger check, or list them as equivalent " \
        "with the reason in attn_course/tools/mutants_equivalent.json):\n" + "\n".join(
            f"{m.id}: {m.description}" for m in survivors)


def test_no_swap_of_identical_arguments():
    cell = CELL.replace("m = x.amax(dim=dim, keepdim=True)", "m = torch.maximum(x, x).amax(dim=dim, keepdim=True)\n"
                        "    m = torch.ones(3, 3) * 0 + m.amax(dim=dim, keepdim=True)")
    ids = [m.id for m in mutants_of("softmax", cell)]
    assert not any(i.startswith("swap:") and i.endswith("args-ones") for i in ids), "ones(3, 3) swapped is itself"


@pytest.mark.slow  # a fresh process, kernel or fork server: seconds
def test_every_listed_equivalent_names_a_mutant_that_exists_with_a_reason():
    equivalent = load_equivalents()
    assert equivalent, "the list is read"
    solutions = {}
    for nb in registry.NOTEBOOKS:
        for exercise in nb.exercises:
            solutions[exercise] = nb
    made: dict[str, set[str]] = {}
    for (exercise, mutant_id), reason in equivalent.items():
        assert exercise in solutions, f"{exercise}: no such exercise"
        assert len(reason) > 20, f"{exercise} {mutant_id}: say why it is equivalent"
        if exercise not in made:
            solution = nbformat.read(ROOT / "solutions" / solutions[exercise].filename, as_version=4)
            cell = next(c for c in solution.cells
                        if nbmeta.role(c) == nbmeta.EXERCISE and nbmeta.exercise_id(c) == exercise)
            made[exercise] = {m.id for m in mutants_of(exercise, cell.source)}
        assert mutant_id in made[exercise], \
            f"{exercise} {mutant_id}: listed as equivalent but no longer made (the solution changed): remove it"


# ---------------------------------------------------------------------------- the messages' wording (issue 22)
@pytest.mark.parametrize("text, slip", [
    ("got 2 rows: the 1 right ones after 1 that were never appended", "one of a plural"),
    ("expected 1 rows", "one of a plural"),
    ("inf in 1 entries", "one of a plural"),
    ("3 of 4 row", "of a singular"),
    ("the the cause", "a word twice"),
    ("got  nothing", "two spaces"),
])
def test_message_slips_are_found(text, slip):
    assert any(slip in found for found in message_slips(text)), message_slips(text)


@pytest.mark.parametrize("text", ["3 of 4 entries differ only in the first row", "head 1 of 2", "shape ()",
                                  "a 1-row tensor", "x.sum(dim=-1) then", "1 of 12 entries", "Q[0] @ K[0].T",
                                  "  2 |   0.5   1.0"])
def test_correct_wording_is_no_slip(text):
    assert not message_slips(text)


def test_expected_that_says_nothing_is_a_slip():
    assert message_slips("the expected values", part="expected")
    assert not message_slips("the values torch.softmax gives", part="expected")


@pytest.mark.slow
@pytest.mark.parametrize("nb,exercise", list(_sample()))
def test_every_message_for_a_sample_of_mutants_reads_right(nb, exercise):
    """Every check's verdict on its mutants, rendered: no "1 rows", no word twice, no empty field."""
    slips = [f"{o.mutant.id}: {slip}" for o in _sampled_outcomes(nb, exercise) if o.result is not None
             for slip in result_slips(o.result)]
    assert not slips, "\n".join(slips)

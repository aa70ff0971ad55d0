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
from attn_course.tools.mutants import (Outcome, as_row, compare_runs, load_equivalents, message_slips, mutants_of,
                                      result_slips, run_exercise)

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


def _toy():
    """A one-exercise solution notebook (the softmax above) and a check of it."""
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
    return solution, check_softmax


def test_a_check_kills_the_mutants_it_should_and_survivors_are_reported():
    solution, check_softmax = _toy()
    outcomes = run_exercise(solution, "softmax", check_softmax)
    assert len(outcomes) >= 20
    survivors = {o.mutant.id for o in outcomes if o.survived}
    # Dropping the max shift is invisible on these inputs only if no entry overflows: here one is 30,
    # which float64 handles, so that mutant survives — the kind of gap the harness exists to show.
    assert any(s.startswith("binop") or s.startswith("call") for s in survivors)
    killed = [o for o in outcomes if not o.survived]
    assert killed and all(o.summary for o in killed)


def _rows(outcomes) -> list[dict]:
    """Outcomes as a ``--json`` file holds them."""
    return [as_row(o) for o in outcomes]


def test_compare_names_a_changed_diagnosis_and_tells_a_mutant_whose_result_varies_apart():
    solution, check_softmax = _toy()
    outcomes = run_exercise(solution, "softmax", check_softmax)
    reruns = []

    def rerun(differ):
        reruns.append(sorted(o.mutant.id for o in differ))
        return [run_exercise(solution, "softmax", check_softmax, only={o.mutant.id for o in differ}) for _ in range(2)]

    same = compare_runs(_rows(outcomes), outcomes, rerun)
    assert len(same["same"]) == len(outcomes) and not same["changed"] + same["unstable"] + same["new"] + same["gone"]
    assert reruns == [], "nothing differs: nothing runs again"

    before = _rows(outcomes)
    killed = [r for r in before if r["status"] == "failed" and r["result"] and r["result"].get("diagnosis")]
    reworded, varies = killed[0], killed[1]
    reworded["result"]["diagnosis"]["cause"] += " (older wording)"  # what a refactor must not do
    varies["result"]["summary"] = "what the memory held in the earlier run"
    before.append({**before[0], "id": "binop:99:0:gone"})  # a mutant the solution no longer gives
    dropped = before.pop(next(i for i, r in enumerate(before) if r is not reworded and r is not varies))  # not there

    def rerun_varying(differ):  # this mutant's own result is not the same twice
        runs = rerun(differ)
        runs[1] = [Outcome(o.mutant, "error", "garbage", 0.0) if o.mutant.id == varies["id"] else o for o in runs[1]]
        return runs

    sorted_ = compare_runs(before, outcomes, rerun_varying)
    assert [o.mutant.id for o in sorted_["changed"]] == [reworded["id"]]
    assert [o.mutant.id for o in sorted_["unstable"]] == [varies["id"]]
    assert [o.mutant.id for o in sorted_["new"]] == [dropped["id"]]
    assert sorted_["gone"] == [("softmax", "binop:99:0:gone")]
    assert len(sorted_["same"]) == len(outcomes) - 3
    assert reruns[-1] == sorted([reworded["id"], varies["id"]]), "only what differs runs again"


@pytest.mark.slow
def test_compare_on_the_command_line_exits_1_only_when_a_verdict_or_message_changed(tmp_path, capsys):
    import argparse
    import json

    from attn_course.tools import mutants

    parser = argparse.ArgumentParser()
    mutants.configure(parser)
    first = tmp_path / "before.json"
    argv = ["solutions/05_attention.ipynb", "--solutions", str(ROOT / "solutions"), "--exercise", "score_matrix_bytes"]
    assert mutants.run(parser.parse_args([*argv, "--json", str(first)])) == 0
    assert mutants.run(parser.parse_args([*argv, "--compare", str(first)])) == 0
    assert " 0 changed" in capsys.readouterr().out
    rows = json.loads(first.read_text())
    target = next(r for r in rows if r["status"] == "failed" and r["result"])
    target["result"]["summary"] = "an older wording"
    first.write_text(json.dumps(rows))
    assert mutants.run(parser.parse_args([*argv, "--compare", str(first)])) == 1
    assert f"CHANGED score_matrix_bytes {target['id']}" in capsys.readouterr().out
    target["result"]["summary"] = target["summary"]
    target["result"]["diagnosis"]["cause"] = "an older cause"  # the same summary, another cause
    first.write_text(json.dumps(rows))
    assert mutants.run(parser.parse_args([*argv, "--compare", str(first)])) == 1
    assert "cause: 'an older cause'" in capsys.readouterr().out
    (tmp_path / "junk.json").write_text('{"not": "a run"}')
    assert mutants.run(parser.parse_args([*argv, "--compare", str(tmp_path / "junk.json")])) == 2
    assert "cannot read it as a --json file" in capsys.readouterr().err


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

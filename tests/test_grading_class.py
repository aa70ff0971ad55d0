"""Grading a whole class: a generated class of 20 submissions, correct, wrong, unfinished and broken.

The class is built at test time from the course's smallest notebook with exercises (its solution and
its generated exercise copy). Every way a submission can go wrong must end as rows saying what
happened, the rest of the class must still be graded, and no learner file may change.
"""

from __future__ import annotations

import csv
import hashlib
import time
from pathlib import Path

import nbformat
import pytest

from attn_course.exercises import BEGIN, END, CODE_STUB
from attn_course.grading import (
    ERROR,
    FAILED,
    NOT_ATTEMPTED,
    NOT_SUBMITTED,
    PASSED,
    check_cells,
    grade_class,
    main_class,
)

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"


def _smallest_graded_notebook() -> Path | None:
    """The solution with exercises and the fewest code cells whose exercise copy exists."""
    candidates = []
    for path in sorted(SOLUTIONS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        if check_cells(nb) and (ROOT / "notebooks" / path.name).exists():
            candidates.append((sum(c.cell_type == "code" for c in nb.cells), path))
    preferred = [p for _, p in candidates if p.name == "01_dot_product.ipynb"]  # quick checks
    return preferred[0] if preferred else (min(candidates)[1] if candidates else None)


SOLUTION = _smallest_graded_notebook()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(SOLUTION is None, reason="no solution notebook with exercises yet"),
]

MEMORY_LIMIT_MB = 800
CELL_TIMEOUT = 5
NOTEBOOK_TIMEOUT = 25  # generous: a loaded 2-core CI machine must not kill an honest submission
ADDRESS_SPACE_MB = 4096


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _graded_core(nb) -> nbformat.NotebookNode:
    """The notebook cut down to what grading needs: its first code cell (imports), then its exercise
    and check cells. The class's 20 submissions then cost seconds each, not a whole notebook's run."""
    nb = nbformat.from_dict(nb)
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells = [c for i, c in enumerate(nb.cells)
                if i == first or {"exercise", "check"} & set(c.metadata.get("tags", []))]
    return nb


def _exercise_indices(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if "exercise" in c.metadata.get("tags", [])]


def _with_answers(solution, exercise, keep: int) -> nbformat.NotebookNode:
    """The exercise notebook with the first ``keep`` exercises answered (the solution's code, unmarked)."""
    nb = nbformat.from_dict(exercise)
    for n, index in enumerate(_exercise_indices(nb)):
        if n < keep:
            lines = solution.cells[index].source.splitlines()
            nb.cells[index].source = "\n".join(l for l in lines if l.strip() not in (BEGIN, END))
    return nb


def _wrong(exercise) -> nbformat.NotebookNode:
    """Every exercise answered by returning None: a wrong answer every check must reject."""
    nb = nbformat.from_dict(exercise)
    for index in _exercise_indices(nb):
        nb.cells[index].source = nb.cells[index].source.replace(CODE_STUB[1], "return None")
    return nb


def _insert_first_code(nb, source: str) -> nbformat.NotebookNode:
    nb = nbformat.from_dict(nb)
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells.insert(first + 1, nbformat.v4.new_code_cell(source))
    return nb


def build_class(folder: Path) -> dict[str, str]:
    """Write 20 submissions into ``folder``; returns learner -> what kind of submission it is."""
    solution = _graded_core(_read(SOLUTION))
    exercise = _graded_core(_read(ROOT / "notebooks" / SOLUTION.name))
    name = SOLUTION.name
    kinds: dict[str, str] = {}

    def put(learner: str, kind: str, nb=None, *, raw: bytes | None = None, as_file: bool = False):
        kinds[learner] = kind
        target = folder / f"{learner}.ipynb" if as_file else folder / learner / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if raw is not None:
            target.write_bytes(raw)
        else:
            nbformat.write(nb, target)

    for i in range(2):
        put(f"correct-{i}", "correct", solution)
    put("correct-file", "correct", solution, as_file=True)  # one notebook per learner, any file name
    for i in range(2):
        put(f"unfinished-{i}", "unfinished", exercise)
    for i in range(2):
        put(f"partial-{i}", "partial", _with_answers(solution, exercise, keep=1))
    for i in range(2):
        put(f"wrong-{i}", "wrong", _wrong(exercise))

    cheat = _with_answers(solution, exercise, keep=0)
    for index, _ in check_cells(cheat):
        cheat.cells[index].source = 'print("✓ all good")'
    put("edited-checks", "edited checks", cheat)

    deleted = _with_answers(solution, exercise, keep=len(_exercise_indices(exercise)))
    first_ex = _exercise_indices(deleted)[0]
    first_check = next(i for i, _ in check_cells(deleted) if i > first_ex)
    del deleted.cells[first_check]  # the check cell too: grading must restore it
    del deleted.cells[first_ex]
    put("deleted-cells", "deleted cells", deleted)

    crash = _with_answers(solution, exercise, keep=len(_exercise_indices(exercise)))
    first = next(i for i, c in enumerate(crash.cells) if c.cell_type == "code")
    crash.cells[first].source = "import attn_course_no_such_module\n" + crash.cells[first].source
    put("raises-at-import", "raises at import", crash)

    put("infinite-loop", "infinite loop", _insert_first_code(exercise, "while True:\n    pass"))
    put("stubborn-loop", "loop ignoring interrupts", _insert_first_code(exercise, (
        "import time\n"
        "while True:\n"
        "    try:\n"
        "        time.sleep(0.05)\n"
        "    except KeyboardInterrupt:\n"
        "        pass")))
    put("not-json", "not JSON", raw=b'{"cells": [ this is not json')
    put("empty-file", "empty file", raw=b"")
    victim = folder / "correct-0" / name
    put("writes-outside", "writes outside", _insert_first_code(_with_answers(solution, exercise, keep=1), (
        "import os, shutil\n"
        "for attempt in (\n"
        f"    lambda: open({str(victim)!r}, 'w').write('overwritten'),\n"
        "    lambda: open('../escaped.txt', 'w').write('escaped'),\n"
        f"    lambda: os.remove({str(victim)!r}),\n"
        f"    lambda: shutil.rmtree({str(folder / 'correct-1')!r}),\n"
        f"    lambda: open({str(folder / 'planted.txt')!r}, 'x').write('planted'),\n"
        "):\n"
        "    try:\n"
        "        attempt()\n"
        "    except PermissionError as exc:\n"
        "        print('refused:', exc)\n"
        "open('inside.txt', 'w').write('writing in its own folder is fine')\n"
        f"open({str(victim)!r}, 'w')  # finally, unguarded: the error is the note")))
    put("memory-hog", "memory hog", _insert_first_code(exercise, (
        "hog = []\n"
        "for _ in range(40):  # 4 GB at most, in case the limit did not work\n"
        "    hog.append(bytearray(100 * 2**20))\n"
        "    hog[-1][::4096] = b'x' * len(hog[-1][::4096])")))
    # 6 GB of address space, never touched: harmless without a limit, refused at once under RLIMIT_AS.
    put("huge-alloc", "one huge allocation", _insert_first_code(exercise, (
        "import mmap\nblock = mmap.mmap(-1, 6 * 2**30)")))
    stranger = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('hello')")])
    put("not-course", "not a course notebook", stranger, as_file=True)
    return kinds


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("class")
    folder = base / "submissions"
    kinds = build_class(folder)
    before = _digests(folder)
    start = time.perf_counter()
    rows, warnings = grade_class(folder, solutions_dir=SOLUTIONS, cell_timeout=CELL_TIMEOUT,
                                 notebook_timeout=NOTEBOOK_TIMEOUT, memory_limit_mb=MEMORY_LIMIT_MB,
                                 address_space_mb=ADDRESS_SPACE_MB, jobs=2, progress=False)
    seconds = time.perf_counter() - start
    print(f"\ngraded a class of {len(kinds)} submissions of {SOLUTION.name} in {seconds:.0f} s")
    from attn_course.grading import class_summary

    (base / "summary.md").write_text(class_summary(rows, warnings), encoding="utf-8")
    return {"folder": folder, "base": base, "kinds": kinds, "rows": rows, "warnings": warnings,
            "before": before, "after": _digests(folder), "seconds": seconds}


def _of(graded, learner):
    return [r for r in graded["rows"] if r.learner == learner]


def test_class_is_large_enough(graded):
    assert len(graded["kinds"]) >= 20
    assert {r.learner for r in graded["rows"]} == set(graded["kinds"])


def test_learner_files_are_never_modified(graded):
    assert graded["after"] == graded["before"]
    assert graded["warnings"] == []
    assert not (graded["base"] / "escaped.txt").exists()


def test_correct_submissions_pass_everything(graded):
    for learner, kind in graded["kinds"].items():
        if kind == "correct":
            rows = _of(graded, learner)
            assert rows and all(r.status == PASSED for r in rows), rows


def test_unfinished_and_partial(graded):
    n = len(check_cells(_read(SOLUTION)))
    for learner, kind in graded["kinds"].items():
        statuses = [r.status for r in _of(graded, learner)]
        if kind == "unfinished":
            assert statuses == [NOT_ATTEMPTED] * n
        if kind == "partial":
            assert statuses == [PASSED] + [NOT_ATTEMPTED] * (n - 1)


def test_wrong_answers_fail_with_a_message(graded):
    for learner in (l for l, k in graded["kinds"].items() if k == "wrong"):
        for row in _of(graded, learner):
            assert row.status == FAILED and row.message, row


def test_edited_check_cells_are_replaced_by_the_course_checks(graded):
    assert all(r.status == NOT_ATTEMPTED for r in _of(graded, "edited-checks"))


def test_deleted_cells(graded):
    rows = _of(graded, "deleted-cells")
    assert rows[0].status == FAILED and "deleted" in rows[0].message
    assert "restored" in rows[0].note
    assert all(r.status == PASSED for r in rows[1:])


def test_raises_at_import(graded):
    rows = _of(graded, "raises-at-import")
    assert "ModuleNotFoundError" in rows[0].note
    assert all(r.status in (FAILED, PASSED) for r in rows)  # graded anyway


def test_infinite_loop_is_interrupted_and_the_rest_graded(graded):
    rows = _of(graded, "infinite-loop")
    assert "KeyboardInterrupt" in rows[0].note
    assert all(r.status == NOT_ATTEMPTED for r in rows)


def test_loop_ignoring_interrupts_hits_the_notebook_limit(graded):
    rows = _of(graded, "stubborn-loop")
    assert all(r.status == ERROR for r in rows)
    assert all(f"past {NOTEBOOK_TIMEOUT} s" in r.message or f"past {CELL_TIMEOUT} s" in r.message for r in rows)


def test_unreadable_files(graded):
    for learner, phrase in (("not-json", "not valid JSON"), ("empty-file", "empty")):
        rows = _of(graded, learner)
        assert rows and all(r.status == ERROR and phrase in r.message for r in rows), rows


def test_writes_outside_its_folder_are_refused(graded):
    rows = _of(graded, "writes-outside")
    assert "tried to write outside its folder" in rows[0].note
    assert rows[0].status == PASSED  # its own work still counts
    assert not (graded["folder"] / "planted.txt").exists()


def test_memory_hog_is_stopped(graded):
    rows = _of(graded, "memory-hog")
    assert all(r.status == ERROR and f"more than {MEMORY_LIMIT_MB} MB" in r.message for r in rows), rows
    assert rows[0].peak_mb is not None and rows[0].peak_mb > MEMORY_LIMIT_MB * 0.9
    assert rows[0].peak_mb < MEMORY_LIMIT_MB + 1500  # stopped, not after eating the 4 GB
    assert rows[0].seconds < NOTEBOOK_TIMEOUT


def test_one_huge_allocation_fails_at_once(graded):
    rows = _of(graded, "huge-alloc")
    assert "OSError" in rows[0].note and "allocate memory" in rows[0].note
    assert all(r.status == NOT_ATTEMPTED for r in rows)  # the rest of the notebook still ran


def test_not_a_course_notebook(graded):
    rows = _of(graded, "not-course")
    unknown = [r for r in rows if r.exercise == "-"]
    assert len(unknown) == 1 and unknown[0].status == ERROR and "not one of the course" in unknown[0].message
    # The course notebook the rest of the class handed in counts as not submitted for this learner.
    assert {r.status for r in rows if r.exercise != "-"} == {NOT_SUBMITTED}


def test_class_table_and_summary(graded, tmp_path):
    from attn_course.grading import write_class

    paths = write_class(graded["rows"], graded["warnings"], tmp_path / "out")
    with paths["grades"].open(encoding="utf-8") as fh:
        long = list(csv.DictReader(fh))
    assert len(long) == len(graded["rows"])
    with paths["table"].open(encoding="utf-8") as fh:
        wide = list(csv.reader(fh))
    assert len(wide) == 1 + len(graded["kinds"])
    summary = paths["summary"].read_text(encoding="utf-8")
    for heading in ("## Per learner", "## Per exercise", "## Most often failed"):
        assert heading in summary
    most = summary.split("## Most often failed")[1]
    # The two "wrong" learners made the same mistake (returning None): it is the top diagnosis, twice.
    first = [l for l in most.splitlines() if l.startswith("| ") and "exercise |" not in l and "---" not in l][0]
    assert "None" in first and first.endswith("(2) |"), first


def test_cli_refuses_to_write_into_the_class_folder(tmp_path):
    (tmp_path / "class").mkdir()
    out = []

    class Sink:
        def write(self, text):
            out.append(text)

    code = main_class(str(tmp_path / "class"), out_dir=str(tmp_path / "class" / "grades"), solutions=None,
                      cell_timeout=5, notebook_timeout=5, memory_limit_mb=100, address_space_mb=None, jobs=1,
                      out=Sink())
    assert code == 2 and "outside the submissions folder" in "".join(out)

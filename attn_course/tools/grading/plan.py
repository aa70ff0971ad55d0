"""Which cells the learner's process runs for one notebook: only what a verdict needs.

In the learner's notebook order:

* the course's set-up cells (imports) first — the course's copy, so a deleted import cell costs nothing;
* every exercise cell of the learner (found by its nbgrader ``grade_id``), each followed at once by
  the course's check cell for it — the course's copy, never the learner's (an edited or deleted check
  cell changes nothing). A check whose exercise cell is missing runs at the end;
* every cell the learner added (code that is neither an exercise, a check, nor one of the course's
  own cells), in case the answer uses it;
* a demonstration cell only when an answer reads a name that only that cell defines (found by
  static analysis, transitively); all other demonstrations — figures, timings, widgets — are skipped.

The learner's own check cells never run.
"""

from __future__ import annotations

from dataclasses import dataclass

import nbformat

from .. import nbmeta
from .course import CourseNotebook, normalise
from . import static

__all__ = ["PlanCell", "plan", "exercise_cells"]


@dataclass
class PlanCell:
    kind: str  # setup | exercise | added | demo | check
    source: str
    exercise: str | None = None  # for exercise and check cells
    name: str | None = None  # for check cells: the name the check looks up
    origin: int | None = None  # index of the learner's cell it came from (None: the course's)

    def job(self, timeout: float) -> dict:
        return {"kind": self.kind, "source": self.source, "exercise": self.exercise, "name": self.name,
                "timeout": timeout}


def exercise_cells(nb: nbformat.NotebookNode, course_nb: CourseNotebook) -> dict[str, int]:
    """``exercise id -> index`` of the learner's exercise cell for each course exercise (the first
    one carrying that grade_id; a notebook without metadata is matched by the names its cells define)."""
    found: dict[str, int] = {}
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        if nbmeta.role(cell) == nbmeta.EXERCISE:
            ident = nbmeta.exercise_id(cell)
            if ident in course_nb.exercises and ident not in found:
                found[ident] = index
    if found:
        return found
    for index, cell in enumerate(nb.cells):  # no metadata at all: by what the cells define
        if cell.get("cell_type") != "code" or nbmeta.role(cell) is not None:
            continue
        bound = static.bound_names(cell.get("source", ""))
        for ident, ex in course_nb.exercises.items():
            if ex.name in bound and ident not in found:
                found[ident] = index
    return found


def plan(nb: nbformat.NotebookNode, course_nb: CourseNotebook, *, dependencies: bool = True) -> list[PlanCell]:
    """The cells to run, in order (see the module docstring)."""
    cells: list[PlanCell] = [PlanCell("setup", source) for source in course_nb.setup]
    mine = exercise_cells(nb, course_nb)
    by_index = {index: ident for ident, index in mine.items()}
    skipped: list[tuple[int, PlanCell]] = []  # demonstrations, kept in case an answer needs one
    body: list[tuple[int, PlanCell]] = []
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if index in by_index:
            ident = by_index[index]
            body.append((index, PlanCell("exercise", source, ident, origin=index)))
            body.append((index, _check(course_nb, ident)))
            continue
        role = nbmeta.role(cell)
        if role == nbmeta.CHECK or not source.strip():
            continue
        known = course_nb.known.get(normalise(source))
        if known in ("setup", "check"):
            continue
        if known == "demo":
            skipped.append((index, PlanCell("demo", source, origin=index)))
            continue
        body.append((index, PlanCell("added", source, origin=index)))
    if dependencies:
        body += _needed(cells, body, skipped)
        body.sort(key=lambda item: item[0])
    cells += [cell for _, cell in body]
    cells += [_check(course_nb, ident) for ident in course_nb.exercises if ident not in mine]
    return cells


def _check(course_nb: CourseNotebook, ident: str) -> PlanCell:
    ex = course_nb.exercises[ident]
    return PlanCell("check", ex.check_source, ident, name=ex.name)


def _needed(setup: list[PlanCell], body: list[tuple[int, PlanCell]],
            skipped: list[tuple[int, PlanCell]]) -> list[tuple[int, PlanCell]]:
    """The skipped demonstration cells that define a name the planned cells read (transitively)."""
    bound: set[str] = set()
    for cell in setup:
        bound |= static.bound_names(cell.source)
    for _, cell in body:
        if cell.kind != "check":
            bound |= static.bound_names(cell.source)
    wanted: set[str] = set()
    for _, cell in body:
        if cell.kind in ("exercise", "added"):
            wanted |= static.used_names(cell.source)
    wanted -= bound
    taken: list[tuple[int, PlanCell]] = []
    remaining = list(skipped)
    while wanted and remaining:
        progress = False
        for item in list(remaining):
            names = static.bound_names(item[1].source)
            if names & wanted:
                taken.append(item)
                remaining.remove(item)
                bound |= names
                wanted |= static.used_names(item[1].source)
                wanted -= bound
                progress = True
        if not progress:
            break
    return taken

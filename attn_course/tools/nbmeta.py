"""Exercise identity in cell metadata, nbgrader's way: which cells are exercises, checks and set-up.

An author marks cells in a solution notebook with a tag; :func:`normalize` (run by the exercise
generator) writes the matching nbgrader metadata, so that the real nbgrader, the course's grader,
the schedule and the tests all read the same thing:

============  ==========================================================================================
tag           metadata written
============  ==========================================================================================
``exercise``  ``nbgrader: {solution: true, grade: false, grade_id: <exercise id>, locked: false}``; the
              exercise id is the name the cell defines (``def attention`` → ``attention``)
``check``     ``nbgrader: {solution: false, grade: true, grade_id: check_<exercise id>, points: 1,
              locked: true}``; it checks the exercise cell above it
``setup``     nothing for nbgrader; the grader runs these cells (imports, seeds) and skips the
              demonstrations in between, which no verdict needs
============  ==========================================================================================

Exercise and check cells also get the ``raises-exception`` tag: JupyterLab's Run All and nbclient
then go on past an exercise cell with an error. Run All does not rely on it for unfinished or wrong
answers: in a notebook a check that is not passed shows its diagnosis without raising
(:func:`attn_course.checks.core.raises`), so VS Code and Colab, which ignore tags, reach the end too.
Under pytest the course's plugin (:mod:`attn_course.pytest_plugin`) fails a check cell whose result is
not passed, and takes the tag's licence away, so ``pytest --nbval-lax`` still fails on a wrong answer.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

import nbformat

__all__ = ["EXERCISE", "CHECK", "SETUP", "RAISES", "role", "exercise_id", "defined_name", "normalize",
           "Exercise", "exercises", "check_grade_id"]

EXERCISE, CHECK, SETUP = "exercise", "check", "setup"
RAISES = "raises-exception"
SCHEMA_VERSION = 3


def check_grade_id(exercise: str) -> str:
    return f"check_{exercise}"


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def role(cell) -> str | None:
    """``"exercise"``, ``"check"``, ``"setup"`` or None, from nbgrader metadata first, then tags."""
    meta = cell.get("metadata", {}).get("nbgrader")
    if isinstance(meta, dict):
        if meta.get("solution"):
            return EXERCISE
        if meta.get("grade"):
            return CHECK
    tags = _tags(cell)
    for name in (EXERCISE, CHECK, SETUP):
        if name in tags:
            return name
    return None


def exercise_id(cell) -> str | None:
    """The exercise an exercise or check cell belongs to (from its nbgrader ``grade_id``)."""
    meta = cell.get("metadata", {}).get("nbgrader")
    if not isinstance(meta, dict) or not isinstance(meta.get("grade_id"), str):
        return None
    grade_id = meta["grade_id"]
    if meta.get("grade") and grade_id.startswith("check_"):
        return grade_id[len("check_"):]
    return grade_id


def defined_name(source: str) -> str | None:
    """The first top-level function or class a cell defines (a regex fallback when it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        match = re.search(r"^(?:def|class)\s+([A-Za-z_]\w*)", source, re.M)
        return match.group(1) if match else None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return node.name
    return None


def normalize(nb: nbformat.NotebookNode, where: str = "") -> list[str]:
    """Write nbgrader metadata and the ``raises-exception`` tag from the authoring tags, in place.

    Returns the problems found (an exercise cell that defines nothing, a check with no exercise above
    it, two exercises with one id); the notebook is still normalised as far as possible."""
    problems: list[str] = []
    current: str | None = None
    seen: set[str] = set()
    for index, cell in enumerate(nb.cells):
        kind = role(cell)
        if kind not in (EXERCISE, CHECK):
            continue
        if kind == EXERCISE:
            current = defined_name(cell.source)
            if current is None:
                problems.append(f"{where} cell {index}: an exercise cell must define a function or class")
                continue
            if current in seen:
                problems.append(f"{where} cell {index}: a second exercise named {current!r}")
            seen.add(current)
            meta = {"grade": False, "grade_id": current, "locked": False, "schema_version": SCHEMA_VERSION,
                    "solution": True, "task": False}
        else:
            if current is None:
                problems.append(f"{where} cell {index}: a check cell with no exercise cell above it")
                continue
            meta = {"grade": True, "grade_id": check_grade_id(current), "locked": True, "points": 1,
                    "schema_version": SCHEMA_VERSION, "solution": False, "task": False}
            current = None  # one check per exercise
        cell.metadata["nbgrader"] = meta
        tags = [t for t in _tags(cell) if t not in (EXERCISE, CHECK, RAISES)]
        cell.metadata["tags"] = [kind, *tags, RAISES]
    return problems


@dataclass(frozen=True)
class Exercise:
    """One exercise of a notebook: its id and the indices of its exercise and check cells."""

    id: str
    cell: int
    check_cell: int | None


def exercises(nb: nbformat.NotebookNode) -> list[Exercise]:
    """The notebook's exercises in order, read from nbgrader metadata."""
    found: dict[str, list[int | None]] = {}
    for index, cell in enumerate(nb.cells):
        kind, ident = role(cell), exercise_id(cell)
        if ident is None or kind not in (EXERCISE, CHECK):
            continue
        slot = found.setdefault(ident, [None, None])
        position = 0 if kind == EXERCISE else 1
        if slot[position] is None:  # the first one counts; the grader reports duplicates
            slot[position] = index
    return [Exercise(ident, cells[0], cells[1]) for ident, cells in found.items() if cells[0] is not None]

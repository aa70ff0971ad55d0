"""From files to submissions: which course notebook each file is, and which copy of it is graded.

A notebook's identity is the exercises it holds — the nbgrader ``grade_id`` of its exercise cells
(or, in a notebook without that metadata, the names its cells define) — never its file name: a
correct 05 saved as ``03_softmax.ipynb`` is graded as 05 and flagged. When a learner has several
copies of one notebook (``05_attention (1).ipynb``, ``-Copy1``, a generator backup in
``notebooks/backups/``, a Jupyter checkpoint), exactly one is graded, chosen by a fixed rule — the
copy with the most exercises attempted, then the learner's notebook before a backup before a
checkpoint, then the plain name, then the path — and the row says which and lists the others (a
Jupyter checkpoint, which every saved notebook has, is listed only when it is the copy graded).

A copy of the course's own solution notebook inside a learner's folder (a whole course clone, with
its ``solutions/``) is not the learner's work: it is named in a warning and not graded. Exercise code
identical to the course's solutions is graded but flagged.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .. import nbmeta
from . import files, static
from .course import Course, CourseNotebook, normalise
from .plan import exercise_cells

__all__ = ["Submission", "read_submission", "identify", "choose", "file_slug", "collect"]

#: More cells than any course notebook has: a file holding more is not read further.
MAX_CELLS = 5000
#: The most notebook bytes read for one learner: copies past that are named in a warning, not read.
MAX_LEARNER_BYTES = 4 * files.MAX_NOTEBOOK_BYTES

_COPY = re.compile(r"(\s*\(\d+\)|-copy\d*|\s+copy\d*|-checkpoint|\.updated|[-_ ]\d{8}[-_T]?\d{4,6})$", re.I)


@dataclass
class Submission:
    """One learner's file, read and identified (``notebook`` is None when it is no course notebook)."""

    learner: str
    path: Path
    rel: str
    where: str = "notebook"
    data: bytes = b""
    nb: nbformat.NotebookNode | None = None
    notebook: CourseNotebook | None = None
    problem: str = ""  # why it cannot be graded (unreadable, not a notebook)
    flags: list[str] = field(default_factory=list)
    attempted: int = 0  # exercise cells that differ from the course's stub
    sha: str = ""  # digest of the file's bytes
    code: str = ""  # digest of the learner's exercise code (same answers, same digest)
    solution_copy: bool = False  # every exercise cell is the course's solution

    @property
    def slug(self) -> str:
        return self.notebook.slug if self.notebook else file_slug(self.rel)


def file_slug(name: str) -> str:
    """``05_attention`` from ``ada/05_attention (1).ipynb``, ``05_attention-Copy1.IPYNB``, …"""
    stem = Path(name).name
    if stem.lower().endswith(".ipynb"):
        stem = stem[: -len(".ipynb")]
    for _ in range(3):
        stem = _COPY.sub("", stem)
    return stem


def identify(nb: nbformat.NotebookNode, name: str, course: Course) -> tuple[CourseNotebook | None, str]:
    """The course notebook ``nb`` is, and how that was told ("exercises", "names", "file name" or "")."""
    ids = {nbmeta.exercise_id(c) for c in nb.cells if nbmeta.role(c) in (nbmeta.EXERCISE, nbmeta.CHECK)} - {None}
    slug = file_slug(name)

    def best(score) -> CourseNotebook | None:
        ranked = sorted(course.notebooks.values(), key=lambda n: (-score(n), n.slug != slug, n.slug))
        return ranked[0] if ranked and score(ranked[0]) > 0 else None

    found = best(lambda n: len(ids & set(n.exercises)))
    if found:
        return found, "exercises"
    if slug in course.ungraded:
        return None, ""
    defined: set[str] = set()
    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            defined |= static.bound_names(cell.get("source", ""))

    def names(n: CourseNotebook) -> int:  # at least half of a notebook's exercises defined, or nothing
        hits = len(defined & {e.name for e in n.exercises.values()})
        return hits if 2 * hits >= len(n.exercises) else 0

    if slug in course.notebooks:
        return course.notebooks[slug], "file name" if not names(course.notebooks[slug]) else "names"
    found = best(names)
    return (found, "names") if found else (None, "")


def read_submission(found: files.Found, course: Course) -> Submission:
    """Read, parse and identify one found file (never raises: problems are recorded)."""
    sub = Submission(found.learner, found.path, found.rel, found.where)
    if found.where == "checkpoint":
        sub.flags.append("graded from a Jupyter checkpoint copy")
    try:
        sub.data = files.read_file(found.path)
    except files.Unreadable as exc:
        sub.problem = f"not read: {exc}"
        return sub
    sub.sha = hashlib.sha256(sub.data).hexdigest()
    if not sub.data.strip():
        sub.problem = "an empty file, not a notebook"
        return sub
    try:
        text = sub.data.decode("utf-8-sig")
    except UnicodeDecodeError:
        sub.problem = "not a notebook (not UTF-8 text)"
        return sub
    try:
        # Counted before nbformat validates (seconds per thousand cells): a file of a million tiny cells,
        # hard-linked a thousand times, would keep the class waiting for days.
        raw = json.loads(text)
        if isinstance(raw, dict) and isinstance(raw.get("cells"), list) and len(raw["cells"]) > MAX_CELLS:
            sub.problem = f"not a course notebook ({len(raw['cells'])} cells; the limit is {MAX_CELLS})"
            return sub
        del raw
        nb = nbformat.reads(text, as_version=4)
    except Exception as exc:  # noqa: BLE001 - JSON errors, validation errors, recursion in nested JSON
        from nbformat.reader import NotJSONError

        kind = "not valid JSON" if isinstance(exc, (NotJSONError, json.JSONDecodeError)) else "not a readable notebook"
        sub.problem = f"{kind} ({type(exc).__name__})"
        return sub
    if not isinstance(nb.get("cells"), list) or not all(isinstance(cell, dict) for cell in nb.cells):
        sub.problem = "not a notebook (no cells)"
        return sub
    for cell in nb.cells:
        _plain_cell(cell)
    try:
        _identify(sub, nb, found, course)
    except Exception as exc:  # noqa: BLE001 - whatever else the file holds, one learner's file never stops the class
        sub.nb, sub.notebook, sub.flags = None, None, [f for f in sub.flags if "checkpoint" in f]
        sub.problem = f"not a readable notebook ({type(exc).__name__})"
    return sub


def _plain_cell(cell: dict) -> None:
    """A cell as the grader reads it, whatever the file said (nbformat does not validate everything): the
    source as text, metadata a mapping, tags a list of strings, nbgrader metadata a mapping or absent."""
    src = cell.get("source", "")
    cell["source"] = "".join(map(str, src)) if isinstance(src, list) else str(src)
    if not isinstance(cell.get("cell_type"), str):
        cell["cell_type"] = "raw"
    meta = cell.get("metadata")
    if not isinstance(meta, dict):
        cell["metadata"] = meta = nbformat.NotebookNode()
    tags = meta.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        meta["tags"] = [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []
    if "nbgrader" in meta and not isinstance(meta["nbgrader"], dict):
        del meta["nbgrader"]


def _identify(sub: Submission, nb: nbformat.NotebookNode, found: files.Found, course: Course) -> None:
    sub.nb = nb
    sub.notebook, how = identify(nb, found.rel, course)
    if sub.notebook is None:
        return
    named = file_slug(found.rel)
    if how == "file name":
        sub.flags.append("identified by its file name only (no exercise found in it)")
    elif named != sub.notebook.slug and (named in course.notebooks or named in course.ungraded):
        sub.flags.append(f"saved as {Path(found.rel).name} but holds {sub.notebook.slug}'s exercises")
    mine = exercise_cells(nb, sub.notebook)
    answers = []
    same_as_solution = 0
    for ident, ex in sub.notebook.exercises.items():
        source = nb.cells[mine[ident]].source if ident in mine else ""
        answers.append(normalise(source))
        if ident in mine and normalise(source) not in ("", normalise(ex.stub)):
            sub.attempted += 1
        if ident in mine and normalise(source) == normalise(ex.solution):
            same_as_solution += 1
    sub.code = hashlib.sha256("\0".join(answers).encode()).hexdigest()[:16]
    sub.solution_copy = same_as_solution == len(sub.notebook.exercises)
    if same_as_solution:
        sub.flags.append(f"{same_as_solution} of {len(sub.notebook.exercises)} exercise cells are the course's "
                         "solution, character for character")


def _order(sub: Submission) -> tuple:
    return (sub.solution_copy, -sub.attempted, {"notebook": 0, "backup": 1, "checkpoint": 2, "solutions": 3}[sub.where],
            Path(sub.rel).stem != sub.slug, sub.rel)


def choose(subs: list[Submission]) -> Submission:
    """The one copy graded among a learner's copies of one notebook (rule in the module docstring)."""
    ranked = sorted(subs, key=_order)
    chosen = ranked[0]
    # Jupyter keeps a checkpoint copy of every saved notebook: worth a word only when it is what was graded
    # (then every other copy is named), never when the learner's own notebook was.
    others = [s for s in ranked[1:] if chosen.where == "checkpoint" or s.where != "checkpoint"]
    if others:
        listed = ", ".join(f"{s.rel} ({s.attempted} attempted)" for s in others[:3])
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        chosen.flags.append(f"{len(others) + 1} copies: graded {chosen.rel} ({chosen.attempted} attempted); "
                            f"not graded: {listed}{more}")
    return chosen


def collect(learner: str, found: list[files.Found],
            course: Course) -> tuple[list[Submission], list[Submission], list[str]]:
    """A learner's files → (one submission per course notebook, files that are not gradable, warnings)."""
    warnings: list[str] = []
    by_slug: dict[str, list[Submission]] = {}
    rejected: list[Submission] = []
    budget, unread = MAX_LEARNER_BYTES, []
    for item in sorted(found, key=lambda f: (f.priority, f.rel)):  # the learner's own notebooks first
        try:
            size = os.lstat(item.path).st_size
        except OSError:
            size = 0
        size = size if size <= files.MAX_NOTEBOOK_BYTES else 0  # too large: refused unread (read_file)
        if size > budget:
            unread.append(item.rel)
            continue
        budget -= size
        sub = read_submission(item, course)
        if sub.problem:
            rejected.append(sub)
            continue
        if sub.notebook is None:
            if file_slug(item.rel) in course.ungraded:
                continue  # 00_setup: nothing to grade
            warnings.append(f"{item.rel}: not one of the course's notebooks (none of its exercises is in it); "
                            "not graded")
            continue
        if sub.where == "solutions" and sub.solution_copy:
            warnings.append(f"{item.rel}: the course's own solution notebook (a copy of the course?); "
                            f"not graded as {learner}'s work")
            continue
        by_slug.setdefault(sub.notebook.slug, []).append(sub)
    if unread:
        warnings.append(f"{learner}: {len(unread)} notebooks not read, past {MAX_LEARNER_BYTES // 2**20} MiB of "
                        f"notebooks in all: {', '.join(unread[:3])}" + (" and more" if len(unread) > 3 else ""))
    chosen = [choose(subs) for _, subs in sorted(by_slug.items())]
    graded = {s.notebook.slug for s in chosen}
    for sub in rejected:
        slug = file_slug(sub.rel)
        if slug in graded or slug in course.ungraded:
            warnings.append(f"{sub.rel}: {sub.problem}; another copy was graded")
        elif slug in course.notebooks:
            sub.notebook = course.notebooks[slug]  # one row per exercise says why it could not be read
            chosen.append(sub)
            graded.add(slug)
        else:
            warnings.append(f"{sub.rel}: {sub.problem}; not graded")
    return chosen, rejected, warnings

"""The course a submission is graded against: its solution notebooks, their exercises and the checks.

Where the solutions are (:func:`find_solutions`): ``--solutions FOLDER`` when given; else the
folder named by ``ATTN_COURSE_SOLUTIONS``; else ``solutions/`` of the course root
(:mod:`attn_course.tools.layout`: ``ATTN_COURSE_ROOT``, or the nearest folder at or above the current
one holding ``solutions/`` and ``notebooks/`` — where the README tells everyone to run commands).
The package never guesses a path from where it is installed (a non-editable install holds no
notebooks), and when none is found the message says what to pass.

:class:`Course` reads every solution notebook once and keeps, per exercise (its nbgrader
``grade_id``): the solution's and the generated stub's exercise code, the course's check cell and
the :class:`~attn_course.checks.core.Check` object it calls — resolved from the check cell itself
and imported *here, before any learner code runs*. :func:`preload_course` imports every other module
of the package as well, so the grader never imports course code after learners' processes have run
(a later import could read a file a submission managed to change); :meth:`Course.fingerprint` digests
the course's files, compared at the end of grading.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import os
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .. import nbmeta
from . import files

__all__ = ["SOLUTIONS_ENV", "CourseNotFound", "find_solutions", "preload_course", "normalise",
           "CourseExercise", "CourseNotebook", "Course"]

SOLUTIONS_ENV = "ATTN_COURSE_SOLUTIONS"
_HOW = ("run the command in the course's folder (the one holding solutions/ and notebooks/), or pass "
        f"--solutions FOLDER (or set {SOLUTIONS_ENV}); an installed attn_course package does not include the notebooks")


class CourseNotFound(Exception):
    """The course's solution notebooks are not where they were looked for (the message says what to do)."""


def _has_notebooks(folder: Path) -> bool:
    try:
        return folder.is_dir() and any(p.suffix == ".ipynb" for p in folder.iterdir())
    except OSError:
        return False


def find_solutions(explicit: str | os.PathLike | None = None, *, cwd: Path | None = None) -> Path:
    """The folder of the course's solution notebooks (see the module docstring); raises CourseNotFound."""
    for given, origin in ((explicit, "--solutions"), (os.environ.get(SOLUTIONS_ENV), SOLUTIONS_ENV)):
        if given:
            folder = Path(given).expanduser()
            if not _has_notebooks(folder):
                raise CourseNotFound(f"{origin} {folder}: not a folder of the course's solution notebooks")
            return folder.resolve()
    from ..layout import find_root

    here = (cwd or Path.cwd()).resolve()
    root = find_root(here)
    if root is not None and _has_notebooks(root / "solutions"):
        return (root / "solutions").resolve()
    raise CourseNotFound(f"cannot find the course's solution notebooks from {here}: {_HOW}")


def preload_course() -> list[str]:
    """Import every module of ``attn_course`` (but the tooling) now; returns those that failed."""
    import attn_course

    failed = []
    for info in pkgutil.walk_packages(attn_course.__path__, "attn_course."):
        if info.name.startswith("attn_course.tools") or info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - an optional dependency (triton) or a module mid-edit
            failed.append(info.name)
    return failed


def normalise(source: str) -> str:
    """Source compared as code: trailing spaces and surrounding blank lines do not count."""
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def _resolve_check(source: str, exercise: str):
    """The Check object a course check cell calls, or (None, why not)."""
    from attn_course.checks.core import Check

    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return None, f"the course's check cell does not parse ({exc.msg})"
    imported = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attn_course.checks"):
            for alias in node.names:
                imported[alias.asname or alias.name] = (node.module, alias.name)
    called = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    for name in called:
        if name in imported:
            module, attr = imported[name]
            try:
                obj = getattr(importlib.import_module(module), attr)
            except Exception as exc:  # noqa: BLE001
                return None, f"the course's check {module}.{attr} cannot be imported ({type(exc).__name__})"
            if not isinstance(obj, Check):
                return None, f"{module}.{attr} is not a check that can be replayed (not yet ported?)"
            if obj.exercise != exercise:
                return None, f"{module}.{attr} checks {obj.exercise!r}, not {exercise!r}"
            return obj, ""
    return None, "the course's check cell calls no check of attn_course.checks"


@dataclass
class CourseExercise:
    """One exercise of the course, as the grader needs it."""

    id: str  # the nbgrader grade_id
    name: str  # what the learner's exercise cell defines (the check looks this name up)
    solution: str  # the solution's exercise cell
    stub: str  # the same cell in the generated exercise notebook
    check_source: str  # the course's check cell, the only one ever run
    check: object | None  # the attn_course.checks.core.Check it calls
    problem: str = ""  # why the check cannot be replayed (then every verdict is "error")


@dataclass
class CourseNotebook:
    slug: str
    path: Path
    title: str
    exercises: dict[str, CourseExercise]  # in notebook order
    setup: list[str]  # the set-up cells (imports), run first in every learner process
    known: dict[str, str] = field(default_factory=dict)  # normalised source -> role of every other code cell
    solution_code: str = ""  # digest of the solution's exercise code (an unedited copy of the solution)
    allowed_imports: frozenset[str] = frozenset()  # attn_course imports the course's own cells make
    digest: str = ""  # of the solution notebook's file

    @property
    def number(self) -> str:
        return self.slug.split("_", 1)[0]

    def exercise_ids(self) -> list[str]:
        return list(self.exercises)


def _title(nb: nbformat.NotebookNode, slug: str) -> str:
    try:
        from ...registry import by_slug

        return by_slug(slug).title
    except Exception:  # noqa: BLE001 - a course notebook the registry does not list (yet)
        pass
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("#"):
            return cell.source.lstrip().splitlines()[0].lstrip("# ").strip()
    return slug


def _course_imports(sources: list[str]) -> frozenset[str]:
    found = set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attn_course"):
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("attn_course"))
    return frozenset(found)


def load_notebook(path: Path) -> CourseNotebook:
    """Read one solution notebook into a :class:`CourseNotebook` (checks resolved and imported)."""
    from ..exercises import strip_solution

    data = files.read_file(path, limit=files.MAX_NOTEBOOK_BYTES)
    nb = nbformat.reads(data.decode("utf-8-sig"), as_version=4)
    slug = path.stem
    exercises: dict[str, CourseExercise] = {}
    setup: list[str] = []
    known: dict[str, str] = {}
    for ex in nbmeta.exercises(nb):
        source = nb.cells[ex.cell].source
        check_source = nb.cells[ex.check_cell].source if ex.check_cell is not None else ""
        check, problem = _resolve_check(check_source, ex.id) if check_source else (None, "no check cell")
        try:
            stub = strip_solution(source, "code")
        except Exception:  # noqa: BLE001 - unpaired markers: the stub is unknown
            stub = ""
        name = getattr(check, "name", None) or nbmeta.defined_name(source) or ex.id
        exercises[ex.id] = CourseExercise(ex.id, name, source, stub, check_source, check, problem)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        role = nbmeta.role(cell)
        if role == nbmeta.SETUP:
            setup.append(cell.source)
            known[normalise(cell.source)] = "setup"
        elif role not in (nbmeta.EXERCISE, nbmeta.CHECK):
            known.setdefault(normalise(cell.source), "demo")
    for ex in exercises.values():
        known.setdefault(normalise(ex.check_source), "check")
    digest = hashlib.sha256("\0".join(normalise(e.solution) for e in exercises.values()).encode()).hexdigest()
    allowed = _course_imports(setup + [e.solution for e in exercises.values()])
    return CourseNotebook(slug, path, _title(nb, slug), exercises, setup, known, digest, allowed,
                          hashlib.sha256(data).hexdigest()[:16])


class Course:
    """Every solution notebook of the course, and which notebooks a class is graded on."""

    def __init__(self, solutions: Path, *, assigned: list[str] | None = None):
        self.solutions = Path(solutions)
        self.notebooks: dict[str, CourseNotebook] = {}
        self.ungraded: list[str] = []  # course notebooks without exercises (00_setup)
        self.problems: list[str] = []
        self.preload_failed = preload_course()
        for path in sorted(self.solutions.iterdir()):
            if path.suffix != ".ipynb" or path.is_symlink() or not path.is_file():
                continue
            try:
                notebook = load_notebook(path)
            except Exception as exc:  # noqa: BLE001 - a solution that cannot be read is reported, not fatal
                self.problems.append(f"{path.name}: cannot be read ({type(exc).__name__}: {exc})")
                continue
            if notebook.exercises:
                self.notebooks[notebook.slug] = notebook
            else:
                self.ungraded.append(notebook.slug)
        if not self.notebooks:
            raise CourseNotFound(f"{self.solutions} holds no solution notebook with exercises: {_HOW}")
        self.assigned = self._assigned(assigned)
        self._fingerprint = self.fingerprint()

    def _assigned(self, chosen: list[str] | None) -> list[str]:
        if chosen:
            picked = []
            for item in chosen:
                key = item.strip().removesuffix(".ipynb")
                match = [s for s in self.notebooks if s == key or s.split("_", 1)[0] == key]
                if not match:
                    raise CourseNotFound(f"--assigned {item}: no notebook with exercises is called that "
                                         f"(choose from {', '.join(self.notebooks)})")
                picked += [m for m in match if m not in picked]
            return picked
        try:
            from ...registry import assigned

            listed = [nb.slug for nb in assigned() if nb.slug in self.notebooks]
        except Exception:  # noqa: BLE001
            listed = []
        return listed or list(self.notebooks)

    def by_exercise(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for slug, nb in self.notebooks.items():
            for ex in nb.exercises:
                found.setdefault(ex, []).append(slug)
        return found

    def fingerprint(self) -> str:
        """A digest of the course's package files and solution notebooks."""
        import attn_course

        h = hashlib.sha256()
        package = Path(attn_course.__file__).resolve().parent
        paths = sorted(package.rglob("*.py")) + sorted(self.solutions.glob("*.ipynb"))
        for path in paths:
            try:
                h.update(str(path.relative_to(path.parents[1])).encode())
                h.update(path.read_bytes())
            except OSError:
                h.update(b"unreadable")
        return h.hexdigest()[:16]

    def changed(self) -> bool:
        """True when the course's files differ from when this Course was loaded."""
        return self.fingerprint() != self._fingerprint

"""One source: generate the exercise notebooks in ``notebooks/`` from the solutions in ``solutions/``.

In a solution notebook, the answer sits between two marker lines (nbgrader's convention)::

    def softmax(x, dim=-1):
        ### BEGIN SOLUTION
        ...
        ### END SOLUTION

In code cells the block becomes ``# YOUR CODE HERE`` and ``raise NotImplementedError()`` at the
marker's indentation, so the signature and docstring stay; in markdown cells it becomes
``*Your answer here.*``. Outputs, execution counts and saved widget state are stripped.

Each generated notebook records a digest of its cells. When a notebook on disk no longer matches
its own digest, a learner has edited it: before overwriting, a copy goes to ``notebooks/backups/``
and its path is printed. Nothing a learner wrote is ever lost.
"""

from __future__ import annotations

import copy
import datetime as _dt
import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

import nbformat

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
MARKDOWN_STUB = "*Your answer here.*"
BACKUP_DIR = "backups"

_MARKER = re.compile(r"^(\s*)(### BEGIN SOLUTION|### END SOLUTION)\s*$")


class MarkerError(ValueError):
    """A solution cell whose BEGIN/END markers do not pair up."""


def strip_solution(source: str, cell_type: str, where: str = "") -> str:
    """Replace every marked block in ``source`` by the stub for ``cell_type``."""
    out: list[str] = []
    inside = False
    for number, line in enumerate(source.splitlines(), 1):
        marker = _MARKER.match(line)
        if marker and marker.group(2) == BEGIN:
            if inside:
                raise MarkerError(f"{where} line {number}: {BEGIN} inside another solution block")
            inside = True
            indent = marker.group(1)
            if cell_type == "code":
                out.extend(indent + stub for stub in CODE_STUB)
            else:
                out.append(indent + MARKDOWN_STUB)
        elif marker and marker.group(2) == END:
            if not inside:
                raise MarkerError(f"{where} line {number}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise MarkerError(f"{where}: {BEGIN} is never closed by {END}")
    return "\n".join(out)


def cells_digest(nb: nbformat.NotebookNode) -> str:
    """A digest of what a learner can edit: each cell's type and source (outputs are not work)."""
    content = [(c.get("cell_type"), c.get("source", "")) for c in nb.cells]
    return hashlib.sha256(json.dumps(content, ensure_ascii=False).encode()).hexdigest()[:16]


def make_exercise(solution: nbformat.NotebookNode, source_name: str = "") -> nbformat.NotebookNode:
    """Return the exercise version of a solution notebook (the input is not modified)."""
    nb = copy.deepcopy(solution)
    for index, cell in enumerate(nb.cells):
        where = f"{source_name} cell {index}"
        if cell.cell_type in ("code", "markdown"):
            cell.source = strip_solution(cell.source, cell.cell_type, where)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    nb.metadata["attn_course"] = {"generated_from": source_name, "cells_digest": cells_digest(nb)}
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    """The exact text a notebook is written as (stable, so files can be compared byte for byte)."""
    return nbformat.writes(nb) + "\n"


def _learner_edited(path: Path) -> bool:
    """True when ``path`` differs from what was generated there last time (or has no record)."""
    try:
        on_disk = nbformat.read(path, as_version=4)
    except Exception:
        return True  # unreadable: keep a copy rather than guess
    recorded = on_disk.metadata.get("attn_course", {}).get("cells_digest")
    return recorded != cells_digest(on_disk)


def backup(path: Path) -> Path:
    """Copy ``path`` to ``<its folder>/backups/<name>-<timestamp>.ipynb`` and return the copy's path."""
    folder = path.parent / BACKUP_DIR
    folder.mkdir(exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    target = folder / f"{path.stem}-{stamp}{path.suffix}"
    n = 1
    while target.exists():
        n += 1
        target = folder / f"{path.stem}-{stamp}-{n}{path.suffix}"
    shutil.copy2(path, target)
    return target


def generate(solutions: Path, exercises: Path, *, check_only: bool = False, out=sys.stdout) -> int:
    """Write (or, with ``check_only``, compare) every exercise notebook. Returns a process exit code."""
    sources = sorted(solutions.glob("*.ipynb"))
    if not sources:
        print(f"No solution notebooks found in {solutions}/.", file=out)
        return 1
    exercises.mkdir(parents=True, exist_ok=True)
    stale: list[str] = []
    problems = 0
    for src in sources:
        target = exercises / src.name
        try:
            text = render(make_exercise(nbformat.read(src, as_version=4), f"{solutions.name}/{src.name}"))
        except MarkerError as exc:
            print(f"ERROR  {src}: {exc}", file=out)
            problems += 1
            continue
        except Exception as exc:
            print(f"ERROR  {src}: not a readable notebook ({type(exc).__name__}: {exc})", file=out)
            problems += 1
            continue
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            print(f"ok     {target}", file=out)
            continue
        if check_only:
            stale.append(str(target))
            print(f"STALE  {target} ({'missing' if current is None else 'differs from ' + str(src)})", file=out)
            continue
        if current is not None and _learner_edited(target):
            copy_path = backup(target)
            print(f"saved  your edited {target} as {copy_path}", file=out)
        target.write_text(text, encoding="utf-8")
        print(f"wrote  {target}", file=out)
    orphans = sorted({p.name for p in exercises.glob("*.ipynb")} - {p.name for p in sources})
    for name in orphans:
        print(f"ORPHAN {exercises / name} has no solution in {solutions}/", file=out)
        if check_only:
            stale.append(str(exercises / name))
    if check_only and stale:
        print(
            f"{len(stale)} exercise notebook(s) are stale. Regenerate them with: python -m attn_course exercises",
            file=out,
        )
        return 1
    return 1 if problems else 0

"""One source: generate the exercise notebooks in ``notebooks/`` from the solutions in ``solutions/``.

In a solution notebook, the answer sits between two marker lines (nbgrader's convention)::

    def softmax(x, dim=-1):
        ### BEGIN SOLUTION
        ...
        ### END SOLUTION

In code cells the block becomes ``# YOUR CODE HERE`` and ``raise NotImplementedError()`` at the
marker's indentation, so the signature and docstring stay; in markdown cells it becomes
``*Your answer here.*``. Outputs, execution counts and saved widget state are stripped.

Generation also writes each solution's exercise identity into its cell metadata (nbgrader's
convention, :mod:`.nbmeta`), so the real nbgrader, the grader and the tests read the same ids.

Each generated notebook records a digest of its cells and of what it was generated as. A learner's
work is never overwritten:

* a notebook the learner edited (its cells no longer match its recorded digest) whose solution did not
  change is left alone;
* if its solution did change, the learner's notebook is still left alone and the new version is
  written beside it as ``NN_topic.updated.ipynb``.

So a learner may run ``python -m attn_course exercises`` (or update the course) at any time.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import re
import sys
from pathlib import Path

import nbformat

from .links import HEADER_ID
from .nbmeta import normalize

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
MARKDOWN_STUB = "*Your answer here.*"
UPDATED_SUFFIX = ".updated"

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


def make_exercise(solution: nbformat.NotebookNode, source_name: str = "", *,
                  header: str | None = None) -> nbformat.NotebookNode:
    """Return the exercise version of a solution notebook (the input is not modified). ``header``, when
    given, replaces the source of the links cell (:mod:`.links`) with the exercise version's."""
    nb = copy.deepcopy(solution)
    if header is not None:
        for cell in nb.cells:
            if cell.get("id") == HEADER_ID:
                cell.source = header
    for index, cell in enumerate(nb.cells):
        where = f"{source_name} cell {index}"
        if cell.cell_type in ("code", "markdown"):
            cell.source = strip_solution(cell.source, cell.cell_type, where)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    digest = cells_digest(nb)
    nb.metadata["attn_course"] = {"generated_from": source_name, "cells_digest": digest}
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    """The exact text a notebook is written as (stable, so files can be compared byte for byte)."""
    return nbformat.writes(nb) + "\n"


def learner_edited(path: Path) -> bool:
    """True when the notebook at ``path`` is no longer what was generated there (or has no record)."""
    try:
        on_disk = nbformat.read(path, as_version=4)
    except Exception:
        return True  # unreadable: never overwrite it
    recorded = on_disk.metadata.get("attn_course", {}).get("cells_digest")
    return recorded != cells_digest(on_disk)


def _generated_as(path: Path) -> str | None:
    """The cells digest recorded when ``path`` was generated (what its solution produced then)."""
    try:
        return nbformat.read(path, as_version=4).metadata.get("attn_course", {}).get("cells_digest")
    except Exception:
        return None


def updated_path(path: Path) -> Path:
    """Where the new version of a notebook the learner edited is written: ``NN_topic.updated.ipynb``."""
    return path.with_name(path.stem + UPDATED_SUFFIX + path.suffix)


def _normalised_source(src: Path, *, check_only: bool, out) -> tuple[nbformat.NotebookNode, bool]:
    """Read a solution, write its nbgrader metadata from its tags; returns (notebook, metadata was stale)."""
    nb = nbformat.read(src, as_version=4)
    before = nbformat.writes(nb)
    for problem in normalize(nb, str(src)):
        print(f"WARN   {problem}", file=out)
    stale = nbformat.writes(nb) != before
    if stale and not check_only:
        src.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
        print(f"meta   wrote the exercise metadata of {src}", file=out)
    return nb, stale


def _exercise_headers(root: Path) -> dict[str, str]:
    """The links line of each registered notebook's exercise version (empty outside a course checkout)."""
    from .. import registry
    from . import links

    if not (root / "pyproject.toml").exists():
        return {}
    try:
        repo = links.repository(root)
    except (KeyError, ValueError):
        return {}
    minutes = links._minutes(root)
    return {nb.slug: links.header_source(nb, "exercise", repo, minutes.get(nb.slug)) for nb in registry.NOTEBOOKS}


def generate(solutions: Path, exercises: Path, *, check_only: bool = False, out=None) -> int:
    """Write (or, with ``check_only``, compare) every exercise notebook. Returns a process exit code.

    Notebooks a learner edited are never overwritten (see the module docstring); with ``check_only``
    they are reported but not counted as stale."""
    out = sys.stdout if out is None else out  # the stream of the moment, not of import time
    sources = sorted(p for p in solutions.glob("*.ipynb") if not p.stem.endswith(UPDATED_SUFFIX))
    if not sources:
        print(f"No solution notebooks found in {solutions}/.", file=out)
        return 1
    if not check_only:  # --check writes nothing, not even the folder
        exercises.mkdir(parents=True, exist_ok=True)
    stale: list[str] = []
    problems = 0
    headers = _exercise_headers(solutions.parent)
    for src in sources:
        target = exercises / src.name
        try:
            solution, meta_stale = _normalised_source(src, check_only=check_only, out=out)
            generated = make_exercise(solution, f"{solutions.name}/{src.name}", header=headers.get(src.stem))
            text = render(generated)
        except MarkerError as exc:
            print(f"ERROR  {src}: {exc}", file=out)
            problems += 1
            continue
        except Exception as exc:
            print(f"ERROR  {src}: not a readable notebook ({type(exc).__name__}: {exc})", file=out)
            problems += 1
            continue
        if meta_stale and check_only:
            stale.append(str(src))
            print(f"STALE  {src}: its exercise metadata is not written yet", file=out)
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            print(f"ok     {target}", file=out)
            continue
        new_digest = generated.metadata["attn_course"]["cells_digest"]
        if current is not None and learner_edited(target):
            if _generated_as(target) == new_digest:
                print(f"kept   {target}: your edits (its solution has not changed)", file=out)
            elif check_only:
                print(f"EDITED {target}: your edits are kept; the course has a newer version", file=out)
            else:
                beside = updated_path(target)
                beside.write_text(text, encoding="utf-8")
                print(f"kept   {target}: your edits; the course's new version is {beside}", file=out)
            continue
        if check_only:
            stale.append(str(target))
            print(f"STALE  {target} ({'missing' if current is None else 'differs from ' + str(src)})", file=out)
            continue
        target.write_text(text, encoding="utf-8")
        print(f"wrote  {target}", file=out)
    names = {p.name for p in sources}
    orphans = sorted(p.name for p in exercises.glob("*.ipynb")
                     if p.name not in names and not p.stem.endswith(UPDATED_SUFFIX))
    for name in orphans:
        print(f"ORPHAN {exercises / name} has no solution in {solutions}/", file=out)
        if check_only:
            stale.append(str(exercises / name))
    if check_only and stale:
        print(f"{len(stale)} notebook(s) are stale (maintainers: run `python -m attn_course exercises`; "
              "it never overwrites a notebook you edited)", file=out)
        return 1
    return 1 if problems else 0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 and list what is stale")
    parser.add_argument("--solutions", default="solutions", help="folder of solution notebooks (default: solutions)")
    parser.add_argument("--notebooks", default="notebooks", help="folder of exercise notebooks (default: notebooks)")


def run(args: argparse.Namespace) -> int:
    return generate(Path(args.solutions), Path(args.notebooks), check_only=args.check)

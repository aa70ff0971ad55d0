"""Grade notebooks: run each in its own kernel and report every exercise as a row of a table.

A check cell is a code cell tagged ``check`` (or, failing tags, one that calls ``check_<name>(...)``).
Each yields one row: *passed*, *failed* with the check's message, *not attempted*, or *error* when the
cell never ran (kernel died, notebook unreadable). Where the course's own solution notebook is
found, the check cells are taken from it, so an edited or deleted check cell cannot change a grade.
The learner's file is only read; it runs from a temporary copy.
"""

from __future__ import annotations

import csv
import json
import re
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

from .runner import execute

CHECK_CALL = re.compile(r"\bcheck_(\w+)\s*\(")
PASSED, FAILED, NOT_ATTEMPTED, ERROR = "passed", "failed", "not attempted", "error"


@dataclass
class Row:
    notebook: str
    exercise: str
    status: str
    message: str = ""


def check_cells(nb: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """``(cell index, exercise name)`` for every check cell of ``nb``.

    Cells tagged ``check`` when the notebook uses tags; otherwise every code cell calling ``check_*``.
    """
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    tagged = [(i, c) for i, c in code if "check" in c.metadata.get("tags", [])]
    found = []
    for index, cell in tagged or code:
        match = CHECK_CALL.search(cell.source)
        if match:
            found.append((index, match.group(1)))
    return found


def _first_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def outcome(cell: nbformat.NotebookNode, exercise: str) -> tuple[str, str]:
    """Read a status and a message off an executed check cell's outputs."""
    if cell.get("execution_count") is None and not cell.get("outputs"):
        return ERROR, "this check never ran"
    for output in cell.get("outputs", []):
        if output.get("output_type") != "error":
            continue
        name, value = output.get("ename", ""), output.get("evalue", "")
        value = re.sub(r"^\s*" + re.escape(exercise) + r"\s*:\s*", "", value)
        if name == "KeyboardInterrupt":
            return FAILED, "timed out: the cell ran too long and was interrupted (an infinite loop?)"
        if "not attempted" in value:
            return NOT_ATTEMPTED, _first_line(value)
        if name in ("AssertionError", "CheckFailed", "NotAttempted"):
            return FAILED, _first_line(value)
        if name == "NameError":
            return FAILED, _first_line(f"{name}: {value} (is the exercise cell above run, or was it deleted?)")
        return FAILED, _first_line(f"{name}: {value}")
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    if "✓" in text:
        return PASSED, ""
    return FAILED, "the check printed no verdict (was the check cell edited?)"


def find_solution(path: Path) -> Path | None:
    """The course's solution notebook with the same name, looked up beside and above ``path``."""
    for folder in [path.parent, *path.parent.parents, Path.cwd()]:
        candidate = folder / "solutions" / path.name
        if candidate.exists() and candidate.resolve() != path.resolve():
            return candidate
    return None


def with_reference_checks(nb: nbformat.NotebookNode, solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Put the solution's check cells into ``nb`` (replacing edited ones, restoring deleted ones)."""
    reference = {name: solution.cells[i] for i, name in check_cells(solution)}
    present = {}
    for index, name in check_cells(nb):
        present[name] = index
        if name in reference:
            nb.cells[index].source = reference[name].source
    for name, cell in reference.items():
        if name not in present:
            restored = nbformat.v4.new_code_cell(cell.source)
            restored.metadata["tags"] = ["check"]
            nb.cells.append(restored)
    return nb


def grade_notebook(path: Path, *, cell_timeout: int = 60, label: str | None = None) -> list[Row]:
    """Grade one notebook; never raises for a broken notebook, it becomes a row instead."""
    label = label or str(path)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:
        return [Row(label, "-", ERROR, _first_line(f"not a readable notebook: {type(exc).__name__}: {exc}"))]
    solution_path = find_solution(path)
    if solution_path is not None:
        try:
            nb = with_reference_checks(nb, nbformat.read(solution_path, as_version=4))
        except Exception:
            pass  # an unreadable solution should not block grading with the learner's own checks
    checks = check_cells(nb)
    if not checks:
        return []  # a notebook without exercises (e.g. 00_setup) has nothing to grade
    with tempfile.TemporaryDirectory(prefix="attn-grade-") as tmp:
        run = execute(nb, cwd=Path(tmp), cell_timeout=cell_timeout)
    rows = []
    for index, name in checks:
        status, message = outcome(run.notebook.cells[index], name)
        if status == ERROR and run.problem:
            message = f"never ran: {run.problem}"
        rows.append(Row(label, name, status, message))
    return rows


def expand(paths: list[str]) -> list[Path]:
    """Notebook files named directly, plus every ``*.ipynb`` inside named folders (checkpoints skipped)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(
                q for q in sorted(p.rglob("*.ipynb"))
                if ".ipynb_checkpoints" not in q.parts and "backups" not in q.parts
            )
        else:
            found.append(p)
    return found


def format_table(rows: list[Row]) -> str:
    """The rows as an aligned plain-text table followed by totals."""
    headers = ("notebook", "exercise", "result")
    body = [
        (r.notebook, r.exercise, r.status + (f": {r.message}" if r.message and r.status != PASSED else ""))
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(headers[:2])]
    lines = [f"{headers[0]:<{widths[0]}}  {headers[1]:<{widths[1]}}  {headers[2]}"]
    lines.append("-" * len(lines[0]))
    lines += [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in body]
    counts = {s: sum(r.status == s for r in rows) for s in (PASSED, FAILED, NOT_ATTEMPTED, ERROR)}
    lines.append("")
    lines.append(
        f"Total: {counts[PASSED]} of {len(rows)} exercises passed "
        f"({counts[FAILED]} failed, {counts[NOT_ATTEMPTED]} not attempted, {counts[ERROR]} errors)"
    )
    return "\n".join(lines)


def write_rows(rows: list[Row], path: Path) -> None:
    """Write rows as JSON (``.json``) or CSV (anything else)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps([asdict(r) for r in rows], indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=["notebook", "exercise", "status", "message"])
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


def main(paths: list[str], *, cell_timeout: int, json_path: str | None, csv_path: str | None, out=sys.stdout) -> int:
    notebooks = expand(paths or ["notebooks"])
    if not notebooks:
        print(f"No notebooks found in {' '.join(paths or ['notebooks'])}.", file=out)
        return 2
    rows: list[Row] = []
    try:
        from tqdm import tqdm

        progress = tqdm(notebooks, desc="grading", unit="notebook", file=sys.stderr, disable=len(notebooks) < 2)
    except ImportError:  # pragma: no cover - tqdm is a course dependency
        progress = notebooks
    for nb_path in progress:
        rows.extend(grade_notebook(nb_path, cell_timeout=cell_timeout))
    print(format_table(rows), file=out)
    for target in filter(None, [json_path, csv_path]):
        write_rows(rows, Path(target))
        print(f"wrote {target}", file=out)
    return 0 if rows and all(r.status == PASSED for r in rows) else 1

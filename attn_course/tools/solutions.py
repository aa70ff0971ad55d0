"""Re-execute solution notebooks in place, top to bottom, so their stored outputs are current.

``python -m attn_course run-solutions [PATH...]`` is what a maintainer runs after editing a solution
(then ``python -m attn_course exercises`` to regenerate the learner copies). A notebook with a failing
cell is not written: the error is printed and the file on disk stays as it was.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

from .nbmeta import CHECK, EXERCISE, role
from .runner import execute


def _unexpected_errors(nb, errors: list[int]) -> list[int]:
    """Cells that raised but may not: a solution's exercise and check cells must pass, and any other
    cell may raise only when it is tagged ``raises-exception`` (a demonstration of an error message)."""
    def allowed(cell) -> bool:
        return role(cell) not in (EXERCISE, CHECK) and "raises-exception" in cell.metadata.get("tags", [])

    return [i for i in errors if not allowed(nb.cells[i])]


def run_in_place(path: Path, out=None) -> bool:
    out = sys.stdout if out is None else out  # the stream of the moment, not of import time
    nb = nbformat.read(path, as_version=4)
    run = execute(nb, cwd=path.parent.resolve(), allow_errors=False)
    errors = _unexpected_errors(run.notebook, run.errors)
    if run.problem or errors:
        print(f"FAILED {path}: {run.problem or 'cell(s) ' + str(errors) + ' raised'}; file left unchanged", file=out)
        return False
    executed = run.notebook
    for cell in executed.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(executed, path)
    print(f"ran    {path} in {run.seconds:.1f} s", file=out)
    return True


def main(paths: list[str], out=None) -> int:
    out = sys.stdout if out is None else out  # the stream of the moment, not of import time
    notebooks: list[Path] = []
    for p in map(Path, paths or ["solutions"]):
        notebooks.extend(sorted(p.glob("*.ipynb")) if p.is_dir() else [p])
    if not notebooks:
        print(f"no notebooks in {', '.join(paths or ['solutions'])}", file=out)
        return 1
    ok = [run_in_place(p, out) for p in notebooks]
    return 0 if ok and all(ok) else 1


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", help="notebooks or folders (default: solutions/)")


def run(args: argparse.Namespace) -> int:
    return main(args.paths)

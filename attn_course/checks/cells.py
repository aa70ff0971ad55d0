"""What each cell's last run did to the names it defines, so a check never grades a stale definition.

A cell with a syntax error defines nothing, and a cell that raises stops at that line: either way the
kernel still holds whatever an *earlier* run of the cell defined (the stub, or a previous attempt), and
a check looking the name up would grade that. IPython's own way to know how a cell's run ended is its
``post_run_cell`` event, whose :class:`~IPython.core.interactiveshell.ExecutionResult` carries the cell's
text (``info.raw_cell``) and ``error_before_exec`` (a syntax error) or ``error_in_exec`` (an exception).

:func:`install` registers ``pre_run_cell`` / ``post_run_cell`` callbacks on a shell. For every cell that
defines a top-level function or class (``def name`` / ``class name`` at the cell's left margin, found
even when the cell does not parse), they record under that name a :class:`CellRun`: whether the run
raised, where (the line of the learner's cell, with a caret for a syntax error), and whether the name was
bound afresh by this run. :func:`outcomes` returns the record; the checks read it
(:mod:`.core`). Installed when ``attn_course`` is imported inside IPython (every notebook's set-up
cell does that) and by the grader on the shell it runs a notebook's cells in.

This module imports nothing heavy: ``import attn_course`` stays cheap.
"""

from __future__ import annotations

import ast
import linecache
import re
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["CellRun", "install", "outcomes", "defined_names", "describe_error"]

_ATTR = "_attn_course_cell_runs"
_MISSING = object()
_DEF = re.compile(r"^(?:async\s+def|def|class)\s+([A-Za-z_]\w*)", re.M)


@dataclass
class CellRun:
    """How the last run of the cell defining ``name`` ended."""

    name: str
    source: str  # the cell's text, as run
    error: dict[str, Any] | None = None  # describe_error(...) when the run raised, else None
    rebound: bool = True  # the run bound ``name`` afresh (False: the kernel holds an older definition)
    execution_count: int | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


def defined_names(source: str) -> list[str]:
    """The functions and classes a cell defines at its left margin (also when it does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return list(dict.fromkeys(_DEF.findall(source)))
    return [node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def describe_error(exc: BaseException, source: str = "") -> dict[str, Any]:
    """Type, message, line and code of an error raised by a cell, located in the learner's own cell.

    For a syntax error: the line Python could not read and the column of the caret. For an exception:
    the deepest line of the cell itself that the traceback passes through (where the cell stopped, or
    the line of the cell's own function that raised)."""
    info: dict[str, Any] = {"type": type(exc).__name__}
    try:
        message = exc.msg if isinstance(exc, SyntaxError) and exc.msg else str(exc)
    except BaseException:  # noqa: BLE001 - a learner's exception may have an unprintable message
        message = ""
    info["message"] = message[:300]
    if isinstance(exc, SyntaxError):
        info["syntax"] = True
        if exc.lineno:
            info["line"] = int(exc.lineno)
            lines = source.splitlines()
            text = exc.text if exc.text is not None else (lines[exc.lineno - 1] if 0 < exc.lineno <= len(lines) else "")
            info["code"] = text.rstrip("\n")[:300]
            if exc.offset:
                info["offset"] = int(exc.offset)
        return info
    cell_file = None
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    for filename, _, function in frames:
        if function == "<module>":  # the cell's own code (IPython's run_code frame comes before it)
            cell_file = filename
            break
    for filename, lineno, function in frames:
        if filename == cell_file:
            info.update(line=lineno, function="" if function == "<module>" else function,
                        code=linecache.getline(filename, lineno).rstrip()[:300])
    return info


def outcomes(shell: Any) -> dict[str, CellRun]:
    """``name -> CellRun`` for every name a cell run on ``shell`` defined (empty when not installed)."""
    runs = getattr(shell, _ATTR, None) if shell is not None else None
    return runs if isinstance(runs, dict) else {}


class _Watcher:
    def __init__(self, shell: Any):
        self.shell = shell
        self.runs: dict[str, CellRun] = {}
        self.before: dict[str, Any] = {}

    def pre_run_cell(self, info: Any) -> None:
        source = getattr(info, "raw_cell", "") or ""
        names = defined_names(source) if "def " in source or "class " in source else []
        namespace = self.shell.user_ns
        self.before = {name: namespace.get(name, _MISSING) for name in names}

    def post_run_cell(self, result: Any) -> None:
        before, self.before = self.before, {}
        if not before:
            return
        source = getattr(getattr(result, "info", None), "raw_cell", "") or ""
        error = getattr(result, "error_before_exec", None) or getattr(result, "error_in_exec", None)
        described = describe_error(error, source) if error is not None else None
        namespace = self.shell.user_ns
        for name, old in before.items():
            now = namespace.get(name, _MISSING)
            self.runs[name] = CellRun(name, source, described, rebound=now is not _MISSING and now is not old,
                                      execution_count=getattr(result, "execution_count", None))


def install(shell: Any = None) -> bool:
    """Watch the cells ``shell`` runs (default: the running IPython). Returns whether a shell is watched."""
    if shell is None:
        ipython = sys.modules.get("IPython")  # not imported: no shell is running (and none is imported here)
        shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None or not hasattr(shell, "events"):
        return False
    if isinstance(getattr(shell, _ATTR, None), dict):
        return True
    watcher = _Watcher(shell)
    shell.events.register("pre_run_cell", watcher.pre_run_cell)
    shell.events.register("post_run_cell", watcher.post_run_cell)
    setattr(shell, _ATTR, watcher.runs)
    return True

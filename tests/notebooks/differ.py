"""Which cells of an exercise notebook can run differently from its solution.

An exercise notebook is its solution with the answers cut out, so a cell that never reaches an answer runs
the same in both — and nbval already runs every solution cell, with no error allowed. Run All on an unfilled
notebook therefore needs only the cells that can reach an answer (:func:`cells_that_can_differ`); the rest
are proven by the solution's run. The analysis reads names (Python's ``ast``) and errs on the side of
keeping a cell: a cell stays when in doubt.
"""

from __future__ import annotations

import ast

import nbformat
from IPython.core.inputtransformer2 import TransformerManager

from attn_course.tools import nbmeta

#: Calls that reach names without spelling them (a cell making one stays).
INDIRECT = {"globals", "locals", "vars", "eval", "exec", "get_ipython", "__import__"}


class Names:
    """What one cell's code does with names: binds at top level, reads anywhere, mutates, imports."""

    def __init__(self, source: str):
        self.binds: set[str] = set()
        self.reads: set[str] = set()
        self.mutates: set[str] = set()  # roots of `x.attr = …`, `x[i] = …`, `x.method(…)`
        self.imports: set[str] = set()
        self.checks = False  # imports from attn_course.checks (a check reads the learner's namespace)
        python = TransformerManager().transform_cell(source)
        self.magic = python != source and "get_ipython()" in python  # %magic or !shell: names hide in strings
        try:
            tree = ast.parse(python)
        except SyntaxError:  # a cell that shows a syntax error: nothing known of it, so it is kept
            self.unknown = True
            return
        self.unknown = False
        self._visit(tree, top=True)

    def _visit(self, node, top: bool) -> None:
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                self.reads.add(node.id)
            elif top:
                self.binds.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            if top and not isinstance(node, ast.Lambda):
                self.binds.add(node.name)
            top = False  # names bound inside a body are local to it
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            module = getattr(node, "module", None) or ""
            self.checks |= module.startswith("attn_course.checks") or any(
                a.name.startswith("attn_course.checks") for a in node.names)
            for alias in node.names:
                name = (alias.asname or alias.name).split(".")[0]
                self.imports.add(name)
                if top:
                    self.binds.add(name)
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and not isinstance(node.ctx, ast.Load):
            self.mutates.add(_root(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            self.mutates.add(_root(node.func))
        for child in ast.iter_child_nodes(node):
            self._visit(child, top)
        self.mutates.discard(None)


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def cells_that_can_differ(solution: nbformat.NotebookNode, exercise: nbformat.NotebookNode) -> list[int]:
    """Indices of the exercise notebook's code cells whose run can differ from the solution's.

    Kept: set-up, exercise and check cells; any cell tagged ``raises-exception``, that does not parse, uses
    a magic, reaches names indirectly (``globals()``, ``eval`` …) or imports from ``attn_course.checks``;
    any cell that reads a name an exercise cell binds (in either version) or that such a cell binds or
    mutates (modules aside), and so on down the notebook; then every earlier cell binding a name a kept
    cell reads, and so on up.
    """
    assert len(solution.cells) == len(exercise.cells), "the exercise is made cell for cell from its solution"
    code = [i for i, c in enumerate(exercise.cells) if c.cell_type == "code" and c.source.strip()]
    names = {i: Names(exercise.cells[i].source) for i in code}
    kept, tainted, modules = set(), set(), set()
    for i in code:
        cell, here = exercise.cells[i], names[i]
        modules |= here.imports
        if nbmeta.role(cell) == nbmeta.EXERCISE:
            tainted |= here.binds | Names(solution.cells[i].source).binds
            kept.add(i)
        elif (nbmeta.role(cell) in (nbmeta.SETUP, nbmeta.CHECK) or here.magic or here.unknown or here.checks
              or nbmeta.RAISES in cell.get("metadata", {}).get("tags", []) or here.reads & (tainted | INDIRECT)):
            kept.add(i)
            if here.reads & tainted:
                tainted |= here.binds | (here.mutates - modules)
    wanted: set[str] = set()  # what the kept cells below read
    for i in reversed(code):  # up the notebook: a cell binding what a kept cell below it reads is kept too
        if i in kept or names[i].binds & wanted:
            kept.add(i)
            wanted |= names[i].reads
    return sorted(kept)

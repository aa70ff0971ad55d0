"""Mutation testing of the checks: mutate every solution mechanically and see which mutants a check lets pass.

``python -m attn_course mutants [NOTEBOOK…] [--exercise ID] [--sample N]`` takes each exercise's
solution code (the lines between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` of its solution
notebook), applies one small change at a time, runs the exercise's check on each mutant (locally, in
this process) and lists the *survivors*: mutants the check passes. A survivor is either equivalent to
the solution on every input the docstring allows — then it is listed, with the reason, in
``attn_course/tools/mutants_equivalent.json`` — or a gap in the check, to be closed by a stronger check.
The test suite runs a fixed sample and fails on any survivor not listed as equivalent.

Operators (each one change at one place; only code inside the solution block is touched):

* ``binop``     — + ↔ −, * ↔ /, @ → *, ** 0.5 ↔ ** 2 / ** -0.5, ``a op b`` → ``a`` or ``b`` (a term dropped);
* ``compare``   — < ↔ ≤, > ↔ ≥, == ↔ !=;
* ``number``    — an integer n → n ± 1 (so −1 ↔ −2, 0 ↔ 1, diagonal and range offsets), a float c → −c, 2c, c/2;
* ``negate``    — −x → x;
* ``keyword``   — a keyword argument dropped (``keepdim=True``, ``dim=-1``…) or its value replaced (a bool flipped,
  an axis held in a variable replaced by −2 or 0);
* ``call``      — a call replaced by its first argument (``math.sqrt(d)`` → ``d``, ``torch.exp(x)`` → ``x``), or by
  a sibling function (sum ↔ mean, max ↔ min, amax ↔ amin, tril ↔ triu, maximum ↔ minimum, sqrt ↔ rsqrt);
* ``swap``      — the first two positional arguments of a call swapped (not for calls symmetric in them:
  ``transpose(-2, -1)`` is ``transpose(-1, -2)``, ``max(a, b)`` is ``max(b, a)``; nor when both are the same
  expression: ``torch.ones(n, n)``, ``xlogy(w, w)``);
* ``stmt``      — one statement deleted (an update that rescales a running quantity, a masking line…);
* ``default``   — a parameter with a default ignored: every use replaced by its default value;
* ``transpose`` — the returned tensor transposed on its last two axes.

A mutant's id is ``operator:line:node:detail``: the line within the solution block and the node's
position in it, so it stays the same while the solution's code does.

Why not mutmut or cosmic-ray: both mutate importable source files and judge a mutant by the exit code
of a test command run in a fresh process (mutmut 3 also needs ``fork``). The code under test here lives
in notebook cells, and the "test" is a check function already in this process: exporting every
exercise to a module and starting a pytest process per mutant would cost seconds per mutant (torch's
import alone is about one), and neither ships the tensor-specific operators above (axes, ``keepdim``,
triangle offsets, ignored arguments). Python's ``ast`` gives all of them in a few hundred lines.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import hashlib
import importlib
import json
import pickle
import re
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import nbformat

from .. import registry
from ..checks.result import Status
from . import nbmeta
from .exercises import BEGIN, END

__all__ = ["Mutant", "Outcome", "mutants_of", "run_exercise", "load_equivalents", "named_share", "message_slips", "result_slips", "configure", "run"]

EQUIVALENTS = Path(__file__).with_name("mutants_equivalent.json")

_SIBLINGS = {
    "sum": "mean", "mean": "sum", "max": "min", "min": "max", "amax": "amin", "amin": "amax",
    "tril": "triu", "triu": "tril", "maximum": "minimum", "minimum": "maximum", "sqrt": "rsqrt",
    "rsqrt": "sqrt", "exp": "log", "log": "exp", "logsumexp": "sum", "softmax": "log_softmax",
    "argmax": "argmin", "cumsum": "flip", "ones": "zeros", "zeros": "ones", "full": "full_like",
}
#: Functions whose first two arguments can be swapped without changing the result: no "swap" mutant for them.
_SYMMETRIC = {"transpose", "swapaxes", "swapdims", "min", "max", "maximum", "minimum", "fmax", "fmin", "add", "mul",
              "multiply", "eq", "ne", "logical_and", "logical_or", "logical_xor", "hypot", "dot", "inner", "isclose",
              "allclose", "equal", "gcd", "lcm"}
_BINOP_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.MatMult: ast.Mult,
                ast.FloorDiv: ast.Div}
_CMP_SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}


@dataclass(frozen=True)
class Mutant:
    """One change to an exercise's solution: ``id`` is stable while the solution's code is unchanged."""

    exercise: str
    id: str  # operator:line:column:detail (line counted within the solution block)
    description: str
    source: str  # the whole exercise cell, mutated


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # the check's verdict on the mutant ("passed" = survived)
    summary: str
    seconds: float
    result: object = None  # the CheckResult (None when the mutant could not even be defined)

    @property
    def survived(self) -> bool:
        return self.status == Status.PASSED.value

    @property
    def rejected(self) -> bool:
        """The check ran on the mutant and failed it (a mutant that cannot even be defined is not counted)."""
        return self.status == Status.FAILED.value and self.result is not None

    @property
    def named(self) -> bool:
        """Rejected with a cause named (the diagnosis's "cause" part), not only "does not match"."""
        diagnosis = getattr(self.result, "diagnosis", None)
        return self.rejected and diagnosis is not None and bool(diagnosis.cause.strip())


def named_share(outcomes: list[Outcome]) -> tuple[int, int]:
    """(rejected mutants whose diagnosis names a cause, rejected mutants)."""
    rejected = [o for o in outcomes if o.rejected]
    return sum(o.named for o in rejected), len(rejected)


# ============================================================================ generating mutants
def _solution_lines(source: str) -> tuple[int, int]:
    """The 1-based line range strictly between the BEGIN and END markers."""
    lines = source.splitlines()
    begin = next(i for i, line in enumerate(lines, 1) if line.strip() == BEGIN)
    end = next(i for i, line in enumerate(lines, 1) if line.strip() == END and i > begin)
    return begin + 1, end - 1


class _Sites(ast.NodeVisitor):
    """Every place an operator can change, in a fixed order (so each mutant has a stable index)."""

    def __init__(self, first: int, last: int, defaults: dict[str, ast.expr]):
        self.first, self.last, self.defaults = first, last, defaults
        self.sites: list[tuple[str, int, str, Callable[[ast.AST], ast.AST | None]]] = []
        self.counter = 0
        self.start: int | None = None

    def _inside(self, node: ast.AST) -> bool:
        line = getattr(node, "lineno", None)
        return line is not None and self.first <= line <= self.last

    def _add(self, op: str, node: ast.AST, detail: str, make: Callable[[ast.AST], ast.AST | None]) -> None:
        # The id counts nodes from the start of the solution block: stable while the solution is unchanged.
        if self.start is None:
            self.start = self.counter
        where = f"{node.lineno - self.first + 1}:{self.counter - self.start}:{detail}"
        self.sites.append((op, self.counter, where, make))

    def generic_visit(self, node: ast.AST) -> None:
        self.counter += 1
        node._mut_index = self.counter  # type: ignore[attr-defined]
        if self._inside(node):
            self._visit_sites(node)
        super().generic_visit(node)

    def _visit_sites(self, node: ast.AST) -> None:
        if isinstance(node, ast.BinOp):
            swap = _BINOP_SWAPS.get(type(node.op))
            if swap:
                self._add("binop", node, f"{type(node.op).__name__}->{swap.__name__}",
                          lambda n, s=swap: ast.BinOp(n.left, s(), n.right))
            if isinstance(node.op, ast.Pow) and isinstance(node.right, ast.Constant):
                for value in (2, -0.5, 0.5):
                    if value != node.right.value:
                        self._add("binop", node, f"pow->{value}", lambda n, v=value: ast.BinOp(n.left, ast.Pow(), ast.Constant(v)))
            self._add("binop", node, "keep-left", lambda n: n.left)
            self._add("binop", node, "keep-right", lambda n: n.right)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP_SWAPS:
            swap = _CMP_SWAPS[type(node.ops[0])]
            self._add("compare", node, f"{type(node.ops[0]).__name__}->{swap.__name__}",
                      lambda n, s=swap: ast.Compare(n.left, [s()], n.comparators))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float) and not isinstance(node.value, bool):
            value = node.value
            options = [value + 1, value - 1] if isinstance(value, int) else [-value, 2 * value, value / 2]
            for new in options:
                if new != value:
                    self._add("number", node, f"{value!r}->{new!r}", lambda n, v=new: ast.Constant(v))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            if isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, int):
                v = node.operand.value  # -1 -> -2 and 0 (handled as a number, written -v)
                for new in (-(v + 1), -(v - 1)):
                    self._add("number", node, f"-{v}->{new}", lambda n, x=new: ast.Constant(x))
            else:
                self._add("negate", node, "drop-minus", lambda n: n.operand)
        elif isinstance(node, ast.Call):
            for i, kw in enumerate(node.keywords):
                if kw.arg is None:
                    continue
                self._add("keyword", node, f"drop-{kw.arg}",
                          lambda n, i=i: ast.Call(n.func, n.args, n.keywords[:i] + n.keywords[i + 1:]))
                if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, bool):
                    self._add("keyword", node, f"flip-{kw.arg}", lambda n, i=i: _with_keyword(n, i, ast.Constant(not n.keywords[i].value.value)))
                if kw.arg in ("dim", "axis") and not isinstance(kw.value, (ast.Constant, ast.UnaryOp)):
                    for axis in (-2, 0):  # an axis given by a variable, replaced by a fixed one
                        self._add("keyword", node, f"{kw.arg}->{axis}",
                                  lambda n, i=i, a=axis: _with_keyword(n, i, ast.Constant(a)))
            if node.args:
                self._add("call", node, f"unwrap-{_callee(node)}", lambda n: n.args[0])
            name = _callee(node)
            if name in _SIBLINGS:
                self._add("call", node, f"{name}->{_SIBLINGS[name]}", lambda n, s=_SIBLINGS[name]: _renamed(n, s))
            if len(node.args) >= 2 and name not in _SYMMETRIC and ast.dump(node.args[0]) != ast.dump(node.args[1]):
                self._add("swap", node, f"args-{name}", lambda n: ast.Call(n.func, [n.args[1], n.args[0], *n.args[2:]], n.keywords))
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr, ast.If)) and not _is_docstring(node):
            self._add("stmt", node, f"delete-{type(node).__name__}", lambda n: None)
        if isinstance(node, ast.Return) and node.value is not None:
            self._add("transpose", node, "return-mT", lambda n: ast.Return(_transpose_expr(n.value)))
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in self.defaults:
            self._add("default", node, f"{node.id}->default", lambda n, d=self.defaults[node.id]: copy.deepcopy(d))


def _is_docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _callee(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else (func.id if isinstance(func, ast.Name) else "call")


def _renamed(node: ast.Call, new: str) -> ast.Call:
    func = copy.deepcopy(node.func)
    if isinstance(func, ast.Attribute):
        func.attr = new
    elif isinstance(func, ast.Name):
        func.id = new
    return ast.Call(func, node.args, node.keywords)


def _with_keyword(node: ast.Call, index: int, value: ast.expr) -> ast.Call:
    keywords = list(node.keywords)
    keywords[index] = ast.keyword(keywords[index].arg, value)
    return ast.Call(node.func, node.args, keywords)


def _transpose_expr(value: ast.expr) -> ast.expr:
    """``value`` transposed on its last two axes; a returned tuple gets its first element transposed."""
    def mt(expr: ast.expr) -> ast.expr:
        return ast.Call(ast.Attribute(expr, "transpose", ast.Load()), [ast.Constant(-2), ast.Constant(-1)], [])

    if isinstance(value, ast.Tuple) and value.elts:
        return ast.Tuple([mt(value.elts[0]), *value.elts[1:]], ast.Load())
    return mt(value)


class _Apply(ast.NodeTransformer):
    def __init__(self, index: int, make: Callable[[ast.AST], ast.AST | None]):
        self.index, self.make = index, make

    def generic_visit(self, node: ast.AST) -> ast.AST | None:
        if getattr(node, "_mut_index", None) == self.index:
            return self.make(node)
        return super().generic_visit(node)


def _defaults(tree: ast.Module, name: str) -> dict[str, ast.expr]:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            args = node.args
            positional = args.posonlyargs + args.args
            found = {a.arg: d for a, d in zip(positional[len(positional) - len(args.defaults):], args.defaults)}
            found.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
            return found
    return {}


def mutants_of(exercise: str, source: str) -> Iterator[Mutant]:
    """Every single-change mutant of an exercise cell's solution block (those that still compile)."""
    first, last = _solution_lines(source)
    tree = ast.parse(source)
    sites = _Sites(first, last, _defaults(tree, nbmeta.defined_name(source) or exercise))
    sites.visit(tree)
    seen: set[str] = set()
    tree_bytes = pickle.dumps(tree)
    for op, index, where, make in sites.sites:
        mutated_tree = _Apply(index, make).visit(pickle.loads(tree_bytes))  # a fresh copy; pickle is ~10× faster than deepcopy
        _fill_empty_bodies(mutated_tree)
        try:
            text = ast.unparse(ast.fix_missing_locations(mutated_tree))
            _compile(text, f"<mutant {exercise}>")
        except (SyntaxError, ValueError, TypeError):
            continue
        digest = hashlib.sha1(text.encode()).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        yield Mutant(exercise, f"{op}:{where}", f"{op} at line {where.split(':')[0]}: {where.split(':', 2)[2]}", text)


def _compile(source: str, filename: str):
    """Compile a mutant. Python's SyntaxWarnings about generated code (``None[0]``: "perhaps you missed a
    comma?") are the mutation's point, not the course's problem: they are not shown."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        return compile(source, filename, "exec")


def _fill_empty_bodies(tree: ast.AST) -> None:
    """A deleted statement may leave a block empty: give it ``pass`` so the mutant still compiles."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and field == "body" and not block:
                block.append(ast.Pass())


# ============================================================================ running them
def _setup_namespace(solution: nbformat.NotebookNode) -> dict:
    namespace: dict = {"__name__": "__mutants__"}
    for cell in solution.cells:
        if nbmeta.role(cell) != nbmeta.SETUP:
            continue
        # Statement by statement: an import the exercises do not need must not stop the run.
        for statement in ast.parse(cell.source).body:
            try:
                exec(compile(ast.Module([statement], []), "<setup>", "exec"), namespace)  # noqa: S102 - the course's own code
            except Exception:  # noqa: BLE001
                pass
    return namespace


@contextlib.contextmanager
def _unwritten_memory_filled():
    """While mutants run, memory a tensor gets without values (torch.empty) holds NaN (integers: their largest
    value), not what was there before: a mutant that leaves part of its output unwritten then gets the same
    verdict and message on every run, which ``--compare`` relies on (PyTorch's deterministic mode, warnings only)."""
    import torch
    import torch.utils.deterministic

    was = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
           torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])
        torch.utils.deterministic.fill_uninitialized_memory = was[2]


def run_exercise(solution: nbformat.NotebookNode, exercise: str, check, *, sample: int | None = None,
                 progress: Callable[[str], None] | None = None, only: set[str] | None = None) -> list[Outcome]:
    """Run ``check`` on every mutant (or a fixed, evenly spread sample of ``sample``; or those whose id is in
    ``only``) of ``exercise``."""
    cell = next(c for c in solution.cells if nbmeta.role(c) == nbmeta.EXERCISE and nbmeta.exercise_id(c) == exercise)
    base = _setup_namespace(solution)
    name = nbmeta.defined_name(cell.source) or exercise
    mutants = list(mutants_of(exercise, cell.source))
    if sample is not None and len(mutants) > sample:
        step = len(mutants) / sample
        mutants = [mutants[int(i * step)] for i in range(sample)]
    if only is not None:
        mutants = [m for m in mutants if m.id in only]
    with _unwritten_memory_filled():
        return [_run_one(mutant, base, name, check, progress) for mutant in mutants]


def _run_one(mutant: Mutant, base: dict, name: str, check, progress: Callable[[str], None] | None) -> Outcome:
    """The check's verdict on one mutant, defined in a copy of the notebook's set-up namespace ``base``."""
    namespace = dict(base)
    start = time.perf_counter()
    result = None
    try:
        with warnings.catch_warnings():  # what a mutant's own code warns about (var() of one sample) is its own
            warnings.filterwarnings("ignore", module=re.escape(namespace["__name__"]))
            exec(_compile(mutant.source, f"<mutant {mutant.id}>"), namespace)  # noqa: S102
            result = check.evaluate(namespace[name])
        status, summary = result.status.value, result.summary
    except Exception as exc:  # noqa: BLE001 - a mutant that breaks at definition time is killed
        status, summary = "failed", f"the mutant does not define {name}: {type(exc).__name__}"
    if progress:
        progress(mutant.id)
    return Outcome(mutant, status, summary, time.perf_counter() - start, result)


# ============================================================================ the messages' wording
#: Nouns the checks count; "1 rows" and "3 row" are slips.
_COUNTED = ("row", "column", "entry", "entries", "key", "query", "queries", "head", "token", "position", "value",
            "element", "item", "case", "block", "step", "batch entry", "dimension", "axis", "axes", "tile", "layer",
            "byte", "call", "mutant", "exercise", "copy", "copies", "index", "indices", "time", "vector", "matrix",
            "matrices", "score", "weight", "number", "slice", "feature", "pair", "word")
_SINGULAR_OF = {"entries": "entry", "queries": "query", "axes": "axis", "copies": "copy", "indices": "index",
                "matrices": "matrix"}
_PLURAL_OF = {v: k for k, v in _SINGULAR_OF.items()}


def message_slips(text: str, *, part: str = "") -> list[str]:
    """Slips in one piece of a check's message: a count that disagrees with its noun ("1 rows", "2 row"),
    a word written twice in a row ("the the"), an empty or hollow field (two spaces where a word is
    missing, "expected" saying only "the expected values", a dangling "()" or " ,")."""
    import re

    slips = []
    singular = {w for w in _COUNTED if w not in _SINGULAR_OF}
    for match in re.finditer(r"(?<![\w.\-−/×*^])(?<![+\-−×*/] )(\d+) ([a-z]+)\b", text):
        count, word = int(match.group(1)), match.group(2)
        if count == 1 and (word in _SINGULAR_OF or (word.endswith("s") and word[:-1] in singular)):
            slips.append(f"'{match.group(0)}': one of a plural")
        elif count != 1 and word in singular and word not in ("time",) and not text[match.end():].startswith(("-", "'")):
            plural = _PLURAL_OF.get(word, word + "s")
            slips.append(f"'{match.group(0)}': {count} of a singular (write {count} {plural})")
    for match in re.finditer(r"(?<![\w.\-−/×*^])1 (?:[a-z]+ )?(?:ones\b|(?:that|which) (?:were|are|have)\b)", text):
        slips.append(f"'{match.group(0)}': one of a plural")
    for match in re.finditer(r"\b([A-Za-z]+) \1\b", text, re.I):
        slips.append(f"'{match.group(0)}': a word twice")
    for line in text.splitlines():
        body = line.strip()
        if "  " in body and not re.search(r"[=\[\](){}#:|]|\^", body):  # code lines and tables keep their alignment
            slips.append(f"'{body[:60]}': two spaces where a word is missing")
        prose = re.sub(r"\[[^\]]*\]", "[]", body)  # an index like [:, None, :] is code, not a gap
        if re.search(r"\( *\)(?! *[-=:])|\s[,;:](?!\d)|\s\.(?![\w(])|\{\}", prose) and not re.search(r"\w\(\)|shape \(\)|\.\.\.", body):
            slips.append(f"'{body[:60]}': an empty field")
    if part == "expected" and re.fullmatch(r"(the )?expected values?\.?", text.strip(), re.I):
        slips.append(f"expected says only '{text.strip()}'")
    if part in ("summary",) and not text.strip():
        slips.append("an empty summary")
    return slips


def result_slips(result) -> list[str]:
    """Every slip in a check result's summary and diagnosis parts (see :func:`message_slips`); the message of an
    exception the learner's code raised is Python's or PyTorch's, quoted as it is, and not judged."""
    import re

    found = [f"summary: {s}" for s in message_slips(result.summary, part="summary")]
    if result.diagnosis is not None:
        for name in ("tried", "got", "expected", "cause", "fix"):
            text = getattr(result.diagnosis, name)
            if re.match(r"(the backward pass raised )?\w+(Error|Exception|Warning|Exit|Interrupt)\b", text):
                text = "\n".join(line for line in text.splitlines() if line.startswith("at "))  # Python's own words
            found += [f"{name}: {s}" for s in message_slips(text, part=name)] if text else []
    return found


# ============================================================================ the same verdicts as before a refactor
def _verdict(status: str, result: Any) -> str:
    """What a mutant's run said, in full (status, summary, every part of the diagnosis), as comparable text."""
    return json.dumps([status, result], sort_keys=True, ensure_ascii=False)


def as_row(o: Outcome) -> dict:
    """One outcome as a ``--json`` file holds it (what ``--compare`` reads back)."""
    return {**asdict(o.mutant), "status": o.status, "summary": o.summary, "named": o.named,
            "result": o.result.to_json() if o.result else None, "seconds": round(o.seconds, 3)}


def _full(o: Outcome) -> str:
    return _verdict(o.status, o.result.to_json() if o.result else None)


def compare_runs(before: list[dict], now: list[Outcome], rerun: Callable[[list[Outcome]], list[list[Outcome]]]
                 ) -> dict[str, list]:
    """Sort the mutants of ``now`` by how their full result compares with ``before`` (a ``--json`` file's rows):
    ``same``; ``changed`` (a different verdict or text that stays the same when the mutant runs again);
    ``unstable`` (the mutant's own result varies from run to run: it reads memory it never wrote, or races a
    time limit, so it says nothing about the check); ``new`` / ``gone`` (in one run only: the solution or the
    operators changed). ``rerun(outcomes)`` runs those mutants again, twice, and returns the two lists."""
    old = {(r["exercise"], r["id"]): _verdict(r["status"], r.get("result")) for r in before}
    ran = {(o.mutant.exercise, o.mutant.id) for o in now}
    exercises = {o.mutant.exercise for o in now}
    sorted_: dict[str, list] = {"same": [], "changed": [], "unstable": [], "new": [],
                                "gone": [key for key in old if key[0] in exercises and key not in ran]}
    differ = []
    for o in now:
        key = (o.mutant.exercise, o.mutant.id)
        verdict = _full(o)
        if key not in old:
            sorted_["new"].append(o)
        elif verdict == old[key]:
            sorted_["same"].append(o)
        else:
            differ.append(o)
    if differ:
        seen = {(o.mutant.exercise, o.mutant.id): {_full(o)} for o in differ}
        for run in rerun(differ):
            for o in run:
                seen[(o.mutant.exercise, o.mutant.id)].add(_full(o))
        for o in differ:
            sorted_["unstable" if len(seen[(o.mutant.exercise, o.mutant.id)]) > 1 else "changed"].append(o)
    return sorted_


def load_equivalents(path: Path = EQUIVALENTS) -> dict[tuple[str, str], str]:
    """``(exercise, mutant id) -> why it is equivalent`` for the survivors a check cannot and must not kill.

    The file is ``{"about": …, "equivalent": [{"exercise", "id", "notebook", "solution", "mutant", "reason"}, …]}``:
    ``solution`` and ``mutant`` show the changed line before and after, for the reader; the key is (exercise, id)."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return {(row["exercise"], row["id"]): row["reason"] for row in data["equivalent"]}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("notebooks", nargs="*", help="solution notebooks (default: every registered one)")
    parser.add_argument("--solutions", default="solutions", help="folder of solution notebooks (default: solutions)")
    parser.add_argument("--exercise", action="append", help="only this exercise id (repeatable)")
    parser.add_argument("--sample", type=int, help="at most this many mutants per exercise, evenly spread")
    parser.add_argument("--json", metavar="FILE", help="write every outcome as JSON")
    parser.add_argument("--compare", metavar="FILE",
                        help="a --json file of an earlier run (before a refactor): report every mutant whose full "
                             "result (verdict, summary, diagnosis) is not the same now; exit 1 if any changed")
    parser.add_argument("--named", action="store_true",
                        help="also report, per notebook, how many rejected mutants get a named cause (the diagnosis's "
                             "'cause' part) rather than a generic 'does not match', and list the generic ones")


def run(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    wanted = [registry.by_slug(Path(p).stem) for p in args.notebooks] or [nb for nb in registry.NOTEBOOKS if nb.exercises]
    if unknown := sorted(set(args.exercise or ()) - {ex for nb in wanted for ex in nb.exercises}):
        print(f"--exercise {', '.join(unknown)}: no such exercise in "
              f"{', '.join(nb.filename for nb in wanted)}", file=sys.stderr)
        return 2
    before = None
    if getattr(args, "compare", None):
        try:
            before = json.loads(Path(args.compare).read_text(encoding="utf-8"))
            if not isinstance(before, list) or \
                    not all(isinstance(r, dict) and {"exercise", "id", "status"} <= set(r) for r in before):
                raise ValueError("not a list of mutants' outcomes")
        except (OSError, ValueError) as exc:
            print(f"--compare {args.compare}: cannot read it as a --json file of this command ({exc})", file=sys.stderr)
            return 2
    equivalents = load_equivalents()
    outcomes: list[Outcome] = []
    by_notebook: dict[str, list[Outcome]] = {}
    where: dict[str, tuple] = {}  # exercise -> (solution, check): to run a mutant again
    for nb in wanted:
        solution = nbformat.read(Path(args.solutions) / nb.filename, as_version=4)
        checks = importlib.import_module(nb.checks)
        for exercise in nb.exercises:
            if args.exercise and exercise not in args.exercise:
                continue
            check = getattr(checks, registry.check_name(exercise))
            where[exercise] = (solution, check)
            bar = tqdm(desc=f"{nb.number} {exercise}", unit="mutant", file=sys.stderr, leave=False)
            mine = run_exercise(solution, exercise, check, sample=args.sample, progress=lambda _: bar.update())
            bar.close()
            outcomes += mine
            by_notebook.setdefault(nb.number, []).extend(mine)
    survivors = [o for o in outcomes if o.survived and (o.mutant.exercise, o.mutant.id) not in equivalents]
    equivalent = [o for o in outcomes if o.survived and (o.mutant.exercise, o.mutant.id) in equivalents]
    print(f"{len(outcomes)} mutants: {len(outcomes) - len(survivors) - len(equivalent)} killed, "
          f"{len(equivalent)} equivalent (listed with reasons), {len(survivors)} survived")
    for o in survivors:
        print(f"SURVIVED {o.mutant.exercise} {o.mutant.id}")
    if getattr(args, "named", False):
        for nb, mine in by_notebook.items():
            named, rejected = named_share(mine)
            print(f"{nb}: {named} of {rejected} rejected mutants get a named cause"
                  + (f" ({100 * named / rejected:.1f} %)" if rejected else ""))
        named, rejected = named_share(outcomes)
        print(f"all: {named} of {rejected} rejected mutants get a named cause"
              + (f" ({100 * named / rejected:.1f} %)" if rejected else ""))
        for o in outcomes:
            if o.rejected and not o.named:
                print(f"GENERIC {o.mutant.exercise} {o.mutant.id}: {o.summary}")
    if args.json:
        Path(args.json).write_text(json.dumps([as_row(o) for o in outcomes], indent=1), encoding="utf-8")
    if before is not None:
        def rerun(differ: list[Outcome]) -> list[list[Outcome]]:
            ids: dict[str, set[str]] = {}
            for o in differ:
                ids.setdefault(o.mutant.exercise, set()).add(o.mutant.id)
            return [[o for exercise, only in ids.items()
                     for o in run_exercise(where[exercise][0], exercise, where[exercise][1], only=only)]
                    for _ in range(2)]

        sorted_ = compare_runs(before, outcomes, rerun)
        gone = [] if args.sample else sorted_["gone"]
        print(f"compared with {args.compare}: {len(sorted_['same'])} the same, {len(sorted_['changed'])} changed, "
              f"{len(sorted_['unstable'])} unstable (their result varies from run to run), "
              f"{len(sorted_['new'])} new, {len(gone)} no longer made")
        rows = {(r["exercise"], r["id"]): r for r in before}
        for o in sorted_["changed"]:
            old_row = rows[(o.mutant.exercise, o.mutant.id)]
            print(f"CHANGED {o.mutant.exercise} {o.mutant.id}: {old_row['status']} {old_row.get('summary', '')!r}"
                  f" -> {o.status} {o.summary!r}")
            was = ((old_row.get("result") or {}).get("diagnosis") or {})
            now = ((o.result.to_json() if o.result else {}).get("diagnosis") or {})
            for part in ("tried", "got", "expected", "cause", "fix"):
                if was.get(part) != now.get(part):
                    print(f"    {part}: {was.get(part)!r}\n      -> {now.get(part)!r}")
        for o in sorted_["unstable"]:
            print(f"UNSTABLE {o.mutant.exercise} {o.mutant.id}: {o.summary!r}")
        if sorted_["changed"]:
            return 1
    return 1 if survivors else 0

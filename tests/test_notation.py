"""One symbol, one meaning (docs/notation.md): the table gives each symbol one row, and the course's text does
not use a symbol of the table with another meaning where a pattern can tell.

What is read: every markdown cell of solutions/*.ipynb, the docstrings and comments of their code cells, and
the docstrings of the package attn_course (modules, classes, functions). What is flagged: the typical misuses
of the table's symbols — H or h for heads (the course's are A and a), N and D as sizes (n and d_k, d_head),
P as a permutation (P is the attention weights; a permutation is π, Π), L as a number of layers (L is the
logsumexp and the loss; layers are n_layers), m as ALiBi's slope or as a position (m is the running
maximum). Each failure names the notebook cell or the module and the line.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTATION = ROOT / "docs" / "notation.md"


@dataclass(frozen=True)
class Misuse:
    symbol: str
    meaning: str  # the table's meaning
    wrong: str  # the other meaning the pattern catches
    pattern: re.Pattern


def _p(regex: str) -> re.Pattern:
    return re.compile(regex)


MISUSES = [
    Misuse("A / a", "the number of heads / one head", "H or h for heads",
           _p(r"[(,]\s*\$?H\$?\s*,\s*(?:n|N|T|S|d|n_q|n_k)\b"  # a shape (B, H, n, …)
              r"|[(,]\s*(?:num_buckets|n|N)\s*,\s*H\s*\)"  # (num_buckets, H), (n, n, H)
              r"|\(\s*H\s*,\s*n\s*,"  # (H, n, n)
              r"|\$?\bH\$?\s+heads\b|\bheads?\s+\$?H\b(?![-\w])"  # "H heads", "heads H"
              r"|\bhead\s+\$?h\$?\b(?![-'\w])|\[h,\s*i,\s*j\]|\bm_h\b|\bm_\{h\}")),
    Misuse("n / d", "sequence length / a vector's width", "N or D as a size",
           _p(r"[(,]\s*(?:\.\.\.|…)\s*,\s*N\s*,|[(,]\s*N\s*,\s*(?:N|D|d)\b|,\s*D\s*\)"
              r"|\bN\s*=\s*\d|\bN\s*[²^]|[×·]\s*N\b|\bN\s*[×·]|\bD\s*=\s*\d|√D\b|[×·]\s*D\b(?!\s*=)"
              r"|\$N\^2\$|\bin \$N\$")),
    Misuse("π / Π", "a permutation / its matrix", "P as a permutation",
           _p(r"\$?\bP\$?\s+(?:is\s+)?an?\s+permutation|permutation(?:\s+matrix)?\s+\$?\bP\b|Attn\}\(PX\)|\bPX\b")),
    Misuse("n_layers", "a model's depth", "L as a number of layers",
           _p(r"\$?\bL\$?\s+layers\b|\blayers\s*\(?\$?\bL\$?\)?(?=[\s,.;)])(?<!n_layers)|\bL\s*=\s*\d+\s+layers")),
    Misuse("m", "the running maximum", "m as a slope or a position",
           _p(r"\bslopes?\s+\$?m\b|\bm\s*=\s*2\s*\*\*|\bposition\s+\$?m\b|\bR_\{?m\}?\b|\(\s*[qk]\s*,\s*m\s*\)"
              r"|\bat\s+\$?m\$?\s*,|\bm_h\b")),
]


def scan_text(text: str, where: str) -> list[str]:
    """Every misuse in ``text``, as 'where, line k: symbol — wrong meaning: the line'."""
    found = []
    for k, line in enumerate(text.splitlines(), 1):
        for misuse in MISUSES:
            if misuse.pattern.search(line):
                found.append(f"{where}, line {k}: {misuse.wrong} (the table: {misuse.symbol} = {misuse.meaning}): "
                             f"{line.strip()[:120]}")
    return found


def _code_text(source: str) -> str:
    """The docstrings and comments of a code cell or module, one per line group (code itself is not read)."""
    parts = []
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a cell with IPython magics: comments only
        tree = None
    if tree is not None:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    parts.append(doc)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                parts.append(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return "\n".join(parts)


def scan_notebook(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    found = []
    for i, cell in enumerate(nb.cells):
        text = cell.source if cell.cell_type == "markdown" else _code_text(cell.source)
        found += scan_text(text, f"{path.name}[{i}] ({cell.cell_type})")
    return found


def scan_module(path: Path) -> list[str]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                first = node.body[0].lineno if node.body else 1
                name = getattr(node, "name", "module docstring")
                for line in scan_text(doc, f"{path.relative_to(ROOT)} ({name}, from line {first})"):
                    found.append(line)
    return found


NOTEBOOKS = sorted((ROOT / "solutions").glob("*.ipynb"))
MODULES = sorted((ROOT / "attn_course").rglob("*.py"))


# ---------------------------------------------------------------- the scanner catches what it claims to
@pytest.mark.parametrize("text,wrong", [
    ("scores of shape (B, H, n, n)", "H or h for heads"),
    ("table: (num_buckets, H), one column per head", "H or h for heads"),
    ("Returns (H, n, n): bias[h, i, j] = table[bucket(j − i), h]", "H or h for heads"),
    ("for $H$ heads, $m_h = 2^{-8(h+1)/H}$", "H or h for heads"),
    ("the slope of head h", "H or h for heads"),
    ("q, k: (..., N, D), v: (..., N, Dv)", "N or D as a size"),
    ("the cost model 4·B·H·N²·D", "N or D as a size"),
    ("tiles grow like $N^2$, the window's like $N$", "N or D as a size"),
    ("and $P$ a permutation matrix (it reorders rows)", "P as a permutation"),
    (r"$$\mathrm{Attn}(PX) = P\,\mathrm{Attn}(X).$$", "P as a permutation"),
    ("a model of L layers", "L as a number of layers"),
    ("with $L$ layers and A heads", "L as a number of layers"),
    ("add $-m \\cdot |i - j|$ with slope m for each head", "m as a slope or a position"),
    ("the score of a query at position m and a key at n", "m as a slope or a position"),
    ("rotations compose: $R_m^\\top R_n = R_{n-m}$", "m as a slope or a position"),
])
def test_scanner_flags_a_planted_misuse(text, wrong):
    found = scan_text(text, "planted")
    assert found and any(wrong in f for f in found), found


@pytest.mark.parametrize("text", [
    "scores of shape (B, A, n_q, n_k)",
    "Returns (A, n, n): bias[a, i, j] = table[bucket(j − i), a]",
    "the entropy $H = -\\sum_j p_j \\log p_j$",
    "queries with $\\mathcal N(0, 1)$ entries, i.i.d. N(0, sigma²)",
    "$D = \\operatorname{rowsum}(dO \\odot O)$, computed once",
    "the weights P = softmax(S); the output O = PV; dV = Pᵀ dO",
    "L = m + log ℓ, the logsumexp; ∂ℒ/∂q the gradient of the loss",
    "n_layers = 32 layers, A = 32 heads",
    "the running maximum m and sum ℓ of each row",
    "a permutation π and its matrix Π: Attn(ΠX) = Π Attn(X)",
    "d_h, the hidden width of additive attention",
])
def test_scanner_lets_the_tables_meanings_through(text):
    assert scan_text(text, "planted") == []


def test_scanner_reads_markdown_docstrings_and_comments_of_a_notebook(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Title\n\nFor $H$ heads we add a bias."),
                nbformat.v4.new_code_cell('def f(x):\n    """x: (B, H, n, d)."""\n    return x  # fine\n'),
                nbformat.v4.new_code_cell("y = 1  # shape (..., N, D)\nH = 3  # code itself is not read\n")]
    path = tmp_path / "99_planted.ipynb"
    nbformat.write(nb, path)
    found = scan_notebook(path)
    assert [f.split(":")[0] for f in found] == ["99_planted.ipynb[0] (markdown), line 3",
                                               "99_planted.ipynb[1] (code), line 1",
                                               "99_planted.ipynb[2] (code), line 1"], found


# ---------------------------------------------------------------- the table itself
def test_notation_table_gives_each_symbol_one_row():
    rows = [line for line in NOTATION.read_text(encoding="utf-8").splitlines()
            if line.startswith("| ") and not line.startswith("| symbol") and not line.startswith("| ---")]
    symbols: dict[str, int] = {}
    for row in rows:
        for symbol in row.split("|")[1].split(","):
            symbols[symbol.strip()] = symbols.get(symbol.strip(), 0) + 1
    assert rows and {s: k for s, k in symbols.items() if k > 1} == {}


# ---------------------------------------------------------------- the course
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_uses_one_meaning_per_symbol(path):
    found = scan_notebook(path)
    assert found == [], "\n".join(found)


@pytest.mark.slow
def test_package_docstrings_use_one_meaning_per_symbol():
    found = [line for path in MODULES for line in scan_module(path)]
    assert found == [], "\n".join(found)

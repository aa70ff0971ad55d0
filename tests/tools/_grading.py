"""What the grading tests share: a small course built from the real notebooks 03 and 05, learner
notebooks made from it, and one grader kept for the whole test process (its fork server imports
PyTorch once).

The course holds trimmed copies of ``solutions/05_attention.ipynb`` and ``03_softmax.ipynb`` (set-up,
exercise and check cells, plus two demonstrations: one that would end the process if it ran, one
defining a name an answer may use) and a ``00_setup`` with no exercise. Answers are written here,
not copied from the solutions.
"""

from __future__ import annotations

import atexit
import copy
import functools
import json
import shutil
import tempfile
from pathlib import Path

import nbformat

from attn_course.tools import nbmeta
from attn_course.tools.exercises import make_exercise
from attn_course.tools.grading.course import Course
from attn_course.tools.grading.pipeline import Grader
from attn_course.tools.grading.sandbox import Limits

REPO = Path(__file__).resolve().parents[2]

ATTENTION = '''def attention(Q, K, V, mask=None):
    """Scaled dot-product attention, written for the tests."""
    scale = 1.0 / math.sqrt(K.shape[-1])
    scores = torch.matmul(Q, K.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), -math.inf)
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    return torch.matmul(weights, V), weights
'''
WRONG_ATTENTION = ATTENTION.replace("* scale", "")  # the classic: no 1/√d_k
BYTES = '''def score_matrix_bytes(n, batch=1, heads=1, dtype=torch.float32):
    itemsize = torch.tensor([], dtype=dtype).element_size()
    return int(batch * heads * n * n * itemsize)
'''
SOFTMAX = '''def stable_softmax(x, dim=-1):
    z = x - x.max(dim=dim, keepdim=True).values
    return z.exp() / z.exp().sum(dim=dim, keepdim=True)
'''
#: A demonstration cell that ends the process: if it ever ran, no check after it would be checked.
FATAL_DEMO = "import os\nos._exit(7)  # a demonstration the grader must skip"
#: A demonstration defining a constant an answer may read.
CONSTANT_DEMO = "SCALE_FLOOR = 1e-12  # demonstration constant"

NOTEBOOK_05, NOTEBOOK_03 = "05_attention", "03_softmax"


def _trim(source: Path, keep_exercises: tuple[str, ...]) -> nbformat.NotebookNode:
    nb = nbformat.read(source, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "markdown"][:1]
    cells += [c for c in nb.cells if nbmeta.role(c) == nbmeta.SETUP]
    cells.append(nbformat.v4.new_code_cell(CONSTANT_DEMO))
    for ex in nbmeta.exercises(nb):
        if ex.id in keep_exercises:
            cells += [nb.cells[ex.cell], nb.cells[ex.check_cell]]
            cells.append(nbformat.v4.new_code_cell(FATAL_DEMO))
    out = nbformat.v4.new_notebook(cells=copy.deepcopy(cells), metadata=nb.metadata)
    out.metadata.pop("widgets", None)
    for cell in out.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return out


@functools.lru_cache(maxsize=None)
def course_dir() -> Path:
    """A course folder (solutions/ and notebooks/) made once per test process."""
    root = Path(tempfile.mkdtemp(prefix="attn-test-course-"))
    atexit.register(shutil.rmtree, root, True)
    (root / "solutions").mkdir()
    (root / "notebooks").mkdir()
    notebooks = {
        NOTEBOOK_05: _trim(REPO / "solutions" / f"{NOTEBOOK_05}.ipynb", ("attention", "score_matrix_bytes")),
        NOTEBOOK_03: _trim(REPO / "solutions" / f"{NOTEBOOK_03}.ipynb", ("stable_softmax",)),
        "00_setup": nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 00 · Setup"),
                                                    nbformat.v4.new_code_cell("import torch\nprint(torch.__version__)")]),
    }
    for slug, nb in notebooks.items():
        nbformat.write(nb, root / "solutions" / f"{slug}.ipynb")
        nbformat.write(make_exercise(nb, f"solutions/{slug}.ipynb"), root / "notebooks" / f"{slug}.ipynb")
    return root


@functools.lru_cache(maxsize=None)
def course() -> Course:
    return Course(course_dir() / "solutions")


def exercise_notebook(slug: str = NOTEBOOK_05) -> nbformat.NotebookNode:
    return nbformat.read(course_dir() / "notebooks" / f"{slug}.ipynb", as_version=4)


def learner_notebook(slug: str = NOTEBOOK_05, answers: dict[str, str] | None = None, *,
                     added: list[tuple[str, str]] = (), check_sources: dict[str, str] | None = None,
                     drop: tuple[str, ...] = ()) -> nbformat.NotebookNode:
    """The exercise notebook with ``answers`` in the exercise cells (by id), cells ``added`` right
    after the named exercise's cell (``("before:<id>", source)`` puts one before it), the learner's
    check cells replaced by ``check_sources`` and the exercise cells in ``drop`` deleted."""
    nb = exercise_notebook(slug)
    answers = answers or {}
    cells = []
    for cell in nb.cells:
        ident, role = nbmeta.exercise_id(cell), nbmeta.role(cell)
        if role == nbmeta.EXERCISE and ident in drop:
            continue
        for where, source in added:
            if where == f"before:{ident}" and role == nbmeta.EXERCISE:
                cells.append(nbformat.v4.new_code_cell(source))
        if role == nbmeta.EXERCISE and ident in answers:
            cell.source = answers[ident]
        if role == nbmeta.CHECK and check_sources and ident in check_sources:
            cell.source = check_sources[ident]
        cells.append(cell)
        for where, source in added:
            if where == ident and role == nbmeta.EXERCISE:
                cells.append(nbformat.v4.new_code_cell(source))
    nb.cells = cells
    return nb


def graded_cells_only(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` cut, in place, to what grading runs: its set-up, exercise and check cells, in order."""
    nb.cells = [c for c in nb.cells if nbmeta.role(c) in (nbmeta.SETUP, nbmeta.EXERCISE, nbmeta.CHECK)]
    return nb


def write(nb: nbformat.NotebookNode, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def correct(slug: str = NOTEBOOK_05) -> nbformat.NotebookNode:
    answers = {NOTEBOOK_05: {"attention": ATTENTION, "score_matrix_bytes": BYTES},
               NOTEBOOK_03: {"stable_softmax": SOFTMAX}}[slug]
    return learner_notebook(slug, answers)


#: Limits for tests: generous enough that no correct notebook nears them on a loaded machine.
TEST_LIMITS = Limits(cell_timeout=60, notebook_timeout=300, memory_mb=3072, call_timeout=None)


@functools.lru_cache(maxsize=None)
def grader() -> Grader:
    """One grader (two job slots) for the whole test process, closed at exit."""
    g = Grader(course(), TEST_LIMITS, jobs=2)
    atexit.register(g.close)
    return g


def grade_notebook(nb: nbformat.NotebookNode, tmp_path: Path, *, name: str | None = None, learner: str = "ada",
                   limits: Limits | None = None):
    """Write ``nb`` into a learner folder and grade it; returns ``{exercise: Row}``."""
    from attn_course.tools.grading import collect, files

    path = write(nb, tmp_path / learner / (name or f"{NOTEBOOK_05}.ipynb"))
    found = files.Found(learner, path, str(path.relative_to(tmp_path)))
    sub = collect.read_submission(found, course())
    rows = grader().grade(sub, limits=limits)
    return {r.exercise: r for r in rows}


def rows_text(rows) -> str:
    return json.dumps([r.to_json() for r in (rows.values() if isinstance(rows, dict) else rows)], indent=1,
                      ensure_ascii=False)

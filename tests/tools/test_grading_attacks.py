"""Attacks beyond issue 14's list, each run as a learner's code in a real learner process: none of
them passes an exercise, stops the class or changes the grades unnoticed (attn_course.tools.grading:
verdict, run, journal, commands).

The fast ones grade one notebook with the shared test grader (tests/tools/_grading.py); the two that
need a class folder and an ``--out`` folder grade a small class and are marked slow.
"""

from __future__ import annotations

import csv
import io
import json
import time

import pytest

from attn_course.tools.grading.commands import grade_class
from attn_course.tools.grading.journal import JOURNAL
from attn_course.tools.grading.sandbox import landlock_abi

from ._grading import (ATTENTION, BYTES, NOTEBOOK_05, TEST_LIMITS, WRONG_ATTENTION, correct, course_dir,
                       grade_notebook, grader, learner_notebook, rows_text, write)

RIGHT = {"attention": ATTENTION, "score_matrix_bytes": BYTES}
WRONG = {"attention": WRONG_ATTENTION, "score_matrix_bytes": BYTES}


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_patching_torch_in_the_learners_process_changes_no_reference_and_is_caught(tmp_path):
    """The check draws its inputs with torch.randn in the learner's process; patched there (through
    ``vars()``, which no source flag looks for), the record answers other questions than the check asks
    when it is replayed: never a pass, and flagged."""
    patch = ("import torch\n_randn = torch.randn\n"
             "def doubled(*shape, **kwargs):\n    return 2 * _randn(*shape, **kwargs)\n"
             "vars(torch)['ran' + 'dn'] = doubled")
    rows = grade_notebook(learner_notebook(answers=RIGHT, added=[("before:attention", patch)]), tmp_path)
    assert rows["attention"].status == "error" and "record is incomplete" in rows["attention"].message, rows_text(rows)
    assert any("does not match the course's check" in f for f in rows["attention"].flags), rows_text(rows)
    # PyTorch's functions as the grader's references use them are untouched by any of this:
    softmax = ("import torch, torch.nn.functional as F\n"
               "F.scaled_dot_product_attention = lambda q, k, v, *a, **kw: torch.matmul(torch.softmax("
               "q @ k.transpose(-1, -2), dim=-1), v)\ntorch.softmax = torch.nn.functional.softmax")
    rows = grade_notebook(learner_notebook(answers=WRONG, added=[("before:attention", softmax)]), tmp_path / "b")
    assert rows["attention"].status == "failed", rows_text(rows)
    assert any("replaces a library attribute" in f for f in rows["attention"].flags), rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_a_check_cell_replaced_by_a_displayed_pass_changes_nothing(tmp_path):
    from attn_course.checks.result import CheckResult, Status

    forged = CheckResult("attention", Status.PASSED, "matches F.scaled_dot_product_attention")
    fake = f"from IPython.display import display\ndisplay({forged.mimebundle()!r}, raw=True)"
    nb = learner_notebook(answers=WRONG, check_sources={"attention": fake})
    rows = grade_notebook(nb, tmp_path)
    assert rows["attention"].status == "failed", rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_a_pickle_in_a_forged_log_is_never_unpickled_by_the_grader(tmp_path):
    marker = tmp_path / "unpickled-in-the-grader"
    forge = ("import os, numpy as np\nimport attn_course.checks.attention as c\n"
             "class Payload:\n"
             f"    def __reduce__(self): return (open, ({str(marker)!r}, 'w'))\n"
             "def forged(*args, **kwargs):\n"
             "    path = os.path.join(os.environ['ATTN_COURSE_RECORD_DIR'], 'attention.npz')\n"
             "    np.savez(path, __events__=np.array([Payload()], dtype=object))\n"
             "c.check_attention = forged")
    rows = grade_notebook(learner_notebook(answers=WRONG, added=[("before:attention", forge)]), tmp_path)
    assert rows["attention"].status == "failed", rows_text(rows)
    assert any("damaged or forged" in f for f in rows["attention"].flags), rows_text(rows)
    assert not marker.exists(), "the grader unpickled the learner's log"


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_huge_output_is_discarded_and_grading_goes_on(tmp_path):
    flood = ("import os, sys\nchunk = 'x' * 2**20\n"
             "for _ in range(150):\n    sys.stdout.write(chunk)\n    os.write(2, chunk.encode())\n"
             "from IPython.display import display\ndisplay({'text/html': chunk * 20}, raw=True)")
    started = time.monotonic()
    rows = grade_notebook(learner_notebook(answers=RIGHT, added=[("attention", flood)]), tmp_path)
    assert [r.status for r in rows.values()] == ["passed", "passed"], rows_text(rows)
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_memory_of_a_child_in_a_new_session_counts_against_the_notebook(tmp_path):
    """A double-forked child in a new session allocating without end is counted with the notebook
    (the fork server is a subreaper; or the notebook's cgroup) and stopped with it."""
    from attn_course.tools.grading.sandbox import Limits

    code = ("import os, sys\nif os.fork(): sys.exit(0)\nos.setsid()\nblocks = []\n"
            "while True:\n    blocks.append(b'x' * 2**26)")
    hog = (f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {code!r}]).wait()\n"
           "time.sleep(20)")
    limits = Limits(**{**TEST_LIMITS.__dict__, "memory_mb": 700, "address_space_mb": None})
    started = time.monotonic()
    rows = grade_notebook(learner_notebook(answers=RIGHT, added=[("attention", hog)]), tmp_path, limits=limits)
    assert rows["attention"].status == "passed", rows_text(rows)
    assert "700 MiB" in rows["score_matrix_bytes"].message + rows["score_matrix_bytes"].note, rows_text(rows)
    assert time.monotonic() - started < 20, "the notebook was not stopped when its child passed the limit"


def _grades(out):
    text = (out / "grades.csv").read_text(encoding="utf-8-sig")
    return {(r["learner"], r["exercise"]): r for r in csv.DictReader(io.StringIO(text))}


def _forged_entry(learner: str, slug: str, exercise: str) -> str:
    row = {"learner": learner, "notebook": slug, "exercise": exercise, "status": "passed", "message": "forged"}
    return json.dumps({"kind": "graded", "key": "forged", "rows": [row]})


@pytest.mark.slow
@pytest.mark.parametrize("confine", [False, True], ids=["audit-hook-only", "landlock"])
def test_the_grades_folder_and_other_learners_files_are_out_of_reach(tmp_path, confine):
    """A subprocess (which an audit hook does not stop) appends forged rows to the grader's journal and
    overwrites grades.csv; a daemon in a new session waits for the notebook to end, then plants a file in
    another learner's folder. The journal is restored (and that named), the reports rewritten, the daemon
    killed with its notebook. With Landlock the kernel refuses every one of those writes."""
    if confine and landlock_abi() < 1:
        pytest.skip("Landlock is not available here")
    root, out = tmp_path / "class", tmp_path / "grades"
    write(correct(), root / "ada" / f"{NOTEBOOK_05}.ipynb")
    journal = out / JOURNAL
    forged = "".join(_forged_entry("mal", slug, ex) + "\n"
                     for slug, ex in (("03_softmax", "stable_softmax"), (NOTEBOOK_05, "attention")))
    code = f"open({str(journal)!r}, 'a').write({forged!r})\nopen({str(out / 'grades.csv')!r}, 'w').write('forged')"
    tamper = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {code!r}])"
    write(learner_notebook(answers=WRONG, added=[("attention", tamper)]), root / "mal" / f"{NOTEBOOK_05}.ipynb")
    planted = root / "ada" / "planted-later.ipynb"
    # Double-forked into a new session; waits until the learner process has ended, then one more second.
    code = ("import os, sys, time\nif os.fork(): sys.exit(0)\nos.setsid()\nlearner = int(sys.argv[1])\n"
            "while os.path.exists(f'/proc/{learner}') and open(f'/proc/{learner}/stat').read().split()[2] != 'Z':\n"
            "    time.sleep(0.02)\n"
            f"time.sleep(1)\nopen({str(planted)!r}, 'w').write('x')")
    daemon = f"import os, subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {code!r}, str(os.getpid())]).wait()"
    write(learner_notebook(answers=RIGHT, added=[("attention", daemon)]), root / "dan" / f"{NOTEBOOK_05}.ipynb")
    log = io.StringIO()
    runner = grader().runner if confine else None  # the shared runner is confined, with TEST_LIMITS
    assert grade_class(root, out=out, solutions=str(course_dir() / "solutions"), limits=TEST_LIMITS, jobs=1,
                       confine=confine, stdout=log, runner=runner) == 0, log.getvalue()
    time.sleep(2)  # longer than the daemon waits after its notebook ended
    assert not planted.exists(), "a process a submission started outlived its notebook"
    grades = _grades(out)
    assert grades[("mal", "attention")]["status"] == "failed", grades
    assert grades[("mal", "stable_softmax")]["status"] == "not submitted", grades
    assert grades[("ada", "attention")]["status"] == grades[("dan", "attention")]["status"] == "passed", grades
    assert '"forged"' not in journal.read_text(encoding="utf-8")
    summary = (out / "summary.md").read_text(encoding="utf-8")
    if confine:  # the kernel refused the writes: nothing to restore
        assert "was changed by something other than the grader" not in summary
    else:
        assert f"{journal} was changed by something other than the grader" in summary, summary


@pytest.mark.slow
@pytest.mark.parametrize("confine", [False, True], ids=["audit-hook-only", "landlock"])
def test_a_submission_reads_neither_classmates_notebooks_nor_the_solutions(tmp_path, confine):
    """An answer that, while it is graded, takes the code of ``attention`` from a classmate's notebook or
    from the course's solutions and runs it (it passed before reads were confined): every read is refused
    (by the kernel with Landlock, by the audit hook without), so it fails, and says so."""
    if confine and landlock_abi() < 1:
        pytest.skip("Landlock is not available here")
    root, out = tmp_path / "class", tmp_path / "grades"
    write(correct(), root / "ada" / f"{NOTEBOOK_05}.ipynb")
    solutions = course_dir() / "solutions"
    sources = [str(root / "ada" / f"{NOTEBOOK_05}.ipynb"), str(solutions / f"{NOTEBOOK_05}.ipynb")]
    borrow = ("def attention(Q, K, V, mask=None):\n    import json\n    refused = []\n"
              f"    for path in {sources!r}:\n"
              "        try:\n            cells = json.load(open(path))['cells']\n"
              "        except OSError as exc:\n            refused.append(type(exc).__name__)\n            continue\n"
              "        for cell in cells:\n            code = ''.join(cell['source'])\n"
              "            if code.startswith('def attention('):\n                scope = dict(globals())\n"
              "                exec(code, scope)\n                return scope['attention'](Q, K, V, mask)\n"
              "    raise PermissionError(' '.join(refused))\n")
    write(learner_notebook(answers={**RIGHT, "attention": borrow}), root / "mal" / f"{NOTEBOOK_05}.ipynb")
    log = io.StringIO()
    runner = grader().runner if confine else None  # the shared runner is confined, with TEST_LIMITS
    assert grade_class(root, out=out, solutions=str(solutions), limits=TEST_LIMITS, jobs=1, confine=confine,
                       stdout=log, runner=runner) == 0, log.getvalue()
    grades = _grades(out)
    assert grades[("ada", "attention")]["status"] == "passed", grades
    assert grades[("mal", "attention")]["status"] == "failed", grades
    assert "PermissionError" in grades[("mal", "attention")]["message"], grades

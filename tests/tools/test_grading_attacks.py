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
import os
import time
from pathlib import Path

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
def test_a_computer_reported_too_busy_by_the_learners_process_alone_is_a_failure(tmp_path):
    """The learner's process answers every call of the check with a made-up time-out on a busy machine
    (30 s waited, 1 s computed, 25 s ready to run): replayed, that is "not checked: the computer was too
    busy". The grader measured the process's own wait for a processor: well under a second, so the times
    were false. A failure, flagged, never an error that asks to grade again."""
    forge = ("from attn_course.checks.boundary import sessions\n"
             "def run(self, op, ref, method, args, kwargs, *, timeout, extra=None, clock=None):\n"
             "    return {'timeout': 10.0, 'waited': 30.0, 'computed': 1.0, 'by': 'wall', 'queued': 25.0}, {}\n"
             "setattr(sessions.LocalSession, 'r' + 'un', run)")
    rows = grade_notebook(learner_notebook(answers=WRONG, added=[("before:attention", forge)]), tmp_path)
    if not Path("/proc/self/schedstat").exists():
        pytest.skip("no /proc/<pid>/schedstat here: the grader cannot measure a wait for a processor")
    assert rows["attention"].status == "failed", rows_text(rows)
    assert any("the times were reported falsely" in f for f in rows["attention"].flags), rows_text(rows)


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


# ---------------------------------------------------------------------------------------- red team, round 2
#: Waits until a classmate's check has written its log (a stat of another learner's folder is not refused),
#: then replaces its own record folder by a link to theirs: without care the grader reads their log as its own.
_STEAL_RECORD = '''import os, time
here = os.getcwd()
base = os.path.dirname(here)
mine = int(os.path.basename(here).split("-")[1])
NEIGHBOURS = [k for k in range(mine - 20, mine + 21) if k > 0 and k != mine]
found = None
end = time.time() + 50
while found is None and time.time() < end:
    for k in NEIGHBOURS:
        d = os.path.join(base, "work-%d" % k, "record")
        if d != os.path.join(here, "record") and os.path.exists(os.path.join(d, "attention" + ".np" + "z")):
            found = d
            break
    time.sleep(0.05)
if found:
    time.sleep(1.0)
    for name in os.listdir("record"):
        os.remove(os.path.join("record", name))
    os.rmdir("record")
    os.symlink(found, "record")
'''


#: Ada's slow cell: she runs until a classmate's record folder has become a link and is gone again (his grading
#: ended and his folder was removed), at most 20 s: her folder exists for as long as his check can read it.
#: (Her folder's parent cannot be listed, so she looks at the names next to her own, work-N, as he does.)
_OUTLAST_THE_THIEF = '''import os, time
base, mine = os.path.dirname(os.getcwd()), int(os.path.basename(os.getcwd()).split("-")[1])
end, seen = time.time() + 20, False
while time.time() < end:
    links = [k for k in range(max(1, mine - 20), mine + 21) if os.path.islink(os.path.join(base, "work-%d" % k, "record"))]
    seen = seen or bool(links)
    if seen and not links:
        break
    time.sleep(0.05)
'''


@pytest.mark.slow
def test_a_record_folder_replaced_by_a_link_to_a_classmates_is_not_read(tmp_path):
    """Two notebooks graded at once: bob's wrong answer swaps his record folder for a link to ada's while she
    still runs (a slow cell of her own). His logs are read only from his own folder: he fails, and it says so."""
    assert grader().runner.jobs >= 2
    root, out = tmp_path / "class", tmp_path / "grades"
    write(learner_notebook(answers=RIGHT, added=[("score_matrix_bytes", _OUTLAST_THE_THIEF)]),
          root / "ada" / f"{NOTEBOOK_05}.ipynb")
    write(learner_notebook(answers=WRONG, added=[("score_matrix_bytes", _STEAL_RECORD)]),
          root / "bob" / f"{NOTEBOOK_05}.ipynb")
    log = io.StringIO()
    assert grade_class(root, out=out, solutions=str(course_dir() / "solutions"), limits=TEST_LIMITS, jobs=2,
                       stdout=log, runner=grader().runner) == 0, log.getvalue()
    grades = _grades(out)
    assert grades[("ada", "attention")]["status"] == "passed", grades
    assert grades[("bob", "attention")]["status"] == "failed", grades
    assert "symbolic link" in grades[("bob", "attention")]["note"], grades


@pytest.mark.slow
def test_odd_text_in_a_submission_does_not_stop_the_class(tmp_path):
    """A file name that is not UTF-8, a lone surrogate written into the learner's progress file, and cell
    metadata of the wrong types (tags a number, nbgrader metadata a list): the class still gets its table."""
    import os

    root, out = tmp_path / "class", tmp_path / "grades"
    write(correct(), root / "ada" / f"{NOTEBOOK_05}.ipynb")
    (root / "ada").joinpath(os.fsdecode(b"notes-\xff.txt")).write_bytes(b"x")
    odd = ("for k in range(40):\n    open('progress.jsonl', 'a').write("
           "'{\"cell\": %d, \"error\": {\"type\": \"E\", \"message\": \"\\\\ud800\"}}\\n' % k)")
    write(learner_notebook(answers=WRONG, added=[("attention", odd)]), root / "bob" / f"{NOTEBOOK_05}.ipynb")
    nb = correct()
    nb.cells[1].metadata["tags"] = 5
    nb.cells[2].metadata["nbgrader"] = [1]
    write(nb, root / "cy" / f"{NOTEBOOK_05}.ipynb")
    log = io.StringIO()
    assert grade_class(root, out=out, solutions=str(course_dir() / "solutions"), limits=TEST_LIMITS, jobs=1,
                       stdout=log, runner=grader().runner) == 0, log.getvalue()
    grades = _grades(out)
    assert grades[("ada", "attention")]["status"] == "passed", grades
    assert grades[("bob", "attention")]["status"] == "failed" and "\\ud800" in grades[("bob", "attention")]["note"]
    assert grades[("cy", "attention")]["status"] == "passed", grades
    assert "notes-\\\\xff.txt" in (out / "summary.md").read_text(encoding="utf-8")  # its backslash escaped


def test_removing_a_learners_folder_never_changes_what_a_link_in_it_points_to(tmp_path, monkeypatch):
    """A link left in a folder the learner made read-only cannot be unlinked by a grader that is not root;
    the retry makes the folder writable, and must not chmod the link's target (a classmate's notebook)."""
    import os
    import stat

    from attn_course.tools.grading import watch

    victim = tmp_path / "victim.ipynb"
    victim.write_text("{}")
    victim.chmod(0o444)
    trap = tmp_path / "work" / "trap"
    trap.mkdir(parents=True)
    (trap / "link").symlink_to(victim)
    unlink, refused = os.unlink, []

    def unlink_as_a_user(path, *args, **kwargs):  # what a grader that is not root meets in a folder mode 0o500
        if str(path).endswith("link") and not refused:
            refused.append(path)
            raise PermissionError(13, "Permission denied", str(path))
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink_as_a_user)
    watch._rmtree(tmp_path / "work")
    monkeypatch.undo()
    assert refused and not (tmp_path / "work").exists()
    assert stat.S_IMODE(victim.stat().st_mode) == 0o444


def test_learners_text_in_the_summary_is_literal_markdown():
    """Messages, flags and warnings hold what learners wrote (an exception's message, a file name): in
    summary.md no HTML, link or table cell of theirs may take effect."""
    from attn_course.tools.grading.journal import ClassInfo
    from attn_course.tools.grading.model import Row
    from attn_course.tools.grading.report import class_summary

    evil = "<!-- [passed](http://x.test) <img src=x> \\| passed |"
    rows = [Row("ada", NOTEBOOK_05, "attention", "failed", f"it raised E: {evil}", [f"copy {evil}"])]
    text = class_summary(rows, ClassInfo(learners=["ada"], assigned=[NOTEBOOK_05], warnings=[f"ada/{evil}.txt"]))
    for line in text.splitlines():
        if "http://x.test" in line:
            assert "<!--" not in line.replace("\\<", "") and "](" not in line.replace("\\]", ""), line
            assert "<img" not in line.replace("\\<", ""), line
            assert not line.startswith("|") or _unescaped_pipes(line) == 4, line  # both tables have 3 columns


def _unescaped_pipes(line: str) -> int:
    count, escaped = 0, False
    for char in line:
        count += char == "|" and not escaped
        escaped = char == "\\" and not escaped
    return count


@pytest.mark.slow  # loads the test course
def test_a_learners_copies_are_read_within_a_budget_and_a_notebook_of_endless_cells_is_refused(tmp_path,
                                                                                            monkeypatch):
    """Parsing costs seconds per thousand cells: a notebook of a million tiny cells, hard-linked a thousand
    times, would keep the class waiting for days. Cells are counted before parsing, and a learner's
    notebooks are read up to a budget."""
    import os

    import nbformat

    from attn_course.tools.grading import collect, files

    from ._grading import course

    nb = correct()
    # ids of our own: 5,000 random 8-hex ids collide now and then (a DuplicateCellId warning from nbformat)
    nb.cells += [nbformat.v4.new_code_cell("x = 1", id=f"endless-{i}") for i in range(collect.MAX_CELLS)]
    big = write(nb, tmp_path / "ada" / f"{NOTEBOOK_05}.ipynb")
    sub = collect.read_submission(files.Found("ada", big, f"ada/{NOTEBOOK_05}.ipynb"), course())
    assert sub.problem.startswith("not a course notebook") and "cells" in sub.problem, sub.problem
    one = write(correct(), tmp_path / "bob" / f"{NOTEBOOK_05}.ipynb")
    for k in range(30):
        os.link(one, tmp_path / "bob" / f"copy-{k}.ipynb")
    found = files.scan_class(tmp_path).learners["bob"]
    monkeypatch.setattr(collect, "MAX_LEARNER_BYTES", 3 * one.stat().st_size)
    read = []
    monkeypatch.setattr(collect, "read_submission", lambda item, c, _real=collect.read_submission:
                        read.append(item) or _real(item, c))
    chosen, _, warnings = collect.collect("bob", found, course())
    assert len(read) == 3 and [s.rel for s in chosen] == [f"bob/{NOTEBOOK_05}.ipynb"], [s.rel for s in chosen]
    assert any("28 notebooks not read" in w for w in warnings), warnings


# ---------------------------------------------------------------------------------------- red team, round 5
#: Leaves its folder nested 3,000 deep (past Python's recursion limit; shutil.rmtree and os.walk recurse per
#: level): removing it raised RecursionError, which lost the notebook's verdicts and left the grader's private
#: folder behind, whose clean-up then stopped every later grading run on the machine.
_NEST = "import os\nhere = os.getcwd()\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\nos.chdir(here)\n"


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_folders_nested_past_the_recursion_limit_lose_no_verdict_and_are_removed(tmp_path):
    from attn_course.tools.grading import watch

    rows = grade_notebook(learner_notebook(answers=RIGHT, added=[("attention", _NEST)]), tmp_path)
    assert [r.status for r in rows.values()] == ["passed", "passed"], rows_text(rows)
    rows = grade_notebook(learner_notebook(answers=WRONG, added=[("attention", _NEST)]), tmp_path / "b")
    assert rows["attention"].status == "failed", rows_text(rows)
    # What a grader killed mid-notebook leaves for the next run's clean-up (and its disk-use measure):
    left = tmp_path / "left-behind"
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        os.mkdir("left-behind", dir_fd=fd)
        current = os.open("left-behind", os.O_RDONLY, dir_fd=fd)
        for _ in range(3000):
            os.mkdir("d", dir_fd=current)
            nxt = os.open("d", os.O_RDONLY, dir_fd=current)
            os.close(current)
            current = nxt
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=current), "wb") as fh:
            fh.write(b"x" * 10)
        os.close(current)
    finally:
        os.close(fd)
    try:
        assert watch._size(left) >= 10  # past the longest path: counted as larger than any limit
    finally:
        watch._rmtree(left)  # (pytest's own clean-up of old temporary folders recurses too)
    assert not left.exists()


@pytest.mark.slow
def test_two_learner_folders_shown_under_one_name_are_both_graded(tmp_path):
    """``mal<0xff>`` (a name that is not UTF-8) is shown as ``mal\\xff``, the name of a classmate's folder: the
    second folder replaced the first learner, whose grades were lost without a word. Both are graded."""
    root, out = tmp_path / "class", tmp_path / "grades"
    write(correct(), root / "mal\\xff" / f"{NOTEBOOK_05}.ipynb")
    write(learner_notebook(answers=WRONG), root / os.fsdecode(b"mal\xff") / f"{NOTEBOOK_05}.ipynb")
    log = io.StringIO()
    assert grade_class(root, out=out, solutions=str(course_dir() / "solutions"), limits=TEST_LIMITS, jobs=1,
                       stdout=log, runner=grader().runner) == 0, log.getvalue()
    grades = _grades(out)
    statuses = sorted(r["status"] for (learner, ex), r in grades.items() if ex == "attention")
    assert statuses == ["failed", "passed"], grades
    assert len({learner for learner, _ in grades}) == 2, grades
    assert "shown with the same name" in (out / "summary.md").read_text(encoding="utf-8")

"""Verdicts come from replaying the course's checks on the learner's outputs: nothing a submission
prints, patches or forges in its own process passes an exercise (attn_course.tools.grading.verdict).

Each test grades a notebook built from the small test course (tests/tools/_grading.py) in a real
learner process, so every attack below runs exactly as a learner's code would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attn_course.checks.core import check
from attn_course.tools.grading import collect, files
from attn_course.tools.grading.course import CourseExercise
from attn_course.tools.grading.plan import plan
from attn_course.tools.grading.sandbox import Limits, landlock_abi
from attn_course.tools.grading.verdict import judge

from ._grading import (ATTENTION, BYTES, NOTEBOOK_05, TEST_LIMITS, WRONG_ATTENTION, correct, course, grade_notebook,
                       grader, learner_notebook, rows_text, write)

RIGHT = {"attention": ATTENTION, "score_matrix_bytes": BYTES}
WRONG = {"attention": WRONG_ATTENTION, "score_matrix_bytes": BYTES}


def _status(rows, exercise="attention"):
    return rows[exercise].status


# ---------------------------------------------------------------------------------------- honest work
@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_correct_answers_pass_without_flags(tmp_path):
    rows = grade_notebook(correct(), tmp_path)
    assert [r.status for r in rows.values()] == ["passed", "passed"], rows_text(rows)
    assert not any(r.flags for r in rows.values()), rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_an_unfilled_notebook_is_not_attempted(tmp_path):
    rows = grade_notebook(learner_notebook(), tmp_path)
    assert {r.status for r in rows.values()} == {"not attempted"}, rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_a_wrong_answer_fails_with_the_checks_own_summary(tmp_path):
    rows = grade_notebook(learner_notebook(answers=WRONG), tmp_path)
    assert _status(rows) == "failed" and rows["score_matrix_bytes"].status == "passed", rows_text(rows)
    assert "√d_k" in rows["attention"].message or "scale" in rows["attention"].message, rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_a_syntax_error_is_reported_with_its_line(tmp_path):
    broken = ATTENTION.replace("scale = 1.0 / math.sqrt(K.shape[-1])", "scale = 1.0 / math.sqrt(K.shape[-1]")
    rows = grade_notebook(learner_notebook(answers={"attention": broken}), tmp_path)
    assert _status(rows) == "failed"
    assert rows["attention"].message.startswith("syntax error in line 3"), rows_text(rows)
    assert "NameError" not in rows["attention"].message


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_an_exercise_cell_that_defines_another_name_says_so(tmp_path):
    rows = grade_notebook(learner_notebook(answers={"attention": ATTENTION.replace("def attention", "def atention")}),
                          tmp_path)
    assert _status(rows) == "failed" and "does not define `attention`" in rows["attention"].message, rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_an_exercise_cell_that_raises_says_which_error_and_line(tmp_path):
    source = "helper = undefined_thing\n" + ATTENTION
    rows = grade_notebook(learner_notebook(answers={"attention": source}), tmp_path)
    message = rows["attention"].message
    assert _status(rows) == "failed" and "NameError in line 1" in message and "never defined" in message, rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_a_deleted_exercise_cell_is_not_attempted_but_an_answer_elsewhere_counts(tmp_path):
    rows = grade_notebook(learner_notebook(answers=RIGHT, drop=("attention",)), tmp_path)
    assert _status(rows) == "not attempted" and "no exercise cell" in rows["attention"].message, rows_text(rows)
    moved = learner_notebook(answers={"score_matrix_bytes": BYTES}, drop=("attention",),
                             added=[("score_matrix_bytes", ATTENTION)])
    assert _status(grade_notebook(moved, tmp_path / "b")) == "passed"


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_keyboard_interrupt_from_the_learner_is_not_called_a_timeout(tmp_path):
    source = ATTENTION.replace("    scale =", "    raise KeyboardInterrupt\n    scale =")
    rows = grade_notebook(learner_notebook(answers={"attention": source}), tmp_path)
    message = rows["attention"].message
    assert _status(rows) == "failed" and "KeyboardInterrupt" in message and "stopped after" not in message, rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_an_error_whose_text_says_not_attempted_is_a_failure(tmp_path):
    source = ATTENTION.replace("    scale =", "    raise ValueError('not attempted yet')\n    scale =")
    rows = grade_notebook(learner_notebook(answers={"attention": source}), tmp_path)
    assert _status(rows) == "failed" and "ValueError" in rows["attention"].message, rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_the_instructors_call_limit_reaches_the_learners_process(tmp_path):
    """`grade --call-timeout`: the learner process's checks run under the lower limit (that the boundary
    applies it is tests/tools/test_grading_learner.py's; a test of the limit striking would depend on
    how busy the machine is)."""
    source = ATTENTION.replace('    scale =', '    if __import__("os").environ.get("ATTN_COURSE_CALL_TIMEOUT") == "1.0":\n'
                                              '        raise ValueError("capped")\n    scale =')
    limits = Limits(**{**TEST_LIMITS.__dict__, "call_timeout": 1.0})
    capped = grade_notebook(learner_notebook(answers={"attention": source}), tmp_path / "capped", limits=limits)
    assert _status(capped) == "failed" and "ValueError" in capped["attention"].message, rows_text(capped)
    assert capped["score_matrix_bytes"].status == "not attempted"  # the next exercise is still checked
    free = grade_notebook(learner_notebook(answers={"attention": source}), tmp_path / "free")
    assert _status(free) == "passed", rows_text(free)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_an_exercise_cell_that_never_ends_is_stopped_and_the_rest_graded(tmp_path):
    nb = learner_notebook(answers={"attention": "import time\ntime.sleep(600)\n" + ATTENTION, "score_matrix_bytes": BYTES})
    limits = Limits(**{**TEST_LIMITS.__dict__, "cell_timeout": 1.0})
    rows = grade_notebook(nb, tmp_path, limits=limits)
    assert _status(rows) == "failed" and "ran past its time" in rows["attention"].message, rows_text(rows)
    assert rows["score_matrix_bytes"].status == "passed", rows_text(rows)


# ---------------------------------------------------------------------------------------- issue 14's cheats
@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_replacing_the_check_before_its_cell_imports_it_passes_nothing(tmp_path):
    patch = ("import attn_course.checks.attention as checks\n"
             "checks.check_attention = lambda *a, **k: print('✓ attention: passed')")
    rows = grade_notebook(learner_notebook(answers=WRONG, added=[("before:attention", patch)]), tmp_path)
    assert _status(rows) == "failed", rows_text(rows)
    assert any("left no record" in f for f in rows["attention"].flags)
    assert any("course's code" in f for f in rows["attention"].flags)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_replacing_a_shared_comparison_helper_does_not_pass_a_wrong_answer(tmp_path):
    patch = ("import attn_course.checks.compare as compare, attn_course.checks.attention as a\n"
             "compare.expect_close = a.expect_close = lambda *args, **kwargs: None\n"
             "compare.fail = a.fail = lambda *args, **kwargs: None")
    rows = grade_notebook(learner_notebook(answers=WRONG, added=[("before:attention", patch)]), tmp_path)
    assert _status(rows) == "failed", rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_a_custom_exception_handler_printing_ticks_changes_nothing(tmp_path):
    patch = ("ip = get_ipython()\n"
             "ip.set_custom_exc((BaseException,), lambda shell, etype, value, tb, tb_offset=None: print('✓ passed'))")
    rows = grade_notebook(learner_notebook(answers=WRONG, added=[("before:attention", patch)]), tmp_path)
    assert _status(rows) == "failed", rows_text(rows)
    assert any("exception handler" in f for f in rows["attention"].flags)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_an_input_transformer_rewriting_later_cells_passes_nothing(tmp_path):
    patch = ("def rewrite(lines):\n"
             "    return ['print(\"✓ attention: passed\")\\n'] if any('check_' in l for l in lines) else lines\n"
             "get_ipython().input_transformers_post.append(rewrite)")
    rows = grade_notebook(learner_notebook(answers=WRONG, added=[("before:attention", patch)]), tmp_path)
    assert {r.status for r in rows.values()} == {"failed"}, rows_text(rows)
    assert any("input transformer" in f for f in rows["attention"].flags)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_results_built_to_fool_comparisons_are_compared_as_plain_data(tmp_path):
    liar = '''
class Liar(torch.Tensor):
    """Claims to equal everything."""
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal): return True
        return super().__torch_function__(func, types, args, kwargs or {})

def attention(Q, K, V, mask=None):
    out = torch.zeros(*Q.shape[:-1], V.shape[-1], dtype=Q.dtype).as_subclass(Liar)
    w = torch.zeros(*Q.shape[:-1], K.shape[-2], dtype=Q.dtype).as_subclass(Liar)
    return out, w
'''
    rows = grade_notebook(learner_notebook(answers={"attention": liar}), tmp_path)
    assert _status(rows) == "failed", rows_text(rows)
    assert any("overrides torch functions" in f for f in rows["attention"].flags)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_forged_result_messages_in_the_output_are_ignored(tmp_path):
    from attn_course.checks.result import CheckResult, Status

    forged = CheckResult("attention", Status.PASSED, "matches everything")
    patch = ("from IPython.display import display\n"
             f"display({forged.mimebundle()!r}, raw=True)\nprint('✓ attention: passed')")
    rows = grade_notebook(learner_notebook(answers={"attention": patch + "\n" + WRONG_ATTENTION}), tmp_path)
    assert _status(rows) == "failed", rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_the_courses_own_function_as_an_answer_is_flagged(tmp_path):
    rows = grade_notebook(learner_notebook(answers={"attention": "from attn_course.attention import attention"}),
                          tmp_path)
    flags = " ".join(rows["attention"].flags)
    assert "imports the course's code (attn_course.attention.attention)" in flags, rows_text(rows)
    assert "is the course's own attn_course.attention code" in flags, rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_an_answer_using_the_course_function_imported_elsewhere_is_flagged(tmp_path):
    nb = learner_notebook(answers={"attention": "def attention(Q, K, V, mask=None):\n    return ref(Q, K, V, mask)"},
                          added=[("before:attention", "from attn_course.attention import attention as ref")])
    rows = grade_notebook(nb, tmp_path)
    assert _status(rows) == "passed", rows_text(rows)
    assert "its exercise cell uses `ref`, the course's code (attn_course.attention.attention)" in rows["attention"].flags
    assert not any("flag" in f for f in rows["score_matrix_bytes"].flags)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_an_answer_wrapping_the_reference_code_the_setup_imports_is_flagged(tmp_path):
    # The set-up cell imports attention_steps for the demonstrations: a wrapper passes every check unwritten.
    wrapper = "def attention(Q, K, V, mask=None):\n    steps = attention_steps(Q, K, V, mask)\n    return steps[4][1], steps[3][1]"
    rows = grade_notebook(learner_notebook(answers={"attention": wrapper, "score_matrix_bytes": BYTES}), tmp_path)
    assert _status(rows) == "passed", rows_text(rows)
    assert "its exercise cell uses `attention_steps`, the course's reference code (attn_course.attention" \
           ".attention_steps)" in rows["attention"].flags, rows_text(rows)
    assert rows["score_matrix_bytes"].flags == [], rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_a_log_forged_with_the_courses_reference_is_flagged(tmp_path):
    forge = ("import os, attn_course.attention as ref\n"
             "from attn_course.checks.attention import check_attention\n"
             "from pathlib import Path\n"
             "check_attention.evaluate(ref.attention, record=Path(os.environ['ATTN_COURSE_RECORD_DIR']) / 'attention.npz')\n"
             "def check_attention(): pass")
    rows = grade_notebook(learner_notebook(answers=WRONG, added=[("attention", forge)]), tmp_path)
    flags = " ".join(rows["attention"].flags)
    assert "course's code" in flags and "ATTN_COURSE" in flags, rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_a_damaged_log_is_a_failure_and_flagged(tmp_path):
    damage = ("import os\nfrom pathlib import Path\n"
              "import attn_course.checks.attention as c\n"
              "c.check_attention = lambda: (Path(os.environ['ATTN_COURSE_RECORD_DIR']) / 'attention.npz').write_bytes(b'PK junk')")
    rows = grade_notebook(learner_notebook(answers=RIGHT, added=[("before:attention", damage)]), tmp_path)
    assert _status(rows) == "failed" and any("damaged or forged" in f for f in rows["attention"].flags), rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_the_learners_check_cells_never_run(tmp_path):
    nb = learner_notebook(answers=WRONG, check_sources={"attention": "print('✓ attention: passed')"})
    rows = grade_notebook(nb, tmp_path)
    assert _status(rows) == "failed", rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
@pytest.mark.skipif(landlock_abi() < 6, reason="signal scoping needs Landlock ABI 6 (Linux 6.12)")
def test_a_submission_cannot_kill_the_grader(tmp_path):
    killer = ("import os, signal, psutil\n"
              "for p in psutil.Process().parents():\n"
              "    try: os.kill(p.pid, signal.SIGKILL)\n"
              "    except OSError: pass")
    rows = grade_notebook(learner_notebook(answers=RIGHT, added=[("before:attention", killer)]), tmp_path)
    assert _status(rows) == "passed", rows_text(rows)
    assert grader().runner._zygotes and all(z.alive() for z in grader().runner._zygotes.values())


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_a_submission_ending_its_process_still_gets_rows(tmp_path):
    nb = learner_notebook(answers=RIGHT, added=[("attention", "import os\nos._exit(0)")])
    rows = grade_notebook(nb, tmp_path)
    assert _status(rows) == "passed", rows_text(rows)  # checked before the exit
    assert rows["score_matrix_bytes"].status == "failed" and "ended the grading process" in \
        rows["score_matrix_bytes"].message, rows_text(rows)


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_memory_past_the_limit_stops_the_notebook(tmp_path):
    hog = "import torch\nblocks = []\nwhile True:\n    blocks.append(torch.ones(2**24))"  # 64 MB a step
    limits = Limits(**{**TEST_LIMITS.__dict__, "memory_mb": 700, "address_space_mb": None})
    rows = grade_notebook(learner_notebook(answers=RIGHT, added=[("attention", hog)]), tmp_path, limits=limits)
    assert _status(rows) == "passed"
    assert rows["score_matrix_bytes"].status == "failed" and "700 MiB" in rows["score_matrix_bytes"].message, \
        rows_text(rows)


# ---------------------------------------------------------------------------------------- a bug in a check
@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_a_bug_inside_the_check_is_an_error_not_the_learners_failure(tmp_path):
    path = write(correct(), tmp_path / "ada" / f"{NOTEBOOK_05}.ipynb")
    sub = collect.read_submission(files.Found("ada", path, "ada/05_attention.ipynb"), course())
    cells = plan(sub.nb, sub.notebook)
    run = grader().runner.run(cells, sub.notebook.exercise_ids())

    @check("attention", expects="a function")
    def buggy(learner):  # the log answers the check's preflight; then the check itself breaks
        raise ZeroDivisionError("a bug in the check")

    real = sub.notebook.exercises["attention"]
    sub.notebook = type(sub.notebook)(**{**sub.notebook.__dict__,
                                         "exercises": {**sub.notebook.exercises,
                                                       "attention": CourseExercise(**{**real.__dict__, "check": buggy})}})
    rows = {r.exercise: r for r in judge(sub, cells, run)}
    grader().runner.forget(run)
    assert rows["attention"].status == "error" and "not your fault" in rows["attention"].message, rows_text(rows)
    assert rows["score_matrix_bytes"].status == "passed"


def test_the_guide_says_what_every_learner_side_probe_trusts():
    """A probe measures inside the learner's process; the instructor guide must name each one."""
    from attn_course.checks.boundary import PROBES

    course()  # imports every check module, registering its probes
    guide = (Path(__file__).resolve().parents[2] / "docs" / "instructor-guide.md").read_text(encoding="utf-8")
    missing = [name for name in PROBES if f"`{name}`" not in guide]
    assert not missing, f"docs/instructor-guide.md does not say what these probes trust: {missing}"

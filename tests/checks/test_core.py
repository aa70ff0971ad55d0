"""The check decorator (attn_course.checks.core): the contract notebooks, tests and the grader rely on."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch

from attn_course.checks import cells
from attn_course.checks.boundary import RECORD_ENV, WALL_FACTOR, Learner, LocalSession, RecordingSession, ReplaySession, Session
from attn_course.checks.core import (IMPORTS_CELL, NBGRADER_ENV, STRICT_ENV, as_tensor, check, expect_close,
                                     raises)
from attn_course.checks.result import MIME, CheckFailed, NotAttempted, Status, result_from_output
from attn_course.tools import nbmeta

ROOT = Path(__file__).resolve().parents[2]


@check("double", expects="a function double(x) returning 2·x")
def check_double(fn: Learner) -> str:
    x = torch.arange(4.0)
    tried = "double(x) on x = [0, 1, 2, 3]"
    expect_close(as_tensor(fn(x), tried=tried), 2 * x, tried=tried)
    return "doubles"


@check("Net", kind="class", expects="a class Net")
def check_net(cls: Learner) -> str:
    return "a class" if cls.inspect()["kind"] == "class" else "?"


@check("buggy", expects="anything")
def check_buggy(fn: Learner) -> str:
    return 1 / 0  # a bug in the check itself


def test_passed_failed_not_attempted():
    assert check_double.evaluate(lambda x: 2 * x).status is Status.PASSED
    assert check_double.evaluate(lambda x: 3 * x).status is Status.FAILED

    def stub(x):
        raise NotImplementedError()

    result = check_double.evaluate(stub)
    assert result.status is Status.NOT_ATTEMPTED and "NotImplementedError" in result.diagnosis.got


def test_looks_the_exercise_up_by_name_and_says_which_cell_to_run():
    assert check_double.evaluate(namespace={"double": lambda x: 2 * x}).passed
    result = check_double.evaluate(namespace={})
    assert result.status is Status.NOT_ATTEMPTED and "run the exercise cell" in result.diagnosis.fix


def test_a_syntax_error_in_the_exercise_cell_is_named_with_its_line():
    history = ["import torch", "def double(x):\n    return (2 * x\n"]
    result = check_double.evaluate(namespace={"_ih": history})
    assert result.status is Status.FAILED and "syntax error" in result.summary and "line 2" in result.summary


def test_a_restart_is_recognised_from_a_missing_import():
    def after_restart(x):
        return torch_is_gone.mul(x)  # noqa: F821

    def uses_torch(x):
        raise NameError("name 'torch' is not defined")

    result = check_double.evaluate(uses_torch)
    assert "restarted" in result.diagnosis.cause and IMPORTS_CELL in result.diagnosis.fix
    assert "first code cell" not in result.diagnosis.fix  # the first code cell is Colab's set-up cell
    assert check_double.evaluate(after_restart).status is Status.FAILED


def test_wrong_kinds_of_exercise():
    assert "not a function" in check_double.evaluate(5).summary
    assert "not a class" in check_net.evaluate(lambda: 1).summary
    assert check_net.evaluate(type("Net", (), {})).passed


def test_a_bug_in_the_check_is_an_error_verdict_not_the_learners():
    result = check_buggy.evaluate(lambda: 1)
    assert result.status is Status.ERROR and "not your fault" in result.summary


def test_outside_ipython_a_pass_prints_one_line_and_a_failure_raises(capsys):
    check_double(lambda x: 2 * x)
    assert capsys.readouterr().out == "✓ double: doubles\n"
    try:
        check_double(lambda x: x)
    except CheckFailed as exc:
        assert exc.result.status is Status.FAILED
    else:
        raise AssertionError("no exception")
    def stub(x):
        raise NotImplementedError()

    try:
        check_double(stub)
    except NotAttempted:
        pass
    else:
        raise AssertionError("no exception")



# ------------------------------------------------------------------ a check never grades a stale definition
@pytest.fixture
def shell(monkeypatch):
    """A real IPython shell (no kernel) watching its cells, as a notebook's kernel does."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    for key in (STRICT_ENV, RECORD_ENV, NBGRADER_ENV):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("ATTN_COURSE_QUIET", "1")
    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "nocolor"
    config.InteractiveShell.xmode = "Plain"
    sh = InteractiveShell.instance(config=config)
    assert cells.install(sh)
    sh.user_ns["check_double"] = check_double
    yield sh
    InteractiveShell.clear_instance()


GOOD = "def double(x):\n    return 2 * x\n"
STUB = "def double(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
SYNTAX = "def double(x):\n    y = x\n    z = (2 * y\n    return z\n"


def verdict(sh):
    return check_double.evaluate(namespace=sh.user_ns, runs=cells.outcomes(sh))


def test_a_syntax_error_after_a_stub_is_named_not_graded_as_the_stub(shell):
    shell.run_cell(STUB)
    assert verdict(shell).status is Status.NOT_ATTEMPTED
    assert shell.run_cell(SYNTAX).error_before_exec is not None
    result = verdict(shell)
    assert result.status is Status.FAILED, result.text()
    assert result.summary == "syntax error in your exercise cell (line 3)"
    got = result.diagnosis.got.splitlines()
    assert got[0] == "SyntaxError: '(' was never closed" and got[1] == "line 3: z = (2 * y"
    assert got[2].index("^") == got[1].index("(")  # the caret sits under the bracket never closed
    assert "earlier run" in result.diagnosis.cause and "run the exercise cell again" in result.diagnosis.fix
    assert "   line 3: z = (2 * y" in result.text() and "^" in result.text()  # kept in the text as shown


def test_a_syntax_error_after_a_wrong_answer_never_repeats_the_old_diagnosis(shell):
    shell.run_cell("def double(x):\n    return 3 * x\n")
    assert verdict(shell).status is Status.FAILED and "syntax" not in verdict(shell).summary
    shell.run_cell(SYNTAX)
    assert "syntax error" in verdict(shell).summary
    shell.run_cell(GOOD)  # fixed and rerun: graded again
    assert verdict(shell).passed


def test_an_exception_before_the_definition_is_named_with_the_learners_line(shell):
    shell.run_cell(GOOD)
    shell.run_cell("import math\nscale = math.sqrt(-1)\n" + GOOD.replace("2 *", "2.0 *"))
    result = verdict(shell)
    assert result.status is Status.FAILED and result.summary == "your exercise cell raised ValueError (line 2)"
    assert "at line 2 of your exercise cell: scale = math.sqrt(-1)" in result.diagnosis.got
    assert "before it defined `double`" in result.diagnosis.cause and "earlier run" in result.diagnosis.cause


def test_an_exception_after_the_definition_is_still_a_failed_run(shell):
    shell.run_cell(GOOD + "double(None) + 1\n")
    result = verdict(shell)
    assert result.status is Status.FAILED and "raised TypeError (line 2)" in result.summary  # where it raised
    assert "at line 2 of your exercise cell, in double(): return 2 * x" in result.diagnosis.got
    assert "after it defined `double`" in result.diagnosis.cause


def test_a_first_run_that_raises_is_a_failure_not_not_attempted(shell):
    shell.run_cell("import no_such_module_here\n" + GOOD)
    result = verdict(shell)
    assert result.status is Status.FAILED and "ModuleNotFoundError" in result.summary, result.text()
    assert "before it defined `double`" in result.diagnosis.cause and "earlier" not in result.diagnosis.cause


def test_an_exercise_cell_run_after_a_restart_is_sent_to_the_imports_cell(shell):
    shell.run_cell("def double(x: torch.Tensor):\n    return 2 * x\n")  # the annotation needs torch
    result = verdict(shell)  # (this shell never imported torch: as after a restart)
    assert result.status is Status.FAILED and "NameError" in result.summary
    assert "restarted" in result.diagnosis.cause and IMPORTS_CELL in result.diagnosis.fix


def test_an_exercise_cell_calling_its_own_stub_is_still_not_attempted(shell):
    shell.run_cell(STUB + "double(1)\n")  # the stub raises when called: unfinished work, not a failure
    assert verdict(shell).status is Status.NOT_ATTEMPTED


def test_only_the_cell_defining_the_name_counts(shell):
    shell.run_cell(GOOD)
    shell.run_cell("1 / 0")  # some other cell fails: the exercise is still graded
    assert verdict(shell).passed


def test_in_a_notebook_the_check_shows_the_diagnosis_and_does_not_raise(shell, capsys):
    shell.run_cell(STUB)
    shell.run_cell(SYNTAX)
    capsys.readouterr()
    outcome = shell.run_cell("check_double()")
    assert outcome.error_in_exec is None  # Run All goes on, in any front-end
    shown = capsys.readouterr().out
    assert "✗ double: syntax error in your exercise cell (line 3)" in shown and "to do" in shown


@pytest.mark.parametrize("key", [STRICT_ENV, RECORD_ENV, NBGRADER_ENV])
def test_where_cells_are_judged_by_their_error_the_check_raises(shell, monkeypatch, tmp_path, key):
    monkeypatch.setenv(key, str(tmp_path) if key == RECORD_ENV else "autograde" if key == NBGRADER_ENV else "1")
    assert raises(shell)
    shell.run_cell(SYNTAX)
    outcome = shell.run_cell("check_double()")
    assert isinstance(outcome.error_in_exec, CheckFailed)
    assert outcome.error_in_exec.result.status is Status.FAILED


def test_the_not_raising_display_carries_the_result_data_and_a_red_box():
    result = check_double.evaluate(lambda x: 3 * x)
    bundle = result.mimebundle(diagnosis=True)
    assert result_from_output({"output_type": "display_data", "data": bundle}).status is Status.FAILED
    assert bundle[MIME]["status"] == "failed" and bundle["text/plain"] == result.text()
    assert "border-left:6px solid #c62828" in bundle["text/html"] and "to do" in bundle["text/html"]
    assert set(check_double.evaluate(lambda x: 2 * x).mimebundle(diagnosis=True)) == {MIME, "text/plain"}


# ------------------------------------------------------------------ after a restart: which cell holds the imports
@pytest.mark.parametrize("folder", ["notebooks", "solutions"])
def test_the_imports_cell_the_restart_hint_names_is_where_it_says(folder):
    assert "second code cell" in IMPORTS_CELL and "On Google Colab only" in IMPORTS_CELL
    for path in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb")):
        code = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        first, second = code[0], code[1]
        assert first.source.startswith("# On Google Colab only"), f"{path.name}: first code cell"
        assert nbmeta.role(second) == nbmeta.SETUP, f"{path.name}: the second code cell is not tagged setup"
        assert re.search(r"^(from attn_course\b|import attn_course\b)", second.source, re.M), \
            f"{path.name}: the second code cell does not import attn_course"
        imported = set(re.findall(r"^import (\w+)$|^import \w+(?:\.\w+)* as (\w+)$", second.source, re.M))
        assert "torch" in {name for pair in imported for name in pair}, f"{path.name}: no `import torch`"


# ------------------------------------------------------------------ time limits: what the learner waits
@check("slow", expects="anything", timeout=0.3)
def check_many_calls(fn: Learner) -> str:
    for i in range(100):
        fn(i)
    return "all calls returned"


def _computes(seconds):
    def fn(i):
        start = time.process_time()
        while time.process_time() - start < seconds:
            pass
        return i
    return fn


def _stated_wait(result) -> float:
    return float(re.search(r"after ([\d.]+) s", result.diagnosis.got).group(1))


@pytest.mark.slow
def test_one_limit_for_all_calls_of_a_check():
    started = time.monotonic()
    result = check_many_calls.evaluate(_computes(0.05))  # 100 calls × 0.05 s: far past 0.3 s in all
    waited = time.monotonic() - started
    assert result.status in (Status.FAILED, Status.ERROR), result.text()
    assert waited <= WALL_FACTOR * 0.3 + 0.5, f"waited {waited:.2f} s for a check whose limit is 0.3 s"


@pytest.mark.slow
def test_code_that_waits_is_stopped_after_twice_the_limit_and_said_to_wait():
    started = time.monotonic()
    result = check_many_calls.evaluate(lambda i: time.sleep(10))
    waited = time.monotonic() - started
    assert result.status is Status.FAILED and "waiting, not computing" in result.diagnosis.got, result.text()
    assert WALL_FACTOR * 0.3 - 0.05 <= waited <= WALL_FACTOR * 0.3 + 0.5
    assert result.summary == "stopped after 0.6 s without a result"
    assert abs(_stated_wait(result) - waited) < 0.15  # the message states the wall time waited


class _Stopped(Session):
    """A session whose learner code was stopped with these numbers (as a log would say)."""

    def __init__(self, **numbers):
        self.numbers = numbers

    def run(self, op, ref, method, args, kwargs, *, timeout, extra=None, clock=None):
        if op == "inspect":
            return {"ok": {"t": "dict", "items": [[{"t": "py", "v": "callable"}, {"t": "py", "v": True}]]}}, {}
        return {"timeout": 10.0, "by": "wall", **self.numbers}, {}


def test_a_stop_on_a_busy_machine_says_so_and_is_never_the_learners_failure():
    endless = check_double.evaluate(session=_Stopped(waited=20.0, computed=8.0))
    assert endless.status is Status.FAILED and endless.summary == "stopped after 20 s without a result"
    assert "(8 s of computing)" in endless.diagnosis.got and "20 s of waiting at most" in endless.diagnosis.got
    busy = check_double.evaluate(session=_Stopped(waited=20.0, computed=3.0))
    assert busy.status is Status.ERROR and busy.summary == "not checked: the computer was too busy"
    assert "only 3 s" in busy.diagnosis.got and "says nothing about your code" in busy.diagnosis.cause
    waits = check_double.evaluate(session=_Stopped(waited=20.0, computed=0.5))
    assert waits.status is Status.FAILED and "waiting" in waits.diagnosis.got


@pytest.mark.slow
def test_the_replay_states_the_same_wait(tmp_path):
    live = check_many_calls.evaluate(session=RecordingSession(lambda: (lambda i: time.sleep(10)), tmp_path / "log.npz"))
    replayed = check_many_calls.evaluate(session=ReplaySession(tmp_path / "log.npz"))
    assert replayed.text() == live.text() and "stopped after" in replayed.summary


HOG = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end:\n    pass\n"


@pytest.mark.slow  # starts CPU hogs (bounded: they end with the test, or after 30 s)
def test_on_a_loaded_machine_no_check_keeps_the_learner_waiting_past_twice_its_limit():
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(3 * (os.cpu_count() or 1))]
    try:
        time.sleep(0.2)
        started = time.monotonic()
        result = check_many_calls.evaluate(_computes(10.0))  # one endless call: 0.3 s of computing allowed
        waited = time.monotonic() - started
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
    print(f"\nloaded machine: stopped after {waited:.2f} s; {result.text()}")
    assert waited <= WALL_FACTOR * 0.3 + 0.5, f"the learner waited {waited:.2f} s (limit 0.3 s)"
    assert result.status in (Status.FAILED, Status.ERROR)  # named endless, or "too busy to tell"
    assert abs(_stated_wait(result) - waited) < 0.25, result.text()  # the message states the wall time waited


@pytest.mark.parametrize("name", ["softmax_vjp", "SoftmaxFunction", "attention_backward", "AttentionFunction",
                                  "tiled_attention_backward", "MultiHeadAttention"])
def test_checks_that_differentiate_grade_right_answers_with_gradients_switched_off(name):
    """A learner who switched gradients off for the whole notebook (torch.set_grad_enabled(False), say in the
    inference notebook) still gets a verdict on their answer, not "the check itself failed"."""
    from attn_course import backward, jacobian, multihead
    from attn_course.checks import backward as backward_checks, jacobian as jacobian_checks, multihead as mh_checks

    answers = {"softmax_vjp": (jacobian.softmax_vjp, jacobian_checks), "SoftmaxFunction": (jacobian.SoftmaxFunction,
               jacobian_checks), "attention_backward": (backward.attention_backward, backward_checks),
               "AttentionFunction": (backward.AttentionFunction, backward_checks),
               "tiled_attention_backward": (backward.tiled_attention_backward, backward_checks),
               "MultiHeadAttention": (multihead.MultiHeadAttention, mh_checks)}
    answer, checks = answers[name]
    with torch.no_grad():
        result = getattr(checks, f"check_{name}").evaluate(answer)
        assert not torch.is_grad_enabled()  # the learner's setting is theirs again afterwards
    assert result.status is Status.PASSED, result.diagnosis


# ============================================================================ PyTorch's global settings
def doubles_in_float64(x):
    torch.set_default_dtype(torch.float64)  # "for precision", left on for the rest of the notebook
    return 2 * x


def doubles_without_gradients(x):
    torch.set_grad_enabled(False)  # meant as `with torch.no_grad():`
    return 2 * x


def doubles_with_both(x):
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    return 2 * x


def doubles_and_puts_the_dtype_back(x):
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    out = 2 * x.to(torch.get_default_dtype())
    torch.set_default_dtype(before)
    return out.float()


def doubles_in_a_no_grad_block(x):
    with torch.no_grad():
        return 2 * x


@pytest.mark.parametrize("fn, phrases", [
    (doubles_in_float64, ["torch.get_default_dtype() is torch.float64 (it was torch.float32)",
                          "the default dtype (torch.set_default_dtype)", "dtype=torch.float64"]),
    (doubles_without_gradients, ["torch.is_grad_enabled() is False (it was True)", "the gradient mode",
                                 "with torch.no_grad():"]),
    (doubles_with_both, ["torch.float64", "is_grad_enabled() is False", "the default dtype (torch.set_default_dtype) "
                         "and the gradient mode"]),
])
def test_code_that_leaves_torch_settings_changed_is_named_and_the_settings_are_put_back(rejects, fn, phrases):
    """Right values, but every later cell of the learner's notebook would run in float64 or without gradients: the
    check names the setting, and the settings are as they were when it ends (in the live run and the replay)."""
    rejects(check_double, fn, "changed PyTorch's global settings", *phrases)
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()


def test_code_that_changes_a_setting_and_restores_it_passes(accepts):
    accepts(check_double, doubles_and_puts_the_dtype_back)
    accepts(check_double, doubles_in_a_no_grad_block)


def test_an_exception_after_changing_a_setting_is_the_verdict_and_the_setting_is_put_back(rejects):
    def raises_in_float64(x):
        torch.set_default_dtype(torch.float64)
        raise ValueError("not yet")

    rejects(check_double, raises_in_float64, "your code raised ValueError")
    assert torch.get_default_dtype() == torch.float32

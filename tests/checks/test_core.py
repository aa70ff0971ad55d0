"""The check decorator (attn_course.checks.core): the contract notebooks, tests and the grader rely on."""

from __future__ import annotations

import torch

from attn_course.checks.core import Learner, as_tensor, check, expect_close
from attn_course.checks.result import CheckFailed, NotAttempted, Status


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
    assert "restarted" in result.diagnosis.cause and "first code cell" in result.diagnosis.fix
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

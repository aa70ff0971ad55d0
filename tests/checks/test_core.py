"""The shared check machinery keeps its promises: clear messages, never a raw traceback."""

import numpy as np
import pytest
import torch

from attn_course.checks._core import (
    CheckFailed,
    NotAttempted,
    as_tensor,
    call,
    check,
    describe,
    diagnose,
    expect_close,
    expect_finite,
    expect_shape,
)


def unfinished(x):
    raise NotImplementedError()


def test_unfinished_function_is_not_attempted():
    with pytest.raises(NotAttempted, match="not attempted"):
        call(unfinished, torch.zeros(2))


def test_learner_exception_is_reported_with_its_inputs():
    def broken(x):
        return x @ torch.zeros(5, 5)

    with pytest.raises(CheckFailed) as info:
        call(broken, torch.zeros(2, 3))
    message = str(info.value)
    assert "broken(tensor (2, 3) float32)" in message and "RuntimeError" in message


def test_call_protects_the_checks_data_from_in_place_edits():
    x = torch.ones(3)

    def vandal(t):
        t.zero_()
        return t

    call(vandal, x)
    assert torch.equal(x, torch.ones(3))


@pytest.mark.parametrize(
    "value, phrase",
    [([1.0, 2.0], "Python list"), ((1.0,), "Python tuple"), (None, "forget to `return`"), ("abc", "str"),
     (np.array([object()], dtype=object), "Python objects")],
)
def test_as_tensor_explains_what_was_expected(value, phrase):
    with pytest.raises(CheckFailed, match="expected|forget|objects") as info:
        as_tensor(value, "softmax(x)")
    assert phrase in str(info.value)


def test_as_tensor_accepts_numpy_and_scalars():
    assert torch.equal(as_tensor(np.arange(3.0)), torch.arange(3.0, dtype=torch.float64))
    assert as_tensor(np.float32(2.5)).item() == 2.5
    assert as_tensor(3).item() == 3.0


def test_shape_and_finiteness_messages():
    with pytest.raises(CheckFailed, match=r"shape \(3, 2\), expected \(2, 3\)\. transpose"):
        expect_shape(torch.zeros(3, 2), (2, 3), hint="transpose?")
    with pytest.raises(CheckFailed, match=r"NaN .*first at index \(1,\)"):
        expect_finite(torch.tensor([0.0, float("nan"), 1.0]))
    expect_shape(torch.zeros(2, 3), (2, 3))
    expect_finite(torch.zeros(4))


def test_expect_close_names_the_pitfall_the_answer_reproduces():
    expected = torch.tensor([1.0, 2.0])
    wrong = torch.tensor([2.0, 4.0])
    with pytest.raises(CheckFailed, match="doubled by mistake") as info:
        expect_close(wrong, expected, pitfalls=[("something else", torch.zeros(2)), ("doubled by mistake", wrong)])
    assert "largest difference 2" in str(info.value)
    with pytest.raises(CheckFailed, match="does not match") as info:
        expect_close(torch.tensor([5.0, 5.0]), expected, pitfalls=[("doubled by mistake", wrong)])
    assert "doubled" not in str(info.value)
    expect_close(expected + 1e-7, expected)


def test_diagnose_skips_pitfalls_that_cannot_be_computed():
    def impossible():
        raise RuntimeError("shape mismatch")

    assert diagnose(torch.ones(2), [("cannot", impossible), ("ones", lambda: torch.ones(2))]) == "ones"


@check("demo exercise", expects="a function f(x) returning x doubled")
def check_demo(fn):
    out = as_tensor(call(fn, torch.arange(3.0)), "f(x)")
    expect_close(out, 2 * torch.arange(3.0), "f(x)", pitfalls=[("x was tripled", 3 * torch.arange(3.0))])
    return "doubles correctly"


def test_check_success_prints_one_line(capsys):
    check_demo(lambda x: x * 2)
    assert capsys.readouterr().out == "✓ demo exercise: doubles correctly\n"


def test_check_failure_is_prefixed_with_the_exercise_and_names_the_mistake():
    with pytest.raises(CheckFailed, match=r"^demo exercise: f\(x\) does not match the expected values — x was tripled"):
        check_demo(lambda x: x * 3)
    with pytest.raises(NotAttempted, match="^demo exercise: not attempted"):
        check_demo(unfinished)


def test_check_rejects_non_callables_and_missing_arguments_clearly():
    with pytest.raises(CheckFailed, match="expected a function f\\(x\\).*got tensor"):
        check_demo(torch.zeros(3))
    with pytest.raises(CheckFailed, match="as the first argument"):
        check_demo()


def test_check_turns_its_own_surprises_into_a_message():
    @check("fragile", expects="a function returning a tensor")
    def check_fragile(fn):
        return {}["missing"]  # a bug in a check must still read as a message

    with pytest.raises(CheckFailed, match="could not check the answer .*Expected a function returning a tensor"):
        check_fragile(lambda: 0)


def test_describe():
    assert describe(torch.zeros(2, 3, dtype=torch.float64)) == "tensor (2, 3) float64"
    assert describe(np.zeros(3, dtype=np.float32)) == "ndarray (3,) float32"
    assert describe([1, 2]) == "list of length 2"

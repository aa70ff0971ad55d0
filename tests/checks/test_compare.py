"""The comparison layer (attn_course.checks.compare): a mistake is blamed only when the answer reproduces
it; otherwise the difference itself is measured and named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attn_course.checks.boundary import Opaque
from attn_course.checks.compare import Failure, Mistake, as_tensor, describe_mismatch, expect_close, expect_shape

E = torch.tensor([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25], [0.3, 0.3, 0.4]], dtype=torch.float64)


def diagnosis(fn):
    with pytest.raises(Failure) as info:
        fn()
    return info.value.diagnosis


def test_a_mistake_is_blamed_only_when_reproduced():
    wrong = Mistake("columns", "you normalised columns", "use dim=-1", lambda: E.T)
    d = diagnosis(lambda: expect_close(E.T, E, tried="t", mistakes=[wrong]))
    assert d.summary == "columns" and d.cause == "you normalised columns"
    d = diagnosis(lambda: expect_close(E + 0.05 * torch.arange(9.0).reshape(3, 3), E, tried="t", mistakes=[wrong]))
    assert "normalised columns" not in d.cause
    same_output = Mistake("other", "you did the other thing", "undo it", lambda: E.T)
    d = diagnosis(lambda: expect_close(E.T, E, tried="t", mistakes=[wrong, same_output]))
    assert "two mistakes give the same numbers" in d.cause


@pytest.mark.parametrize("actual,phrase", [
    (E * math.sqrt(8), "factor of √d_k"),
    (E / 8, "1/d_k"),
    (-E, "−1"),
    (E + 0.5, "shifted by a constant"),
    (E.T, "transposed"),
    (E.to(torch.float16), "float16"),
    (torch.where(torch.arange(9).reshape(3, 3) == 4, float("nan"), E), "NaN"),
    ((E * 10).to(torch.int64), "integer"),
])
def test_the_difference_is_measured_and_named(actual, phrase):
    got, expected, cause, summary = describe_mismatch(actual, E, factors={"√d_k": math.sqrt(8), "d_k": 8.0})
    assert phrase in got + cause + summary, (got, cause, summary)


def test_wrong_only_in_some_rows_says_which():
    wrong = E.clone()
    wrong[2] += 1
    got, _, _, summary = describe_mismatch(wrong, E)
    assert "from row 2 on" in summary


def test_batch_order_is_recognised():
    batch = torch.stack([E, 2 * E, 3 * E])
    got, _, cause, _ = describe_mismatch(batch[[1, 2, 0]], batch)
    assert "batch" in cause


@pytest.mark.parametrize("value,phrase", [
    (None, "None"), ([1, 2], "Python list"), (Opaque("Gen", "x"), "Gen"), ("text", "str"),
    (torch.empty(2, device="meta"), "meta"), (torch.ones(2, dtype=torch.complex64), "complex"),
])
def test_as_tensor_explains_what_came_back(value, phrase):
    d = diagnosis(lambda: as_tensor(value, tried="f(x)"))
    assert phrase in d.summary + d.got


def test_same_never_drops_an_imaginary_part():
    from attn_course.checks.compare import same

    real = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert not same(real.to(torch.complex128) + 5j, real, atol=1e-6, rtol=1e-6)  # float64 of it would equal
    assert not same(real.to(torch.complex128), real, atol=1e-6, rtol=1e-6)  # a complex answer is not a real one
    assert same(real + 1j, real.to(torch.complex64) + 1j, atol=1e-6, rtol=1e-6)
    assert not same(real + 1j, real + 2j, atol=1e-6, rtol=1e-6)


def test_as_tensor_accepts_numpy_and_numbers():
    assert as_tensor(np.ones(2), tried="t").dtype == torch.float64
    assert as_tensor(3, tried="t").item() == 3.0


@pytest.mark.parametrize("shape,phrase", [((3, 2), "different order"), ((2, 3, 1), "size 1 too many"),
                                          ((6,), "reshape"), ((2,), "missing")])
def test_shape_causes(shape, phrase):
    d = diagnosis(lambda: expect_shape(torch.zeros(shape), (2, 3), tried="t"))
    assert phrase in d.cause


def test_a_factor_near_one_is_shown_with_enough_digits_or_not_called_a_factor():
    got, _, _, summary = describe_mismatch(E * 1.005, E)
    assert "1.005" in summary
    got, _, _, summary = describe_mismatch(E * 1.0001, E, rtol=1e-6, atol=1e-9)
    assert "factor of 1 " not in summary + " " and "factor of 1" != summary[-11:]


@pytest.mark.parametrize("actual,phrase", [
    (E.flip(-1), "columns in reverse order"),
    (E[:, [1, 2, 0]], "columns in the wrong order"),
    (E[:1].expand(3, 3), "row 0 repeated for every row"),
    (E[-1:].expand(3, 3), "row 2 repeated for every row"),
    (E.mean(0, keepdim=True).expand(3, 3), "the mean over the rows in every row"),
    (E[[1, 0, 2]], "rows in the wrong order"),
    (2 * E + 0.25, "every value is 2 × the expected value + 0.25"),
    (1 - E, "1 − the expected value"),
])
def test_values_moved_repeated_or_mapped_are_recognised(actual, phrase):
    got, _, cause, summary = describe_mismatch(actual, E)
    assert phrase in summary, (got, cause, summary)


def test_axis_names_and_ambiguous_factor_names():
    got, _, cause, summary = describe_mismatch(E.flip(0), E, axes=("queries", "keys"))
    assert summary == "queries in reverse order"
    _, _, cause, summary = describe_mismatch(2 * E, E, factors={"√d_head": 2.0})
    assert summary == "off by a factor of 2" and not cause  # √4 = 2: no name is more likely than the other


def test_a_probe_says_which_entry_and_what_to_do():
    """The probes name the index along the named axis and give advice that follows from what they measured."""
    batch = torch.stack([E, 2 * E, -E])  # (3 batch entries, 3, 3)
    got, _, cause, summary = m = describe_mismatch(batch[:1].expand(3, 3, 3), batch)
    assert summary == "batch entry 0 repeated for every batch entry"
    assert "every batch entry holds batch entry 0's values" in got and "[0]" in cause and "drop the index [0]" in m.fix
    got, _, _, summary = describe_mismatch(batch[:, [1, 0, 2]], batch, axes=("batch entries", "heads", "keys"))
    assert summary == "heads in the wrong order" and "head 0 and head 1 swapped" in got
    got, _, _, summary = describe_mismatch(batch.roll(1, 2), batch, axes=(None, None, "keys"))
    assert "your key 0 holds key 2's values" in got and "rotation" in got
    got, _, _, summary = describe_mismatch(batch.flip(1), batch, axes=(None, "queries", None))
    assert "your query 0 holds query 2's values" in got


def test_equal_infinities_are_no_difference():
    e = torch.tensor([[-math.inf, 2.0, 3.0], [0.5, 0.5, 0.25]], dtype=torch.float64)  # -inf: a masked log-weight
    got = describe_mismatch(torch.tensor([[-math.inf, 1.0, 3.0], [0.5, 0.5, 0.5]], dtype=torch.float64), e)[0]
    assert "largest difference 1 at index (0, 1): got 1, expected 2" in got, got


def test_expect_close_passes_axis_names_and_prefers_the_measured_fix():
    batch = torch.stack([E, 2 * E, -E])
    d = diagnosis(lambda: expect_close(batch[:, :1].expand(3, 3, 3), batch, tried="t", fix="general advice",
                                       axes=("batch entries", "heads", "keys")))
    assert d.summary == "head 0 repeated for every head" and "drop the index [0]" in d.fix
    d = diagnosis(lambda: expect_close(batch + torch.randn(3, 3, 3), batch, tried="t", fix="general advice"))
    assert d.fix == "general advice"  # nothing measured: the caller's advice stands


# ---------------------------------------------------------------------------- issue 22: causes named, not misnamed
def test_an_index_that_drops_an_axis_is_named_as_an_index_not_a_reduction():
    expected = torch.randn(3, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    d = diagnosis(lambda: expect_close(expected[0], expected, tried="t"))
    assert "batch entry 0" in d.summary and "[0]" in d.cause and "sum" not in d.cause, d
    d = diagnosis(lambda: expect_close(expected[:, -1], expected, tried="t"))
    assert "[-1]" in d.cause and "axis 1" in d.cause, d
    d = diagnosis(lambda: expect_close(expected.sum(0), expected, tried="t"))
    assert "sum over" in d.cause and "[0]" not in d.cause, d
    d = diagnosis(lambda: expect_close(torch.randn(4, 5, dtype=torch.float64), expected, tried="t"))
    assert "index that picks one entry" in d.cause  # shapes alone: both readings are offered


def test_inf_is_counted_in_words_and_named_an_overflow():
    inf = E.clone()
    inf[0, 0] = math.inf
    got, _, cause, _ = describe_mismatch(inf, E)
    assert "inf in 1 entry " in got and "overflow" in cause


def test_expected_never_says_only_the_expected_values():
    for wrong in (2 * E, E + 0.5, 1 - E):
        d = diagnosis(lambda: expect_close(wrong, E, tried="t"))
        assert d.expected.strip() not in ("the expected values", "the expected value"), d
        d = diagnosis(lambda: expect_close(wrong, E, tried="t", oracle="torch.softmax"))
        assert d.expected == "the values torch.softmax gives"


@pytest.mark.parametrize("kind, message, phrase", [
    ("NameError", "name 'scores' is not defined", "`scores` is used before"),
    ("RuntimeError", "The size of tensor a (4) must match the size of tensor b (2) at non-singleton dimension 1",
     "sizes 4 and 2"),
    ("RuntimeError", "mat1 and mat2 shapes cannot be multiplied (2x1 and 4x3)", "inner sizes differ (2x1 @ 4x3)"),
    ("IndexError", "Dimension out of range (expected to be in range of [-1, 0], but got -2)", "axis -2"),
    ("RuntimeError", "stack expects a non-empty TensorList", "nothing was appended"),
    ("TypeError", "unsupported operand type(s) for @: 'Tensor' and 'int'", "between Tensor and int values"),
    ("TypeError", "unsupported operand type(s) for -: 'torch.Size' and 'tuple'", "between two shapes"),
    ("TypeError", "can only concatenate tuple (not Tensor) to torch.Size", "+ a Tensor"),
    ("TypeError", "'torch.Size' object does not support item assignment", "entry of a torch.Size"),
    ("TypeError", "slice indices must be integers or None or have an __index__ method", "slice bound"),
    ("TypeError", "only integer tensors of a single element can be converted to an index", "one integer"),
    ("TypeError", "zeros_like(): argument 'input' (position 1) must be Tensor, not torch.Size",
     "zeros_like() got a torch.Size as its argument `input`"),
    ("RuntimeError", "The expanded size of the tensor (9) must match the existing size (2) at non-singleton "
     "dimension 0.  Target sizes: [9].  Tensor sizes: [2]", "size 2 on one axis"),
    ("RuntimeError", "expand(torch.DoubleTensor{[9, 2]}, size=[2]): the number of sizes provided (1) must be greater "
     "or equal to the number of dimensions in the tensor (2)", "2 axes is broadcast"),
    ("RuntimeError", "both arguments to matmul need to be at least 1D, but they are 2D and 0D", "0-D operand"),
    ("IndexError", "amax(): Expected reduction dim -1 to have non-zero size.", "axis -1, which has size 0"),
    ("AttributeError", "module 'math' has no attribute 'rsqrt'", "math.rsqrt does not exist"),
])
def test_common_exceptions_are_explained(kind, message, phrase):
    from attn_course.checks.exceptions import explain_exception

    cause, fix = explain_exception(kind, message)
    assert phrase in cause and fix
    assert explain_exception("RuntimeError", "something nobody has seen") is None


def test_a_lost_axis_is_named_with_the_callers_axis_names():
    """expect_shape (and expect_close, through it) call the lost axis by the name the check gives it."""
    bias = torch.arange(24.0).reshape(3, 2, 4)  # (heads, queries, keys)
    d = diagnosis(lambda: expect_shape(bias[0], bias.shape, tried="t", values=bias,
                                       axes=("heads", "queries", "keys")))
    assert d.summary == "only head 0 kept (axis 0 dropped)"
    d = diagnosis(lambda: expect_close(bias[2], bias, tried="t", axes=("heads", "queries", "keys")))
    assert d.summary == "only head 2 kept (axis 0 dropped)" and "head 2 alone" in d.cause
    d = diagnosis(lambda: expect_shape(bias[0], bias.shape, tried="t", values=bias))  # unnamed: a batch axis
    assert d.summary == "only batch entry 0 kept (axis 0 dropped)"


def test_got_and_expected_show_the_digits_that_tell_them_apart():  # 4 when they are enough
    a, e = torch.tensor([1.0, 1.6710001], dtype=torch.float64), torch.tensor([1.0, 1.671], dtype=torch.float64)
    got = describe_mismatch(a, e, atol=0.0, rtol=0.0)[0]
    assert "got 1.6710001, expected 1.671" in got, got
    assert "got 2.5, expected 1.671" in describe_mismatch(a + torch.tensor([0.0, 0.829]), e, atol=0.0, rtol=0.0)[0]

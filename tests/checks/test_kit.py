"""The check kit's engine, watcher and explainer, on small made-up checks (the topics' tests cover real ones)."""

import pytest
import torch

from attn_course.checks.boundary import LearnerRaised
from attn_course.checks.compare import Failure
from attn_course.checks.kit import Known, Suspects, Watch, batch_entries, explain_raise, fits, watch


def _oracle(x):
    return x.softmax(-1)


TABLE = [
    Known("no-exp", "exp forgotten", "the scores were normalised without exp", "apply exp before dividing",
          lambda x: x / x.sum(-1, keepdim=True)),
    Known("wrong-axis", "softmax over the wrong axis", "dim=0 instead of dim=-1", "normalise along dim=-1",
          lambda x: x.softmax(0)),
    Known("uniform", "uniform weights down each column", "1 / (number of rows) everywhere", "compute the softmax",
          lambda x: torch.full_like(x, 1 / x.shape[0])),
]


def _fail(suspects, actual, case, **kw):
    with pytest.raises(Failure) as info:
        suspects.expect(actual, _oracle(*case), case, tried="f(x)", **kw)
    return info.value.diagnosis


def test_a_right_answer_passes_and_the_mistake_behind_a_wrong_one_is_named():
    symmetric = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64)  # both axes give the same softmax
    s = Suspects(TABLE)
    s.expect(_oracle(symmetric), _oracle(symmetric), (symmetric,), tried="f(x)")  # rules out only the others
    x = torch.randn(3, 4, dtype=torch.float64) + 1.0
    assert _fail(s, x.softmax(0), (x,)).summary == "softmax over the wrong axis"


def test_a_mistake_that_an_earlier_right_case_contradicts_is_not_blamed():
    s = Suspects(TABLE)
    right = torch.tensor([[0.5, 2.0, 1.0]], dtype=torch.float64)
    s.expect(_oracle(right), _oracle(right), (right,), tried="f(x)")  # rules out "exp forgotten" (and the axis)
    x = torch.rand(2, 3, dtype=torch.float64) + 0.5
    d = _fail(s, x / x.sum(-1, keepdim=True), (x,))
    assert "exp forgotten" not in d.summary


def test_several_suspects_are_told_apart_by_running_the_learner_on_another_case():
    sym = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], dtype=torch.float64)  # equal rows: softmax(0) is uniform
    s = Suspects(TABLE)
    ambiguous = _fail(s, sym.softmax(0), (sym,))
    assert " or " in ambiguous.summary and "give the same numbers" in ambiguous.cause
    s = Suspects(TABLE)
    other = torch.tensor([[0.0, 3.0, 1.0], [1.0, -1.0, 2.0]], dtype=torch.float64)
    told = _fail(s, sym.softmax(0), (sym,), again=lambda x: x.softmax(0), distinguish=[(other,)])
    assert told.summary == "softmax over the wrong axis"


def test_no_suspect_means_the_difference_is_measured():
    x = torch.randn(2, 3, dtype=torch.float64)
    d = _fail(Suspects(TABLE), 2 * _oracle(x), (x,))
    assert "2" in d.summary or "2" in d.got


def test_the_watcher_counts_products_exps_and_the_largest_tensor():
    a, b = torch.randn(4, 8), torch.randn(8, 5)
    with Watch() as w:
        s = a @ b
        torch.exp(s)
        torch.einsum("ij,jk->ik", a, b)
    assert w.flops == 2 * 2 * 4 * 5 * 8
    assert w.products == {(4, 5): 2} and w.exp_elements == 20 and w.largest == 20
    report = watch(lambda: (a @ b).sum(-1))
    assert report["ops"] and report["reductions"] == [5] and report["flops"] == 2 * 4 * 5 * 8


def _raised(attempt):
    try:
        attempt()
    except Exception as exc:  # noqa: BLE001
        return LearnerRaised({"type": type(exc).__name__, "message": str(exc)}, "f(x)")
    raise AssertionError("did not raise")


def test_an_exception_is_explained_by_a_construct_then_a_pattern_then_the_course_table():
    x = torch.randn(2, 3)
    exc = _raised(lambda: x @ x)
    assert explain_raise(exc, [("x @ x", "use x @ x.T", lambda: x @ x)])["cause"] == "x @ x"
    assert explain_raise(exc, [("other", "other", lambda: x @ torch.randn(4, 4))]) != {"cause": "other", "fix": "other"}
    assert explain_raise(exc, (), [("RuntimeError", r"cannot be multiplied \((\d+)x", "rows {1}", "fix")])["cause"] == "rows 2"
    assert explain_raise(exc)  # the course-wide table explains a shape mismatch
    assert explain_raise(_raised(lambda: (_ for _ in ()).throw(KeyError("zz")))) == {}


def test_a_mistake_that_changes_nothing_on_this_case_is_never_blamed():
    x = torch.tensor([[0.0, 0.1], [0.1, 0.0]], dtype=torch.float64)  # weights near 0.5: tolerance ≈ 6e-5
    harmless = Known("tiny", "a tiny offset", "an offset within rounding", "none", lambda x: _oracle(x) + 5e-5)
    near = _oracle(x) + 1e-4  # wrong (1e-4 off), yet within tolerance of the harmless mistake's output
    d = _fail(Suspects([harmless]), near, (x,))
    assert "tiny offset" not in d.summary


# ============================================================================ calling the learner's function
def Learner(fn):
    from attn_course.checks.boundary import Learner as Live, LocalSession

    return Live(LocalSession(lambda: fn), "fn")


def test_the_call_probe_names_the_arguments_changed_in_place():
    from attn_course.checks import kit
    from attn_course.checks.boundary import PROBES

    assert PROBES[kit.CALL] is kit.call
    x, y = torch.tensor([1.0, float("nan")]), torch.ones(2)
    out, changed = kit.call(lambda a, b: a + b, x, y)  # NaN kept as it was is unchanged
    assert torch.equal(out[:1], torch.tensor([2.0])) and changed == []
    _, changed = kit.call(lambda a, b: b.mul_(2), x.clone(), y.clone())
    assert changed == [1]
    out, changed = kit.call(lambda a: a.__isub__(1), torch.ones(3), numpy=True, result=False)  # a NumPy array
    assert out is None and changed == [0]

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, z):
            return z.exp_()

    assert kit.call(Fn, torch.zeros(2), apply=True)[1] == [0]


def test_expect_unchanged_says_which_input_was_overwritten():
    from attn_course.checks import kit
    def overwrite(p):
        p -= 1
        return p

    with pytest.raises(Failure) as info:
        kit.expect_unchanged(Learner(overwrite), (torch.ones(3),), call="f(p)", name="p", shown="p of shape (3,)")
    d = info.value.diagnosis
    assert d.summary == "p changed in place" and "x -= …" in d.cause and "clone" in d.fix
    kit.expect_unchanged(Learner(lambda p: p - 1), (torch.ones(3),), call="f(p)", name="p", shown="p")


def test_tensor_or_array_keeps_to_the_kind_that_worked():
    import numpy as np

    from attn_course.checks import kit

    def numpy_only(x):
        return np.exp(x) / np.exp(x).sum(-1, keepdims=True) if isinstance(x, np.ndarray) else x.no_such_method()

    run = kit.TensorOrArray(Learner(numpy_only))
    assert isinstance(run.tensor(torch.zeros(2, dtype=torch.float64)), torch.Tensor)
    assert run.mode == "numpy" and run.kind == "NumPy arrays"
    run = kit.TensorOrArray(Learner(lambda x: x.softmax(-1)))
    run(torch.zeros(2))
    assert run.mode == "torch" and run.kind == "tensors"


def test_lower_precision_names_the_narrower_dtype():
    from attn_course.checks import kit

    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with pytest.raises(Failure) as info:  # float64 values that all lie on float32's grid
        kit.lower_precision(x.float().double(), torch.float64, tried="t", what="the output")
    assert info.value.diagnosis.summary == "computed in float32, not float64"
    assert "exactly representable in float32" in info.value.diagnosis.got
    kit.lower_precision(x.float().double(), torch.float64, tried="t", what="the output", grid=False)  # not asked
    kit.lower_precision(x, torch.float64, tried="t", what="the output")  # float64 precision: nothing to say
    with pytest.raises(Failure) as info:
        kit.lower_precision(x.half(), torch.float64, tried="t", what="the output", grid=False)
    assert info.value.diagnosis.summary == "computed in float16, not float64"


def test_suspects_the_learner_disagrees_with_on_another_case_are_not_named():
    rounded = Known("rounded", "√d_k rounded", "you rounded √d_k", "divide by math.sqrt(d_k)",
                    lambda x: x / round(x.shape[-1] ** 0.5))
    floor = Known("floor", "√d_k rounded down", "you took the integer part of √d_k", "divide by math.sqrt(d_k)",
                  lambda x: x / int(x.shape[-1] ** 0.5))
    x10, x7 = torch.ones(1, 10, dtype=torch.float64), torch.ones(1, 7, dtype=torch.float64)
    minus_one = lambda x: x / (x.shape[-1] - 1) ** 0.5  # noqa: E731 - both rows give /3 at d_k = 10
    oracle = lambda x: x / x.shape[-1] ** 0.5  # noqa: E731
    with pytest.raises(Failure) as info:  # at d_k = 7 the rows give /3 and /2, the answer /√6: neither
        Suspects([rounded, floor]).expect(minus_one(x10), oracle(x10), (x10,), tried="f(x)", again=minus_one,
                                          distinguish=[(x7,)])
    assert "rounded" not in info.value.diagnosis.summary
    with pytest.raises(Failure) as info:  # no other case: the coincidence is all there is, and it is said
        Suspects([rounded, floor]).expect(minus_one(x10), oracle(x10), (x10,), tried="f(x)")
    assert "give the same numbers" in info.value.diagnosis.cause


def test_a_mistake_fits_a_wrong_case_only_by_raising_where_the_answer_raised_or_giving_its_numbers():
    x = torch.tensor([[1.0, 2.0], [0.5, 0.0]], dtype=torch.float64)
    axis = TABLE[1]  # softmax over axis 0
    assert fits(axis, (x,), raised=False, value=x.softmax(0), atol=1e-6)
    assert not fits(axis, (x,), raised=False, value=x.softmax(1), atol=1e-6)
    assert not fits(axis, (x,), raised=True, value=None, atol=1e-6)  # the answer raised, the mistake does not
    broken = Known("raises", "raises", "raises", "none", lambda x: x @ torch.ones(5))
    assert fits(broken, (x,), raised=True, value=None, atol=1e-6) and not fits(broken, (x,), raised=False,
                                                                               value=x, atol=1e-6)


def test_batch_entries_names_the_entries_that_are_wrong():
    expected = torch.arange(12, dtype=torch.float64).reshape(3, 2, 2)
    repeated = expected.clone()
    repeated[1:] = expected[0]
    with pytest.raises(Failure) as info:
        batch_entries(repeated, expected, tried="f(x)", what="your weights", atol=1e-6, rtol=1e-6, along="-1")
    assert info.value.diagnosis.summary == "batch entry 0 repeated" and "along -1" in info.value.diagnosis.fix
    some = expected.clone()
    some[2] += 1
    with pytest.raises(Failure) as info:
        batch_entries(some, expected, tried="f(x)", what="your weights", atol=1e-6, rtol=1e-6, along="-1")
    assert info.value.diagnosis.summary == "wrong for some batch entries"
    batch_entries(expected + 1, expected, tried="f(x)", what="w", atol=1e-6, rtol=1e-6, along="-1")  # all wrong: silent

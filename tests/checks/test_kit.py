"""The check kit's engine, watcher and explainer, on small made-up checks (the topics' tests cover real ones)."""

import math

import pytest
import torch
import torch.nn.functional as F

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


def test_the_watcher_counts_products_written_out_and_their_aliases():
    a, b = torch.randn(4, 8), torch.randn(5, 8)
    matmul = 2 * 4 * 5 * 8
    assert watch(lambda: (a[:, None, :] * b[None, :, :]).sum(-1))["flops"] == matmul  # a product by broadcasting
    assert watch(lambda: torch.linalg.matmul(a, b.T))["flops"] == matmul
    assert watch(lambda: torch.tensordot(a, b.T, dims=1))["flops"] == matmul
    assert watch(lambda: torch.linalg.vecdot(a, a))["flops"] == 2 * 4 * 8
    # a state that broadcasts to its shape at its first update is no product: nothing is summed over
    acc, correction = torch.zeros(8), torch.rand(4, 1)
    assert watch(lambda: acc * correction + a)["flops"] == 0


def test_the_watcher_measures_the_memory_held_at_once():
    a = torch.randn(8, 8)  # an (8, 8) float32 tensor: 256 bytes

    def hoard(a):
        kept = [a * i for i in range(4)]  # four storages alive together
        [t[1:] for t in kept] + [t.T for t in kept]  # views: no new memory
        return a.contiguous()  # the input, returned as it is: not memory the function made

    report = watch(hoard, a)
    assert report["live_peak"] == 4 * 256 and report["live_count"] == 4, report
    assert report["live_shapes"] == [[[8, 8], 4, 4 * 256]] and report["largest"] == 64

    def one_at_a_time(a):
        for i in range(10):
            t = a * i  # the new t is made before the old one is freed: two at a time
        return t

    assert watch(one_at_a_time, a)["live_peak"] == 2 * 256
    assert watch(lambda a: a[2:].sum(), a)["live_peak"] == 4  # a view of the input is not new: only the sum


def test_the_watcher_follows_which_numbers_of_a_source_the_reductions_read():
    x = torch.randn(2, 8)

    def reads(fn):
        with Watch(source=x) as w:
            fn(x)
        return w.report()["reads"]

    def one_pass(x):
        for s in (0, 4):
            block = x[:, s:s + 4]
            m = block.amax(-1, keepdim=True)
            torch.exp(block - m).sum(-1)  # reads the block, through − and exp
            block.amax(-1)  # the same block again, before moving on: still one pass

    def two_passes(x):
        maxima = [x[:, s:s + 4].amax(-1, keepdim=True) for s in (0, 4)]
        for s, m in zip((0, 4), maxima):
            torch.exp(x[:, s:s + 4] - m).sum(-1)

    def rows_one_after_the_other(x):
        for row in x:
            for s in (0, 4):
                row[s:s + 4].amax(), torch.exp(row[s:s + 4]).sum()

    def padded_first(x):  # the maxima of every block through pad and unfold, then the sums
        F.pad(x, (0, 4), value=-math.inf).unfold(-1, 4, 4).amax(-1)
        torch.cat([x[:, :4], x[:, 4:]], -1)[:, :4].sum(-1), x[:, 4:].sum(-1)

    assert reads(one_pass) == {"most": {"m": 2, "s": 1, "l": 0}, "back": None, "sizes": [4]}
    assert reads(two_passes)["back"] == ["s", 8, 2, "m"]  # the sum of block 0 (2 rows × 4), after block 1's maximum
    assert reads(rows_one_after_the_other)["back"] is None
    assert reads(padded_first)["back"] == ["s", 8, 2, "s"]  # the second block's sum, after the first block's
    assert "reads" not in watch(one_pass, x)  # no source: nothing followed


def test_maxima_and_sums_written_with_other_functions_are_reductions_too():
    """cummax, topk, sort, kthvalue, max pooling and −min(−x) are maxima; cumsum, e @ ones, matmul, mv and einsum
    over a dropped index are sums: each combines the length of the axis it reduces, and reads the numbers of x."""
    x = torch.randn(2, 8, dtype=torch.float64)
    ones = torch.ones(4, 1, dtype=torch.float64)

    def seen(fn):
        with Watch(source=x) as w:
            fn(x)
        report = w.report()
        return report["reductions"], report["reduction_kinds"], report["reads"]["most"]

    assert seen(lambda x: x.cummax(-1)) == ([8], "m", {"m": 1, "s": 0, "l": 0})
    for maximum in (lambda x: x.topk(1, -1), lambda x: torch.sort(x, dim=-1), lambda x: x.kthvalue(8, -1),
                    lambda x: -(-x).amin(-1), lambda x: F.max_pool1d(x[:, None], 8)):
        assert seen(maximum)[:2] == ([8], "m")
    assert seen(lambda x: x.cumsum(-1))[:2] == ([8], "s")
    assert seen(lambda x: torch.logcumsumexp(x, -1))[2]["l"] == 1
    for total in (lambda x: torch.exp(x[:, :4]) @ ones, lambda x: torch.matmul(x[:, 4:], ones),
                  lambda x: torch.mv(x[:, :4], ones[:, 0]), lambda x: torch.einsum("...i,i->...", x[:, :4], ones[:, 0]),
                  lambda x: torch.einsum("...i->...", x[:, 4:])):
        assert seen(total) == ([4], "s", {"m": 0, "s": 1, "l": 0})
    assert seen(lambda x: x[:, :4] @ torch.randn(4, 1, dtype=torch.float64))[0] == []  # a product, not a sum


def test_a_copy_carries_the_numbers_it_writes():
    x = torch.randn(2, 8)

    def second_loop_over_a_copy(x):
        buf = torch.empty_like(x)
        buf.copy_(x)
        for s in (0, 4):
            x[:, s:s + 4].amax(-1)
        for s in (0, 4):
            buf[:, s:s + 4].sum(-1)

    def written_block_by_block(x):
        buf = torch.zeros(2, 4)
        for s in (0, 4):
            buf[:, :] = x[:, s:s + 4]
            buf.amax(-1), buf.sum(-1)

    with Watch(source=x) as w:
        second_loop_over_a_copy(x)
    assert w.report()["reads"]["back"] == ["s", 8, 2, "m"]
    with Watch(source=x) as w:
        written_block_by_block(x)
    assert w.report()["reads"] == {"most": {"m": 1, "s": 1, "l": 0}, "back": None, "sizes": [4]}


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
    # the calls named are those that give that dtype: .half() for float16, never .float()
    assert ".half()" in info.value.diagnosis.cause and ".float()" not in info.value.diagnosis.cause
    assert kit.narrowing_calls(torch.float32) == ".float(), .to(torch.float32) or dtype=torch.float32"
    assert kit.narrowing_calls(torch.bfloat16).startswith(".bfloat16(), ")


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


def test_judge_cases_names_a_known_mistake_measures_the_rest_and_passes_keyword_arguments_on():
    from attn_course.checks import kit
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 3, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)
    cases = [kit.TensorCase("a (2, 3) x", (x,), 3 * x), kit.TensorCase("a (4,) x", (y,), 3 * y),
             kit.TensorCase("scale=5", (y,), 5 * y, kwargs={"scale": 5.0}, tags=frozenset({"scaled"}))]
    table = kit.known_rows(("squared", "squared, not scaled", "x * x", "multiply by scale", lambda x, s=3.0: x * x))

    def judged(fn):
        try:
            kit.judge_cases(Learner(fn), cases, table, call="f(x)", arg_names=("x",), oracle="scale * x",
                            tags={"scaled": ("a given scale", "a scale other than the default")})
        except Failure as failure:
            return failure.diagnosis
        return None

    def in_place(x, scale=3.0):
        x *= scale
        return x.clone()

    assert judged(lambda x, scale=3.0: scale * x) is None
    assert judged(lambda x, scale=3.0: x * x).summary == "squared, not scaled"  # the row, run in float64
    assert judged(in_place).summary == "changed its input x in place"
    assert judged(lambda x, scale=3.0: torch.ones_like(x)).summary == "the result does not depend on x"
    assert judged(lambda x, scale=3.0: 3 * x).summary == "wrong with a given scale only"  # scale=5 was passed on
    assert judged(lambda x, scale=3.0: (3 * x).numpy()).summary == "returned a NumPy array, not a tensor"
    raised = judged(lambda x, scale=3.0: x @ torch.ones(7, dtype=x.dtype))
    assert "raised" in raised.summary and raised.tried == "f(x) with a (2, 3) x"
    with pytest.raises(Failure) as info:
        kit.expect_signature(Learner(lambda x, scale: x), ["scale"], call="f(x, scale=5)", signature="f(x, scale=3.0)")
    assert info.value.diagnosis.summary == "scale has no default value"


def test_judge_cases_names_an_exception_only_by_a_row_no_right_result_rules_out():
    from attn_course.checks import kit
    g = torch.Generator().manual_seed(1)
    flat, batched = torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(2, 3, 4, generator=g,
                                                                                         dtype=torch.float64)
    cases = [kit.TensorCase("a 2-D x", (flat,), 2 * flat), kit.TensorCase("a 3-D x", (batched,), 2 * batched)]

    def raises_on_3d(right):  # the learner's code, or a row's: `right` on 2-D input, the same error on 3-D
        def fn(x):
            if x.ndim > 2:
                raise RuntimeError("only 2-D input")
            return right(x)
        return fn

    # both rows raise the learner's very message on the 3-D case; the first one gives -x on 2-D input, which the
    # learner's right 2-D result rules out
    table = kit.known_rows(("negated", "negated", "-x", "keep the sign", raises_on_3d(lambda x: -2 * x)),
                           ("flat-only", "2-D input only", "a 2-D step", "work on any axes", raises_on_3d(lambda x: 2 * x)))
    with pytest.raises(Failure) as info:
        kit.judge_cases(Learner(raises_on_3d(lambda x: 2 * x)), cases, table, call="f(x)", arg_names=("x",),
                        oracle="2 * x")
    assert info.value.diagnosis.summary == "2-D input only"


def test_tensor_answer_names_a_numpy_array():
    import numpy as np

    from attn_course.checks import kit

    t = torch.ones(2)
    assert kit.tensor_answer(t, tried="f(x)") is t
    with pytest.raises(Failure) as info:
        kit.tensor_answer(np.ones((2, 3)), tried="f(x)")
    d = info.value.diagnosis
    assert d.summary == "returned a NumPy array, not a tensor" and "(2, 3)" in d.got and "torch.from_numpy" in d.fix
    with pytest.raises(Failure) as info:
        kit.tensor_answer([1.0, 2.0], tried="f(x)", what="forward")
    assert info.value.diagnosis.summary == "forward returned a Python list"


def test_call_explained_returns_the_answer_or_ends_the_check_with_the_exception_explained():
    from attn_course.checks import kit

    def learner(x):
        raise _raised(lambda: torch.arange(3, 1))  # "upper bound and lower bound inconsistent with step sign"

    assert kit.call_explained(lambda x: x + 1, 1, tried="f(1)", expected="2") == 2
    pattern = ("RuntimeError", r"upper bound and lower bound", "start > end", "swap them")
    with pytest.raises(Failure) as info:
        kit.call_explained(learner, 1, tried="f(1)", expected="a tensor", patterns=[pattern])
    d = info.value.diagnosis
    assert (d.tried, d.expected, d.cause, d.fix) == ("f(1)", "a tensor", "start > end", "swap them")
    assert d.got.startswith("RuntimeError: upper bound")
    construct = ("arange with start > end", "count upwards", lambda: torch.arange(3, 1))
    with pytest.raises(Failure) as info:  # a construct that raises the very same message comes first
        kit.call_explained(learner, 1, tried="f(1)", expected="a tensor", constructs=[construct], patterns=[pattern])
    assert info.value.diagnosis.cause == "arange with start > end"


def _diagnosis(call):
    with pytest.raises(Failure) as info:
        call()
    return info.value.diagnosis


def test_agrees_and_the_hints_for_a_signature_a_reduction_and_code_that_works_on_another_number_of_axes():
    import numpy as np

    from attn_course.checks import kit

    e = torch.tensor([0.25, 0.75], dtype=torch.float64)
    assert kit.agrees(np.array([0.25, 0.75]), e, atol=1e-6, rtol=0) and not kit.agrees(e[None], e, atol=1, rtol=0)
    assert not kit.agrees(None, e, atol=1, rtol=0) and not kit.agrees(e + 1e-3, e, atol=1e-6, rtol=0)
    raised = lambda message, kind="RuntimeError", line=3: LearnerRaised(  # noqa: E731
        {"type": kind, "message": message, "line": line}, "f(x)")
    takes = raised("f() takes 1 positional argument but 2 were given", "TypeError", None)
    assert kit.signature_hint(takes, "f(x, dim=-1)")["fix"] == "keep the signature f(x, dim=-1)"
    assert kit.signature_hint(raised("f() takes 1 positional argument", "TypeError"), "f(x)") == {}  # in the body
    size = raised("The size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 1")
    assert "keepdim=True" in kit.reduction_hint(size, dim=True)["cause"]
    axis = raised("Dimension out of range (expected to be in range of [-1, 0], but got 1)", "IndexError")
    assert "`dim` argument" in kit.reduction_hint(axis, dim=True)["fix"]
    assert "from the end" in kit.reduction_hint(axis, dim=False)["fix"] and kit.reduction_hint(takes, dim=True) == {}
    others = [((3, 4), lambda: False), ((5,), lambda: True), ((2, 2), lambda: True)]
    hint = kit.works_elsewhere((2, 3), others, fix="write it for any shape")
    assert "works on input of shape (5,) but raises on (2, 3)" in hint["cause"] and hint["fix"] == "write it for any shape"
    assert kit.works_elsewhere((2, 3), [((4,), lambda: kit.agrees(None, e, atol=1, rtol=0))], fix="") == {}


def test_what_is_off_names_a_reduction_dropped_axes_half_precision_and_three_digits_else_returns():
    from attn_course.checks import kit

    x = torch.randn(3, 1, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    e = x.softmax(-1)
    judge = lambda out, **kw: kit.what_is_off(out, e, tried="f(x)", what="your result", atol=1e-6, rtol=1e-5,  # noqa: E731
                                              fix="keep x's shape", **kw)
    d = _diagnosis(lambda: judge(e.sum(-1, keepdim=True), reduced=2))
    assert (d.summary, d.fix) == ("one value per slice", "keep x's shape")
    assert _diagnosis(lambda: judge(e.squeeze())).summary == "size-1 axes dropped"
    assert judge(e[:2]) is None  # another wrong shape: the plain comparison says it
    assert _diagnosis(lambda: judge(e.half().double())).summary == "float16 precision"
    d = _diagnosis(lambda: judge(e + 3e-4 * torch.rand(e.shape, generator=torch.Generator().manual_seed(1))))
    assert d.summary == "about 3 digits right"
    assert judge(e * 2) is None  # a constant factor: the plain comparison says it better
    seen = []
    judge(torch.where(e > 0.3, float("nan"), e), explain=seen.append)  # NaN where the truth is finite: explained
    assert len(seen) >= 1 and bool(seen[0].isnan().any())


def test_explain_nonfinite_says_where_nan_comes_from():
    from attn_course.checks import kit

    assert kit.exp_limits(torch.float32)[0] == pytest.approx(88.72, abs=0.01)
    assert kit.nan_or_inf(torch.tensor([float("nan"), float("inf"), 1.0])) == "NaN and inf"
    xs = torch.tensor([[1000.0, 1001.0], [0.0, 1.0]], dtype=torch.float64)
    rows = torch.tensor([[True, True], [False, False]])
    explain = lambda xs, rows, **kw: kit.explain_nonfinite(rows, xs, torch.float32, tried="f(x)", got="NaN in 2",  # noqa: E731
                                                           kinds="NaN", expected="finite", **kw)
    d = _diagnosis(lambda: explain(xs, rows))
    assert d.summary == "NaN from an overflow" and "the largest x in those slices is 1001" in d.cause and "amax" in d.fix
    assert _diagnosis(lambda: explain(-xs, rows)).summary == "NaN from an underflow"
    spread = torch.tensor([[-80.0, 80.0]], dtype=torch.float64)
    assert _diagnosis(lambda: explain(spread, torch.tensor([[True, True]]))).summary == \
        "NaN in slices of widely spread scores"
    masked = torch.tensor([[float("-inf"), 1.0]], dtype=torch.float64)
    assert _diagnosis(lambda: explain(masked, torch.tensor([[True, True]]))).summary == "NaN where scores are -inf"
    plain = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    assert _diagnosis(lambda: explain(plain, torch.tensor([[True, True]]))).summary == "NaN in the result"
    assert explain(plain, torch.tensor([[True, True]]), last=False) is None


def test_unpack_names_what_came_back_instead_of_the_tuple():
    from attn_course.checks import kit

    names = ("output", "weights")
    unpack = lambda r: kit.unpack(r, names, tried="attention(Q, K, V)")  # noqa: E731
    t = torch.ones(2, 3)
    out, w = unpack((t, t * 2))
    assert torch.equal(out, t) and torch.equal(w, 2 * t)
    d = _diagnosis(lambda: unpack(t))
    assert d.summary == "returned one tensor, not (output, weights)" and "(2, 3)" in d.got
    assert "return output, weights" in d.fix
    d = _diagnosis(lambda: unpack(None))
    assert d.summary == "did not return (output, weights)" and d.got == "None" and "no `return`" in d.cause
    assert _diagnosis(lambda: unpack((t, t, t))).got == "a tuple of 3 items"
    d = _diagnosis(lambda: unpack((t.numpy(), t)))
    assert d.summary == "returned NumPy arrays, not tensors" and "output: a NumPy array" in d.got
    d = _diagnosis(lambda: unpack((t, [t[:1], t[1:]])))
    assert d.summary == "weights returned as a list of 2 tensors" and "(1, 3), (1, 3)" in d.got
    assert "second element" in _diagnosis(lambda: unpack((t, "text"))).summary


def test_a_shared_family_is_adapted_by_each_check_not_copied():
    from attn_course.checks import kit

    # the stable-softmax mistakes, on (x, dim) and, for a function without dim, along the last axis
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    rows = {k.key: k for k in kit.SOFTMAX_MISTAKES}
    last = kit.along_last_axis(kit.SOFTMAX_MISTAKES, "sum-axis-0", "naive")
    assert [k.key for k in last] == ["sum-axis-0", "naive"]  # in the order asked
    assert torch.equal(last[0].make(x), rows["sum-axis-0"].make(x, -1))
    assert rows["sum-axis-0"].make(x) is None  # dim left at its default: no axis row applies
    assert last[0].on((x,)).cause == "you divided by the sum along axis 0, not along dim=-1"
    assert rows["sum-axis-0"].on((x, 1)).cause.endswith("not along dim=1")
    # the Q Kᵀ mistakes, picked in a check's order with its own fixes, the product mapped
    Q, K = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    picked = kit.product_rows({"dot-T": "mine", "entrywise": None}, then=lambda S, Q: 2 * S)
    own = {r[0]: r[3] for r in kit.PRODUCT_MISTAKES}
    assert [(r[0], r[3]) for r in picked] == [("dot-T", "mine"), ("entrywise", own["entrywise"])]
    assert torch.equal(picked[1][4](Q[..., :3, :], K[..., :3, :]), 2 * Q[..., :3, :] * K[..., :3, :])
    assert [r[0] for r in kit.product_rows()] == [r[0] for r in kit.PRODUCT_MISTAKES]

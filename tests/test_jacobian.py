"""Notebook 04: the reference Jacobian, VJP and autograd Function agree with torch.autograd, and
each check rejects its pitfalls with the right diagnosis while accepting correct alternatives."""

import numpy as np
import pytest
import torch

from attn_course import jacobian as ref
from attn_course.checks._core import CheckFailed, NotAttempted
from attn_course.checks.jacobian import check_softmax_function, check_softmax_jacobian, check_softmax_vjp
from checking import rejects, accepts

torch.manual_seed(0)


# ---------------------------------------------------------------- reference vs PyTorch

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reference_jacobian_matches_autograd(dtype):
    x = torch.randn(2, 3, 5, dtype=dtype)
    s = torch.softmax(x, -1)
    J = ref.softmax_jacobian(s)
    assert J.shape == (2, 3, 5, 5)
    for b in range(2):
        for h in range(3):
            oracle = torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), x[b, h])
            torch.testing.assert_close(J[b, h], oracle)


def test_reference_jacobian_properties():
    s = torch.softmax(torch.randn(6, dtype=torch.float64), -1)
    J = ref.softmax_jacobian(s)
    torch.testing.assert_close(J.sum(-1), torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(J, J.T)
    assert torch.linalg.eigvalsh(J).min() > -1e-12
    assert torch.linalg.matrix_rank(J) == 5


def test_reference_vjp_and_function_match_autograd():
    x = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 7, dtype=torch.float64)
    (oracle,) = torch.autograd.grad(torch.softmax(x, -1), x, g)
    s = torch.softmax(x.detach(), -1)
    torch.testing.assert_close(ref.softmax_vjp(s, g), oracle)
    torch.testing.assert_close(ref.jacobian_backward(s, g), oracle)
    (mine,) = torch.autograd.grad(ref.softmax_fn(x), x, g)
    torch.testing.assert_close(mine, oracle)
    assert torch.autograd.gradcheck(ref.SoftmaxFunction.apply, (x,))


# ---------------------------------------------------------------- softmax_jacobian

def sign_flipped(s):
    return s.unsqueeze(-1) * s.unsqueeze(-2) - torch.diag_embed(s)


def inner_product(s):  # s sᵀ written as sᵀ s: one number
    return torch.diag_embed(s) - (s * s).sum(-1)[..., None, None]


def only_diag(s):
    return torch.diag_embed(s)


def only_outer(s):
    return -(s.unsqueeze(-1) * s.unsqueeze(-2))


def diagonal_entries_only(s):
    return torch.diag_embed(s * (1 - s))


def unbatched(s):  # torch.diag / torch.outer handle one vector only
    return torch.diag(s) - torch.outer(s, s)


def numpy_unbatched(s):
    return np.diag(s) - np.outer(s, s)


def batch_summed(s):
    if s.dim() == 1:
        return torch.diag(s) - torch.outer(s, s)
    return torch.diag_embed(s).sum(0) - s.T @ s


def axes_last(s):  # J with the batch axes moved to the end
    J = torch.diag_embed(s) - s.unsqueeze(-1) * s.unsqueeze(-2)
    return J if s.dim() == 1 else J.movedim(0, -1)


@pytest.mark.parametrize(
    "fn, phrase",
    [
        (sign_flipped, "sign is flipped"),
        (inner_product, "inner product"),
        (only_diag, "− s sᵀ term is missing"),
        (only_outer, "diag(s) term is missing"),
        (diagonal_entries_only, "off-diagonal entries"),
        (unbatched, "batch dimensions are not supported"),
        (numpy_unbatched, "batch dimensions are not supported"),
        (batch_summed, "summed over the batch"),
        (axes_last, "wrong order"),
    ],
)
def test_jacobian_names_each_pitfall(fn, phrase):
    rejects(check_softmax_jacobian, fn, phrase)


def jacobian_einsum(s):
    eye = torch.eye(s.shape[-1], dtype=s.dtype)
    return torch.einsum("...i,ij->...ij", s, eye) - torch.einsum("...i,...j->...ij", s, s)


def jacobian_numpy(s):
    n = s.shape[-1]
    return s[..., :, None] * np.eye(n) - s[..., :, None] * s[..., None, :]


def jacobian_float64(s):
    return ref.softmax_jacobian(s.double())


def jacobian_by_formula(s):  # s_i (δ_ij − s_j)
    eye = torch.eye(s.shape[-1], dtype=s.dtype)
    return s.unsqueeze(-1) * (eye - s.unsqueeze(-2))


def jacobian_transposed(s):  # J is symmetric: its transpose is the same matrix, and correct
    return ref.softmax_jacobian(s).transpose(-1, -2)


@pytest.mark.parametrize("fn", [jacobian_einsum, jacobian_numpy, jacobian_float64, jacobian_by_formula,
                                jacobian_transposed, ref.softmax_jacobian])
def test_jacobian_accepts_correct_alternatives(fn, capsys):
    accepts(check_softmax_jacobian, fn, capsys)


# ---------------------------------------------------------------- softmax_vjp

def vjp_missing_dot(s, g):
    return s * g


def vjp_sign(s, g):
    return s * ((g * s).sum(-1, keepdim=True) - g)


def vjp_plain_sum(s, g):
    return s * (g - g.sum(-1, keepdim=True))


def vjp_no_s(s, g):
    return g - (g * s).sum(-1, keepdim=True)


def vjp_global_sum(s, g):
    return s * (g - (g * s).sum())


def vjp_no_keepdim(s, g):
    return s * (g - (g * s).sum(-1))


def vjp_via_jacobian(s, g):  # right values, O(n²) memory
    return ref.jacobian_backward(s, g)


def vjp_via_jacobian_numpy(s, g):
    J = s[..., :, None] * np.eye(s.shape[-1]) - s[..., :, None] * s[..., None, :]
    return (J @ g[..., :, None])[..., 0]


@pytest.mark.parametrize(
    "fn, phrase",
    [
        (vjp_missing_dot, "⟨g, s⟩ term is missing"),
        (vjp_sign, "sign is flipped"),
        (vjp_plain_sum, "plain sum or mean"),
        (vjp_no_s, "multiplication by s is missing"),
        (vjp_global_sum, "whole tensor instead of per row"),
        (vjp_no_keepdim, "without keepdim"),
        (vjp_via_jacobian, "O(n²)"),
        (vjp_via_jacobian_numpy, "O(n²)"),
    ],
)
def test_vjp_names_each_pitfall(fn, phrase):
    rejects(check_softmax_vjp, fn, phrase)


def vjp_numpy(s, g):
    return s * (g - np.sum(g * s, axis=-1, keepdims=True))


def vjp_einsum(s, g):
    return s * (g - torch.einsum("...i,...i->...", g, s).unsqueeze(-1))


def vjp_float64(s, g):
    return ref.softmax_vjp(s.double(), g.double())


def vjp_expanded(s, g):  # s ⊙ g − s ⟨g, s⟩
    return s * g - s * (g * s).sum(-1, keepdim=True)


@pytest.mark.parametrize("fn", [vjp_numpy, vjp_einsum, vjp_float64, vjp_expanded, ref.softmax_vjp])
def test_vjp_accepts_correct_alternatives(fn, capsys):
    accepts(check_softmax_vjp, fn, capsys)


# ---------------------------------------------------------------- SoftmaxFunction

def make_function(backward_rule, forward_rule=None, name="SoftmaxFunction"):
    def forward(ctx, x):
        s = forward_rule(x) if forward_rule else torch.softmax(x, -1)
        ctx.save_for_backward(s)
        return s

    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return backward_rule(s, grad)

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def naive_forward(x):
    e = torch.exp(x)
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize(
    "cls, phrase",
    [
        (make_function(ref.softmax_vjp, naive_forward), "maximum was not subtracted"),
        (make_function(vjp_missing_dot), "⟨g, s⟩ term is missing"),
        (make_function(vjp_sign), "sign is flipped"),
        (make_function(vjp_global_sum), "whole tensor instead of per row"),
        (make_function(ref.jacobian_backward), "O(n²)"),
        (make_function(lambda s, g: None), "returned None"),
    ],
)
def test_function_names_each_pitfall(cls, phrase):
    rejects(check_softmax_function, cls, phrase)


def test_function_with_unbatched_backward_is_rejected():
    def one_vector(s, g):  # torch.diag / torch.outer only handle one vector
        return (torch.diag(s) - torch.outer(s, s)) @ g

    rejects(check_softmax_function, make_function(one_vector), "raised RuntimeError")


def test_function_with_unfinished_backward_is_not_attempted():
    def unfinished_backward(s, g):
        raise NotImplementedError()

    with pytest.raises(NotAttempted, match="not attempted"):
        check_softmax_function(make_function(unfinished_backward))


class SetupContextStyle(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return torch.softmax(x, -1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return s * (grad - (grad * s).sum(-1, keepdim=True))


class NeedsRealContext(torch.autograd.Function):
    """Correct, but uses a ctx feature the check's stand-in lacks: the check falls back to autograd."""

    @staticmethod
    def forward(ctx, x):
        s = torch.softmax(x, -1)
        ctx.save_for_backward(s)
        ctx.mark_dirty()  # no tensors: a no-op for autograd, unknown to the stand-in
        return s

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return s * (grad - (grad * s).sum(-1, keepdim=True))


def numpy_backward(s, g):  # computes in NumPy, hands a tensor back
    s_np, g_np = s.numpy(), g.numpy()
    return torch.from_numpy(s_np * (g_np - (g_np * s_np).sum(-1, keepdims=True)))


@pytest.mark.parametrize(
    "cls",
    [ref.SoftmaxFunction, ref.SoftmaxFunction.apply, SetupContextStyle, NeedsRealContext,
     make_function(vjp_einsum), make_function(vjp_expanded), make_function(numpy_backward)],
)
def test_function_accepts_correct_alternatives(cls, capsys):
    accepts(check_softmax_function, cls, capsys)


def test_function_rejects_a_plain_function():
    rejects(check_softmax_function, lambda x: torch.softmax(x, -1), "subclass of torch.autograd.Function")


# ---------------------------------------------------------------- unfinished, wrong type, shape, NaN

def unfinished(*args):
    raise NotImplementedError()


class Unfinished(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError()


@pytest.mark.parametrize("check, fn", [(check_softmax_jacobian, unfinished), (check_softmax_vjp, unfinished),
                                       (check_softmax_function, Unfinished)])
def test_unfinished_is_not_attempted(check, fn):
    with pytest.raises(NotAttempted, match="not attempted"):
        check(fn)


@pytest.mark.parametrize("check", [check_softmax_jacobian, check_softmax_vjp, check_softmax_function])
def test_non_callable_gets_a_clear_message(check):
    with pytest.raises(CheckFailed, match="expected"):
        check(torch.zeros(3))


@pytest.mark.parametrize("check", [check_softmax_jacobian, check_softmax_vjp])
def test_list_result_gets_a_clear_message(check):
    with pytest.raises(CheckFailed, match="Python list"):
        check(lambda s, *g: s.tolist())


def test_jacobian_wrong_shape_gets_a_clear_message():
    with pytest.raises(CheckFailed, match=r"has shape \(3,\), expected \(3, 3\)"):
        check_softmax_jacobian(lambda s: s)


def test_vjp_wrong_shape_gets_a_clear_message():
    with pytest.raises(CheckFailed, match="has shape"):
        check_softmax_vjp(lambda s, g: (s * g).sum(-1))


@pytest.mark.parametrize("check, fn", [(check_softmax_jacobian, lambda s: torch.full(s.shape + s.shape[-1:], float("nan"))),
                                       (check_softmax_vjp, lambda s, g: torch.full_like(s, float("nan"))),
                                       (check_softmax_function, make_function(lambda s, g: torch.full_like(s, float("nan"))))])
def test_nan_result_gets_a_clear_message(check, fn):
    with pytest.raises(CheckFailed, match="NaN"):
        check(fn)


def test_function_forward_returning_a_list_gets_a_clear_message():
    class ReturnsList(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.softmax(x, -1).tolist()

        @staticmethod
        def backward(ctx, grad):
            return grad

    with pytest.raises(CheckFailed) as info:
        check_softmax_function(ReturnsList)
    assert "expected" in str(info.value) or "raised" in str(info.value)

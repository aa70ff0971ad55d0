"""Checks of notebook 04 (attn_course.checks.jacobian): every wrong Jacobian, VJP and autograd Function
rejected with the mistake named (O(n²) memory and work included, measured by the learner-side probes),
correct alternatives accepted, and the same verdict when the grader replays the log."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attn_course import jacobian as ref
from attn_course.checks import jacobian as checks
from attn_course.checks.jacobian import (BIG_N, QUADRATIC, check_softmax_jacobian, check_softmax_vjp,
                                         check_SoftmaxFunction)
from attn_course.checks.result import Status

INF = float("inf")


def J_of(p):
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


# =============================================================================== softmax_jacobian
def j_sign(p):
    return p.unsqueeze(-1) * p.unsqueeze(-2) - torch.diag_embed(p)


def j_inner(p):
    return torch.diag_embed(p) - (p * p).sum(-1)[..., None, None]


def j_inner_matmul(p):  # p @ p.T on a vector is the inner product
    return torch.diag_embed(p) - p @ p if p.ndim == 1 else J_of(p)


def j_only_diag(p):
    return torch.diag_embed(p)


def j_only_outer(p):
    return -(p.unsqueeze(-1) * p.unsqueeze(-2))


def j_diagonal_entries(p):
    return torch.diag_embed(p * (1 - p))


def j_unbatched(p):
    return torch.diag(p) - torch.outer(p, p)


def j_numpy_unbatched(p):
    return np.diag(p) - np.outer(p, p)


def j_batch_summed(p):
    return torch.diag(p) - torch.outer(p, p) if p.ndim == 1 else torch.diag_embed(p).sum(0) - p.T @ p


def j_axes_last(p):
    return J_of(p) if p.ndim == 1 else J_of(p).movedim(0, -1)


def j_axes_middle(p):
    return J_of(p).transpose(0, 1) if p.ndim >= 2 else J_of(p)


def j_s_i_squared(p):
    return torch.diag_embed(p) - (p * p).unsqueeze(-1)


def j_identity(p):
    return torch.eye(p.shape[-1], dtype=p.dtype) - p.unsqueeze(-1) * p.unsqueeze(-2)


def j_softmax_again(p):
    return J_of(torch.softmax(p, -1))


def j_row_loop(p):  # rows of a (B, n) batch one at a time: (B, A, n) breaks
    return torch.diag(p) - torch.outer(p, p) if p.ndim == 1 else torch.stack([torch.diag(r) - torch.outer(r, r) for r in p])


def j_log_softmax(p):
    return torch.eye(p.shape[-1], dtype=p.dtype) - p.unsqueeze(-2)


def j_autograd_whole_batch(p):
    return torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), torch.log(p))


def j_hard_coded_n(p):
    return torch.eye(3, dtype=p.dtype) * p.unsqueeze(-1) - p.unsqueeze(-1) * p.unsqueeze(-2)


def j_double_diagonal(p):
    return 2 * torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def j_half_outer(p):
    return torch.diag_embed(p) - 0.5 * p.unsqueeze(-1) * p.unsqueeze(-2)


def j_first_batch_entry(p):
    J = J_of(p)
    return J[:1].expand_as(J).clone() if J.ndim >= 3 else J


def j_half(p):
    return J_of(p).half()


def j_long(p):
    return J_of(p).long()


JACOBIAN_WRONG = [
    (j_sign, ["sign flipped"]),
    (j_inner, ["pᵀp for p pᵀ", "outer"]),
    (j_inner_matmul, ["pᵀp for p pᵀ"]),
    (j_only_diag, ["− p pᵀ term missing"]),
    (j_only_outer, ["diag(p) term missing"]),
    (j_diagonal_entries, ["only the diagonal"]),
    (j_unbatched, ["worked on inputs with fewer axes", "diag_embed"]),
    (j_numpy_unbatched, ["worked on inputs with fewer axes"]),
    (j_batch_summed, ["outer product over the batch"]),
    (j_axes_last, ["batch axes last"]),
    (j_axes_middle, ["batch axes in the wrong place"]),
    (j_s_i_squared, ["p_i² for p_i p_j"]),
    (j_identity, ["identity for diag(p)"]),
    (j_softmax_again, ["softmax applied to p"]),
    (j_row_loop, ["worked on inputs with fewer axes"]),
    (j_log_softmax, ["Jacobian of log-softmax"]),
    (j_autograd_whole_batch, ["Jacobian across the batch"]),
    (j_hard_coded_n, ["a size written into your code", "n = 5"]),
    (j_double_diagonal, ["diagonal wrong"]),
    (j_half_outer, ["rows of J do not sum to 0"]),
    (j_first_batch_entry, ["batch entry 0 repeated"]),
    (j_half, ["result in float16"]),
    (j_long, ["integer result"]),
]


@pytest.mark.parametrize("fn,phrases", JACOBIAN_WRONG, ids=[f.__name__ for f, _ in JACOBIAN_WRONG])
def test_jacobian_names_each_mistake(fn, phrases, rejects):
    rejects(check_softmax_jacobian, fn, *phrases)


def j_einsum(p):
    eye = torch.eye(p.shape[-1], dtype=p.dtype)
    return torch.einsum("...i,ij->...ij", p, eye) - torch.einsum("...i,...j->...ij", p, p)


def j_numpy(p):
    return p[..., :, None] * np.eye(p.shape[-1]) - p[..., :, None] * p[..., None, :]


def j_formula(p):  # p_i (δ_ij − p_j)
    return p.unsqueeze(-1) * (torch.eye(p.shape[-1], dtype=p.dtype) - p.unsqueeze(-2))


def j_transposed(p):  # J is symmetric: its transpose is the same matrix
    return J_of(p).transpose(-1, -2)


def j_matmul_outer(p):
    return torch.diag_embed(p) - p.unsqueeze(-1) @ p.unsqueeze(-2)


def j_loop_over_flattened_rows(p):
    flat = p.reshape(-1, p.shape[-1])
    return torch.stack([torch.diag(r) - torch.outer(r, r) for r in flat]).reshape(*p.shape, p.shape[-1])


def j_autograd_per_row(p):
    flat = torch.log(p).reshape(-1, p.shape[-1])
    rows = [torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), r) for r in flat]
    return torch.stack(rows).reshape(*p.shape, p.shape[-1])


def j_vmap(p):
    flat = p.reshape(-1, p.shape[-1])
    return torch.vmap(lambda r: torch.diag(r) - torch.outer(r, r))(flat).reshape(*p.shape, p.shape[-1])


@pytest.mark.parametrize("fn", [j_einsum, j_numpy, j_formula, j_transposed, j_matmul_outer, j_loop_over_flattened_rows,
                                j_autograd_per_row, j_vmap, lambda p: J_of(p.double()), ref.softmax_jacobian])
def test_jacobian_accepts_correct_alternatives(fn, accepts):
    accepts(check_softmax_jacobian, fn)


# =============================================================================== softmax_vjp
def v_missing_dot(p, g):
    return p * g


def v_sign(p, g):
    return p * ((g * p).sum(-1, keepdim=True) - g)


def v_plain_sum(p, g):
    return p * (g - g.sum(-1, keepdim=True))


def v_mean(p, g):
    return p * (g - g.mean(-1, keepdim=True))


def v_no_s(p, g):
    return g - (g * p).sum(-1, keepdim=True)


def v_global_sum(p, g):
    return p * (g - (g * p).sum())


def v_no_keepdim(p, g):
    return p * (g - (g * p).sum(-1))


def v_sum_axis0(p, g):
    return p * (g - (g * p).sum(0, keepdim=True))


def v_per_batch_entry(p, g):  # a loop over the first axis, each entry reduced whole
    if p.ndim == 1:
        return p * (g - (g * p).sum())
    return torch.stack([r * (q - (q * r).sum()) for r, q in zip(p, g)])


def v_via_jacobian(p, g):
    return ref.jacobian_backward(p, g)


def v_via_autograd_jacobian(p, g):
    flat_s, flat_g = p.reshape(-1, p.shape[-1]), g.reshape(-1, p.shape[-1])
    rows = [torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), torch.log(r), vectorize=True) @ q
            for r, q in zip(flat_s, flat_g)]
    return torch.stack(rows).reshape(p.shape)


def v_per_entry_loop(p, g):  # right values, ⟨g, p⟩ recomputed for every entry: O(n²) work
    flat_s, flat_g = p.reshape(-1, p.shape[-1]), g.reshape(-1, p.shape[-1])
    out = torch.empty_like(flat_s)
    for r in range(flat_s.shape[0]):
        for i in range(flat_s.shape[1]):
            out[r, i] = flat_s[r, i] * (flat_g[r, i] - (flat_g[r] * flat_s[r]).sum())
    return out.reshape(p.shape)


def v_diagonal_only(p, g):
    return p * (1 - p) * g


def v_swapped(p, g):
    return g * (p - (g * p).sum(-1, keepdim=True))


def v_grad_unused(p, g):
    return p * (1 - p)


def v_zeros(p, g):
    return torch.zeros_like(p)


def v_grad_unchanged(p, g):
    return g


def v_softmax_again(p, g):
    p = torch.softmax(p, -1)
    return p * (g - (g * p).sum(-1, keepdim=True))


def v_dot_for_vectors_only(p, g):
    return p * (g - torch.dot(g, p))


def v_inner_for_outer(p, g):
    return p * g - (p * p).sum(-1, keepdim=True) * g


def v_half(p, g):
    return (p * (g - (g * p).sum(-1, keepdim=True))).half()


def v_double_dot(p, g):
    return p * (g - 2 * (g * p).sum(-1, keepdim=True))


def v_grad_reused_in_place(p, g):  # "saves a tensor": the upstream gradient becomes the result
    g -= (g * p).sum(-1, keepdim=True)
    return g.mul_(p)


VJP_WRONG = [
    (v_grad_reused_in_place, ["grad changed in place"]),
    (v_missing_dot, ["⟨g, p⟩ term missing"]),
    (v_sign, ["sign flipped"]),
    (v_plain_sum, ["plain sum of g"]),
    (v_mean, ["mean of g"]),
    (v_no_s, ["final multiplication by p missing"]),
    (v_global_sum, ["⟨g, p⟩ summed over the whole tensor"]),
    (v_no_keepdim, ["keepdim missing"]),
    (v_sum_axis0, ["⟨g, p⟩ summed along axis 0"]),
    (v_per_batch_entry, ["⟨g, p⟩ summed over a whole batch entry"]),
    (v_via_jacobian, ["O(n²) memory", "(1, 2048, 2048)"]),
    (v_via_autograd_jacobian, ["O(n²) memory"]),
    (v_per_entry_loop, ["n = 2048", "work"]),  # O(n²) work (or, on a very slow machine, stopped at the time limit)
    (v_diagonal_only, ["only the diagonal of J"]),
    (v_swapped, ["p and grad swapped"]),
    (v_grad_unused, ["upstream gradient not used"]),
    (v_zeros, ["upstream gradient not used"]),
    (v_grad_unchanged, ["grad returned unchanged"]),
    (v_softmax_again, ["softmax applied to p"]),
    (v_dot_for_vectors_only, ["worked on inputs with fewer axes"]),
    (v_inner_for_outer, ["pᵀp for p pᵀ"]),
    (v_half, ["result in float16"]),
    (v_double_dot, ["rows do not sum to 0"]),
]


@pytest.mark.parametrize("fn,phrases", VJP_WRONG, ids=[f.__name__ for f, _ in VJP_WRONG])
@pytest.mark.slow
def test_vjp_names_each_mistake(fn, phrases, rejects):
    rejects(check_softmax_vjp, fn, *phrases)


def v_numpy_jacobian(p, g):  # NumPy only, through J: O(n²) NumPy memory
    J = p[..., :, None] * np.eye(p.shape[-1], dtype=p.dtype) - p[..., :, None] * p[..., None, :]
    return (J @ g[..., :, None])[..., 0]


def test_vjp_numpy_jacobian_is_caught_by_numpy_memory(rejects):
    def numpy_only(p, g):
        if isinstance(p, torch.Tensor):
            raise TypeError("NumPy arrays only")
        return v_numpy_jacobian(p, g)

    result = rejects(check_softmax_vjp, numpy_only, "O(n²) memory", "NumPy")
    assert "MiB" in result.text()


def v_numpy(p, g):
    return p * (g - np.sum(g * p, axis=-1, keepdims=True))


def v_einsum(p, g):
    return p * (g - torch.einsum("...i,...i->...", g, p).unsqueeze(-1))


def v_expanded(p, g):
    return p * g - p * (g * p).sum(-1, keepdim=True)


def v_matmul_dot(p, g):
    return p * (g - (g.unsqueeze(-2) @ p.unsqueeze(-1)).squeeze(-1))


def v_autograd(p, g):
    z = torch.log(p).detach().requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(torch.softmax(z, -1), z, g)
    return grad


def v_vecdot(p, g):
    return p * (g - torch.linalg.vecdot(g, p).unsqueeze(-1))


@pytest.mark.parametrize("fn", [v_numpy, v_einsum, v_expanded, v_matmul_dot, v_autograd, v_vecdot,
                                lambda p, g: ref.softmax_vjp(p.double(), g.double()), ref.softmax_vjp])
def test_vjp_accepts_correct_alternatives(fn, accepts):
    result = accepts(check_softmax_vjp, fn)
    assert f"O(n) at n = {BIG_N}" in result.summary


# =============================================================================== SoftmaxFunction
def make_function(backward_rule, forward_rule=None, save="p"):
    """A SoftmaxFunction whose forward is ``forward_rule`` (default torch.softmax) and whose backward is
    ``backward_rule(p, grad)``; it saves p, or z when ``save="z"`` (recomputing p in backward)."""

    def forward(ctx, z):
        p = forward_rule(z) if forward_rule else torch.softmax(z, -1)
        ctx.save_for_backward(p if save == "p" else z)
        return p

    def backward(ctx, grad):
        (t,) = ctx.saved_tensors
        return backward_rule(t if save == "p" else torch.softmax(t, -1), grad)

    return type("SoftmaxFunction", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def f_naive(z):
    e = torch.exp(z)
    return e / e.sum(-1, keepdim=True)


def f_global_max(z):
    e = torch.exp(z - z.max())
    return e / e.sum(-1, keepdim=True)


def f_normalised(e):
    return e / e.sum(-1, keepdim=True)


def f_stable(z):
    e = torch.exp(z - z.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


class ForwardSavesJ(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        p = torch.softmax(z, -1)
        ctx.save_for_backward(J_of(p))
        return p

    @staticmethod
    def backward(ctx, g):
        (J,) = ctx.saved_tensors
        return (J @ g.unsqueeze(-1)).squeeze(-1)


class SavesNothing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        return torch.softmax(z, -1)

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        return p * (g - (g * p).sum(-1, keepdim=True))


class ExitsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        return torch.softmax(z, -1)

    @staticmethod
    def backward(ctx, g):
        raise SystemExit(0)


class NotAFunction:
    @staticmethod
    def apply(z):
        return torch.softmax(z, -1)


FUNCTION_WRONG = [
    (make_function(ref.softmax_vjp, f_naive), ["maximum not subtracted"]),
    (make_function(ref.softmax_vjp, f_global_max), ["maximum taken over the whole tensor"]),
    (make_function(ref.softmax_vjp, lambda z: torch.softmax(z, 0)), ["softmax along axis 0"]),
    (make_function(v_missing_dot), ["⟨g, p⟩ term missing"]),
    (make_function(v_sign), ["sign flipped"]),
    (make_function(v_global_sum), ["⟨g, p⟩ summed over the whole tensor"]),
    (make_function(v_no_keepdim), ["keepdim missing"]),
    (make_function(v_grad_unused), ["upstream gradient not used"]),
    (make_function(v_grad_unchanged), ["grad returned unchanged"]),
    (make_function(lambda p, g: None), ["backward returned None"]),
    (make_function(lambda p, g: (torch.diag(p) - torch.outer(p, p)) @ g), ["worked on inputs with fewer axes", "diag_embed"]),
    (make_function(lambda p, g: v_expanded(p, g).sum(-1)), ["shape is not the shape of z"]),
    (make_function(v_half), ["float16 precision"]),
    (make_function(lambda p, g: 2 * ref.softmax_vjp(p, g)), ["off by a factor of 2"]),
    (make_function(ref.jacobian_backward), ["O(n²) memory in your backward"]),
    (make_function(lambda p, g: torch.stack([p[..., i] * (g[..., i] - (g * p).sum(-1)) for i in range(p.shape[-1])], -1)),
     ["O(n²) work in your backward"]),
    (make_function(ref.softmax_vjp, lambda z: f_stable(z) * z.shape[-1]), ["divided by the mean, not the sum"]),
    # NaN that no known mistake reproduces: where it comes from is measured
    (make_function(ref.softmax_vjp, lambda z: f_naive(z) * (1 + 1e-3 * (z.amax() > 500))), ["NaN from an overflow"]),
    (make_function(ref.softmax_vjp, lambda z: f_normalised(torch.exp(z - z[..., :1]))), ["NaN where scores are -inf"]),
    (ForwardSavesJ, ["O(n²) memory in your forward"]),
    (SavesNothing, ["did not save p"]),
    (ExitsInBackward, ["SystemExit", "stops programs"]),
    (NotAFunction, ["not a torch.autograd.Function"]),
]


@pytest.mark.parametrize("cls,phrases", FUNCTION_WRONG, ids=[str(i) for i in range(len(FUNCTION_WRONG))])
@pytest.mark.slow
def test_function_names_each_mistake(cls, phrases, rejects):
    rejects(check_SoftmaxFunction, cls, *phrases)


class SetupContextStyle(torch.autograd.Function):
    @staticmethod
    def forward(z):
        return torch.softmax(z, -1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return p * (grad - (grad * p).sum(-1, keepdim=True))


class LogSpaceForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        p = (z - torch.logsumexp(z, -1, keepdim=True)).exp()
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return p * grad - p * (grad * p).sum(dim=-1, keepdim=True)


def numpy_backward(p, g):
    sn, gn = p.numpy(), g.numpy()
    return torch.from_numpy(sn * (gn - (gn * sn).sum(-1, keepdims=True)))


@pytest.mark.parametrize("cls", [ref.SoftmaxFunction, make_function(ref.softmax_vjp, save="z"), make_function(v_einsum),
                                 make_function(v_expanded, lambda z: torch.nn.functional.softmax(z, dim=-1)),
                                 make_function(numpy_backward), SetupContextStyle, LogSpaceForward])
def test_function_accepts_correct_alternatives(cls, accepts):
    result = accepts(check_SoftmaxFunction, cls)
    assert "gradcheck passes" in result.summary and f"O(n) at n = {BIG_N}" in result.summary


# =============================================================================== every check
class Custom(BaseException):
    pass


@pytest.mark.parametrize("check,right", [(check_softmax_jacobian, ref.softmax_jacobian), (check_softmax_vjp, ref.softmax_vjp)])
def test_odd_values_and_exceptions_get_clear_messages(check, right, rejects, unfinished):
    rejects(check, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    assert check.evaluate(namespace={}).status is Status.NOT_ATTEMPTED
    rejects(check, 3.0, "not a function")
    rejects(check, lambda *a: right(*a).tolist(), "Python list")
    rejects(check, lambda *a: None, "returned None")
    rejects(check, lambda *a: torch.empty(right(*a).shape, device="meta"), "meta device")
    rejects(check, lambda *a: right(*a) * float("nan"), "NaN")
    rejects(check, lambda *a: (_ for _ in ()).throw(SystemExit(2)), "SystemExit", "stops programs")
    rejects(check, lambda *a: (_ for _ in ()).throw(Custom("z")), "Custom", "stops programs")
    rejects(check, lambda *a: right(*a)[..., :1], "wrong shape")


def test_function_not_attempted_and_not_a_class(rejects):
    class Unfinished(torch.autograd.Function):
        @staticmethod
        def forward(ctx, z):
            raise NotImplementedError()

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError()

    rejects(check_SoftmaxFunction, Unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_SoftmaxFunction, ref.softmax_fn, "not a class")
    assert check_SoftmaxFunction.evaluate(namespace={}).status is Status.NOT_ATTEMPTED


def test_function_with_unfinished_backward_is_not_attempted_or_named(rejects):
    rejects(check_SoftmaxFunction, make_function(lambda p, g: (_ for _ in ()).throw(NotImplementedError())),
            "NotImplementedError")


# =============================================================================== the cost probes
def test_probe_margins_separate_right_from_wrong_widely():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(1, BIG_N, generator=g), -1)
    up = torch.randn(1, BIG_N, generator=g)
    right = checks.vjp_cost(ref.softmax_vjp, p, up)
    wrong = checks.vjp_cost(ref.jacobian_backward, p, up)
    assert right["measured"] and wrong["measured"]
    assert 50 * right["largest"] < QUADRATIC and 50 * right["total"] < QUADRATIC  # over 50× below the line
    assert wrong["largest"] >= 8 * QUADRATIC  # 8× above it
    cost = checks.function_cost(ref.SoftmaxFunction, torch.randn(1, BIG_N, generator=g), up)
    assert 50 * cost["backward"]["largest"] < QUADRATIC and 50 * cost["forward"]["largest"] < QUADRATIC


def test_gradcheck_runs_through_learner_operations_only(tmp_path):
    """The grader replays gradcheck from the log: every forward and backward it asked for was recorded."""
    from attn_course.checks.boundary import ReplaySession

    log = tmp_path / "SoftmaxFunction.npz"
    live = check_SoftmaxFunction.evaluate(ref.SoftmaxFunction, record=log)
    data = np.load(log)
    import json

    ops = [e["op"] for e in json.loads(data["__events__"].tobytes().decode())]
    # gradcheck's backward calls; the probes: input unchanged on the first case and on the one holding -inf (each in
    # its dtype, then the other float dtype), grad unchanged by backward (in both float dtypes) and cost
    assert ops.count("vjp") > 20 and ops.count("observe") == 7
    assert check_SoftmaxFunction.evaluate(session=ReplaySession(log)).to_json() == live.to_json()


# =============================================================================== one change to the solution
def _dot(p, g):
    return (g * p).sum(-1, keepdim=True)


MUTANT_LIKE = [
    (check_softmax_jacobian, lambda p: torch.diag_embed(p) - p.unsqueeze(-1) / p.unsqueeze(-2), "p_i / p_j"),
    (check_softmax_jacobian, lambda p: torch.diag_embed(p) + p.unsqueeze(-1) * p.unsqueeze(-2), "outer product added"),
    (check_softmax_jacobian, lambda p: p.unsqueeze(-1) * p.unsqueeze(-2), "outer product alone"),
    (check_softmax_jacobian, lambda p: torch.diag_embed(p) - p.unsqueeze(-1), "outer product missing a factor"),
    (check_softmax_jacobian, lambda p: p.unsqueeze(-2) - p.unsqueeze(-1) * p.unsqueeze(-2), "p for diag(p)"),
    (check_softmax_vjp, lambda p, g: p * (g - (g * p).mean(-1, keepdim=True)), "mean instead of sum"),
    (check_softmax_vjp, lambda p, g: p * (g - (g / p).sum(-1, keepdim=True)), "g / p"),
    (check_softmax_vjp, lambda p, g: p * (g - p.sum(-1, keepdim=True)), "replaced by Σ p"),
    (check_softmax_vjp, lambda p, g: p / (g - _dot(p, g)), "divided by (g − ⟨g, p⟩)"),
    (check_softmax_vjp, lambda p, g: p.clone(), "returned p"),
    (check_softmax_vjp, lambda p, g: p * (g + _dot(p, g)), "sign of the ⟨g, p⟩ term"),
    (check_softmax_vjp, lambda p, g: p * _dot(p, g), "only the − p ⟨g, p⟩ part"),
    # one factor of p_i p_j lost (and the sign slipped): off the diagonal, J changes along one index only
    (check_softmax_jacobian, lambda p: torch.diag_embed(p) - -1 * p.unsqueeze(-2), "changes with j only"),
    (check_softmax_jacobian, lambda p: torch.diag_embed(p) - p.unsqueeze(-1) * -2, "changes with i only"),
]


@pytest.mark.parametrize("check,fn,phrase", MUTANT_LIKE, ids=[f"{c.exercise}-{i}" for i, (c, _, p) in enumerate(MUTANT_LIKE)])
def test_one_change_slips_are_named(check, fn, phrase, rejects):
    rejects(check, fn, phrase)


# =============================================================================== red-team cases (issue 13)
# Answers written outside the course from the docstrings alone; each kind below once got a generic or a
# misleading message (or passed). The checks were fixed in general; these keep them fixed.
def rt_j_flat_outer(p):  # torch.outer flattens: one (B·n)×(B·n) matrix
    flat = p.reshape(-1)
    return torch.diag(flat) - torch.outer(flat, flat)


def rt_j_over_n(p):
    return J_of(p) / p.shape[-1]


def rt_j_rows_only(p):  # a loop over rows: (B, n) only
    return torch.stack([torch.diag(r) - torch.outer(r, r) for r in p])


def rt_j_squeeze(p):
    p = p.squeeze()
    return J_of(p)


def rt_j_clears_s(p):
    J = J_of(p)
    p.zero_()
    return J


def rt_j_second_row_doubled(p):  # right for the first batch entry only
    J = J_of(p)
    return torch.cat([J[:1], 2 * J[1:]]) if J.ndim >= 3 else J


@pytest.mark.parametrize("fn,phrases,absent", [
    (rt_j_flat_outer, ["one Jacobian for the whole batch, flattened"], ["reduction"]),
    (rt_j_over_n, ["off by a factor of 1/n"], []),
    (rt_j_rows_only, ["works on input of shape (2, 5) but raises on (3,)"], []),
    (rt_j_squeeze, ["fails when n = 1, though it worked for n = 3"], ["`dim` argument"]),
    (rt_j_clears_s, ["p changed in place"], []),
    (rt_j_second_row_doubled, ["wrong for some batch entries", "wrong for 1"], []),
    (lambda p: J_of(p).round(decimals=3), ["about 3 digits right"], ["float16"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_softmax_jacobian_red_team(fn, phrases, absent, rejects):
    text = rejects(check_softmax_jacobian, fn, *phrases).text()
    assert not any(a in text for a in absent), text


def rt_j_jacfwd(p):
    n = p.shape[-1]
    rows = p.reshape(-1, n)
    return torch.stack([torch.func.jacfwd(lambda z: torch.softmax(z, -1))(r.log()) for r in rows]).reshape(*p.shape, n)


def test_softmax_jacobian_accepts_jacfwd(accepts):
    accepts(check_softmax_jacobian, rt_j_jacfwd)


def rt_v_dot_not_times_s(p, grad):
    return p * grad - (grad * p).sum(-1, keepdim=True)


def rt_v_ss(p, grad):
    return p * (grad - (p * p).sum(-1, keepdim=True))


def rt_v_bmm(p, grad):  # (B, n) only
    return p * (grad - torch.bmm(grad.unsqueeze(1), p.unsqueeze(2)).squeeze(2))


def rt_v_squeeze(p, grad):
    return (p * (grad - (grad * p).sum(-1, keepdim=True))).squeeze()


@pytest.mark.parametrize("fn,phrases,absent", [
    (rt_v_dot_not_times_s, ["⟨g, p⟩ not multiplied by p"], []),
    (rt_v_ss, ["⟨p, p⟩ for ⟨g, p⟩"], []),
    (rt_v_bmm, ["but raises on (5,)", "handles one number"], ["`dim` argument"]),
    (rt_v_squeeze, ["size-1 axes dropped"], ["keepdim"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_softmax_vjp_red_team(fn, phrases, absent, rejects):
    text = rejects(check_softmax_vjp, fn, *phrases).text()
    assert not any(a in text for a in absent), text


def rt_v_numpy_methods(p, grad):  # NumPy spelling, no type check
    return p * (grad - (grad * p).sum(axis=-1, keepdims=True))


def test_softmax_vjp_accepts_numpy_spelling(accepts):
    accepts(check_softmax_vjp, rt_v_numpy_methods)


def _stable(z):
    e = torch.exp(z - z.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _product(p, g):
    return p * (g - (g * p).sum(-1, keepdim=True))


class RtSavesX(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return _stable(z)

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return _product(p, grad)


class RtSavesE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        e = torch.exp(z - z.amax(-1, keepdim=True))
        ctx.save_for_backward(e)
        return e / e.sum(-1, keepdim=True)

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return _product(p, grad)


class RtNumpyForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        p = _stable(z)
        ctx.save_for_backward(p)
        return p.numpy()

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return _product(p, grad)


class RtNaiveRecompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return _stable(z)

    @staticmethod
    def backward(ctx, grad):
        (z,) = ctx.saved_tensors
        e = torch.exp(z)
        return _product(e / e.sum(-1, keepdim=True), grad)


class RtFloat32Forward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        p = _stable(z.float()).to(z.dtype)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return _product(p, grad)


class RtInPlaceForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        z.sub_(z.amax(-1, keepdim=True)).exp_()
        p = z / z.sum(-1, keepdim=True)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return _product(p, grad)


class RtBmmBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        p = _stable(z)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return p * (grad - torch.bmm(grad.unsqueeze(1), p.unsqueeze(2)).squeeze(2))


class RtFloat32Backward(torch.autograd.Function):  # within gradcheck's tolerance, but float32's 7 digits
    @staticmethod
    def forward(ctx, z):
        p = _stable(z)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return _product(p.float(), grad.float())


class RtInPlaceThroughDouble(torch.autograd.Function):  # .double() of float64 input is the input itself
    @staticmethod
    def forward(ctx, z):
        y = z.double()
        y -= y.amax(-1, keepdim=True)
        p = (y.exp() / y.exp().sum(-1, keepdim=True)).to(z.dtype)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return _product(p, grad)


@pytest.mark.parametrize("cls,phrases,absent", [
    (RtFloat32Backward, ["backward not in float64 precision", "about 7 correct digits"], []),
    (RtInPlaceThroughDouble, ["z changed in place", "returned x itself"], []),
    (RtSavesX, ["z used as p in backward"], []),
    (RtSavesE, ["unnormalised e used as p in backward"], []),
    (RtNumpyForward, ["forward returned a NumPy array"], ["detach"]),
    (RtNaiveRecompute, ["NaN or inf in the gradient", "exponentiating"], []),
    (RtFloat32Forward, ["gradcheck fails: forward not in float64 precision"], []),
    (RtInPlaceForward, ["z changed in place"], []),
    (RtBmmBackward, ["but raises on (5,)"], ["`dim` argument"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_SoftmaxFunction_red_team(cls, phrases, absent, rejects):  # noqa: N802
    text = rejects(check_SoftmaxFunction, cls, *phrases).text()
    assert not any(a in text for a in absent), text


class RtSetupContext(torch.autograd.Function):  # the PyTorch ≥ 2.0 style: forward without ctx
    @staticmethod
    def forward(z):
        return _stable(z)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return _product(p, grad)


class RtCtxAttribute(torch.autograd.Function):  # p kept on ctx, not saved: works for a single backward
    @staticmethod
    def forward(ctx, z):
        ctx.s = _stable(z)
        return ctx.s

    @staticmethod
    def backward(ctx, grad):
        return _product(ctx.s, grad)


@pytest.mark.parametrize("cls", [RtSetupContext, RtCtxAttribute])
def test_SoftmaxFunction_accepts_red_team_alternatives(cls, accepts):  # noqa: N802
    accepts(check_SoftmaxFunction, cls)


# =============================================================================== inputs changed only where they are special
def j_zeros_clamped_in_place(p):  # "no exact zeros": changes p only where it is 0
    p.clamp_(min=1e-12)
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def v_zeros_clamped_in_place(p, g):
    p.clamp_(min=1e-12)
    return p * (g - (g * p).sum(-1, keepdim=True))


def f_infinities_replaced_in_place(z):  # "no infinities": changes z only where it is -inf
    z[z == -INF] = -1e4
    return torch.softmax(z, -1)


@pytest.mark.parametrize("check,fn,phrase", [
    (check_softmax_jacobian, j_zeros_clamped_in_place, "p changed in place"),
    (check_softmax_vjp, v_zeros_clamped_in_place, "p changed in place"),
    (check_SoftmaxFunction, make_function(lambda p, g: p * (g - (g * p).sum(-1, keepdim=True)),
                                          f_infinities_replaced_in_place), "z changed in place"),
], ids=["jacobian", "vjp", "function"])
def test_in_place_changes_of_special_entries_are_caught(check, fn, phrase, rejects):
    result = rejects(check, fn, phrase)
    assert "a copy taken before the call" in result.diagnosis.tried


class SoftmaxWithTrailingNone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        p = torch.softmax(z, dim=-1)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return p * (grad - (grad * p).sum(-1, keepdim=True)), None  # autograd accepts trailing None gradients


def test_function_backward_may_return_a_trailing_none(accepts):
    accepts(check_SoftmaxFunction, SoftmaxWithTrailingNone)


# =============================================================================== audit: named causes
def j_delta_as_one(p):  # p_i (δ_ij − p_j) with δ_ij written as 1
    return p.unsqueeze(-1) * (1 - p.unsqueeze(-2))


def j_delta_as_ones_matrix(p):
    n = p.shape[-1]
    return p.unsqueeze(-1) * (torch.ones(n, n, dtype=p.dtype) - p.unsqueeze(-2))


def j_delta_dropped_in_a_loop(p):
    n = p.shape[-1]
    rows = [torch.stack([p[..., i] - p[..., i] * p[..., j] for j in range(n)], -1) for i in range(n)]
    return torch.stack(rows, -2)


def j_delta_einsum(p):
    return p.unsqueeze(-1) - torch.einsum("...i,...j->...ij", p, p)


@pytest.mark.parametrize("fn", [j_delta_as_one, j_delta_as_ones_matrix, j_delta_dropped_in_a_loop, j_delta_einsum])
def test_jacobian_names_a_delta_replaced_by_one(fn, rejects):
    result = rejects(check_softmax_jacobian, fn, "δ_ij replaced by 1", "p_i (1 − p_j)")
    assert "off-diagonal entries wrong" not in result.text()


def j_eye_minus_p(p):
    eye = torch.eye(p.shape[-1], dtype=p.dtype)
    return p.unsqueeze(-1) * (eye - p.unsqueeze(-2))


def j_where(p):
    eye = torch.eye(p.shape[-1], dtype=torch.bool)
    outer = p.unsqueeze(-1) * p.unsqueeze(-2)
    return torch.where(eye, p.unsqueeze(-1) - outer, -outer)


def j_eye_times_p(p):
    return torch.eye(p.shape[-1], dtype=p.dtype) * p.unsqueeze(-2) - torch.einsum("...i,...j->...ij", p, p)


def j_numpy_kronecker(p):
    return p[..., :, None] * (np.eye(p.shape[-1], dtype=p.dtype) - p[..., None, :])


def j_outer_subtracted_in_place_of_a_new_tensor(p):
    J = torch.diag_embed(p)
    J -= p.unsqueeze(-1) * p.unsqueeze(-2)  # in place on a new tensor, not on p
    return J


@pytest.mark.parametrize("fn", [j_eye_minus_p, j_where, j_eye_times_p, j_numpy_kronecker,
                                j_outer_subtracted_in_place_of_a_new_tensor])
def test_jacobian_accepts_kronecker_forms(fn, accepts):
    accepts(check_softmax_jacobian, fn)


def v_dot_prefix(p, g):  # a size written into the slice: right while n = 5
    return p * (g - (g * p)[..., :5].sum(-1, keepdim=True))


def v_dot_without_first(p, g):
    return p * (g - (g * p)[..., 1:].sum(-1, keepdim=True))


def v_dot_every_other(p, g):
    return p * (g - (g * p)[..., ::2].sum(-1, keepdim=True))


def v_dot_loop_one_short(p, g):
    dot = torch.zeros_like(p[..., :1])
    for j in range(p.shape[-1] - 1):
        dot = dot + g[..., j:j + 1] * p[..., j:j + 1]
    return p * (g - dot)


def v_dot_narrow(p, g):
    return p * (g - (g * p).narrow(-1, 1, p.shape[-1] - 2).sum(-1, keepdim=True))


@pytest.mark.parametrize("fn,phrases", [
    (v_dot_prefix, ["summed over part of each row", "entries 0 to 4 only", "[..., :5]"]),
    (v_dot_without_first, ["summed over part of each row", "entries 1 to 4", "[..., 1:]"]),
    (v_dot_every_other, ["summed over part of each row", "entries 0, 2, 4", "[..., ::2]"]),
    (v_dot_loop_one_short, ["summed over part of each row", "entries 0 to 3", "[..., :4]"]),
    (v_dot_narrow, ["summed over part of each row", "entries 1 to 3", "[..., 1:4]"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_vjp_names_a_partial_dot(fn, phrases, rejects):
    result = rejects(check_softmax_vjp, fn, *phrases)
    assert "rows do not sum to 0" not in result.text()


def test_function_backward_names_a_partial_dot(rejects):
    rejects(check_SoftmaxFunction, make_function(v_dot_prefix), "summed over part of each row", "[..., :5]")


def v_dot_cumsum(p, g):
    return p * (g - (g * p).cumsum(-1)[..., -1:])


def v_dot_full_slice(p, g):
    return p * (g - (g * p)[..., :p.shape[-1]].sum(-1, keepdim=True))


def v_dot_loop(p, g):
    dot = torch.zeros_like(p[..., :1])
    for j in range(p.shape[-1]):
        dot = dot + g[..., j:j + 1] * p[..., j:j + 1]
    return p * (g - dot)


def v_dot_tensordot(p, g):
    return p * (g - (g * p) @ torch.ones(p.shape[-1], 1, dtype=p.dtype))


def v_dot_split_halves(p, g):
    k = p.shape[-1] // 2
    gp = g * p
    return p * (g - gp[..., :k].sum(-1, keepdim=True) - gp[..., k:].sum(-1, keepdim=True))


@pytest.mark.parametrize("fn", [v_dot_cumsum, v_dot_full_slice, v_dot_loop, v_dot_tensordot, v_dot_split_halves])
def test_vjp_accepts_other_ways_to_sum_the_row(fn, accepts):
    accepts(check_softmax_vjp, fn)


def b_sub_then_mul_in_place(p, grad):
    grad.sub_((grad * p).sum(-1, keepdim=True))
    return grad.mul_(p)


def b_augmented_assignment(p, grad):
    grad -= (grad * p).sum(-1, keepdim=True)
    grad *= p
    return grad


def b_in_place_after_double(p, grad):  # grad.double() is grad itself for float64 grads only
    grad = grad.double()
    grad -= (grad * p.double()).sum(-1, keepdim=True)
    return (grad * p).to(p.dtype)


def b_in_place_after_float(p, grad):  # grad.float() is grad itself for float32 grads only
    grad = grad.float()
    grad -= (grad * p.float()).sum(-1, keepdim=True)
    return (grad * p).to(p.dtype)


@pytest.mark.parametrize("bw,where", [(b_sub_then_mul_in_place, "z of shape (5,), float64"),
                                      (b_augmented_assignment, "z of shape (5,), float64"),
                                      (b_in_place_after_double, "z of shape (5,), float64"),
                                      (b_in_place_after_float, "the same values in float32")],
                         ids=lambda v: getattr(v, "__name__", ""))
def test_function_backward_that_overwrites_grad_is_named(bw, where, rejects):
    result = rejects(check_SoftmaxFunction, make_function(bw), "grad changed in place by backward",
                     "other branches of the graph", "grad -= …")
    assert where in result.diagnosis.tried


def b_on_a_clone(p, grad):
    g = grad.clone()
    g -= (g * p).sum(-1, keepdim=True)
    return g.mul_(p)


def b_in_place_on_its_own_difference(p, grad):
    return (grad - (grad * p).sum(-1, keepdim=True)).mul_(p)


def b_out_argument(p, grad):
    out = torch.empty_like(grad)
    torch.mul(p, grad - (grad * p).sum(-1, keepdim=True), out=out)
    return out


def b_rebound_not_in_place(p, grad):
    grad = grad - (grad * p).sum(-1, keepdim=True)  # a new tensor bound to the same name
    grad = grad * p
    return grad


def b_in_place_after_times_one(p, grad):
    g = grad * 1
    g -= (g * p).sum(-1, keepdim=True)
    g *= p
    return g


@pytest.mark.parametrize("bw", [b_on_a_clone, b_in_place_on_its_own_difference, b_out_argument, b_rebound_not_in_place,
                                b_in_place_after_times_one])
def test_function_backward_that_works_on_a_copy_passes(bw, accepts):
    accepts(check_SoftmaxFunction, make_function(bw))


def test_an_overwritten_grad_breaks_a_graph_with_two_branches():
    """Why the check rejects it: y = a + b hands one gradient tensor to both Functions."""
    cls = make_function(b_sub_then_mul_in_place)
    z = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 5, dtype=torch.float64)
    gz, _ = torch.autograd.grad(cls.apply(z) + cls.apply(w), (z, w), g.clone())
    p = torch.softmax(z.detach(), -1)
    assert not torch.allclose(gz, p * (g - (g * p).sum(-1, keepdim=True)))


# =============================================================================== red team: a partial ⟨g, p⟩ is positional
def v_dot_max(p, g):  # a max, not a sum: one entry of g ⊙ p, chosen by value
    return p * (g - (g * p).amax(-1, keepdim=True))


def v_dot_min(p, g):
    return p * (g - (g * p).amin(-1, keepdim=True))


def v_dot_positive_part(p, g):  # the entries chosen by their sign
    return p * (g - (g * p).clamp(min=0).sum(-1, keepdim=True))


def v_dot_at_argmax_p(p, g):
    return p * (g - (g * p).gather(-1, p.argmax(-1, keepdim=True)))


def v_dot_top_two(p, g):
    return p * (g - (g * p).topk(min(2, p.shape[-1]), -1).values.sum(-1, keepdim=True))


def v_dot_large_p_only(p, g):
    return p * (g - torch.where(p > 0.1, g * p, 0).sum(-1, keepdim=True))


@pytest.mark.parametrize("fn", [v_dot_max, v_dot_min, v_dot_positive_part, v_dot_at_argmax_p, v_dot_top_two,
                                v_dot_large_p_only], ids=lambda v: v.__name__)
def test_vjp_does_not_call_a_selection_by_value_a_slice(fn, rejects):
    """Entries chosen by their values fit p ⊙ (g − Σ_S g_j p_j) on one row; on the row rolled by one they move."""
    result = rejects(check_softmax_vjp, fn)
    assert "summed over part" not in result.text() and "slice" not in result.diagnosis.cause


def test_function_backward_does_not_call_a_max_a_slice(rejects):
    result = rejects(check_SoftmaxFunction, make_function(v_dot_max))
    assert "summed over part" not in result.text()


def v_dot_prefix_in_original_order_only(p, g):  # leaves out the last entry, and raises once the row is rolled
    if p.shape == (5,) and bool(p[0] < p[-1]):
        raise ValueError("unexpected order")
    return p * (g - (g * p)[..., :-1].sum(-1, keepdim=True))


def v_dot_prefix_scalar_when_rolled(p, g):  # leaves out the last entry; the rolled row gives a wrong shape
    out = p * (g - (g * p)[..., :-1].sum(-1, keepdim=True))
    return out.sum(-1) if p.shape == (5,) and bool(p[0] < p[-1]) else out


@pytest.mark.parametrize("fn", [v_dot_prefix_in_original_order_only, v_dot_prefix_scalar_when_rolled])
def test_vjp_names_a_partial_dot_only_when_the_rolled_row_confirms_it(fn, rejects):
    result = rejects(check_softmax_vjp, fn)
    assert "summed over part" not in result.text()


# ============================================================================ round 3: a forward off by an epsilon
class SoftmaxWithEpsilonInForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        e = torch.exp(z - z.amax(dim=-1, keepdim=True))
        p = e / (e.sum(dim=-1, keepdim=True) + 1e-7)  # "never divide by 0": gradcheck still passes
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return p * (grad - (grad * p).sum(dim=-1, keepdim=True))


def test_function_forward_off_by_an_epsilon_is_named(rejects):
    rejects(check_SoftmaxFunction, SoftmaxWithEpsilonInForward, "forward not in float64 precision", "correct digits")


class SoftmaxSetupContext(torch.autograd.Function):  # the newer style: forward without ctx, then setup_context
    @staticmethod
    def forward(z):
        return torch.exp(z - torch.logsumexp(z, dim=-1, keepdim=True))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        pg = p * grad
        return pg - p * pg.sum(dim=-1, keepdim=True)


def test_function_in_the_setup_context_style_passes(accepts):
    accepts(check_SoftmaxFunction, SoftmaxSetupContext)

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


def J_of(s):
    return torch.diag_embed(s) - s.unsqueeze(-1) * s.unsqueeze(-2)


# =============================================================================== softmax_jacobian
def j_sign(s):
    return s.unsqueeze(-1) * s.unsqueeze(-2) - torch.diag_embed(s)


def j_inner(s):
    return torch.diag_embed(s) - (s * s).sum(-1)[..., None, None]


def j_inner_matmul(s):  # s @ s.T on a vector is the inner product
    return torch.diag_embed(s) - s @ s if s.ndim == 1 else J_of(s)


def j_only_diag(s):
    return torch.diag_embed(s)


def j_only_outer(s):
    return -(s.unsqueeze(-1) * s.unsqueeze(-2))


def j_diagonal_entries(s):
    return torch.diag_embed(s * (1 - s))


def j_unbatched(s):
    return torch.diag(s) - torch.outer(s, s)


def j_numpy_unbatched(s):
    return np.diag(s) - np.outer(s, s)


def j_batch_summed(s):
    return torch.diag(s) - torch.outer(s, s) if s.ndim == 1 else torch.diag_embed(s).sum(0) - s.T @ s


def j_axes_last(s):
    return J_of(s) if s.ndim == 1 else J_of(s).movedim(0, -1)


def j_axes_middle(s):
    return J_of(s).transpose(0, 1) if s.ndim >= 2 else J_of(s)


def j_s_i_squared(s):
    return torch.diag_embed(s) - (s * s).unsqueeze(-1)


def j_identity(s):
    return torch.eye(s.shape[-1], dtype=s.dtype) - s.unsqueeze(-1) * s.unsqueeze(-2)


def j_softmax_again(s):
    return J_of(torch.softmax(s, -1))


def j_row_loop(s):  # rows of a (B, n) batch one at a time: (B, H, n) breaks
    return torch.diag(s) - torch.outer(s, s) if s.ndim == 1 else torch.stack([torch.diag(r) - torch.outer(r, r) for r in s])


def j_log_softmax(s):
    return torch.eye(s.shape[-1], dtype=s.dtype) - s.unsqueeze(-2)


def j_autograd_whole_batch(s):
    return torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), torch.log(s))


def j_hard_coded_n(s):
    return torch.eye(3, dtype=s.dtype) * s.unsqueeze(-1) - s.unsqueeze(-1) * s.unsqueeze(-2)


def j_double_diagonal(s):
    return 2 * torch.diag_embed(s) - s.unsqueeze(-1) * s.unsqueeze(-2)


def j_half_outer(s):
    return torch.diag_embed(s) - 0.5 * s.unsqueeze(-1) * s.unsqueeze(-2)


def j_first_batch_entry(s):
    J = J_of(s)
    return J[:1].expand_as(J).clone() if J.ndim >= 3 else J


def j_half(s):
    return J_of(s).half()


def j_long(s):
    return J_of(s).long()


JACOBIAN_WRONG = [
    (j_sign, ["sign flipped"]),
    (j_inner, ["sᵀs for s sᵀ", "outer"]),
    (j_inner_matmul, ["sᵀs for s sᵀ"]),
    (j_only_diag, ["− s sᵀ term missing"]),
    (j_only_outer, ["diag(s) term missing"]),
    (j_diagonal_entries, ["only the diagonal"]),
    (j_unbatched, ["worked on inputs with fewer axes", "diag_embed"]),
    (j_numpy_unbatched, ["worked on inputs with fewer axes"]),
    (j_batch_summed, ["outer product over the batch"]),
    (j_axes_last, ["batch axes last"]),
    (j_axes_middle, ["batch axes in the wrong place"]),
    (j_s_i_squared, ["s_i² for s_i s_j"]),
    (j_identity, ["identity for diag(s)"]),
    (j_softmax_again, ["softmax applied to s"]),
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


def j_einsum(s):
    eye = torch.eye(s.shape[-1], dtype=s.dtype)
    return torch.einsum("...i,ij->...ij", s, eye) - torch.einsum("...i,...j->...ij", s, s)


def j_numpy(s):
    return s[..., :, None] * np.eye(s.shape[-1]) - s[..., :, None] * s[..., None, :]


def j_formula(s):  # s_i (δ_ij − s_j)
    return s.unsqueeze(-1) * (torch.eye(s.shape[-1], dtype=s.dtype) - s.unsqueeze(-2))


def j_transposed(s):  # J is symmetric: its transpose is the same matrix
    return J_of(s).transpose(-1, -2)


def j_matmul_outer(s):
    return torch.diag_embed(s) - s.unsqueeze(-1) @ s.unsqueeze(-2)


def j_loop_over_flattened_rows(s):
    flat = s.reshape(-1, s.shape[-1])
    return torch.stack([torch.diag(r) - torch.outer(r, r) for r in flat]).reshape(*s.shape, s.shape[-1])


def j_autograd_per_row(s):
    flat = torch.log(s).reshape(-1, s.shape[-1])
    rows = [torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), r) for r in flat]
    return torch.stack(rows).reshape(*s.shape, s.shape[-1])


def j_vmap(s):
    flat = s.reshape(-1, s.shape[-1])
    return torch.vmap(lambda r: torch.diag(r) - torch.outer(r, r))(flat).reshape(*s.shape, s.shape[-1])


@pytest.mark.parametrize("fn", [j_einsum, j_numpy, j_formula, j_transposed, j_matmul_outer, j_loop_over_flattened_rows,
                                j_autograd_per_row, j_vmap, lambda s: J_of(s.double()), ref.softmax_jacobian])
def test_jacobian_accepts_correct_alternatives(fn, accepts):
    accepts(check_softmax_jacobian, fn)


# =============================================================================== softmax_vjp
def v_missing_dot(s, g):
    return s * g


def v_sign(s, g):
    return s * ((g * s).sum(-1, keepdim=True) - g)


def v_plain_sum(s, g):
    return s * (g - g.sum(-1, keepdim=True))


def v_mean(s, g):
    return s * (g - g.mean(-1, keepdim=True))


def v_no_s(s, g):
    return g - (g * s).sum(-1, keepdim=True)


def v_global_sum(s, g):
    return s * (g - (g * s).sum())


def v_no_keepdim(s, g):
    return s * (g - (g * s).sum(-1))


def v_sum_axis0(s, g):
    return s * (g - (g * s).sum(0, keepdim=True))


def v_per_batch_entry(s, g):  # a loop over the first axis, each entry reduced whole
    if s.ndim == 1:
        return s * (g - (g * s).sum())
    return torch.stack([r * (q - (q * r).sum()) for r, q in zip(s, g)])


def v_via_jacobian(s, g):
    return ref.jacobian_backward(s, g)


def v_via_autograd_jacobian(s, g):
    flat_s, flat_g = s.reshape(-1, s.shape[-1]), g.reshape(-1, s.shape[-1])
    rows = [torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), torch.log(r), vectorize=True) @ q
            for r, q in zip(flat_s, flat_g)]
    return torch.stack(rows).reshape(s.shape)


def v_per_entry_loop(s, g):  # right values, ⟨g, s⟩ recomputed for every entry: O(n²) work
    flat_s, flat_g = s.reshape(-1, s.shape[-1]), g.reshape(-1, s.shape[-1])
    out = torch.empty_like(flat_s)
    for r in range(flat_s.shape[0]):
        for i in range(flat_s.shape[1]):
            out[r, i] = flat_s[r, i] * (flat_g[r, i] - (flat_g[r] * flat_s[r]).sum())
    return out.reshape(s.shape)


def v_diagonal_only(s, g):
    return s * (1 - s) * g


def v_swapped(s, g):
    return g * (s - (g * s).sum(-1, keepdim=True))


def v_grad_unused(s, g):
    return s * (1 - s)


def v_zeros(s, g):
    return torch.zeros_like(s)


def v_grad_unchanged(s, g):
    return g


def v_softmax_again(s, g):
    p = torch.softmax(s, -1)
    return p * (g - (g * p).sum(-1, keepdim=True))


def v_dot_for_vectors_only(s, g):
    return s * (g - torch.dot(g, s))


def v_inner_for_outer(s, g):
    return s * g - (s * s).sum(-1, keepdim=True) * g


def v_half(s, g):
    return (s * (g - (g * s).sum(-1, keepdim=True))).half()


def v_double_dot(s, g):
    return s * (g - 2 * (g * s).sum(-1, keepdim=True))


VJP_WRONG = [
    (v_missing_dot, ["⟨g, s⟩ term missing"]),
    (v_sign, ["sign flipped"]),
    (v_plain_sum, ["plain sum of g"]),
    (v_mean, ["mean of g"]),
    (v_no_s, ["final multiplication by s missing"]),
    (v_global_sum, ["⟨g, s⟩ summed over the whole tensor"]),
    (v_no_keepdim, ["keepdim missing"]),
    (v_sum_axis0, ["⟨g, s⟩ summed along axis 0"]),
    (v_per_batch_entry, ["⟨g, s⟩ summed over a whole batch entry"]),
    (v_via_jacobian, ["O(n²) memory", "(1, 2048, 2048)"]),
    (v_via_autograd_jacobian, ["O(n²) memory"]),
    (v_per_entry_loop, ["n = 2048", "work"]),  # O(n²) work (or, on a very slow machine, stopped at the time limit)
    (v_diagonal_only, ["only the diagonal of J"]),
    (v_swapped, ["s and grad swapped"]),
    (v_grad_unused, ["upstream gradient not used"]),
    (v_zeros, ["upstream gradient not used"]),
    (v_grad_unchanged, ["grad returned unchanged"]),
    (v_softmax_again, ["softmax applied to s"]),
    (v_dot_for_vectors_only, ["worked on inputs with fewer axes"]),
    (v_inner_for_outer, ["sᵀs for s sᵀ"]),
    (v_half, ["result in float16"]),
    (v_double_dot, ["rows do not sum to 0"]),
]


@pytest.mark.parametrize("fn,phrases", VJP_WRONG, ids=[f.__name__ for f, _ in VJP_WRONG])
def test_vjp_names_each_mistake(fn, phrases, rejects):
    rejects(check_softmax_vjp, fn, *phrases)


def v_numpy_jacobian(s, g):  # NumPy only, through J: O(n²) NumPy memory
    J = s[..., :, None] * np.eye(s.shape[-1], dtype=s.dtype) - s[..., :, None] * s[..., None, :]
    return (J @ g[..., :, None])[..., 0]


def test_vjp_numpy_jacobian_is_caught_by_numpy_memory(rejects):
    def numpy_only(s, g):
        if isinstance(s, torch.Tensor):
            raise TypeError("NumPy arrays only")
        return v_numpy_jacobian(s, g)

    result = rejects(check_softmax_vjp, numpy_only, "O(n²) memory", "NumPy")
    assert "MiB" in result.text()


def v_numpy(s, g):
    return s * (g - np.sum(g * s, axis=-1, keepdims=True))


def v_einsum(s, g):
    return s * (g - torch.einsum("...i,...i->...", g, s).unsqueeze(-1))


def v_expanded(s, g):
    return s * g - s * (g * s).sum(-1, keepdim=True)


def v_matmul_dot(s, g):
    return s * (g - (g.unsqueeze(-2) @ s.unsqueeze(-1)).squeeze(-1))


def v_autograd(s, g):
    x = torch.log(s).detach().requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(torch.softmax(x, -1), x, g)
    return grad


def v_vecdot(s, g):
    return s * (g - torch.linalg.vecdot(g, s).unsqueeze(-1))


@pytest.mark.parametrize("fn", [v_numpy, v_einsum, v_expanded, v_matmul_dot, v_autograd, v_vecdot,
                                lambda s, g: ref.softmax_vjp(s.double(), g.double()), ref.softmax_vjp])
def test_vjp_accepts_correct_alternatives(fn, accepts):
    result = accepts(check_softmax_vjp, fn)
    assert f"O(n) at n = {BIG_N}" in result.summary


# =============================================================================== SoftmaxFunction
def make_function(backward_rule, forward_rule=None, save="s"):
    """A SoftmaxFunction whose forward is ``forward_rule`` (default torch.softmax) and whose backward is
    ``backward_rule(s, grad)``; it saves s, or x when ``save="x"`` (recomputing s in backward)."""

    def forward(ctx, x):
        s = forward_rule(x) if forward_rule else torch.softmax(x, -1)
        ctx.save_for_backward(s if save == "s" else x)
        return s

    def backward(ctx, grad):
        (t,) = ctx.saved_tensors
        return backward_rule(t if save == "s" else torch.softmax(t, -1), grad)

    return type("SoftmaxFunction", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def f_naive(x):
    e = torch.exp(x)
    return e / e.sum(-1, keepdim=True)


def f_global_max(x):
    e = torch.exp(x - x.max())
    return e / e.sum(-1, keepdim=True)


class ForwardSavesJ(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        s = torch.softmax(x, -1)
        ctx.save_for_backward(J_of(s))
        return s

    @staticmethod
    def backward(ctx, g):
        (J,) = ctx.saved_tensors
        return (J @ g.unsqueeze(-1)).squeeze(-1)


class SavesNothing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.softmax(x, -1)

    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_tensors
        return s * (g - (g * s).sum(-1, keepdim=True))


class ExitsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.softmax(x, -1)

    @staticmethod
    def backward(ctx, g):
        raise SystemExit(0)


class NotAFunction:
    @staticmethod
    def apply(x):
        return torch.softmax(x, -1)


FUNCTION_WRONG = [
    (make_function(ref.softmax_vjp, f_naive), ["maximum not subtracted"]),
    (make_function(ref.softmax_vjp, f_global_max), ["maximum taken over the whole tensor"]),
    (make_function(ref.softmax_vjp, lambda x: torch.softmax(x, 0)), ["softmax along axis 0"]),
    (make_function(v_missing_dot), ["⟨g, s⟩ term missing"]),
    (make_function(v_sign), ["sign flipped"]),
    (make_function(v_global_sum), ["⟨g, s⟩ summed over the whole tensor"]),
    (make_function(v_no_keepdim), ["keepdim missing"]),
    (make_function(v_grad_unused), ["upstream gradient not used"]),
    (make_function(v_grad_unchanged), ["grad returned unchanged"]),
    (make_function(lambda s, g: None), ["backward returned None"]),
    (make_function(lambda s, g: (torch.diag(s) - torch.outer(s, s)) @ g), ["worked on inputs with fewer axes", "diag_embed"]),
    (make_function(lambda s, g: v_expanded(s, g).sum(-1)), ["shape is not the shape of x"]),
    (make_function(v_half), ["float16 precision"]),
    (make_function(lambda s, g: 2 * ref.softmax_vjp(s, g)), ["off by a factor of 2"]),
    (make_function(ref.jacobian_backward), ["O(n²) memory in your backward"]),
    (make_function(lambda s, g: torch.stack([s[..., i] * (g[..., i] - (g * s).sum(-1)) for i in range(s.shape[-1])], -1)),
     ["O(n²) work in your backward"]),
    (ForwardSavesJ, ["O(n²) memory in your forward"]),
    (SavesNothing, ["did not save s"]),
    (ExitsInBackward, ["SystemExit", "stops programs"]),
    (NotAFunction, ["not a torch.autograd.Function"]),
]


@pytest.mark.parametrize("cls,phrases", FUNCTION_WRONG, ids=[str(i) for i in range(len(FUNCTION_WRONG))])
def test_function_names_each_mistake(cls, phrases, rejects):
    rejects(check_SoftmaxFunction, cls, *phrases)


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


class LogSpaceForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        s = (x - torch.logsumexp(x, -1, keepdim=True)).exp()
        ctx.save_for_backward(s)
        return s

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return s * grad - s * (grad * s).sum(dim=-1, keepdim=True)


def numpy_backward(s, g):
    sn, gn = s.numpy(), g.numpy()
    return torch.from_numpy(sn * (gn - (gn * sn).sum(-1, keepdims=True)))


@pytest.mark.parametrize("cls", [ref.SoftmaxFunction, make_function(ref.softmax_vjp, save="x"), make_function(v_einsum),
                                 make_function(v_expanded, lambda x: torch.nn.functional.softmax(x, dim=-1)),
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
    rejects(check, lambda *a: (_ for _ in ()).throw(Custom("x")), "Custom", "stops programs")
    rejects(check, lambda *a: right(*a)[..., :1], "wrong shape")


def test_function_not_attempted_and_not_a_class(rejects):
    class Unfinished(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            raise NotImplementedError()

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError()

    rejects(check_SoftmaxFunction, Unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_SoftmaxFunction, ref.softmax_fn, "not a class")
    assert check_SoftmaxFunction.evaluate(namespace={}).status is Status.NOT_ATTEMPTED


def test_function_with_unfinished_backward_is_not_attempted_or_named(rejects):
    rejects(check_SoftmaxFunction, make_function(lambda s, g: (_ for _ in ()).throw(NotImplementedError())),
            "NotImplementedError")


# =============================================================================== the cost probes
def test_probe_margins_separate_right_from_wrong_widely():
    g = torch.Generator().manual_seed(0)
    s = torch.softmax(torch.randn(1, BIG_N, generator=g), -1)
    up = torch.randn(1, BIG_N, generator=g)
    right = checks.vjp_cost(ref.softmax_vjp, s, up)
    wrong = checks.vjp_cost(ref.jacobian_backward, s, up)
    assert right["measured"] and wrong["measured"]
    assert 50 * right["largest"] < QUADRATIC and 50 * right["total"] < QUADRATIC  # over 50× below the line
    assert wrong["largest"] >= 8 * QUADRATIC  # 8× above it
    cost = checks.function_cost(ref.SoftmaxFunction, torch.randn(1, BIG_N, generator=g), up)
    assert 50 * cost["backward"]["largest"] < QUADRATIC and 50 * cost["forward"]["largest"] < QUADRATIC


def test_without_torch_function_mode_memory_is_not_measured_but_values_still_checked(monkeypatch, accepts, rejects):
    import torch.overrides

    monkeypatch.delattr(torch.overrides, "TorchFunctionMode")
    assert "memory not measured" in accepts(check_softmax_vjp, ref.softmax_vjp).summary
    assert "memory not measured" in accepts(check_SoftmaxFunction, ref.SoftmaxFunction).summary
    rejects(check_softmax_vjp, v_sign, "sign flipped")


def test_gradcheck_runs_through_learner_operations_only(tmp_path):
    """The grader replays gradcheck from the log: every forward and backward it asked for was recorded."""
    from attn_course.checks.boundary import ReplaySession

    log = tmp_path / "SoftmaxFunction.npz"
    live = check_SoftmaxFunction.evaluate(ref.SoftmaxFunction, record=log)
    data = np.load(log)
    import json

    ops = [e["op"] for e in json.loads(data["__events__"].tobytes().decode())]
    assert ops.count("vjp") > 20 and ops.count("observe") == 2  # gradcheck's backward calls; the input and cost probes
    assert check_SoftmaxFunction.evaluate(session=ReplaySession(log)).to_json() == live.to_json()


# =============================================================================== one change to the solution
def _dot(s, g):
    return (g * s).sum(-1, keepdim=True)


MUTANT_LIKE = [
    (check_softmax_jacobian, lambda s: torch.diag_embed(s) - s.unsqueeze(-1) / s.unsqueeze(-2), "s_i / s_j"),
    (check_softmax_jacobian, lambda s: torch.diag_embed(s) + s.unsqueeze(-1) * s.unsqueeze(-2), "outer product added"),
    (check_softmax_jacobian, lambda s: s.unsqueeze(-1) * s.unsqueeze(-2), "outer product alone"),
    (check_softmax_jacobian, lambda s: torch.diag_embed(s) - s.unsqueeze(-1), "outer product missing a factor"),
    (check_softmax_jacobian, lambda s: s.unsqueeze(-2) - s.unsqueeze(-1) * s.unsqueeze(-2), "s for diag(s)"),
    (check_softmax_vjp, lambda s, g: s * (g - (g * s).mean(-1, keepdim=True)), "mean instead of sum"),
    (check_softmax_vjp, lambda s, g: s * (g - (g / s).sum(-1, keepdim=True)), "g / s"),
    (check_softmax_vjp, lambda s, g: s * (g - s.sum(-1, keepdim=True)), "replaced by Σ s"),
    (check_softmax_vjp, lambda s, g: s / (g - _dot(s, g)), "divided by (g − ⟨g, s⟩)"),
    (check_softmax_vjp, lambda s, g: s.clone(), "returned s"),
    (check_softmax_vjp, lambda s, g: s * (g + _dot(s, g)), "sign of the ⟨g, s⟩ term"),
    (check_softmax_vjp, lambda s, g: s * _dot(s, g), "only the − s ⟨g, s⟩ part"),
]


@pytest.mark.parametrize("check,fn,phrase", MUTANT_LIKE, ids=[f"{c.exercise}-{i}" for i, (c, _, p) in enumerate(MUTANT_LIKE)])
def test_one_change_slips_are_named(check, fn, phrase, rejects):
    rejects(check, fn, phrase)


# =============================================================================== red-team cases (issue 13)
# Answers written outside the course from the docstrings alone; each kind below once got a generic or a
# misleading message (or passed). The checks were fixed in general; these keep them fixed.
def rt_j_flat_outer(s):  # torch.outer flattens: one (B·n)×(B·n) matrix
    flat = s.reshape(-1)
    return torch.diag(flat) - torch.outer(flat, flat)


def rt_j_over_n(s):
    return J_of(s) / s.shape[-1]


def rt_j_rows_only(s):  # a loop over rows: (B, n) only
    return torch.stack([torch.diag(r) - torch.outer(r, r) for r in s])


def rt_j_squeeze(s):
    s = s.squeeze()
    return J_of(s)


def rt_j_clears_s(s):
    J = J_of(s)
    s.zero_()
    return J


@pytest.mark.parametrize("fn,phrases,absent", [
    (rt_j_flat_outer, ["one Jacobian for the whole batch, flattened"], ["reduction"]),
    (rt_j_over_n, ["off by a factor of 1/n"], []),
    (rt_j_rows_only, ["works on input of shape (2, 5) but raises on (3,)"], []),
    (rt_j_squeeze, ["fails when n = 1, though it worked for n = 3"], ["`dim` argument"]),
    (rt_j_clears_s, ["s changed in place"], []),
], ids=lambda v: getattr(v, "__name__", ""))
def test_softmax_jacobian_red_team(fn, phrases, absent, rejects):
    text = rejects(check_softmax_jacobian, fn, *phrases).text()
    assert not any(a in text for a in absent), text


def rt_j_jacfwd(s):
    n = s.shape[-1]
    rows = s.reshape(-1, n)
    return torch.stack([torch.func.jacfwd(lambda z: torch.softmax(z, -1))(r.log()) for r in rows]).reshape(*s.shape, n)


def test_softmax_jacobian_accepts_jacfwd(accepts):
    accepts(check_softmax_jacobian, rt_j_jacfwd)


def rt_v_dot_not_times_s(s, grad):
    return s * grad - (grad * s).sum(-1, keepdim=True)


def rt_v_ss(s, grad):
    return s * (grad - (s * s).sum(-1, keepdim=True))


def rt_v_bmm(s, grad):  # (B, n) only
    return s * (grad - torch.bmm(grad.unsqueeze(1), s.unsqueeze(2)).squeeze(2))


def rt_v_squeeze(s, grad):
    return (s * (grad - (grad * s).sum(-1, keepdim=True))).squeeze()


@pytest.mark.parametrize("fn,phrases,absent", [
    (rt_v_dot_not_times_s, ["⟨g, s⟩ not multiplied by s"], []),
    (rt_v_ss, ["⟨s, s⟩ for ⟨g, s⟩"], []),
    (rt_v_bmm, ["but raises on (5,)", "handles one number"], ["`dim` argument"]),
    (rt_v_squeeze, ["size-1 axes dropped"], ["keepdim"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_softmax_vjp_red_team(fn, phrases, absent, rejects):
    text = rejects(check_softmax_vjp, fn, *phrases).text()
    assert not any(a in text for a in absent), text


def rt_v_numpy_methods(s, grad):  # NumPy spelling, no type check
    return s * (grad - (grad * s).sum(axis=-1, keepdims=True))


def test_softmax_vjp_accepts_numpy_spelling(accepts):
    accepts(check_softmax_vjp, rt_v_numpy_methods)


def _stable(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _product(s, g):
    return s * (g - (g * s).sum(-1, keepdim=True))


class RtSavesX(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _stable(x)

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return _product(s, grad)


class RtSavesE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        ctx.save_for_backward(e)
        return e / e.sum(-1, keepdim=True)

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return _product(s, grad)


class RtNumpyForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        s = _stable(x)
        ctx.save_for_backward(s)
        return s.numpy()

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return _product(s, grad)


class RtNaiveRecompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _stable(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        e = torch.exp(x)
        return _product(e / e.sum(-1, keepdim=True), grad)


class RtFloat32Forward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        s = _stable(x.float()).to(x.dtype)
        ctx.save_for_backward(s)
        return s

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return _product(s, grad)


class RtInPlaceForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.sub_(x.amax(-1, keepdim=True)).exp_()
        s = x / x.sum(-1, keepdim=True)
        ctx.save_for_backward(s)
        return s

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return _product(s, grad)


class RtBmmBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        s = _stable(x)
        ctx.save_for_backward(s)
        return s

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return s * (grad - torch.bmm(grad.unsqueeze(1), s.unsqueeze(2)).squeeze(2))


@pytest.mark.parametrize("cls,phrases,absent", [
    (RtSavesX, ["x used as s in backward"], []),
    (RtSavesE, ["unnormalised e used as s in backward"], []),
    (RtNumpyForward, ["forward returned a NumPy array"], ["detach"]),
    (RtNaiveRecompute, ["NaN or inf in the gradient", "exponentiating"], []),
    (RtFloat32Forward, ["gradcheck fails: forward not in float64 precision"], []),
    (RtInPlaceForward, ["x changed in place"], []),
    (RtBmmBackward, ["but raises on (5,)"], ["`dim` argument"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_SoftmaxFunction_red_team(cls, phrases, absent, rejects):  # noqa: N802
    text = rejects(check_SoftmaxFunction, cls, *phrases).text()
    assert not any(a in text for a in absent), text


class RtSetupContext(torch.autograd.Function):  # the PyTorch ≥ 2.0 style: forward without ctx
    @staticmethod
    def forward(x):
        return _stable(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return _product(s, grad)


class RtCtxAttribute(torch.autograd.Function):  # s kept on ctx, not saved: works for a single backward
    @staticmethod
    def forward(ctx, x):
        ctx.s = _stable(x)
        return ctx.s

    @staticmethod
    def backward(ctx, grad):
        return _product(ctx.s, grad)


@pytest.mark.parametrize("cls", [RtSetupContext, RtCtxAttribute])
def test_SoftmaxFunction_accepts_red_team_alternatives(cls, accepts):  # noqa: N802
    accepts(check_SoftmaxFunction, cls)

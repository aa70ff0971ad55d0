"""The softmax_jacobian and softmax_vjp checks: each one's table of known mistakes, what a wrong answer breaks
(the diagonal, symmetry, rows summing to 0) and its check. SoftmaxFunction's backward reuses the VJP's table."""

from __future__ import annotations

from typing import Callable

import torch

from .. import kit
from ..compare import Failure
from ..core import Learner, LearnerRaised, as_tensor, check, fail, fmt
from .cases import (INF, describe, judge_cases, jacobian_cases, oracle_jacobian, oracle_vjp, probs, unchanged_cases,
                    vjp_cases)
from .probes import BIG_N, observe, quadratic

_J = "J = diag(p) − p pᵀ: torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)"
VJP_CODE = "p * (grad - (grad * p).sum(-1, keepdim=True))"
_OUTER = "the outer product: p.unsqueeze(-1) * p.unsqueeze(-2)"


# ============================================================================ softmax_jacobian
_jac = lambda p: torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # noqa: E731 - J = diag(p) − p pᵀ


def _batch_moved(p: torch.Tensor, where: Callable[[list[int], int], list[int]]) -> torch.Tensor | None:
    batch = list(range(p.ndim - 1))
    return _jac(p).movedim(batch, where(batch, p.ndim + 1)) if p.ndim >= 2 else None


_INNER = ("pᵀp for p pᵀ", "you subtracted the inner product pᵀp = Σ p_i² (one number) where J needs the outer product "
          "p pᵀ (an n×n matrix with entries p_i p_j)", _OUTER)
_BATCH = "batch axes first, the two Jacobian axes last: J[..., i, j] = ∂p_i/∂z_j"
K = kit.Known
JACOBIAN = [
    K("sign", "sign flipped", "your J is p pᵀ − diag(p), the negative of diag(p) − p pᵀ (its diagonal p_i(1 − p_i) must "
      "be positive)", _J, lambda p: -_jac(p)),
    K("inner", *_INNER, lambda p: torch.diag_embed(p) - (p * p).sum(-1)[..., None, None]),
    K("inner-all", *_INNER, lambda p: torch.diag_embed(p) - (p * p).sum()),
    K("no-outer", "− p pᵀ term missing", "you returned diag(p) alone: off the diagonal, ∂p_i/∂z_j = −p_i p_j, not 0", _J,
      lambda p: torch.diag_embed(p)),
    K("no-diag", "diag(p) term missing", "you returned −p pᵀ alone: the diagonal entries are p_i − p_i², not −p_i²", _J,
      lambda p: -p.unsqueeze(-1) * p.unsqueeze(-2)),
    K("delta-one", "δ_ij replaced by 1", "you wrote p_i (1 − p_j) where J[i, j] = p_i (δ_ij − p_j): δ_ij is 1 on the "
      "diagonal only (torch.eye), so your diagonal is right and every entry off it is p_i too large", _J,
      lambda p: p.unsqueeze(-1) * (1 - p.unsqueeze(-2))),
    K("diagonal", "only the diagonal", "you returned only the diagonal entries p_i(1 − p_i): the off-diagonal entries "
      "−p_i p_j are missing", _J, lambda p: torch.diag_embed(p * (1 - p))),
    K("pi2", "p_i² for p_i p_j", "you subtracted p_i² in row i (p ⊙ p broadcast along the rows), not the outer product "
      "p_i p_j", _OUTER, lambda p: torch.diag_embed(p) - (p * p).unsqueeze(-1)),
    K("pj2", "p_j² for p_i p_j", "you subtracted p_j² in column j, not the outer product p_i p_j", _OUTER,
      lambda p: torch.diag_embed(p) - (p * p).unsqueeze(-2)),
    K("ratio", "p_i / p_j for p_i p_j", "you divided where the outer product multiplies: p_i / p_j", _J,
      lambda p: torch.diag_embed(p) - p.unsqueeze(-1) / p.unsqueeze(-2)),
    *[K(key, "outer product missing a factor", f"you subtracted {factor} (p broadcast along one axis), not the outer "
        "product p_i p_j", _OUTER, lambda p, axis=axis: torch.diag_embed(p) - p.unsqueeze(axis))
      for key, factor, axis in (("pi", "p_i", -1), ("pj", "p_j", -2))],
    K("p-for-diag", "p for diag(p)", "you subtracted the outer product from the vector p, which broadcasts along the "
      "rows, where J needs the diagonal matrix diag(p)", "torch.diag_embed(p) builds diag(p) for any leading axes",
      lambda p: p.unsqueeze(-2) - p.unsqueeze(-1) * p.unsqueeze(-2)),
    K("added", "outer product added", "you added p pᵀ to diag(p); J subtracts it", _J,
      lambda p: torch.diag_embed(p) + p.unsqueeze(-1) * p.unsqueeze(-2)),
    K("outer", "outer product alone", "you returned p pᵀ alone", _J, lambda p: p.unsqueeze(-1) * p.unsqueeze(-2)),
    K("identity", "identity for diag(p)", "you used the identity matrix where J has diag(p)", _J,
      lambda p: torch.eye(p.shape[-1], dtype=p.dtype) - p.unsqueeze(-1) * p.unsqueeze(-2)),
    K("log-softmax", "Jacobian of log-softmax", "you returned I − 1 pᵀ, the Jacobian of log-softmax; softmax's is "
      "diag(p) − p pᵀ", _J,
      lambda p: torch.eye(p.shape[-1], dtype=p.dtype) - p.unsqueeze(-2).expand(*p.shape, p.shape[-1])),
    K("softmax-again", "softmax applied to p", "you took the softmax of p again: p is already the softmax output, and J "
      "is written in terms of it", "use p as it is: " + _J, lambda p: _jac(torch.softmax(p, -1))),
    K("batch-summed", "outer product over the batch", "you multiplied pᵀ @ p over a (B, n) tensor, which sums the outer "
      "products of all rows into one n×n matrix", "one matrix per row: p.unsqueeze(-1) * p.unsqueeze(-2)",
      lambda p: torch.diag_embed(p).sum(0) - p.T @ p if p.ndim == 2 else None),
    K("flattened", "one Jacobian for the whole batch, flattened", "torch.outer and np.outer flatten their inputs, so your "
      "J treats the whole batch as one long vector: one (B·n)×(B·n) matrix", "one n×n matrix per row: " + _J,
      lambda p: _jac(p.reshape(-1)) if p.ndim >= 2 else None),
    K("batch-last", "batch axes last", "your J has the batch axes after the two Jacobian axes", _BATCH,
      lambda p: _batch_moved(p, lambda b, nd: [nd - len(b) + k for k in b])),
    K("batch-middle", "batch axes in the wrong place", "your J has a batch axis between the two Jacobian axes", _BATCH,
      lambda p: _batch_moved(p, lambda b, nd: [k + 1 for k in b])),
    K("across-batch", "Jacobian across the batch", "you differentiated the whole (B, n) batch at once: that is a "
      "(B, n, B, n) array, most of it zeros between different rows", "one n×n matrix per row: " + _J,
      lambda p: torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), torch.log(p.double()))
      if p.ndim == 2 else None),
]


def _explain_jacobian(out: torch.Tensor, case: tuple, tried: str) -> None:
    """Which property of J = diag(p) − p pᵀ the answer breaks (same shape, no known mistake)."""
    (p,), a = case, out.detach().double()
    if not torch.isfinite(a).all():
        return
    e, eye, n = _jac(p.double()), torch.eye(p.shape[-1], dtype=torch.bool), p.shape[-1]
    close = torch.isclose(a, e, atol=1e-6, rtol=1e-4)
    diag_ok, off_ok = bool(close[..., eye].all()), bool(close[..., ~eye].all())
    if diag_ok and not off_ok:
        fail("off-diagonal entries wrong", tried=tried, got="the diagonal of your J is right, the entries off it are not",
             expected="J[i, j] = −p_i p_j for i ≠ j", fix=_J)
    if off_ok and not diag_ok:
        fail("diagonal wrong", tried=tried, got="the entries off the diagonal are right, the diagonal is not",
             expected="J[i, i] = p_i (1 − p_i)", fix=_J)
    for axis, index, other in ((-2, "j", "column"), (-1, "i", "row")):  # off the diagonal, one index only
        spread = lambda m: m.masked_fill(eye, -INF).amax(axis) - m.masked_fill(eye, INF).amin(axis)  # noqa: E731
        if n >= 3 and float(spread(a).abs().max()) <= 1e-9 and float(spread(e).abs().max()) > 1e-6:
            fail("off-diagonal entries depend on one index only", tried=tried, expected="J[i, j] = −p_i p_j for i ≠ j",
                 got=f"off the diagonal, your J[i, j] changes with {index} only: each {other} holds one value",
                 cause="the term you subtract from diag(p) holds one factor of p_i p_j (p broadcast along one axis, "
                       "perhaps times a constant), not the outer product", fix=_J)
    if not torch.allclose(a, a.transpose(-1, -2), atol=1e-6):
        fail("J not symmetric", tried=tried, expected="a symmetric J: J[i, j] = J[j, i] = −p_i p_j off the diagonal",
             got=f"your J differs from its transpose (by up to {fmt(float((a - a.mT).abs().max()))})", fix=_J)
    if not torch.allclose(rows := a.sum(-1), torch.zeros_like(rows), atol=1e-6):
        fail("rows of J do not sum to 0", tried=tried, got=f"rows of your J sum to {fmt(float(rows.min()))} … "
             f"{fmt(float(rows.max()))}", expected="every row summing to 0 (Σ_i p_i = 1 whatever z is)", fix=_J)


@check("softmax_jacobian", expects="a function softmax_jacobian(p) returning J of shape (..., n, n)")
def check_softmax_jacobian(fn: Learner) -> str:
    run, cases = kit.TensorOrArray(fn), jacobian_cases()
    judge_cases(cases, lambda case, said: as_tensor(run(*case), tried=said), oracle=oracle_jacobian, table=JACOBIAN,
                tried=lambda c: f"softmax_jacobian(p) on {describe(c[0], 'p')}", expected="J of shape (..., n, n)",
                signature="softmax_jacobian(p)", reductions=False,
                explain=_explain_jacobian, what="your J", again=run.tensor, factors=True,
                shape_fix=lambda case, passed: "one n×n matrix per row of p: J has shape (*p.shape, n)" + (
                    "; use operations that work for any leading axes: torch.diag_embed(p) (torch.diag on a 2-D tensor "
                    "extracts a diagonal instead of building one) and p.unsqueeze(-1) * p.unsqueeze(-2) (torch.outer "
                    "and np.outer flatten their inputs)" if case[0].ndim > max((c[0].ndim for c in passed), default=0)
                    >= 1 else ""))
    for case in unchanged_cases(cases, lambda p: bool((p == 0).any())):  # p.clamp_(min=…) changes only exact zeros
        kit.expect_unchanged(fn, case, call="softmax_jacobian(p)", name="p", shown=describe(case[0], "p"),
                             numpy=run.mode == "numpy")
    return f"matches torch.autograd.functional.jacobian on {len(cases)} cases ({run.kind}): (n,), (B, n), (B, A, n), " \
           "n = 1, saturated"


# ============================================================================ softmax_vjp
dot = lambda p, g: (g * p).sum(-1, keepdim=True)  # noqa: E731 - ⟨g, p⟩ per row, kept
grad_atol = lambda case: 1e-6 * max(1.0, float(case[1].abs().max()))  # noqa: E731 - scales with the upstream grad
_VJP_FIX = f"∂ℒ/∂z = p ⊙ (g − ⟨g, p⟩): {VJP_CODE}"
_PER_ROW = "sum along the last axis only: (grad * p).sum(-1, keepdim=True)"
_UNUSED = "upstream gradient not used"
VJP = [
    K("unchanged", "grad returned unchanged", "you returned the upstream gradient as it is: the gradient with respect to "
      "the scores is grad multiplied by the softmax Jacobian", _VJP_FIX, lambda p, g: g.clone()),
    K("no-dot", "⟨g, p⟩ term missing", "you returned p ⊙ g, only the diagonal part of the product: the − p ⟨g, p⟩ term "
      "is missing", _VJP_FIX, lambda p, g: p * g),
    K("sign", "sign flipped", "you returned p ⊙ (⟨g, p⟩ − g), the negative of the gradient", _VJP_FIX,
      lambda p, g: p * (dot(p, g) - g)),
    K("no-p", "final multiplication by p missing", "you returned g − ⟨g, p⟩ without multiplying by p", _VJP_FIX,
      lambda p, g: g - dot(p, g)),
    K("plain-sum", "plain sum of g", "you subtracted the plain sum Σ_j g_j; the term is the p-weighted sum ⟨g, p⟩ = "
      "Σ_j g_j p_j", _VJP_FIX, lambda p, g: p * (g - g.sum(-1, keepdim=True))),
    K("mean-g", "mean of g", "you subtracted the mean of g; the term is the p-weighted sum ⟨g, p⟩ = Σ_j g_j p_j", _VJP_FIX,
      lambda p, g: p * (g - g.mean(-1, keepdim=True))),
    K("whole-sum", "⟨g, p⟩ summed over the whole tensor", "you summed g ⊙ p over the whole tensor, not per row, so every "
      "row gets the same ⟨g, p⟩", _PER_ROW, lambda p, g: p * (g - (g * p).sum())),
    K("keepdim", "keepdim missing", "you reduced ⟨g, p⟩ without keepdim=True, so it broadcast along the wrong axis (each "
      "row got another row's sum)", "(grad * p).sum(-1, keepdim=True)", lambda p, g: p * (g - (g * p).sum(-1))),
    K("diagonal", "only the diagonal of J", "you multiplied g by the diagonal of J, p ⊙ (1 − p), leaving out the "
      "off-diagonal −p_i p_j", _VJP_FIX, lambda p, g: p * (1 - p) * g),
    K("swapped", "p and grad swapped", "you used grad where the formula has p and p where it has grad", _VJP_FIX,
      lambda p, g: g * (p - dot(p, g))),
    K("mean-dot", "mean instead of sum for ⟨g, p⟩", "you took the mean of g ⊙ p; ⟨g, p⟩ is its sum", _VJP_FIX,
      lambda p, g: p * (g - (g * p).mean(-1, keepdim=True))),
    K("g-over-p", "g / p for g ⊙ p", "you divided grad by p inside ⟨g, p⟩; it is the sum of the products g_j p_j",
      _VJP_FIX, lambda p, g: p * (g - (g / p).sum(-1, keepdim=True))),
    K("sum-p", "⟨g, p⟩ replaced by Σ p", "you summed p alone (which is 1) where ⟨g, p⟩ sums g ⊙ p", _VJP_FIX,
      lambda p, g: p * (g - p.sum(-1, keepdim=True))),
    K("divided", "divided by (g − ⟨g, p⟩)", "you divided p by (g − ⟨g, p⟩); the two are multiplied", _VJP_FIX,
      lambda p, g: p / (g - dot(p, g))),
    K("p", "returned p", "you returned p itself", _VJP_FIX, lambda p, g: p.clone()),
    K("plus-dot", "sign of the ⟨g, p⟩ term", "you added ⟨g, p⟩; the formula subtracts it", _VJP_FIX,
      lambda p, g: p * (g + dot(p, g))),
    K("only-dot", "only the − p ⟨g, p⟩ part", "you returned p ⊙ ⟨g, p⟩: the p ⊙ g part is missing", _VJP_FIX,
      lambda p, g: p * dot(p, g)),
    K("zeros", _UNUSED, "your result is J·1, the product with a vector of ones (which is 0), not with grad", _VJP_FIX,
      lambda p, g: torch.zeros_like(p)),
    K("diag-of-J", _UNUSED, "your result is the diagonal of J, p ⊙ (1 − p): grad does not enter it", _VJP_FIX,
      lambda p, g: p * (1 - p)),
    K("softmax-again", "softmax applied to p", "you took the softmax of p again: p is already the softmax output",
      "use p as it is: " + VJP_CODE, lambda p, g: torch.softmax(p, -1) * (g - dot(torch.softmax(p, -1), g))),
    K("inner", "pᵀp for p pᵀ", "you used J = diag(p) − pᵀp (one number) in place of the outer product p pᵀ", _VJP_FIX,
      lambda p, g: p * g - (p * p).sum(-1, keepdim=True) * g),
    K("dot-not-times-p", "⟨g, p⟩ not multiplied by p", "you returned p ⊙ g − ⟨g, p⟩: the ⟨g, p⟩ term must be multiplied "
      "by p too, p ⊙ g − p ⟨g, p⟩", _VJP_FIX, lambda p, g: p * g - dot(p, g)),
    K("pp", "⟨p, p⟩ for ⟨g, p⟩", "you subtracted ⟨p, p⟩ = Σ p_j² where the formula has ⟨g, p⟩ = Σ g_j p_j", _VJP_FIX,
      lambda p, g: p * (g - (p * p).sum(-1, keepdim=True))),
    K("gg", "⟨g, g⟩ for ⟨g, p⟩", "you subtracted ⟨g, g⟩ = Σ g_j² where the formula has ⟨g, p⟩ = Σ g_j p_j", _VJP_FIX,
      lambda p, g: p * (g - (g * g).sum(-1, keepdim=True))),
    K("per-entry", "⟨g, p⟩ summed over a whole batch entry", "you summed g ⊙ p over each batch entry (a loop over the "
      "first axis?), not over each row", _PER_ROW,
      lambda p, g: p * (g - (g * p).flatten(1).sum(1).reshape(-1, *[1] * (p.ndim - 1))) if p.ndim >= 3 else None),
] + [K(f"axis-{o}", f"⟨g, p⟩ summed along axis {o}", f"you summed g ⊙ p along axis {o}; ⟨g, p⟩ is the sum along the last "
       "axis, one number per row", "(grad * p).sum(-1, keepdim=True)",
       lambda p, g, o=o: p * (g - (g * p).sum(o, keepdim=True)) if o < p.ndim - 1 else None) for o in range(3)]


def explain_vjp(out: torch.Tensor, case: tuple, tried: str, z: torch.Tensor | None = None,
                again: Callable | None = None) -> None:
    """What is wrong with a gradient no known mistake reproduces. ``z``: the scores, when the answer is a Function's
    backward (whose forward has already passed every case, ±1000 included). ``again(x, g)``: the answer once more on
    other inputs (x is p, or z for a Function), which a partial ⟨g, p⟩ must confirm."""
    a = out.detach().double()
    if not torch.isfinite(a).all():
        cause = ""
        if z is not None:
            top, limit = z.double().masked_fill(~torch.isfinite(z), -INF).amax(-1), kit.exp_limits(z.dtype)[0]
            if bool((top[(~torch.isfinite(a)).any(-1)] > limit).all()):
                cause = (f"those rows hold scores above {limit:.2f}, where e^z overflows in "
                         f"{str(z.dtype).replace('torch.', '')}; your forward handles them (it passed the cases at "
                         "±1000), so your backward must be exponentiating z again without subtracting the maximum")
        fail("NaN or inf in the gradient", tried=tried, got=f"{int((~torch.isfinite(a)).sum())} entries are NaN or inf",
             expected="finite gradients (p and grad are finite)", cause=cause,
             fix="save p in forward and use it in backward (or recompute it stably, with the maximum subtracted)"
             if cause else f"compute {VJP_CODE}: no division, no log")
    p = case[0].double() if z is None else torch.softmax(z.double(), -1)
    if (part := _partial_dot(a, p, case[1].double(), grad_atol(case), case, again, z is not None)) is not None:
        n, shown, code = p.shape[-1], *part
        fail("⟨g, p⟩ summed over part of each row", tried=tried, got=f"your result is p ⊙ (g − s) with s the sum of "
             f"g_j p_j over {shown} only, of the {n} in each row", expected="⟨g, p⟩ summed over every entry of the row",
             cause=f"your ⟨g, p⟩ leaves out part of the row ({code}?): a slice or a size written into your code",
             fix="sum over the whole last axis, with no slice: (grad * p).sum(-1, keepdim=True)")
    if not torch.allclose(sums := a.sum(-1), torch.zeros_like(sums), atol=grad_atol(case)):
        fail("rows do not sum to 0", tried=tried, got=f"rows of your result sum to {fmt(float(sums.min()))} … "
             f"{fmt(float(sums.max()))}",
             expected="every row summing to 0 (Σ_i p_i (g_i − ⟨g, p⟩) = ⟨g, p⟩ − ⟨g, p⟩ = 0)",
             fix=_VJP_FIX)


def _fits(a: torch.Tensor, p: torch.Tensor, g: torch.Tensor, taken: torch.Tensor, atol: float) -> torch.Tensor:
    """Which sets S (rows of ``taken``) make ``a`` = p ⊙ (g − Σ_{j∈S} g_j p_j) in every row."""
    made = p.unsqueeze(-2) * (g.unsqueeze(-2) - ((g * p) @ taken.T).unsqueeze(-1))  # (..., S, n)
    return torch.isclose(made, a.unsqueeze(-2), atol=atol, rtol=1e-4).all(-1).reshape(-1, taken.shape[0]).all(0)


def _rolled_fits(case: tuple, again: Callable, scores: bool, taken: torch.Tensor, atol: float) -> torch.Tensor | None:
    """The sets that fit the answer on the case with its last axis rolled by one: a slice or a size takes the same
    positions there, a selection by value (a max, a top-k, a sign) the moved ones. ``scores``: the case holds z, not p.
    None: no answer to confirm with."""
    x, g = (torch.roll(t, 1, -1) for t in case)
    try:
        a = as_tensor(again(x, g), tried="").detach().double()
    except (LearnerRaised, Failure):
        return None
    p = torch.softmax(x.double(), -1) if scores else x.double()
    return _fits(a, p, g.double(), taken, atol) if a.shape == x.shape else None


def _partial_dot(a: torch.Tensor, p: torch.Tensor, g: torch.Tensor, atol: float, case: tuple = (),
                 again: Callable | None = None, scores: bool = False) -> tuple[str, str] | None:
    """(which entries, a slice that takes them) when ``a`` is p ⊙ (g − Σ_{j∈S} g_j p_j) in every row, for one proper,
    non-empty set S of the last axis's entries (every such S up to n = 10, contiguous ones beyond), and the same S
    fits ``again`` on the case rolled along the last axis (positions, not values, chose S), else None."""
    n = p.shape[-1]
    spans = [list(range(i, j)) for i in range(n) for j in range(i + 1, n + 1) if j - i < n]
    sets = spans + ([[k for k in range(n) if m >> k & 1] for m in range(1, 2 ** n - 1)] if n <= 10 else [])
    if not sets or again is None:
        return None
    taken = torch.tensor([[k in s for k in range(n)] for s in sets], dtype=torch.float64)  # (S, n)
    fits = _fits(a, p, g, taken, atol)
    if not fits.any() or (rolled := _rolled_fits(case, again, scores, taken, atol)) is None:
        return None
    if not (fits := fits & rolled).any():
        return None
    s = sets[int(fits.nonzero()[0])]  # a contiguous set first (the spans come first)
    step = s[1] - s[0] if len(s) > 1 else 1
    if len(s) == 1:
        return f"entry {s[0]}", f"[..., {s[0]}]"
    if s != list(range(s[0], s[-1] + 1, step)):
        return f"entries {', '.join(map(str, s))}", f"[..., [{', '.join(map(str, s))}]]"
    bounds = f"{s[0] or ''}:{s[-1] + 1 if s[-1] + step < n else ''}"
    code = f"[..., {bounds}{f':{step}' if step > 1 else ''}]"
    return (f"entries {s[0]} to {s[-1]}" if step == 1 else f"entries {', '.join(map(str, s))}"), code


@check("softmax_vjp", expects="a function softmax_vjp(p, grad) returning ∂ℒ/∂z shaped like p")
def check_softmax_vjp(fn: Learner) -> str:
    run, cases = kit.TensorOrArray(fn), vjp_cases()
    judge_cases(cases, lambda case, said: as_tensor(run(*case), tried=said), oracle=oracle_vjp, table=VJP,
                tried=lambda c: f"softmax_vjp(p, grad) on {describe(c[0], 'p')} and {describe(c[1], 'grad')}",
                expected="∂ℒ/∂z shaped like p", atol=grad_atol, again=run.tensor,
                explain=lambda o, case, said: explain_vjp(o, case, said, again=run.tensor),
                signature="softmax_vjp(p, grad)", shape_fix="∂ℒ/∂z has the shape of p")
    for case in unchanged_cases(cases, lambda p: bool((p == 0).any())):
        kit.expect_unchanged(fn, case, call="softmax_vjp(p, grad)", name="p", shown=describe(case[0], "p"),
                             numpy=run.mode == "numpy", others=("grad",))
    gen = torch.Generator().manual_seed(80)
    big = (probs(gen, 1, BIG_N, dtype=torch.float32), torch.randn(1, BIG_N, generator=gen))
    tried = f"softmax_vjp(p, grad) on p and grad of shape (1, {BIG_N}), float32, watching what it creates"
    cost = observe(fn, tried, "∂ℒ/∂z in O(n)", "your function", "softmax_vjp_cost", *big, run.mode == "numpy")
    quadratic(cost, "your softmax_vjp", tried, fix=f"do not form J: {VJP_CODE}")
    memory = f"O(n) at n = {BIG_N}" if cost.get("measured") else "memory not measured"
    return f"matches autograd on {len(cases)} cases ({run.kind}): (n,) to (B, A, n), n = 1, grads of ±1000; {memory}"

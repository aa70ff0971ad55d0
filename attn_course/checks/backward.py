"""Checks for notebook 10 (attention's backward pass): attention_backward, AttentionFunction,
tiled_attention_backward.

The oracle is PyTorch: autograd through ``F.scaled_dot_product_attention`` in float64 (which, from
PyTorch 2.5 on, gives a fully masked row a zero output and zero gradients, the course's convention).

Each check runs the learner's code on cases that vary every argument (mask or none, causal or not,
block sizes that do and do not divide n_q and n_k, batch and head axes, d_k ≠ d_v, axes of size 1, float32
and float64, scores and upstream gradients far from 1). When an answer is wrong, the check replays
the known mistakes — written below as small variants of the reference, each with one bug — and
names the one whose three gradients the answer reproduces; when none does, it measures how the
gradient differs (a constant factor, rows from some index on, NaN…) and says only that.

What outputs cannot show is measured on the learner's side, by the probe :func:`_watch_probe`
(``learner.observe("backward.watch", …)``): the largest tensor the code creates (an n × n score
matrix, or a full-size mask), the matrix-multiply FLOPs it does (are the causal tiles above the
diagonal skipped?), the size of the tiles it exponentiates (is ``block_size`` used?), and whether it
calls autograd or a fused attention. Only plain numbers and names come back.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from ..softmax import masked_softmax
from .boundary import probe
from .compare import Failure, Mistake, as_tensor, describe_mismatch, expect_close, expect_shape, fail, same
from .core import Learner, LearnerRaised, check, learner_error

__all__ = ["check_attention_backward", "check_AttentionFunction", "check_tiled_attention_backward"]

NAMES = ("dq", "dk", "dv")
_SHAPE_FIX = {"dq": "dq has q's shape (..., n_q, d_k): dQ = dS K/√d_k", "dk": "dk has k's shape (..., n_k, d_k): dK = dSᵀ Q/√d_k",
              "dv": "dv has v's shape (..., n_k, d_v): dV = Pᵀ dO"}
INF = float("inf")


# ============================================================================ the learner-side probe
#: Functions whose use a check reports: autograd (the exercise is the chain rule by hand) and fused attention.
_WATCHED = {"grad": "torch.autograd.grad", "backward": ".backward()", "vjp": "a vector–Jacobian product from "
            "torch.func / torch.autograd.functional", "jacobian": "torch.autograd.functional.jacobian",
            "scaled_dot_product_attention": "F.scaled_dot_product_attention"}


_MATMULS = {"matmul", "__matmul__", "__rmatmul__", "mm", "bmm"}


class _Watch(TorchFunctionMode):
    """Sees every torch function the learner's Python code calls: the largest tensor storage created,
    the names of watched functions, what went through exp, and the multiply-adds of matrix products."""

    def __init__(self) -> None:
        super().__init__()
        self.largest, self.shape = 0, ()
        self.calls: set[str] = set()
        self.exp_elements, self.exp_tile, self.flops, self.elements = 0, (), 0, 0
        self.zero_tiles = 0  # exponentiated tiles that came out all zero: every score in them was masked

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name in _WATCHED:
            self.calls.add(name)
        if name in _MATMULS and isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
            self.flops += 2 * out.numel() * int(args[0].shape[-1])
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.elements += t.numel()
                try:
                    size = t.untyped_storage().nbytes() // max(t.element_size(), 1)
                except Exception:  # noqa: BLE001 - tensors without storage: count their elements
                    size = t.numel()
                if size > self.largest:
                    self.largest, self.shape = size, tuple(t.shape)
                if name in ("exp", "exp_", "exp2", "exp2_") and t.dim() >= 2:
                    self.exp_elements += t.numel()
                    if t.shape[-2] * t.shape[-1] > math.prod(self.exp_tile or (0,)):
                        self.exp_tile = tuple(t.shape[-2:])
                    if t.shape[-2] > 1 and t.shape[-1] > 1 and not bool(t.any()):
                        self.zero_tiles += 1
        return out


@probe("backward.watch")
def _watch_probe(obj: Callable[..., Any], *args: Any, **kwargs: Any) -> dict:
    """Run ``obj(*args, **kwargs)`` once and report what it did: ``largest`` (elements of the largest
    tensor storage created) and its ``shape``, ``flops`` (of matrix products called from Python),
    ``exp_elements`` and ``exp_tile`` (what went through exp), ``zero_tiles`` (exponentiated tiles that came out
    all zero: tiles whose every score was masked), ``elements`` (of every tensor created),
    ``calls`` (watched functions used) and ``changed`` (positions of tensor arguments it wrote into).
    The result itself is dropped: only these numbers cross."""
    watch = _Watch()
    before = [(i, a.clone()) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    with watch:
        obj(*args, **kwargs)
    changed = [i for i, copy in before if not torch.equal(args[i], copy)]
    return {"changed": changed, "largest": int(watch.largest), "shape": [int(s) for s in watch.shape], "calls": sorted(watch.calls),
            "flops": int(watch.flops), "exp_elements": int(watch.exp_elements), "elements": int(watch.elements),
            "exp_tile": [int(s) for s in watch.exp_tile], "zero_tiles": int(watch.zero_tiles)}


def _forbid_changes(report: dict, tried: str, names: tuple[str, ...]) -> None:
    changed = [names[i] for i in report.get("changed", []) if i < len(names)]
    if changed:
        fail(f"overwrote its input {changed[0]}", tried=tried,
             got=f"after the call, {', '.join(changed)} held different numbers than before",
             expected="the inputs left as they were: the caller still needs them",
             cause="an in-place write into an input: += or [...] = on it, or a result that is the input itself "
                   "(dk = k instead of dk = torch.zeros_like(k))",
             fix="allocate every result and accumulator as a new tensor (torch.zeros_like, torch.empty_like)")


def _forbid_calls(report: dict, tried: str, *, what: str) -> None:
    used = [c for c in report.get("calls", []) if c in _WATCHED]
    if not used:
        return
    fused = "scaled_dot_product_attention" in used
    names = ", ".join(_WATCHED[c] for c in used)
    fail("used autograd instead of the chain rule" if not fused else "called a fused attention",
         tried=tried, got=f"your {what} calls {names}",
         expected=f"{what} written from the formulas, with matrix products and element-wise operations",
         cause="the values may be right, but autograd (or PyTorch's own attention) did the work the exercise asks "
               "you to do", fix="compute dV, dP, dS, dQ and dK yourself, as the exercise's formulas say")


# ============================================================================ oracle and inputs
def _oracle(q, k, v, dout, mask=None, causal=False):
    """(o, (dq, dk, dv)) from autograd through F.scaled_dot_product_attention, in float64."""
    q, k, v = (t.detach().to(torch.float64).requires_grad_(True) for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    grads = torch.autograd.grad(o, (q, k, v), dout.to(torch.float64))
    return o.detach(), grads


def _rand(g: torch.Generator, *shape: int, dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


def _spread_queries(g: torch.Generator, *shape: int, dtype=torch.float64) -> torch.Tensor:
    """Queries whose rows have very different norms, so row maxima rise and fall from block to block."""
    q = torch.randn(*shape, generator=g, dtype=torch.float64)
    norms = 0.5 + 2.5 * torch.rand(*shape[:-1], 1, generator=g, dtype=torch.float64)
    return (q * norms).to(dtype)


# ============================================================================ known mistakes
class GradMistake:
    """A known wrong backward: ``grads()`` is what it returns on the case at hand (None where it cannot run)."""

    def __init__(self, summary: str, cause: str, fix: str, grads: Callable[[], tuple | None]):
        self.summary, self.cause, self.fix, self._grads = summary, cause, fix, grads

    def value(self) -> tuple | None:
        try:
            out = self._grads()
        except Exception:  # noqa: BLE001 - this mistake cannot happen on this input (shapes)
            return None
        return tuple(out) if isinstance(out, (tuple, list)) and len(out) == 3 else None


_SCALE_FIX = "multiply dQ = dS K and dK = dSᵀ Q by 1/√d_k, the same scale the forward applied to Q Kᵀ"
_MISTAKE_TEXT = {
    "no_scale_dq": ("1/√d_k missing in dQ", "you left out the 1/√d_k in dQ: the scores are Q Kᵀ/√d_k, so dQ = dS K/√d_k",
                    _SCALE_FIX),
    "no_scale_dk": ("1/√d_k missing in dK", "you left out the 1/√d_k in dK: the scores are Q Kᵀ/√d_k, so dK = dSᵀ Q/√d_k",
                    _SCALE_FIX),
    "no_scale": ("1/√d_k missing in dQ and dK", "you left out the 1/√d_k in both dQ and dK", _SCALE_FIX),
    "by_d": ("divided by d_k instead of √d_k in dQ and dK", "you divided dQ and dK by d_k", "divide by math.sqrt(d_k)"),
    "s_unscaled": ("scores not scaled when P is recomputed", "you recomputed the scores as Q Kᵀ without the 1/√d_k, "
                   "so P is not the forward's P", "recompute S = Q Kᵀ/√d_k, exactly as the forward did"),
    "dk_transposed": ("dK transposed: dS Q instead of dSᵀ Q", "you multiplied dS (queries × keys) by Q without "
                      "transposing it; dK needs one row per key", "dK = dSᵀ Q/√d_k: dS.transpose(-2, -1) @ q"),
    "dq_transposed": ("dQ from dSᵀ instead of dS", "you transposed dS in dQ; dQ needs one row per query",
                      "dQ = dS K/√d_k, with dS of shape (..., n_q, n_k)"),
    "dv_transposed": ("dV = P dO instead of Pᵀ dO", "you multiplied P by dO without transposing P; dV needs one "
                      "row per key", "dV = Pᵀ dO: p.transpose(-2, -1) @ dout"),
    "no_rowsum": ("softmax VJP: the rowsum term is missing", "you computed dS = P ⊙ dP, leaving out the "
                  "− rowsum(dP ⊙ P) term of the softmax's vector–Jacobian product (notebook 04)",
                  "dS = P ⊙ (dP − (dP * P).sum(-1, keepdim=True))"),
    "rowsum_axis": ("softmax VJP: rowsum over the wrong axis", "you summed dP ⊙ P over the queries (axis -2); "
                    "each query's softmax is over its row of keys", "sum over the last axis: (dP * P).sum(-1, keepdim=True)"),
    "rowsum_broadcast": ("softmax VJP: rowsum subtracted along the wrong axis", "you summed without keepdim=True, so "
                         "the (..., n_q) row sums were broadcast along the keys' axis instead of the queries'",
                         "keep the summed axis: (dP * P).sum(-1, keepdim=True), shape (..., n_q, 1)"),
    "rowsum_unweighted": ("softmax VJP: rowsum(dP) instead of rowsum(dP ⊙ P)", "you subtracted the plain row sum of "
                          "dP; the softmax's VJP subtracts the weighted one, ⟨dP, P⟩ per row",
                          "dS = P ⊙ (dP − (dP * P).sum(-1, keepdim=True))"),
    "rowsum_all": ("softmax VJP: one sum over the whole matrix", "you summed dP ⊙ P over every query and key at "
                   "once; the softmax's VJP needs one sum per query", "sum over the last axis only: (dP * P).sum(-1, "
                   "keepdim=True)"),
    "softmax_axis": ("softmax over the wrong axis", "you took the softmax over the queries (axis -2); each query's "
                     "weights are a softmax over its row of keys", "masked_softmax(scores, mask) (its dim=-1 default)"),
    "dv_scaled": ("dV scaled by 1/√d_k", "you multiplied dV by 1/√d_k; the scale sits on the scores Q Kᵀ, so only dQ "
                  "and dK carry it", "dV = Pᵀ dO, with no scale"),
    "exp2_unconverted": ("exp2 without the log₂e factor", "you used exp2 on S − L, which are natural-log quantities: "
                         "2^x is not e^x", "P = torch.exp(s - lse), or torch.exp2((s - lse) * math.log2(math.e))"),
    "sign": ("softmax VJP: sign flipped", "you computed P ⊙ (rowsum(dP ⊙ P) − dP), the negative of dS",
             "dS = P ⊙ (dP − rowsum(dP ⊙ P))"),
    "mask_ignored": ("mask ignored in the backward", "you recomputed P without the mask, so blocked keys get "
                     "weight and gradient", "apply the mask exactly as the forward does: masked_softmax(scores, mask)"),
    "mask_inverted": ("mask polarity inverted", "you blocked the positions where the mask is True; in this course "
                      "True means 'may attend'", "masked_softmax(scores, mask) (it fills where the mask is False)"),
    "nan_rows": ("NaN from a fully masked row", "a row whose keys are all blocked went through torch.softmax over "
                 "-inf everywhere, which gives NaN, and the NaN spread into dK and dV",
                 "use the course's masked_softmax(scores, mask): a fully masked row gets zero weights, so zero gradients"),
    "weak_fill": ("fully masked row attends uniformly", "you filled blocked scores with a large negative number; on "
                  "a row where every key is blocked the softmax is then uniform instead of zero",
                  "use the course's masked_softmax(scores, mask): a fully masked row gets zero weights"),
    "unstable": ("softmax without the maximum subtracted", "you exponentiated the raw scores, so exp overflowed on "
                 "scores this large", "use torch.softmax or masked_softmax (they subtract each row's maximum)"),
    "unscaled_all": ("1/√d_k missing everywhere", "you left out the 1/√d_k in the scores and in dQ and dK: these are "
                     "the gradients of softmax(Q Kᵀ) V, a different function", "scale the scores (S = Q Kᵀ/√d_k) "
                     "and dQ, dK by 1/√d_k"),
    "by_d_all": ("divided by d_k instead of √d_k everywhere", "you divided the scores and dQ, dK by d_k",
                 "divide by math.sqrt(d_k)"),
    "scale_dv": ("scale from d_v instead of d_k", "you took the scale from the values' width (v.shape[-1] = d_v); the "
                 "scores are Q Kᵀ, whose width is d_k", "scale = 1 / math.sqrt(q.shape[-1])"),
    "dk_from_k": ("dK from K instead of Q: dSᵀ K", "you multiplied dSᵀ by K; the scores are Q Kᵀ, so the gradient "
                  "reaching K goes through Q", "dK = dSᵀ Q/√d_k"),
    "dq_from_q": ("dQ from Q instead of K: dS Q", "you multiplied dS by Q; the scores are Q Kᵀ, so the gradient "
                  "reaching Q goes through K", "dQ = dS K/√d_k"),
    "rowsum_mean": ("softmax VJP: mean instead of sum", "you subtracted the row mean of dP ⊙ P; the softmax's VJP "
                    "subtracts its row sum", "dS = P ⊙ (dP − (dP * P).sum(-1, keepdim=True))"),
    "diag_jacobian": ("softmax VJP: only the Jacobian's diagonal", "you computed P(1 − P) ⊙ dP, the diagonal of the "
                      "softmax's Jacobian alone; each weight also depends on every other score of its row (the "
                      "−pᵢpⱼ terms)", "dS = P ⊙ (dP − (dP * P).sum(-1, keepdim=True))"),
    "dp_transposed": ("dP transposed: V dOᵀ instead of dO Vᵀ", "you computed dP as V dOᵀ (keys × queries); dP has "
                      "P's layout, one row per query", "dP = dO Vᵀ: dout @ v.transpose(-2, -1)"),
    "dv_uses_v": ("dV from V instead of dO: Pᵀ V", "you multiplied Pᵀ by V; the gradient reaching V is Pᵀ times the "
                  "upstream gradient dO", "dV = Pᵀ dO: p.transpose(-2, -1) @ dout"),
    "no_p": ("softmax VJP: the factor P is missing", "you computed dS = dP − rowsum(dP ⊙ P) without multiplying by P",
             "dS = P ⊙ (dP − rowsum(dP ⊙ P))"),
    "mask_ds_only": ("mask applied to dS but not to P", "you computed P without the mask and zeroed dS at the blocked "
                     "positions; P itself (and with it dV and the row sums) must come from the masked softmax",
                     "P = masked_softmax(scores, mask); then dS needs no extra masking"),
    "mask_after_softmax": ("mask applied after the softmax", "you multiplied the softmax's weights by the mask, so "
                           "the weights left no longer sum to 1", "apply the mask before the softmax: "
                           "masked_softmax(scores, mask)"),
    "mask_added": ("mask added to the scores", "you added the bool mask (0 or 1) to the scores; a blocked key needs "
                   "a score of −∞, not 0", "masked_softmax(scores, mask), which sets the blocked scores to −∞"),
    # tiled
    "lse_ignored": ("L not subtracted: P = exp(S)", "you recomputed P as exp(S); the forward's P is exp(S − L), "
                    "normalised by the saved row logsumexp L", "P = torch.exp(s - lse[..., q_start:q_end, None])"),
    "lse_sign": ("L added instead of subtracted: exp(S + L)", "you computed exp(S + L); P = exp(S)/Σⱼexp(Sⱼ) = "
                 "exp(S − L)", "P = torch.exp(s - lse[..., q_start:q_end, None])"),
    "delta_sign": ("D added instead of subtracted", "you computed dS = P ⊙ (dP + D); the softmax's VJP subtracts D",
                   "dS = P ⊙ (dP − D)"),
    "dk_overwritten": ("dK not accumulated over query blocks", "you assigned dK for each query block instead of "
                       "adding, so only the last query block's term survives", "start dK_j at zero before the query "
                       "loop and add (+=) each tile's term"),
    "dv_overwritten": ("dV not accumulated over query blocks", "you assigned dV for each query block instead of "
                       "adding, so only the last query block's term survives", "start dV_j at zero before the query "
                       "loop and add (+=) each tile's term"),
    "mask_offset_sign": ("causal mask offset the wrong way", "you shifted each tile's mask by k_start − q_start; key "
                         "k_start + c lies in the future of query q_start + r when c − r > q_start − k_start",
                         "mask where k_start + column > q_start + row (global positions), e.g. "
                         "torch.ones(bq, bk, dtype=torch.bool).triu(q_start - k_start + 1)"),
    "exp_split": ("exp(S) and exp(L) taken separately", "you computed exp(S)/exp(L); at scores near 10³ both "
                  "overflow to inf, and inf/inf is NaN", "exponentiate S − L in one step: "
                  "torch.exp(s - lse[..., q_start:q_end, None])"),
    "mask_after_exp": ("blocked entries zeroed after exp: inf · 0", "you set the blocked entries of P to 0 after "
                       "exp(S − L); a blocked score far above L overflows to inf first, and inf · 0 is NaN",
                       "give the blocked scores −∞ before exp (s.masked_fill(blocked, float('-inf'))), or select "
                       "with torch.where after it"),
    "fresh_max": ("P recomputed with a fresh max instead of the stored L", "you recomputed each tile as "
                  "exp(S − the tile's own row max); that tile is not normalised like the forward's P",
                  "P = exp(S − L) with the saved logsumexp L of each row: no max, no sum"),
    "tile_softmax": ("P normalised within each tile instead of with the stored L", "you normalised each tile on "
                     "its own (a softmax over the tile, or exp(S − the tile's own logsumexp)); P's rows are "
                     "normalised over all keys, which the saved L already accounts for",
                     "P = exp(S − L) with the saved logsumexp L of each row"),
    "lse_as_sum": ("L used as a sum, not a log", "you divided exp(S) by L; L is the log of the row's sum",
                   "P = exp(S − L)"),
    "lse_broadcast": ("L subtracted along the wrong axis", "you subtracted the (…, b) slice of L without a trailing "
                      "axis, so it was broadcast along the keys, not the queries",
                      "add the axis: lse[..., q_start:q_end, None] (shape (..., b, 1))"),
    "delta_tile": ("D computed from the recomputed P instead of dO ⊙ O", "you computed D = rowsum(dP ⊙ P) inside "
                   "the tile, which sums over one block of keys only; D needs the whole row",
                   "compute D = (dout * o).sum(-1) once, before the loops: it equals rowsum(dP ⊙ P) over all keys"),
    "delta_tile_axis": ("D summed over the wrong axis", "you summed dP ⊙ P over the tile's queries (axis -2)",
                        "D = (dout * o).sum(-1): one number per query"),
    "delta_broadcast": ("D subtracted along the wrong axis", "you subtracted the (…, b) slice of D without a "
                        "trailing axis, so it was broadcast along the keys, not the queries",
                        "add the axis: delta[..., q_start:q_end, None] (shape (..., b, 1))"),
    "no_causal": ("causal mask forgotten in the backward", "with causal=True you computed every tile without the "
                  "mask, so gradients flow from future keys", "skip the query blocks that end before the key block "
                  "starts and mask key > query in the tiles on the diagonal, as the forward did"),
    "diag_unmasked": ("diagonal tiles not masked", "you skipped the tiles above the diagonal but did not mask the "
                      "tiles on it, so query i still sees keys i+1, i+2, … of its own block",
                      "in a tile on the diagonal set S to -inf where key position > query position"),
    "skip_diag": ("diagonal tiles skipped", "you visited only the tiles strictly below the diagonal; the diagonal "
                  "tiles hold each query's own key and its neighbours", "start the query loop at the key block's "
                  "own block: range(k_start, n, block_size)"),
    "mask_self": ("causal mask off by one: a query cannot see itself", "you masked key ≥ query; a query may "
                  "attend to its own position", "mask key > query"),
    "mask_ahead": ("causal mask off by one: each query sees the next key", "you masked key > query + 1",
                   "mask key > query"),
    "local_mask": ("causal mask built from positions inside the tile", "you masked column > row of every tile; "
                   "the mask needs global positions (q_start + row, k_start + column)",
                   "compare global positions, or mask only the tiles on the diagonal"),
    "dq_overwritten": ("dQ not accumulated over key blocks", "you assigned dQ's rows for each key block instead of "
                       "adding to them, so only the last key block's term survives",
                       "dq[..., q_start:q_end, :] += ds @ k_blk / √d_k: dQ collects one term per key block"),
    "dkdv_overwritten": ("dK, dV not accumulated over query blocks", "you assigned dK and dV for each query block "
                         "instead of adding, so only the last query block's term survives",
                         "start dK_j, dV_j at zero before the query loop and add (+=) each tile's term"),
    "q_tail": ("last partial query block dropped", "your query loop stops at the last full block, so the rows "
               "after it are missing when n_q is not a multiple of the block size",
               "loop with range(0, n_q, block_size) and slice [start:start + block_size] (the last slice is shorter)"),
    "k_tail": ("last partial key block dropped", "your key loop stops at the last full block, so the keys after it "
               "get no gradient when n_k is not a multiple of the block size",
               "loop with range(0, n_k, block_size) and slice [start:start + block_size] (the last slice is shorter)"),
    "both_tails": ("last partial block dropped", "your loops stop at the last full block, so the rows and keys after "
                   "it are missing when n_q, n_k are not multiples of the block size",
                   "loop with range(0, n_q, block_size) and slice [start:start + block_size] (the last slice is shorter)"),
}


def _mistake(bug: str, grads: Callable[[], tuple | None]) -> GradMistake:
    return GradMistake(*_MISTAKE_TEXT[bug], grads)


def _naive_weights(q, k, v, mask, bug: str = "") -> tuple[torch.Tensor, float]:
    """(P, scale) of the forward in float64, with one known bug in the weights (``bug=""``: none)."""
    q, k = q.to(torch.float64), k.to(torch.float64)
    d = q.shape[-1]
    scale = {"unscaled_all": 1.0, "by_d_all": 1 / d, "scale_dv": 1 / math.sqrt(v.shape[-1])}.get(bug, 1 / math.sqrt(d))
    s = q @ k.transpose(-2, -1) * (1.0 if bug == "s_unscaled" else scale)  # (..., n_q, n_k)
    if bug in ("mask_ignored", "mask_ds_only"):
        p = torch.softmax(s, -1)
    elif bug == "mask_inverted":
        p = masked_softmax(s, ~mask)
    elif bug == "nan_rows":
        p = torch.softmax(s.masked_fill(~mask, -INF), -1)
    elif bug == "weak_fill":
        p = torch.softmax(s.masked_fill(~mask, -1e9), -1)
    elif bug == "unstable":
        e = torch.exp(s if mask is None else s.masked_fill(~mask, -INF))
        p = e / e.sum(-1, keepdim=True)
    elif bug == "softmax_axis":
        p = masked_softmax(s, mask, dim=-2)
    elif bug == "mask_after_softmax":
        p = torch.softmax(s, -1) * mask
    elif bug == "mask_added":
        p = torch.softmax(s + mask.to(s.dtype), -1)
    else:
        p = masked_softmax(s, mask)
    return p, scale


def _naive_variant(q, k, v, dout, mask, bug: str = ""):
    """The chain-rule backward in float64 with one known bug (``bug=""``: none)."""
    q, k, v, dout = (t.to(torch.float64) for t in (q, k, v, dout))
    d = q.shape[-1]
    p, scale = _naive_weights(q, k, v, mask, bug)  # (..., n_q, n_k)
    dv = (p @ dout) if bug == "dv_transposed" else p.transpose(-2, -1) @ (v if bug == "dv_uses_v" else dout)
    dv = dv * scale if bug == "dv_scaled" else dv
    dp = v @ dout.transpose(-2, -1) if bug == "dp_transposed" else dout @ v.transpose(-2, -1)
    rows = (dp * p).sum(-1, keepdim=True)
    if bug == "no_rowsum":
        ds = p * dp
    elif bug == "rowsum_axis":
        ds = p * (dp - (dp * p).sum(-2, keepdim=True))
    elif bug == "rowsum_broadcast":
        ds = p * (dp - (dp * p).sum(-1).unsqueeze(-2))
    elif bug == "rowsum_unweighted":
        ds = p * (dp - dp.sum(-1, keepdim=True))
    elif bug == "rowsum_all":
        ds = p * (dp - (dp * p).sum((-2, -1), keepdim=True))
    elif bug == "rowsum_mean":
        ds = p * (dp - (dp * p).mean(-1, keepdim=True))
    elif bug == "diag_jacobian":
        ds = p * (1 - p) * dp
    elif bug == "no_p":
        ds = dp - rows
    elif bug == "sign":
        ds = p * (rows - dp)
    else:
        ds = p * (dp - rows)
    if bug == "mask_ds_only":
        ds = ds.masked_fill(~mask, 0.0)
    sq = {"no_scale_dq": 1.0, "no_scale": 1.0, "by_d": 1 / d}.get(bug, scale)
    sk = {"no_scale_dk": 1.0, "no_scale": 1.0, "by_d": 1 / d}.get(bug, scale)
    dq = (ds.transpose(-2, -1) @ k if bug == "dq_transposed" else ds @ (q if bug == "dq_from_q" else k)) * sq
    dk = (ds @ q if bug == "dk_transposed" else ds.transpose(-2, -1) @ (k if bug == "dk_from_k" else q)) * sk
    return dq, dk, dv


_NAIVE_BUGS = ("no_scale_dq", "no_scale_dk", "no_scale", "by_d", "s_unscaled", "unscaled_all", "by_d_all", "scale_dv",
               "dk_transposed", "dq_transposed", "dk_from_k", "dq_from_q", "dv_transposed", "dv_scaled", "dv_uses_v",
               "dp_transposed", "no_rowsum", "rowsum_axis", "rowsum_broadcast", "rowsum_unweighted", "rowsum_all",
               "rowsum_mean", "diag_jacobian", "no_p", "sign", "softmax_axis")


def _naive_mistakes(case: dict, bugs: tuple[str, ...] | None = None) -> list[GradMistake]:
    q, k, v, dout, mask = case["q"], case["k"], case["v"], case["dout"], case["mask"]
    fully_masked = mask is not None and bool((~mask).all(-1).any())
    bugs = bugs or (_NAIVE_BUGS
                    + (("unstable",) if case.get("extreme") else ())
                    + (("mask_ignored", "mask_inverted", "mask_ds_only", "mask_after_softmax", "mask_added")
                       if mask is not None else ())
                    + (("nan_rows", "weak_fill") if fully_masked else ()))
    return [_mistake(bug, lambda bug=bug: _naive_variant(q, k, v, dout, mask, bug)) for bug in bugs]


def _tiled_variant(q, k, v, o, lse, dout, block: int, causal: bool, bug: str = ""):
    """The FlashAttention-2 backward in float64 with one known bug (``bug=""``: none)."""
    q, k, v, o, lse, dout = (t.to(torch.float64) for t in (q, k, v, o, lse, dout))
    n, m, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = {"unscaled_all": 1.0, "by_d_all": 1 / d, "scale_dv": 1 / math.sqrt(v.shape[-1])}.get(bug, 1 / math.sqrt(d))
    sq = {"no_scale_dq": 1.0, "no_scale": 1.0, "by_d": 1 / d}.get(bug, scale)
    sk = {"no_scale_dk": 1.0, "no_scale": 1.0, "by_d": 1 / d}.get(bug, scale)
    n_end = n - n % block if bug in ("q_tail", "both_tails") else n
    m_end = m - m % block if bug in ("k_tail", "both_tails") else m
    masked = causal and bug != "no_causal"
    delta = (dout * o).sum(-1)  # (..., n_q)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for ks in range(0, m_end, block):
        ke = min(ks + block, m)
        kb, vb = k[..., ks:ke, :], v[..., ks:ke, :]
        dkb, dvb = torch.zeros_like(kb), torch.zeros_like(vb)
        first = (ks + block if bug == "skip_diag" else ks) if masked else 0
        for qs in range(first, n_end, block):
            qe = min(qs + block, n)
            qb, dob = q[..., qs:qe, :], dout[..., qs:qe, :]
            s = qb @ kb.transpose(-2, -1) * (1.0 if bug == "s_unscaled" else scale)
            blocked = None
            if masked and bug != "diag_unmasked":
                rows = torch.arange(qs, qe)[:, None] - (qs if bug == "local_mask" else 0)
                cols = torch.arange(ks, ke)[None, :] - (ks if bug == "local_mask" else 0)
                blocked = {"mask_self": cols >= rows, "mask_ahead": cols > rows + 1,
                           "mask_offset_sign": cols - rows >= 2 * (ks - qs) + 1}.get(bug, cols > rows)
                if bug != "mask_after_exp":
                    s = s.masked_fill(blocked, -INF)
            l_blk = lse[..., qs:qe]
            if bug == "fresh_max":
                p = torch.exp(s - s.amax(-1, keepdim=True))
            elif bug == "tile_softmax":
                p = torch.softmax(s, -1)
            elif bug == "lse_as_sum":
                p = torch.exp(s) / l_blk[..., None]
            elif bug == "lse_broadcast":
                p = torch.exp(s - l_blk[..., None, :])
            elif bug == "exp2_unconverted":
                p = torch.exp2(s - l_blk[..., None])
            elif bug == "lse_ignored":
                p = torch.exp(s)
            elif bug == "lse_sign":
                p = torch.exp(s + l_blk[..., None])
            elif bug == "exp_split":
                p = torch.exp(s) / torch.exp(l_blk[..., None])
            else:
                p = torch.exp(s - l_blk[..., None])
            if bug == "mask_after_exp" and blocked is not None:
                p = p * ~blocked
            tv = (p @ dob) if bug == "dv_transposed" else p.transpose(-2, -1) @ dob
            tv = tv * scale if bug == "dv_scaled" else tv
            dp = dob @ vb.transpose(-2, -1)
            d_blk = delta[..., qs:qe, None]
            if bug == "no_rowsum":
                ds = p * dp
            elif bug == "delta_tile":
                ds = p * (dp - (dp * p).sum(-1, keepdim=True))
            elif bug == "delta_tile_axis":
                ds = p * (dp - (dp * p).sum(-2, keepdim=True))
            elif bug == "delta_broadcast":
                ds = p * (dp - delta[..., None, qs:qe])
            elif bug == "delta_sign":
                ds = p * (dp + d_blk)
            elif bug == "sign":
                ds = p * (d_blk - dp)
            elif bug == "no_p":
                ds = dp - d_blk
            else:
                ds = p * (dp - d_blk)
            tq = ds @ kb * sq
            tk = (ds @ qb if bug == "dk_transposed" else ds.transpose(-2, -1) @ (kb if bug == "dk_from_k" else qb)) * sk
            if bug == "dq_overwritten":
                dq[..., qs:qe, :] = tq
            else:
                dq[..., qs:qe, :] += tq
            dkb = tk if bug in ("dkdv_overwritten", "dk_overwritten") else dkb + tk
            dvb = tv if bug in ("dkdv_overwritten", "dv_overwritten") else dvb + tv
        dk[..., ks:ke, :], dv[..., ks:ke, :] = dkb, dvb
    return dq, dk, dv


_TILED_BUGS = ("no_scale_dq", "no_scale_dk", "no_scale", "by_d", "s_unscaled", "unscaled_all", "by_d_all", "scale_dv",
               "dk_transposed", "dk_from_k", "dv_transposed", "dv_scaled", "no_rowsum", "no_p", "sign",
               "exp2_unconverted", "fresh_max", "tile_softmax", "lse_as_sum", "lse_broadcast", "lse_ignored",
               "lse_sign", "exp_split", "delta_tile", "delta_tile_axis", "delta_broadcast", "delta_sign",
               "dq_overwritten", "dkdv_overwritten", "dk_overwritten", "dv_overwritten", "q_tail", "k_tail",
               "both_tails")
_CAUSAL_BUGS = ("no_causal", "diag_unmasked", "skip_diag", "mask_self", "mask_ahead", "local_mask", "mask_offset_sign",
                "mask_after_exp")


def _tiled_mistakes(case: dict) -> list[GradMistake]:
    args = (case["q"], case["k"], case["v"], case["o"], case["lse"], case["dout"], case["block"], case["causal"])
    bugs = _TILED_BUGS + (_CAUSAL_BUGS if case["causal"] else ())
    found = [_mistake(bug, lambda bug=bug: _tiled_variant(*args, bug)) for bug in bugs]
    if case["causal"]:  # the mask forgotten everywhere: plain attention's gradients, forward and backward
        found.append(_mistake("no_causal", lambda: _naive_variant(case["q"], case["k"], case["v"], case["dout"], None)))
    return found


# ============================================================================ comparing three gradients
def _unpack(result: Any, tried: str) -> tuple[torch.Tensor, ...]:
    if isinstance(result, torch.Tensor):
        fail("returned one tensor, not (dq, dk, dv)", tried=tried, got=f"one tensor of shape {tuple(result.shape)}",
             expected="a tuple of three tensors (dq, dk, dv)", fix="end the function with `return dq, dk, dv`")
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        got = f"a {type(result).__name__} of {len(result)} items" if isinstance(result, (tuple, list)) else \
            ("None" if result is None else type(result).__name__)
        fail("did not return (dq, dk, dv)", tried=tried, got=got, expected="a tuple of three tensors (dq, dk, dv)",
             cause="your function has no `return`" if result is None else "",
             fix="end the function with `return dq, dk, dv`")
    grads = tuple(as_tensor(r, tried=tried, what=f"{name} (element {i} of your result)")
                  for i, (name, r) in enumerate(zip(NAMES, result)))
    return grads


def _tolerance(expected: tuple, dtype: torch.dtype) -> tuple[float, float]:
    big = max(1.0, max(float(e.abs().max()) if e.numel() else 0.0 for e in expected))
    return (1e-10 * big, 1e-9) if dtype == torch.float64 else (2e-4 * big, 2e-3)


def _expect_grads(got: tuple, expected: tuple, *, tried: str, dtype: torch.dtype, mistakes: list[GradMistake],
                  nan_cause: str = "", nan_fix: str = "") -> None:
    """Fail unless the three gradients match; blame a known mistake the answer reproduces, else measure."""
    for i, (name, g, e) in enumerate(zip(NAMES, got, expected)):
        if tuple(g.shape) != tuple(e.shape):
            perm = _permutation(got, expected, dtype)
            if perm:
                fail("gradients returned in the wrong order", tried=tried, got=f"({', '.join(perm)})",
                     expected="(dq, dk, dv): the gradient of each input in the order of the inputs",
                     fix="return dq, dk, dv")
            values = [m.value() for m in mistakes]
            found = [m for m, val in zip(mistakes, values) if val is not None and tuple(val[i].shape) == tuple(g.shape)
                     and same(g, val[i], atol=1e-6, rtol=1e-5)]
            if found:
                _blame([found], tried, f"your {name} of shape {tuple(g.shape)}", f"shape {tuple(e.shape)}")
            expect_shape(g, e.shape, tried=tried, what=f"your {name}", fix=_SHAPE_FIX[name])
    for name, g in zip(NAMES, got):
        if g.dtype != dtype:
            fail(f"{name} is {str(g.dtype).replace('torch.', '')}, not {str(dtype).replace('torch.', '')}", tried=tried,
                 got=f"your {name} in {str(g.dtype).replace('torch.', '')}",
                 expected=f"{str(dtype).replace('torch.', '')}, the dtype of the inputs",
                 cause="a tensor created without dtype= (torch.zeros(shape) is float32) or a .float()/.double()",
                 fix="create accumulators with torch.zeros_like(q) or dtype=q.dtype")
    atol, rtol = _tolerance(expected, dtype)
    if all(same(g, e, atol=atol, rtol=rtol) for g, e in zip(got, expected)):
        return
    perm = _permutation(got, expected, dtype)
    if perm:
        fail("gradients returned in the wrong order", tried=tried, got=f"({', '.join(perm)})",
             expected="(dq, dk, dv): the gradient of each input in the order of the inputs", fix="return dq, dk, dv")
    wrong = [i for i in range(3) if not same(got[i], expected[i], atol=atol, rtol=rtol)]
    name = NAMES[wrong[0]]
    factors = {"√d_k": math.sqrt(_head_dim(expected)), "d_k": _head_dim(expected)}
    chosen = _explain(got, expected, wrong, mistakes, atol=atol, rtol=rtol)
    if chosen:
        got_text, exp_text, _, _ = describe_mismatch(got[wrong[0]], expected[wrong[0]], what=f"your {name}",
                                                     atol=atol, rtol=rtol, factors=factors)
        wrong_names = ", ".join(NAMES[i] for i in wrong)
        _blame(chosen, tried, f"{wrong_names} {'is' if len(wrong) == 1 else 'are'} wrong; in {name}: {got_text}",
               _named_expected(exp_text, name))
    for i in wrong:
        g = got[i]
        if torch.isnan(g).any() and nan_cause and not torch.isnan(expected[i]).any():
            fail(f"NaN in {NAMES[i]}", tried=tried, got=f"NaN in {int(torch.isnan(g).sum())} of {g.numel()} entries of your {NAMES[i]}",
                 expected="finite gradients", cause=nan_cause, fix=nan_fix)
    _describe_properties(got, expected, wrong, tried=tried, dtype=dtype, atol=atol, rtol=rtol)
    try:
        expect_close(got[wrong[0]], expected[wrong[0]], tried=tried, what=f"your {name}", atol=atol, rtol=rtol,
                     factors=factors)
    except Failure as failure:
        d = failure.diagnosis
        d.expected = _named_expected(d.expected, name)
        if name not in d.summary:
            d.summary = f"{name}: {d.summary}"
        if name not in d.got:
            d.got = f"in your {name}: {d.got}"
        raise


#: What a measured mismatch says it expected when it has nothing more specific to say.
_GENERIC_EXPECTED = ("the expected values", "the correct values (from the check's reference computation)")


def _named_expected(text: str, name: str) -> str:
    """The diagnosis's "expected" line: say which gradient and where it comes from, not "the expected values"."""
    if text in _GENERIC_EXPECTED:
        return f"the {name} that autograd computes through F.scaled_dot_product_attention (in float64)"
    return text


def _describe_properties(got: tuple, expected: tuple, wrong: list[int], *, tried: str, dtype: torch.dtype,
                         atol: float, rtol: float) -> None:
    """When no known mistake matches: name what the wrong gradients measurably are, if one property says it."""
    finite = all(bool(torch.isfinite(g).all()) for g in got)
    if dtype == torch.float64 and finite:
        atol32, rtol32 = _tolerance(expected, torch.float32)
        in_float32 = all(bool((got[i] == got[i].float().double()).all()) for i in wrong)  # rounded to float32
        if in_float32 and all(same(g, e, atol=atol32 / 20, rtol=rtol32 / 20) for g, e in zip(got, expected)):
            worst = max(float(((g.double() - e).abs() / (e.abs() + atol32)).max()) for g, e in zip(got, expected))
            fail("float64 inputs, float32 precision", tried=tried,
                 got=f"gradients that agree with the expected ones to about 7 significant digits only (relative "
                     f"error up to {worst:.1e}), every value a float32 number",
                 expected="float64 precision, about 15 significant digits, like the inputs",
                 cause="part of your computation ran in float32: a tensor made with torch.zeros(shape) or "
                       "torch.tensor(...) without dtype=, or a .float() somewhere",
                 fix="keep every tensor in the inputs' dtype: torch.zeros_like(q), or dtype=q.dtype")
    for i in wrong:
        g, e = got[i].double(), expected[i].double()
        if g.numel() and not bool(g.any()) and bool(e.any()):
            fail(f"{NAMES[i]} is all zeros", tried=tried, got=f"your {NAMES[i]} is zero everywhere",
                 expected=f"the gradient {NAMES[i]} (not zero)",
                 cause="nothing was ever added into it, or the function returns the tensor it started from",
                 fix=f"check that {NAMES[i]} is the tensor your formula (or your loop) fills")
        if g.dim() < 2 or g.shape[-2] < 2:
            continue
        zero_rows = ~g.flatten(0, -3).ne(0).any(-1).any(0) if g.dim() > 2 else ~g.ne(0).any(-1)  # (rows,)
        live_rows = e.flatten(0, -3).ne(0).any(-1).any(0) if e.dim() > 2 else e.ne(0).any(-1)
        tail = 0
        while tail < zero_rows.numel() and zero_rows[-1 - tail] and live_rows[-1 - tail]:
            tail += 1
        first = zero_rows.numel() - tail
        if tail and first > 0 and same(g[..., :first, :], e[..., :first, :], atol=atol, rtol=rtol):
            axis, axes = ("query", "queries") if i == 0 else ("key", "keys")
            fail(f"{NAMES[i]}: the last {axis} rows get no gradient", tried=tried,
                 got=f"your {NAMES[i]} is right in rows 0…{first - 1} and zero from row {first} on",
                 expected=f"a gradient for every {axis}, rows 0…{g.shape[-2] - 1}",
                 cause=f"your loop over the {axes} stops before row {first}: a range or a block count that "
                       "leaves out the last (possibly shorter) block",
                 fix="loop with range(0, n, block_size) and slice [start:start + block_size]: the last slice is "
                     "simply shorter")


def _explain(got: tuple, expected: tuple, wrong: list[int], mistakes: list[GradMistake], *, atol: float,
             rtol: float) -> list[list[GradMistake]]:
    """The fewest known mistakes that together explain every wrong gradient, or [] when they cannot.

    A mistake explains the gradients it changes when the answer reproduces every one of them (the
    gradients it leaves alone may still be wrong through a second mistake). Mistakes that explain the
    same gradients with the same numbers come as one group ("this or that")."""
    explains = []
    for m in mistakes:
        val = m.value()
        if val is None:
            continue
        changed = frozenset(j for j in range(3) if not same(val[j], expected[j], atol=atol, rtol=rtol))
        if changed and all(j in wrong and same(got[j], val[j], atol=atol, rtol=rtol) for j in changed):
            explains.append((m, changed))
    remaining, chosen = set(wrong), []
    while remaining:
        best = max((len(changed & remaining) for _, changed in explains), default=0)
        if best == 0:
            return []
        first = next(changed for _, changed in explains if len(changed & remaining) == best)
        chosen.append([m for m, changed in explains if changed == first])
        remaining -= first
    return chosen


def _blame(chosen: list[list[GradMistake]], tried: str, got: str, expected: str) -> None:
    """Fail naming the mistakes found: one group is one mistake (or several giving the same numbers)."""
    parts = []
    for group in chosen:
        unique = list({m.summary: m for m in group}.values())
        parts.append(unique)
    if len(parts) == 1 and len(parts[0]) == 1:
        m = parts[0][0]
        fail(m.summary, tried=tried, got=got, expected=expected, cause=m.cause, fix=m.fix)
    if len(parts) == 1:
        unique = parts[0]
        fail(" or ".join(m.summary for m in unique), tried=tried, got=got, expected=expected,
             cause="on this input these mistakes give the same numbers: " + " — or ".join(m.cause for m in unique),
             fix="; otherwise ".join(m.fix for m in unique))
    fail("; and ".join(" or ".join(m.summary for m in unique) for unique in parts), tried=tried, got=got,
         expected=expected, cause=f"{len(parts)} mistakes at once: " + " — and ".join(
             " or ".join(m.cause for m in unique) for unique in parts),
         fix="; then ".join(unique[0].fix for unique in parts))


def _head_dim(expected: tuple) -> int:
    return max(1, int(expected[0].shape[-1]))


def _permutation(got: tuple, expected: tuple, dtype) -> tuple[str, ...] | None:
    """The order the gradients were returned in, when it is a permutation of (dq, dk, dv) other than itself."""
    atol, rtol = _tolerance(expected, dtype)
    for perm in itertools.permutations(range(3)):
        if perm != (0, 1, 2) and all(tuple(got[i].shape) == tuple(expected[j].shape) and
                                     same(got[i], expected[j], atol=atol, rtol=rtol) for i, j in enumerate(perm)):
            return tuple(NAMES[j] for j in perm)
    return None


# ============================================================================ exercise 1: attention_backward
def _backward_cases() -> list[dict]:
    g = torch.Generator().manual_seed(10)
    cases = []

    def add(name, lead, n, m, d, dv, mask=None, dtype=torch.float64, q_scale=1.0, dout_scale=1.0, extreme=False):
        q = _rand(g, *lead, n, d, dtype=dtype, scale=q_scale)
        k = _rand(g, *lead, m, d, dtype=dtype)
        v = _rand(g, *lead, m, dv, dtype=dtype)
        dout = _rand(g, *lead, n, dv, dtype=dtype, scale=dout_scale)
        cases.append(dict(name=name, q=q, k=k, v=v, dout=dout, mask=mask, dtype=dtype, extreme=extreme))

    add("one head, n_q = n_k = 5, d_k = 7, d_v = 3, no mask", (), 5, 5, 7, 3, q_scale=1.5)
    add("batch × heads (2, 3), n_q = 4, n_k = 6, d_k = 8, d_v = 5, no mask", (2, 3), 4, 6, 8, 5)
    keep = torch.rand(5, 7, generator=g) < 0.6
    keep[:, 0], keep[1, 2] = True, False
    keep[3] = False  # query 3 sees nothing: zero weights, zero output, zero gradients
    add("batch 2, n_q = 5, n_k = 7, d_k = 6, d_v = 6, a (5, 7) mask with row 3 fully masked", (2,), 5, 7, 6, 6, mask=keep)
    pad = (torch.arange(6) < torch.tensor([5, 0, 3])[:, None])[:, None, None, :]  # (3, 1, 1, 6): batch 1 all padding
    add("key padding (3, 1, 1, 6) over 2 heads, n_q = 4, n_k = 6, d_k = 5, d_v = 2; batch entry 1 fully padded", (3, 2),
        4, 6, 5, 2, mask=pad)
    add("a causal (6, 6) mask, one head, d_k = 3, d_v = 7", (), 6, 6, 3, 7, mask=torch.ones(6, 6, dtype=torch.bool).tril())
    add("float32, batch 2, n_q = 9, n_k = 8, d_k = 12, d_v = 4", (2,), 9, 8, 12, 4, dtype=torch.float32)
    add("axes of size 1: batch 1, one query, one key, d_k = 1, d_v = 1", (1,), 1, 1, 1, 1)
    add("one query, n_q = 1, n_k = 5, d_k = 2, d_v = 3, with a (1, 5) mask", (), 1, 5, 2, 3,
        mask=torch.tensor([[True, False, True, True, False]]))
    add("extreme values: scores up to ±10³ (saturated softmax), upstream gradient ×10⁴", (2,), 5, 6, 5, 3,
        q_scale=400.0, dout_scale=1e4, extreme=True)
    return cases


_SHAPES_FIX = ("write each line's shapes next to it: P (..., n_q, n_k), dO (..., n_q, d_v), dV = Pᵀ dO (..., n_k, d_v), "
               "dP = dO Vᵀ (..., n_q, n_k), dQ = dS K (..., n_q, d_k), dK = dSᵀ Q (..., n_k, d_k)")


def _matmul_hint(exc: LearnerRaised) -> dict:
    """A matrix product of incompatible shapes: in this exercise, nearly always a transpose in the wrong place."""
    message = exc.message
    if exc.type_name == "RuntimeError" and ("mat1 and mat2" in message or "shapes cannot be multiplied" in message
                                            or "Expected size for first two dimensions of batch2" in message):
        return dict(cause="two matrices with incompatible shapes were multiplied; with n_q ≠ n_k or d_k ≠ d_v a "
                          "transpose in the wrong place shows up as exactly this", fix=_SHAPES_FIX)
    return {}


def _dtype_hint(exc: LearnerRaised) -> dict:
    """Two dtypes met in one operation: nearly always a tensor created without dtype= (float32 by default)."""
    message = exc.message
    if exc.type_name == "RuntimeError" and ("same dtype" in message or "expected scalar type" in message
                                            or ("Float" in message and "Double" in message)):
        return dict(cause="a float32 tensor met a float64 one: a tensor created without dtype= (torch.zeros(shape) "
                          "is float32) or a .float()/.double() somewhere",
                    fix="create every tensor from the inputs: torch.zeros_like(q), or dtype=q.dtype")
    return {}


def _raised_hint(exc: LearnerRaised, q: torch.Tensor, mask: Any) -> dict:
    """What an exception from the learner's chain rule says about its cause, when the evidence is clear."""
    message = exc.message
    if mask is not None and exc.type_name == "TypeError" and "positional argument" in message:
        return dict(cause="your function does not take the mask as its fifth argument",
                    fix="keep the signature attention_backward(q, k, v, dout, mask=None)")
    if mask is None and "NoneType" in message:
        return dict(cause="with mask=None (no mask) your code still uses the mask",
                    fix="apply the mask only when there is one (`if mask is not None:`), or let masked_softmax "
                        "handle None")
    if "3D tensor" in message or (q.dim() < 3 and "Dimension out of range" in message):
        return dict(cause=f"your code assumes exactly one batch axis (torch.bmm, or transpose(1, 2)); here q has shape "
                          f"{tuple(q.shape)}, and the docstring allows any number of leading axes, none included",
                    fix="write it for any leading axes: @ (torch.matmul) and .mT or .transpose(-2, -1)")
    return _matmul_hint(exc) or _dtype_hint(exc)


def _call_backward(fn: Learner, case: dict, tried: str):
    q, k, v, dout, mask = case["q"], case["k"], case["v"], case["dout"], case["mask"]
    try:
        return fn(q, k, v, dout) if mask is None else fn(q, k, v, dout, mask)
    except LearnerRaised as exc:
        raise Failure(learner_error(exc, tried=tried, expected="(dq, dk, dv)", **_raised_hint(exc, q, mask))) from None


@check("attention_backward", expects="a function attention_backward(q, k, v, dout, mask=None) returning (dq, dk, dv)")
def check_attention_backward(fn: Learner) -> str:
    cases = _backward_cases()
    # First, what the code does besides its result: autograd (not the exercise) or writes into an input.
    case = cases[1]
    tried = f"attention_backward(q, k, v, dout) on {case['name']}, watching the functions it calls"
    try:
        report = fn.observe("backward.watch", case["q"], case["k"], case["v"], case["dout"])
    except LearnerRaised:
        report = {}  # the same call runs again below, where its error gets the full diagnosis
    _forbid_calls(report, tried, what="attention_backward")
    _forbid_changes(report, tried, ("q", "k", "v", "dout"))
    for case in cases:
        q, k, v, dout, mask = case["q"], case["k"], case["v"], case["dout"], case["mask"]
        tried = f"attention_backward(q, k, v, dout{', mask' if mask is not None else ''}) on {case['name']}"
        got = _unpack(_call_backward(fn, case, tried), tried)
        _, expected = _oracle(q, k, v, dout, mask)
        nan_cause = ("exp overflowed on scores this large: a softmax written by hand must subtract each row's maximum"
                     if case["extreme"] else
                     "a fully masked row went through a softmax over -inf everywhere (0/0)" if mask is not None and
                     (~mask).all(-1).any() else "")
        _expect_grads(got, expected, tried=tried, dtype=case["dtype"], mistakes=_naive_mistakes(case),
                      nan_cause=nan_cause, nan_fix="compute P with the course's masked_softmax(scores, mask), which is "
                      "stable and gives a fully masked row zero weights")
    return (f"matches autograd through F.scaled_dot_product_attention on {len(cases)} cases (masks, fully masked rows, "
            f"batch × heads, d_k ≠ d_v, size-1 axes, float32, saturated scores)")


# ============================================================================ exercise 2: AttentionFunction
def _function_cases() -> list[dict]:
    g = torch.Generator().manual_seed(11)
    out = []
    for name, lead, n, m, d, dv, mask in [
        ("batch × heads (2, 2), n_q = 4, n_k = 5, d_k = 3, d_v = 2, no mask", (2, 2), 4, 5, 3, 2, None),
        ("one head, n_q = n_k = 5, d_k = 5, d_v = 6, a causal mask", (), 5, 5, 5, 6, torch.ones(5, 5, dtype=torch.bool).tril()),
        ("batch 2, n_q = 3, n_k = 4, d_k = 2, d_v = 3, a mask with row 1 fully masked", (2,), 3, 4, 2, 3,
         torch.tensor([[True, False, True, True], [False, False, False, False], [False, True, True, False]])),
    ]:
        out.append(dict(name=name, q=_rand(g, *lead, n, d), k=_rand(g, *lead, m, d), v=_rand(g, *lead, m, dv),
                        dout=_rand(g, *lead, n, dv), mask=mask, dtype=torch.float64))
    return out


_BACKWARD_COUNT = ("the backward returns one gradient per input of forward, in order: for forward(ctx, q, k, v, mask) "
                   "that is four, the last one None because a bool mask has no gradient")
_FORWARD_FIX = "forward returns softmax(q kᵀ/√d_k) v with the course's masked_softmax: shape (..., n_q, d_v)"
#: Mistakes in forward: (bug of :func:`_naive_weights`, summary, cause, fix).
_FORWARD_MISTAKES = (
    ("mask_ignored", "forward: mask ignored", "your forward takes the softmax without the mask, so blocked keys get weight",
     "P = masked_softmax(scores, mask)"),
    ("mask_inverted", "forward: mask polarity inverted", "you blocked the positions where the mask is True; in this "
     "course True means 'may attend'", "masked_softmax(scores, mask) (it fills where the mask is False)"),
    ("nan_rows", "forward: NaN from a fully masked row", "a row whose keys are all blocked went through torch.softmax "
     "over -inf everywhere, which gives NaN", "use masked_softmax(scores, mask): a fully masked row gets zero weights "
     "and a zero output"),
    ("weak_fill", "forward: fully masked row attends uniformly", "you filled blocked scores with a large negative "
     "number; on a row where every key is blocked the softmax is then uniform instead of zero",
     "use masked_softmax(scores, mask): a fully masked row gets zero weights"),
    ("softmax_axis", "forward: softmax over the wrong axis", "you took the softmax over the queries (axis -2)",
     "masked_softmax(scores, mask) (its dim=-1 default)"),
    ("unscaled_all", "forward: scores not scaled", "your forward computes softmax(q kᵀ) v without the 1/√d_k",
     "divide the scores by math.sqrt(d_k)"),
    ("by_d_all", "forward: divided by d_k instead of √d_k", "you divided the scores by d_k", "divide by math.sqrt(d_k)"),
    ("scale_dv", "forward: scale from d_v instead of d_k", "you took the scale from the values' width (v.shape[-1])",
     "scale = 1 / math.sqrt(q.shape[-1])"),
    ("mask_after_softmax", "forward: mask applied after the softmax", "you multiplied the weights by the mask, so "
     "they no longer sum to 1", "apply the mask before the softmax: masked_softmax(scores, mask)"),
    ("mask_added", "forward: mask added to the scores", "you added the bool mask (0 or 1) to the scores; a blocked key "
     "needs a score of −∞", "masked_softmax(scores, mask)"),
)


def _forward_mistakes(case: dict) -> list[Mistake]:
    q, k, v, mask = case["q"], case["k"], case["v"], case["mask"]
    found = []
    for bug, summary, cause, fix in _FORWARD_MISTAKES:
        if mask is None and bug.startswith(("mask", "nan", "weak")):
            continue
        found.append(Mistake(summary, cause, fix, lambda bug=bug: _naive_weights(q, k, v, mask, bug)[0] @ v.double()))
    return found


def _apply_hint(exc: LearnerRaised, q: torch.Tensor) -> dict:
    """What an exception from forward, backward or autograd's checks of them says about its cause."""
    message = exc.message
    if "incorrect number of gradients" in message:
        return dict(cause=_BACKWARD_COUNT, fix="return dq, dk, dv, None")
    if "invalid gradient at index" in message:
        return dict(cause="a gradient your backward returned does not have the shape of the input it belongs to: "
                          "backward returns them in the order forward takes its inputs, (q, k, v, mask)",
                    fix="return dq, dk, dv, None")
    if "Mismatch in shape: grad_output[0]" in message:
        return dict(cause="the output of your forward does not have the attention output's shape (..., n_q, d_v)",
                    fix=_FORWARD_FIX)
    if "save_for_backward can only save" in message:
        return dict(cause="ctx.save_for_backward takes tensors (or None) only",
                    fix="keep other values as attributes of ctx (ctx.scale = scale) and save only tensors")
    if exc.type_name == "TypeError" and "positional argument" in message and exc.phase == "call":
        return dict(cause="forward does not take the mask: apply passes its arguments to forward(ctx, …) in order",
                    fix="def forward(ctx, q, k, v, mask=None)")
    return _matmul_hint(exc)


@check("AttentionFunction", kind="class",
       expects="a torch.autograd.Function subclass AttentionFunction with forward(ctx, q, k, v, mask=None) and backward")
def check_AttentionFunction(fn: Learner) -> str:
    info = fn.inspect()
    if not info.get("autograd_function"):
        fail("not a torch.autograd.Function", tried="checking the class AttentionFunction",
             got=f"a class deriving from {', '.join(info.get('bases', [])[:2]) or 'object'}",
             expected="class AttentionFunction(torch.autograd.Function)",
             fix="derive the class from torch.autograd.Function and give it static methods forward and backward")
    apply = fn.method("apply")
    cases = _function_cases()
    for case in cases:
        q, k, v, dout, mask = case["q"], case["k"], case["v"], case["dout"], case["mask"]
        args = (q, k, v) if mask is None else (q, k, v, mask)
        tried = f"AttentionFunction.apply(q, k, v{', mask' if mask is not None else ''}) and backward, on {case['name']}"
        try:
            out, grads = apply.vjp(args, dout, wrt=(0, 1, 2))
        except LearnerRaised as exc:
            raise Failure(learner_error(exc, tried=tried, expected="the attention output, then its gradients",
                                        **_apply_hint(exc, q))) from None
        o_exp, expected = _oracle(q, k, v, dout, mask)
        out = as_tensor(out, tried=tried, what="forward", expected="the attention output, one tensor (..., n_q, d_v)")
        expect_shape(out, o_exp.shape, tried=tried, what="the output of forward", fix=_FORWARD_FIX)
        atol, rtol = _tolerance((o_exp,), torch.float64)
        if not same(out, o_exp, atol=atol, rtol=rtol):
            found = [m for m in _forward_mistakes(case) if (val := m.value()) is not None
                     and not same(val, o_exp, atol=atol, rtol=rtol) and same(out, val, atol=atol, rtol=rtol)]
            got_text, exp_text, cause, summary = describe_mismatch(out, o_exp, what="the output of forward", atol=atol,
                                                                   rtol=rtol, factors={"√d_k": math.sqrt(q.shape[-1])})
            if exp_text in _GENERIC_EXPECTED:
                exp_text = "softmax(q kᵀ/√d_k) v, as F.scaled_dot_product_attention computes it (in float64)"
            if found:
                m = found[0]
                fail(m.summary, tried=tried, got=f"the output of forward: {got_text}", expected=exp_text, cause=m.cause,
                     fix=m.fix)
            fail(f"forward: {summary}", tried=tried, got=f"the output of forward: {got_text}", expected=exp_text,
                 cause=cause, fix=_FORWARD_FIX)
        if grads is None:
            fail("no gradient reaches the inputs", tried=tried, got="the output does not depend on q, k, v through autograd",
                 expected="gradients from your backward", fix="return the output of forward itself (not a detached copy)")
        missing = [name for name, gr in zip(NAMES, grads) if gr is None]
        if missing:
            fail(f"backward returned None for {', '.join(missing)}", tried=tried, got=f"no gradient for {', '.join(missing)}",
                 expected="(dq, dk, dv, None)", cause=_BACKWARD_COUNT, fix="return dq, dk, dv, None")
        got = tuple(as_tensor(gr, tried=tried, what=f"the backward's {name}") for name, gr in zip(NAMES, grads))
        _expect_grads(got, expected, tried=tried, dtype=torch.float64, mistakes=_naive_mistakes(case),
                      nan_cause="a fully masked row went through a softmax over -inf everywhere (0/0)" if mask is not None else "",
                      nan_fix="compute P with the course's masked_softmax(scores, mask)")
    # backward by hand: watched while it runs (called directly with the ctx forward filled)
    case = cases[1]
    tried = f"AttentionFunction.backward on {case['name']}, watching the functions it calls"
    report = fn.observe("backward.function_watch", case["q"], case["k"], case["v"], case["mask"], case["dout"])
    used = [c for c in report.get("calls", []) if c in ("grad", "backward", "vjp", "jacobian")]
    if used:
        fail("backward uses autograd", tried=tried, got=f"your backward calls {', '.join(_WATCHED[c] for c in used)}",
             expected="a backward written from the formulas (ref.attention_backward, or your own)",
             cause="the gradients are right because autograd differentiated the forward again: the exercise asks "
                   "for the hand-written backward", fix="return (*ref.attention_backward(q, k, v, dout, mask), None)")
    # two calls in one graph (two attention layers): each backward must use its own call's tensors
    g = torch.Generator().manual_seed(15)
    first, second = ([_rand(g, 2, 4, 3), _rand(g, 2, 6, 3), _rand(g, 2, 6, 2)] for _ in range(2))
    upstream = [_rand(g, 2, 4, 2), _rand(g, 2, 4, 2)]
    tried = ("o1 = AttentionFunction.apply(q1, k1, v1); o2 = AttentionFunction.apply(q2, k2, v2); then one backward "
             "through both (two attention layers in one model)")
    try:
        grads = fn.observe("backward.function_twice", first, second, upstream)
    except LearnerRaised as exc:
        raise Failure(learner_error(exc, tried=tried, expected="the gradients of both calls",
                                    **_apply_hint(exc, first[0]))) from None
    expected = [*_oracle(*first, upstream[0])[1], *_oracle(*second, upstream[1])[1]]
    got = [as_tensor(x, tried=tried, what="a gradient") if x is not None else None for x in grads]
    atol, rtol = _tolerance(tuple(expected), torch.float64)
    bad = [i for i, (x, e) in enumerate(zip(got, expected)) if x is None or not same(x, e, atol=atol, rtol=rtol)]
    if bad:
        fail("two calls share their state", tried=tried,
             got=f"wrong gradients for call {', '.join(sorted({str(i // 3 + 1) for i in bad}))} (right when each call "
                 "is alone)",
             expected="each call's gradients computed from that call's own q, k, v",
             cause="forward keeps what backward needs somewhere all calls share (an attribute of the class, a global "
                   "variable), so the second call overwrites the first call's tensors",
             fix="keep per-call state on ctx only: ctx.save_for_backward(q, k, v, mask), ctx.anything = …")
    # gradcheck, run next to the learner's class (finite differences of its own forward vs its backward).
    g = torch.Generator().manual_seed(12)
    q, k, v = _rand(g, 2, 3, 4), _rand(g, 2, 5, 4), _rand(g, 2, 5, 2)
    mask = torch.tensor([[True, True, False, True, False], [False, True, True, False, True], [True] * 5])
    tried = "torch.autograd.gradcheck(AttentionFunction.apply, (q, k, v, mask)) in float64, shapes (2, 3, 4), (2, 5, 4), (2, 5, 2)"
    report = fn.observe("backward.gradcheck", q, k, v, mask, timeout=60)
    if not isinstance(report, dict) or not report.get("passed"):
        message = str(report.get("error", "")) if isinstance(report, dict) else repr(report)
        fail("gradcheck fails", tried=tried, got=message[:400] or "gradcheck returned False",
             expected="gradcheck passes: your backward agrees with finite differences of your forward",
             fix="compare your backward's formulas with the exercise's, line by line")
    return (f"forward and backward match autograd through F.scaled_dot_product_attention on {len(cases)} cases "
            f"(masks, a fully masked row) and with two calls in one graph; the backward is by hand; gradcheck passes")


@probe("backward.function_watch")
def _function_watch_probe(cls: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any,
                          dout: torch.Tensor) -> dict:
    """Run ``cls.apply`` once, then call ``cls.backward`` directly on the node it made (the ``ctx`` its forward
    filled) under :class:`_Watch`, as autograd would (gradients off). Reports the watched functions it called."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = cls.apply(*leaves, *(() if mask is None else (mask,)))
    ctx = getattr(out, "grad_fn", None)
    if ctx is None:
        return {"calls": []}
    watch = _Watch()
    with torch.no_grad(), watch:
        cls.backward(ctx, dout)
    return {"calls": sorted(watch.calls)}


@probe("backward.function_twice")
def _function_twice_probe(cls: Any, first: list, second: list, upstream: list) -> list:
    """Two calls of ``cls.apply`` in one graph, one backward through both: the six gradients (q1, k1, v1, q2, k2, v2)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (*first, *second)]
    outs = (cls.apply(*leaves[:3]), cls.apply(*leaves[3:]))
    return list(torch.autograd.grad(outs, leaves, upstream, allow_unused=True))


@probe("backward.gradcheck")
def _gradcheck_probe(cls: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> dict:
    """torch.autograd.gradcheck of ``cls.apply`` in float64 (run where the class lives); plain data back."""
    inputs = tuple(t.detach().clone().requires_grad_(True) for t in (q, k, v)) + (mask,)
    try:
        return {"passed": bool(torch.autograd.gradcheck(cls.apply, inputs, eps=1e-6, atol=1e-5))}
    except Exception as exc:  # noqa: BLE001 - gradcheck's own report of what differs
        return {"passed": False, "error": f"{type(exc).__name__}: {exc}".strip()}


# ============================================================================ exercise 3: tiled_attention_backward
#: The structural probe's size: n² = 1,048,576 numbers for one head; a (128, 128) tile holds 16,384.
BIG_N, BIG_D, BIG_BLOCK = 1024, 16, 128


def _tiled_cases() -> list[dict]:
    from ..backward import tiled_attention_forward

    g = torch.Generator().manual_seed(13)
    cases = []

    def add(name, lead, n, m, d, dv, block, causal, dtype=torch.float64, extreme=False, pass_block=True,
            explicit_false=False):
        q = _spread_queries(g, *lead, n, d, dtype=dtype)
        if extreme:
            q = q * 300
        k = _rand(g, *lead, m, d, dtype=dtype)
        if extreme:  # key 1, blocked for query 0 in the same tile when causal, scores far above key 0
            k[..., 1, :] = 3 * q[..., 0, :] / q[..., 0, :].norm(dim=-1, keepdim=True)
        v = _rand(g, *lead, m, dv, dtype=dtype)
        dout = _rand(g, *lead, n, dv, dtype=dtype, scale=1e4 if extreme else 1.0)
        o, lse = tiled_attention_forward(q.double(), k.double(), v.double(), 16, causal=causal)
        cases.append(dict(name=name, q=q, k=k, v=v, o=o.to(dtype), lse=lse.to(dtype), dout=dout, block=block,
                          causal=causal, dtype=dtype, extreme=extreme, pass_block=pass_block,
                          explicit_false=explicit_false))

    add("n_q = n_k = 12, block 4 (3 × 3 tiles), d_k = 6, d_v = 3", (), 12, 12, 6, 3, 4, False)
    add("causal, n_q = n_k = 12, block 4, d_k = 5, d_v = 5", (), 12, 12, 5, 5, 4, True)
    add("n_q = 10, n_k = 13, block 4 (n_q and n_k not multiples of it), batch 2, d_k = 6, d_v = 2", (2,), 10, 13, 6, 2, 4, False)
    add("causal, batch × heads (2, 3), n_q = n_k = 11, block 3, d_k = 5, d_v = 6", (2, 3), 11, 11, 5, 6, 3, True)
    add("causal, block 1, n_q = n_k = 5, d_k = 2, d_v = 3", (), 5, 5, 2, 3, 1, True)
    add("block 16 longer than n_q = 7, n_k = 9, d_k = 3, d_v = 2", (1,), 7, 9, 3, 2, 16, False, explicit_false=True)
    add("causal, block 8 longer than n_q = n_k = 6, d_k = 3, d_v = 4", (), 6, 6, 3, 4, 8, True)
    add("axes of size 1: one query, one key, d_k = 1, d_v = 1, block 2", (1, 1), 1, 1, 1, 1, 2, False)
    add("causal, one query and key, d_k = 2, d_v = 1, block 3", (), 1, 1, 2, 1, 3, True)
    add("the default block size (no block_size passed), n_q = 70, n_k = 75, d_k = 2, d_v = 2", (), 70, 75, 2, 2, 64, False,
        pass_block=False)
    add("float32, causal, batch 2, n_q = n_k = 33, block 8, d_k = 8, d_v = 4", (2,), 33, 33, 8, 4, 8, True, dtype=torch.float32)
    add("extreme values: scores of order ±10³ (L ≈ 10³), a blocked key scoring far above the allowed ones, upstream "
        "gradient ×10⁴, causal, n_q = n_k = 9, block 4", (), 9, 9,
        5, 3, 4, True, extreme=True)
    return cases


def _call_tiled(fn: Learner, case: dict, tried: str, *, full_blocks_passed: bool = False):
    args = (case["q"], case["k"], case["v"], case["o"], case["lse"], case["dout"])
    kwargs = {}
    if case["pass_block"]:
        args += (case["block"],)
    if case["causal"] or case["explicit_false"]:
        kwargs["causal"] = case["causal"]
    try:
        return fn(*args, **kwargs)
    except LearnerRaised as exc:
        hint = {}
        if exc.type_name == "TypeError" and "causal" in exc.message:
            hint = dict(cause="your function does not take the causal argument",
                        fix="keep the signature tiled_attention_backward(q, k, v, o, lse, dout, block_size=64, causal=False)")
        elif (full_blocks_passed and exc.type_name in ("RuntimeError", "IndexError")
              and (case["q"].shape[-2] % case["block"] or case["k"].shape[-2] % case["block"])):
            hint = dict(cause="your code ran on the cases where every block is full; here the last block is shorter "
                              "than block_size (n_q or n_k is not a multiple of it), and code that assumes full "
                              "blocks breaks on it",
                        fix="take each block's end as min(start + block_size, n) and size its tensors from the slice")
        else:
            hint = _dtype_hint(exc)
        raise Failure(learner_error(exc, tried=tried, expected="(dq, dk, dv)", **hint)) from None


def _tiled_tried(case: dict) -> str:
    block = f", {case['block']}" if case["pass_block"] else ""
    causal = ", causal=True" if case["causal"] else (", causal=False" if case["explicit_false"] else "")
    return f"tiled_attention_backward(q, k, v, o, lse, dout{block}{causal}) on {case['name']}"


@check("tiled_attention_backward", timeout=30.0,
       expects="a function tiled_attention_backward(q, k, v, o, lse, dout, block_size=64, causal=False) "
               "returning (dq, dk, dv)")
def check_tiled_attention_backward(fn: Learner) -> str:
    cases = _tiled_cases()
    # First, what the code does besides its result: autograd or a fused attention, or writes into an input.
    case = cases[0]
    tried = f"{_tiled_tried(case)}, watching the functions it calls"
    try:
        report = fn.observe("backward.watch", case["q"], case["k"], case["v"], case["o"], case["lse"], case["dout"],
                            case["block"])
    except LearnerRaised:
        report = {}  # the same call runs again below, where its error gets the full diagnosis
    _forbid_calls(report, tried, what="tiled_attention_backward")
    _forbid_changes(report, tried, ("q", "k", "v", "o", "lse", "dout"))
    for index, case in enumerate(cases):
        tried = _tiled_tried(case)
        full_blocks_passed = any(c["q"].shape[-2] % c["block"] == 0 == c["k"].shape[-2] % c["block"]
                                 for c in cases[:index])
        got = _unpack(_call_tiled(fn, case, tried, full_blocks_passed=full_blocks_passed), tried)
        _, expected = _oracle(case["q"], case["k"], case["v"], case["dout"], causal=case["causal"])
        nan_cause = ("your gradients were finite on every earlier case, so exp overflowed on scores this large"
                     if case["extreme"] else "")
        _expect_grads(got, expected, tried=tried, dtype=case["dtype"], mistakes=_tiled_mistakes(case),
                      nan_cause=nan_cause, nan_fix="exponentiate S − L in one step, torch.exp(s - lse[..., q_start:q_end, "
                      "None]), and give blocked scores −∞ before exp (or select with torch.where after it)")
    reports = _watch_big(fn)  # fails on an n × n tensor, autograd or an input written into
    _check_delta_from_o(fn, cases[2])
    _check_tiles(reports)
    return (f"matches autograd through F.scaled_dot_product_attention on {len(cases)} cases (causal or not, blocks 1…64, "
            f"n_q, n_k not multiples of the block, size-1 axes, float32, L ≈ 10³); D from o; at n = {BIG_N} no n × n "
            f"tensor, tiles of block_size, causal skips the tiles above the diagonal")


def _check_delta_from_o(fn: Learner, case: dict) -> None:
    """The docstring's D = rowsum(dout ⊙ o): with an o no forward made, the result must follow that o."""
    g = torch.Generator().manual_seed(16)
    other_o = case["o"] + 0.5 * _rand(g, *case["o"].shape, dtype=case["dtype"])
    changed = dict(case, o=other_o)
    tried = _tiled_tried(case).replace(" on ", " with o replaced by o + 0.5·noise (not the forward's output), on ", 1)
    got = _unpack(_call_tiled(fn, changed, tried), tried)
    expected = _tiled_variant(case["q"], case["k"], case["v"], other_o, case["lse"], case["dout"], case["block"],
                              case["causal"])
    atol, rtol = _tolerance(expected, case["dtype"])
    if all(same(a, b, atol=atol, rtol=rtol) for a, b in zip(got, expected)):
        return
    _, unchanged = _oracle(case["q"], case["k"], case["v"], case["dout"], causal=case["causal"])
    if all(same(a, b, atol=atol, rtol=rtol) for a, b in zip(got, unchanged)):
        fail("D not computed from o", tried=tried,
             got="the same gradients as with the forward's o: your result does not depend on o",
             expected="gradients that follow the o passed in, through D = rowsum(dout ⊙ o)",
             cause="D, the row term of the softmax's VJP, came from recomputed tiles of P (as rowsum(dP ⊙ P), or "
                   "through an O rebuilt as P V) instead of from the o passed in: right numbers for extra work, and "
                   "not the FlashAttention-2 backward",
             fix="delta = (dout * o).sum(-1, keepdim=True), once, before the loops")
    fail("o used other than through D", tried=tried,
         got="gradients that are neither those of D = rowsum(dout ⊙ o) for this o nor those of the forward's o",
         expected="gradients that follow the o passed in, through D = rowsum(dout ⊙ o) and nowhere else",
         fix="use o only in delta = (dout * o).sum(-1, keepdim=True), computed once before the loops")


def _watch_big(fn: Learner) -> dict:
    """The watch probe's reports at n = BIG_N, causal and not; fails on what a single report shows (an n × n
    tensor, autograd, an input written into)."""
    from ..backward import tiled_attention_forward

    g = torch.Generator().manual_seed(14)
    q, k, v, dout = (_rand(g, 1, BIG_N, BIG_D) for _ in range(4))
    o, lse = tiled_attention_forward(q, k, v, 256)
    reports = {}
    for causal in (False, True):
        tried = (f"watching tiled_attention_backward(q, k, v, o, lse, dout, {BIG_BLOCK}{', causal=True' if causal else ''}) "
                 f"at n_q = n_k = {BIG_N}, d_k = d_v = {BIG_D}, one head")
        kwargs = {"causal": True} if causal else {}
        try:
            report = fn.observe("backward.watch", q, k, v, o, lse, dout, BIG_BLOCK, timeout=120, **kwargs)
        except LearnerRaised as exc:
            raise Failure(learner_error(exc, tried=tried, expected="(dq, dk, dv)")) from None
        _forbid_calls(report, tried, what="tiled_attention_backward")
        _forbid_changes(report, tried, ("q", "k", "v", "o", "lse", "dout"))
        largest, shape = int(report["largest"]), tuple(report["shape"])
        if largest >= BIG_N * BIG_N // 4:
            fail("built an n × n tensor", tried=tried, got=f"your function created a tensor of shape {shape} "
                 f"({largest:,} numbers)",
                 expected=f"nothing near n × n = {BIG_N * BIG_N:,} numbers: tiles of {BIG_BLOCK}×{BIG_BLOCK} = "
                          f"{BIG_BLOCK * BIG_BLOCK:,}, and vectors of n · d_k = {BIG_N * BIG_D:,}",
                 cause="the full score matrix (or dS, dP, or a full-size causal mask) was materialised; the tiled "
                       "backward's point is to hold one tile at a time",
                 fix="compute S, P, dP and dS one (block, block) tile at a time inside the two loops, and build "
                     "the causal mask per tile from global positions")
        reports[causal] = report
    return reports


def _check_tiles(reports: dict) -> None:
    """Tiles of block_size × block_size, and with causal=True only the tiles on or below the diagonal."""
    for causal, report in reports.items():
        tried = (f"watching tiled_attention_backward(q, k, v, o, lse, dout, {BIG_BLOCK}{', causal=True' if causal else ''}) "
                 f"at n_q = n_k = {BIG_N}, d_k = d_v = {BIG_D}, one head")
        tile = sorted(report.get("exp_tile") or [])
        if tile and tile != [BIG_BLOCK, BIG_BLOCK]:
            fail("block_size ignored", tried=tried, got=f"the largest tile you exponentiated is {tile[0]}×{tile[1]}",
                 expected=f"tiles of {BIG_BLOCK}×{BIG_BLOCK}, the block_size passed, for queries and for keys",
                 cause=f"one of your loops steps by something other than block_size: {tile[0]}×{tile[1]} tiles"
                       if tile[1] <= BIG_BLOCK else f"a block of {tile[1]} queries or keys at once, more than "
                       f"block_size = {BIG_BLOCK}: a whole strip, or blocks of another size",
                 fix="step both loops, over query blocks and over key blocks, by block_size")
    full, causal = reports[False], reports[True]
    blocks = BIG_N // BIG_BLOCK
    visited = blocks * (blocks + 1) // 2  # tiles on or below the diagonal
    tried = f"watching the work with causal=True and False at n = {BIG_N}, blocks of {BIG_BLOCK} ({blocks} × {blocks} tiles)"
    if causal.get("zero_tiles", 0) and not full.get("zero_tiles", 0):
        fail("causal: tiles above the diagonal not skipped", tried=tried,
             got=f"{causal['zero_tiles']} of the tiles you exponentiated were masked entirely (every key in them after "
                 "every query)", expected=f"only the {visited} tiles on or below the diagonal visited",
             cause="your query loop starts before the key block's own block, so tiles that lie wholly above the "
                   "diagonal are computed and then masked away: right values, wasted work",
             fix="for key block j, start the query loop at block j: range(k_start, n, block_size)")
    measure = next((m for m in ("exp_elements", "flops", "elements") if full[m] and causal[m]), "elements")
    ratio = causal[measure] / full[measure] if full[measure] else 0.0
    limit = (visited + (blocks - 1) / 2) / blocks**2  # halfway to one extra tile per key block
    if full[measure] and ratio > limit:
        fail("causal: tiles above the diagonal not skipped", tried=tried,
             got=f"causal work is {ratio:.2f} × the non-causal work",
             expected=f"{visited / blocks**2:.2f} ×: only the {visited} of {blocks**2} tiles on or below the diagonal are "
                      "visited",
             cause="you computed the tiles above the diagonal and masked them out, which gives the right values at "
                   "twice the cost" if ratio > 0.9 else "your query loop starts before the key block's own block for "
                   "some key blocks, so some tiles wholly above the diagonal are computed",
             fix="for key block j, start the query loop at block j: range(k_start, n, block_size)")

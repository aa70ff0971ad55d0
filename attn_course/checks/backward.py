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
from .compare import Failure, as_tensor, describe_mismatch, expect_close, expect_shape, fail, same
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
        return out


@probe("backward.watch")
def _watch_probe(obj: Callable[..., Any], *args: Any, **kwargs: Any) -> dict:
    """Run ``obj(*args, **kwargs)`` once and report what it did: ``largest`` (elements of the largest
    tensor storage created) and its ``shape``, ``flops`` (of matrix products called from Python),
    ``exp_elements`` and ``exp_tile`` (what went through exp), ``elements`` (of every tensor created),
    ``calls`` (watched functions used) and ``changed`` (positions of tensor arguments it wrote into).
    The result itself is dropped: only these numbers cross."""
    watch = _Watch()
    before = [(i, a.clone()) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    with watch:
        obj(*args, **kwargs)
    changed = [i for i, copy in before if not torch.equal(args[i], copy)]
    return {"changed": changed, "largest": int(watch.largest), "shape": [int(s) for s in watch.shape], "calls": sorted(watch.calls),
            "flops": int(watch.flops), "exp_elements": int(watch.exp_elements), "elements": int(watch.elements),
            "exp_tile": [int(s) for s in watch.exp_tile]}


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
    # tiled
    "fresh_max": ("P recomputed with a fresh max instead of the stored L", "you recomputed each tile as "
                  "exp(S − the tile's own row max); that tile is not normalised like the forward's P",
                  "P = exp(S − L) with the saved logsumexp L of each row: no max, no sum"),
    "tile_softmax": ("P recomputed as a softmax over one tile", "you took a softmax over each tile; P's rows are "
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


def _naive_variant(q, k, v, dout, mask, bug: str = ""):
    """The chain-rule backward in float64 with one known bug (``bug=""``: none)."""
    q, k, v, dout = (t.to(torch.float64) for t in (q, k, v, dout))
    d = q.shape[-1]
    scale = 1 / math.sqrt(d)
    s = q @ k.transpose(-2, -1) * (1.0 if bug == "s_unscaled" else scale)  # (..., n_q, n_k)
    if bug == "mask_ignored":
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
    else:
        p = masked_softmax(s, mask)
    dv = (p @ dout) if bug == "dv_transposed" else p.transpose(-2, -1) @ dout
    dv = dv * scale if bug == "dv_scaled" else dv
    dp = dout @ v.transpose(-2, -1)
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
    elif bug == "sign":
        ds = p * (rows - dp)
    else:
        ds = p * (dp - rows)
    sq = {"no_scale_dq": 1.0, "no_scale": 1.0, "by_d": 1 / d}.get(bug, scale)
    sk = {"no_scale_dk": 1.0, "no_scale": 1.0, "by_d": 1 / d}.get(bug, scale)
    dq = (ds.transpose(-2, -1) @ k if bug == "dq_transposed" else ds @ k) * sq
    dk = (ds @ q if bug == "dk_transposed" else ds.transpose(-2, -1) @ q) * sk
    return dq, dk, dv


def _naive_mistakes(case: dict, bugs: tuple[str, ...] | None = None) -> list[GradMistake]:
    q, k, v, dout, mask = case["q"], case["k"], case["v"], case["dout"], case["mask"]
    fully_masked = mask is not None and bool((~mask).all(-1).any())
    bugs = bugs or (("no_scale_dq", "no_scale_dk", "no_scale", "by_d", "s_unscaled", "dk_transposed", "dq_transposed",
                     "dv_transposed", "dv_scaled", "no_rowsum", "rowsum_axis", "rowsum_broadcast", "rowsum_unweighted",
                     "rowsum_all", "sign", "softmax_axis")
                    + (("unstable",) if case.get("extreme") else ())
                    + (("mask_ignored", "mask_inverted") if mask is not None else ())
                    + (("nan_rows", "weak_fill") if fully_masked else ()))
    return [_mistake(bug, lambda bug=bug: _naive_variant(q, k, v, dout, mask, bug)) for bug in bugs]


def _tiled_variant(q, k, v, o, lse, dout, block: int, causal: bool, bug: str = ""):
    """The FlashAttention-2 backward in float64 with one known bug (``bug=""``: none)."""
    q, k, v, o, lse, dout = (t.to(torch.float64) for t in (q, k, v, o, lse, dout))
    n, m, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(d)
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
            if masked and bug != "diag_unmasked":
                rows = torch.arange(qs, qe)[:, None] - (qs if bug == "local_mask" else 0)
                cols = torch.arange(ks, ke)[None, :] - (ks if bug == "local_mask" else 0)
                blocked = {"mask_self": cols >= rows, "mask_ahead": cols > rows + 1}.get(bug, cols > rows)
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
            else:
                p = torch.exp(s - l_blk[..., None])
            tv = (p @ dob) if bug == "dv_transposed" else p.transpose(-2, -1) @ dob
            tv = tv * scale if bug == "dv_scaled" else tv
            dp = dob @ vb.transpose(-2, -1)
            d_blk = delta[..., qs:qe]
            if bug == "no_rowsum":
                ds = p * dp
            elif bug == "delta_tile":
                ds = p * (dp - (dp * p).sum(-1, keepdim=True))
            elif bug == "delta_tile_axis":
                ds = p * (dp - (dp * p).sum(-2, keepdim=True))
            elif bug == "delta_broadcast":
                ds = p * (dp - d_blk[..., None, :])
            else:
                ds = p * (dp - d_blk[..., None])
            tq = ds @ kb * sq
            tk = (ds @ qb if bug == "dk_transposed" else ds.transpose(-2, -1) @ qb) * sk
            if bug == "dq_overwritten":
                dq[..., qs:qe, :] = tq
            else:
                dq[..., qs:qe, :] += tq
            if bug == "dkdv_overwritten":
                dkb, dvb = tk, tv
            else:
                dkb, dvb = dkb + tk, dvb + tv
        dk[..., ks:ke, :], dv[..., ks:ke, :] = dkb, dvb
    return dq, dk, dv


_TILED_BUGS = ("no_scale_dq", "no_scale_dk", "no_scale", "by_d", "s_unscaled", "dk_transposed", "dv_transposed",
               "dv_scaled", "no_rowsum", "exp2_unconverted", "fresh_max", "tile_softmax", "lse_as_sum", "lse_broadcast", "delta_tile",
               "delta_tile_axis", "delta_broadcast", "dq_overwritten", "dkdv_overwritten", "q_tail", "k_tail",
               "both_tails")
_CAUSAL_BUGS = ("no_causal", "diag_unmasked", "skip_diag", "mask_self", "mask_ahead", "local_mask")


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
    return (1e-9 * big, 1e-7) if dtype == torch.float64 else (2e-4 * big, 2e-3)


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
               exp_text)
    for i in wrong:
        g = got[i]
        if torch.isnan(g).any() and nan_cause and not torch.isnan(expected[i]).any():
            fail(f"NaN in {NAMES[i]}", tried=tried, got=f"NaN in {int(torch.isnan(g).sum())} of {g.numel()} entries of your {NAMES[i]}",
                 expected="finite gradients", cause=nan_cause, fix=nan_fix)
    expect_close(got[wrong[0]], expected[wrong[0]], tried=tried, what=f"your {name}", atol=atol, rtol=rtol,
                 factors=factors)


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

    add("one head, n_q = n_k = 5, d_k = 9, d_v = 3, no mask", (), 5, 5, 9, 3, q_scale=1.5)
    add("batch × heads (2, 3), n_q = 4, n_k = 6, d_k = 8, d_v = 5, no mask", (2, 3), 4, 6, 8, 5)
    keep = torch.rand(5, 7, generator=g) < 0.6
    keep[:, 0], keep[1, 2] = True, False
    keep[3] = False  # query 3 sees nothing: zero weights, zero output, zero gradients
    add("batch 2, n_q = 5, n_k = 7, d_k = 6, d_v = 6, a (5, 7) mask with row 3 fully masked", (2,), 5, 7, 6, 6, mask=keep)
    pad = (torch.arange(6) < torch.tensor([6, 0, 4])[:, None])[:, None, None, :]  # (3, 1, 1, 6): batch 1 all padding
    add("key padding (3, 1, 1, 6) over 2 heads, n_q = 4, n_k = 6, d_k = 5, d_v = 2; batch entry 1 fully padded", (3, 2),
        4, 6, 5, 2, mask=pad)
    add("a causal (6, 6) mask, one head, d_k = 3, d_v = 7", (), 6, 6, 3, 7, mask=torch.ones(6, 6, dtype=torch.bool).tril())
    add("float32, batch 2, n_q = 9, n_k = 8, d_k = 16, d_v = 4", (2,), 9, 8, 16, 4, dtype=torch.float32)
    add("axes of size 1: batch 1, one query, one key, d_k = 1, d_v = 1", (1,), 1, 1, 1, 1)
    add("one query, n_q = 1, n_k = 5, d_k = 2, d_v = 3, with a (1, 5) mask", (), 1, 5, 2, 3,
        mask=torch.tensor([[True, False, True, True, False]]))
    add("extreme values: scores up to ±10³ (saturated softmax), upstream gradient ×10⁴", (2,), 5, 6, 4, 3,
        q_scale=400.0, dout_scale=1e4, extreme=True)
    return cases


def _call_backward(fn: Learner, case: dict, tried: str):
    q, k, v, dout, mask = case["q"], case["k"], case["v"], case["dout"], case["mask"]
    try:
        return fn(q, k, v, dout) if mask is None else fn(q, k, v, dout, mask)
    except LearnerRaised as exc:
        hint = {}
        if mask is not None and exc.type_name == "TypeError" and "argument" in exc.message:
            hint = dict(cause="your function does not take the mask as its fifth argument",
                        fix="keep the signature attention_backward(q, k, v, dout, mask=None)")
        elif exc.type_name == "RuntimeError" and ("mat1 and mat2" in exc.message or "size of tensor" in exc.message
                                                  or "shapes cannot be multiplied" in exc.message):
            hint = dict(cause="two tensors with incompatible shapes were multiplied; with n_q ≠ n_k or d_k ≠ d_v a transpose "
                              "in the wrong place shows up as exactly this",
                        fix="write each line's shapes next to it: P (..., n_q, n_k), dO (..., n_q, d_v), dV = Pᵀ dO (..., n_k, d_v), "
                            "dP = dO Vᵀ (..., n_q, n_k), dQ = dS K (..., n_q, d_k), dK = dSᵀ Q (..., n_k, d_k)")
        raise Failure(learner_error(exc, tried=tried, expected="(dq, dk, dv)", **hint)) from None


@check("attention_backward", expects="a function attention_backward(q, k, v, dout, mask=None) returning (dq, dk, dv)")
def check_attention_backward(fn: Learner) -> str:
    cases = _backward_cases()
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
    case = cases[1]
    tried = f"watching attention_backward on {case['name']}"
    report = fn.observe("backward.watch", case["q"], case["k"], case["v"], case["dout"])
    _forbid_calls(report, tried, what="attention_backward")
    _forbid_changes(report, tried, ("q", "k", "v", "dout"))
    return (f"matches autograd through F.scaled_dot_product_attention on {len(cases)} cases (masks, fully masked rows, "
            f"batch × heads, d_k ≠ d_v, size-1 axes, float32, saturated scores)")


# ============================================================================ exercise 2: AttentionFunction
def _function_cases() -> list[dict]:
    g = torch.Generator().manual_seed(11)
    out = []
    for name, lead, n, m, d, dv, mask in [
        ("batch × heads (2, 2), n_q = 4, n_k = 5, d_k = 3, d_v = 2, no mask", (2, 2), 4, 5, 3, 2, None),
        ("one head, n_q = n_k = 5, d_k = 4, d_v = 6, a causal mask", (), 5, 5, 4, 6, torch.ones(5, 5, dtype=torch.bool).tril()),
        ("batch 2, n_q = 3, n_k = 4, d_k = 2, d_v = 3, a mask with row 1 fully masked", (2,), 3, 4, 2, 3,
         torch.tensor([[True, False, True, True], [False, False, False, False], [False, True, True, False]])),
    ]:
        out.append(dict(name=name, q=_rand(g, *lead, n, d), k=_rand(g, *lead, m, d), v=_rand(g, *lead, m, dv),
                        dout=_rand(g, *lead, n, dv), mask=mask, dtype=torch.float64))
    return out


_BACKWARD_COUNT = ("the backward returns one gradient per input of forward, in order: for forward(ctx, q, k, v, mask) "
                   "that is four, the last one None because a bool mask has no gradient")


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
            hint = {}
            if "incorrect number of gradients" in exc.message:
                hint = dict(cause=_BACKWARD_COUNT, fix="return dq, dk, dv, None")
            elif "invalid gradient at index" in exc.message:
                hint = dict(cause="a gradient your backward returned does not have the shape of the input it belongs "
                                  "to: backward returns them in the order forward takes its inputs, (q, k, v, mask)",
                            fix="return dq, dk, dv, None")
            elif exc.type_name == "TypeError" and "positional argument" in exc.message and exc.phase == "call":
                hint = dict(cause="forward does not take the mask: apply passes its arguments to forward(ctx, …) in order",
                            fix="def forward(ctx, q, k, v, mask=None)")
            raise Failure(learner_error(exc, tried=tried, expected="the attention output, then its gradients", **hint)) from None
        o_exp, expected = _oracle(q, k, v, dout, mask)
        out = as_tensor(out, tried=tried, what="forward", expected="the attention output, one tensor (..., n_q, d_v)")
        forward_fix = "forward returns softmax(q kᵀ/√d_k) v with the course's masked_softmax: shape (..., n_q, d_v)"
        expect_shape(out, o_exp.shape, tried=tried, what="the output of forward", fix=forward_fix)
        if not same(out, o_exp, atol=1e-9, rtol=1e-7):
            got_text, exp_text, cause, summary = describe_mismatch(out, o_exp, what="the output of forward", atol=1e-9,
                                                                   rtol=1e-7, factors={"√d_k": math.sqrt(q.shape[-1])})
            fail(f"forward: {summary}", tried=tried, got=f"the output of forward: {got_text}", expected=exp_text,
                 cause=cause, fix=forward_fix)
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
            f"(masks, a fully masked row), gradcheck passes")


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
        v = _rand(g, *lead, m, dv, dtype=dtype)
        dout = _rand(g, *lead, n, dv, dtype=dtype, scale=1e4 if extreme else 1.0)
        o, lse = tiled_attention_forward(q.double(), k.double(), v.double(), 16, causal=causal)
        cases.append(dict(name=name, q=q, k=k, v=v, o=o.to(dtype), lse=lse.to(dtype), dout=dout, block=block,
                          causal=causal, dtype=dtype, extreme=extreme, pass_block=pass_block,
                          explicit_false=explicit_false))

    add("n_q = n_k = 12, block 4 (3 × 3 tiles), d_k = 4, d_v = 3", (), 12, 12, 4, 3, 4, False)
    add("causal, n_q = n_k = 12, block 4, d_k = 5, d_v = 5", (), 12, 12, 5, 5, 4, True)
    add("n_q = 10, n_k = 13, block 4 (n_q and n_k not multiples of it), batch 2, d_k = 6, d_v = 2", (2,), 10, 13, 6, 2, 4, False)
    add("causal, batch × heads (2, 3), n_q = n_k = 11, block 3, d_k = 4, d_v = 6", (2, 3), 11, 11, 4, 6, 3, True)
    add("causal, block 1, n_q = n_k = 5, d_k = 2, d_v = 3", (), 5, 5, 2, 3, 1, True)
    add("block 16 longer than n_q = 7, n_k = 9, d_k = 3, d_v = 2", (1,), 7, 9, 3, 2, 16, False, explicit_false=True)
    add("causal, block 8 longer than n_q = n_k = 6, d_k = 3, d_v = 4", (), 6, 6, 3, 4, 8, True)
    add("axes of size 1: one query, one key, d_k = 1, d_v = 1, block 2", (1, 1), 1, 1, 1, 1, 2, False)
    add("causal, one query and key, d_k = 2, d_v = 1, block 3", (), 1, 1, 2, 1, 3, True)
    add("the default block size (no block_size passed), n_q = 70, n_k = 75, d_k = 2, d_v = 2", (), 70, 75, 2, 2, 64, False,
        pass_block=False)
    add("float32, causal, batch 2, n_q = n_k = 33, block 8, d_k = 8, d_v = 4", (2,), 33, 33, 8, 4, 8, True, dtype=torch.float32)
    add("extreme values: scores up to ±10³ (L ≈ 10³), upstream gradient ×10⁴, causal, n_q = n_k = 9, block 4", (), 9, 9,
        4, 3, 4, True, extreme=True)
    return cases


def _call_tiled(fn: Learner, case: dict, tried: str):
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
        elif exc.type_name in ("RuntimeError", "IndexError") and case["q"].shape[-2] % case["block"]:
            hint = dict(cause="the last block is shorter than block_size here (n_q or n_k is not a multiple of it); "
                              "code that assumes full blocks breaks on it",
                        fix="take each block's end as min(start + block_size, n) and size its tensors from the slice")
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
    for case in cases:
        tried = _tiled_tried(case)
        got = _unpack(_call_tiled(fn, case, tried), tried)
        _, expected = _oracle(case["q"], case["k"], case["v"], case["dout"], causal=case["causal"])
        nan_cause = ("exp overflowed on scores this large: exponentiate S − L in one step, torch.exp(s - lse), never "
                     "exp(S) and exp(L) separately" if case["extreme"] else "")
        _expect_grads(got, expected, tried=tried, dtype=case["dtype"], mistakes=_tiled_mistakes(case),
                      nan_cause=nan_cause, nan_fix="P = torch.exp(s - lse[..., q_start:q_end, None])")
    _check_structure(fn)
    return (f"matches autograd through F.scaled_dot_product_attention on {len(cases)} cases (causal or not, blocks 1…64, "
            f"n_q, n_k not multiples of the block, size-1 axes, float32, L ≈ 10³); at n = {BIG_N} no n × n tensor, "
            f"tiles of block_size, causal skips the tiles above the diagonal")


def _check_structure(fn: Learner) -> None:
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
        tile = report.get("exp_tile") or []
        size = tile[0] * tile[1] if len(tile) == 2 else 0
        if size and not BIG_BLOCK * BIG_BLOCK // 2 <= size <= 2 * BIG_BLOCK * BIG_BLOCK:
            fail("block_size ignored", tried=tried, got=f"the largest tile you exponentiated is {tile[0]}×{tile[1]}",
                 expected=f"tiles of {BIG_BLOCK}×{BIG_BLOCK}, the block_size passed",
                 cause="your loops use a block size of their own instead of the block_size argument" if size < BIG_BLOCK
                       * BIG_BLOCK else "a whole strip of queries or keys is processed at once instead of a "
                       "(block_size, block_size) tile",
                 fix="step both loops, over query blocks and over key blocks, by block_size")
        reports[causal] = report
    full, causal = reports[False], reports[True]
    measure = next((m for m in ("exp_elements", "flops", "elements") if full[m] and causal[m]), "elements")
    if full[measure] and causal[measure] > 0.75 * full[measure]:
        fail("causal: tiles above the diagonal not skipped", tried=f"watching the work with causal=True and False at n = {BIG_N}",
             got=f"causal work is {causal[measure] / full[measure]:.2f} × the non-causal work",
             expected=f"about {(BIG_N // BIG_BLOCK + 1) / (2 * (BIG_N // BIG_BLOCK)):.2f} ×: only tiles on or below the diagonal are visited",
             cause="you computed the tiles above the diagonal and masked them out, which gives the right values "
                   "at twice the cost",
             fix="for key block j, start the query loop at block j: range(k_start, n, block_size)")

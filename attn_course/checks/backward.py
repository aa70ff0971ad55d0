"""Checks for notebook 10 (attention's backward pass): attention_backward, AttentionFunction,
tiled_attention_backward.

Oracle: autograd through ``F.scaled_dot_product_attention`` in float64 (from PyTorch 2.5 on it gives a fully
masked row a zero output and zero gradients, the course's convention). Cases vary every argument: masks,
fully masked rows, causal or not, blocks that do and do not divide n_q and n_k, batch and head axes,
d_k ≠ d_v, size-1 axes, float32, scores and upstream gradients far from 1.

Mistakes: one backward, :func:`_variant`, written once with a switch per known bug; each bug is a
:class:`~.kit.Known` row (:data:`TEXT`) that a :class:`~.kit.Suspects` engine tries on the three gradients at
once. When no row reproduces an answer the check measures it: a wrong scale (fitted), which line of the
chain rule is wrong (the right gradients pin dS down), zero rows, float32 precision, then the difference.
What outputs cannot show (an n × n tensor, the tile size, skipped causal tiles, autograd) is measured on
the learner's side by the probe ``backward.watch``; only plain numbers come back.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..softmax import masked_softmax
from .boundary import probe
from .compare import Failure, as_tensor, describe_mismatch, expect_close, expect_shape, fail, same
from .core import Learner, LearnerRaised, check, learner_error
from .kit import Known, Suspects, Watch, explain_raise, unpack, watch

__all__ = ["check_attention_backward", "check_AttentionFunction", "check_tiled_attention_backward"]

NAMES = ("dq", "dk", "dv")
INF = float("inf")
_ORACLE = "F.scaled_dot_product_attention"


# ============================================================================ probes (in the learner's process)
#: Functions whose use a check reports: autograd (the exercise is the chain rule by hand) and fused attention.
_WATCHED = {"grad": "torch.autograd.grad", "backward": ".backward()", "vjp": "a vector–Jacobian product from "
            "torch.func / torch.autograd.functional", "jacobian": "torch.autograd.functional.jacobian",
            "scaled_dot_product_attention": "F.scaled_dot_product_attention"}


@probe("backward.watch")
def _watch_probe(obj: Callable[..., Any], *args: Any, **kwargs: Any) -> dict:
    """``obj(*args, **kwargs)`` once under :class:`~.kit.Watch`; back come the largest tensor storage and its shape,
    the FLOPs of matrix products, what went through exp, the watched functions called (``calls``) and the positions
    of tensor arguments it wrote into (``changed``). The result itself is dropped."""
    before = [(i, a.clone()) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    report = watch(obj, *args, **kwargs)
    return {"changed": [i for i, copy in before if not torch.equal(args[i], copy)], "flops": int(report["flops"]),
            "calls": sorted(set(report["calls"]) & set(_WATCHED)),
            **{key: report[key] for key in ("largest", "shape", "exp_elements", "elements", "exp_tile", "zero_tiles")}}


@probe("backward.function_watch")
def _function_watch_probe(cls: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any,
                          dout: torch.Tensor) -> dict:
    """``cls.apply`` once, then ``cls.backward`` called directly on the node it made (the ``ctx`` its forward
    filled), watched, gradients off as autograd would: the watched functions it calls."""
    out = cls.apply(*[t.detach().clone().requires_grad_(True) for t in (q, k, v)], *(() if mask is None else (mask,)))
    if getattr(out, "grad_fn", None) is None:
        return {"calls": []}
    with torch.no_grad(), Watch() as seen:
        cls.backward(out.grad_fn, dout)
    return {"calls": sorted(set(seen.calls) & set(_WATCHED))}


@probe("backward.function_twice")
def _function_twice_probe(cls: Any, first: list, second: list, upstream: list) -> list:
    """Two calls of ``cls.apply`` in one graph, one backward through both: the six gradients (q1 … v2)."""
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


def _forbid(report: dict, tried: str, *, what: str, inputs: tuple[str, ...]) -> None:
    """Fail when the watch saw autograd or a fused attention, or an input written into."""
    used = [c for c in report.get("calls", []) if c in _WATCHED]
    if used:
        fail("called a fused attention" if "scaled_dot_product_attention" in used else
             "used autograd instead of the chain rule", tried=tried,
             got=f"your {what} calls {', '.join(_WATCHED[c] for c in used)}",
             expected=f"{what} written from the formulas, with matrix products and element-wise operations",
             cause="the values may be right, but autograd (or PyTorch's own attention) did the work the exercise asks "
                   "you to do", fix="compute dV, dP, dS, dQ and dK yourself, as the exercise's formulas say")
    changed = [inputs[i] for i in report.get("changed", []) if i < len(inputs)]
    if changed:
        fail(f"overwrote its input {changed[0]}", tried=tried,
             got=f"after the call, {', '.join(changed)} held different numbers than before",
             expected="the inputs left as they were: the caller still needs them",
             cause="an in-place write into an input: += or [...] = on it, or a result that is the input itself "
                   "(dk = k instead of dk = torch.zeros_like(k))",
             fix="allocate every result and accumulator as a new tensor (torch.zeros_like, torch.empty_like)")


def _watch(fn: Learner, tried: str, *args: Any, what: str, inputs: tuple[str, ...], **kwargs: Any) -> None:
    """:func:`_forbid` on the watch probe's report of ``fn(*args, **kwargs)``; a call that raises is left to the
    cases, where its error gets the full diagnosis."""
    try:
        _forbid(fn.observe("backward.watch", *args, **kwargs), tried, what=what, inputs=inputs)
    except LearnerRaised:
        pass


# ============================================================================ oracle and inputs
def _oracle(q, k, v, dout, mask=None, causal=False):
    """(o, (dq, dk, dv)) from autograd through F.scaled_dot_product_attention, in float64."""
    q, k, v = (t.detach().to(torch.float64).requires_grad_(True) for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    return o.detach(), torch.autograd.grad(o, (q, k, v), dout.to(torch.float64))


def _rand(g: torch.Generator, *shape: int, dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


# ============================================================================ known mistakes: one backward, switches
def _scales(bug: str, d: int, d_v: int) -> tuple[float, float, float, float]:
    """(scale of the scores, of dQ, of dK, the base scale) under ``bug``."""
    base = {"unscaled_all": 1.0, "by_d_all": 1 / d, "scale_dv": 1 / math.sqrt(d_v), "scale_inverted": math.sqrt(d)
            }.get(bug, 1 / math.sqrt(d))
    sq = {"no_scale_dq": 1.0, "no_scale": 1.0, "by_d": 1 / d}.get(bug, base)
    sk = {"no_scale_dk": 1.0, "no_scale": 1.0, "by_d": 1 / d}.get(bug, base)
    return (1.0 if bug == "s_unscaled" else base), sq, sk, base


def _weights(s: torch.Tensor, mask: Any, bug: str) -> torch.Tensor:
    """P from the whole score matrix (the chain-rule exercise and the forward), with one bug."""
    if bug in ("mask_ignored", "mask_ds_only"):
        return torch.softmax(s, -1)
    fill = {"nan_rows": -INF, "weak_fill": -1e9}
    if bug in fill:
        return torch.softmax(s.masked_fill(~mask, fill[bug]), -1)
    if bug == "unstable":  # fully masked rows set to zero, but no maximum subtracted
        e = torch.exp(s if mask is None else s.masked_fill(~mask, -INF))
        return e / e.sum(-1, keepdim=True) if mask is None else torch.where((~mask).all(-1, keepdim=True), 0.0,
                                                                            e / e.sum(-1, keepdim=True))
    return {"mask_inverted": lambda: masked_softmax(s, ~mask), "softmax_axis": lambda: masked_softmax(s, mask, dim=-2),
            "mask_after_softmax": lambda: torch.softmax(s, -1) * mask, "no_softmax": lambda: s,
            "mask_added": lambda: torch.softmax(s + mask.to(s.dtype), -1)}.get(bug, lambda: masked_softmax(s, mask))()


def _tile_weights(s: torch.Tensor, lse: torch.Tensor, bug: str) -> torch.Tensor:
    """P of one tile from the saved row logsumexp L (``lse``: (..., b)), with one bug."""
    ell = lse[..., None]
    return {"fresh_max": lambda: torch.exp(s - s.amax(-1, keepdim=True)), "tile_softmax": lambda: torch.softmax(s, -1),
            "lse_as_sum": lambda: torch.exp(s) / ell, "lse_broadcast": lambda: torch.exp(s - lse[..., None, :]),
            "exp2_unconverted": lambda: torch.exp2(s - ell), "lse_ignored": lambda: torch.exp(s),
            "lse_sign": lambda: torch.exp(s + ell), "exp_split": lambda: torch.exp(s) / torch.exp(ell),
            "no_exp": lambda: s - ell}.get(bug, lambda: torch.exp(s - ell))()


def _ds(p: torch.Tensor, dp: torch.Tensor, rows: torch.Tensor, bug: str) -> torch.Tensor:
    """dS = P ⊙ (dP − D) with one bug; ``rows`` is D, (..., b, 1)."""
    bugs = {"no_rowsum": lambda: p * dp, "no_p": lambda: dp - rows, "sign": lambda: p * (rows - dp),
            "ds_is_p": lambda: p, "rowsum_of_p": lambda: p * (dp - p.sum(-1, keepdim=True)),
            "rowsum_axis": lambda: p * (dp - (dp * p).sum(-2, keepdim=True)),
            "rowsum_broadcast": lambda: p * (dp - rows.squeeze(-1).unsqueeze(-2)),
            "rowsum_unweighted": lambda: p * (dp - dp.sum(-1, keepdim=True)),
            "rowsum_all": lambda: p * (dp - (dp * p).sum((-2, -1), keepdim=True)),
            "rowsum_mean": lambda: p * (dp - (dp * p).mean(-1, keepdim=True)),
            "diag_jacobian": lambda: p * (1 - p) * dp}
    bugs |= {"delta_tile_axis": bugs["rowsum_axis"], "delta_broadcast": bugs["rowsum_broadcast"]}
    return bugs.get(bug, lambda: p * (dp + rows if bug in ("delta_sign", "rowsum_sign") else dp - rows))()


def _variant(q, k, v, dout, bug: str = "", *, mask=None, o=None, lse=None, block=None, causal=False, scale=None,
             gscale=None):
    """The backward in float64 with one known bug (``bug=""``: none). Without ``lse``: the chain rule on the whole
    matrix (exercise 1). With ``o``, ``lse``: the FlashAttention-2 loops (exercise 3), key blocks outer, P = exp(S − L)
    per (block, block) tile, D = rowsum(dO ⊙ O). ``scale``/``gscale`` replace the scale of the scores / of dQ, dK."""
    q, k, v, dout = (t.to(torch.float64) for t in (q, k, v, dout))
    n, m, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s_scale, sq, sk, base = _scales(bug, d, v.shape[-1])
    s_scale = s_scale if scale is None else scale
    sq, sk = (sq, sk) if gscale is None else (gscale, gscale)
    tiled = lse is not None
    block = block if tiled else max(n, m, 1)
    if tiled:  # D: (..., n_q)
        o = o.to(torch.float64)
        delta = {"delta_mean": (dout * o).mean(-1), "delta_no_o": dout.sum(-1), "delta_no_dout": o.sum(-1)
                 }.get(bug, (dout * o).sum(-1))
    n_end = n - n % block if bug in ("q_tail", "both_tails") else n
    m_end = m - m % block if bug in ("k_tail", "both_tails") else m
    masked = causal and bug != "no_causal"
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for ks in range(0, m_end, block):
        ke = min(ks + block, m)
        kb, vb = k[..., ks:ke, :], v[..., ks:ke, :]
        dkb, dvb = torch.zeros_like(kb), torch.zeros_like(vb)
        for qs in range((ks + block if bug == "skip_diag" else ks) if masked else 0, n_end, block):
            qe = min(qs + block, n)
            qb, dob = q[..., qs:qe, :], dout[..., qs:qe, :]
            s = qb @ kb.mT * s_scale  # (..., b_q, b_k)
            blocked = None
            if masked and bug != "diag_unmasked":
                r = torch.arange(qs, qe)[:, None] - (qs if bug == "local_mask" else 0)  # query positions
                c = torch.arange(ks, ke)[None, :] - (ks if bug == "local_mask" else 0)  # key positions
                blocked = {"mask_self": c >= r, "mask_ahead": c > r + 1, "mask_offset_sign": c - r >= 2 * (ks - qs) + 1
                           }.get(bug, c > r)
                if bug != "mask_after_exp":
                    s = s.masked_fill(blocked, INF if bug == "mask_plus_inf" else -INF)
            p = _tile_weights(s, lse[..., qs:qe], bug) if tiled else _weights(s, mask, bug)
            if bug == "mask_after_exp" and blocked is not None:
                p = p * ~blocked
            tv = {"dv_transposed": lambda: p @ dob, "dv_uses_v": lambda: p.mT @ vb, "dv_no_p": lambda: dob,
                  "dv_no_dout": lambda: p.mT}.get(bug, lambda: p.mT @ dob)()
            tv = tv * base if bug == "dv_scaled" else tv
            dp = vb @ dob.mT if bug == "dp_transposed" else dob @ vb.mT
            rows = (dp * p).sum(-1, keepdim=True) if not tiled or bug == "delta_tile" else delta[..., qs:qe, None]
            ds = _ds(p, dp, rows, bug)
            ds = ds.masked_fill(~mask, 0.0) if bug == "mask_ds_only" else ds
            tq = {"dq_transposed": lambda: ds.mT @ kb, "dq_from_q": lambda: ds @ qb, "dq_no_ds": lambda: kb,
                  "dq_no_k": lambda: ds}.get(bug, lambda: ds @ kb)() * sq
            tk = {"dk_transposed": lambda: ds @ qb, "dk_from_k": lambda: ds.mT @ kb, "dk_no_ds": lambda: qb,
                  "dk_no_q": lambda: ds.mT}.get(bug, lambda: ds.mT @ qb)() * sk
            if not tiled:
                dq, dkb, dvb = tq, tk, tv
                continue
            if bug == "dq_overwritten":
                dq[..., qs:qe, :] = tq
            else:
                dq[..., qs:qe, :] += tq
            dkb = tk if bug in ("dkdv_overwritten", "dk_overwritten") else dkb + tk
            dvb = tv if bug in ("dkdv_overwritten", "dv_overwritten") else dvb + tv
        if not tiled:
            return dq, dkb, dvb
        dk[..., ks:ke, :], dv[..., ks:ke, :] = dkb, dvb
    return dq, dk, dv


_SCALE_FIX = "multiply dQ = dS K and dK = dSᵀ Q by 1/√d_k, the scale the forward put on Q Kᵀ"
_SQRT, _SCALE = "divide by math.sqrt(d_k)", "scale = 1 / math.sqrt(q.shape[-1])"
_DQ, _DK, _DV = "dQ = dS K/√d_k", "dK = dSᵀ Q/√d_k", "dV = Pᵀ dO: p.transpose(-2, -1) @ dout"
_DS = "dS = P ⊙ (dP − rowsum(dP ⊙ P))"
_VJP_FIX = "dS = P ⊙ (dP − (dP * P).sum(-1, keepdim=True))"
_MASK_FIX = "use the course's masked_softmax(scores, mask): a fully masked row gets zero weights, so zero gradients"
_TILE_P = "P = torch.exp(s - lse[..., q_start:q_end, None])"
_DELTA = "delta = (dout * o).sum(-1, keepdim=True)"
_LOOP = "loop with range(0, n_q, block_size) and slice [start:start + block_size] (the last slice is shorter)"
#: Every known mistake: key → (summary, cause, fix). The key is the bug's name in :func:`_variant`.
TEXT = {
    "no_scale_dq": ("1/√d_k missing in dQ", "the scores are Q Kᵀ/√d_k, so dQ = dS K/√d_k needs the 1/√d_k too",
                    _SCALE_FIX),
    "no_scale_dk": ("1/√d_k missing in dK", "the scores are Q Kᵀ/√d_k, so dK = dSᵀ Q/√d_k needs the 1/√d_k too",
                    _SCALE_FIX),
    "no_scale": ("1/√d_k missing in dQ and dK", "you left out the 1/√d_k in both dQ and dK", _SCALE_FIX),
    "by_d": ("divided by d_k instead of √d_k in dQ and dK", "you divided dQ and dK by d_k", _SQRT),
    "s_unscaled": ("scores not scaled when P is recomputed", "you recomputed the scores as Q Kᵀ without the 1/√d_k, "
                   "so P is not the forward's P", "recompute S = Q Kᵀ/√d_k, exactly as the forward did"),
    "unscaled_all": ("1/√d_k missing everywhere", "without 1/√d_k in the scores and in dQ, dK these are the gradients "
                     "of softmax(Q Kᵀ) V", "scale the scores (S = Q Kᵀ/√d_k) and dQ, dK by 1/√d_k"),
    "by_d_all": ("divided by d_k instead of √d_k everywhere", "you divided the scores and dQ, dK by d_k", _SQRT),
    "scale_inverted": ("multiplied by √d_k instead of dividing by it", "you multiplied the scores and dQ, dK by √d_k",
                       _SCALE),
    "scale_dv": ("scale from d_v instead of d_k", "you took the scale from v.shape[-1] = d_v; Q Kᵀ sums over d_k",
                 _SCALE),
    "dk_transposed": ("dK transposed: dS Q instead of dSᵀ Q", "dS (queries × keys) times Q without a transpose; dK "
                      "needs one row per key", "dK = dSᵀ Q/√d_k: dS.transpose(-2, -1) @ q"),
    "dq_transposed": ("dQ from dSᵀ instead of dS", "you transposed dS in dQ; dQ needs one row per query",
                      "dQ = dS K/√d_k, with dS of shape (..., n_q, n_k)"),
    "dv_transposed": ("dV = P dO instead of Pᵀ dO", "P times dO without a transpose; dV needs one row per key", _DV),
    "dk_from_k": ("dK from K instead of Q: dSᵀ K", "the scores are Q Kᵀ, so the gradient reaching K goes through Q",
                  _DK),
    "dq_from_q": ("dQ from Q instead of K: dS Q", "the scores are Q Kᵀ, so the gradient reaching Q goes through K",
                  _DQ),
    "dv_uses_v": ("dV from V instead of dO: Pᵀ V", "the gradient reaching V is Pᵀ times the upstream gradient dO", _DV),
    "dv_no_p": ("dV = dO: the factor Pᵀ is missing", "you returned dO as dV; each key's value receives dO weighted by "
                "how much each query attended to it", _DV),
    "dv_scaled": ("dV scaled by 1/√d_k", "the scale sits on the scores Q Kᵀ, so only dQ and dK carry it",
                  "dV = Pᵀ dO, with no scale"),
    "dp_transposed": ("dP transposed: V dOᵀ instead of dO Vᵀ", "dP has P's layout, one row per query",
                      "dP = dO Vᵀ: dout @ v.transpose(-2, -1)"),
    "no_rowsum": ("softmax VJP: the rowsum term is missing", "dS = P ⊙ dP leaves out the − rowsum(dP ⊙ P) of the "
                  "softmax's vector–Jacobian product (notebook 04)", _VJP_FIX),
    "rowsum_axis": ("softmax VJP: rowsum over the wrong axis", "you summed dP ⊙ P over the queries (axis -2); each "
                    "query's softmax is over its row of keys", "sum over the keys: (dP * P).sum(-1, keepdim=True)"),
    "rowsum_broadcast": ("softmax VJP: rowsum subtracted along the wrong axis", "summed without keepdim=True, the "
                         "(..., n_q) row sums broadcast along the keys' axis", "keep the summed axis: "
                         "(dP * P).sum(-1, keepdim=True), shape (..., n_q, 1)"),
    "rowsum_unweighted": ("softmax VJP: rowsum(dP) instead of rowsum(dP ⊙ P)", "the softmax's VJP subtracts the "
                          "weighted row sum ⟨dP, P⟩, not the plain one", _VJP_FIX),
    "rowsum_of_p": ("softmax VJP: rowsum(P) instead of rowsum(dP ⊙ P)", "the row sum of P is 1; the softmax's VJP "
                    "subtracts the row sum of dP ⊙ P", _VJP_FIX),
    "rowsum_all": ("softmax VJP: one sum over the whole matrix", "you summed dP ⊙ P over every query and key at once; "
                   "each query needs its own sum", "sum over the last axis only: (dP * P).sum(-1, keepdim=True)"),
    "rowsum_mean": ("softmax VJP: mean instead of sum", "the softmax's VJP subtracts the row sum of dP ⊙ P, not its "
                    "mean", _VJP_FIX),
    "rowsum_sign": ("softmax VJP: rowsum added instead of subtracted", "you computed dS = P ⊙ (dP + rowsum(dP ⊙ P))",
                    _VJP_FIX),
    "diag_jacobian": ("softmax VJP: only the Jacobian's diagonal", "P(1 − P) ⊙ dP leaves out the −pᵢpⱼ terms: each "
                      "weight depends on every score of its row", _VJP_FIX),
    "no_p": ("softmax VJP: the factor P is missing", "you computed dS = dP − rowsum(dP ⊙ P) without multiplying by P",
             _DS),
    "ds_is_p": ("dS = P: the bracket (dP − D) is missing", "you used the weights P as dS", _VJP_FIX),
    "sign": ("softmax VJP: sign flipped", "you computed P ⊙ (rowsum(dP ⊙ P) − dP), the negative of dS", _DS),
    "softmax_axis": ("softmax over the wrong axis", "you took the softmax over the queries (axis -2); each query's "
                     "weights are a softmax over its row of keys", "masked_softmax(scores, mask) (its dim=-1 default)"),
    "no_softmax": ("softmax forgotten: P = S", "you used the scaled scores themselves as the weights P",
                   "P = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), mask)"),
    "exp2_unconverted": ("exp2 without the log₂e factor", "S − L are natural-log quantities, and 2^x is not e^x",
                         "P = torch.exp(s - lse), or torch.exp2((s - lse) * math.log2(math.e))"),
    "mask_ignored": ("mask ignored in the backward", "P recomputed without the mask gives blocked keys weight and "
                     "gradient", "apply the mask exactly as the forward does: masked_softmax(scores, mask)"),
    "mask_inverted": ("mask polarity inverted", "you blocked the positions where the mask is True; in this course "
                      "True means 'may attend'", "masked_softmax(scores, mask) (it fills where the mask is False)"),
    "nan_rows": ("NaN from a fully masked row", "a row with every key blocked went through torch.softmax over -inf "
                 "everywhere (NaN), and the NaN spread into dK and dV", _MASK_FIX),
    "weak_fill": ("fully masked row attends uniformly", "with blocked scores filled by a large negative number, a row "
                  "whose keys are all blocked gets a uniform softmax instead of zero", _MASK_FIX),
    "unstable": ("softmax without the maximum subtracted", "you exponentiated the raw scores, so exp overflowed on "
                 "scores this large", "use torch.softmax or masked_softmax (they subtract each row's maximum)"),
    "mask_ds_only": ("mask applied to dS but not to P", "you zeroed dS at the blocked positions, but P (and with it dV "
                     "and the row sums) came from an unmasked softmax", "P = masked_softmax(scores, mask); then dS "
                     "needs no extra masking"),
    "mask_after_softmax": ("mask applied after the softmax", "weights multiplied by the mask no longer sum to 1",
                           "apply the mask before the softmax: masked_softmax(scores, mask)"),
    "mask_added": ("mask added to the scores", "you added the bool mask (0 or 1) to the scores; a blocked key needs "
                   "−∞", "masked_softmax(scores, mask), which sets the blocked scores to −∞"),
    # the tiled backward
    "lse_ignored": ("L not subtracted: P = exp(S)", "the forward's P is exp(S − L), normalised by the saved row "
                    "logsumexp L", _TILE_P),
    "lse_sign": ("L added instead of subtracted: exp(S + L)", "P = exp(S)/Σⱼexp(Sⱼ) = exp(S − L)", _TILE_P),
    "no_exp": ("exp forgotten: P = S − L", "you used S − L itself as P; the weights are its exponential", _TILE_P),
    "delta_sign": ("D added instead of subtracted", "you computed dS = P ⊙ (dP + D); the softmax's VJP subtracts D",
                   "dS = P ⊙ (dP − D)"),
    "delta_mean": ("D as a mean instead of a sum", "D is the row sum of dO ⊙ O, not its mean", _DELTA),
    "delta_no_o": ("D = rowsum(dO): the factor O is missing", "you summed dO alone; D = rowsum(dO ⊙ O)", _DELTA),
    "delta_no_dout": ("D = rowsum(O): the factor dO is missing", "you summed O alone; D = rowsum(dO ⊙ O)", _DELTA),
    "mask_offset_sign": ("causal mask offset the wrong way", "you shifted each tile's mask by k_start − q_start; key "
                         "k_start + c is in the future of query q_start + r when c − r > q_start − k_start",
                         "mask where k_start + column > q_start + row, e.g. "
                         "torch.ones(bq, bk, dtype=torch.bool).triu(q_start - k_start + 1)"),
    "mask_plus_inf": ("blocked scores set to +∞ instead of −∞", "exp(+inf) is inf, and the gradients turn into NaN",
                      "s.masked_fill(blocked, float('-inf'))"),
    "exp_split": ("exp(S) and exp(L) taken separately", "at scores near 10³ exp(S) and exp(L) both overflow to inf, "
                  "and inf/inf is NaN", "exponentiate S − L in one step: " + _TILE_P),
    "mask_after_exp": ("blocked entries zeroed after exp: inf · 0", "a blocked score far above L overflows to inf in "
                       "exp(S − L) before you zero it, and inf · 0 is NaN", "give the blocked scores −∞ before exp "
                       "(s.masked_fill(blocked, float('-inf'))), or select with torch.where after it"),
    "fresh_max": ("P recomputed with a fresh max instead of the stored L", "exp(S − the tile's own row max) is not "
                  "normalised like the forward's P", "P = exp(S − L) with the saved logsumexp L of each row"),
    "tile_softmax": ("P normalised within each tile instead of with the stored L", "you normalised each tile on its "
                     "own; P's rows are normalised over all keys, as the saved L records",
                     "P = exp(S − L) with the saved logsumexp L of each row"),
    "lse_as_sum": ("L used as a sum, not a log", "you divided exp(S) by L; L is the log of the row's sum",
                   "P = exp(S − L)"),
    "lse_broadcast": ("L subtracted along the wrong axis", "the (…, b) slice of L without a trailing axis broadcasts "
                      "along the keys", "add the axis: lse[..., q_start:q_end, None] (shape (..., b, 1))"),
    "delta_tile": ("D computed from the recomputed P instead of dO ⊙ O", "rowsum(dP ⊙ P) inside a tile sums over one "
                   "block of keys only; D needs the whole row", "compute D = (dout * o).sum(-1) once, before the "
                   "loops: it equals rowsum(dP ⊙ P) over all keys"),
    "delta_tile_axis": ("D summed over the wrong axis", "you summed dP ⊙ P over the tile's queries (axis -2)",
                        "D = (dout * o).sum(-1): one number per query"),
    "delta_broadcast": ("D subtracted along the wrong axis", "the (…, b) slice of D without a trailing axis "
                        "broadcasts along the keys", "add the axis: delta[..., q_start:q_end, None] (..., b, 1)"),
    "no_causal": ("causal mask forgotten in the backward", "with causal=True you computed every tile unmasked, so "
                  "gradients flow from future keys", "skip the query blocks that end before the key block starts and "
                  "mask key > query in the diagonal tiles, as the forward did"),
    "diag_unmasked": ("diagonal tiles not masked", "in the tiles on the diagonal query i still sees keys i+1, i+2, … "
                      "of its block", "in a diagonal tile set S to -inf where key position > query position"),
    "skip_diag": ("diagonal tiles skipped", "the diagonal tiles hold each query's own key and its neighbours",
                  "start the query loop at the key block's own block: range(k_start, n, block_size)"),
    "mask_self": ("causal mask off by one: a query cannot see itself", "you masked key ≥ query; a query may attend "
                  "to its own position", "mask key > query"),
    "mask_ahead": ("causal mask off by one: each query sees the next key", "you masked key > query + 1",
                   "mask key > query"),
    "local_mask": ("causal mask built from positions inside the tile", "you masked column > row of every tile; the "
                   "mask needs global positions (q_start + row, k_start + column)",
                   "compare global positions, or mask only the tiles on the diagonal"),
    "dq_overwritten": ("dQ not accumulated over key blocks", "you assigned dQ's rows for each key block, so only the "
                       "last key block's term survives", "dq[..., q_start:q_end, :] += ds @ k_blk / √d_k"),
}
for key, grad, formula, factor, left in (("dq_no_ds", "dQ", "dS K/√d_k", "dS", "K/√d_k"),
                                         ("dq_no_k", "dQ", "dS K/√d_k", "K", "dS/√d_k"),
                                         ("dk_no_ds", "dK", "dSᵀ Q/√d_k", "dSᵀ", "Q/√d_k"),
                                         ("dk_no_q", "dK", "dSᵀ Q/√d_k", "Q", "dSᵀ/√d_k"),
                                         ("dv_no_dout", "dV", "Pᵀ dO", "dO", "Pᵀ")):
    TEXT[key] = (f"{grad} = {left}: the factor {factor} is missing", f"you left {factor} out of {grad} = {formula}",
                 f"{grad} = {formula}")
for key, grads, names in (("dk", "dK", "dK_j"), ("dv", "dV", "dV_j"), ("dkdv", "dK, dV", "dK_j, dV_j")):
    TEXT[f"{key}_overwritten"] = (f"{grads} not accumulated over query blocks", f"you assigned {grads} for each query "
                                  "block, so only the last query block's term survives",
                                  f"start {names} at zero before the query loop and add (+=) each tile's term")
for key, which, n in (("q_tail", "query ", "n_q"), ("k_tail", "key ", "n_k"), ("both_tails", "", "n_q, n_k")):
    TEXT[key] = (f"last partial {which}block dropped", f"your loop stops at the last full block, so with {n} not a "
                 f"multiple of the block size the {which or 'query and key '}rows after it get no gradient",
                 _LOOP.replace("n_q", n[:3]))
TEXT["no_causal_anywhere"] = TEXT["no_causal"]  # the mask forgotten in the forward's L and O too: plain attention

_COMMON = ("no_scale_dq", "no_scale_dk", "no_scale", "by_d", "s_unscaled", "unscaled_all", "by_d_all", "scale_inverted",
           "scale_dv", "dk_transposed", "dk_from_k", "dv_transposed", "dv_scaled", "dv_no_p", "dv_no_dout", "dq_no_ds",
           "dq_no_k", "dk_no_ds", "dk_no_q", "no_rowsum", "no_p", "ds_is_p", "sign")
NAIVE = _COMMON + ("dq_transposed", "dq_from_q", "dv_uses_v", "dp_transposed", "rowsum_axis", "rowsum_broadcast",
                   "rowsum_unweighted", "rowsum_of_p", "rowsum_all", "rowsum_mean", "rowsum_sign", "diag_jacobian",
                   "softmax_axis", "no_softmax", "unstable")
MASKED = ("mask_ignored", "mask_inverted", "mask_ds_only", "mask_after_softmax", "mask_added", "nan_rows", "weak_fill")
TILED = _COMMON + ("exp2_unconverted", "fresh_max", "tile_softmax", "lse_as_sum", "lse_broadcast", "lse_ignored",
                   "lse_sign", "no_exp", "exp_split", "delta_tile", "delta_tile_axis", "delta_broadcast", "delta_sign",
                   "delta_mean", "delta_no_o", "delta_no_dout", "dq_overwritten", "dkdv_overwritten", "dk_overwritten",
                   "dv_overwritten", "q_tail", "k_tail", "both_tails")
CAUSAL = ("no_causal", "no_causal_anywhere", "diag_unmasked", "skip_diag", "mask_self", "mask_ahead", "local_mask",
          "mask_offset_sign", "mask_after_exp", "mask_plus_inf")


def _naive(q, k, v, dout, mask=None, bug="", **scales):
    return _variant(q, k, v, dout, bug, mask=mask, **scales)


def _tiled(q, k, v, o, lse, dout, block, causal, bug="", **scales):
    if bug == "no_causal_anywhere":
        return _variant(q, k, v, dout)
    return _variant(q, k, v, dout, bug, o=o, lse=lse, block=block, causal=causal, **scales)


def _flat(grads) -> torch.Tensor:
    """Three gradients as one tensor, their shapes first (what the engine compares)."""
    head = [float(x) for g in grads for x in (g.dim(), *g.shape)]
    return torch.cat([torch.tensor(head, dtype=torch.float64), *(g.detach().double().flatten() for g in grads)])


def _table(keys, grads: Callable[..., tuple]) -> list[Known]:
    """Known rows for ``keys``: each makes the three gradients of ``grads(*case, bug=key)``, flattened."""
    return [Known(key, *TEXT[key], lambda *case, key=key: _flat(grads(*case, bug=key))) for key in keys]


# ============================================================================ judging three gradients
def _grads(result: Any, tried: str) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) from the learner's result: the right numbers as NumPy arrays are right too."""
    if isinstance(result, (tuple, list)):
        result = tuple(torch.from_numpy(r) if isinstance(r, np.ndarray) else r for r in result)
    return unpack(result, NAMES, tried=tried)


def _tolerance(expected: tuple, dtype: torch.dtype) -> dict:
    big = max(1.0, max(float(e.abs().max()) if e.numel() else 0.0 for e in expected))
    return dict(atol=1e-10 * big, rtol=1e-9) if dtype == torch.float64 else dict(atol=2e-4 * big, rtol=2e-3)


def _blame(groups: list[list[Known]], tried: str, got: str, expected: str) -> None:
    """Fail naming the mistakes found: each group is one mistake, or several that give the same numbers here."""
    groups = [list({k.summary: k for k in group}.values()) for group in groups]
    if len(groups) == 1:
        same_numbers = "" if len(groups[0]) == 1 else "on this input these mistakes give the same numbers: "
        fail(" or ".join(k.summary for k in groups[0]), tried=tried, got=got, expected=expected,
             cause=same_numbers + " — or ".join(k.cause for k in groups[0]),
             fix="; otherwise ".join(k.fix for k in groups[0]))
    fail("; and ".join(" or ".join(k.summary for k in g) for g in groups), tried=tried, got=got, expected=expected,
         cause=f"{len(groups)} mistakes at once: " + " — and ".join(" or ".join(k.cause for k in g) for g in groups),
         fix="; then ".join(g[0].fix for g in groups))


def _at_once(suspects: Suspects, grads: Callable[..., tuple], case: tuple, got, expected, wrong, tol) -> list:
    """The fewest known mistakes that together explain every wrong gradient, each reproducing the gradients it
    changes (one in dV, another in dQ…), grouped by the gradients they change; [] when they cannot."""
    explains = []
    for known in suspects.table:
        try:
            out = grads(*case, bug=known.key)
        except Exception:  # noqa: BLE001 - this mistake cannot happen on this case
            continue
        changed = frozenset(j for j in range(3) if not same(out[j], expected[j], **tol))
        if changed and not suspects.ruled_out(known) and all(j in wrong and same(got[j], out[j], **tol)
                                                             for j in changed):
            explains.append((known, changed))
    remaining, chosen = set(wrong), []
    while remaining:
        best = max(explains, key=lambda e: len(e[1] & remaining), default=None)
        if best is None or not best[1] & remaining:
            return []
        chosen.append([k for k, changed in explains if changed == best[1]])
        remaining -= best[1]
    return chosen


def _judge(suspects: Suspects, got: tuple, expected: tuple, case: tuple, *, tried: str, dtype: torch.dtype,
           grads: Callable[..., tuple], again: Callable[..., Any] | None = None, nan_cause: str = "",
           nan_fix: str = "") -> None:
    """Fail unless the three gradients match the oracle's; name the known mistake behind them (``suspects`` tries its
    table on ``case``, ``grads(*case, bug=key)``), else measure what is wrong."""
    tol = _tolerance(expected, dtype)
    for name, g, e in zip(NAMES, got, expected):
        if tuple(g.shape) != tuple(e.shape):
            _order(got, expected, tried, tol)
            if found := suspects.suspects(_flat(got), case):
                _blame([found], tried, f"your {name} of shape {tuple(g.shape)}", f"shape {tuple(e.shape)}")
            expect_shape(g, e.shape, tried=tried, what=f"your {name}", fix={
                "dq": "dq has q's shape (..., n_q, d_k): dQ = dS K/√d_k", "dk": "dk has k's shape (..., n_k, d_k): "
                "dK = dSᵀ Q/√d_k", "dv": "dv has v's shape (..., n_k, d_v): dV = Pᵀ dO"}[name])
    for name, g in zip(NAMES, got):
        if g.dtype != dtype:
            have, want = str(g.dtype).replace("torch.", ""), str(dtype).replace("torch.", "")
            fail(f"{name} is {have}, not {want}", tried=tried, got=f"your {name} in {have}",
                 expected=f"{want}, the dtype of the inputs",
                 cause="a tensor created without dtype= (torch.zeros(shape) is float32) or a .float()/.double()",
                 fix="create accumulators with torch.zeros_like(q) or dtype=q.dtype")
    if all(same(g, e, **tol) for g, e in zip(got, expected)):
        suspects.expect(_flat(got), _flat(expected), case, tried=tried, **tol)  # a right case rules mistakes out
        return
    _order(got, expected, tried, tol)
    wrong = [i for i in range(3) if not same(got[i], expected[i], **tol)]
    name = NAMES[wrong[0]]
    factors = {"√d_k": math.sqrt(expected[0].shape[-1]), "d_k": expected[0].shape[-1]}
    found = [k for k in suspects.suspects(_flat(got), case) if not same(k.make(*case), _flat(expected), **tol)]
    if len(found) > 1 and again is not None:
        found = suspects.narrow(found, lambda *c: _flat(_grads(again(*c), tried)))
    if groups := [found] if found else _at_once(suspects, grads, case, got, expected, wrong, tol):
        got_text, exp_text, _, _ = describe_mismatch(got[wrong[0]], expected[wrong[0]], what=f"your {name}",
                                                     factors=factors, **tol)
        _blame(groups, tried, f"{', '.join(NAMES[i] for i in wrong)} {'is' if len(wrong) == 1 else 'are'} wrong; in "
               f"{name}: {got_text}", _named(exp_text, name))
    for i in wrong:
        if torch.isnan(got[i]).any() and nan_cause and not torch.isnan(expected[i]).any():
            fail(f"NaN in {NAMES[i]}", tried=tried, expected="finite gradients", cause=nan_cause, fix=nan_fix,
                 got=f"NaN in {int(torch.isnan(got[i]).sum())} of {got[i].numel()} entries of your {NAMES[i]}")
    _wrong_scale(got, case, grads, tried, tol)
    _properties(got, expected, wrong, tried=tried, dtype=dtype, tol=tol)
    _one_wrong_ds(got, wrong, case, tried, tol)
    try:
        expect_close(got[wrong[0]], expected[wrong[0]], tried=tried, what=f"your {name}", factors=factors, **tol)
    except Failure as failure:
        d = failure.diagnosis
        d.expected = _named(d.expected, name)
        d.summary = d.summary if name in d.summary else f"{name}: {d.summary}"
        d.got = d.got if name in d.got else f"in your {name}: {d.got}"
        raise


def _named(text: str, name: str) -> str:
    """The "expected" line: which gradient, from where — never a bare "the expected values"."""
    if text in ("the expected values", "the correct values (from the check's reference computation)"):
        return f"the {name} that autograd computes through {_ORACLE} (in float64)"
    return text


def _order(got: tuple, expected: tuple, tried: str, tol: dict) -> None:
    """Fail when the gradients are right but returned in another order."""
    for perm in itertools.permutations(range(3)):
        if perm != (0, 1, 2) and all(same(got[i], expected[j], **tol) for i, j in enumerate(perm)):
            fail("gradients returned in the wrong order", tried=tried, got=f"({', '.join(NAMES[j] for j in perm)})",
                 expected="(dq, dk, dv): one gradient per input, in the inputs' order", fix="return dq, dk, dv")


def _fit_scale(err: Callable[[float], float], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> float:
    """The c in [10⁻³, 10³] that minimises err(c) (a grid in log c, then golden-section search around its best),
    replaced by the value of a named scale when it is that one to 6 digits (a fit is not exact)."""
    lo = math.log(min((10 ** (i / 10) for i in range(-30, 31)), key=err)) - 0.24
    hi, r = lo + 0.48, (math.sqrt(5) - 1) / 2
    for _ in range(45):  # keep the part of [lo, hi] that holds the lower of two inner points
        a, b = hi - r * (hi - lo), lo + r * (hi - lo)
        lo, hi = (lo, b) if err(math.exp(a)) < err(math.exp(b)) else (a, hi)
    c = math.exp((lo + hi) / 2)
    return next((x for x in _scale_names(q, k, v).values() if abs(c - x) <= 1e-6 * x), c)


def _scale_names(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, float]:
    d = q.shape[-1]
    return {"1/√d_k": 1 / math.sqrt(d), "√d_k": math.sqrt(d), "1/d_k": 1 / d, "1": 1.0, "1/√d_v": v.shape[-1] ** -0.5,
            "1/√n_q": q.shape[-2] ** -0.5, "1/√n_k": k.shape[-2] ** -0.5, "2/√d_k": 2 / math.sqrt(d)}


def _scale_name(c: float, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    fits = [name for name, x in _scale_names(q, k, v).items() if abs(c - x) <= 1e-9 * x]
    return f"{c:.4g}" + (f" = {fits[0]}" if len(fits) == 1 else "")


def _wrong_scale(got: tuple, case: tuple, grads: Callable[..., tuple], tried: str, tol: dict) -> None:
    """Fail when the answer is exactly the right backward with other scales: c on the scores (fitted on dV, which
    sees the scale only through P), c′ on dQ and dK (then a ratio)."""
    if not all(bool(torch.isfinite(g).all()) for g in got):
        return
    q, k, v = case[:3]
    run = lambda c, cg: grads(*case, bug="", scale=c, gscale=cg)  # noqa: E731
    c = _fit_scale(lambda x: float((run(x, 1.0)[2] - got[2].double()).norm()), q, k, v)
    x = run(c, 1.0)[0]
    cg = 1.0
    if bool(x.any()):
        cg = float((got[0].double() * x).sum() / (x * x).sum())
        cg = next((y for y in _scale_names(q, k, v).values() if abs(cg - y) <= 1e-6 * y), cg)
    if not all(same(g, e, **tol) for g, e in zip(got, run(c, cg))):
        return
    right = 1 / math.sqrt(q.shape[-1])
    parts = [f"scores scaled by {_scale_name(c, q, k, v)}"] if abs(c - right) > 1e-6 * right else []
    parts += [f"dQ, dK scaled by {_scale_name(cg, q, k, v)}"] if abs(cg - right) > 1e-6 * right else []
    fail(" and ".join(parts) + " instead of 1/√d_k", tried=tried,
         got="your gradients are exactly those of attention with " + " and ".join(parts),
         expected=f"1/√d_k = {right:.4g} (d_k = {q.shape[-1]}, the last axis of q) in the scores and in dQ, dK",
         cause="the scale is wrong: the scores of the forward are Q Kᵀ/√d_k, and dQ, dK carry the same 1/√d_k",
         fix="scale = 1 / math.sqrt(q.shape[-1]); multiply the scores and dQ, dK by it")


def _one_wrong_ds(got: tuple, wrong: list[int], case: tuple, tried: str, tol: dict) -> None:
    """dV right, dQ and dK wrong yet both following from one matrix dS′ (pinned down by dQ where K has full row
    rank): the mistake is where dS is made."""
    q, k = case[0].double(), case[1].double()
    if wrong != [0, 1] or k.shape[-2] > k.shape[-1] or int(torch.linalg.matrix_rank(k).min()) < k.shape[-2]:
        return
    ds = got[0].double() @ torch.linalg.pinv(k) * math.sqrt(q.shape[-1])  # (..., n_q, n_k): dq = dS′ K/√d_k
    if not same(got[1], ds.mT @ q / math.sqrt(q.shape[-1]), **tol):
        return
    fail("dS wrong: dv right, dq and dk from one wrong dS", tried=tried,
         got="your dv is right; your dq and dk are dS′ K/√d_k and dS′ᵀ Q/√d_k for one and the same dS′ (recovered "
             "from dq, as K has full row rank) that is not P ⊙ (dP − rowsum(dP ⊙ P))",
         expected=f"dS = P ⊙ (dP − rowsum(dP ⊙ P)), with dP = dO Vᵀ, as autograd through {_ORACLE} gives",
         cause="your dQ and dK lines agree, so the mistake is in dS: dP = dO Vᵀ, rowsum(dP ⊙ P), or the product with P",
         fix=f"print your ds next to {_VJP_FIX.split(' = ')[1]} on a small input and compare")


def _properties(got: tuple, expected: tuple, wrong: list[int], *, tried: str, dtype: torch.dtype, tol: dict) -> None:
    """Name what the wrong gradients measurably are: float32 precision, all zeros, the last rows zero."""
    if dtype == torch.float64 and all(bool(torch.isfinite(g).all()) for g in got):
        loose = _tolerance(expected, torch.float32)
        in_float32 = all(bool((got[i] == got[i].float().double()).all()) for i in wrong)
        pairs = list(zip(got, expected))
        if in_float32 and all(same(g, e, atol=loose["atol"] / 20, rtol=loose["rtol"] / 20) for g, e in pairs):
            worst = max(float(((g.double() - e).abs() / (e.abs() + loose["atol"])).max()) for g, e in pairs)
            fail("float64 inputs, float32 precision", tried=tried,
                 got=f"gradients that agree with the expected ones to about 7 significant digits only (relative "
                     f"error up to {worst:.1e}), every value a float32 number",
                 expected="float64 precision, about 15 significant digits, like the inputs",
                 cause="part of your computation ran in float32: torch.zeros(shape) or torch.tensor(...) without "
                       "dtype=, or a .float()",
                 fix="keep every tensor in the inputs' dtype: torch.zeros_like(q), or dtype=q.dtype")
    for i in wrong:
        g, e = got[i].double(), expected[i].double()
        if g.numel() and not bool(g.any()) and bool(e.any()):
            fail(f"{NAMES[i]} is all zeros", tried=tried, got=f"your {NAMES[i]} is zero everywhere",
                 expected=f"the gradient {NAMES[i]} (not zero)",
                 cause="nothing was added into it, or the function returns the tensor it started from",
                 fix=f"check that {NAMES[i]} is the tensor your formula (or your loop) fills")
        if g.dim() < 2 or g.shape[-2] < 2:
            continue
        zero_rows = ~g.reshape(-1, *g.shape[-2:]).ne(0).any(-1).any(0)  # (rows,)
        live_rows = e.reshape(-1, *e.shape[-2:]).ne(0).any(-1).any(0)
        tail = 0
        while tail < zero_rows.numel() and zero_rows[-1 - tail] and live_rows[-1 - tail]:
            tail += 1
        first = zero_rows.numel() - tail
        if tail and first > 0 and same(g[..., :first, :], e[..., :first, :], **tol):
            axis, axes = ("query", "queries") if i == 0 else ("key", "keys")
            fail(f"{NAMES[i]}: the last {axis} rows get no gradient", tried=tried,
                 got=f"your {NAMES[i]} is right in rows 0…{first - 1} and zero from row {first} on",
                 expected=f"a gradient for every {axis}, rows 0…{g.shape[-2] - 1}",
                 cause=f"your loop over the {axes} stops before row {first}: a range or a block count that "
                       "leaves out the last (possibly shorter) block", fix=_LOOP.replace("n_q", "n"))


# ============================================================================ exceptions the learner's code raises
_MATMUL = ("RuntimeError", r"mat1 and mat2|shapes cannot be multiplied|Expected size for first two dimensions of "
           "batch2", "two matrices with incompatible shapes were multiplied; with n_q ≠ n_k or d_k ≠ d_v a "
           "transpose in the wrong place does exactly this", "write each line's shapes next to it: P (..., n_q, n_k), "
           "dO (..., n_q, d_v), dV = Pᵀ dO (..., n_k, d_v), dP = dO Vᵀ (..., n_q, n_k), dQ = dS K (..., n_q, d_k), "
           "dK = dSᵀ Q (..., n_k, d_k)")
_DTYPE = ("RuntimeError", r"same dtype|expected scalar type|Float.*Double|Double.*Float",
          "a float32 tensor met a float64 one: a tensor created without dtype= (torch.zeros(shape) is float32) or a "
          ".float()/.double() somewhere", "create every tensor from the inputs: torch.zeros_like(q), or dtype=q.dtype")


def _raise(exc: LearnerRaised, tried: str, expected: str, patterns=(), **hint: str) -> None:
    """Fail with the learner's exception, explained by ``hint`` or else by a pattern of this topic."""
    hint = hint or explain_raise(exc, (), patterns)
    raise Failure(learner_error(exc, tried=tried, expected=expected, **hint)) from None


def _case(g: torch.Generator, name: str, lead: tuple, n: int, m: int, d: int, dv: int, mask: Any = None, *,
          dtype=torch.float64, q_scale: float = 1.0, dout_scale: float = 1.0, extreme: bool = False) -> dict:
    """One case of exercises 1 and 2: q (..., n, d), k (..., m, d), v (..., m, dv), dout (..., n, dv)."""
    q, k = _rand(g, *lead, n, d, dtype=dtype, scale=q_scale), _rand(g, *lead, m, d, dtype=dtype)
    v, dout = _rand(g, *lead, m, dv, dtype=dtype), _rand(g, *lead, n, dv, dtype=dtype, scale=dout_scale)
    return dict(name=name, q=q, k=k, v=v, dout=dout, mask=mask, dtype=dtype, extreme=extreme)


# ============================================================================ exercise 1: attention_backward
def _backward_cases() -> list[dict]:
    g = torch.Generator().manual_seed(10)
    cases = [_case(g, "one head, n_q = n_k = 5, d_k = 7, d_v = 3, no mask", (), 5, 5, 7, 3, q_scale=1.5),
             _case(g, "batch × heads (2, 3), n_q = 4, n_k = 6, d_k = 8, d_v = 5, no mask", (2, 3), 4, 6, 8, 5)]
    keep = torch.rand(5, 7, generator=g) < 0.6
    keep[:, 0], keep[1, 2] = True, False
    keep[3] = False  # query 3 sees nothing: zero weights, zero output, zero gradients
    pad = (torch.arange(6) < torch.tensor([5, 0, 3])[:, None])[:, None, None, :]  # (3, 1, 1, 6): batch 1 all padding
    cases += [
        _case(g, "batch 2, n_q = 5, n_k = 7, d_k = 6, d_v = 6, a (5, 7) mask with row 3 fully masked", (2,), 5, 7, 6, 6,
              keep),
        _case(g, "key padding (3, 1, 1, 6) over 2 heads, n_q = 4, n_k = 6, d_k = 5, d_v = 2; batch entry 1 fully "
              "padded", (3, 2), 4, 6, 5, 2, pad),
        _case(g, "a causal (6, 6) mask, one head, d_k = 3, d_v = 7", (), 6, 6, 3, 7,
              torch.ones(6, 6, dtype=torch.bool).tril()),
        _case(g, "float32, batch 2, n_q = 9, n_k = 8, d_k = 12, d_v = 4", (2,), 9, 8, 12, 4, dtype=torch.float32),
        _case(g, "axes of size 1: batch 1, one query, one key, d_k = 1, d_v = 1", (1,), 1, 1, 1, 1),
        _case(g, "one query, n_q = 1, n_k = 5, d_k = 2, d_v = 3, with a (1, 5) mask", (), 1, 5, 2, 3,
              torch.tensor([[True, False, True, True, False]])),
        _case(g, "extreme values: scores up to ±10³ (saturated softmax), upstream gradient ×10⁴", (2,), 5, 6, 5, 3,
              q_scale=400.0, dout_scale=1e4, extreme=True)]
    return cases


def _backward_raised(exc: LearnerRaised, q: torch.Tensor, mask: Any) -> dict:
    """What an exception from the learner's chain rule says about its cause, when the evidence is clear."""
    if mask is not None and exc.type_name == "TypeError" and "positional argument" in exc.message:
        return dict(cause="your function does not take the mask as its fifth argument",
                    fix="keep the signature attention_backward(q, k, v, dout, mask=None)")
    if mask is None and "NoneType" in exc.message:
        return dict(cause="with mask=None (no mask) your code still uses the mask",
                    fix="apply the mask only when there is one (`if mask is not None:`), or let masked_softmax "
                        "handle None")
    if "3D tensor" in exc.message or (q.dim() < 3 and "Dimension out of range" in exc.message):
        return dict(cause=f"your code assumes exactly one batch axis (torch.bmm, or transpose(1, 2)); here q has shape "
                          f"{tuple(q.shape)}, and the docstring allows any number of leading axes, none included",
                    fix="write it for any leading axes: @ (torch.matmul) and .mT or .transpose(-2, -1)")
    return explain_raise(exc, (), [_MATMUL, _DTYPE])


@check("attention_backward", expects="a function attention_backward(q, k, v, dout, mask=None) returning (dq, dk, dv)")
def check_attention_backward(fn: Learner) -> str:
    cases = _backward_cases()
    case = cases[1]  # first, what the code does besides its result: autograd, or writes into an input
    _watch(fn, f"attention_backward(q, k, v, dout) on {case['name']}, watching the functions it calls", case["q"],
           case["k"], case["v"], case["dout"], what="attention_backward", inputs=("q", "k", "v", "dout"))
    suspects = Suspects(_table(NAIVE + MASKED, _naive), atol=1e-6, rtol=1e-4)

    def call(q, k, v, dout, mask=None):
        return fn(q, k, v, dout) if mask is None else fn(q, k, v, dout, mask)

    for case in cases:
        q, k, v, dout, mask = case["q"], case["k"], case["v"], case["dout"], case["mask"]
        tried = f"attention_backward(q, k, v, dout{', mask' if mask is not None else ''}) on {case['name']}"
        try:
            got = _grads(call(q, k, v, dout, mask), tried)
        except LearnerRaised as exc:
            _raise(exc, tried, "(dq, dk, dv)", **_backward_raised(exc, q, mask))
        nan_cause = ("exp overflowed on scores this large: a softmax written by hand must subtract each row's maximum"
                     if case["extreme"] else "a fully masked row went through a softmax over -inf everywhere (0/0)"
                     if mask is not None and bool((~mask).all(-1).any()) else "")
        _judge(suspects, got, _oracle(q, k, v, dout, mask)[1], (q, k, v, dout, mask), tried=tried, dtype=case["dtype"],
               grads=_naive, again=call, nan_cause=nan_cause, nan_fix="compute P with the course's "
               "masked_softmax(scores, mask), which is stable and gives a fully masked row zero weights")
    return (f"matches autograd through F.scaled_dot_product_attention on {len(cases)} cases (masks, fully masked rows, "
            f"batch × heads, d_k ≠ d_v, size-1 axes, float32, saturated scores)")


# ============================================================================ exercise 2: AttentionFunction
_BACKWARD_COUNT = ("the backward returns one gradient per input of forward, in order: for forward(ctx, q, k, v, mask) "
                   "that is four, the last one None because a bool mask has no gradient")
_FORWARD_FIX = "forward returns softmax(q kᵀ/√d_k) v with the course's masked_softmax: shape (..., n_q, d_v)"
_SAVE = ("ctx.save_for_backward takes tensors (or None) only",
         "keep other values as attributes of ctx (ctx.scale = scale) and save only tensors")
_APPLY_RAISES = [
    ("RuntimeError", "incorrect number of gradients", _BACKWARD_COUNT, "return dq, dk, dv, None"),
    ("RuntimeError", "invalid gradient at index", "a gradient from your backward does not have its input's shape: "
     "backward returns them in the order forward takes its inputs, (q, k, v, mask)", "return dq, dk, dv, None"),
    ("RuntimeError", r"Mismatch in shape: grad_output\[0\]", "the output of your forward does not have the attention "
     "output's shape (..., n_q, d_v)", _FORWARD_FIX),
    ("TypeError", "save_for_backward can only save", *_SAVE),
    ("RuntimeError", "save_for_backward can only save", *_SAVE),
    _MATMUL]
#: Mistakes of the forward: rows of :data:`TEXT`, with the causes that differ there.
_FORWARD_CAUSE = {"unscaled_all": "your forward computes softmax(q kᵀ) v without the 1/√d_k",
                  "by_d_all": "you divided the scores by d_k", "scale_inverted": "you multiplied the scores by √d_k",
                  "no_softmax": "your forward multiplies the scaled scores themselves by v"}


def _forward(q, k, v, mask, bug="", scale=None):
    """The forward, softmax(q kᵀ/√d_k) v in float64, with one bug (or another scale)."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    return _weights(q @ k.mT * (_scales(bug, q.shape[-1], v.shape[-1])[0] if scale is None else scale), mask, bug) @ v


def _expect_output(out: torch.Tensor, case: dict, tried: str) -> None:
    """The forward's output: right, a known mistake, another scale, or what the difference measures."""
    q, k, v, mask = case["q"], case["k"], case["v"], case["mask"]
    expected = _oracle(q, k, v, case["dout"], mask)[0]
    expect_shape(out, expected.shape, tried=tried, what="the output of forward", fix=_FORWARD_FIX)
    tol = _tolerance((expected,), torch.float64)
    if same(out, expected, **tol):
        return
    keys = ("unscaled_all", "by_d_all", "scale_inverted", "scale_dv", "softmax_axis", "no_softmax") + (
        () if mask is None else ("mask_ignored", "mask_inverted", "nan_rows", "weak_fill", "mask_after_softmax",
                                 "mask_added"))
    table = [Known(key, "forward: " + TEXT[key][0].replace(" in the backward", ""),
                   _FORWARD_CAUSE.get(key, TEXT[key][1]), TEXT[key][2],
                   lambda q, k, v, mask, key=key: _forward(q, k, v, mask, key)) for key in keys]
    found = Suspects(table, **tol).suspects(out, (q, k, v, mask))
    got_text, exp_text, cause, summary = describe_mismatch(out, expected, what="the output of forward",
                                                           factors={"√d_k": math.sqrt(q.shape[-1])}, **tol)
    if exp_text != _named(exp_text, "output"):  # the generic "expected": say what it is
        exp_text = f"softmax(q kᵀ/√d_k) v, as {_ORACLE} computes it (in float64)"
    if found:
        _blame([found], tried, f"the output of forward: {got_text}", exp_text)
    c = _fit_scale(lambda x: float((_forward(q, k, v, mask, scale=x) - out).norm()), q, k, v) \
        if bool(torch.isfinite(out).all()) else 0
    if c and same(out, _forward(q, k, v, mask, scale=c), **tol):
        summary, cause = f"scores scaled by {_scale_name(c, q, k, v)}", "the scale is wrong: the scores are q kᵀ/√d_k"
        exp_text = f"1/√d_k = {1 / math.sqrt(q.shape[-1]):.4g} (d_k = {q.shape[-1]}, the last axis of q) on the scores"
    fail(f"forward: {summary}", tried=tried, got=f"the output of forward: {got_text}", expected=exp_text, cause=cause,
         fix=_FORWARD_FIX)


@check("AttentionFunction", kind="class",
       expects="a torch.autograd.Function subclass AttentionFunction: forward(ctx, q, k, v, mask=None), backward")
def check_AttentionFunction(fn: Learner) -> str:
    info = fn.inspect()
    if not info.get("autograd_function"):
        fail("not a torch.autograd.Function", tried="checking the class AttentionFunction",
             got=f"a class deriving from {', '.join(info.get('bases', [])[:2]) or 'object'}",
             expected="class AttentionFunction(torch.autograd.Function)",
             fix="derive the class from torch.autograd.Function and give it static methods forward and backward")
    g = torch.Generator().manual_seed(11)
    cases = [_case(g, "batch × heads (2, 2), n_q = 4, n_k = 5, d_k = 3, d_v = 2, no mask", (2, 2), 4, 5, 3, 2),
             _case(g, "one head, n_q = n_k = 5, d_k = 5, d_v = 6, a causal mask", (), 5, 5, 5, 6,
                   torch.ones(5, 5, dtype=torch.bool).tril()),
             _case(g, "batch 2, n_q = 3, n_k = 4, d_k = 2, d_v = 3, a mask with row 1 fully masked", (2,), 3, 4, 2, 3,
                   torch.tensor([[True, False, True, True], [False] * 4, [False, True, True, False]]))]
    apply, suspects = fn.method("apply"), Suspects(_table(NAIVE + MASKED, _naive), atol=1e-6, rtol=1e-4)
    for case in cases:
        q, k, v, dout, mask = case["q"], case["k"], case["v"], case["dout"], case["mask"]
        masked = "" if mask is None else ", mask"
        tried = f"AttentionFunction.apply(q, k, v{masked}) and backward, on {case['name']}"
        try:
            out, grads = apply.vjp((q, k, v) if mask is None else (q, k, v, mask), dout, wrt=(0, 1, 2))
        except LearnerRaised as exc:
            hint = dict(cause="forward does not take the mask: apply passes its arguments to forward(ctx, …) in order",
                        fix="def forward(ctx, q, k, v, mask=None)") if (
                exc.type_name == "TypeError" and "positional argument" in exc.message and exc.phase == "call") else {}
            _raise(exc, tried, "the attention output, then its gradients", _APPLY_RAISES, **hint)
        out = as_tensor(out, tried=tried, what="forward", expected="the attention output, one tensor (..., n_q, d_v)")
        _expect_output(out, case, tried)
        if grads is None:
            fail("no gradient reaches the inputs", tried=tried, expected="gradients from your backward",
                 got="the output does not depend on q, k, v through autograd",
                 fix="return the output of forward itself (not a detached copy)")
        if missing := ", ".join(name for name, gr in zip(NAMES, grads) if gr is None):
            fail(f"backward returned None for {missing}", tried=tried, got=f"no gradient for {missing}",
                 expected="(dq, dk, dv, None)", cause=_BACKWARD_COUNT, fix="return dq, dk, dv, None")
        got = tuple(as_tensor(gr, tried=tried, what=f"the backward's {name}") for name, gr in zip(NAMES, grads))
        _judge(suspects, got, _oracle(q, k, v, dout, mask)[1], (q, k, v, dout, mask), tried=tried, dtype=torch.float64,
               grads=_naive, nan_cause="a fully masked row went through a softmax over -inf everywhere (0/0)"
               if mask is not None else "", nan_fix="compute P with the course's masked_softmax(scores, mask)")
    case = cases[1]  # the backward by hand: watched while it runs (called directly, with the ctx forward filled)
    report = fn.observe("backward.function_watch", case["q"], case["k"], case["v"], case["mask"], case["dout"])
    if used := [c for c in report.get("calls", []) if c in ("grad", "backward", "vjp", "jacobian")]:
        fail("backward uses autograd", tried=f"AttentionFunction.backward on {case['name']}, watching the functions it "
             "calls", got=f"your backward calls {', '.join(_WATCHED[c] for c in used)}",
             expected="a backward written from the formulas (ref.attention_backward, or your own)",
             cause="autograd differentiated the forward again; the exercise asks for the backward by hand",
             fix="return (*ref.attention_backward(q, k, v, dout, mask), None)")
    g = torch.Generator().manual_seed(15)  # two calls in one graph (two attention layers): each its own tensors
    first, second = ([_rand(g, 2, 4, 3), _rand(g, 2, 6, 3), _rand(g, 2, 6, 2)] for _ in range(2))
    upstream = [_rand(g, 2, 4, 2), _rand(g, 2, 4, 2)]
    tried = ("o1 = AttentionFunction.apply(q1, k1, v1); o2 = AttentionFunction.apply(q2, k2, v2); then one backward "
             "through both (two attention layers in one model)")
    try:
        grads = fn.observe("backward.function_twice", first, second, upstream)
    except LearnerRaised as exc:
        _raise(exc, tried, "the gradients of both calls", _APPLY_RAISES)
    expected = [*_oracle(*first, upstream[0])[1], *_oracle(*second, upstream[1])[1]]
    tol = _tolerance(tuple(expected), torch.float64)
    if bad := [i for i, (x, e) in enumerate(zip(grads, expected))
               if x is None or not same(as_tensor(x, tried=tried, what="a gradient"), e, **tol)]:
        fail("two calls share their state", tried=tried,
             got=f"wrong gradients for call {', '.join(sorted({str(i // 3 + 1) for i in bad}))} (right when each call "
                 "is alone)", expected="each call's gradients computed from that call's own q, k, v",
             cause="forward keeps what backward needs where all calls share it (a class attribute, a global), so "
                   "the second call overwrites the first call's tensors",
             fix="keep per-call state on ctx only: ctx.save_for_backward(q, k, v, mask), ctx.anything = …")
    g = torch.Generator().manual_seed(12)  # gradcheck, next to the learner's class: its backward vs its own forward
    q, k, v = _rand(g, 2, 3, 4), _rand(g, 2, 5, 4), _rand(g, 2, 5, 2)
    mask = torch.tensor([[True, True, False, True, False], [False, True, True, False, True], [True] * 5])
    report = fn.observe("backward.gradcheck", q, k, v, mask, timeout=60)
    if not isinstance(report, dict) or not report.get("passed"):
        message = str(report.get("error", "")) if isinstance(report, dict) else repr(report)
        fail("gradcheck fails", tried="torch.autograd.gradcheck(AttentionFunction.apply, (q, k, v, mask)) in float64, "
             "shapes (2, 3, 4), (2, 5, 4), (2, 5, 2)", got=message[:400] or "gradcheck returned False",
             expected="gradcheck passes: your backward agrees with finite differences of your forward",
             fix="compare your backward's formulas with the exercise's, line by line")
    return (f"forward and backward match autograd through F.scaled_dot_product_attention on {len(cases)} cases "
            f"(masks, a fully masked row) and with two calls in one graph; the backward is by hand; gradcheck passes")


# ============================================================================ exercise 3: tiled_attention_backward
#: The structural probe's size: n² = 1,048,576 numbers for one head; a (128, 128) tile holds 16,384.
BIG_N, BIG_D, BIG_BLOCK = 1024, 16, 128
_TILE_RAISES = [
    ("RuntimeError", r"upper bound and lower bound inconsistent with step sign", "torch.arange(start, end) got an end "
     "below its start: it counts upward, so its two bounds are swapped or the end was computed by subtracting",
     "torch.arange(start, start + length): the smaller bound first"),
    ("RuntimeError", r"with a bool tensor is not supported", "a bool tensor (a mask, such as cols > rows) took part in "
     "arithmetic where a tensor of numbers belongs",
     "use the mask to select: s = s.masked_fill(blocked, float('-inf'))"),
    _DTYPE]


def _tiled_cases() -> list[dict]:
    from ..backward import tiled_attention_forward

    g = torch.Generator().manual_seed(13)
    cases = []
    for name, lead, n, m, d, dv, block, causal, *extra in [
        ("n_q = n_k = 12, block 4 (3 × 3 tiles), d_k = 6, d_v = 3", (), 12, 12, 6, 3, 4, False),
        ("causal, n_q = n_k = 12, block 4, d_k = 5, d_v = 5", (), 12, 12, 5, 5, 4, True),
        ("n_q = 10, n_k = 13, block 4 (n_q and n_k not multiples of it), batch 2, d_k = 6, d_v = 2", (2,), 10, 13, 6, 2,
         4, False),
        ("causal, batch × heads (2, 3), n_q = n_k = 11, block 3, d_k = 5, d_v = 6", (2, 3), 11, 11, 5, 6, 3, True),
        ("causal, block 1, n_q = n_k = 5, d_k = 2, d_v = 3", (), 5, 5, 2, 3, 1, True),
        ("block 16 longer than n_q = 7, n_k = 9, d_k = 3, d_v = 2", (1,), 7, 9, 3, 2, 16, False, "explicit_false"),
        ("causal, block 8 longer than n_q = n_k = 6, d_k = 3, d_v = 4", (), 6, 6, 3, 4, 8, True),
        ("axes of size 1: one query, one key, d_k = 1, d_v = 1, block 2", (1, 1), 1, 1, 1, 1, 2, False),
        ("causal, one query and key, d_k = 2, d_v = 1, block 3", (), 1, 1, 2, 1, 3, True),
        ("the default block size (no block_size passed), n_q = 70, n_k = 75, d_k = 2, d_v = 2", (), 70, 75, 2, 2, 64,
         False, "default_block"),
        ("float32, causal, batch 2, n_q = n_k = 33, block 8, d_k = 8, d_v = 4", (2,), 33, 33, 8, 4, 8, True, "float32"),
        ("extreme values: scores of order ±10³ (L ≈ 10³), a blocked key scoring far above the allowed ones, upstream "
         "gradient ×10⁴, causal, n_q = n_k = 9, block 4", (), 9, 9, 5, 3, 4, True, "extreme"),
    ]:
        dtype, extreme = torch.float32 if "float32" in extra else torch.float64, "extreme" in extra
        q = torch.randn(*lead, n, d, generator=g, dtype=torch.float64)
        q = (q * (0.5 + 2.5 * torch.rand(*lead, n, 1, generator=g, dtype=torch.float64))).to(dtype)  # norms differ
        q = q * 300 if extreme else q
        k = _rand(g, *lead, m, d, dtype=dtype)
        if extreme:  # key 1, blocked for query 0 in the same tile when causal, scores far above key 0
            k[..., 1, :] = 3 * q[..., 0, :] / q[..., 0, :].norm(dim=-1, keepdim=True)
        v = _rand(g, *lead, m, dv, dtype=dtype)
        dout = _rand(g, *lead, n, dv, dtype=dtype, scale=1e4 if extreme else 1.0)
        o, lse = tiled_attention_forward(q.double(), k.double(), v.double(), 16, causal=causal)
        cases.append(dict(name=name, q=q, k=k, v=v, o=o.to(dtype), lse=lse.to(dtype), dout=dout, block=block,
                          causal=causal, dtype=dtype, extreme=extreme, pass_block="default_block" not in extra,
                          explicit_false="explicit_false" in extra))
    return cases


def _tiled_tried(case: dict) -> str:
    block = f", {case['block']}" if case["pass_block"] else ""
    causal = ", causal=True" if case["causal"] else (", causal=False" if case["explicit_false"] else "")
    return f"tiled_attention_backward(q, k, v, o, lse, dout{block}{causal}) on {case['name']}"


def _call_tiled(fn: Learner, case: dict, tried: str, *, full_blocks_passed: bool = False):
    args = (case["q"], case["k"], case["v"], case["o"], case["lse"], case["dout"])
    try:
        return fn(*args, *([case["block"]] if case["pass_block"] else []),
                  **({"causal": case["causal"]} if case["causal"] or case["explicit_false"] else {}))
    except LearnerRaised as exc:
        hint = {}
        if exc.type_name == "TypeError" and "causal" in exc.message:
            hint = dict(cause="your function does not take the causal argument",
                        fix="keep the signature tiled_attention_backward(q, k, v, o, lse, dout, block_size=64, "
                            "causal=False)")
        elif (full_blocks_passed and exc.type_name in ("RuntimeError", "IndexError")
              and (case["q"].shape[-2] % case["block"] or case["k"].shape[-2] % case["block"])):
            hint = dict(cause="your code ran on the cases where every block is full; here the last block is shorter "
                              "than block_size (n_q or n_k is not a multiple of it), and code that assumes full "
                              "blocks breaks on it",
                        fix="take each block's end as min(start + block_size, n) and size its tensors from the slice")
        _raise(exc, tried, "(dq, dk, dv)", _TILE_RAISES, **hint)


@check("tiled_attention_backward", timeout=30.0,
       expects="a function tiled_attention_backward(q, k, v, o, lse, dout, block_size=64, causal=False) "
               "returning (dq, dk, dv)")
def check_tiled_attention_backward(fn: Learner) -> str:
    cases, inputs = _tiled_cases(), ("q", "k", "v", "o", "lse", "dout")
    case = cases[0]  # first what the code does besides its result: autograd, fused attention, inputs written into
    _watch(fn, f"{_tiled_tried(case)}, watching the functions it calls", *(case[x] for x in inputs), case["block"],
           what="tiled_attention_backward", inputs=inputs)
    suspects = Suspects(_table(TILED + CAUSAL, _tiled), atol=1e-6, rtol=1e-4)
    for index, case in enumerate(cases):
        tried = _tiled_tried(case)
        full = any(c["q"].shape[-2] % c["block"] == 0 == c["k"].shape[-2] % c["block"] for c in cases[:index])
        got = _grads(_call_tiled(fn, case, tried, full_blocks_passed=full), tried)
        args = (*(case[x] for x in inputs), case["block"], case["causal"])
        _judge(suspects, got, _oracle(case["q"], case["k"], case["v"], case["dout"], causal=case["causal"])[1], args,
               tried=tried, dtype=case["dtype"], grads=_tiled, again=lambda *a: fn(*a[:7], causal=a[7]),
               nan_cause="your gradients were finite on every earlier case, so exp overflowed on scores this large"
               if case["extreme"] else "", nan_fix="exponentiate S − L in one step, torch.exp(s - lse[..., "
               "q_start:q_end, None]), and give blocked scores −∞ before exp (or select with torch.where after it)")
    reports = _watch_big(fn)  # fails on an n × n tensor, autograd or an input written into
    _check_delta_from_o(fn, cases[2])
    _check_tiles(reports)
    return (f"matches autograd through F.scaled_dot_product_attention on {len(cases)} cases (causal or not, "
            f"blocks 1…64, n_q, n_k not multiples of the block, size-1 axes, float32, L ≈ 10³); D from o; "
            f"at n = {BIG_N} no n × n tensor, tiles of block_size, causal skips the tiles above the diagonal")


def _check_delta_from_o(fn: Learner, case: dict) -> None:
    """The docstring's D = rowsum(dout ⊙ o): with an o no forward made, the result must follow that o."""
    other_o = case["o"] + 0.5 * _rand(torch.Generator().manual_seed(16), *case["o"].shape, dtype=case["dtype"])
    tried = _tiled_tried(case).replace(" on ", " with o replaced by o + 0.5·noise (not the forward's output), on ", 1)
    got = _grads(_call_tiled(fn, dict(case, o=other_o), tried), tried)
    expected = _tiled(*(dict(case, o=other_o)[x] for x in ("q", "k", "v", "o", "lse", "dout", "block", "causal")))
    tol = _tolerance(expected, case["dtype"])
    if all(same(a, b, **tol) for a, b in zip(got, expected)):
        return
    if all(same(a, b, **tol) for a, b in zip(got, _oracle(case["q"], case["k"], case["v"], case["dout"],
                                                         causal=case["causal"])[1])):
        fail("D not computed from o", tried=tried,
             got="the same gradients as with the forward's o: your result does not depend on o",
             expected="gradients that follow the o passed in, through D = rowsum(dout ⊙ o)",
             cause="D came from recomputed tiles of P (rowsum(dP ⊙ P), or an O rebuilt as P V) instead of the o "
                   "passed in: right numbers, extra work, not the FlashAttention-2 backward",
             fix=_DELTA + ", once, before the loops")
    fail("o used other than through D", tried=tried,
         got="gradients that are neither those of D = rowsum(dout ⊙ o) for this o nor those of the forward's o",
         expected="gradients that follow the o passed in, through D = rowsum(dout ⊙ o) and nowhere else",
         fix=f"use o only in {_DELTA}, computed once before the loops")


def _watch_big(fn: Learner) -> dict:
    """The watch probe's reports (with what was tried) at n = BIG_N, causal and not; fails on an n × n tensor,
    autograd, an input written into."""
    from ..backward import tiled_attention_forward

    g = torch.Generator().manual_seed(14)
    q, k, v, dout = (_rand(g, 1, BIG_N, BIG_D) for _ in range(4))
    o, lse = tiled_attention_forward(q, k, v, 256)
    reports = {}
    for causal in (False, True):
        tried = (f"watching tiled_attention_backward(q, k, v, o, lse, dout, {BIG_BLOCK}"
                 f"{', causal=True' if causal else ''}) at n_q = n_k = {BIG_N}, d_k = d_v = {BIG_D}, one head")
        try:
            report = fn.observe("backward.watch", q, k, v, o, lse, dout, BIG_BLOCK, timeout=120,
                                **({"causal": True} if causal else {}))
        except LearnerRaised as exc:
            _raise(exc, tried, "(dq, dk, dv)")
        _forbid(report, tried, what="tiled_attention_backward", inputs=("q", "k", "v", "o", "lse", "dout"))
        largest, shape = int(report["largest"]), tuple(report["shape"])
        if largest >= BIG_N * BIG_N // 4:
            fail("built an n × n tensor", tried=tried, got=f"your function created a tensor of shape {shape} "
                 f"({largest:,} numbers)",
                 expected=f"nothing near n × n = {BIG_N * BIG_N:,} numbers: tiles of {BIG_BLOCK}×{BIG_BLOCK} = "
                          f"{BIG_BLOCK * BIG_BLOCK:,}, and vectors of n · d_k = {BIG_N * BIG_D:,}",
                 cause="the full score matrix (or dS, dP, or a full-size causal mask) was built; the tiled backward "
                       "holds one tile at a time",
                 fix="compute S, P, dP and dS one (block, block) tile at a time, the causal mask per tile from "
                     "global positions")
        reports[causal] = report, tried
    return reports


def _check_tiles(reports: dict) -> None:
    """Tiles of block_size × block_size, and with causal=True only the tiles on or below the diagonal."""
    for report, tried in reports.values():
        tile = sorted(report.get("exp_tile") or [])
        if tile and tile != [BIG_BLOCK, BIG_BLOCK]:
            fail("block_size ignored", tried=tried, got=f"the largest tile you exponentiated is {tile[0]}×{tile[1]}",
                 expected=f"tiles of {BIG_BLOCK}×{BIG_BLOCK}, the block_size passed, for queries and for keys",
                 cause=f"one of your loops steps by something other than block_size: {tile[0]}×{tile[1]} tiles"
                 if tile[1] <= BIG_BLOCK else f"a block of {tile[1]} queries or keys at once, more than "
                 f"block_size = {BIG_BLOCK}: a whole strip, or blocks of another size",
                 fix="step both loops, over query blocks and over key blocks, by block_size")
    (full, _), (causal, _) = reports[False], reports[True]
    blocks = BIG_N // BIG_BLOCK
    visited = blocks * (blocks + 1) // 2  # tiles on or below the diagonal
    tried = (f"watching the work with causal=True and False at n = {BIG_N}, blocks of {BIG_BLOCK} "
             f"({blocks} × {blocks} tiles)")
    fix = "for key block j, start the query loop at block j: range(k_start, n, block_size)"
    if causal.get("zero_tiles", 0) and not full.get("zero_tiles", 0):
        fail("causal: tiles above the diagonal not skipped", tried=tried, fix=fix,
             got=f"{causal['zero_tiles']} of the tiles you exponentiated were masked entirely (every key in them after "
                 "every query)", expected=f"only the {visited} tiles on or below the diagonal visited",
             cause="your query loop starts before the key block's own block, so tiles that lie wholly above the "
                   "diagonal are computed and then masked away: right values, wasted work")
    measure = next((m for m in ("exp_elements", "flops", "elements") if full[m] and causal[m]), "elements")
    ratio = causal[measure] / full[measure] if full[measure] else 0.0
    if full[measure] and ratio > (visited + (blocks - 1) / 2) / blocks**2:  # halfway to one extra tile per key block
        fail("causal: tiles above the diagonal not skipped", tried=tried, fix=fix,
             got=f"causal work is {ratio:.2f} × the non-causal work",
             expected=f"{visited / blocks**2:.2f} ×: only the {visited} of {blocks**2} tiles on or below the "
                      "diagonal are visited",
             cause="you computed the tiles above the diagonal and masked them out, which gives the right values at "
                   "twice the cost" if ratio > 0.9 else "your query loop starts before the key block's own block for "
                   "some key blocks, so some tiles wholly above the diagonal are computed")

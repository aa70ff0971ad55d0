"""Notebook 10's known mistakes: one backward in float64 with a switch per bug (:func:`_variant`), the text of
every mistake (:data:`TEXT`), the keys each exercise tries, and the rows of :class:`~..kit.Known` made of them."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from ...softmax import masked_softmax
from ..kit import Known

INF = float("inf")


def scales(bug: str, d: int, d_v: int) -> tuple[float, float, float, float]:
    """(scale of the scores, of dQ, of dK, the base scale) under ``bug``."""
    base = {"unscaled_all": 1.0, "by_d_all": 1 / d, "scale_dv": 1 / math.sqrt(d_v), "scale_inverted": math.sqrt(d)
            }.get(bug, 1 / math.sqrt(d))
    sq = {"no_scale_dq": 1.0, "no_scale": 1.0, "by_d": 1 / d}.get(bug, base)
    sk = {"no_scale_dk": 1.0, "no_scale": 1.0, "by_d": 1 / d}.get(bug, base)
    return (1.0 if bug == "s_unscaled" else base), sq, sk, base


def weights(s: torch.Tensor, mask: Any, bug: str) -> torch.Tensor:
    """P from the whole score matrix (the chain-rule exercise and the forward), with one bug."""
    if bug == "unstable":  # fully masked rows set to zero, but no maximum subtracted
        e = torch.exp(s if mask is None else s.masked_fill(~mask, -INF))
        p = e / e.sum(-1, keepdim=True)
        return p if mask is None else torch.where((~mask).all(-1, keepdim=True), 0.0, p)
    return {"mask_ignored": lambda: torch.softmax(s, -1), "mask_ds_only": lambda: torch.softmax(s, -1),
            "nan_rows": lambda: torch.softmax(s.masked_fill(~mask, -INF), -1),
            "weak_fill": lambda: torch.softmax(s.masked_fill(~mask, -1e9), -1),
            "mask_inverted": lambda: masked_softmax(s, ~mask), "softmax_axis": lambda: masked_softmax(s, mask, dim=-2),
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


def _unmasked_ds(s: torch.Tensor, p: torch.Tensor, dp: torch.Tensor, mask: Any, bug: str) -> torch.Tensor:
    """dS with the softmax of the unmasked scores in its factor P (``_factor``), in its row sum (``_rowsum``) or in
    both, then zeroed at the blocked keys (``_zeroed``) or not; P (the masked one) stays right everywhere else."""
    if mask is None:
        return p * (dp - (dp * p).sum(-1, keepdim=True))
    unmasked = torch.softmax(s, -1)
    factor = p if "rowsum" in bug else unmasked
    inner = p if "factor" in bug else unmasked
    ds = factor * (dp - (dp * inner).sum(-1, keepdim=True))
    return ds.masked_fill(~mask, 0.0) if bug.endswith("zeroed") else ds


def _variant(q, k, v, dout, bug: str = "", *, mask=None, o=None, lse=None, block=None, causal=False, scale=None,
             gscale=None):
    """The backward in float64 with one known bug (``bug=""``: none). Without ``lse``: the chain rule on the whole
    matrix (exercise 1). With ``o``, ``lse``: the FlashAttention-2 loops (exercise 3), key blocks outer, P = exp(S − L)
    per (block, block) tile, D = rowsum(dO ⊙ O). ``scale``/``gscale`` replace the scale of the scores / of dQ, dK."""
    q, k, v, dout = (t.to(torch.float64) for t in (q, k, v, dout))
    n, m, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s_scale, sq, sk, base = scales(bug, d, v.shape[-1])
    s_scale = s_scale if scale is None else scale
    sq, sk = (sq, sk) if gscale is None else (gscale, gscale)
    tiled = lse is not None
    block = block if tiled else max(n, m, 1)
    if tiled:  # D: (..., n_q)
        o = o.to(torch.float64)
        delta = {"delta_mean": (dout * o).mean(-1), "delta_no_o": dout.sum(-1), "delta_no_dout": o.sum(-1),
                 "delta_dout_dout": (dout * dout).sum(-1), "delta_o_o": (o * o).sum(-1)}.get(bug, (dout * o).sum(-1))
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
                    s = s.masked_fill(blocked, {"mask_plus_inf": INF, "mask_zero": 0.0}.get(bug, -INF))
            p = _tile_weights(s, lse[..., qs:qe], bug) if tiled else weights(s, mask, bug)
            if bug == "mask_after_exp" and blocked is not None:
                p = p * ~blocked
            tv = {"dv_transposed": lambda: p @ dob, "dv_uses_v": lambda: p.mT @ vb, "dv_no_p": lambda: dob,
                  "dv_no_dout": lambda: p.mT}.get(bug, lambda: p.mT @ dob)()
            tv = tv * base if bug == "dv_scaled" else tv
            dp = vb @ dob.mT if bug == "dp_transposed" else dob @ vb.mT
            rows = (dp * p).sum(-1, keepdim=True) if not tiled or bug == "delta_tile" else delta[..., qs:qe, None]
            ds = _ds(p, dp, rows, bug)
            ds = _unmasked_ds(s, p, dp, mask, bug) if bug.startswith("ds_unmasked") else ds
            ds = ds.masked_fill(~mask, 0.0) if bug == "mask_ds_only" else ds
            tq = {"dq_transposed": lambda: ds.mT @ kb, "dq_from_q": lambda: ds @ qb, "dq_no_ds": lambda: kb,
                  "dq_no_k": lambda: ds}.get(bug, lambda: ds @ kb)() * sq
            tk = {"dk_transposed": lambda: ds @ qb, "dk_from_k": lambda: ds.mT @ kb, "dk_no_ds": lambda: qb,
                  "dk_no_q": lambda: ds.mT}.get(bug, lambda: ds.mT @ qb)() * sk
            if not tiled:  # the whole matrix is one tile, and each term has the shape its mistake gives it
                return tq, tk, tv
            dq[..., qs:qe, :] = tq if bug == "dq_overwritten" else dq[..., qs:qe, :] + tq
            dkb = tk if bug in ("dkdv_overwritten", "dk_overwritten") else dkb + tk
            dvb = tv if bug in ("dkdv_overwritten", "dv_overwritten") else dvb + tv
        dk[..., ks:ke, :], dv[..., ks:ke, :] = dkb, dvb
    return dq, dk, dv


_SCALE_FIX = "multiply dQ = dS K and dK = dSᵀ Q by 1/√d_k, the scale the forward put on Q Kᵀ"
_SQRT, _SCALE = "divide by math.sqrt(d_k)", "scale = 1 / math.sqrt(q.shape[-1])"
_DQ, _DK, _DV = "dQ = dS K/√d_k", "dK = dSᵀ Q/√d_k", "dV = Pᵀ dO: p.transpose(-2, -1) @ dout"
_DS = "dS = P ⊙ (dP − rowsum(dP ⊙ P))"
VJP_FIX = "dS = P ⊙ (dP − (dP * P).sum(-1, keepdim=True))"
_UNMASKED_FIX = "use the masked P = masked_softmax(scores, mask) in dS as well: it is 0 at the blocked keys"
_MASK_FIX = "use the course's masked_softmax(scores, mask): a fully masked row gets zero weights, so zero gradients"
_TILE_P = "P = torch.exp(s - lse[..., q_start:q_end, None])"
DELTA = "delta = (dout * o).sum(-1, keepdim=True)"
LOOP = "loop with range(0, n_q, block_size) and slice [start:start + block_size] (the last slice is shorter)"
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
                  "softmax's vector–Jacobian product (notebook 04)", VJP_FIX),
    "rowsum_axis": ("softmax VJP: rowsum over the wrong axis", "you summed dP ⊙ P over the queries (axis -2); each "
                    "query's softmax is over its row of keys", "sum over the keys: (dP * P).sum(-1, keepdim=True)"),
    "rowsum_broadcast": ("softmax VJP: rowsum subtracted along the wrong axis", "summed without keepdim=True, the "
                         "(..., n_q) row sums broadcast along the keys' axis", "keep the summed axis: "
                         "(dP * P).sum(-1, keepdim=True), shape (..., n_q, 1)"),
    "rowsum_unweighted": ("softmax VJP: rowsum(dP) instead of rowsum(dP ⊙ P)", "the softmax's VJP subtracts the "
                          "weighted row sum ⟨dP, P⟩, not the plain one", VJP_FIX),
    "rowsum_of_p": ("softmax VJP: rowsum(P) instead of rowsum(dP ⊙ P)", "the row sum of P is 1; the softmax's VJP "
                    "subtracts the row sum of dP ⊙ P", VJP_FIX),
    "rowsum_all": ("softmax VJP: one sum over the whole matrix", "you summed dP ⊙ P over every query and key at once; "
                   "each query needs its own sum", "sum over the last axis only: (dP * P).sum(-1, keepdim=True)"),
    "rowsum_mean": ("softmax VJP: mean instead of sum", "the softmax's VJP subtracts the row sum of dP ⊙ P, not its "
                    "mean", VJP_FIX),
    "rowsum_sign": ("softmax VJP: rowsum added instead of subtracted", "you computed dS = P ⊙ (dP + rowsum(dP ⊙ P))",
                    VJP_FIX),
    "diag_jacobian": ("softmax VJP: only the Jacobian's diagonal", "P(1 − P) ⊙ dP leaves out the −pᵢpⱼ terms: each "
                      "weight depends on every score of its row", VJP_FIX),
    "no_p": ("softmax VJP: the factor P is missing", "you computed dS = dP − rowsum(dP ⊙ P) without multiplying by P",
             _DS),
    "ds_is_p": ("dS = P: the bracket (dP − D) is missing", "you used the weights P as dS", VJP_FIX),
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
    "ds_unmasked": ("dS from the unmasked P", "your P for dV is masked, but dS = P ⊙ (dP − rowsum(dP ⊙ P)) uses "
                    "the softmax of the unmasked scores: blocked keys get weight there, so dQ and dK get gradient "
                    "from keys the forward never saw", _UNMASKED_FIX),
    "ds_unmasked_zeroed": ("dS from the unmasked P, zeroed at masked keys", "you zeroed dS at the blocked keys, but "
                           "the P inside dS is the softmax of the unmasked scores: its kept weights and rowsum(dP ⊙ "
                           "P) still count the blocked keys", _UNMASKED_FIX + "; then dS needs no extra masking"),
    "ds_unmasked_factor": ("unmasked P as the factor of dS", "in dS = P ⊙ (dP − rowsum(dP ⊙ P)) the leading P is "
                           "the softmax of the unmasked scores (the row sum uses the masked one), so dS is not 0 at "
                           "the blocked keys", _UNMASKED_FIX),
    "ds_unmasked_factor_zeroed": ("unmasked P as dS's factor, zeroed at masked keys", "you zeroed dS at the "
                                  "blocked keys, but the leading P of dS = P ⊙ (dP − rowsum(dP ⊙ P)) is the softmax "
                                  "of the unmasked scores, so its kept weights count the blocked keys",
                                  _UNMASKED_FIX + "; then dS needs no extra masking"),
    "ds_unmasked_rowsum": ("unmasked P in dS's rowsum(dP ⊙ P)", "the row sum rowsum(dP ⊙ P) in dS uses the softmax "
                           "of the unmasked scores, so it counts the blocked keys", _UNMASKED_FIX),
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
    "delta_mean": ("D as a mean instead of a sum", "D is the row sum of dO ⊙ O, not its mean", DELTA),
    "delta_no_o": ("D = rowsum(dO): the factor O is missing", "you summed dO alone; D = rowsum(dO ⊙ O)", DELTA),
    "delta_dout_dout": ("D = rowsum(dO ⊙ dO): O replaced by dO", "you multiplied dO by itself; D = rowsum(dO ⊙ "
                        "O) pairs the upstream gradient with the forward's output O", DELTA),
    "delta_o_o": ("D = rowsum(O ⊙ O): dO replaced by O", "you multiplied O by itself; D = rowsum(dO ⊙ O) pairs the "
                  "forward's output O with the upstream gradient dO", DELTA),
    "delta_no_dout": ("D = rowsum(O): the factor dO is missing", "you summed O alone; D = rowsum(dO ⊙ O)", DELTA),
    "mask_offset_sign": ("causal mask offset the wrong way", "you shifted each tile's mask by k_start − q_start; key "
                         "k_start + c is in the future of query q_start + r when c − r > q_start − k_start",
                         "mask where k_start + column > q_start + row, e.g. "
                         "torch.ones(bq, bk, dtype=torch.bool).triu(q_start - k_start + 1)"),
    "mask_plus_inf": ("blocked scores set to +∞ instead of −∞", "exp(+inf) is inf, and the gradients turn into NaN",
                      "s.masked_fill(blocked, float('-inf'))"),
    "mask_zero": ("blocked scores set to 0 instead of −∞", "you filled the blocked scores with 0: exp(0 − L) is not 0, "
                  "so future keys keep a weight", "s.masked_fill(blocked, float('-inf'))"),
    "exp_split": ("exp(S) and exp(L) taken separately", "with scores of order ±10³, exp(S) and exp(L) leave the "
                  "floating-point range together: both inf where L is large (inf/inf is NaN), both 0 where L is far "
                  "below 0 (0/0 is NaN)", "exponentiate S − L in one step: " + _TILE_P),
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
                 LOOP.replace("n_q", n[:3]))
TEXT["no_causal_anywhere"] = TEXT["no_causal"]  # the mask forgotten in the forward's L and O too: plain attention

_COMMON = ("no_scale_dq", "no_scale_dk", "no_scale", "by_d", "s_unscaled", "unscaled_all", "by_d_all", "scale_inverted",
           "scale_dv", "dk_transposed", "dk_from_k", "dv_transposed", "dv_scaled", "dv_no_p", "dv_no_dout", "dq_no_ds",
           "dq_no_k", "dk_no_ds", "dk_no_q", "no_rowsum", "no_p", "ds_is_p", "sign")
NAIVE = _COMMON + ("dq_transposed", "dq_from_q", "dv_uses_v", "dp_transposed", "rowsum_axis", "rowsum_broadcast",
                   "rowsum_unweighted", "rowsum_of_p", "rowsum_all", "rowsum_mean", "rowsum_sign", "diag_jacobian",
                   "softmax_axis", "no_softmax", "unstable")
MASKED = ("mask_ignored", "mask_inverted", "mask_ds_only", "mask_after_softmax", "mask_added", "nan_rows", "weak_fill",
          "ds_unmasked", "ds_unmasked_zeroed", "ds_unmasked_factor", "ds_unmasked_factor_zeroed",
          "ds_unmasked_rowsum")
TILED = _COMMON + ("exp2_unconverted", "fresh_max", "tile_softmax", "lse_as_sum", "lse_broadcast", "lse_ignored",
                   "lse_sign", "no_exp", "exp_split", "delta_tile", "delta_tile_axis", "delta_broadcast", "delta_sign",
                   "delta_mean", "delta_no_o", "delta_no_dout", "delta_dout_dout", "delta_o_o",
                   "dq_overwritten", "dkdv_overwritten", "dk_overwritten",
                   "dv_overwritten", "q_tail", "k_tail", "both_tails")
CAUSAL = ("no_causal", "no_causal_anywhere", "diag_unmasked", "skip_diag", "mask_self", "mask_ahead", "local_mask",
          "mask_offset_sign", "mask_after_exp", "mask_plus_inf", "mask_zero")


def naive(q, k, v, dout, mask=None, bug="", **scales):
    return _variant(q, k, v, dout, bug, mask=mask, **scales)


def tiled(q, k, v, o, lse, dout, block, causal, bug="", **scales):
    if bug == "no_causal_anywhere":
        return _variant(q, k, v, dout)
    return _variant(q, k, v, dout, bug, o=o, lse=lse, block=block, causal=causal, **scales)


def flat(grads) -> torch.Tensor:
    """Three gradients as one tensor, their shapes first (what the engine compares)."""
    head = [float(x) for g in grads for x in (g.dim(), *g.shape)]
    return torch.cat([torch.tensor(head, dtype=torch.float64), *(g.detach().double().flatten() for g in grads)])


def table(keys, grads: Callable[..., tuple]) -> list[Known]:
    """Known rows for ``keys``: each makes the three gradients of ``grads(*case, bug=key)``, flattened."""
    return [Known(key, *TEXT[key], lambda *case, key=key: flat(grads(*case, bug=key))) for key in keys]

"""MultiHeadAttention's oracle and its known mistakes, each :func:`multihead` with one argument changed."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn

from ...multihead import merge_heads as ref_merge, split_heads as ref_split, torch_masks
from ...softmax import masked_softmax
from ..kit import Known
from .heads import MERGE_MISTAKES, SPLIT_MISTAKES
from .shared import Sized


_MASKING = {  # how the scores s (B, A, n_q, n_k) and the broadcast mask m become weights, right or wrong
    "ok": masked_softmax,
    "inverted": lambda s, m, dim: masked_softmax(s, ~m, dim),
    "ignored": lambda s, m, dim: torch.softmax(s, dim),
    "after": lambda s, m, dim: torch.softmax(s, dim) * m,
    "nan": lambda s, m, dim: torch.softmax(s.masked_fill(~m, float("-inf")), dim),
    "finite": lambda s, m, dim: torch.softmax(s.masked_fill(~m, -1e9), dim),
    "transposed": lambda s, m, dim: masked_softmax(s, m.transpose(-2, -1), dim),
    "added": lambda s, m, dim: torch.softmax(s + m.to(s.dtype), dim),
    "zero_fill": lambda s, m, dim: torch.softmax(s.masked_fill(~m, 0.0), dim),
    # a (B·A, …) mask built head-major for batch-major scores
    "heads_batch_mixed": lambda s, m, dim: masked_softmax(s, m.transpose(0, 1).reshape(m.shape), dim),
}
_POST = {"": lambda out, x: out, "residual": lambda out, x: out + x,
         "layer_norm": lambda out, x: nn.functional.layer_norm(out, out.shape[-1:]),
         "residual_layer_norm": lambda out, x: nn.functional.layer_norm(out + x, out.shape[-1:])}


def multihead(P: dict, x_q: torch.Tensor, x_kv: torch.Tensor | None, mask: torch.Tensor | None, a: int,
               d_head: int, *, scale: float | None = None, split: Callable = ref_split, merge: Callable = ref_merge,
               split_on: str = "qkv", roles: str = "qkv", inputs: tuple = ("x_q", "x_kv", "x_kv"), dim: int = -1,
               mask_mode: str = "ok",
               scale_after: float = 1.0, v_scale: float = 1.0, out_proj: bool = True, out_bias: float = 1.0,
               post: str = "", returns: str = "weights") -> tuple[torch.Tensor, torch.Tensor]:
    """(out, weights) of multi-head attention from plain float64 tensors, or of one classic mistake in it.
    ``split``/``merge`` make and join the heads (``split`` makes those of ``split_on``, the others are split right);
    ``roles`` names the projections used for the queries, keys and values
    (``"kqv"``: W^K for the queries…) and ``inputs`` what each projects; ``returns`` what comes back as the weights
    (``"scores"``: the scaled scores after masking, ``"raw_scores"``)."""
    src = {"x_q": x_q.to(torch.float64), "x_kv": (x_q if x_kv is None else x_kv).to(torch.float64)}
    q, k, v = ((split if part in split_on else ref_split)(src[x] @ P[r][0].T + P[r][1], a)
               for part, r, x in zip("qkv", roles, inputs))  # (B, A, n_q or n_k, d_head)
    scores = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(d_head) if scale is None else scale)  # (B, A, n_q, n_k)
    raw = scores
    if mask_mode == "causal":  # a causal mask built inside forward, whatever mask was given
        mask, mask_mode = torch.ones(scores.shape[-2:], dtype=torch.bool).tril(), "ok"
    full = None if mask is None else torch.broadcast_to(mask, scores.shape)
    weights = _MASKING[mask_mode if full is not None else "ok"](scores, full, dim) * scale_after  # (B, A, n_q, n_k)
    if full is not None:
        scores = scores.masked_fill(~full, float("-inf"))
    cat = merge(weights @ (v * v_scale))  # (B, n_q, A·d_head)
    out = cat @ P["o"][0].T + out_bias * P["o"][1] if out_proj else cat  # (B, n_q, d_model)
    return _POST[post](out, src["x_q"]), {"weights": weights, "scores": scores, "raw_scores": raw}[returns]


def _fused_per_head(P: dict, a: int, d_head: int) -> dict:
    """The W^Q, W^K, W^V a learner gets who splits a fused qkv_proj head by head — (B, n, A, 3·d_head), then
    chunk(3) — instead of into three blocks q | k | v."""
    w, b = torch.cat([P[r][0] for r in "qkv"]), torch.cat([P[r][1] for r in "qkv"])  # as the check loads them
    rows = {r: torch.tensor([h * 3 * d_head + i * d_head + j for h in range(a) for j in range(d_head)])
            for i, r in enumerate("qkv")}
    return {**P, **{r: (w[rows[r]], b[rows[r]]) for r in "qkv"}}


def _oracle(P: dict, x_q, x_kv, mask, a: int, d_head: int, d_model: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(out, weights, whether nn.MultiheadAttention gave them)."""
    x_q64 = x_q.to(torch.float64)
    x_kv64 = x_q64 if x_kv is None else x_kv.to(torch.float64)
    b, n_q, n_k = x_q.shape[0], x_q.shape[1], x_kv64.shape[1]
    fully_masked = mask is not None and bool((~torch.broadcast_to(mask, (b, a, n_q, n_k))).all(-1).any())
    if a * d_head != d_model or fully_masked:
        return (*multihead(P, x_q, x_kv, mask, a, d_head), False)
    torch_mha = nn.MultiheadAttention(d_model, a, batch_first=True, dtype=torch.float64).eval()
    torch_mha.load_state_dict({"in_proj_weight": torch.cat([P[r][0] for r in "qkv"]), "out_proj.weight": P["o"][0],
                               "in_proj_bias": torch.cat([P[r][1] for r in "qkv"]), "out_proj.bias": P["o"][1]})
    with torch.no_grad():
        out, w = torch_mha(x_q64, x_kv64, x_kv64, attn_mask=torch_masks(mask, batch=b, n_heads=a, n_q=n_q, n_k=n_k),
                           average_attn_weights=False)
    return out, w, True


class Case:
    """One forward call of the module check, as the mistakes' ``make(case, view)`` see it; each output computed once."""

    def __init__(self, P: dict, x_q, x_kv, mask, a: int, d_head: int, d_model: int, fused: bool):
        self.P, self.x_q, self.x_kv, self.mask, self.a, self.d_head, self.fused = P, x_q, x_kv, mask, a, d_head, fused
        self.out, self.weights, self.by_torch = _oracle(P, x_q, x_kv, mask, a, d_head, d_model)
        self.allowed = torch.broadcast_to(torch.tensor(True) if mask is None else mask, self.weights.shape)
        self.split_width = abs(d_model / a - d_head) > 1e-9  # d_head ≠ d_model / A
        self.width_differs = a * d_head != d_model
        self.words = dict(ratio=f"{d_model / a:g}", d_head=d_head, none="" if mask is not None else
                          " — here none was given", also="" if self.width_differs else
                          " (here also √(A·d_head), the width of all heads together)")
        self.scales = {"1/√d_model": 1 / math.sqrt(d_model), "1/d_head": 1 / d_head, "√d_head": math.sqrt(d_head),
                       "1/√(d_model/A)": 1 / math.sqrt(d_model / a), "1/√(A·d_head)": 1 / math.sqrt(a * d_head),
                       "1/√d_head": 1 / math.sqrt(d_head)}
        self._memo: dict = {}

    def part(self, view: str, per_head: bool = False, **kw) -> torch.Tensor | None:
        """``view`` ("out" or "weights") of the mistake that ``kw`` names (a factor by its name in ``scales``;
        ``per_head``: qkv_proj split head by head)."""
        kw = {k: self.scales.get(v, v) if k in ("scale", "scale_after", "v_scale") else v for k, v in kw.items()}
        key = (per_head, *sorted(kw.items()))
        if key not in self._memo:
            P = _fused_per_head(self.P, self.a, self.d_head) if per_head else self.P
            try:
                self._memo[key] = multihead(P, self.x_q, self.x_kv, self.mask, self.a, self.d_head, **kw)
            except Exception:  # noqa: BLE001 - this mistake cannot run on this case (lengths differ…)
                self._memo[key] = None
        pair = self._memo[key]
        return None if pair is None else pair[0 if view == "out" else 1]


def _m(key: str, summary: str, cause: str, fix: str, when: Callable[[Case], bool] | None = None, **kw) -> Sized:
    """A mistake of the module: :func:`multihead` with ``kw``, on the cases where ``when(case)`` holds."""
    return Sized(key, summary, cause, fix, lambda c, view: c.part(view, **kw) if when is None or when(c) else None,
                 sizes=lambda c, view: c.words)


def _inside(table: list[Known], key: str, step: str) -> Sized:
    """A split_heads / merge_heads mistake (``step``: "split" or "merge"), made inside forward: the same texts."""
    row = next(k for k in table if k.key == key)
    return _m(f"{step}_{key}", row.summary, row.cause, row.fix, **{step: row.make})


def _split_one(key: str, part: str) -> Sized:
    """A split_heads mistake made for one of q, k, v only (``part``), the other two split right."""
    row, words = next(k for k in SPLIT_MISTAKES if k.key == key), {"q": "queries", "k": "keys", "v": "values"}[part]
    return _m(f"split_{key}_{part}", f"{row.summary} ({words} only)", f"for the {words} only, {row.cause}; the other "
              f"two are split right", f"{row.fix}, for the {words} as for the others", split=row.make, split_on=part)


_MASK_FIX = "fill the scores where the mask is False with -inf before the softmax, or use masked_softmax(scores, mask)"
_SCALE_FIX = "divide by math.sqrt(d_head)"
_EMPTY_FIX = "such a row gets zero weights in this course: use masked_softmax(scores, mask) from attn_course.softmax"
_BLOCK = "return out_proj(concatenated heads) as it is: the transformer block around attention adds the rest"
_CROSS, _MASKED = (lambda c: c.x_kv is not None), (lambda c: c.mask is not None)
_FUSED_ORDERS = {"kqv": "k, q, v", "qvk": "q, v, k", "vkq": "v, k, q", "kvq": "k, v, q", "vqk": "v, q, k"}
_FUSED_SPLIT = "qkv.split(n_heads * d_head, dim=-1)"

MODULE_MISTAKES = [
    *(_inside(SPLIT_MISTAKES, key, "split") for key in ("no_transpose", "strided")),
    *(_split_one(key, part) for key in ("no_transpose", "strided") for part in "qkv"),
    _m("sqrt_d_model", "scaled by √d_model, not √d_head", "you divided the scores by √d_model{also}; each head's dot "
       "product has only d_head terms", _SCALE_FIX, scale="1/√d_model"),
    _m("unscaled", "scores not scaled", "you did not divide the scores by √d_head", _SCALE_FIX, scale=1.0),
    _m("d_head", "divided by d_head instead of √d_head", "you divided the scores by d_head", _SCALE_FIX,
       scale="1/d_head"),
    _m("times_sqrt", "multiplied by √d_head", "you multiplied the scores by √d_head", _SCALE_FIX, scale="√d_head"),
    *(_m(f"softmax_{axis}", f"softmax over the {axis}", f"you took the softmax over axis {dim}, the {axis} of "
         "(B, A, n_q, n_k)", "take it over the keys, dim=-1: each query's row of weights sums to 1", dim=dim)
      for dim, axis in ((-2, "queries"), (1, "heads"), (0, "batch"))),
    *(_m(f"weights_scaled{i}", "weights scaled instead of the scores", "you divided the weights by √d_head after the "
         "softmax, so the rows sum to 1/√d_head", "divide the scores q @ kᵀ by √d_head before the softmax",
         scale_after="1/√d_head", **kw) for i, kw in enumerate(({"scale": 1.0}, {}))),
    _m("qk_swapped", "queries and keys swapped", "your scores are k·qᵀ instead of q·kᵀ (W^K used for the queries, or "
       "k @ q.transpose(-2, -1))", "q = q_proj(x_q), k = k_proj(x_kv), scores = q @ k.transpose(-2, -1)",
       when=lambda c: not c.fused, roles="kqv"),  # fused: a split order, below
    _m("v_with_w_k", "values projected with W^K", "you computed the values with k_proj", "v = v_proj(x_kv)",
       roles="qkk"),
    _m("kv_swapped", "keys and values swapped", "you computed the keys with v_proj and the values with k_proj",
       "k = k_proj(x_kv), v = v_proj(x_kv)", when=lambda c: not c.fused, roles="qvk"),  # fused: a split order, below
    *(_inside(MERGE_MISTAKES, key, "merge") for key in ("no_transpose", "interleaved", "reversed")),
    _m("no_out_proj", "W^O not applied", "you returned the concatenated heads without out_proj",
       "return self.out_proj(concatenated heads)", out_proj=False),
    _m("values_scaled", "values scaled instead of the scores", "you divided the values (or the heads' outputs) by "
       "√d_head", "scale only the scores: (q @ k.transpose(-2, -1)) / math.sqrt(d_head)", v_scale="1/√d_head"),
    _m("residual", "residual added inside attention", "your out is the attention output plus x_q: the residual belongs "
       "to the transformer block around attention", "return out_proj(concatenated heads) without adding x_q",
       post="residual"),
    _m("layer_norm", "layer norm inside attention", "you applied a layer norm to out", _BLOCK, post="layer_norm"),
    _m("residual_layer_norm", "residual and layer norm inside attention", "your out is layer_norm(attention output + "
       "x_q), a whole post-norm sub-layer", _BLOCK, post="residual_layer_norm"),
    _m("q_with_w_k", "queries projected with W^K", "you computed the queries with k_proj", "q = q_proj(x_q)",
       roles="kkv"),
    _m("k_with_w_q", "keys projected with W^Q", "you computed the keys with q_proj", "k = k_proj(x_kv)", roles="qqv"),
    *(_m(f"scores_returned{i}", "scores returned as the weights", "you returned the scaled scores q·kᵀ/√d_head, not "
         "their softmax", "return the weights, softmax(scores) over the keys", returns=r) for i, r in
      enumerate(("scores", "raw_scores"))),
    _m("raw_scores_returned", "scores returned as the weights", "you returned the unscaled scores q·kᵀ, not their "
       "softmax", "return the weights, softmax(q·kᵀ/√d_head) over the keys", returns="raw_scores", scale=1.0),
    _m("always_causal", "always causal", "you applied a causal mask whatever the mask argument says{none}",
       "use the mask you are given (None: every key allowed)", mask_mode="causal"),
    _m("sqrt_d_model_over_a", "scaled by √(d_model / A), not √d_head", "you divided the scores by √(d_model / n_heads) "
       "= √{ratio}; a head's dot product has d_head = {d_head} terms", _SCALE_FIX, when=lambda c: c.split_width,
       scale="1/√(d_model/A)"),
    *(_m(f"fused_{order}", f"qkv_proj split in the order {said}", f"you took qkv_proj's three blocks as {said}",
         f"q, k, v = {_FUSED_SPLIT}, in that order", when=lambda c: c.fused, roles=order)
      for order, said in _FUSED_ORDERS.items()),
    _m("fused_per_head", "qkv_proj split head by head", "you split each head's piece of qkv_proj's output into q, k, "
       "v; qkv_proj holds three blocks: all of q, then all of k, then all of v", f"split first into three blocks "
       f"({_FUSED_SPLIT}), then each into heads", when=lambda c: c.fused, per_head=True),
    _m("sqrt_width", "scaled by √(A·d_head)", "you divided the scores by √(A·d_head), the width of all heads together",
       "divide by math.sqrt(d_head), one head's width", when=lambda c: c.width_differs, scale="1/√(A·d_head)"),
    *(_m(key, summary, cause, fix, when=_CROSS, inputs=inputs) for key, summary, cause, fix, inputs in (
        ("x_kv_ignored", "x_kv ignored: keys and values from x_q", "you computed the keys and values from x_q even "
         "when x_kv is given", "k = k_proj(x_kv), v = v_proj(x_kv); x_q only when x_kv is None", ("x_q",) * 3),
        ("v_from_x_q", "values from x_q in cross-attention", "you computed the values from x_q", "v = v_proj(x_kv)",
         ("x_q", "x_kv", "x_q")),
        ("k_from_x_q", "keys from x_q in cross-attention", "you computed the keys from x_q", "k = k_proj(x_kv)",
         ("x_q", "x_q", "x_kv")),
        ("q_from_x_kv", "queries from x_kv in cross-attention", "you computed the queries from x_kv",
         "q = q_proj(x_q)", ("x_kv",) * 3),
        ("x_swapped", "x_q and x_kv swapped", "you took the queries from x_kv and the keys and values from x_q",
         "queries come from x_q, keys and values from x_kv", ("x_kv", "x_q", "x_q")))),
    *(_m(key, summary, cause, fix, when=_MASKED, mask_mode=mode) for key, mode, summary, cause, fix in (
        ("mask_inverted", "inverted", "mask polarity inverted", "you blocked the positions where the mask is True; "
         "here True means 'may attend' (as in F.scaled_dot_product_attention, unlike nn.MultiheadAttention)",
         "fill the scores where the mask is False: scores.masked_fill(~mask, float('-inf'))"),
        ("mask_ignored", "ignored", "mask ignored", "you did not use the mask", _MASK_FIX),
        ("mask_after", "after", "mask applied after the softmax", "you zeroed the weights after the softmax, so the "
         "rows no longer sum to 1", "mask the scores before the softmax"),
        ("mask_transposed", "transposed", "mask transposed", "you applied the mask with its rows (queries) and columns "
         "(keys) swapped", "use mask[..., i, j] for query i and key j"),
        ("mask_zero_fill", "zero_fill", "blocked scores set to 0", "you filled the blocked scores with 0 instead of "
         "-inf, so blocked keys still get weight", _MASK_FIX),
        ("mask_added", "added", "bool mask added to the scores", "you added the boolean mask to the scores: True "
         "counts as +1, which blocks nothing", _MASK_FIX),
        ("mask_heads_batch", "heads_batch_mixed", "mask matched to the wrong batch entries and heads", "you flattened "
         "the mask to (B·A, n_q, n_k) head by head while the scores run batch entry by batch entry (repeat vs "
         "repeat_interleave)", "let a (B, 1, n_q, n_k) mask broadcast against (B, A, n_q, n_k) scores, unreshaped"),
        ("mask_nan", "nan", "NaN on a fully masked row", "a query whose keys are all blocked got softmax of -inf "
         "everywhere, which is 0/0 = NaN", _EMPTY_FIX),
        ("mask_finite", "finite", "uniform weights on a fully masked row", "you filled blocked scores with a finite "
         "number, so a query whose keys are all blocked spreads its weight evenly over them", _EMPTY_FIX))),
    Known("weights_averaged", "weights averaged over the heads", "you returned the mean over heads, one (n_q, n_k) "
          "matrix per batch entry (nn.MultiheadAttention's default)", "return every head's weights: (B, A, n_q, n_k)",
          lambda c, view: c.weights.mean(1) if view == "weights" else None),
    _m("out_bias_missing", "out_proj's bias not added", "your out lacks out_proj's bias at every position",
       "return self.out_proj(concatenated heads)", out_bias=0.0),
    _m("out_bias_twice", "out_proj's bias added twice", "your out has out_proj's bias twice at every position",
       "self.out_proj(concatenated heads) adds its bias once: add no other", out_bias=2.0),
]

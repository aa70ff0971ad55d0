"""Checks for notebook 06: causal, padding, decoder, cross-attention and additive masks.

Convention: a boolean mask is True where a query may attend to a key. Where a boolean mask is asked
for, the additive form (0 = keep, -inf or a very large negative = block) is accepted too. Masks for
scores of shape (B, H, n_q, n_k) are compared after broadcasting to that shape (with H = 3 ≠ B), so
(B, 1, n_q, n_k) and (B, 1, 1, n_k) both pass where they are correct.
Oracle for the additive mask: the softmax over the kept scores alone, and F.scaled_dot_product_attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._core import as_tensor, call, check, fail

__all__ = [
    "check_causal_mask",
    "check_padding_mask_from_lengths",
    "check_padding_mask_from_ids",
    "check_decoder_mask",
    "check_cross_attention_mask",
    "check_additive_mask",
]

HEADS = 3  # the heads axis every (B, 1, n_q, n_k) mask must broadcast over; differs from every batch size used

POLARITY = ("mask polarity inverted: in this course True means 'may attend' (the convention of "
            "F.scaled_dot_product_attention; nn.MultiheadAttention uses the opposite).")


def _as_bool_mask(value, what: str) -> torch.Tensor:
    """A bool mask from a bool tensor/array or an additive float mask (0 keep, -inf / huge negative block)."""
    t = as_tensor(value, what)
    if t.dtype == torch.bool:
        return t
    if t.is_floating_point():
        if torch.isnan(t).any():
            fail(f"{what} contains NaN: 0 × (-inf) is NaN — build an additive mask with masked_fill or torch.where, "
                 "or return a bool mask.")
        threshold = max(-1e9, torch.finfo(t.dtype).min)
        keep, block = t == 0, t <= threshold
        if bool((keep | block).all()):
            return keep
        values = sorted({float(v) for v in t.flatten()[:1000].tolist()})
        if set(values) <= {0.0, 1.0}:
            fail(f"{what} is a float mask of 0s and 1s; return a bool mask (True = may attend), e.g. with "
                 "`.bool()` or a comparison — or an additive mask with 0 and -inf.")
        weak = [v for v in values if threshold < v < 0]
        if weak:
            fail(f"{what} looks additive but blocks with {weak[0]:g}, a weak fill value that leaks weight when "
                 "scores are large: use float('-inf').")
        fail(f"{what} holds values {values[:6]}; expected a bool mask (True = may attend).")
    fail(f"{what} has dtype {str(t.dtype).replace('torch.', '')}; expected a bool mask (True = may attend): "
         "use `.bool()` or build it with a comparison.")


def _compare_mask(got: torch.Tensor, expected: torch.Tensor, target: tuple, what: str, pitfalls, shape_hints=()):
    """Compare ``got`` and ``expected`` broadcast to ``target``; name the mistake when a pitfall matches."""
    for shape, message in shape_hints:
        if tuple(got.shape) == tuple(shape):
            fail(f"{what} has shape {tuple(got.shape)} — {message}")
    try:
        g = torch.broadcast_to(got, target)
    except RuntimeError:
        fail(f"{what} has shape {tuple(got.shape)}, which does not broadcast to the scores' shape {target}; "
             f"expected {tuple(expected.shape)}.")
    e = torch.broadcast_to(expected, target)
    if torch.equal(g, e):
        return
    for message, wrong in pitfalls:
        if wrong is not None and torch.equal(g, torch.broadcast_to(wrong, target)):
            fail(f"{what} is wrong — {message}")
    if torch.equal(g, ~e):
        fail(f"{what} is wrong — {POLARITY}")
    where = tuple(int(i) for i in (g != e).nonzero()[0])
    fail(f"{what} differs from the expected mask at {int((g != e).sum())} positions; first at index {where}: "
         f"got {bool(g[where])}, expected {bool(e[where])}.")


# ----------------------------------------------------------------------------- causal
@check("causal_mask", expects="a function causal_mask(n) returning an (n, n) bool tensor")
def check_causal_mask(fn):
    sizes = [5, 8, 2, 1]
    for n in sizes:
        got = _as_bool_mask(call(fn, n), f"causal_mask({n})")
        while got.dim() > 2 and got.shape[0] == 1:  # (1, 1, n, n) broadcasts too
            got = got[0]
        ones = torch.ones(n, n, dtype=torch.bool)
        pitfalls = [
            ("upper triangle: query i may see keys j ≥ i (the future). Keep j ≤ i: torch.tril.", ones.triu()),
            ("diagonal excluded (off by one): a token must be allowed to attend to itself — tril with "
             "diagonal=0; otherwise the first row is empty.", ones.tril(-1)),
            ("one diagonal too many (off by one): query i also sees key i + 1, the next token.", ones.tril(1)),
            (POLARITY + " True marks the future positions here; use torch.tril for the allowed ones.", ones.triu(1)),
            ("nothing is masked: every query sees every key.", ones),
        ]
        _compare_mask(got, ones.tril(), (n, n), f"causal_mask({n})", pitfalls)
    return f"lower-triangular with the diagonal, for n in {sizes}"


# ----------------------------------------------------------------------------- padding
@check("padding_mask_from_lengths", expects="a function padding_mask_from_lengths(lengths, max_len=None) returning a (B, max_len) bool tensor")
def check_padding_mask_from_lengths(fn):
    cases = [(torch.tensor([3, 1, 4]), 6), (torch.tensor([2, 5]), 5), (torch.tensor([0, 2]), 3), (torch.tensor([4, 2, 1]), None)]
    for lengths, max_len in cases:
        S = int(lengths.max()) if max_len is None else max_len
        shown = f"padding_mask_from_lengths({lengths.tolist()}" + ("" if max_len is None else f", max_len={max_len}") + ")"
        raw = call(fn, lengths) if max_len is None else call(fn, lengths, max_len=max_len)
        got = _as_bool_mask(raw, shown)
        B = len(lengths)
        positions = torch.arange(S)
        expected = positions < lengths[:, None]
        hints = [((S, B), f"transposed: expected (B, max_len) = {(B, S)}, one row per sequence.")] if S != B else []
        if max_len is not None and int(lengths.max()) != S:
            hints.append(((B, int(lengths.max())), f"max_len was ignored: the mask must have max_len = {S} columns."))
        pitfalls = [
            ("off by one: positions 0 … length−1 are real tokens, position `length` is already padding "
             "(use <, not <=).", positions <= lengths[:, None]),
            ("off by one: the last real token is marked as padding (use <, not < length − 1).",
             positions < (lengths[:, None] - 1)),
            (POLARITY + " Real tokens should be True, padding False.", positions >= lengths[:, None]),
        ]
        _compare_mask(got, expected, (B, S), shown, pitfalls, hints)
    return f"correct on {len(cases)} batches (zero length, no padding, default max_len)"


@check("padding_mask_from_ids", expects="a function padding_mask_from_ids(ids, pad_id) returning a (B, S) bool tensor")
def check_padding_mask_from_ids(fn):
    cases = [
        (torch.tensor([[5, 7, 2, 0, 0], [4, 4, 9, 8, 1]]), 0),
        (torch.tensor([[6, 3, 3, 3], [0, 2, 3, 3], [3, 3, 3, 3]]), 3),  # pad id 3; a token with id 0 is real
    ]
    for ids, pad_id in cases:
        shown = f"padding_mask_from_ids(ids of shape {tuple(ids.shape)}, pad_id={pad_id})"
        got = _as_bool_mask(call(fn, ids, pad_id), shown)
        pitfalls = [
            ("pad_id is ignored (compared with 0?): compare the ids with the pad_id argument.", ids != 0),
            (POLARITY + " Real tokens should be True, <pad> False: ids != pad_id.", ids == pad_id),
        ]
        _compare_mask(got, ids != pad_id, tuple(ids.shape), shown, pitfalls,
                      [((ids.shape[1], ids.shape[0]), "transposed: expected (B, S), one row per sequence.")])
    return f"correct on {len(cases)} batches (pad ids 0 and 3, an all-padding row)"


# ----------------------------------------------------------------------------- decoder and cross
_TGT = torch.tensor([[1, 5, 6, 7, 0, 0], [1, 8, 9, 4, 3, 2]])  # (B=2, T=6), pad id 0
# Left padding (as used when a decoder-only model generates for a batch): only here does blocking
# padding *queries* instead of padding *keys* change what the real tokens see.
_TGT_LEFT = torch.tensor([[0, 0, 1, 5, 6], [0, 1, 7, 8, 9], [1, 4, 3, 2, 5]])  # pad id 0, (3, 5)
_SRC = torch.tensor([[4, 9, 0, 0], [3, 5, 7, 2]])  # (B=2, S=4)
_TGT_PAD2 = torch.tensor([[1, 5, 2, 2, 2], [1, 3, 4, 6, 2], [1, 2, 2, 2, 2]])  # pad id 2, (3, 5)
_SRC_PAD2 = torch.tensor([[7, 8, 9, 2, 2, 2, 2], [5, 6, 2, 2, 2, 2, 2], [4, 4, 4, 4, 4, 4, 4]])  # (3, 7)


def _heads_hint(B, n_q, n_k):
    return ((B, n_q, n_k), f"no heads axis: (B, n_q, n_k) does not broadcast against scores (B, H, n_q, n_k) — "
            f"it lines B up with the heads. Return (B, 1, n_q, n_k), e.g. mask[:, None].")


@check("decoder_mask", expects="a function decoder_mask(tgt_ids, pad_id) returning a (B, 1, T, T) bool tensor")
def check_decoder_mask(fn):
    notes = []
    for ids, pad_id in [(_TGT, 0), (_TGT_PAD2, 2), (_TGT_LEFT, 0)]:
        B, T = ids.shape
        shown = f"decoder_mask(tgt_ids of shape {(B, T)}, pad_id={pad_id})"
        got = _as_bool_mask(call(fn, ids, pad_id), shown)
        ones = torch.ones(T, T, dtype=torch.bool)
        causal, real = ones.tril(), ids != pad_id
        keys, queries = real[:, None, None, :], real[:, None, :, None]
        expected = causal & keys  # (B, 1, T, T)
        target = (B, HEADS, T, T)
        # Blocking the padding queries' rows as well (both i and j real) is harmless: accepted.
        try:
            if torch.equal(torch.broadcast_to(got, target), torch.broadcast_to(causal & keys & queries, target)):
                notes.append("padding rows blocked too")
                continue
        except RuntimeError:
            pass
        pitfalls = [
            ("padding is applied to the queries (rows) instead of the keys (columns): block the columns of "
             "padding tokens, real[:, None, None, :] (with left padding, real tokens saw the <pad> keys).",
             causal & queries),
            ("the padding part is missing: combine the causal mask with the key-padding mask (AND).", causal),
            ("the causal part is missing: a token must not see later tokens (AND with torch.tril).", keys.expand(B, 1, T, T)),
            ("causal OR padding: both must hold — combine with & (AND), not | (OR).", causal | keys),
            ("upper triangle: the causal part lets queries see the future; use torch.tril.", ones.triu() & keys),
            ("diagonal excluded (off by one): a token may attend to itself; tril with diagonal=0.", ones.tril(-1) & keys),
            ("one diagonal too many (off by one) in the causal part.", ones.tril(1) & keys),
        ]
        _compare_mask(got, expected, target, shown, pitfalls, [_heads_hint(B, T, T)])
    note = f" ({notes[0]}: fine, though the course blocks keys only)" if notes else ""
    return "causal AND key padding (right and left padding), broadcasting over heads" + note


@check("cross_attention_mask", expects="a function cross_attention_mask(tgt_ids, src_ids, pad_id) returning a (B, 1, T, S) bool tensor")
def check_cross_attention_mask(fn):
    for tgt, src, pad_id in [(_TGT, _SRC, 0), (_TGT_PAD2, _SRC_PAD2, 2)]:
        (B, T), S = tgt.shape, src.shape[1]
        shown = f"cross_attention_mask(tgt_ids {(B, T)}, src_ids {(B, S)}, pad_id={pad_id})"
        got = _as_bool_mask(call(fn, tgt, src, pad_id), shown)
        src_real, tgt_real = src != pad_id, tgt != pad_id
        expected = src_real[:, None, None, :].expand(B, 1, T, S)
        swapped = ("rows and columns swapped: rows are the target queries (T = tgt length), columns the source keys "
                   "(S = src length); expected (B, 1, T, S).")
        hints = [((B, 1, S, T), swapped), ((B, S, T), swapped), ((B, 1, 1, T), swapped), _heads_hint(B, T, S)]
        causal_rect = torch.ones(T, S, dtype=torch.bool).tril()
        pitfalls = [
            ("the target padding (the queries' rows) is blocked instead of the source padding (the keys' columns).",
             tgt_real[:, None, :, None].expand(B, 1, T, S)),
            ("target padding rows are blocked as well: in cross-attention only the source padding (columns) is blocked.",
             expected & tgt_real[:, None, :, None]),
            ("cross-attention has no causal constraint: the whole source sentence is known; block only source padding.",
             expected & causal_rect),
            (POLARITY + " Real source tokens should be True.", ~expected),
        ]
        _compare_mask(got, expected, (B, HEADS, T, S), shown, pitfalls, hints)
    return "rows = target, columns = source, only source padding blocked, broadcasting over heads"


# ----------------------------------------------------------------------------- additive
def _large_scores(dtype):
    """(2, 1, 3, 4) scores: kept ones near -2e4, blocked ones up to +3e4, and the keep mask."""
    s = torch.tensor([[-20000.0, 30000.0, -20016.0, 0.0],
                      [30000.0, -20000.0, -5000.0, -20032.0],
                      [-20032.0, -20000.0, 30000.0, -5000.0]])
    keep = torch.tensor([[True, False, True, False], [False, True, False, True], [True, True, False, False]])
    scores = torch.stack([s, s.flip(-1)])[:, None].to(dtype)  # (2, 1, 3, 4)
    mask = torch.stack([keep, keep.flip(-1)])[:, None]  # (2, 1, 3, 4)
    return scores, mask


@check("additive_mask", expects="a function additive_mask(mask, dtype=torch.float32) returning a float tensor")
def check_additive_mask(fn):
    for dtype in (torch.float32, torch.float16, torch.float64):
        scores, mask = _large_scores(dtype)
        name = str(dtype).replace("torch.", "")
        shown = f"additive_mask(mask {tuple(mask.shape)}, dtype=torch.{name})"
        try:
            raw = call(fn, mask, dtype=dtype)
        except Exception as exc:
            if "overflow" in str(exc) and dtype == torch.float16:
                raise type(exc)(f"{exc} — -1e9 cannot be stored in float16 (its largest magnitude is 65504): "
                                "use float('-inf'), or torch.finfo(dtype).min.") from None
            raise
        got = as_tensor(raw, shown)
        if got.dtype != dtype:
            fail(f"{shown} has dtype {str(got.dtype).replace('torch.', '')}; expected {name}, the dtype asked for "
                 "(scores and mask must share it).")
        try:
            g = torch.broadcast_to(got, mask.shape)
        except RuntimeError:
            fail(f"{shown} has shape {tuple(got.shape)}; expected the mask's shape {tuple(mask.shape)}.")
        if torch.isnan(g).any():
            fail(f"{shown} contains NaN: 0 × (-inf) is NaN, so `(~mask) * float('-inf')` does not work — use "
                 "torch.zeros(...).masked_fill(~mask, float('-inf')) or torch.where.")
        if torch.equal(g, mask.to(dtype)):
            fail(f"{shown} is mask.to(dtype): 1 for kept and 0 for blocked only shifts the scores by 1 and blocks "
                 "nothing. Use 0 for kept positions and -inf for blocked ones.")
        if (g[mask] != 0).any():
            if (g[~mask] == 0).all():
                fail(f"{shown} is wrong — {POLARITY} The kept (True) positions get 0, the blocked ones -inf.")
            fail(f"{shown}: kept positions (mask True) must hold 0, found {float(g[mask][g[mask] != 0][0]):g}.")
        # Behaviour on large scores: the softmax of scores + mask must ignore the blocked keys.
        weights = torch.softmax((scores + g).to(torch.float32), dim=-1)
        expected = torch.softmax(scores.to(torch.float32).masked_fill(~mask, float("-inf")), dim=-1)
        leak = weights[~mask].max().item()
        if not torch.allclose(weights, expected, atol=1e-4) or leak > 1e-6:
            fill = float(g[~mask].max())
            fail(f"{shown}: a weak fill value ({fill:g}) leaks weight onto masked keys (up to {leak:.3g}) when "
                 "scores are large (±3e4 here). Use float('-inf') (or torch.finfo(dtype).min).")
        g_ = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(2, HEADS, n, 5, generator=g_) for n in (3, 4, 4))
        ours = F.scaled_dot_product_attention(q, k, v, attn_mask=g.to(torch.float32))
        oracle = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if not torch.allclose(ours, oracle, atol=1e-5):
            fail(f"{shown} does not act like the bool mask in F.scaled_dot_product_attention.")
    return "0 / -inf-like in float32, float16 and float64; no leak with scores of ±3e4"

"""Check of notebook 13's exercise 5, ``block_sparse_attention``: its cases and random layouts, its known
mistakes (09's tiled loop with one mistake), what the query blocks show, and the work it does counted."""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

from ..compare import Failure, as_tensor, call_or_skip, fail, fail_again, same
from ..core import Learner, LearnerRaised, check, learner_error
from ..kit import Known, Suspects, expect_unchanged, reproduce, variants
from .judge import blocks_right, dtype_of, expect_close_at_dtype, qkv, squares, tolerance


_SPARSE_FIX = ("for query block i, visit only the key blocks j with layout[i, j] True, keeping 09's running max, "
               "sum and accumulator; divide once at the end")
_VISIT_FIX = "query block i visits the key blocks j with layout[i, j] True: layout[i].nonzero()"


def _mask(q: Tensor, k: Tensor, layout: Tensor, b: int) -> Tensor:
    """(n_q, n_k) True where the layout keeps the (query block, key block) tile."""
    return layout.repeat_interleave(b, 0)[:q.shape[-2]].repeat_interleave(b, 1)[:, :k.shape[-2]]


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None = None) -> Tensor:
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, scale=scale)


def _sparse_tiles(q: Tensor, k: Tensor, v: Tensor, layout: Tensor, b: int, mistake: str) -> Tensor:
    """09's loop over the layout's tiles (float64) with one mistake switched on."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    for qb in range(layout.shape[0]):
        qs = q[..., qb * b:(qb + 1) * b, :] * (1 / math.sqrt(q.shape[-1]))
        m = torch.full(qs.shape[:-1] + (1,), -math.inf, dtype=torch.float64)
        l, acc = torch.zeros_like(m), torch.zeros(qs.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
        for kb in layout[qb].nonzero().flatten().tolist():
            s = qs @ k[..., kb * b:(kb + 1) * b, :].transpose(-2, -1)
            m_new = torch.maximum(m, s.amax(keepdim=True) if mistake == "tile_max" else s.amax(-1, keepdim=True))
            p = torch.exp(s if mistake == "no_max" else s - m_new)
            corr = torch.exp(m - m_new)
            if mistake == "tile_softmax":
                p = p / p.sum(-1, keepdim=True)
            l_corr = {"sum": 1.0, "l_plain": 1.0, "last": 0.0, "l_last": 0.0}.get(mistake, corr)
            acc_corr = {"sum": 1.0, "acc_plain": 1.0, "last": 0.0, "acc_last": 0.0}.get(mistake, corr)
            l = l * l_corr + p.sum(-1, keepdim=True)
            acc = acc * acc_corr + p @ v[..., kb * b:(kb + 1) * b, :]
            m = m_new
        out[..., qb * b:(qb + 1) * b, :] = {"division": acc, "mul": acc * l}.get(mistake, acc / l)
    return out


def _zero_filled(q: Tensor, k: Tensor, v: Tensor, layout: Tensor, b: int) -> Tensor:
    """Attention with the skipped tiles' scores set to 0 rather than left out."""
    s = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~_mask(q, k, layout, b), 0.0), -1) @ v.double()


_SPARSE_TABLE = variants(_sparse_tiles, [
    ("tile_max", "one running maximum for all rows", "you took the maximum over the whole tile (amax without "
     "dim=-1), so a row whose scores are far below another row's underflows to 0 / 0", "keep one maximum per query "
     "row: s.amax(dim=-1, keepdim=True)"),
    ("sum", "running sum not rescaled", "when the maximum grows you add to ℓ and acc without multiplying them by "
     "exp(m_old − m_new)", "rescale ℓ and acc by exp(m_old − m_new) before adding the tile"),
    ("division", "final division missing", "you returned the accumulator without dividing by the running sum ℓ",
     "after the last tile, divide: acc / ℓ"),
    ("mul", "multiplied by the running sum instead of dividing", "you returned acc × ℓ instead of acc / ℓ",
     "after the last tile, divide: acc / ℓ"),
    ("last", "only the last tile counted", "ℓ and acc hold only the last kept tile's part: the running maximum is "
     "never updated (m = m_new missing, so m stays −inf and exp(m − m_new) = 0 wipes ℓ and acc at every tile), or ℓ "
     "and acc are overwritten instead of updated", "rescale and add: ℓ = ℓ·exp(m − m_new) + rowsum(p), acc likewise, "
     "then m = m_new"),
    ("l_last", "running sum ℓ overwritten at each tile", "you set ℓ to the tile's rowsum(p) instead of adding it to "
     "the rescaled ℓ, so only the last tile is in the denominator", "ℓ = ℓ·exp(m − m_new) + rowsum(p)"),
    ("acc_last", "accumulator overwritten at each tile", "you set acc to the tile's p @ v instead of adding it to "
     "the rescaled acc, so only the last tile is in the numerator", "acc = acc·exp(m − m_new) + p @ v_tile"),
    ("l_plain", "running sum ℓ not rescaled", "when the maximum grows you rescale acc but add to ℓ without "
     "multiplying it by exp(m_old − m_new)", "ℓ = ℓ·exp(m − m_new) + rowsum(p)"),
    ("acc_plain", "accumulator not rescaled", "when the maximum grows you rescale ℓ but add to acc without "
     "multiplying it by exp(m_old − m_new)", "acc = acc·exp(m − m_new) + p @ v_tile"),
    ("no_max", "maximum not subtracted inside exp", "you computed p = exp(s) instead of exp(s − m_new) while still "
     "rescaling ℓ and acc by exp(m − m_new), so the tiles are weighed inconsistently", "p = torch.exp(s − m_new)"),
    ("tile_softmax", "each tile normalised on its own", "you normalised each tile's probabilities by their own sum",
     "add the unnormalised p @ v_block to acc and divide by ℓ once, at the end"),
]) + [
    Known("block_layout_transposed", "block layout transposed", "you read layout[j, i] (key block, query block) "
          "instead of layout[i, j]: rows of the layout are query blocks, columns key blocks", _VISIT_FIX,
          lambda q, k, v, layout, b: _sdpa(q, k, v, _mask(q, k, layout.T, b))),
    Known("block_layout_inverted", "block layout inverted: the skipped tiles visited", "you visited the key blocks "
          "with layout[i, j] False and skipped those with True: in the layout, True means the tile is kept (computed), "
          "not masked out", _VISIT_FIX, lambda q, k, v, layout, b: _sparse_tiles(q, k, v, ~layout, b, "")),
    Known("layout_ignored_dense_attention", "layout ignored: dense attention", "every query sees every key: the "
          "layout's skipped tiles are not left out", _SPARSE_FIX, lambda q, k, v, layout, b: _sdpa(q, k, v, None)),
    Known("skipped_tiles_kept_with", "skipped tiles kept with weight", "the skipped tiles' scores were set to 0 "
          "instead of being left out, so their keys still get weight exp(0 − m)", "leave the skipped tiles out of "
          "the softmax entirely (or mask them with −inf)", _zero_filled),
    # the scale of the scores: (key, summary, cause, fix, the scale as a function of q)
    *[Known(key, summary, cause, fix, lambda q, k, v, layout, b, scale=scale: _sdpa(
        q, k, v, _mask(q, k, layout, b), scale=scale(q))) for key, summary, cause, fix, scale in [
        ("scores_not_scaled", "scores not scaled", "you did not multiply q kᵀ by 1/√d_k",
         "scale the scores by 1 / math.sqrt(d_k)", lambda q: 1.0),
        ("divided_by_d_k", "divided by d_k instead of √d_k", "you divided the scores by d_k",
         "scale by 1 / math.sqrt(d_k)", lambda q: 1 / q.shape[-1]),
        ("scores_multiplied_by_d", "scores multiplied by √d_k instead of divided", "you multiplied q kᵀ by √d_k (or "
         "divided q by 1/√d_k)", "scale the scores by 1 / math.sqrt(d_k)", lambda q: math.sqrt(q.shape[-1])),
        ("scaled_by_1_n", "scaled by 1/√n_q instead of 1/√d_k", "you took the size of the wrong axis: q.shape[-2] "
         "(the number of queries) instead of q.shape[-1] (d_k)", "scale by 1 / math.sqrt(q.shape[-1])",
         lambda q: 1 / math.sqrt(q.shape[-2]))]],
]


def _sparse_measured(fn: Learner, failure: Failure, out: Tensor, expected: Tensor, case: tuple) -> None:
    """Fail with what the query blocks show; else with the learner's result when each query block keeps its first key
    block only: right there, the tiles are combined wrongly; wrong there, one tile's own work is wrong."""
    q, k, v, layout, b = case
    right = blocks_right(out, expected, b)
    if right is None:
        return
    wrong, kept = [i for i, r in enumerate(right) if not r], [int(t) for t in layout.sum(-1)]
    shown = ", ".join(map(str, wrong[:8]))
    if wrong and len(wrong) < len(right) and all(r == (t == 1) for r, t in zip(right, kept)):
        fail_again(failure, "wrong where a query block keeps several key blocks", f"the query blocks that keep one key "
               f"block are right and those that keep several ({shown}) are wrong: one tile alone is right, so what "
               "goes wrong is " + _COMBINED, _SPARSE_FIX)
    if wrong and len(wrong) < len(right):
        rows = ", ".join(f"{i * b}–{min((i + 1) * b, out.shape[-2]) - 1}" for i in wrong[:6])
        fail_again(failure, f"wrong only in query blocks {shown}", f"query blocks {shown} (rows {rows}) are wrong and the "
               f"other {len(right) - len(wrong)} right: compare what your loop does for those blocks (their key "
               "blocks: " + "; ".join(f"{i}: {layout[i].nonzero().flatten().tolist()}" for i in wrong[:4]) + ")",
               _SPARSE_FIX)
    one = torch.zeros_like(layout)
    one[torch.arange(layout.shape[0]), layout.float().argmax(-1)] = True  # each row's first kept key block
    mine = call_or_skip(lambda: as_tensor(fn(q, k, v, one, b), tried=failure.diagnosis.tried))
    if mine is None or tuple(mine.shape) != tuple(out.shape) or bool((layout.sum(-1) == 1).all()):
        return
    if same(mine, _sdpa(q, k, v, _mask(q, k, one, b)), **tolerance(torch.float32)):
        fail_again(failure, "right with one tile per query block, wrong with several", "with a layout that keeps one key "
               "block per query block your function is right, with several it is not: what goes wrong is "
               + _COMBINED, _SPARSE_FIX)
    fail_again(failure, "wrong even with one tile per query block", "with a layout that keeps one key block per query "
           f"block your result is wrong as well{' (NaN)' if bool(torch.isnan(mine).any()) else ''}: the error is in "
           "what one tile computes (its scores q kᵀ/√d_k, p = exp(s − m), ℓ, acc, or the final acc / ℓ), not only "
           "in how tiles are combined", _SPARSE_FIX)


_COMBINED = ("how the tiles of a query block are combined (the running maximum m, and the rescaling of ℓ and acc "
             "by exp(m_old − m_new))")
_SPARSE_CASES = [  # (label, (batch axes, n_q, n_k, d_k, d_v), block size)
    ("q, k (32, 4), v (32, 3), 4 × 4 tiles of 8", ((), 32, 32, 4, 3), 8),
    ("q, k, v (2, 3, 24, 4) (batch × heads), tiles of 4", ((2, 3), 24, 24, 4, 4), 4),
    ("q (21, 4), k (30, 4), v (30, 2): n not a multiple of the block (tiles of 8)", ((), 21, 30, 4, 2), 8),
    ("q, k (10, 3), v (10, 2), tiles of 1", ((), 10, 10, 3, 2), 1),
    ("q, k (2, 20, 4) with scores in the hundreds and query 0's in the tens of thousands (each row needs its own "
     "maximum), v (2, 20, 3), tiles of 4", ((2,), 20, 20, 4, 3), 4),
    ("q, k (2, 16, 8), v (2, 16, 4) in float32, tiles of 4", ((2,), 16, 16, 8, 4), 4),
    ("q, k (12, 4) with every score near −1000 (a running maximum must start at −∞, not 0), v (12, 2), tiles of 4",
     ((), 12, 12, 4, 2), 4),
]


def _layout(rows: int, cols: int, seed: int) -> Tensor:
    """A random, asymmetric layout with at least one tile per row and per column (the diagonal for square ones): a
    loop that reads the layout as square, or stops early, misses a kept tile."""
    layout = torch.rand(rows, cols, generator=torch.Generator().manual_seed(seed)) < 0.35
    layout[torch.arange(rows), torch.arange(rows) % cols] = True
    layout[torch.arange(cols) % rows, torch.arange(cols)] = True
    return layout


_EXPECTS = "a function block_sparse_attention(q, k, v, layout, block_size) returning a tensor (..., n_q, d_v)"


def _call(fn: Learner, case: tuple) -> object:
    """``fn(*case)``; an IndexError that indexing the layout's query-block axis with the last key block's number
    reproduces (or the other way round, with more query blocks) is named: the layout read the other way round."""
    try:
        return fn(*case)
    except LearnerRaised as exc:
        layout = case[3]
        n_qb, n_kb = layout.shape
        attempt = (lambda: layout[n_kb - 1]) if n_qb < n_kb else (lambda: layout[:, n_qb - 1])
        if n_qb == n_kb or exc.type_name != "IndexError" or reproduce(attempt) != exc.message:
            raise
        axis, other = ("query", "key") if n_qb < n_kb else ("key", "query")
        d = learner_error(exc, expected=_EXPECTS)
        raise Failure(replace(d, summary="block layout read the other way round", cause=(
            f"the layout here is ({n_qb}, {n_kb}): a row per block of queries (⌈n_q / block_size⌉ = {n_qb}), a column per "
            f"block of keys (⌈n_k / block_size⌉ = {n_kb}), and your code indexed its {axis}-block axis with a {other}-block number "
            f"({max(n_qb, n_kb) - 1}): layout[j, i] for layout[i, j], or a loop over the {axis} blocks that runs to "
            f"the number of {other} blocks"), fix="rows are query blocks, columns key blocks: for i in "
            "range(layout.shape[0]), visit the key blocks j with layout[i, j] True: layout[i].nonzero()")) from None


@check("block_sparse_attention", expects=_EXPECTS)
def check_block_sparse_attention(fn: Learner) -> str:
    suspects = Suspects(_SPARSE_TABLE)
    for i, (label, (lead, n_q, n_k, d_k, d_v), b) in enumerate(_SPARSE_CASES):
        big = "hundreds" in label
        q, k, v = qkv(lead, n_q, n_k, d_k, d_v, 500 + i, scale=12.0 if big else 1.0, dtype=dtype_of(label))
        if big:
            q[..., 0, :] *= 100.0
        if "−1000" in label:  # q·k/√d_k ≈ −40 · 50 / 2 for every pair: exp(s − 0) underflows to 0
            q[..., 0], k[..., 0] = -40.0, k[..., 0] + 50.0
        layout = _layout(-(-n_q // b), -(-n_k // b), 510 + i)
        case, tried = (q, k, v, layout, b), f"block_sparse_attention(q, k, v, layout, {b}) on {label}"
        out, expected = as_tensor(_call(fn, case), tried=tried), _sdpa(q, k, v, _mask(q, k, layout, b))
        expect_close_at_dtype(suspects, out, expected, case, tried=tried, again=fn, fix=_SPARSE_FIX,
                              oracle="F.scaled_dot_product_attention with the layout's mask",
                              factors={"√d_k": math.sqrt(d_k), "block_size": float(b)},
                              measured=lambda failure: _sparse_measured(fn, failure, out, expected, case),
                              normaliser="the running sum ℓ")
    expect_unchanged(fn, (*qkv((), 12, 12, 3, 2, 530), _layout(3, 3, 531), 4), call="block_sparse_attention(q, k, v, "
                     "layout, 4)", name="q", others=("k", "v"), shown="q, k (12, 3), v (12, 2), float64")
    n, d_k, d_v, b = 48, 6, 2, 8
    layout = _layout(n // b, n // b, 521)
    tried = f"block_sparse_attention(q, k, v, layout, {b}) on q, k ({n}, {d_k}), v ({n}, {d_v}), counting its work"
    seen = fn.observe("beyond.work", *qkv((), n, n, d_k, d_v, 520), layout, b)
    needed, dense, flops = 2.0 * b * b * (d_k + d_v) * int(layout.sum()), 2.0 * n * n * (d_k + d_v), seen["flops"]
    kept = f"the {int(layout.sum())} tiles of {layout.numel()} the layout keeps"
    if fused := [op for op in seen["ops"] if "scaled_dot_product" in op or "multi_head_attention" in op]:
        fail("skipped blocks still computed: a fused attention call", tried=tried,
             got=f"a call to {fused[0]} (with the layout as a mask, presumably)",
             expected=f"only {kept}, computed by your loop",
             cause="the values are right, but the fused kernel computes every tile of the score matrix and masks "
                   "the skipped ones afterwards: the work is dense",
             fix="loop over layout[i].nonzero() for each query block i and compute only those tiles with @")
    full = squares(seen, n)
    # a ones column appended to v (ℓ kept as acc's last column) is one more value column: allowed
    if flops > 2.0 * b * b * (d_k + d_v + 1) * int(layout.sum()) * 1.05 or full:
        fail("skipped blocks still computed", tried=tried,
             got=f"{flops:.0f} matrix-multiply FLOPs ({flops / dense:.0%} of dense attention's)"
                 + (f" and a tensor of shape {full[0]}" if full else ""),
             expected=f"at most {needed:.0f} FLOPs: {kept} ({needed / dense:.0%} of dense)",
             cause="the values are right, but your code also computes the tiles the layout leaves out (a full "
                   "score matrix masked afterwards, or every tile visited and then dropped): the work is dense",
             fix="loop over layout[i].nonzero() for each query block i and compute only those tiles")
    return (f"matches F.scaled_dot_product_attention with the layout's mask on {len(_SPARSE_CASES)} cases and "
            "computes only the tiles the layout keeps")

"""The check of the tiled sliding_window_attention: its cases, its known mistakes (reproduced by a tiled loop),
where a wrong answer goes wrong, and the work it does (tiles of block_size, only the blocks inside the window)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch

from ..boundary import probe
from ..compare import Failure, call_or_skip, fmt, same
from ..core import Learner, LearnerRaised, LearnerTimedOut, as_tensor, check, fail
from ..kit import Known, Suspects, call_explained, expect_float64_precision, expect_unchanged, watch
from ..result import Diagnosis
from .oracle import LOOSE, PATTERNS, attn, dtype_name, rows, sdpa, tolerance, window


def _window_qkv(lead, n, d, seed, dtype=torch.float64):
    """q, k, v whose scores rise along the sequence for some rows and fall for others: every rescaling matters."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, n, d, generator=g, dtype=torch.float64) + 1.0
    trend = torch.linspace(-2.5, 2.5, n, dtype=torch.float64)[:, None]
    k = torch.randn(*lead, n, d, generator=g, dtype=torch.float64)
    k[..., : n // 2, :] -= trend[: n // 2]  # falling, then rising
    k[..., n // 2:, :] += trend[n // 2:]
    return q.to(dtype), k.to(dtype), torch.randn(*lead, n, d + 1, generator=g, dtype=torch.float64).to(dtype)


def _tiled(q, k, v, w, b, mistake: str = "", skip: bool = False) -> torch.Tensor:
    """A tiled sliding-window loop (float64) with one classic mistake switched on; ``skip``: each query block's key
    loop starts at the window's first block (not block 0)."""
    q, k, v = q.double(), k.double(), v.double()
    n = q.shape[-2]
    scale = {"no_scale": 1.0, "scale_d": 1 / q.shape[-1]}.get(mistake, 1 / math.sqrt(q.shape[-1]))
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    for qs in range(0, n, b):
        qe = min(qs + b, n)
        m = torch.full(q[..., qs:qe, :1].shape, 0.0 if mistake == "zero_init" else -math.inf, dtype=torch.float64)
        l, acc = torch.zeros_like(m), torch.zeros(q.shape[:-2] + (qe - qs, v.shape[-1]), dtype=torch.float64)
        first = max(0, qs - w + 1) // b * b if skip else 0
        if mistake == "ceil_start":  # the first block rounded up: keys of the window in it are never seen
            first = -(-max(0, qs - w + 1) // b) * b
        for ks in range(first, n - n % b if mistake == "k_tail" else qe, b):
            ke = min(ks + b, n)
            s = q[..., qs:qe, :] @ k[..., ks:ke, :].transpose(-2, -1) * scale
            rows, cols = torch.arange(qs, qe)[:, None], torch.arange(ks, ke)[None, :]
            if mistake == "local":
                rows, cols = rows - qs, cols - ks
            blocked = {"causal_only": cols > rows, "band_only": cols <= rows - w, "no_self_tiles": (cols >= rows) | (
                cols <= rows - w)}.get(mistake, (cols > rows) | (cols <= rows - w))
            s = s.masked_fill(blocked, -math.inf)
            m_new = {"global_max": torch.maximum(m.amax(), s.amax()).expand_as(m),  # one maximum for every row
                     "block_max": s.amax(-1, keepdim=True)}.get(mistake, torch.maximum(m, s.amax(-1, keepdim=True)))
            finite = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            shift = m_new if mistake == "unguarded" else finite
            alpha, p = torch.exp(m - shift), torch.exp(s - shift)
            l = {"sum": l, "neither": l, "sum_block": 0}.get(mistake, l * alpha) + p.sum(-1, keepdim=True)
            acc = (acc if mistake in ("acc", "neither") else acc * alpha) + p @ v[..., ks:ke, :]
            m = m_new
        out[..., qs:qe, :] = acc if mistake == "division" else acc / l
    return out


_BAND = "keep key j for query i iff i − window < j ≤ i"
_MEMO: dict[tuple, tuple] = {}  # (id(q), mistake, skip) → (q, output): the engine asks for one more than once


def _loop(key: str, summary: str, cause: str, fix: str, skips=(False,)) -> list[Known]:
    """Mistake ``key`` of :func:`_tiled`, in a loop that visits every key block and/or one that skips those outside."""

    def make(q, k, v, w, b, skip):
        if (memo := (id(q), key, skip)) not in _MEMO:  # the stored q keeps its id from being reused
            _MEMO[memo] = (q, _tiled(q, k, v, w, b, key, skip))
        return _MEMO[memo][1]

    return [Known(f"{key}{'_skip' if skip else ''}", summary, cause, fix, lambda *case, skip=skip: make(*case, skip))
            for skip in skips]


BOTH, SKIP = (True, False), (True,)
_RESCALE = "before adding the block, rescale by exp(m_old − m_new)"
_WITHIN = "mask key j for query i unless i − window < j ≤ i, in every tile"
#: A case of sliding_window_attention: (q, k, v, window, block_size). First the mistakes of the mask, reproduced by
#: attention under a wrong band (:func:`~.oracle.window`), then those of the tiled loop.
WINDOW_ATTENTION = [Known(key, summary, cause, fix, lambda q, k, v, w, b, band=band: attn(
    q, k, v, mask=window(q.shape[-2], q.shape[-2], w, **band))) for key, summary, cause, fix, band in [
    ("wide", "window off by one: one key too many", "each query sees window + 1 keys (key ≥ query − window)", _BAND,
     dict(lo=-1)),
    ("narrow", "window off by one: one key too few", "each query sees window − 1 keys", _BAND, dict(lo=1)),
    ("ignored", "window ignored", "the output is plain causal attention: every earlier key is visible",
     "mask keys j ≤ i − window too, and skip the blocks that hold only such keys", dict(lo=-math.inf)),
    ("acausal", "window not causal", "your queries also see up to `window` keys in the future",
     "mask keys after the query (j > i) as well", dict(causal=False)),
    ("not_causal", "not causal", "every query sees every key", "mask keys j > i and j ≤ i − window",
     dict(lo=-math.inf, causal=False)),
    ("no_self", "the query does not see itself", "your band stops one key before the query", _BAND, dict(hi=-1)),
    ("shifted", "the query does not see itself", "your band is shifted one key into the past (keys i − window … i − 1)",
     _BAND, dict(lo=-1, hi=-1)),
]] + [known for key, summary, cause, fix, skips in [
    ("no_self_tiles", "the query does not see itself", "your tiles mask key j = i too (j ≥ i, not j > i): query 0 "
     "sees no key (0 / 0 = NaN), the others miss their own", _BAND, SKIP),
    ("local", "mask built from positions inside the tile", "you compared row and column numbers inside each tile, "
     "not the positions q_start + r and k_start + c", "rows = torch.arange(q_start, q_end), cols = "
     "torch.arange(k_start, k_end)", BOTH),
    ("sum", "running sum not rescaled", "when the maximum grows you add to l without rescaling it",
     _RESCALE + " (l and acc)", ()),
    ("acc", "accumulator not rescaled", "when the maximum grows you add to acc without rescaling it",
     _RESCALE + " (acc as l)", ()),
    ("neither", "neither l nor acc rescaled", "when the maximum grows neither l nor acc is rescaled",
     _RESCALE + " (both)", ()),
    ("division", "no final division", "the output is the unnormalised accumulator",
     "divide acc by l once, after the last key block", ()),
    ("k_tail", "last key block dropped", "the last, shorter key block is never visited when n is not a multiple of "
     "the block", "loop with range(start, q_end, block_size): slicing stops at the end", BOTH),
    ("global_max", "one running maximum for all rows", "you took the maximum over the whole tile (amax without "
     "dim=-1): a row far below another underflows to 0 / 0", "one maximum per row: scores.amax(dim=-1, "
     "keepdim=True)", BOTH),
    ("zero_init", "running maximum started at 0", "with every score of a row far below 0, exp(s − 0) underflows and "
     "the row becomes 0 / 0", "start it at −inf: torch.full(..., -math.inf)", BOTH),
    ("block_max", "the block's maximum instead of the running maximum", "when a block's scores fall far below an "
     "earlier block's, exp(m_old − m_block) overflows", "m_new = torch.maximum(m_old, block maximum)", BOTH),
    ("unguarded", "NaN where a row sees no key of a whole tile", "when a tile holds none of a row's keys, its "
     "running maximum is still −inf and exp(−inf − (−inf)) = NaN", "shift by 0 where the new maximum is −inf: "
     "torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)", BOTH),
    ("ceil_start", "a key block inside the window skipped", "your key loop starts one block too late (rounded up, "
     "not down): the keys at the window's start are never seen", "start at max(0, q_start − window + 1) // "
     "block_size * block_size", ()),
    ("causal_only", "window not applied inside the tiles", "you skipped the blocks outside the window but masked "
     "only future keys: a visited block's keys before the window count", _WITHIN, SKIP),
    ("band_only", "keys after the query not masked", "your tiles mask the keys before the window but not those "
     "after the query (j > i)", _WITHIN, SKIP),
    ("sum_block", "running sum restarted in every block", "you set l to the block's own sum instead of adding it to "
     "the rescaled running sum", "l = l·exp(m_old − m_new) + block sum", SKIP),
    ("no_scale", "scores not scaled", "you did not multiply q kᵀ by 1/√d_k", "scale the scores by 1 / "
     "math.sqrt(d_k)", ()),
    ("scale_d", "divided by d_k instead of √d_k", "you divided the scores by d_k", "scale by 1 / math.sqrt(d_k)", ()),
] for known in _loop(key, summary, cause, fix, skips or (False,))]

_ATTN_CASES = [
    ("q, k (10, 4), v (10, 5), window 3, block 4", ((), 10, 4), 3, 4),
    ("q, k (2, 3, 37, 8), window 8, block 16", ((2, 3), 37, 8), 8, 16),
    ("q, k (2, 40, 8), window 20 (not a multiple of the block), block 8", ((2,), 40, 8), 20, 8),
    ("q, k (12, 4), window 1 (each query sees only itself), block 4", ((), 12, 4), 1, 4),
    ("q, k (9, 4), window 20 (longer than the sequence), block 4", ((), 9, 4), 20, 4),
    ("q, k (8, 4), window 3, block 1", ((), 8, 4), 3, 1),
    ("q, k (1, 1, 4): a single token, window 2, block 4", ((1,), 1, 4), 2, 4),
    ("q, k (2, 9, 4) whose rows' scores differ by more than 10³ (each row needs its own maximum), window 4, "
     "block 4", ((2,), 9, 4), 4, 4),
    ("q, k (2, 24, 8) float32, window 5, block 8", ((2,), 24, 8), 5, 8),
    ("q, k (2, 10, 4) with every score below −1000, window 5, block 2", ((2,), 10, 4), 5, 2),
    ("q, k (10, 4) whose scores fall by hundreds from one key to the next, window 6, block 2", ((), 10, 4), 6, 2),
]


def _attn_case(i: int) -> tuple[str, tuple]:
    label, (lead, n, d), w, b = _ATTN_CASES[i]
    q, k, v = _window_qkv(lead, n, d, 50 + i, torch.float32 if "float32" in label else torch.float64)
    if "differ by more" in label:
        q[..., 0, :] *= 1000.0  # row 0's scores are in the thousands, the others near 1
    if "below −1000" in label:
        q, k = q.abs() + 0.5, k - 600.0  # q·k/√d_k ≈ −600·Σ q_i / 2 for every query and key
    if "fall by hundreds" in label:
        q = q.abs() + 1.0
        k = torch.linspace(1600, -5600, n, dtype=torch.float64)[:, None] / q.sum(-1).mean() * 2 + 0.1 * k
    return label, (q, k, v, w, b)


_WINDOW_LOOP = (_BAND + "; visit the key blocks from the one holding key max(0, q_start − window + 1) to q_end; "
                "rescale l and acc by exp(m_old − m_new) at every block")


def _right_on(fn: Learner, args: tuple, expected: torch.Tensor, tol: dict, rows: slice = slice(None)) -> bool:
    """Whether the learner's function gives ``expected`` on ``args`` (in the query rows ``rows``); raising is wrong."""
    try:
        return same(as_tensor(fn(*args), tried="", what="")[..., rows, :], expected[..., rows, :], **tol)
    except (Failure, LearnerRaised, LearnerTimedOut, IndexError):  # IndexError: an answer with too few axes
        return False


def _stale_rows(fn: Learner, case: tuple, out: torch.Tensor, expected: torch.Tensor, tol: dict, tried: str):
    """(bad, zero, stale) per query row of ``out`` = fn(*case): wrong; 0 where the answer is not; neither doubled when
    v is doubled nor affine in v (with q and k fixed, every computed row is affine in v, right or wrong, a term without
    v included: memory never written is neither doubled with v nor on the line through the outputs for v, 2v, 3v)."""
    q, k, v, w, b = case
    n = q.shape[-2]
    a = out.double()
    per_row = lambda t: t.movedim(-2, 0).reshape(n, -1)  # noqa: E731 - one row per query position
    bad = (~per_row(torch.isclose(a, expected.double(), equal_nan=True, **tol))).any(1)
    zero = (per_row(a).abs() < 1e-30).all(1) & (per_row(expected.double()).abs() > 1e-12).any(1)
    doubled, tripled = (call_or_skip(lambda c=c: as_tensor(fn(q, k, c * v, w, b), tried=tried)) for c in (2, 3))
    stale = torch.zeros_like(zero)
    if doubled is not None and tripled is not None and doubled.shape == tripled.shape == out.shape:
        d2, d3 = doubled.double(), tripled.double()
        stale = ~per_row(torch.isclose(d2, 2 * a, equal_nan=True, **tol)).all(1) & \
            ~per_row(torch.isclose(d3 - d2, d2 - a, equal_nan=True, **tol)).all(1)
    return bad, zero, stale


def _unwritten(fn: Learner, out: torch.Tensor, expected: torch.Tensor, case: tuple, tol: dict, tried: str) -> None:
    """Fail when the wrong rows were never written (as notebook 09 says it): some rows right, and each wrong one 0
    where the answer is not, or neither doubled when v is doubled nor affine in v, as every computed row is. Which
    rows a loop never writes depends on n, window and block_size only: the same rows must be wrong in that way on
    plain inputs of the same shapes too (scores near 0), or the rows are 0 for another reason (an exponential that
    overflowed, then torch.nan_to_num)."""
    q, k, v, w, b = case
    bad, zero, stale = _stale_rows(fn, case, out, expected, tol, tried)
    if not bad.any() or bad.all() or (bad & ~zero & ~stale).any():
        return
    g = torch.Generator().manual_seed(97)
    plain = tuple((torch.randn(x.shape, generator=g, dtype=torch.float64) * s).to(x.dtype)
                  for x, s in ((q, 0.3), (k, 0.3), (v, 1.0))) + (w, b)
    again = call_or_skip(lambda: as_tensor(fn(*plain), tried=tried))
    if again is None or again.shape != out.shape:
        return
    bad2, zero2, stale2 = _stale_rows(fn, plain, again, sdpa(*plain[:3], mask=window(q.shape[-2], q.shape[-2], w)),
                                      tol, tried)
    if not torch.equal(bad2, bad) or (bad2 & ~zero2 & ~stale2).any():
        return
    shown = [int(i) for i in bad.nonzero()]
    listed = ", ".join(map(str, shown[:6])) + ("…" if len(shown) > 6 else "")
    fail(f"output rows never written ({listed})", tried=tried,
         got=f"rows {listed} of your output " + ("are 0 (what torch.zeros or a fresh torch.empty holds)"
             if bool(zero[bad].all()) else "are 0 or change with v in no way a computed row does "
             "(torch.empty leaves whatever the memory held)") + "; the other rows are right",
         expected="every row computed", cause="your query loop never writes these rows",
         fix="visit every query block: for q_start in range(0, n, block_size), with out[..., q_start:q_start + "
             "block_size, :] written at the end of each")


def _same_along(a: torch.Tensor, e: torch.Tensor, tol: dict) -> bool:
    """Whether ``a`` holds the same values at every index of some axis along which ``e`` does not."""
    for axis in range(a.ndim):
        sa, se = a.movedim(axis, 0), e.movedim(axis, 0)
        if sa.shape[0] > 1 and all(same(x, sa[0], **tol) for x in sa[1:]) and \
                not all(same(x, se[0], **tol) for x in se[1:]):
            return True
    return False


def _axis_claim(summary: str) -> bool:
    """Whether a measured summary says the result is the same at every index of an axis (compare's _repeated)."""
    return summary.startswith(("the same values for every", "the mean over", "the sum over")) or \
        " repeated for every " in summary


def _drops_an_axis(fn: Learner, out, expected, case: tuple, tol: dict, tried: str) -> bool:
    """Whether the measurement's "the same values for every index of an axis" (or one index's values, or their mean,
    repeated) stands: it must hold on plain inputs of the same shapes too (scores near 0), since a result that is 0
    everywhere (an overflow, then torch.nan_to_num) is the same along every axis without dropping one."""
    if not _same_along(out.double(), expected.double(), tol):
        return True
    q, k, v, w, b = case
    g = torch.Generator().manual_seed(98)
    plain = tuple((torch.randn(x.shape, generator=g, dtype=torch.float64) * s).to(x.dtype)
                  for x, s in ((q, 0.3), (k, 0.3), (v, 1.0))) + (w, b)
    again = call_or_skip(lambda: as_tensor(fn(*plain), tried=tried))
    right = sdpa(*plain[:3], mask=window(q.shape[-2], q.shape[-2], w))
    return again is not None and again.shape == right.shape and _same_along(again.double(), right.double(), tol)


def _measured(out: torch.Tensor, expected: torch.Tensor, tol: dict):
    """The plain measurement of a wrong result of the right shape: which entries differ, no cause."""
    a, e = out.detach().double(), expected.detach().double()
    wrong = ~torch.isclose(a, e, equal_nan=True, **tol)
    diff = torch.where(wrong, (a - e).abs().nan_to_num(math.inf), torch.zeros_like(a))
    worst = tuple(int(i) for i in (diff == diff.max()).nonzero()[0])
    return Diagnosis(summary="wrong values", got=f"{int(wrong.sum())} of {a.numel()} entries differ; largest "
                     f"difference at index {worst}: got {fmt(float(a[worst]))}, expected {fmt(float(e[worst]))}",
                     expected="the correct values (from the check's reference computation)", cause="", fix="")


def _window_cause(fn: Learner, out: torch.Tensor, case: tuple, tol: dict) -> tuple[str, str, str]:
    """(summary or "", cause, fix) of a wrong answer no known mistake reproduces: only the last, shorter query block
    wrong; which keys a wrong row attended to; or the simplest setting where the function is already wrong."""
    q, k, v, w, b = case
    n = q.shape[-2]
    expected = sdpa(q, k, v, window(n, n, w))
    close = torch.isclose(out.double(), expected, equal_nan=True, **tol).all(-1)
    close = close.reshape(-1, n).all(0)  # (n,): which query rows are right in every batch entry
    m = n - b  # rows right in a full query block: wrong as the last, shorter block of the first m tokens too?
    first_m = (q[..., :m, :], k[..., :m, :], v[..., :m, :], w, b)
    if n % b and n > 2 * b and bool(close[:n - n % b].all()) and not _right_on(
            fn, first_m, expected[..., :m, :], tol, slice(m - m % b, None)):
        return (f"wrong only in the last, shorter query block (rows {n - n % b} … {n - 1})", f"n = {n} is not a "
                f"multiple of block_size = {b}, and your loop mishandles the last {rows(n % b)} (a range that stops "
                "before them, or a block length taken as block_size)", "loop with range(0, n, block_size); the last "
                "slice is shorter: use its own length for the accumulators")
    i = int((~close).nonzero()[0])  # a row is wrong: the check calls this only once `same` said so, at this tolerance
    for lo in range(i + 1):  # the keys lo … hi this row attended to, if a contiguous run explains it
        for hi in range(lo, n):
            seen = attn(q[..., i:i + 1, :], k[..., lo:hi + 1, :], v[..., lo:hi + 1, :])[..., 0, :]
            if same(out[..., i, :], seen, **tol):
                return "", (f"query {i}'s output is attention over keys {lo} … {hi}, where it may see keys "
                            f"{max(0, i - w + 1)} … {i} (window {w}, blocks of {b}): check the mask, the key blocks "
                            "visited, and weights that underflow to 0"), _BAND
    settings = [(n, n, "one tile and no window (block_size = window = n: plain causal attention)", "the steps every "
                 "tile takes are wrong (scores, mask, exponentials, sums or the final division)"),
                (w, n, f"one tile with window {w} (block_size = n)", "what depends on the window is wrong (the band's "
                 "lower edge j > i − window, or which key blocks you visit)"),
                (n, b, f"blocks of {b} and no window (window = n)", "what changes with several blocks is wrong (the "
                 "block loops, the running maximum, the rescaling by exp(m_old − m_new), or the running sums)")]
    right = []
    for ww, bb, text, where in settings:
        if not _right_on(fn, (q, k, v, ww, bb), sdpa(q, k, v, window(n, n, ww)), tol):
            verdict = f"right on {' and on '.join(right)}, but wrong on" if right else "wrong even on"
            return "", f"your function is {verdict} {text}: so {where}", _WINDOW_LOOP
        right.append(text)
    return "", (f"your function is right on {', on '.join(right)}, and wrong only where tiles and the window meet: "
                "which key blocks each query block visits, or the mask in the tiles the band's edge cuts"), _WINDOW_LOOP


def _needed_tiles(n: int, b: int, w: int) -> int:
    """Tiles (query block × key block) holding at least one key some query of the block may see."""
    from ...inference import visited_key_blocks

    return sum(len(visited_key_blocks(qs, min(qs + b, n), w, b)) for qs in range(0, n, b))


@probe("inference.work")
def _work(fn, *args) -> dict[str, Any]:
    """Learner-side: ``fn(*args)``'s matmul FLOPs, torch functions called, float tensor shapes, products per shape."""
    seen = watch(fn, *args)
    return {key: seen[key] for key in ("flops", "ops", "shapes", "products")}


#: (n, d_k, block, window, batch) of the work measurements. The window's first key falls one past a block boundary
#: in the first, on one in the second (a loop starting a block early shows); the block sizes differ from each other,
#: d_k, d_v and 64 (so do tiles of a fixed size).
_WORK_CASES = [(80, 6, 8, 8, 2), (80, 6, 4, 9, 2)]


def _check_work(fn: Learner) -> None:
    measured = []  # per work case: (n, d, b, w, batch), tried, the probe's report, side s → (…, s, s) products
    for j, (n, d, b, w, batch) in enumerate(_WORK_CASES):
        tried = f"sliding_window_attention(q, k, v, window={w}, block_size={b}) on q, k ({batch}, {n}, {d})"
        work = fn.observe("inference.work", *_window_qkv((batch,), n, d, 70 + j), w, b)
        if any("scaled_dot_product" in op or "flash_attention" in op for op in work["ops"]):
            fail("calls F.scaled_dot_product_attention", tried=tried, got="a call to a fused attention kernel",
                 expected="the tiled loop, written out", cause="the values are right, but the exercise is the loop",
                 fix="compute each tile's scores with q_block @ k_blockᵀ; keep the running max, sum and accumulator")
        if full := [tuple(s) for s in work["shapes"] if tuple(s[-2:]) == (n, n)]:
            fail("built the full n × n score matrix", tried=tried, got=f"a floating-point tensor of shape {full[0]}",
                 expected="no tensor larger than a (block, block) tile of scores",
                 cause="the values are right, but the memory is O(n²): that is what tiling avoids",
                 fix="compute scores one (block, block) tile at a time")
        square = Counter()
        for shape, count in work["products"]:
            if len(shape) >= 2 and shape[-1] == shape[-2] >= 2:
                square[shape[-1]] += int(count)
        measured.append(((n, d, b, w, batch), tried, work, square))
    for (n, d, b, w, batch), tried, work, square in measured:
        full_tiles = _needed_tiles(n - n % b, b, w)  # tiles of the full query blocks: every one is (b, b)
        if square[b] < full_tiles / 2:
            if common := sorted(set.intersection(*(set(m[3]) for m in measured)) - {c[2] for c in _WORK_CASES}):
                cause = (f"your tiles are {common[-1]} × {common[-1]} whatever block_size is passed "
                         f"(block_size = {', '.join(str(c[2]) for c in _WORK_CASES)} here): block_size is ignored")
                fix = "cut the queries and keys into blocks of block_size (the argument), not of a fixed size"
            else:
                cause = (f"your code computed {square[b]} ({b}, {b}) products where the window needs "
                         f"{full_tiles} tiles: the scores come in pieces of another shape (row by row, or one slab of "
                         "keys per query block)")
                fix = "loop over query blocks and, inside, key blocks: each tile is q_block @ k_blockᵀ"
            fail("scores not computed in (block_size, block_size) tiles", tried=tried,
                 got=f"{square[b]} matrix products of shape (…, {b}, {b})",
                 expected=f"score tiles of shape (…, {b}, {b}) (shorter only at the end of the sequence)",
                 cause=cause, fix=fix)
    for (n, d, b, w, batch), tried, work, _ in measured:
        per_tile = batch * (2.0 * b * b * d + 2.0 * b * b * (d + 1))  # q·kᵀ and p·v of one full tile
        needed, flops = per_tile * _needed_tiles(n, b, w), float(work["flops"])
        if flops > needed + 0.5:
            fail("blocks outside the window are computed", tried=tried,
                 got=f"{flops:.0f} matrix-multiply FLOPs ({flops / per_tile:.1f} tiles' worth)",
                 expected=f"at most {needed:.0f} ({needed / per_tile:.0f} tiles: for each query block, only the key "
                          f"blocks that hold keys q_start − window + 1 … q_end − 1)",
                 cause="the values are right, but your loop also computes key blocks wholly before the window (or "
                       "after the diagonal), which the mask then erases",
                 fix="start the key loop at the block holding key max(0, q_start − window + 1) and stop it at q_end")


@check("sliding_window_attention",
       expects="a function sliding_window_attention(q, k, v, window, block_size) returning a tensor (..., n, d_v)")
def check_sliding_window_attention(fn: Learner) -> str:
    suspects = Suspects(WINDOW_ATTENTION, **LOOSE)
    _MEMO.clear()
    for i in range(len(_ATTN_CASES)):
        label, case = _attn_case(i)
        (q, k, v, w, b), n = case, case[0].shape[-2]
        tried, tol = f"sliding_window_attention(q, k, v, window={w}, block_size={b}) on {label}", tolerance(q.dtype)
        out = as_tensor(call_explained(fn, *case, tried=tried, expected="a tensor (..., n, d_v)", patterns=PATTERNS),
                        tried=tried)
        expected = sdpa(q, k, v, mask=window(n, n, w))
        if tuple(out.shape) == tuple(q.shape) and q.shape[-1] != v.shape[-1]:
            fail("output as wide as q, not v", tried=tried, got=f"shape {tuple(out.shape)}",
                 expected=f"shape {tuple(expected.shape)}", cause="you sized the output or the accumulator with d_k",
                 fix="use v.shape[-1] (d_v) for the output and the accumulator")
        if tuple(out.shape) == tuple(expected.shape) and not same(out, expected, **tol):
            suspects.confirm(fn, out, case, expected,
                             [case if j == i else _attn_case(j)[1] for j in range(len(_ATTN_CASES))],
                             lambda q, k, v, w, b: sdpa(q, k, v, mask=window(q.shape[-2], q.shape[-2], w)), LOOSE)
        try:
            suspects.expect(out, expected, case, tried=tried, **tol, again=fn)
        except Failure as failure:
            d = failure.diagnosis
            if _axis_claim(d.summary) and tuple(out.shape) == tuple(expected.shape) and not _drops_an_axis(
                    fn, out, expected, case, tol, tried):
                d = _measured(out, expected, tol)  # "the same values along an axis" only by chance: not named
            elif d.cause or tuple(out.shape) != tuple(expected.shape):
                raise
            summary, cause, fix = _window_cause(fn, out, case, tol)
            if not summary:  # the last, shorter query block is named first, as notebook 09 does
                _unwritten(fn, out, expected, case, tol, tried)
            fail(summary or d.summary, tried=tried, got=d.got, expected=d.expected, cause=cause, fix=fix)
        if out.dtype != q.dtype:
            fail(f"result in {dtype_name(out.dtype)}, not q's {dtype_name(q.dtype)}", tried=tried,
                 got=dtype_name(out.dtype), expected=dtype_name(q.dtype),
                 cause="you created the output (or the accumulator) without dtype=q.dtype",
                 fix="allocate with dtype=q.dtype (or torch.zeros_like from q's tensors)")
        # "a tensor of q's dtype", read as in 09 and in KVCache: at q's precision, not float32's inside a float64 one
        expect_float64_precision(out, expected, tried=tried, what="your result")
    _MEMO.clear()
    expect_unchanged(fn, (*_window_qkv((), 10, 4, 90), 3, 4), call="sliding_window_attention(q, k, v, window=3, "
                     "block_size=4)", name="q", others=("k", "v"), shown="q, k (10, 4), v (10, 5), float64")
    _check_work(fn)
    return (f"matches F.scaled_dot_product_attention with the window mask on {len(_ATTN_CASES)} cases and computes "
            "only the key blocks inside the window")

"""How a right answer is computed, measured by the probe ``fast.trace``: no torch.softmax or fused attention, every
max and sum over one block, read once; no tensor larger than a tile, nor every tile kept alive; one pass of work."""

from __future__ import annotations

import math
from typing import Any, Callable

from ..boundary import probe
from ..core import Learner, fail, fmt
from ..kit import Watch
from .cases import qkv, rows
from .mistakes import DIAG_FIX
from .steps import blocks


# ============================================================================ how it is computed: a probe
_SOFTMAX_FUNCTIONS = {"softmax", "log_softmax", "_softmax", "_log_softmax", "_safe_softmax"}
_FUSED_FUNCTIONS = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                    "_scaled_dot_product_attention_math", "multi_head_attention_forward"}
#: The online update every one-pass fix spells out.
_FOLD = "m_new = max(m, block max); l = l · exp(m − m_new) + Σ exp(block − m_new); m = m_new"


@probe("fast.trace")
def trace(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """``fn(*args)`` under the kit's :class:`~..kit.Watch` (the first argument is the source whose ``reads`` it
    follows): its report, plain data (ops, largest tensor, bytes held at once, reductions, FLOPs)."""
    watcher = Watch(source=args[0] if args else None, inputs=args)
    with watcher:
        fn(*args)
    return watcher.report()


def _reduction_rule(sizes: list[int], b: int, n: int, tried: str, *, unit: str, reads: str) -> None:
    """Every max and sum covers one block: some cover exactly ``b`` numbers, none more (n ≥ 8·b here)."""
    if not sizes:
        return  # no torch reductions at all (plain Python numbers): nothing to judge by
    shown, top = ", ".join(map(str, sizes)), max(sizes)
    whole = " (the whole row)" if top >= n else ""
    if b not in sizes:
        fail("block_size not used", tried=tried, got=f"your maxima and sums combine {shown} numbers at a time{whole}, "
             f"never block_size = {b}", expected=f"blocks of block_size = {b} {unit}s",
             cause=f"your loop reads a fixed number of {unit}s, whatever block_size says",
             fix=f"slice each block with block_size: {reads}")
    if top > b:
        fail(f"max or sum over {'the whole row' if whole else f'{top} {unit}s'} as well as blocks", tried=tried,
             got=f"your maxima and sums combine {shown} numbers at a time: blocks of {b}, but also {top}{whole}",
             expected=f"every max and sum over one block of block_size = {b} {unit}s",
             cause="besides the blocks, you reduce over more at once (a maximum found before the loop, or a "
                   "normalisation after it): that is a second pass, where the algorithm makes one",
             fix="inside the loop, reduce only the current block and fold it into the running m and l; after the "
                 "loop, divide by l")


def _held_rule(seen: dict[str, Any], lead: int, n: int, d: int, b: int, itemsize: int, tried: str) -> None:
    """Memory held at once below a quarter of the full score matrices: a right answer holds the output, the running
    state and a few tiles (under 5 % here), one that keeps every tile holds n² numbers (over 50 %, causal too)."""
    full, held = lead * n * n * itemsize, int(seen.get("live_peak", 0))
    if 4 * held < full:
        _row_of_tiles(seen, n, d, b, tried)
        return
    shape, count, nbytes = (seen.get("live_shapes") or [[[], 0, 0]])[0]
    tiles = len(shape) >= 2 and d < shape[-1] <= b and shape[-2] <= b
    share = f"{held / full:.0%} of the {full:,} bytes the full {n} × {n} score matrices of this batch take"
    fail("keeps every score tile alive at once" if tiles else f"holds as much as a {n} × {n} matrix at once",
         tried=tried + ", and the memory it holds at once",
         got=(f"your code keeps {count} tiles of shape {tuple(shape)} alive at the same time: {nbytes:,} bytes in "
              f"all, {held:,} with the rest it holds, {share}" if tiles else
              f"your code holds {seen.get('live_count', 0)} tensors alive at the same time, {held:,} bytes in all, "
              f"{share}; most of them in {count} of shape {tuple(shape)}"),
         expected=f"a few ({b}, {b}) tiles at a time beside the output and the running m, l and acc: memory that grows "
                  f"like n, less than a quarter of the full score matrices here ({full // 4:,} bytes)",
         cause="the values are right, but every tile stays alive after it is used (appended to a list, stored in a "
               "dict, kept for a second loop over the tiles): together they are the n × n score matrix in pieces, "
               "the memory that tiling avoids",
         fix="use each tile inside the key loop as soon as it is computed: fold it into m, l and acc, then let it go "
             "(no list of tiles); keep only the running state and the output")


def _row_of_tiles(seen: dict[str, Any], n: int, d: int, b: int, tried: str) -> None:
    """As many (block, block) score tiles alive at once as a query block has key blocks (n / b): a right answer folds
    each tile in and lets it go, holding a few at a time; one that keeps a query block's tiles for a second loop over
    them (a maximum over every tile first, then the sums) holds them all, memory that grows like n · block_size."""
    row = n // b
    for shape, count, nbytes in seen.get("live_shapes") or []:
        if len(shape) >= 2 and d < shape[-1] <= b and d < shape[-2] <= b and count >= row:
            fail("keeps a query block's score tiles alive at once", tried=tried + ", and the memory it holds at once",
                 got=f"your code keeps {count} tiles of shape {tuple(shape)} alive at the same time "
                     f"({nbytes:,} bytes): a query block has {row} key blocks here",
                 expected=f"a few ({b}, {b}) tiles at a time beside the output and the running m, l and acc",
                 cause="the values are right, but each tile stays alive after it is computed (kept in a list for a "
                       "maximum over all of them, then the sums, or held by a call of your function on itself that "
                       "has not returned yet): memory that grows like n · block_size, where the online algorithm "
                       "folds each tile into m, l and acc and lets it go",
                 fix="inside the key loop: m_new = max(m, tile max); rescale l and acc by exp(m − m_new); add the "
                     "tile's exp(s − m_new) sums and p @ v_block; m = m_new; keep no list of tiles (a loop, not a "
                     "recursion)")


def _tile_work(n: int, d_k: int, d_v: int, b: int, *, causal: bool, extra: int = 0, passes: int = 1) -> float:
    """Matrix-multiply FLOPs of the tiled loop (one head): per visited tile q kᵀ (2·b_q·b_k·d_k, ``passes``
    times) and p v (2·b_q·b_k·d_v); ``extra`` more key blocks per query block when causal."""
    return sum(2.0 * (qe - qs) * (ke - ks) * (passes * d_k + d_v) for qs, qe in blocks(n, b)
               for ks, ke in blocks(n, b) if not causal or ks < qe + extra * b)


def softmax_structure(fn: Learner) -> None:
    n, b = 48, 6
    tried = f"online_softmax(x, {b}) on x (3, {n}), watching which torch functions run"
    seen = fn.observe("fast.trace", rows((3, n), b, 40), b)
    if set(seen["ops"]) & _SOFTMAX_FUNCTIONS:
        fail("calls torch.softmax", tried=tried, got="your function calls torch.softmax (or log_softmax)",
             expected="a softmax built from a running max and a running sum",
             cause="the values are right, but torch.softmax does the exercise for you",
             fix="build it yourself: a running max m and sum l over the blocks, then exp(x − m) / l")
    kinds = seen["reduction_kinds"]
    if kinds.count("m") >= 2 and kinds.count("s") >= 2 and kinds.rindex("m") < kinds.index("s"):
        fail("two passes over x: every maximum before any sum", tried=tried,
             got=f"your blocks' maxima ({kinds.count('m')}) all come before their sums ({kinds.count('s')})",
             expected="one pass: after each block's maximum, that block's sum, folded into the running l",
             cause="the values are right, but a first loop finds the row's maximum and a second adds exp(x − m): "
                   "that is the two-pass softmax the online algorithm replaces, reading x once and rescaling l "
                   "whenever the maximum grows",
             fix=f"one loop over the blocks: {_FOLD}; after the loop, exp(x − m) / l")
    _merged_rule(seen, b, tried)
    _reduction_rule(seen["reductions"], b, n, tried, unit="column", reads="x[..., start:start + block_size]")
    _one_pass(seen.get("reads") or {}, tried)


def _merged_rule(seen: dict[str, Any], b: int, tried: str) -> None:
    """Maxima or sums over more than a block, none of which reads x (each reduction that reads x reads one block):
    the blocks' own maxima and sums, kept and combined after the loop, instead of a running m and l."""
    sizes, read = seen["reductions"], (seen.get("reads") or {}).get("sizes") or []
    if not sizes or max(sizes) <= b or not read or max(read) > b or (seen.get("reads") or {}).get("back"):
        return
    top = max(sizes)
    fail("block results merged at the end instead of a running m and l", tried=tried,
         got=f"every reduction that reads x reads one block of {b} columns, once; then your code combines {top} "
             f"numbers at a time, which are not columns of x: the blocks' own maxima and sums, kept until the loop "
             "has ended",
         expected="after each block, m and l updated: m the largest value so far, l the sum of exp(x − m) so far",
         cause="x is read once, in blocks, but each block's maximum and sum are kept (in a list) and merged after "
               "the loop, a maximum and a sum over all the blocks' results at once: memory that grows with the "
               "number of blocks, where the online algorithm folds each block into the running m and l as it goes",
         fix=f"fold each block in as soon as it is read: {_FOLD}; keep no list of the blocks' maxima or sums")


_READ_BY = {"m": ("maximum", "maxima"), "s": ("sum", "sums"), "l": ("logsumexp", "logsumexps")}  # the watcher's reads


def _one_pass(reads: dict[str, Any], tried: str) -> None:
    """No block of x reduced again once the loop has moved on to later blocks (the watcher's ``reads``)."""
    if not reads.get("back"):
        return
    kind, count, _, moved = (list(reads["back"]) + [""])[:4]
    most = reads.get("most", {})
    times = {k: {1: "once", 2: "twice"}.get(c, f"{c} times") for k, c in most.items() if c}
    read = ", ".join(f"your {_READ_BY[k][1]} {t}" for k, t in times.items() if k in _READ_BY)
    which = _READ_BY.get(kind, ("reduction",))[0]
    if kind == "s" and moved == "m" and max(most.values(), default=0) <= 1:
        fail("each block's sum taken after the next block's maximum", tried=tried,
             got=f"x is read once, but a sum read {count} numbers of x after a maximum of later columns: each "
                 "block's sum comes one step late, after the next block's maximum",
             expected="after each block, m and l updated: the block's maximum, then at once its sum, folded into "
                      "the running l",
             cause="the values are right, but the loop runs one block ahead for the maximum: m already includes "
                   "the next block when this block's sum is taken, so after a block m and l do not describe the "
                   "same columns",
             fix=f"in each step take this block's maximum and then this block's sum: {_FOLD}")
    fail("reads x twice: goes back to blocks already passed", tried=tried,
         got=f"after your loop had moved on to later blocks, a {which} read {count} numbers of x again (the most "
             f"times one number of x was read: {read})",
         expected="one pass: each block reduced when the loop reaches it, its maximum and then its sum, and never "
                  "again once the loop has moved on",
         cause="the values are right, but x is read twice: besides the online loop, a second loop (or a reduction "
               "before it) goes over the blocks — a maximum found beforehand, or maxima and sums whose results are "
               "thrown away. The online algorithm reads each block once, rescaling l whenever the maximum grows",
         fix=f"keep only the one loop: {_FOLD}; after it, exp(x − m) / l; delete any loop or reduction over x before "
             "it")


def attention_structure(fn: Learner, name: str, causal: bool) -> None:
    # Memory: many small tiles; a full score matrix, a full mask or a row of tiles stands out by a factor ≥ 4, and
    # every tile kept alive holds ≥ 10× what a right answer holds at once (the output, the running state, a few tiles).
    lead, n, d_k, d_v, b = 2, 192, 2, 1, 16
    q, k, v = qkv((lead,), n, n, d_k, d_v, b, 41)
    tried = f"{name}(q, k, v, {b}) on q, k ({lead}, {n}, {d_k}), v ({lead}, {n}, {d_v}), watching what it creates"
    seen = fn.observe("fast.trace", q, k, v, b)
    if any(op in _FUSED_FUNCTIONS or "attention" in op for op in seen["ops"]):
        fail("calls a fused attention", tried=tried, got="your function calls F.scaled_dot_product_attention "
             "(or another fused attention)", expected="the tiled loop, written out",
             cause="the values are right, but the fused function does the exercise for you",
             fix="compute each tile's scores with @ and keep the running max, sum and accumulator yourself")
    limit = 2 * max(lead * b * b, q.numel(), k.numel(), v.numel(), lead * n * d_v)
    elements, shape = seen["largest"], tuple(seen["shape"])
    if elements > limit:
        big = [s for s in shape if s > b]
        if len(big) >= 2 and n in shape:
            summary, what = f"builds a full {n} × {n} matrix", f"a full {n} × {n} matrix (scores, probabilities or a mask)"
        elif len(big) == 1 and n in shape:
            summary, what = "builds a whole row of tiles at once", f"a whole row or column of tiles ({n} positions by a block)"
        elif len(shape) >= 3 and shape[-1] <= b and shape[-2] <= b:
            summary = "computes a whole column of tiles at once"
            what = (f"{math.prod(shape[:-2]) // lead} ({b}, {b}) tiles side by side: a column of tiles (every query "
                    "block against one key block) at once")
        elif any(s > b for s in shape[-2:]):
            summary, what = "tiles larger than block_size", f"tiles larger than block_size = {b}"
        else:
            summary, what = "builds a tensor larger than a tile", "a large tensor"
        fail(summary, tried=tried, got=f"your function creates a tensor of shape {shape} ({elements} numbers): {what}",
             expected=f"nothing larger than the inputs, the output and a ({b}, {b}) tile (at most {limit // 2} numbers "
                      "here)",
             cause="the values are right, but holding that tensor is what tiling avoids: its memory grows like "
                   + ("n · block_size (a tile for every query block at once)" if "column" in summary else "n²"),
             fix="compute one (block_size, block_size) tile of scores at a time, and mask (causal) tile by tile "
                 "from global positions")
    _held_rule(seen, lead, n, max(d_k, d_v), b, q.element_size(), tried)
    _reduction_rule(seen["reductions"], b, n, tried, unit="key", reads="k[..., start:start + block_size, :]")
    # Work: few large blocks, d_k ≫ d_v, so reading the keys twice or one tile too many shows by ≥ 1.3×.
    n, d_k, d_v, b = 96, 8, 1, 32
    tried = f"{name}(q, k, v, {b}) on q, k (1, {n}, {d_k}), v (1, {n}, {d_v}), counting matrix-multiply FLOPs"
    flops = fn.observe("fast.trace", *qkv((1,), n, n, d_k, d_v, b, 42), b)["flops"]
    needed = _tile_work(n, d_k, d_v, b, causal=causal)
    if flops <= 1.2 * needed:
        return
    # (summary, what the work matches, its FLOPs)
    candidates = [("computes the tiles above the diagonal", "every tile, also those above the diagonal",
                   _tile_work(n, d_k, d_v, b, causal=False)),
                  ("computes one tile past the diagonal", "one tile past the diagonal per query block",
                   _tile_work(n, d_k, d_v, b, causal=True, extra=1))] if causal else []
    candidates.append(("reads the keys twice", "the scores twice (a first pass for the maximum, then the sums)",
                       _tile_work(n, d_k, d_v, b, causal=causal, passes=2)))
    summary, named = next(((s, w) for s, w, work in candidates if abs(flops - work) <= 0.02 * work),
                          ("does more work than one pass", ""))
    above = "diagonal" in summary
    fail(summary, tried=tried,
         got=f"{fmt(flops)} matrix-multiply FLOPs, {fmt(flops / needed)} × what one pass needs" + (f": {named}" if named else ""),
         expected=f"{fmt(needed)}: each tile{' on or below the diagonal' if causal else ''} computed once",
         cause=("the values are right, but the tiles above the diagonal are entirely masked: computing them is "
                "wasted work, and skipping them is what halves a causal attention's cost" if above else
                "the values are right, but the algorithm is a single pass: each tile's scores computed once, with a "
                "running maximum instead of a maximum found beforehand"),
         fix=DIAG_FIX if above else "visit each key block once per query block, updating m, l and acc as you go")

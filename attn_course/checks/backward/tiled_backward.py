"""Exercise 3 of notebook 10, tiled_attention_backward: the FlashAttention-2 backward, judged on its cases,
then watched at n = 1024 (no n × n tensor, tiles of block_size, causal tiles above the diagonal skipped)."""

from __future__ import annotations

import torch

from ...backward import tiled_attention_forward
from ..compare import fail, same
from ..core import Learner, LearnerRaised, check
from ..kit import KEPT_FIX, Suspects, call_explained, kept_cause
from .judge import DTYPE, expect_fresh, fail_raised, judge, oracle, rand, tolerance, unpack_grads
from .mistakes import CAUSAL, DELTA, TILED, table, tiled
from .probes import forbid, watch_and_forbid

#: The structural probe's size: n² = 1,048,576 numbers for one head; a (128, 128) tile holds 16,384.
BIG_N, BIG_D, BIG_BLOCK = 1024, 16, 128
_TILE_RAISES = [
    ("RuntimeError", r"upper bound and lower bound inconsistent with step sign", "torch.arange(start, end) got an end "
     "below its start: it counts upward, so its two bounds are swapped or the end was computed by subtracting",
     "torch.arange(start, start + length): the smaller bound first"),
    ("RuntimeError", r"with a bool tensor is not supported", "a bool tensor (a mask, such as cols > rows) took part in "
     "arithmetic where a tensor of numbers belongs",
     "use the mask to select: s = s.masked_fill(blocked, float('-inf'))"),
    DTYPE]


def _tiled_cases() -> list[dict]:
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
        ("extreme values: scores of order ±10³ (L from about −900 to 2000), a blocked key scoring far above the allowed ones, upstream "
         "gradient ×10⁴, causal, n_q = n_k = 9, block 4", (), 9, 9, 5, 3, 4, True, "extreme"),
        # last, the second case's shapes with other values (a result kept from an earlier call shows), every score
        # near −2·10⁴ (so is L): a blocked score given a finite fill instead of −∞ shows
        ("causal, every score near −2·10⁴ (L too), n_q = n_k = 12, block 4, d_k = 5, d_v = 5", (), 12, 12, 5, 5, 4,
         True, "negative"),
    ]:
        dtype, extreme = torch.float32 if "float32" in extra else torch.float64, "extreme" in extra
        q = torch.randn(*lead, n, d, generator=g, dtype=torch.float64)
        q = (q * (0.5 + 2.5 * torch.rand(*lead, n, 1, generator=g, dtype=torch.float64))).to(dtype)  # norms differ
        q = q * 300 if extreme else q
        k = rand(g, *lead, m, d, dtype=dtype)
        if "negative" in extra:  # q·k/√d_k = −2·10⁴ along the first axis, give or take ~10² from q's noise
            q[..., 0], k[..., 0] = q[..., 0] + 1000.0, -20.0 * d ** 0.5 + 1e-3 * k[..., 0]
        if extreme:  # key 1, blocked for query 0 in the same tile when causal, scores far above key 0
            k[..., 1, :] = 3 * q[..., 0, :] / q[..., 0, :].norm(dim=-1, keepdim=True)
        v = rand(g, *lead, m, dv, dtype=dtype)
        dout = rand(g, *lead, n, dv, dtype=dtype, scale=1e4 if extreme else 1.0)
        o, lse = tiled_attention_forward(q.double(), k.double(), v.double(), 16, causal=causal)
        cases.append(dict(name=name, q=q, k=k, v=v, o=o.to(dtype), lse=lse.to(dtype), dout=dout, block=block,
                          causal=causal, dtype=dtype, extreme=extreme, pass_block="default_block" not in extra,
                          explicit_false="explicit_false" in extra, expected=oracle(q, k, v, dout, causal=causal)[1]))
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
        fail_raised(exc, tried, "(dq, dk, dv)", _TILE_RAISES, **hint)


@check("tiled_attention_backward", timeout=30.0,
       expects="a function tiled_attention_backward(q, k, v, o, lse, dout, block_size=64, causal=False) "
               "returning (dq, dk, dv)")
def check_tiled_attention_backward(fn: Learner) -> str:
    cases, inputs = _tiled_cases(), ("q", "k", "v", "o", "lse", "dout")
    case = cases[0]  # first what the code does besides its result: autograd, fused attention, inputs written into
    watch_and_forbid(fn, f"{_tiled_tried(case)}, watching the functions it calls", *(case[x] for x in inputs),
                     case["block"], what="tiled_attention_backward", inputs=inputs)
    suspects, earlier = Suspects(table(TILED + CAUSAL, tiled), atol=1e-6, rtol=1e-4), []
    for index, case in enumerate(cases):
        tried = _tiled_tried(case)
        full = any(c["q"].shape[-2] % c["block"] == 0 == c["k"].shape[-2] % c["block"] for c in cases[:index])
        got = unpack_grads(_call_tiled(fn, case, tried, full_blocks_passed=full), tried)
        args = (*(case[x] for x in inputs), case["block"], case["causal"])
        expect_fresh(got, case["expected"], earlier, tried)
        earlier.append((case["name"], got, case["expected"]))
        judge(suspects, got, case["expected"], args, tried=tried, dtype=case["dtype"], grads=tiled,
              nan_cause="your gradients were finite on every earlier case, so exp overflowed on scores this large"
              if case["extreme"] else "", nan_fix="exponentiate S − L in one step, torch.exp(s - lse[..., "
              "q_start:q_end, None]), and give blocked scores −∞ before exp (or select with torch.where after it)")
    reports = _watch_big(fn)  # fails on an n × n tensor, autograd or an input written into
    _check_delta_from_o(fn, cases[2])
    _check_lse_used(fn, cases[2])
    _check_tiles(reports)
    return (f"matches autograd through F.scaled_dot_product_attention on {len(cases)} cases "
            f"(causal or not, blocks 1…64, n_q, n_k not multiples of the block, size-1 axes, float32, L from −2·10⁴ to "
            f"2·10³); "
            f"D from o; at n = {BIG_N} no n × n tensor, tiles of block_size, causal skips the tiles above the diagonal")


def _check_delta_from_o(fn: Learner, case: dict) -> None:
    """The docstring's D = rowsum(dout ⊙ o): with an o no forward made, the result must follow that o."""
    other_o = case["o"] + 0.5 * rand(torch.Generator().manual_seed(16), *case["o"].shape, dtype=case["dtype"])
    tried = _tiled_tried(case).replace(" on ", " with o replaced by o + 0.5·noise (not the forward's output), on ", 1)
    got = unpack_grads(_call_tiled(fn, dict(case, o=other_o), tried), tried)
    expected = tiled(*(dict(case, o=other_o)[x] for x in ("q", "k", "v", "o", "lse", "dout", "block", "causal")))
    tol = tolerance(expected, case["dtype"])
    if all(same(a, b, **tol) for a, b in zip(got, expected)):
        return
    if all(same(a, b, **tol) for a, b in zip(got, case["expected"])) and \
            not _kept(fn, dict(case, o=other_o), tried, "o"):
        fail("D not computed from o", tried=tried,
             got="the same gradients as with the forward's o: your result does not depend on o",
             expected="gradients that follow the o passed in, through D = rowsum(dout ⊙ o)",
             cause="D came from recomputed tiles of P (rowsum(dP ⊙ P), or an O rebuilt as P V) instead of the o "
                   "passed in: right numbers, extra work, not the FlashAttention-2 backward",
             fix=DELTA + ", once, before the loops")
    fail("o used other than through D", tried=tried,
         got="gradients that are neither those of D = rowsum(dout ⊙ o) for this o nor those of the forward's o",
         expected="gradients that follow the o passed in, through D = rowsum(dout ⊙ o) and nowhere else",
         fix=f"use o only in {DELTA}, computed once before the loops")


def _check_lse_used(fn: Learner, case: dict) -> None:
    """The docstring's P = exp(S − L) from the lse passed in: with lse + 1, every P and so every gradient shrinks by e."""
    shifted = dict(case, lse=case["lse"] + 1.0)
    tried = _tiled_tried(case).replace(" on ", " with lse replaced by lse + 1 (so every P = exp(S − L) shrinks by e), "
                                       "on ", 1)
    got = unpack_grads(_call_tiled(fn, shifted, tried), tried)
    expected = tiled(*(shifted[x] for x in ("q", "k", "v", "o", "lse", "dout", "block", "causal")))
    tol = tolerance(expected, case["dtype"])
    if all(same(a, b, **tol) for a, b in zip(got, expected)):
        return
    if all(same(a, b, **tol) for a, b in zip(got, case["expected"])) and \
            not _kept(fn, shifted, tried, "lse"):
        fail("lse not used: the logsumexp found again", tried=tried,
             got="the same gradients as with the forward's lse: your result does not depend on lse",
             expected="every gradient divided by e, since each tile of P is exp(S − L) with the L passed in",
             cause="your code finds each row's maximum or logsumexp itself (a first pass over the keys) instead of "
                   "taking L from lse: right numbers, a second pass the FlashAttention-2 backward avoids",
             fix="each tile of P is torch.exp(s - lse[..., q_start:q_end, None]): no max, no logsumexp of your own")


def _kept(fn: Learner, changed: dict, tried: str, name: str) -> bool:
    """The gradients came back as with the forward's ``name``: asked again with dout doubled (every gradient doubles,
    D included), do they follow the changed ``name``? Then the first answer was a result kept from the call with the
    same other inputs (a cache keyed on them, not on ``name``), and the check fails saying so; False otherwise."""
    doubled = dict(changed, dout=2 * changed["dout"])
    again = tried.replace(" on ", " and dout doubled, on ", 1)
    got = unpack_grads(_call_tiled(fn, doubled, again), again)
    expected = tiled(*(doubled[x] for x in ("q", "k", "v", "o", "lse", "dout", "block", "causal")))
    if not all(same(a, b, **tolerance(expected, changed["dtype"])) for a, b in zip(got, expected)):
        return False
    fail("an earlier result returned again", tried=f"{tried}, then with dout doubled too",
         got=f"with only {name} changed, the gradients of the forward's {name}; with dout doubled as well, "
             f"the right gradients for the {name} passed in",
         expected=f"gradients that follow the {name} passed in on every call", cause=kept_cause(
             f"the other inputs, not by {name}"), fix=KEPT_FIX)


def _watch_big(fn: Learner) -> dict:
    """The watch probe's reports (with what was tried) at n = BIG_N, causal and not; fails on an n × n tensor,
    autograd, an input written into."""
    g = torch.Generator().manual_seed(14)
    q, k, v, dout = (rand(g, 1, BIG_N, BIG_D) for _ in range(4))
    o, lse = tiled_attention_forward(q, k, v, 256)
    reports = {}
    for causal in (False, True):
        tried = (f"watching tiled_attention_backward(q, k, v, o, lse, dout, {BIG_BLOCK}"
                 f"{', causal=True' if causal else ''}) at n_q = n_k = {BIG_N}, d_k = d_v = {BIG_D}, one head")
        report = call_explained(lambda: fn.observe("backward.watch", q, k, v, o, lse, dout, BIG_BLOCK, timeout=120,
                                                   **({"causal": True} if causal else {})), tried=tried,
                                expected="(dq, dk, dv)")
        forbid(report, tried, what="tiled_attention_backward", inputs=("q", "k", "v", "o", "lse", "dout"))
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

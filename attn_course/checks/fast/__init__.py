"""Checks for notebook 09 (fast attention): ``online_softmax``, ``tiled_attention``, ``causal_tiled_attention``.

Each answer is compared with its float64 oracle on the cases of :mod:`.cases` (every argument varied); a wrong one
is named by the kit's engine from the tables of :mod:`.mistakes` (the algorithm of :mod:`.steps` with one step
changed), else by a property measured on it (:mod:`.judge`). How a right answer is computed (in blocks, one pass,
no tensor larger than a tile, no tile above the diagonal) is measured on the learner's side by the probe
:func:`trace` (:mod:`.probe`).
"""

from __future__ import annotations

from ..core import Learner, check
from .cases import again, causal_cases, softmax_cases, tiled_cases
from .judge import run
from .mistakes import CAUSAL_MISTAKES, SOFTMAX_MISTAKES, SOFTMAX_RAISES, TILED_MISTAKES, TILED_RAISES
from .probe import attention_structure, softmax_structure, trace
from .steps import Loop, Pass

__all__ = ["check_online_softmax", "check_tiled_attention", "check_causal_tiled_attention", "trace",
           "Pass", "Loop", "SOFTMAX_MISTAKES", "TILED_MISTAKES", "CAUSAL_MISTAKES"]


# ============================================================================ the checks
@check("online_softmax", expects="a function online_softmax(x, block_size=1) returning a tensor shaped like x")
def check_online_softmax(fn: Learner) -> str:
    cases = [*softmax_cases(), *again("online_softmax")]
    run(fn, "online_softmax", cases, SOFTMAX_MISTAKES, SOFTMAX_RAISES)
    softmax_structure(fn)
    return (f"matches torch.softmax on {len(cases)} cases (block sizes 1…16, 1-D to 3-D, maxima rising and falling, "
            "values near ±1000) and reads x in blocks, once")


#: CPU seconds for a whole tiled check, not 10: its structure probe watches every torch call, and a right answer
#: that builds each tile one dot product at a time makes ~74,000 of them there (~10 s on a quiet 2-core machine).
SLOW_BUT_RIGHT = 30.0


@check("tiled_attention", timeout=SLOW_BUT_RIGHT,
       expects="a function tiled_attention(q, k, v, block_size=64) returning a tensor (..., n_q, d_v)")
def check_tiled_attention(fn: Learner) -> str:
    cases = [*tiled_cases(), *again("tiled_attention")]
    run(fn, "tiled_attention", cases, TILED_MISTAKES, TILED_RAISES)
    attention_structure(fn, "tiled_attention", causal=False)
    return (f"matches F.scaled_dot_product_attention on {len(cases)} cases (blocks 1…32, n_q ≠ n_k, d_k ≠ d_v, "
            "extreme scores, tile maxima rising by up to 900) and holds only (block, block) tiles, each computed once")


@check("causal_tiled_attention", timeout=SLOW_BUT_RIGHT,
       expects="a function causal_tiled_attention(q, k, v, block_size=64) returning a tensor (..., n, d_v)")
def check_causal_tiled_attention(fn: Learner) -> str:
    cases = [*causal_cases(), *again("causal_tiled_attention")]
    run(fn, "causal_tiled_attention", cases, CAUSAL_MISTAKES, TILED_RAISES)
    attention_structure(fn, "causal_tiled_attention", causal=True)
    return (f"matches causal F.scaled_dot_product_attention on {len(cases)} cases and never computes a tile above "
            "the diagonal")

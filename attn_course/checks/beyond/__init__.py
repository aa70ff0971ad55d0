"""Checks for notebook 13 (beyond softmax): ``linear_attention``, ``causal_linear_attention``,
``chunked_linear_attention``, ``positive_random_features`` and ``block_sparse_attention``.

Oracles, in float64: kernel attention computed densely (A = φ(q) φ(k)ᵀ, masked by j ≤ i when causal,
A v / rowsum(A)) — itself equal to ``F.scaled_dot_product_attention`` with the additive mask log A
(``tests/test_beyond.py``); the feature map's formula; ``F.scaled_dot_product_attention`` with the
layout's boolean mask. Randomness is the check's: the projection Ω is an argument, so a right answer
never fails by chance.

Each check: its cases, the oracle, its table of known mistakes (one :class:`~..kit.Suspects` per run), what a
measurement shows when no mistake reproduces the answer (which rows, chunks or query blocks are wrong; the same
call with one chunk, or one key block per query block), and how the result is computed, seen on the learner's
side by the probe :func:`work`: no (n, n) matrix for the linear forms, (c, c) blocks for the chunkwise one, and
no work on the tiles a layout skips.
"""

from __future__ import annotations

from .block_sparse import check_block_sparse_attention
from .judge import work
from .linear import check_causal_linear_attention, check_chunked_linear_attention, check_linear_attention
from .random_features import check_positive_random_features

__all__ = ["check_linear_attention", "check_causal_linear_attention", "check_chunked_linear_attention",
           "check_positive_random_features", "check_block_sparse_attention", "work"]

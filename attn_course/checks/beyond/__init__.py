"""Checks for notebook 13 (beyond softmax): ``linear_attention``, ``causal_linear_attention``,
``chunked_linear_attention``, ``positive_random_features`` and ``block_sparse_attention``.

Oracles, in float64: kernel attention computed densely (equal to ``F.scaled_dot_product_attention`` with the
additive mask log A, ``tests/test_beyond.py``), the feature map's formula, and SDPA with the layout's mask. The
projection Ω is an argument, so a right answer never fails by chance. The probe :func:`work` sees how the
result is computed: no (n, n) matrix, (c, c) blocks for the chunkwise form, no work on the tiles a layout skips."""

from __future__ import annotations

from .block_sparse import check_block_sparse_attention
from .judge import work
from .linear import check_causal_linear_attention, check_chunked_linear_attention, check_linear_attention
from .random_features import check_positive_random_features

__all__ = ["check_linear_attention", "check_causal_linear_attention", "check_chunked_linear_attention",
           "check_positive_random_features", "check_block_sparse_attention", "work"]

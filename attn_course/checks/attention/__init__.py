"""Checks for notebook 05: scaled dot-product attention and the size of its score matrix.

``attention`` — 12 cases (the worked example, batches, heads, masks of five shapes, one query, one key, scores of
±1000 and ±3·10⁴); oracle ``F.scaled_dot_product_attention`` (the weights: its output with V = I). The weights, then
the output, are judged by a :class:`~..kit.Suspects` over their table of known mistakes; an exception is explained by
a construct that raises the very same message; a wrong answer no mistake reproduces is measured (randomness, a
narrower dtype, NaN from overflow or underflow, weight on blocked keys, rounding, row sums, the scale really used).

``score_matrix_bytes`` — every case runs first; a wrong formula is named only when it fits them all, else the
bytes per entry or a constant factor are measured.
"""

from .attention_check import check_attention
from .score_bytes import check_score_matrix_bytes

__all__ = ["check_attention", "check_score_matrix_bytes"]

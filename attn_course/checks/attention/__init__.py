"""Checks for notebook 05: scaled dot-product attention and the size of its score matrix.

``attention`` (:mod:`.attention_check`; its cases and oracle in :mod:`.cases`, its known mistakes and the
measurements past them in :mod:`.mistakes`) and ``score_matrix_bytes`` (:mod:`.score_bytes`).
"""

from .attention_check import check_attention
from .score_bytes import check_score_matrix_bytes

__all__ = ["check_attention", "check_score_matrix_bytes"]

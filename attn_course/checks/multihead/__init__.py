"""Checks for notebook 07 (multi-head attention): split_heads, merge_heads, MultiHeadAttention.

Oracles: the course's split_heads / merge_heads (tested against ``torch.chunk`` / ``torch.cat``); for the module,
``torch.nn.MultiheadAttention`` with the same weights wherever it applies (A·d_head = d_model, no fully masked row),
else :func:`multihead`, a float64 model the tests hold equal to it. Each check judges its table of
:class:`~..kit.Known` mistakes with one :class:`~..kit.Suspects`; the learner's class is reached only through the
learner boundary (``inspect``, ``construct``, ``set_parameters``, calls).
"""

from __future__ import annotations

from .heads import check_merge_heads, check_split_heads
from .module import check_MultiHeadAttention

__all__ = ["check_split_heads", "check_merge_heads", "check_MultiHeadAttention"]

"""Checks for notebook 10 (attention's backward pass): attention_backward, AttentionFunction,
tiled_attention_backward.

Oracle: autograd through ``F.scaled_dot_product_attention`` in float64 (from PyTorch 2.5 on it gives a fully
masked row a zero output and zero gradients, the course's convention). Mistakes: one backward with a switch per
known bug (:mod:`.mistakes`), tried on the three gradients at once by a :class:`~..kit.Suspects`; what no row
reproduces is measured (:mod:`.judge`). What outputs cannot show (an n × n tensor, the tile size, skipped causal
tiles, autograd) is measured on the learner's side by the probes of :mod:`.probes`.
"""

from __future__ import annotations

from . import probes  # noqa: F401 - its @probe functions register at import time (backward.watch, …)
from .attention_backward import check_attention_backward
from .attention_function import check_AttentionFunction
from .tiled_backward import check_tiled_attention_backward

__all__ = ["check_attention_backward", "check_AttentionFunction", "check_tiled_attention_backward"]

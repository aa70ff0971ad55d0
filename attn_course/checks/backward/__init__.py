"""Checks for notebook 10 (attention's backward pass): attention_backward, AttentionFunction,
tiled_attention_backward.

Oracle: autograd through ``F.scaled_dot_product_attention`` in float64 (from PyTorch 2.5 on it gives a fully
masked row a zero output and zero gradients, the course's convention). Cases vary every argument: masks,
fully masked rows, causal or not, blocks that do and do not divide n_q and n_k, batch and head axes,
d_k ≠ d_v, size-1 axes, float32, scores and upstream gradients far from 1.

Mistakes: one backward, :func:`_variant`, written once with a switch per known bug; each bug is a
:class:`~..kit.Known` row (:data:`TEXT`) that a :class:`~..kit.Suspects` engine tries on the three gradients at
once. When no row reproduces an answer the check measures it: a wrong scale (fitted), which line of the
chain rule is wrong (the right gradients pin dS down), zero rows, float32 precision, then the difference.
What outputs cannot show (an n × n tensor, the tile size, skipped causal tiles, autograd) is measured on
the learner's side by the probe ``backward.watch``; only plain numbers come back.
"""

from __future__ import annotations

from . import probes  # noqa: F401 - its @probe functions register at import time (backward.watch, …)
from .attention_backward import check_attention_backward
from .attention_function import check_AttentionFunction
from .tiled_backward import check_tiled_attention_backward

__all__ = ["check_attention_backward", "check_AttentionFunction", "check_tiled_attention_backward"]

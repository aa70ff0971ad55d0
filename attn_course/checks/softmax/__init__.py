"""Checks for notebook 03 (softmax, stably): stable_softmax, logsumexp, log_softmax, softmax_temperature.

Oracle: ``torch.softmax``, ``torch.logsumexp`` and ``torch.log_softmax`` in float64. The cases (:func:`score_cases`):
every kind of axis (``dim=-1``, ``0``, a middle axis, another negative axis, the default) on 1-D to 4-D inputs with
size-1 axes besides the reduced one; float32, float64 and float16; and the edges that break careless versions — scores
near ±1000 whose maximum sits at the start, middle or end of a slice, slices far apart in one tensor, ``-inf`` entries,
and a log-probability of −1005, far below what a float64 probability can hold. Functions written for tensors or for
NumPy arrays are both accepted (``kit.TensorOrArray``).

Every check is one body (:func:`judge_cases`): its table of known mistakes (``kit.Known``) judged by one
``kit.Suspects``; what no mistake reproduces is measured (``kit.what_is_off``, :func:`explain_weights`: NaN from an
overflow, slices that sum to 1 along another axis, another temperature…). The probe ``kit.call`` says once whether
the function leaves its input as it was.
"""

from .log_softmax import check_log_softmax
from .logsumexp import check_logsumexp
from .stable_softmax import check_stable_softmax
from .temperature import check_softmax_temperature

__all__ = ["check_stable_softmax", "check_logsumexp", "check_log_softmax", "check_softmax_temperature"]

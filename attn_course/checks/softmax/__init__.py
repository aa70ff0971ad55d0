"""Checks for notebook 03 (softmax, stably): stable_softmax, logsumexp, log_softmax, softmax_temperature.

Oracle: ``torch.softmax``, ``torch.logsumexp`` and ``torch.log_softmax`` in float64, on every kind of axis, 1-D to
4-D, float16/32/64, and the edges that break careless versions (scores near ±1000, -inf entries, a log-probability of
−1005); tensors or NumPy arrays (``kit.TensorOrArray``). One body (:func:`.body.judge_cases`) judges each check's
table of known mistakes, then measures what no mistake reproduces.
"""

from .log_softmax import check_log_softmax
from .logsumexp import check_logsumexp
from .stable_softmax import check_stable_softmax
from .temperature import check_softmax_temperature

__all__ = ["check_stable_softmax", "check_logsumexp", "check_log_softmax", "check_softmax_temperature"]

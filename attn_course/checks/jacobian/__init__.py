"""Checks for notebook 04 (the softmax Jacobian): softmax_jacobian, softmax_vjp, SoftmaxFunction.

Oracle: PyTorch's autograd (``torch.autograd.functional.jacobian`` of ``torch.softmax`` for J, its gradient for the
vector–Jacobian product and the Function's backward, ``gradcheck`` for the Function). Each part is one body
(:func:`.cases.judge_cases`): its table of known mistakes (``kit.Known``) judged by ``kit.Suspects``, then what no
mistake reproduces is measured (the diagonal, symmetry, rows that must sum to 0…). A gradcheck failure says which
pass lost float64 precision.

**O(n) memory and work**, the docstrings' promise for the VJP and the Function's backward, are measured where the
learner's code runs (the probes :func:`vjp_cost` and :func:`function_cost`), once at n = 2048: the O(n) route holds
a few vectors of n numbers (about 10⁴ in all), while building J or its outer product holds n² = 4,194,304 at once and
recomputing ⟨g, p⟩ for every entry creates n² in all. The line, n²/8, is 8× below those and over 50× above the first.
"""

from .function import check_SoftmaxFunction
from .jacobian import check_softmax_jacobian, check_softmax_vjp
from .probes import BIG_N, QUADRATIC, function_cost, vjp_cost

__all__ = ["check_softmax_jacobian", "check_softmax_vjp", "check_SoftmaxFunction", "vjp_cost", "function_cost",
           "BIG_N", "QUADRATIC"]

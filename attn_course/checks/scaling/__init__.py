"""Checks for notebook 02 (why divide by √d_k).

``check_mc_score_variance`` judges a Monte-Carlo estimate statistically (seeded, in five settings, within :data:`Z`
standard errors of σ⁴·d_k), after replaying a few small calls to name look-alikes of the sample variance for sure.
``check_scaled_scores`` runs the kit's :func:`~..kit.judge_cases` on shapes whose sizes all differ and whose d_k are
not perfect squares, so that the wrong size or a rounded √d_k can be told apart.
"""

from .monte_carlo import VARIANCE_CASES, Z, check_mc_score_variance, make_mc_check
from .scaled_scores import check_scaled_scores

__all__ = ["check_mc_score_variance", "check_scaled_scores", "make_mc_check", "Z", "VARIANCE_CASES"]

"""Checks for notebook 02 (why divide by √d_k).

``check_mc_score_variance`` judges a Monte-Carlo estimate statistically: called with a seeded generator (built by a
learner-side probe, which also says whether it was drawn from) in five settings of (d_k, sigma, n_samples), each
estimate must land within :data:`Z` standard errors of σ⁴·d_k; a mistake of :data:`PREDICTIONS` is named when it
predicts all five. A few calls with 5 or 8 samples are first *replayed* (the common ways of drawing q and k redone
here), naming a look-alike of the sample variance (:data:`LOOK_ALIKES`) for sure. Then: same seed, same estimate;
``n_samples`` matters; the estimates scatter as they should (150 seeds); ``generator=None`` works, drawing from the
global random state.

``check_scaled_scores``: the kit's :func:`~..kit.judge_cases` on shapes whose axis sizes all differ and whose d_k are
not perfect squares, so that the wrong size or a rounded √d_k can be told apart (:data:`SCALE_TABLE`); else the
divisor the results imply.
"""

from .monte_carlo import VARIANCE_CASES, check_mc_score_variance, make_mc_check
from .predictions import Z
from .scaled_scores import check_scaled_scores

__all__ = ["check_mc_score_variance", "check_scaled_scores", "make_mc_check", "Z", "VARIANCE_CASES"]

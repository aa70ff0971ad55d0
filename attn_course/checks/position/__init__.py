"""Checks for notebook 12 (position): is_permutation_equivariant (a test the learner writes), sinusoidal_encoding,
relative_position_bias, alibi_bias, apply_rope, rope_decode_step and additive_attention.

The learner's test runs learner-side under fixed seeds; the pattern of its verdicts names its flaw. The others compare
in float64 with the conventions' formulas (held to Hugging Face's T5 by ``tests/test_position.py``), name a known
mistake, or else measure what the answer is (frequencies, slopes…)."""

from .additive import check_additive_attention
from .equivariance import check_is_permutation_equivariant
from .relative_bias import check_alibi_bias, check_relative_position_bias
from .rope import check_apply_rope, check_rope_decode_step
from .sinusoidal import check_sinusoidal_encoding

__all__ = ["check_is_permutation_equivariant", "check_sinusoidal_encoding", "check_relative_position_bias",
           "check_alibi_bias", "check_apply_rope", "check_rope_decode_step", "check_additive_attention"]

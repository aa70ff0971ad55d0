"""The course in one table: each notebook, its reference module, its checks module, its tests, its exercises.

This is the one place that says which file belongs to which notebook; ``tests/test_registry.py`` keeps
it true (every notebook, module, check and test file named here exists, every exercise in a solution
notebook is listed here and has its check, and each module's docstring names its notebook).
Conventions that follow from it:

* the check of exercise ``x`` is ``check_x`` in the notebook's checks module;
* reference module ``attn_course/<m>.py`` is tested by ``tests/test_<m>.py``, checks module
  ``attn_course.checks.<m>`` (``checks/<m>.py``, or the package ``checks/<m>/``) by
  ``tests/checks/test_<m>.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Notebook", "NOTEBOOKS", "by_slug", "by_number", "check_name", "assigned"]


@dataclass(frozen=True)
class Notebook:
    number: str  # "05"
    slug: str  # "05_attention": solutions/<slug>.ipynb and notebooks/<slug>.ipynb
    title: str
    reference: str | None  # the module of reference implementations, figures and explorers
    checks: str | None  # the module holding one check per exercise
    exercises: tuple[str, ...] = field(default=())  # exercise ids (nbgrader grade_id), in notebook order
    graded: bool = True  # counted in a class's table (notebook 00 has nothing to grade)

    @property
    def filename(self) -> str:
        return f"{self.slug}.ipynb"

    def test_files(self) -> list[str]:
        """The test files of this notebook's modules, relative to the repository root."""
        files = []
        if self.reference:
            files.append(f"tests/test_{self.reference.rsplit('.', 1)[1]}.py")
        if self.checks:
            files.append(f"tests/checks/test_{self.checks.rsplit('.', 1)[1]}.py")
        return files


def check_name(exercise: str) -> str:
    """The name of the check function of an exercise."""
    return f"check_{exercise}"


NOTEBOOKS: tuple[Notebook, ...] = (
    Notebook("00", "00_setup", "Setup and environment check", "attn_course.environment", None, graded=False),
    Notebook("01", "01_dot_product", "Queries, keys, values: the dot product", "attn_course.dot",
             "attn_course.checks.dot", ("query_scores_loop", "query_scores", "score_matrix", "cosine_scores")),
    Notebook("02", "02_scaling", "Why divide by √d_k", "attn_course.scaling", "attn_course.checks.scaling",
             ("mc_score_variance", "scaled_scores")),
    Notebook("03", "03_softmax", "Softmax, stably", "attn_course.softmax", "attn_course.checks.softmax",
             ("stable_softmax", "logsumexp", "log_softmax", "softmax_temperature")),
    Notebook("04", "04_softmax_jacobian", "The softmax Jacobian", "attn_course.jacobian",
             "attn_course.checks.jacobian", ("softmax_jacobian", "softmax_vjp", "SoftmaxFunction")),
    Notebook("05", "05_attention", "Scaled dot-product attention", "attn_course.attention",
             "attn_course.checks.attention", ("attention", "score_matrix_bytes")),
    Notebook("06", "06_masks", "Masks", "attn_course.masks", "attn_course.checks.masks",
             ("causal_mask", "padding_mask_from_lengths", "padding_mask_from_ids", "decoder_mask",
              "cross_attention_mask", "additive_mask", "masked_softmax")),
    Notebook("07", "07_multihead", "Multi-head attention", "attn_course.multihead", "attn_course.checks.multihead",
             ("split_heads", "merge_heads", "MultiHeadAttention")),
    Notebook("08", "08_reading_attention", "Reading attention", "attn_course.patterns", "attn_course.checks.patterns",
             ("normalised_entropy", "peak_weight", "self_attention_weight", "attention_distance", "effective_positions")),
    Notebook("09", "09_fast_attention", "Fast attention", "attn_course.fast", "attn_course.checks.fast",
             ("online_softmax", "tiled_attention", "causal_tiled_attention")),
    Notebook("10", "10_backward", "Attention's backward pass", "attn_course.backward", "attn_course.checks.backward",
             ("attention_backward", "AttentionFunction", "tiled_attention_backward")),
    Notebook("11", "11_inference", "Attention at inference", "attn_course.inference", "attn_course.checks.inference",
             ("KVCache", "bottom_right_causal_mask", "merge_partials", "sliding_window_mask",
              "sliding_window_attention")),
    Notebook("12", "12_position", "Position", "attn_course.position", "attn_course.checks.position",
             ("is_permutation_equivariant", "sinusoidal_encoding", "relative_position_bias", "alibi_bias",
              "apply_rope", "rope_decode_step", "additive_attention")),
    Notebook("13", "13_beyond_softmax", "Beyond softmax", "attn_course.beyond", "attn_course.checks.beyond",
             ("linear_attention", "causal_linear_attention", "chunked_linear_attention", "positive_random_features",
              "block_sparse_attention")),
)


def by_slug(slug: str) -> Notebook:
    """The notebook with this slug (``"05_attention"``) or file name (``"05_attention.ipynb"``)."""
    slug = slug.removesuffix(".ipynb")
    for nb in NOTEBOOKS:
        if nb.slug == slug:
            return nb
    raise KeyError(f"no notebook {slug!r} in the course")


def by_number(number: str) -> Notebook:
    for nb in NOTEBOOKS:
        if nb.number == number:
            return nb
    raise KeyError(f"no notebook {number!r} in the course")


def assigned() -> tuple[Notebook, ...]:
    """The notebooks a class is graded on by default (every notebook that has exercises)."""
    return tuple(nb for nb in NOTEBOOKS if nb.graded and nb.exercises)

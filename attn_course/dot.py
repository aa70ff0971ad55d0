"""Queries, keys and the dot product (notebook 01): the reference versions of what the learner builds.

* :func:`query_scores_loop` / :func:`query_scores` — one query against every key, first with a
  Python loop, then as one matrix–vector product;
* :func:`score_matrix` — every query against every key, ``Q Kᵀ``, batched over leading dimensions;
* :func:`cosine_scores` — the same comparison with the vectors' lengths divided out;
* :func:`worked_example` — the 4×8 ``Q``, ``K``, ``V`` of the course's running example (from the
  source article 003), and :data:`SOURCE_RAW_SCORES`, the (unscaled) scores that article prints for it;
* :func:`format_matrix` / :func:`print_matrix` — how every notebook prints a matrix;
* :func:`toy_sentence`, :func:`plot_retrieval`, :func:`plot_dot_vs_cosine` — the notebook's figures.

Shapes use ``d`` for the vector size (``d_k``), ``n_q`` queries and ``n_k`` keys; ``...`` stands for
any leading batch dimensions (batch, heads). The functions take tensors, return tensors and leave
their inputs unchanged.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import torch

from .plots import styled

__all__ = [
    "query_scores_loop",
    "query_scores",
    "score_matrix",
    "cosine_scores",
    "worked_example",
    "SOURCE_RAW_SCORES",
    "format_matrix",
    "print_matrix",
    "toy_sentence",
    "plot_retrieval",
    "plot_dot_vs_cosine",
]


def check_qk(q, K, q_name: str, k_name: str, *, one_query: bool = False) -> None:
    """q and K as tensors whose last axes (d) agree; K with at least 2 axes, (..., n_k, d)."""
    for name, x in ((q_name, q), (k_name, K)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, but you passed a {type(x).__name__}; "
                            "convert it with torch.as_tensor(...) first.")
    if K.dim() < 2 or q.dim() < 1 or (one_query and q.dim() != 1):
        want = f"{q_name} (d,)" if one_query else f"{q_name} (..., n_q, d)"
        raise ValueError(f"you need {want} and {k_name} (..., n_k, d), but you passed shapes {tuple(q.shape)} "
                         f"and {tuple(K.shape)}.")
    if q.shape[-1] != K.shape[-1]:
        raise ValueError(f"{q_name} has d = {q.shape[-1]} (shape {tuple(q.shape)}) but {k_name} has d = {K.shape[-1]} "
                         f"(shape {tuple(K.shape)}); queries and keys need the same last axis.")


def query_scores_loop(q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Scores of one query against each key, one dot product at a time (a Python loop).

    q: (d,)   K: (n_k, d)   ->   (n_k,) with entry j = q · K[j]
    """
    check_qk(q, K, "q", "K", one_query=True)
    scores = []
    for key in K:  # key: (d,)
        scores.append((q * key).sum())
    return torch.stack(scores)  # (n_k,)


def query_scores(q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Scores of one query against each key as a single matrix–vector product.

    q: (d,)   K: (n_k, d)   ->   (n_k,)
    """
    check_qk(q, K, "q", "K", one_query=True)
    return K @ q  # (n_k, d) @ (d,) -> (n_k,)


def score_matrix(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Every query against every key, unscaled: ``Q Kᵀ``, entry ``[..., i, j] = Q[..., i, :] · K[..., j, :]``.

    Q: (..., n_q, d)   K: (..., n_k, d)   ->   (..., n_q, n_k)
    """
    check_qk(Q, K, "Q", "K")
    return Q @ K.transpose(-2, -1)  # (..., n_q, d) @ (..., d, n_k) -> (..., n_q, n_k)


def cosine_scores(Q: torch.Tensor, K: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Cosine similarity of every query with every key: ``Q̂ K̂ᵀ`` with unit-length rows.

    Each row is divided by its length clamped below at ``eps``, ``max(‖x‖, eps)``: a zero vector gets
    similarity 0, not NaN (the convention of ``F.normalize`` and, in PyTorch 2.x,
    ``F.cosine_similarity``).

    Q: (..., n_q, d)   K: (..., n_k, d)   ->   (..., n_q, n_k), values in [-1, 1]
    """
    check_qk(Q, K, "Q", "K")
    if not (Q.is_floating_point() and K.is_floating_point()):
        raise TypeError(f"Q and K must be floating-point tensors (a length needs a square root), but you passed "
                        f"{Q.dtype} and {K.dtype}; convert them with .float().")
    Q_unit = Q / Q.norm(dim=-1, keepdim=True).clamp_min(eps)  # (..., n_q, d)
    K_unit = K / K.norm(dim=-1, keepdim=True).clamp_min(eps)  # (..., n_k, d)
    return score_matrix(Q_unit, K_unit)


# The 4×8 running example of source article 003: 4 positions, d_k = 8. These values are data,
# typed in from the article; every later step (scores, scaling, softmax, output) is computed.
_Q = [
    [0.5, 0.3, -0.2, 0.1, 0.4, -0.1, 0.2, 0.3],
    [-0.3, 0.6, 0.2, -0.4, 0.1, 0.5, -0.2, 0.1],
    [0.2, -0.1, 0.7, 0.3, -0.2, 0.4, 0.1, -0.3],
    [0.1, 0.4, -0.3, 0.8, 0.2, -0.1, 0.3, 0.2],
]
_K = [
    [0.4, 0.2, -0.3, 0.2, 0.5, -0.2, 0.1, 0.4],
    [-0.2, 0.7, 0.1, -0.3, 0.2, 0.4, -0.1, 0.2],
    [0.3, -0.2, 0.6, 0.4, -0.1, 0.3, 0.2, -0.4],
    [0.2, 0.3, -0.4, 0.7, 0.1, -0.2, 0.4, 0.1],
]
_V = [
    [0.6, 0.1, -0.4, 0.3, 0.2, -0.3, 0.4, 0.2],
    [-0.1, 0.8, 0.3, -0.2, 0.4, 0.2, -0.3, 0.1],
    [0.4, -0.3, 0.5, 0.2, -0.4, 0.6, 0.1, -0.2],
    [0.3, 0.2, -0.2, 0.9, 0.3, -0.1, 0.2, 0.4],
]

#: The (unscaled) scores Q Kᵀ as printed (two decimals) in source article 003, for comparison with what
#: :func:`score_matrix` recomputes from :func:`worked_example`.
SOURCE_RAW_SCORES = [
    [0.70, 0.14, -0.14, 0.51],
    [-0.17, 0.88, -0.19, -0.40],
    [-0.38, -0.08, 0.90, -0.15],
    [0.60, -0.00, 0.02, 1.00],
]


def worked_example(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The running example's queries, keys and values, each of shape (4, 8): 4 positions, d_k = 8."""
    return (torch.tensor(_Q, dtype=dtype), torch.tensor(_K, dtype=dtype), torch.tensor(_V, dtype=dtype))


def format_matrix(values, decimals: int = 2, labels: list[str] | None = None) -> str:
    """Text of a 1-D or 2-D tensor with a fixed number of decimals.

    A small negative number keeps its sign (-0.004 prints ``-0.00``, as ``print`` would), but a residue of
    rounding, far below the dtype's precision relative to the largest entry, prints as an exact 0: its sign
    depends on the order the machine's BLAS adds the products in, not on the maths.
    """
    t = torch.as_tensor(values).detach()
    finite = t[t.isfinite()].abs() if t.is_floating_point() else t.new_zeros(0)
    residue = 64 * torch.finfo(t.dtype).eps * finite.max().item() if finite.numel() else 0.0
    t = t.to(torch.float64)
    t = torch.where(t.abs() <= residue, torch.zeros_like(t), t)
    rows = t.reshape(1, -1) if t.ndim == 1 else t
    width = max(len(f"{v:.{decimals}f}") for v in rows.flatten().tolist()) + 1
    lines = []
    for i, row in enumerate(rows.tolist()):
        prefix = f"{labels[i]:>6} " if labels else ""
        lines.append(prefix + "".join(f"{v:{width}.{decimals}f}" for v in row))
    return "\n".join(lines)


def print_matrix(name: str, values, decimals: int = 2) -> None:
    """Print ``name`` and the shape, then the matrix with ``decimals`` decimals (how every notebook shows a matrix)."""
    print(f"{name}  shape {tuple(values.shape)}")
    print(format_matrix(values, decimals))


def toy_sentence() -> tuple[list[str], list[str], torch.Tensor]:
    """A tiny hand-made 'library' for the retrieval metaphor.

    Returns ``(tokens, features, keys)``: the six tokens of "the cat sat on the mat", the names of
    four readable features, and one key per token, shape (6, 4), saying how much each token *is*
    an animal, a place or object, an action, a small grammar word.
    """
    tokens = ["the", "cat", "sat", "on", "the ", "mat"]  # the second "the" gets a space to stay distinct
    features = ["animal", "place/object", "action", "grammar word"]
    keys = torch.tensor(
        [
            [0.0, 0.0, 0.0, 1.0],  # the
            [1.0, 0.2, 0.0, 0.0],  # cat
            [0.1, 0.0, 1.0, 0.0],  # sat
            [0.0, 0.3, 0.0, 0.8],  # on
            [0.0, 0.0, 0.0, 1.0],  # the
            [0.0, 1.0, 0.0, 0.1],  # mat
        ],
        dtype=torch.float64,
    )
    return tokens, features, keys


@styled
def plot_retrieval(tokens: Sequence[str], keys: torch.Tensor, questions: dict[str, torch.Tensor]) -> plt.Figure:
    """One bar chart per question: the score q · k of each token's key, the best match highlighted.

    keys: (n_tokens, d); each question is a query of shape (d,).
    """
    fig, axes = plt.subplots(1, len(questions), figsize=(9.6, 3.4), sharey=True, squeeze=False)
    for ax, (question, q) in zip(axes[0], questions.items()):
        scores = query_scores(q, keys)  # (n_tokens,)
        best = int(scores.argmax())
        ax.bar(range(len(tokens)), scores.tolist(), color=["C1" if j == best else "C0" for j in range(len(tokens))])
        ax.set_xticks(range(len(tokens)), [t.strip() for t in tokens])
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_title(question)
        ax.set_xlabel("key (word)")
    axes[0][0].set_ylabel("score q · k")
    fig.tight_layout()
    return fig


@styled
def plot_dot_vs_cosine(q: torch.Tensor, K: torch.Tensor, key_names: Sequence[str]) -> plt.Figure:
    """2-D arrows for one query (shape (2,)) and a few keys (shape (n, 2)), each key labelled with its dot
    product and its cosine with the query (in the legend, so that labels never overlap the arrows)."""
    dots, cosines = query_scores(q, K), cosine_scores(q[None], K)[0]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    vectors = [(q, "query", "black")] + [
        (k, f"key {name}: dot {float(d):.2f}, cosine {float(c):.2f}", f"C{j}")
        for j, (k, name, d, c) in enumerate(zip(K, key_names, dots, cosines))]
    for vec, label, colour in vectors:
        ax.quiver(0, 0, float(vec[0]), float(vec[1]), angles="xy", scale_units="xy", scale=1, color=colour,
                  width=0.012, label=label)
    top = max(float(K.max()), float(q.max())) + 0.3
    ax.set_xlim(-0.2, top)
    ax.set_ylim(-0.2, top)
    ax.set_aspect("equal")
    ax.set_title("The dot product rewards length, cosine does not")
    ax.set_xlabel("feature 1")
    ax.set_ylabel("feature 2")
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig

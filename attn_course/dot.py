"""Queries, keys and the dot product (notebook 01): the reference versions of what the learner builds.

* :func:`query_scores_loop` / :func:`query_scores` — one query against every key, first with a
  Python loop, then as one matrix–vector product;
* :func:`score_matrix` — every query against every key, ``Q Kᵀ``, batched over leading dimensions;
* :func:`cosine_scores` — the same comparison with the vectors' lengths divided out;
* :func:`worked_example` — the 4×8 ``Q``, ``K``, ``V`` of the course's running example (from the
  source article 003), and :data:`SOURCE_RAW_SCORES`, the raw scores that article prints for it.

Shapes use ``d`` for the vector size (``d_k``), ``n_q`` queries and ``n_k`` keys; ``...`` stands for
any leading batch dimensions (batch, heads).
"""

from __future__ import annotations

import torch

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
]


def query_scores_loop(q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Scores of one query against each key, one dot product at a time.

    q: (d,)   K: (n_k, d)   ->   (n_k,) with entry j = q · K[j]
    """
    scores = []
    for key in K:  # key: (d,)
        scores.append((q * key).sum())
    return torch.stack(scores)  # (n_k,)


def query_scores(q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Scores of one query against each key as a single matrix–vector product.

    q: (d,)   K: (n_k, d)   ->   (n_k,)
    """
    return K @ q  # (n_k, d) @ (d,) -> (n_k,)


def score_matrix(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Every query against every key: ``S = Q Kᵀ``; ``S[..., i, j] = Q[..., i, :] · K[..., j, :]``.

    Q: (..., n_q, d)   K: (..., n_k, d)   ->   (..., n_q, n_k)
    """
    return Q @ K.transpose(-2, -1)  # (..., n_q, d) @ (..., d, n_k) -> (..., n_q, n_k)


def cosine_scores(Q: torch.Tensor, K: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Cosine similarity of every query with every key: ``Q̂ K̂ᵀ`` with unit-length rows.

    A zero vector has norm 0; its norms are clamped at ``eps`` so its similarities are 0, not NaN
    (the convention of ``torch.nn.functional.cosine_similarity``).

    Q: (..., n_q, d)   K: (..., n_k, d)   ->   (..., n_q, n_k), values in [-1, 1]
    """
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

#: The raw scores Q Kᵀ as printed (two decimals) in source article 003, for comparison with what
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
    """Text of a 1-D or 2-D tensor with a fixed number of decimals (``-0.00`` kept, as printed in print)."""
    t = torch.as_tensor(values).detach().to(torch.float64)
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

"""Notebook 05's 12 attention cases and their oracle F.scaled_dot_product_attention (the weights: its output, V = I)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Case:
    name: str
    Q: torch.Tensor
    K: torch.Tensor
    V: torch.Tensor
    mask: torch.Tensor | None
    atol: float
    large: bool = False  # scores so large that only a stable, -inf-masked softmax gets them right

    @property
    def args(self) -> tuple:
        return self.Q, self.K, self.V, self.mask

    @property
    def scaled(self) -> torch.Tensor:
        return scaled_scores(self.Q, self.K)

    @property
    def allowed(self) -> torch.Tensor:  # (..., n_q, n_k): True where query i may attend to key j
        return torch.broadcast_to(torch.tensor(True) if self.mask is None else self.mask, self.scaled.shape)


def scaled_scores(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    return Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])


def oracle(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    Q, K, V, mask = case.args
    eye = torch.eye(K.shape[-2], dtype=Q.dtype).expand(*K.shape[:-2], K.shape[-2], K.shape[-2])
    return tuple(F.scaled_dot_product_attention(Q, K, values, attn_mask=mask) for values in (V, eye))


def _large(wanted: list[list[float]], keep: list[list[bool]], V: torch.Tensor, name: str, large: bool) -> Case:
    """A case whose scaled scores are exactly ``wanted`` (K = I, so Q Kᵀ / √d_k = Q / 2 with d_k = 4)."""
    return Case(name, 2 * torch.tensor(wanted, dtype=torch.float64), torch.eye(4, dtype=torch.float64), V,
                torch.tensor(keep), atol=1e-7, large=large)


def attention_cases() -> list[Case]:
    from ...dot import worked_example

    g = torch.Generator().manual_seed(5)

    def rand(*shape, dtype=torch.float64):
        return torch.randn(*shape, generator=g, dtype=dtype)

    Q, K, V = worked_example()
    f32, causal4 = torch.float32, torch.ones(4, 4, dtype=torch.bool).tril()
    keep = torch.rand(4, 6, generator=g) < 0.5  # (4, 6) with at least one True and one False in every row
    for i in range(4):
        j, k = torch.randperm(6, generator=g)[:2].tolist()
        keep[i, j], keep[i, k] = True, False
    key_padding = torch.tensor([[True, True, True, False, False], [False, False, True, True, True],
                                [True] * 5])[:, None, None, :]  # (3, 1, 1, 5): right, left and no padding
    per_batch = causal4 & (torch.arange(4) < torch.tensor([4, 2])[:, None])[:, None, None, :]  # (2, 1, 4, 4)
    return [
        Case("the 4×8 worked example, no mask", Q, K, V, None, atol=1e-7),
        Case("the 4×8 worked example with a causal (4, 4) mask", Q, K, V, causal4, atol=1e-7),
        Case("a batch of 2 in float32, n_q = 5, n_k = 7, d_k = 6, d_v = 3",
             rand(2, 5, 6, dtype=f32), rand(2, 7, 6, dtype=f32), rand(2, 7, 3, dtype=f32), None, atol=2e-5),
        Case("batch × heads (2, 3), n_q = 4, n_k = 6, d_k = 16, d_v = 5, with a (4, 6) mask",
             rand(2, 3, 4, 16), rand(2, 3, 6, 16), rand(2, 3, 6, 5), keep, atol=1e-7),
        Case("a causal (6, 6) mask on a batch of 2", rand(2, 6, 8), rand(2, 6, 8), rand(2, 6, 8),
             torch.ones(6, 6, dtype=torch.bool).tril(), atol=1e-7),
        Case("a key-padding mask (3, 1, 1, 5) (right, left and no padding) over 4 heads and 3 queries",
             rand(3, 4, 3, 8), rand(3, 4, 5, 8), rand(3, 4, 5, 2), key_padding, atol=1e-7),
        Case("a (2, 1, 4, 4) causal-and-padding mask over 2 heads", rand(2, 2, 4, 3), rand(2, 2, 4, 3),
             rand(2, 2, 4, 6), per_batch, atol=1e-7),
        Case("a 1-D mask (5,) for every query of a batch of 2", rand(2, 3, 4), rand(2, 5, 4), rand(2, 5, 4),
             torch.tensor([True, False, True, False, True]), atol=1e-7),
        Case("one query (batch 1, 1 head, n_q = 1, d_v = 1) in float32 with a (1, 6) mask",
             rand(1, 1, 1, 8, dtype=f32), rand(1, 1, 6, 8, dtype=f32), rand(1, 1, 6, 1, dtype=f32),
             torch.tensor([[True, True, False, True, False, True]]), atol=2e-5),
        Case("a single key (n_k = 1)", rand(3, 4), rand(1, 4), rand(1, 2), None, atol=1e-7),
        # Kept scores near +1000: e^1000 overflows; the last row, 2000 below, underflows under a global maximum;
        # row 0 also keeps -50, so a shift by the row's minimum (e^1053) overflows too.
        _large([[1000.0, 990.0, 1003.0, -50.0], [-40.0, 1002.0, 995.0, 1001.0], [-999.0, -1000.0, -1000.5, -998.0]],
               [[True, False, True, True], [False, True, False, True], [True, True, True, True]],
               rand(4, 3), "large scores (about ±1000) with a mask", large=False),
        # Kept scores near -20000, blocked ones up to +30000: a finite fill weaker than about -1e5 leaks, and a
        # softmax over all keys gives the kept ones weight 0 (0/0 when renormalised).
        _large([[-20000.0, 30000.0, -20001.5, 0.0], [30000.0, -20000.7, -5000.0, -20000.0],
                [-20002.0, -20000.0, 30000.0, -5000.0]],
               [[True, False, True, False], [False, True, False, True], [True, True, False, False]],
               rand(4, 3), "large scores (±3·10⁴) with a mask", large=True),
    ]

"""Beyond softmax (notebook 13): linear attention (non-causal, and causal three ways: a recurrence, a
masked quadratic form, chunkwise), a decay γ, positive random features for exp(q·k) (Performer's
FAVOR+), block-sparse attention on a BigBird layout built on notebook 09's tiles, an associative-recall
toy task with tiny models trained in seconds, and the notebook's figures.

Notation (docs/notation.md): q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v); φ a feature map
with n_f features, φ(q) (..., n_q, n_f); the recurrent state C_t (..., n_f, d_v) and normaliser u_t (..., n_f)
(the scores S of the other notebooks never appear here, so the state gets a letter of its own); γ the
decay; n_c the chunk length; Ω (n_f, d_k) the random projection; a block layout is a bool
(n_q blocks, n_k blocks) matrix, True = the tile is computed.

* Kernel attention replaces exp(q·k/√d_k) by φ(q)·φ(k): out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j).
  The sums do not depend on i, so they are computed once: O(n·n_f·d_v) instead of O(n²·d) (Katharopoulos,
  Vyas, Pappas and Fleuret 2020, *Transformers are RNNs*).
* Causal: the sums run over j ≤ i, C_t = γ C_{t−1} + φ(k_t) v_tᵀ, u_t = γ u_{t−1} + φ(k_t); the same as
  the masked quadratic form (φ(q) φ(k)ᵀ ⊙ D) v with D_ij = γ^{i−j} for j ≤ i (Sun et al. 2023, *RetNet*).
* FAVOR+ (Choromanski et al. 2021, *Rethinking Attention with Performers*): φ(x) = exp(Ω x − |x|²/2)/√n_f
  with Ω's rows ω ~ N(0, I) gives E[φ(x)·φ(y)] = exp(x·y).
* BigBird (Zaheer et al. 2020): blocks of a sliding window, global blocks and random blocks.

``tests/test_beyond.py`` checks everything here against ``F.scaled_dot_product_attention`` and dense
masked quadratic forms in float64.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import check_qkv
from .masks import check_size
from .plots import MAX_WIDTH, styled

__all__ = [
    "elu_feature_map",
    "kernel_attention",
    "linear_attention",
    "decay_mask",
    "quadratic_linear_attention",
    "causal_linear_attention",
    "chunked_linear_attention",
    "random_projection",
    "positive_random_features",
    "performer_attention",
    "bigbird_parts",
    "bigbird_layout",
    "layout_mask",
    "block_sparse_attention",
    "block_sparse_flops",
    "recall_batch",
    "RecallModel",
    "train_recall",
    "recall_accuracy",
    "plot_crossover",
    "plot_decay",
    "plot_feature_error",
    "plot_layout",
    "plot_sparse_cost",
    "plot_recall",
]

Tensor = torch.Tensor
FeatureMap = Callable[[Tensor], Tensor]


def _check_causal(q, k, v) -> None:
    """Causal linear attention: q, k, v as :func:`check_qkv` wants them, and one query per key (n_q = n_k)."""
    check_qkv(q, k, v, "q, k, v", arrays=False)
    if q.dim() < 2 or q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal linear attention needs one query per key, q (..., n, d_k) and k (..., n, d_k), "
                         f"but you passed q {tuple(q.shape)} and k {tuple(k.shape)}.")


# ============================================================================ linear attention
def elu_feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1, entry by entry: (..., n, d) → (..., n, d) (Katharopoulos et al.): x + 1 for x > 0,
    exp(x) for x ≤ 0, so positive (it rounds to 0 only where exp(x) − 1 rounds to −1: x below about −37 in
    float64)."""
    return F.elu(x) + 1.0


def kernel_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor) -> Tensor:
    """Non-causal attention with the kernel φ(q)·φ(k), from the features themselves.

    phi_q (..., n_q, n_f), phi_k (..., n_k, n_f), v (..., n_k, d_v) → (..., n_q, d_v):
    out_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / φ(q_i)ᵀ (Σ_j φ(k_j)). No (n_q, n_k) matrix is formed.
    """
    kv = phi_k.transpose(-2, -1) @ v  # (..., n_f, d_v): Σ_j φ(k_j) v_jᵀ, once for every query
    u = phi_k.sum(dim=-2, keepdim=True).transpose(-2, -1)  # (..., n_f, 1): Σ_j φ(k_j)
    return (phi_q @ kv) / (phi_q @ u)  # (..., n_q, d_v) / (..., n_q, 1)


def linear_attention(q: Tensor, k: Tensor, v: Tensor, feature_map: FeatureMap = elu_feature_map) -> Tensor:
    """Non-causal linear attention: q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v) → (..., n_q, d_v).

    Softmax's exp(q·k/√d_k) replaced by φ(q)·φ(k) (default φ = elu + 1): time O(n·d_k·d_v), memory O(d_k·d_v)
    besides inputs and output."""
    check_qkv(q, k, v, "q, k, v", arrays=False)
    return kernel_attention(feature_map(q), feature_map(k), v)


def decay_mask(n: int, gamma: float = 1.0, *, dtype: torch.dtype = torch.float64) -> Tensor:
    """(n, n) matrix D with D_ij = γ^{i−j} for j ≤ i and 0 above the diagonal (γ = 1: the causal mask as 0/1)."""
    n = check_size(n, "n")
    i = torch.arange(n)[:, None]  # (n, 1)
    j = torch.arange(n)[None, :]  # (1, n)
    power = (i - j).clamp(min=0).to(dtype)  # (n, n)
    return torch.where(j <= i, torch.as_tensor(gamma, dtype=dtype) ** power, torch.zeros((), dtype=dtype))


def quadratic_linear_attention(q: Tensor, k: Tensor, v: Tensor, feature_map: FeatureMap = elu_feature_map,
                               gamma: float = 1.0) -> Tensor:
    """Causal linear attention as a masked quadratic form: q, k (..., n, d_k), v (..., n, d_v) → (..., n, d_v).

    A = (φ(q) φ(k)ᵀ) ⊙ D with D = :func:`decay_mask` (n, n); out = A v / rowsum(A). O(n²) like softmax
    attention, and the easiest form to read."""
    _check_causal(q, k, v)
    a = feature_map(q) @ feature_map(k).transpose(-2, -1)  # (..., n, n)
    a = a * decay_mask(q.shape[-2], gamma, dtype=a.dtype)
    return (a @ v) / a.sum(dim=-1, keepdim=True)


def causal_linear_attention(q: Tensor, k: Tensor, v: Tensor, feature_map: FeatureMap = elu_feature_map,
                            gamma: float = 1.0) -> Tensor:
    """Causal linear attention as a recurrence, one token at a time: an RNN whose state is a matrix.

    q, k (..., n, d_k), v (..., n, d_v) → (..., n, d_v). With φ = ``feature_map`` (n_f features):
    C_t = γ C_{t−1} + φ(k_t) v_tᵀ  (..., n_f, d_v),  u_t = γ u_{t−1} + φ(k_t)  (..., n_f),
    out_t = φ(q_t)ᵀ C_t / φ(q_t)ᵀ u_t. The state's size does not grow with t (a KV cache does)."""
    _check_causal(q, k, v)
    phi_q, phi_k = feature_map(q), feature_map(k)  # (..., n, n_f) each
    lead, n, r = phi_q.shape[:-2], phi_q.shape[-2], phi_q.shape[-1]
    state = torch.zeros(lead + (r, v.shape[-1]), dtype=v.dtype)  # (..., n_f, d_v)
    norm = torch.zeros(lead + (r,), dtype=v.dtype)  # (..., n_f)
    out = torch.empty(lead + (n, v.shape[-1]), dtype=v.dtype)  # (..., n, d_v)
    for t in range(n):
        state = gamma * state + phi_k[..., t, :, None] * v[..., t, None, :]  # outer product φ(k_t) v_tᵀ
        norm = gamma * norm + phi_k[..., t, :]
        numerator = (phi_q[..., t, None, :] @ state)[..., 0, :]  # (..., d_v)
        out[..., t, :] = numerator / (phi_q[..., t, :] * norm).sum(dim=-1, keepdim=True)
    return out


def chunked_linear_attention(q: Tensor, k: Tensor, v: Tensor, chunk_size: int,
                             feature_map: FeatureMap = elu_feature_map, gamma: float = 1.0) -> Tensor:
    """Causal linear attention chunk by chunk: the quadratic form inside a chunk, the recurrent state across.

    q, k (..., n, d_k), v (..., n, d_v) → (..., n, d_v); chunks of ``chunk_size`` = n_c positions (the last
    may be shorter). For the chunk [s, e) with state C, u from the positions before s, query s + i gets
    numerator (A v)_i + γ^{i+1} φ(q)ᵀ C and normaliser rowsum(A)_i + γ^{i+1} φ(q)ᵀ u, where A is the
    chunk's masked quadratic form; then C ← γ^{e−s} C + Σ_j γ^{e−1−j} φ(k_j) v_jᵀ over the chunk (u alike).
    Work O(n·n_c·d + n·n_f·d_v): matrix products of size n_c instead of one token at a time."""
    check_size(chunk_size, "chunk_size", positive=True)
    _check_causal(q, k, v)
    phi_q, phi_k = feature_map(q), feature_map(k)  # (..., n, n_f) each
    lead, n, r = phi_q.shape[:-2], phi_q.shape[-2], phi_q.shape[-1]
    state = torch.zeros(lead + (r, v.shape[-1]), dtype=v.dtype)  # (..., n_f, d_v)
    norm = torch.zeros(lead + (r, 1), dtype=v.dtype)  # (..., n_f, 1)
    out = torch.empty(lead + (n, v.shape[-1]), dtype=v.dtype)  # (..., n, d_v)
    for s in range(0, n, chunk_size):
        fq, fk, vc = phi_q[..., s:s + chunk_size, :], phi_k[..., s:s + chunk_size, :], v[..., s:s + chunk_size, :]
        c = fq.shape[-2]  # this chunk's length
        a = (fq @ fk.transpose(-2, -1)) * decay_mask(c, gamma, dtype=fq.dtype)  # (..., c, c)
        carried = torch.as_tensor(gamma, dtype=fq.dtype) ** torch.arange(1, c + 1, dtype=fq.dtype)[:, None]  # (c, 1)
        numerator = a @ vc + carried * (fq @ state)  # (..., c, d_v)
        normaliser = a.sum(dim=-1, keepdim=True) + carried * (fq @ norm)  # (..., c, 1)
        out[..., s:s + c, :] = numerator / normaliser
        age = torch.as_tensor(gamma, dtype=fq.dtype) ** torch.arange(c - 1, -1, -1, dtype=fq.dtype)[:, None]  # (c, 1)
        state = gamma ** c * state + (fk * age).transpose(-2, -1) @ vc  # (..., n_f, d_v)
        norm = gamma ** c * norm + (fk * age).sum(dim=-2)[..., None]  # (..., n_f, 1)
    return out


# ============================================================================ random features
def random_projection(r: int, d: int, *, generator: torch.Generator | None = None, orthogonal: bool = False,
                      dtype: torch.dtype = torch.float64) -> Tensor:
    """Ω (n_f, d): n_f rows ω ~ N(0, I_d). ``orthogonal``: rows orthogonal in blocks of d (QR of a Gaussian
    matrix), each rescaled to the length of a Gaussian vector, so every row is still N(0, I_d)-distributed
    but the estimate has less variance (Performer's orthogonal random features)."""
    if not orthogonal:
        return torch.randn(r, d, generator=generator, dtype=dtype)
    blocks = []
    for _ in range(-(-r // d)):
        square = torch.randn(d, d, generator=generator, dtype=dtype)
        blocks.append(torch.linalg.qr(square).Q.T)  # (d, d): orthonormal rows
    lengths = torch.randn(r, d, generator=generator, dtype=dtype).norm(dim=-1, keepdim=True)  # (n_f, 1): χ_d
    return torch.cat(blocks)[:r] * lengths


def positive_random_features(x: Tensor, omega: Tensor) -> Tensor:
    """FAVOR+'s positive random features: x (..., n, d), Ω (n_f, d) → (..., n, n_f),
    φ(x)_i = exp(ω_i·x − |x|²/2) / √n_f, so that E[φ(x)·φ(y)] = exp(x·y) when ω_i ~ N(0, I)."""
    r = omega.shape[0]
    projected = x @ omega.transpose(-2, -1)  # (..., n, n_f): ω_i·x
    half_norm = (x * x).sum(dim=-1, keepdim=True) / 2  # (..., n, 1): |x|²/2
    return torch.exp(projected - half_norm) / math.sqrt(r)


def performer_attention(q: Tensor, k: Tensor, v: Tensor, omega: Tensor) -> Tensor:
    """Softmax attention estimated with positive random features: q (..., n_q, d_k), k (..., n_k, d_k),
    v (..., n_k, d_v), Ω (n_f, d_k) → (..., n_q, d_v), in O(n·n_f·d).

    q and k are scaled by d_k^(−1/4) each, so that φ(q)·φ(k) estimates exp(q·k/√d_k). Numerically stable:
    the exponents are shifted by each query's own maximum and by one maximum over all keys before exp;
    both shifts multiply a whole row of the numerator and of the normaliser alike, so they cancel."""
    check_qkv(q, k, v, "q, k, v", arrays=False)
    if not isinstance(omega, torch.Tensor) or omega.dim() != 2 or omega.shape[-1] != q.shape[-1]:
        shape = tuple(omega.shape) if isinstance(omega, torch.Tensor) else type(omega).__name__
        raise ValueError(f"omega must be a (n_f, d_k) tensor with d_k = {q.shape[-1]} (q's last axis), but you "
                         f"passed {shape}; draw it with random_projection(n_f, {q.shape[-1]}).")
    scale = q.shape[-1] ** -0.25
    qs, ks = q * scale, k * scale
    log_q = qs @ omega.transpose(-2, -1) - (qs * qs).sum(dim=-1, keepdim=True) / 2  # (..., n_q, n_f)
    log_k = ks @ omega.transpose(-2, -1) - (ks * ks).sum(dim=-1, keepdim=True) / 2  # (..., n_k, n_f)
    phi_q = torch.exp(log_q - log_q.amax(dim=-1, keepdim=True))  # one factor per query: cancels
    phi_k = torch.exp(log_k - log_k.amax(dim=(-2, -1), keepdim=True))  # one factor for all keys: cancels
    return kernel_attention(phi_q, phi_k, v)


# ============================================================================ block-sparse attention
def bigbird_parts(n_blocks: int, *, window: int = 1, n_global: int = 1, n_random: int = 1,
                  generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """BigBird's three kinds of block, each a bool (n_blocks, n_blocks) layout (rows: query blocks).

    ``window``: query block i sees key blocks i − window … i + window; ``global``: the first ``n_global``
    blocks see every block and are seen by every block; ``random``: each other query block also sees
    ``n_random`` key blocks drawn (with ``generator``) among those the window and the globals leave out."""
    i = torch.arange(n_blocks)[:, None]
    j = torch.arange(n_blocks)[None, :]
    local = (i - j).abs() <= window  # (n_blocks, n_blocks): a band
    glob = (i < n_global) | (j < n_global)  # global rows and columns
    rand = torch.zeros(n_blocks, n_blocks, dtype=torch.bool)
    for row in range(n_global, n_blocks):
        free = (~(local[row] | glob[row])).nonzero().flatten()  # key blocks not yet seen by this row
        pick = free[torch.randperm(free.numel(), generator=generator)[:n_random]]
        rand[row, pick] = True
    return {"window": local, "global": glob, "random": rand}


def bigbird_layout(n_blocks: int, *, window: int = 1, n_global: int = 1, n_random: int = 1,
                   generator: torch.Generator | None = None) -> Tensor:
    """The union of :func:`bigbird_parts`: bool (n_blocks, n_blocks), True = the tile is computed."""
    parts = bigbird_parts(n_blocks, window=window, n_global=n_global, n_random=n_random, generator=generator)
    return parts["window"] | parts["global"] | parts["random"]


def layout_mask(layout: Tensor, block_size: int, n_q: int, n_k: int) -> Tensor:
    """The element-wise bool mask (n_q, n_k) of a block layout (⌈n_q/b⌉, ⌈n_k/b⌉): every entry of a tile
    takes its tile's value (the last row and column of tiles may be cut short)."""
    rows = layout.repeat_interleave(block_size, dim=0)[:n_q]  # (n_q, n_k blocks)
    return rows.repeat_interleave(block_size, dim=1)[:, :n_k]  # (n_q, n_k)


def block_sparse_attention(q: Tensor, k: Tensor, v: Tensor, layout: Tensor, block_size: int, *,
                           scale: float | None = None) -> Tensor:
    """Attention that computes only the tiles a block layout allows: notebook 09's tiled loop, skipping.

    q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v), layout bool (⌈n_q/b⌉, ⌈n_k/b⌉) with at least one
    True per row → (..., n_q, d_v): softmax(q kᵀ · scale) v with the keys of skipped tiles left out, i.e.
    F.scaled_dot_product_attention with :func:`layout_mask`. Each query block keeps 09's running max m, sum
    ℓ and accumulator over its allowed key blocks only."""
    check_qkv(q, k, v, "q, k, v", arrays=False)
    check_size(block_size, "block_size", positive=True)
    if q.dim() < 2:
        raise ValueError(f"q must have at least 2 axes, (..., n_q, d_k), but you passed shape {tuple(q.shape)}.")
    blocks = (-(-q.shape[-2] // block_size), -(-k.shape[-2] // block_size))
    if not isinstance(layout, torch.Tensor) or layout.dtype != torch.bool or tuple(layout.shape) != blocks:
        got = f"{tuple(layout.shape)} {layout.dtype}" if isinstance(layout, torch.Tensor) else type(layout).__name__
        raise ValueError(f"layout must be a bool tensor of shape (⌈n_q/b⌉, ⌈n_k/b⌉) = {blocks} for n_q = "
                         f"{q.shape[-2]}, n_k = {k.shape[-2]} and block_size = {block_size}, but you passed {got}.")
    if layout.numel() and not bool(layout.any(dim=-1).all()):
        empty = (~layout.any(dim=-1)).nonzero().flatten().tolist()
        raise ValueError(f"layout rows {empty} have no True entry, so those query blocks would attend to nothing; "
                         "you need at least one True per row.")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    n_q = q.shape[-2]
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)  # (..., n_q, d_v)
    for qb in range(layout.shape[0]):
        q_blk = q[..., qb * block_size:(qb + 1) * block_size, :] * scale  # (..., b_q, d_k)
        m = torch.full(q_blk.shape[:-1] + (1,), -math.inf, dtype=q.dtype)  # (..., b_q, 1)
        l = torch.zeros_like(m)
        acc = torch.zeros(q_blk.shape[:-1] + (v.shape[-1],), dtype=q.dtype)  # (..., b_q, d_v)
        for kb in layout[qb].nonzero().flatten().tolist():  # only the tiles the layout keeps
            k_blk = k[..., kb * block_size:(kb + 1) * block_size, :]  # (..., b_k, d_k)
            s = q_blk @ k_blk.transpose(-2, -1)  # (..., b_q, b_k)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            correction = torch.exp(m - m_new)
            l = l * correction + p.sum(dim=-1, keepdim=True)
            acc = acc * correction + p @ v[..., kb * block_size:(kb + 1) * block_size, :]
            m = m_new
        out[..., qb * block_size:min((qb + 1) * block_size, n_q), :] = acc / l
    return out


def block_sparse_flops(layout: Tensor, block_size: int, n_q: int, n_k: int, d_k: int, d_v: int) -> float:
    """Matrix-multiply FLOPs of :func:`block_sparse_attention`: 2·b_q·b_k·(d_k + d_v) per computed tile (q kᵀ
    and p v), the last row and column of tiles counted at their real size. Dense attention is the all-True
    layout: 2·n_q·n_k·(d_k + d_v)."""
    rows = torch.tensor([min(block_size, n_q - s) for s in range(0, n_q, block_size)], dtype=torch.float64)
    cols = torch.tensor([min(block_size, n_k - s) for s in range(0, n_k, block_size)], dtype=torch.float64)
    sizes = rows[:, None] * cols[None, :]  # (q blocks, k blocks): entries per tile
    return float(2.0 * (d_k + d_v) * (sizes * layout.to(torch.float64)).sum())


# ============================================================================ associative recall
def recall_batch(batch: int, n_pairs: int, n_symbols: int, generator: torch.Generator) -> tuple[Tensor, ...]:
    """A batch of the recall task: ``n_pairs`` distinct keys with a value each, then one of the keys again.

    Returns keys (batch, n_pairs), values (batch, n_pairs), query (batch,), target (batch,): the query is
    one of the keys, drawn uniformly; the target is its value. Symbols are 0 … n_symbols − 1."""
    keys = torch.argsort(torch.rand(batch, n_symbols, generator=generator), dim=-1)[:, :n_pairs]  # distinct
    values = torch.randint(n_symbols, (batch, n_pairs), generator=generator)
    which = torch.randint(n_pairs, (batch,), generator=generator)
    rows = torch.arange(batch)
    return keys, values, keys[rows, which], values[rows, which]


class RecallModel(nn.Module):
    """One attention layer that must look a value up: each pair is one token, embedding(key) +
    embedding(value) (n_pairs, d); the query token is embedding(query key) (1, d). One head of width d,
    softmax (``kind="softmax"``) or linear attention with φ = elu + 1 (``kind="linear"``, a d × d state),
    then a linear read-out to the symbols."""

    def __init__(self, n_symbols: int, d: int, kind: str):
        super().__init__()
        if kind not in ("softmax", "linear"):
            raise ValueError(f"kind must be 'softmax' or 'linear', got {kind!r}")
        self.kind = kind
        self.key_embedding = nn.Embedding(n_symbols, d)
        self.value_embedding = nn.Embedding(n_symbols, d)
        self.w_q, self.w_k, self.w_v = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.read_out = nn.Linear(d, n_symbols)

    def forward(self, keys: Tensor, values: Tensor, query: Tensor) -> Tensor:
        """keys, values (B, n_pairs), query (B,) → logits (B, n_symbols)."""
        pairs = self.key_embedding(keys) + self.value_embedding(values)  # (B, n_pairs, d)
        asking = self.key_embedding(query)[:, None, :]  # (B, 1, d)
        q, k, v = self.w_q(asking), self.w_k(pairs), self.w_v(pairs)
        if self.kind == "softmax":
            weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)  # (B, 1, n_pairs)
            out = weights @ v  # (B, 1, d)
        else:
            out = linear_attention(q, k, v)  # (B, 1, d): through a d × d state
        return self.read_out(out[:, 0, :])


def train_recall(kind: str, pair_counts: Sequence[int], *, n_symbols: int = 32, d: int = 16, steps: int = 200,
                 batch: int = 32, lr: float = 1e-2, seed: int = 0, progress: bool = False) -> RecallModel:
    """Train a :class:`RecallModel` with Adam on batches whose number of pairs cycles through ``pair_counts``.

    Runs on one thread (restored afterwards): on tensors this small, more threads only add waiting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(kind, pair_counts, n_symbols, d, steps, batch, lr, seed, progress)
    finally:
        torch.set_num_threads(threads)


def _train(kind: str, pair_counts: Sequence[int], n_symbols: int, d: int, steps: int, batch: int, lr: float,
           seed: int, progress: bool) -> RecallModel:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = RecallModel(n_symbols, d, kind)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    steps_iter = range(steps)
    if progress:
        from tqdm.auto import tqdm

        steps_iter = tqdm(steps_iter, desc=f"training ({kind})")
    for step in steps_iter:
        keys, values, query, target = recall_batch(batch, pair_counts[step % len(pair_counts)], n_symbols, generator)
        loss = F.cross_entropy(model(keys, values, query), target)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return model


@torch.no_grad()
def recall_accuracy(model: RecallModel, n_pairs: int, *, n: int = 1000, seed: int = 999) -> float:
    """Share of ``n`` fresh recall questions with ``n_pairs`` pairs that ``model`` answers right."""
    generator = torch.Generator().manual_seed(seed)
    keys, values, query, target = recall_batch(n, n_pairs, model.read_out.out_features, generator)
    return float((model(keys, values, query).argmax(dim=-1) == target).to(torch.float64).mean())


# ============================================================================ figures
@styled
def plot_crossover(ns: Sequence[int], times: Mapping[str, Sequence[float]],
                   memory: Mapping[str, Sequence[float]], memory_ns: Sequence[int] | None = None) -> plt.Figure:
    """Time (ms) and peak memory (MiB) against n, log–log, one line per method (memory measured at
    ``memory_ns``, by default at every n)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.4, 3.8))
    for name, ys in times.items():
        left.plot(ns, ys, marker="o", label=name)
    for name, ys in memory.items():
        right.plot(ns if memory_ns is None else memory_ns, ys, marker="o", label=name)
    for ax, label in ((left, "time (ms)"), (right, "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


@styled
def plot_decay(n: int, gammas: Sequence[float]) -> plt.Figure:
    """:func:`decay_mask` (n, n) for each γ, side by side."""
    fig, axes = plt.subplots(1, len(gammas), figsize=(min(MAX_WIDTH, 3.0 * len(gammas)), 3.2))
    for ax, gamma in zip(np.atleast_1d(axes), gammas):
        ax.imshow(decay_mask(n, gamma).numpy(), cmap="viridis", vmin=0, vmax=1)
        ax.set_title(f"γ = {gamma:g}")
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
    fig.tight_layout()
    return fig


@styled
def plot_feature_error(features: Sequence[int], by_features: Mapping[str, Sequence[float]],
                       scales: Sequence[float], by_scale: Mapping[str, Sequence[float]]) -> plt.Figure:
    """Relative error of random-feature attention against the number of features r (left) and against the
    scale of the scores (right), log axes."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.4, 3.8))
    for name, ys in by_features.items():
        left.plot(features, ys, marker="o", label=name)
    left.set_xscale("log", base=2)
    left.set_xlabel("number of random features n_f")
    for name, ys in by_scale.items():
        right.plot(scales, ys, marker="o", label=name)
    right.set_xlabel("score scale (q and k multiplied by it)")
    for ax in (left, right):
        ax.set_yscale("log")
        ax.set_ylabel("relative error of the output")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


@styled
def plot_layout(parts: Mapping[str, Tensor]) -> plt.Figure:
    """A block layout coloured by kind (window, global, random): one cell per tile, white = skipped."""
    names = list(parts)
    n = next(iter(parts.values())).shape[0]
    grid = np.zeros((n, n))
    for value, name in enumerate(names, start=1):
        grid[(parts[name].numpy()) & (grid == 0)] = value
    fig, ax = plt.subplots(figsize=(5.6, 4.6))
    colours = ["white", "#4c72b0", "#dd8452", "#55a868", "#c44e52"][:len(names) + 1]
    cmap = _listed(colours)
    ax.imshow(grid, cmap=cmap, vmin=0, vmax=len(names))
    ax.set_xlabel("key block")
    ax.set_ylabel("query block")
    kept = int((grid > 0).sum())
    ax.set_title(f"{kept} of {n * n} tiles computed")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=colours[i + 1], label=name) for i, name in enumerate(names)],
              loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    return fig


def _listed(colours: Sequence[str]):
    """A listed colour map (one colour per integer value)."""
    from matplotlib.colors import ListedColormap

    return ListedColormap(list(colours))


@styled
def plot_sparse_cost(density: Sequence[float], flop_ratio: Sequence[float],
                     speedup: Sequence[float] | None = None) -> plt.Figure:
    """Block-sparse against dense: the FLOP ratio (dense / sparse) and, if given, the measured speed-up,
    against the share of tiles computed."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(density, flop_ratio, "--", marker="o", label="FLOPs saved (dense / sparse)")
    if speedup is not None:
        ax.plot(density, speedup, marker="s", label="measured speed-up (dense loop / sparse loop)")
    ax.set_xlabel("share of tiles computed")
    ax.set_ylabel("× faster than dense")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


@styled
def plot_recall(pair_counts: Sequence[int], accuracy: Mapping[str, Sequence[float]], *, d: int,
                n_symbols: int) -> plt.Figure:
    """Recall accuracy against the number of key–value pairs, one line per model, with chance level."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, ys in accuracy.items():
        ax.plot(pair_counts, ys, marker="o", label=name)
    ax.axhline(1 / n_symbols, ls=":", color="grey", label=f"chance (1 / {n_symbols})")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("key–value pairs in the context")
    ax.set_ylabel("accuracy")
    ax.set_title(f"Associative recall, one head of width d = {d}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig

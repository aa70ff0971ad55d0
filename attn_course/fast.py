"""Fast attention in plain PyTorch: the online softmax, the tiled (FlashAttention-2) forward pass and
its causal version with block skipping, a naive reference, and the cost model used to judge them.

Every function takes tensors shaped ``(..., N, D)`` (any leading batch/head dimensions) and works
for any block size, including sequence lengths that are not a multiple of the block. The tiled
functions never hold more than one ``(block, block)`` tile of scores per leading index, so their
extra memory grows like ``N·D`` instead of ``N²``.

These are the course's reference implementations (notebook 09); ``tests/test_fast.py`` checks
them against ``torch.softmax`` and ``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "naive_attention",
    "online_softmax",
    "tiled_attention",
    "causal_tiled_attention",
    "attention_flops",
    "score_elements",
    "score_bytes",
    "max_naive_length",
    "BYTES_PER_ELEMENT",
]

BYTES_PER_ELEMENT = {torch.float64: 8, torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scale) v, materialising the whole score matrix.

    q: (..., N, D), k: (..., M, D), v: (..., M, Dv) → (..., N, Dv). ``scale`` defaults to 1/√D.
    With ``causal=True`` query i sees keys 0..i (queries and keys aligned at the start, N == M).
    The score matrix (..., N, M) is what runs out of memory for long sequences.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., N, M)
    if causal:
        n, m = scores.shape[-2:]
        future = torch.ones(n, m, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def online_softmax(x: torch.Tensor, block_size: int = 1) -> torch.Tensor:
    """Softmax along the last axis, reading ``x`` once in blocks while keeping a running max and sum.

    x: (..., n) → (..., n). The normaliser (max m and sum l = Σ exp(x - m)) is built in one pass
    over blocks of ``block_size`` columns; whenever the max grows from m to m', the sum so far is
    rescaled by exp(m - m'). The probabilities are then exp(x - m) / l.
    """
    n = x.shape[-1]
    m = torch.full(x.shape[:-1] + (1,), float("-inf"), dtype=x.dtype, device=x.device)  # (..., 1)
    l = torch.zeros_like(m)  # (..., 1)
    for start in range(0, n, block_size):
        block = x[..., start:start + block_size]  # (..., b), the last block may be shorter
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum(dim=-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l


def _tiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int, causal: bool,
           scale: float | None) -> torch.Tensor:
    if block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    n, m_keys = q.shape[-2], k.shape[-2]
    if causal and n != m_keys:
        raise ValueError(f"causal attention needs as many queries as keys, got {n} and {m_keys}")
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)  # (..., N, Dv)
    for q_start in range(0, n, block_size):
        q_end = min(q_start + block_size, n)
        q_blk = q[..., q_start:q_end, :] * scale  # (..., bq, D): scaling q once is cheaper than every tile
        row_max = torch.full(q_blk.shape[:-1] + (1,), float("-inf"), dtype=q.dtype, device=q.device)  # (..., bq, 1)
        row_sum = torch.zeros_like(row_max)  # (..., bq, 1)
        acc = torch.zeros(q_blk.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)  # (..., bq, Dv)
        # Causal: key blocks that start after this query block's last row are all in the future: skip them.
        k_stop = q_end if causal else m_keys
        for k_start in range(0, k_stop, block_size):
            k_end = min(k_start + block_size, m_keys)
            scores = q_blk @ k[..., k_start:k_end, :].transpose(-2, -1)  # (..., bq, bk)
            if causal and k_end > q_start + 1:  # the tile touches the diagonal: mask key > query
                rows = torch.arange(q_start, q_end, device=q.device)[:, None]
                cols = torch.arange(k_start, k_end, device=q.device)[None, :]
                scores = scores.masked_fill(cols > rows, float("-inf"))
            new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))  # (..., bq, 1)
            correction = torch.exp(row_max - new_max)  # shrinks what was summed under the old max
            probs = torch.exp(scores - new_max)  # (..., bq, bk), unnormalised
            row_sum = row_sum * correction + probs.sum(dim=-1, keepdim=True)
            acc = acc * correction + probs @ v[..., k_start:k_end, :]
            row_max = new_max
        out[..., q_start:q_end, :] = acc / row_sum  # one division per row, at the very end
    return out


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int = 64, *,
                    scale: float | None = None) -> torch.Tensor:
    """The FlashAttention-2 forward pass in PyTorch: same result as :func:`naive_attention`.

    q: (..., N, D), k: (..., M, D), v: (..., M, Dv) → (..., N, Dv). Queries are processed in blocks
    of ``block_size`` rows; for each, key/value blocks stream past while a running row max, a running
    row sum and an unnormalised output accumulator are updated (both rescaled by exp(m_old - m_new)
    whenever the max grows). The output is divided by the row sum once, at the end.
    """
    return _tiled(q, k, v, block_size, causal=False, scale=scale)


def causal_tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int = 64, *,
                           scale: float | None = None) -> torch.Tensor:
    """Causal tiled attention: query i sees keys 0..i; key blocks above the diagonal are never computed.

    q, k: (..., N, D), v: (..., N, Dv) → (..., N, Dv). For query block i only key blocks 0..i are
    visited (about half the tiles); the diagonal tile is masked element by element.
    """
    return _tiled(q, k, v, block_size, causal=True, scale=scale)


# ----------------------------------------------------------------------------- cost model


def attention_flops(batch: int, heads: int, n: int, head_dim: int, *, causal: bool = False,
                    backward: bool = False) -> float:
    """Floating-point operations of attention's two matrix products, the FlashAttention papers' way.

    Forward: QKᵀ and PV each cost 2·N²·D multiply-adds per head → 4·B·H·N²·D (half when causal,
    since half of the score matrix is never needed). With ``backward=True``: forward + backward,
    counted as 3.5× the forward (the backward does 2.5× the forward's matmul work).
    The softmax's exponentials are not counted (they are O(N²), not O(N²·D)).
    """
    flops = 4.0 * batch * heads * n * n * head_dim
    if causal:
        flops /= 2
    return flops * 3.5 if backward else flops


def score_elements(batch: int, heads: int, n: int) -> int:
    """Entries of the score matrix naive attention materialises: B·H·N²."""
    return batch * heads * n * n


def score_bytes(batch: int, heads: int, n: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one B·H·N² score matrix (naive attention holds it, then its softmax: about twice this)."""
    return score_elements(batch, heads, n) * BYTES_PER_ELEMENT[dtype]


def max_naive_length(memory_bytes: float, *, batch: int = 1, heads: int = 1,
                     dtype: torch.dtype = torch.float32, copies: int = 2) -> int:
    """Longest N whose ``copies`` score matrices (scores and probabilities) fit in ``memory_bytes``."""
    per_row = batch * heads * BYTES_PER_ELEMENT[dtype] * copies
    return int(math.isqrt(int(memory_bytes // per_row)))

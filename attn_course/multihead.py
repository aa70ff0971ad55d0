"""Multi-head attention, nanoGPT-style: split/merge heads, one module with W^Q, W^K, W^V, W^O.

Shapes used throughout (batch-first, like ``nn.MultiheadAttention(batch_first=True)``):

* ``B`` batch, ``n`` query positions, ``m`` key positions, ``d_model`` model width;
* ``A`` query heads of width ``d_head``; ``A·d_head`` need not equal ``d_model``
  (W^Q maps d_model → A·d_head and W^O maps A·d_head back to d_model);
* ``G`` key/value heads: ``G = A`` is ordinary multi-head attention, ``G = 1`` multi-query
  attention (MQA), ``1 < G < A`` grouped-query attention (GQA); each K/V head serves ``A // G``
  query heads.

Masks are boolean and broadcast to ``(B, A, n, m)``; ``True`` marks a key the query may attend to
(the convention of ``F.scaled_dot_product_attention``).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

__all__ = [
    "split_heads",
    "merge_heads",
    "MultiHeadAttention",
    "parameter_count",
    "kv_cache_bytes",
    "copy_to_torch",
    "copy_from_torch",
]


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, n, A·d_head) → (B, A, n, d_head): feature block h becomes head h."""
    *lead, n, width = x.shape
    if width % n_heads:
        raise ValueError(f"the last axis ({width}) is not a multiple of n_heads ({n_heads})")
    x = x.reshape(*lead, n, n_heads, width // n_heads)  # (B, n, A, d_head)
    return x.transpose(-3, -2)  # (B, A, n, d_head)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, A, n, d_head) → (B, n, A·d_head): the heads concatenated, head 0 first."""
    *lead, n_heads, n, d_head = x.shape
    x = x.transpose(-3, -2)  # (B, n, A, d_head)
    return x.reshape(*lead, n, n_heads * d_head)  # (B, n, A·d_head)


class MultiHeadAttention(nn.Module):
    """Multi-head self/cross attention with optional grouped K/V heads and dropout on the weights.

    Args:
        d_model: width of the input and output vectors.
        n_heads: number of query heads A.
        d_head: width of each head; defaults to ``d_model // n_heads`` (then it must divide).
        n_kv_heads: number of key/value heads G (divides A); ``None`` means G = A.
        dropout: probability p of zeroing an attention weight during training; the kept weights are
            multiplied by 1/(1 − p), so each row sums to 1 only on average while training.
        bias: whether the four projections have biases.

    ``forward(query, key=None, value=None, mask=None)`` returns ``(out, weights)`` with
    ``out`` (B, n, d_model) and ``weights`` (B, A, n, m) (after dropout).
    """

    def __init__(self, d_model: int, n_heads: int, d_head: int | None = None, *,
                 n_kv_heads: int | None = None, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if d_head is None:
            if d_model % n_heads:
                raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}: pass d_head")
            d_head = d_model // n_heads
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_head, self.n_kv_heads = d_model, n_heads, d_head, n_kv_heads
        self.q_proj = nn.Linear(d_model, n_heads * d_head, bias=bias)     # W^Q: d_model → A·d_head
        self.k_proj = nn.Linear(d_model, n_kv_heads * d_head, bias=bias)  # W^K: d_model → G·d_head
        self.v_proj = nn.Linear(d_model, n_kv_heads * d_head, bias=bias)  # W^V: d_model → G·d_head
        self.out_proj = nn.Linear(n_heads * d_head, d_model, bias=bias)   # W^O: A·d_head → d_model
        self.attn_dropout = nn.Dropout(dropout)
        self.scale: float | None = None  # None: 1/sqrt(d_head); set a number to experiment (notebook 08)

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        key = query if key is None else key
        value = key if value is None else value
        q = split_heads(self.q_proj(query), self.n_heads)     # (B, A, n, d_head)
        k = split_heads(self.k_proj(key), self.n_kv_heads)    # (B, G, m, d_head)
        v = split_heads(self.v_proj(value), self.n_kv_heads)  # (B, G, m, d_head)
        group = self.n_heads // self.n_kv_heads
        if group > 1:  # each K/V head serves `group` consecutive query heads
            k = k.repeat_interleave(group, dim=-3)  # (B, A, m, d_head)
            v = v.repeat_interleave(group, dim=-3)  # (B, A, m, d_head)
        scale = 1.0 / math.sqrt(self.d_head) if self.scale is None else self.scale
        scores = (q @ k.transpose(-2, -1)) * scale  # (B, A, n, m)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = self.attn_dropout(torch.softmax(scores, dim=-1))  # (B, A, n, m)
        out = merge_heads(weights @ v)  # (B, n, A·d_head)
        return self.out_proj(out), weights  # (B, n, d_model), (B, A, n, m)


def parameter_count(module: nn.Module) -> int:
    """Number of trainable numbers in ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def kv_cache_bytes(*, n_layers: int, n_kv_heads: int, d_head: int, seq_len: int, batch: int = 1,
                   bytes_per_value: int = 2) -> int:
    """Memory of a K/V cache: a K and a V vector of width d_head per layer, K/V head and position."""
    return 2 * n_layers * n_kv_heads * d_head * seq_len * batch * bytes_per_value


def _check_torch_compatible(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    if ours.n_heads * ours.d_head != ours.d_model or ours.n_kv_heads != ours.n_heads:
        raise ValueError("nn.MultiheadAttention needs A·d_head = d_model and one K/V head per query head")
    if theirs.embed_dim != ours.d_model or theirs.num_heads != ours.n_heads:
        raise ValueError(
            f"sizes differ: nn.MultiheadAttention({theirs.embed_dim}, {theirs.num_heads}) vs "
            f"MultiHeadAttention({ours.d_model}, {ours.n_heads})"
        )
    if not theirs._qkv_same_embed_dim:
        raise ValueError("only nn.MultiheadAttention with kdim = vdim = embed_dim is supported")


@torch.no_grad()
def copy_to_torch(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> nn.MultiheadAttention:
    """Copy our W^Q, W^K, W^V, W^O (and biases) into ``theirs``; returns ``theirs``.

    nn.MultiheadAttention keeps W^Q, W^K, W^V stacked in one ``in_proj_weight`` (3·d_model, d_model).
    """
    _check_torch_compatible(ours, theirs)
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    theirs.out_proj.weight.copy_(ours.out_proj.weight)
    if theirs.in_proj_bias is not None:
        biases = [p.bias if p.bias is not None else torch.zeros(ours.d_model)
                  for p in (ours.q_proj, ours.k_proj, ours.v_proj)]
        theirs.in_proj_bias.copy_(torch.cat(biases))
    if theirs.out_proj.bias is not None:
        theirs.out_proj.bias.copy_(ours.out_proj.bias if ours.out_proj.bias is not None else 0.0)
    return theirs


@torch.no_grad()
def copy_from_torch(theirs: nn.MultiheadAttention, ours: MultiHeadAttention) -> MultiHeadAttention:
    """Copy ``theirs``' projections into ``ours`` (the inverse of :func:`copy_to_torch`); returns ``ours``."""
    _check_torch_compatible(ours, theirs)
    wq, wk, wv = theirs.in_proj_weight.chunk(3)
    for proj, w in zip((ours.q_proj, ours.k_proj, ours.v_proj), (wq, wk, wv)):
        proj.weight.copy_(w)
    ours.out_proj.weight.copy_(theirs.out_proj.weight)
    if theirs.in_proj_bias is not None:
        for proj, b in zip((ours.q_proj, ours.k_proj, ours.v_proj), theirs.in_proj_bias.chunk(3)):
            if proj.bias is not None:
                proj.bias.copy_(b)
    if theirs.out_proj.bias is not None and ours.out_proj.bias is not None:
        ours.out_proj.bias.copy_(theirs.out_proj.bias)
    return ours

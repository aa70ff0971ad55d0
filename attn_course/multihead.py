"""Multi-head attention (notebook 07), nanoGPT-style: split/merge heads, one module with W^Q, W^K, W^V, W^O.

Shapes used throughout (batch-first, like ``nn.MultiheadAttention(batch_first=True)``):

* ``B`` batch, ``n_q`` query positions, ``n_k`` key positions, ``d_model`` model width;
* ``A`` query heads of width ``d_head``; ``A·d_head`` need not equal ``d_model``
  (W^Q maps d_model → A·d_head and W^O maps A·d_head back to d_model);
* ``G`` key/value heads: ``G = A`` is ordinary multi-head attention, ``G = 1`` multi-query
  attention (MQA, Shazeer 2019), ``1 < G < A`` grouped-query attention (GQA, Ainslie et al. 2023);
  each K/V head serves ``A / G`` query heads.

One ``forward(x_q, x_kv=None, mask=None)`` covers self-attention (``x_kv`` None: keys and values
come from ``x_q``), causal self-attention (a causal mask) and cross-attention (``x_kv`` another
sequence, ``n_k`` may differ from ``n_q``). Masks follow notebook 06 and the whole course: bool,
``True`` = may attend, broadcastable to ``(B, A, n_q, n_k)`` — e.g. ``(n_q, n_k)``, ``(B, 1, n_q, n_k)``
or ``(B, 1, 1, n_k)`` — and the one rule :func:`attn_course.softmax.masked_softmax` (a fully masked
row gets zero weights). ``nn.MultiheadAttention``'s ``attn_mask`` / ``key_padding_mask`` use the
opposite polarity (``True`` = blocked): :func:`torch_masks` converts.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .masks import check_size
from .softmax import masked_softmax

__all__ = [
    "split_heads",
    "merge_heads",
    "default_d_head",
    "MultiHeadAttention",
    "parameter_count",
    "kv_cache_bytes",
    "copy_to_torch",
    "copy_from_torch",
    "torch_masks",
]


def _check_input(x, name: str, d_model: int, dtype: torch.dtype) -> None:
    """x (B, n, d_model), a floating-point tensor of the module's dtype."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (B, n, {d_model}), but you passed a "
                        f"{type(x).__name__}; convert it with torch.as_tensor(...).float().")
    if x.dim() < 2 or x.shape[-1] != d_model:
        raise ValueError(f"{name} must have shape (B, n, d_model={d_model}), but yours has shape {tuple(x.shape)}.")
    if x.dtype != dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but the module's weights are {dtype}; convert one of them, "
                        f"e.g. {name}.to({dtype}) or module.to({x.dtype}).")


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, n, A·d_head) → (B, A, n, d_head): feature block a becomes head a."""
    check_size(n_heads, "n_heads", positive=True)
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a tensor of shape (B, n, A·d_head), but you passed {shape}.")
    *lead, n, width = x.shape
    if width % n_heads:
        raise ValueError(f"the last axis ({width}) is not a multiple of n_heads ({n_heads})")
    x = x.reshape(*lead, n, n_heads, width // n_heads)  # (B, n, A, d_head)
    return x.transpose(-3, -2)  # (B, A, n, d_head)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, A, n, d_head) → (B, n, A·d_head): the heads concatenated, head 0 first."""
    if not isinstance(x, torch.Tensor) or x.dim() < 3:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a tensor of shape (B, A, n, d_head) (at least 3 axes), but you passed {shape}.")
    *lead, n_heads, n, d_head = x.shape
    x = x.transpose(-3, -2)  # (B, n, A, d_head)
    return x.reshape(*lead, n, n_heads * d_head)  # (B, n, A·d_head)


def default_d_head(d_model: int, n_heads: int) -> int:
    """⌈d_model / A⌉: d_model / A when A divides d_model, else just enough for A·d_head ≥ d_model."""
    return -(-d_model // n_heads)


class MultiHeadAttention(nn.Module):
    """Multi-head self-, causal and cross-attention, optional grouped K/V heads, dropout on the weights.

    Args:
        d_model: width of the input and output vectors.
        n_heads: number of query heads A.
        d_head: width of each head; defaults to ⌈d_model / A⌉ (:func:`default_d_head`).
        n_kv_heads: number of key/value heads G (divides A); ``None`` means G = A.
        dropout: probability p of zeroing an attention weight while training; the kept weights are
            multiplied by 1/(1 − p). In ``eval()`` mode dropout does nothing.
        bias: whether the four projections have biases.

    ``forward(x_q, x_kv=None, mask=None)``: ``x_q`` (B, n_q, d_model), ``x_kv`` (B, n_k, d_model)
    (default ``x_q``), ``mask`` bool broadcastable to (B, A, n_q, n_k), True = may attend. Returns
    ``(out, weights)``: ``out`` (B, n_q, d_model) and ``weights`` (B, A, n_q, n_k) — after dropout,
    as ``nn.MultiheadAttention`` returns them.
    """

    def __init__(self, d_model: int, n_heads: int, d_head: int | None = None, *,
                 n_kv_heads: int | None = None, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        check_size(d_model, "d_model", positive=True), check_size(n_heads, "n_heads", positive=True)
        d_head = default_d_head(d_model, n_heads) if d_head is None else check_size(d_head, "d_head", positive=True)
        n_kv_heads = n_heads if n_kv_heads is None else check_size(n_kv_heads, "n_kv_heads", positive=True)
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_head, self.n_kv_heads = d_model, n_heads, d_head, n_kv_heads
        self.q_proj = nn.Linear(d_model, n_heads * d_head, bias=bias)     # W^Q: d_model → A·d_head
        self.k_proj = nn.Linear(d_model, n_kv_heads * d_head, bias=bias)  # W^K: d_model → G·d_head
        self.v_proj = nn.Linear(d_model, n_kv_heads * d_head, bias=bias)  # W^V: d_model → G·d_head
        self.out_proj = nn.Linear(n_heads * d_head, d_model, bias=bias)   # W^O: A·d_head → d_model
        self.attn_dropout = nn.Dropout(dropout)
        self.scale: float | None = None  # None: 1/√d_head; set a number to experiment (notebook 08)

    def forward(self, x_q: torch.Tensor, x_kv: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = self.q_proj.weight.dtype
        _check_input(x_q, "x_q", self.d_model, dtype)
        if x_kv is not None:
            _check_input(x_kv, "x_kv", self.d_model, dtype)
        x_kv = x_q if x_kv is None else x_kv
        q = split_heads(self.q_proj(x_q), self.n_heads)      # (B, A, n_q, d_head)
        k = split_heads(self.k_proj(x_kv), self.n_kv_heads)  # (B, G, n_k, d_head)
        v = split_heads(self.v_proj(x_kv), self.n_kv_heads)  # (B, G, n_k, d_head)
        group = self.n_heads // self.n_kv_heads
        if group > 1:  # each K/V head serves `group` consecutive query heads
            k = k.repeat_interleave(group, dim=-3)  # (B, A, n_k, d_head)
            v = v.repeat_interleave(group, dim=-3)  # (B, A, n_k, d_head)
        scale = 1.0 / math.sqrt(self.d_head) if self.scale is None else self.scale
        scores = (q @ k.transpose(-2, -1)) * scale  # (B, A, n_q, n_k)
        weights = self.attn_dropout(masked_softmax(scores, mask))  # (B, A, n_q, n_k); mask broadcasts over heads
        out = merge_heads(weights @ v)  # (B, n_q, A·d_head)
        return self.out_proj(out), weights  # (B, n_q, d_model), (B, A, n_q, n_k)


def parameter_count(module: nn.Module) -> int:
    """Number of trainable numbers in ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def kv_cache_bytes(*, n_layers: int, n_kv_heads: int, d_head: int, seq_len: int, batch: int = 1,
                   bytes_per_value: int = 2) -> int:
    """Memory of a K/V cache: a K and a V vector of width d_head per layer, K/V head and position."""
    sizes = dict(n_layers=n_layers, n_kv_heads=n_kv_heads, d_head=d_head, seq_len=seq_len, batch=batch,
                 bytes_per_value=bytes_per_value)
    n_layers, n_kv_heads, d_head, seq_len, batch, bytes_per_value = (check_size(v, k) for k, v in sizes.items())
    return 2 * n_layers * n_kv_heads * d_head * seq_len * batch * bytes_per_value


def torch_masks(mask: torch.Tensor | None, *, batch: int, n_heads: int, n_q: int, n_k: int) -> torch.Tensor | None:
    """The course's bool mask (True = may attend, broadcastable to (B, A, n_q, n_k)) as the
    ``attn_mask`` that ``nn.MultiheadAttention`` takes: True = blocked, shape (n_q, n_k) when the
    mask is the same for every batch entry and head, else (B·A, n_q, n_k) (batch-major, as it expects)."""
    if mask is None:
        return None
    want = (batch, n_heads, n_q, n_k)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a bool tensor (True = may attend), but you passed {got}; use mask.bool().")
    try:
        fits = torch.broadcast_shapes(mask.shape, want) == want
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, which does not broadcast to (B, A, n_q, n_k) = "
                         f"{want}; you need a mask of shape (n_q, n_k) or one that broadcasts to it.")
    full = torch.broadcast_to(mask, (batch, n_heads, n_q, n_k))
    if bool((full == full[:1, :1]).all()):
        return ~full[0, 0]  # (n_q, n_k)
    return ~full.reshape(batch * n_heads, n_q, n_k)  # (B·A, n_q, n_k)


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

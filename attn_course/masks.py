"""Attention masks (notebook 06): causal, padding, decoder (causal AND padding), cross-attention, additive.

Convention (the same as :mod:`attn_course.attention` and ``F.scaled_dot_product_attention``):
a boolean mask holds ``True`` where a query **may attend** to a key, ``False`` where it is blocked.
``nn.MultiheadAttention``'s ``attn_mask`` / ``key_padding_mask`` use the opposite polarity
(``True`` = blocked); :func:`additive_mask` turns a boolean mask into the additive form
(``0`` = keep, ``-inf`` = block).

Padding blocks **keys** (columns) only; a padding *query* keeps its row, and its output is thrown
away later (by the loss). Even so, a row can be entirely ``False`` (a *fully masked row*): in a
decoder mask with left padding, the ``<pad>`` queries before the first real token see only ``<pad>``
keys, and every row of a sequence made only of ``<pad>`` is empty. The course's one rule for such a
row is :func:`attn_course.softmax.masked_softmax`: zero weights, zero output. Masks meant for scores
of shape (B, A, n_q, n_k) (A heads) are returned with a heads axis of size 1, (B, 1, n_q, n_k), so that they
broadcast over the heads.

Sizes follow the course's notation: a sequence whose tokens are both queries and keys has length n;
in cross-attention the target's n_q tokens ask and the source's n_k tokens are the keys.

The toy data: two short English→Italian sentence pairs, padded with ``<pad>`` into one batch
(:func:`toy_batch`), deterministic embeddings for them (:func:`toy_qkv`), figures of a mask next to
the attention weights it produces (:func:`plot_mask_and_weights`) and a mask-builder explorer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from .attention import attention
from .plots import MAX_WIDTH, heatmap, styled
from .widgets import explorer

__all__ = [
    "PAD",
    "BOS",
    "TOY_PAIRS",
    "ToyBatch",
    "toy_batch",
    "toy_qkv",
    "causal_mask",
    "padding_mask_from_lengths",
    "padding_mask_from_ids",
    "encoder_mask",
    "decoder_mask",
    "cross_attention_mask",
    "additive_mask",
    "plot_mask_and_weights",
    "mask_builder",
    "mask_example",
    "KINDS",
]

PAD, BOS = "<pad>", "<bos>"

# (English source, Italian target); the target is fed to the decoder after a <bos> token.
TOY_PAIRS = [
    ("the cat sleeps", "il gatto dorme"),
    ("my sister reads a new book", "mia sorella legge un libro nuovo"),
]


# ----------------------------------------------------------------------------- input checks
def check_size(value, name: str, *, positive: bool = False) -> int:
    """A non-negative integer size (Python, NumPy or 0-d tensor integer), at least 1 when ``positive`` (heads,
    widths, block sizes), or a clear error naming it: the one size check of the course's functions."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < int(positive):
        kind = "a positive" if positive else "a non-negative"
        raise ValueError(f"{name} must be {kind} integer, but you passed {value!r}.")
    return int(value)


def _ids(ids, name: str) -> torch.Tensor:
    """Token ids as a (B, n) integer tensor (lists and NumPy arrays are converted), or a clear error."""
    if not isinstance(ids, torch.Tensor):
        try:
            ids = torch.as_tensor(np.asarray(ids))
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{name} must be a (B, n) tensor of token ids, but you passed a {type(ids).__name__}.") from None
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (B, n), one row of token ids per sequence, but yours has shape "
                         f"{tuple(ids.shape)}; for a single sequence use {name}[None].")
    return ids


# ----------------------------------------------------------------------------- masks
def causal_mask(n: int, device=None) -> torch.Tensor:
    """(n, n) bool, True on and below the diagonal: query i may attend to keys j ≤ i."""
    n = check_size(n, "n")
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def padding_mask_from_lengths(lengths, max_len: int | None = None) -> torch.Tensor:
    """(B, max_len) bool, True for the first ``lengths[b]`` positions of sequence b (real tokens)."""
    lengths = torch.as_tensor(lengths)
    if lengths.numel() == 0 and lengths.dim() == 1:
        lengths = lengths.long()  # [] → no sequences
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be a 1-D sequence of integers, one per sequence, but you passed "
                         f"shape {tuple(lengths.shape)} of dtype {lengths.dtype}.")
    if lengths.numel() and bool((lengths < 0).any()):
        raise ValueError(f"lengths must be non-negative, but you passed {lengths.tolist()}.")
    longest = int(lengths.max()) if lengths.numel() else 0
    max_len = longest if max_len is None else check_size(max_len, "max_len")
    if max_len < longest:
        raise ValueError(f"max_len={max_len} is shorter than the longest sequence ({longest} tokens); "
                         f"you need max_len ≥ {longest} (or None).")
    return torch.arange(max_len, device=lengths.device) < lengths[:, None]  # (B, max_len)


def padding_mask_from_ids(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, n) bool, True where ``ids`` (B, n) is a real token, False at ``pad_id``."""
    return _ids(ids, "ids") != pad_id


def encoder_mask(src_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, 1, n, n) bool for encoder self-attention over ``src_ids`` (B, n): every query sees every real
    source key."""
    src_ids = _ids(src_ids, "src_ids")
    keys = padding_mask_from_ids(src_ids, pad_id)  # (B, n)
    n = src_ids.shape[-1]
    return keys[:, None, None, :].expand(-1, 1, n, n)  # (B, 1, n, n)


def decoder_mask(tgt_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, 1, n, n) bool for decoder self-attention over ``tgt_ids`` (B, n): causal AND real keys."""
    tgt_ids = _ids(tgt_ids, "tgt_ids")
    keys = padding_mask_from_ids(tgt_ids, pad_id)  # (B, n)
    n = tgt_ids.shape[-1]
    return causal_mask(n, tgt_ids.device) & keys[:, None, None, :]  # (n, n) & (B, 1, 1, n) → (B, 1, n, n)


def cross_attention_mask(tgt_ids: torch.Tensor, src_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, 1, n_q, n_k) bool for cross-attention, ``tgt_ids`` (B, n_q) and ``src_ids`` (B, n_k): rows are
    target queries, columns source keys; only source padding is blocked (no causal constraint: the whole
    source is known)."""
    tgt_ids, src_ids = _ids(tgt_ids, "tgt_ids"), _ids(src_ids, "src_ids")
    if tgt_ids.shape[0] != src_ids.shape[0]:
        raise ValueError(f"tgt_ids has {tgt_ids.shape[0]} sequences (shape {tuple(tgt_ids.shape)}) but src_ids has "
                         f"{src_ids.shape[0]} (shape {tuple(src_ids.shape)}); you need one source per target.")
    keys = padding_mask_from_ids(src_ids, pad_id)  # (B, n_k)
    n_q = tgt_ids.shape[-1]
    return keys[:, None, None, :].expand(-1, 1, n_q, -1)  # (B, 1, n_q, n_k)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The additive form of a bool mask: 0 where True (keep), -inf where False (block); same shape."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        kind = f"a tensor of dtype {mask.dtype}" if isinstance(mask, torch.Tensor) else f"a {type(mask).__name__}"
        raise TypeError(f"mask must be a bool tensor (True = may attend), but you passed {kind}; "
                        "convert a 0/1 mask with torch.as_tensor(mask).bool().")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype (it has to hold -inf), but you passed {dtype!r}.")
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


# ----------------------------------------------------------------------------- toy sentences
@dataclass
class ToyBatch:
    """Two sentence pairs padded into one batch.

    ``src_ids`` (B, source length) and ``tgt_ids`` (B, target length) are long tensors (in cross-attention
    the source length is n_k, the target length n_q); ``src_tokens`` / ``tgt_tokens`` hold
    the same sequences as strings (with ``<pad>``), for labelling figures.
    """

    src_tokens: list[list[str]]
    tgt_tokens: list[list[str]]
    src_ids: torch.Tensor
    tgt_ids: torch.Tensor
    vocab: dict[str, int]
    pad_id: int


def _pad(sequences: list[list[str]]) -> list[list[str]]:
    width = max(map(len, sequences))
    return [s + [PAD] * (width - len(s)) for s in sequences]


def toy_batch(pairs: Sequence[tuple[str, str]] = TOY_PAIRS) -> ToyBatch:
    """Tokenise ``pairs`` by whitespace, prefix targets with ``<bos>``, pad with ``<pad>`` (id 0)."""
    src = _pad([s.split() for s, _ in pairs])
    tgt = _pad([[BOS] + t.split() for _, t in pairs])
    vocab = {PAD: 0, BOS: 1}
    for sentence in src + tgt:
        for token in sentence:
            vocab.setdefault(token, len(vocab))
    ids = lambda rows: torch.tensor([[vocab[t] for t in row] for row in rows])  # noqa: E731
    return ToyBatch(src, tgt, ids(src), ids(tgt), vocab, vocab[PAD])


def toy_qkv(query_ids: torch.Tensor, key_ids: torch.Tensor, vocab_size: int, d: int = 8, seed: int = 0):
    """Deterministic toy Q (B, n_q, d), K (B, n_k, d) and V (B, n_k, d) for token ids.

    Each token gets a random embedding; random projections W^Q, W^K, W^V (fixed by ``seed``) turn
    embeddings into queries, keys and values, so the weights show some structure, not just a diagonal.
    """
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(vocab_size, d, generator=g)
    Wq, Wk, Wv = (torch.randn(d, d, generator=g) / math.sqrt(d) for _ in range(3))
    return embed[query_ids] @ Wq, embed[key_ids] @ Wk, embed[key_ids] @ Wv


# ----------------------------------------------------------------------------- figures
@styled
def plot_mask_and_weights(mask2d, weights2d, row_tokens, col_tokens, title: str = "") -> plt.Figure:
    """The mask (True = may attend) and the attention weights it produces, side by side."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(MAX_WIDTH, 4.4))
    heatmap(mask2d.to(torch.float32), row_labels=row_tokens, col_labels=col_tokens, ax=left,
            title="mask (1 = may attend)", fmt="{:.0f}", signed=False, vmin=0, vmax=1, colorbar=False)
    heatmap(weights2d, row_labels=row_tokens, col_labels=col_tokens, ax=right,
            title="attention weights", signed=False, vmin=0, vmax=1)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def mask_example(kind: str, batch: ToyBatch, b: int):
    """One mask kind on the toy batch: ``(mask, weights, query tokens, key tokens)`` for sentence pair ``b``.

    ``kind`` is one of :data:`KINDS`; mask and weights have shape (B, 1, n_q, n_k) (one head).
    """
    if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < len(batch.src_tokens):
        raise ValueError(f"b must pick one of the batch's {len(batch.src_tokens)} sentence pairs "
                         f"(0 … {len(batch.src_tokens) - 1}), but you passed {b!r}.")
    if kind == "encoder self-attention":
        q_ids, k_ids, mask = batch.src_ids, batch.src_ids, encoder_mask(batch.src_ids, batch.pad_id)
        rows, cols = batch.src_tokens[b], batch.src_tokens[b]
    elif kind == "decoder self-attention":
        q_ids, k_ids, mask = batch.tgt_ids, batch.tgt_ids, decoder_mask(batch.tgt_ids, batch.pad_id)
        rows, cols = batch.tgt_tokens[b], batch.tgt_tokens[b]
    elif kind == "cross-attention":
        q_ids, k_ids = batch.tgt_ids, batch.src_ids
        mask = cross_attention_mask(batch.tgt_ids, batch.src_ids, batch.pad_id)
        rows, cols = batch.tgt_tokens[b], batch.src_tokens[b]
    else:
        raise ValueError(f"unknown kind {kind!r}")
    Q, K, V = toy_qkv(q_ids, k_ids, len(batch.vocab))
    _, weights = attention(Q[:, None], K[:, None], V[:, None], mask)  # heads axis of size 1
    return mask, weights, rows, cols


KINDS = ("encoder self-attention", "decoder self-attention", "cross-attention")


def _pair_label(batch: ToyBatch, b: int) -> str:
    """Sentence pair ``b`` as words, without its padding: "the cat sleeps → il gatto dorme"."""
    words = lambda tokens: " ".join(t for t in tokens if t not in (PAD, BOS))  # noqa: E731
    return f"{words(batch.src_tokens[b])} → {words(batch.tgt_tokens[b])}"


def mask_builder(batch: ToyBatch | None = None):
    """Explorer: pick a mask kind and a sentence pair, see the mask and the weights it produces."""
    import ipywidgets as widgets

    batch = batch or toy_batch()

    def draw(kind: str, pair: int) -> plt.Figure:
        mask, weights, rows, cols = mask_example(kind, batch, pair)
        return plot_mask_and_weights(mask[pair, 0], weights[pair, 0], rows, cols, title=f"{kind}: {_pair_label(batch, pair)}")

    pairs = [(_pair_label(batch, b), b) for b in range(len(batch.src_tokens))]  # the sentences, not 0/1
    controls = {
        "kind": widgets.Dropdown(options=list(KINDS), value=KINDS[1], description="mask"),
        "pair": widgets.Dropdown(options=pairs, value=0, description="sentences",
                                 layout=widgets.Layout(width="auto")),
    }
    return explorer(draw, controls, title="Mask builder")

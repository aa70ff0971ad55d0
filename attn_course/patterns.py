"""Reading attention (notebook 08): per-query pattern metrics, synthetic pattern types, and a tiny model to read.

Metrics take attention weights shaped ``(..., n_q, n_k)`` (rows = queries, each row sums to 1) and
return one number per query, shaped ``(..., n_q)``:

* normalised entropy   H / log(number of keys the row may attend to) — 0 for a one-hot row, 1 for a
  row spread evenly over every allowed key; ``mask`` (bool, True = allowed, broadcastable to the
  weights; default: every key allowed) says which keys those are, so a causal row i is measured
  against its i + 1 keys, not all n_k. Rows with at most one allowed key get 0;
* peak weight          the largest weight of the row;
* self-attention       the weight a query puts on its own position (the diagonal; square matrices);
* attention distance   Σ_j P_ij·|j − i| — how far, in positions, query i looks on average
  (the "mean attention distance" of Dosovitskiy et al. 2021); query i sits at position i;
* effective positions  exp(H) — how many keys the row spreads over (1 … n_k).

H is :func:`attn_course.softmax.entropy`: natural log, 0·log 0 = 0.

The toy task ("two questions") asks, at every position of a random digit sequence, *which digit came
just before?* and *which digit started the sequence?*. Only position 0's second question can be answered
from the position's own token; every other answer sits at another position, so the model must attend; a one-layer, two-head attention-only model learns it on a CPU in seconds.
"""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .masks import check_size
from .multihead import MultiHeadAttention, merge_heads, split_heads
from .plots import MAX_WIDTH, MIN_FONT, heatmap, styled
from .softmax import entropy

__all__ = [
    "entropy",
    "normalised_entropy",
    "peak_weight",
    "self_attention_weight",
    "attention_distance",
    "effective_positions",
    "pattern_metrics",
    "metrics_table",
    "PATTERN_TYPES",
    "synthetic_pattern",
    "classify_pattern",
    "make_toy_batch",
    "AttentionOnlyModel",
    "toy_loss",
    "train_toy_model",
    "evaluate",
    "attention_gradients",
    "position_labels",
    "plot_heads",
    "plot_loss_curves",
    "head_explorer",
]

IGNORE = -100  # target value that the loss and the accuracy skip (no previous token at position 0)


def _weights(w) -> torch.Tensor:
    return w if isinstance(w, torch.Tensor) else torch.as_tensor(np.asarray(w))


def normalised_entropy(weights, mask=None) -> torch.Tensor:
    """Entropy of every row divided by log(its number of allowed keys): (..., n_q, n_k) → (..., n_q), in [0, 1].

    ``mask``: None (every key allowed) or bool broadcastable to ``weights``, True = the query may attend
    to the key. Rows with at most one allowed key get 0 (no choice, no uncertainty).
    """
    w = _weights(weights)
    h = entropy(w)  # (..., n_q), float64
    if mask is None:
        allowed = torch.full_like(h, float(w.shape[-1]))
    else:
        allowed = torch.broadcast_to(_weights(mask), w.shape).sum(-1).to(torch.float64)  # (..., n_q)
    log_n = torch.log(allowed.clamp(min=1.0))
    return torch.where(allowed > 1, h / torch.where(allowed > 1, log_n, torch.ones_like(log_n)), torch.zeros_like(h))


def peak_weight(weights) -> torch.Tensor:
    """Largest weight of every row: (..., n_q, n_k) → (..., n_q)."""
    return _weights(weights).amax(-1)


def self_attention_weight(weights) -> torch.Tensor:
    """Weight each query puts on its own position, P_ii: (..., n, n) → (..., n)."""
    return _weights(weights).diagonal(dim1=-2, dim2=-1)


def attention_distance(weights) -> torch.Tensor:
    """Mean attention distance Σ_j P_ij·|j − i| of every row: (..., n_q, n_k) → (..., n_q).

    Keys and queries are counted from 0 along the same sequence (query i sits at position i).
    """
    w = _weights(weights)
    keys = torch.arange(w.shape[-1], dtype=w.dtype)  # (n_k,)
    queries = torch.arange(w.shape[-2], dtype=w.dtype)  # (n_q,)
    distance = (keys[None, :] - queries[:, None]).abs()  # (n_q, n_k)
    return (w * distance).sum(-1)


def effective_positions(weights) -> torch.Tensor:
    """exp(entropy): how many keys the row is spread over, between 1 and n_k; (..., n_q)."""
    return entropy(_weights(weights)).exp()


def pattern_metrics(weights, mask=None) -> dict[str, torch.Tensor]:
    """All five metrics of a weights matrix (..., n, n), each (..., n), in float64."""
    w = _weights(weights).detach().to(torch.float64)
    return {
        "entropy (norm.)": normalised_entropy(w, mask),
        "peak": peak_weight(w),
        "self": self_attention_weight(w),
        "distance": attention_distance(w),
        "eff. positions": effective_positions(w),
    }


def metrics_table(weights, tokens: Sequence[str] | None = None, mask=None, digits: int = 2) -> str:
    """A text table of the five metrics of one (n, n) weights matrix, one row per query, plus the mean."""
    metrics = pattern_metrics(weights, mask)
    n = next(iter(metrics.values())).shape[-1]
    tokens = [f"pos {i}" for i in range(n)] if tokens is None else list(tokens)
    names = list(metrics)
    lines = ["query    " + " ".join(f"{name:>15}" for name in names)]
    for i in range(n):
        lines.append(f"{i:>2} {tokens[i]:<5} " + " ".join(f"{metrics[k][i].item():>15.{digits}f}" for k in names))
    lines.append("mean     " + " ".join(f"{metrics[k].mean().item():>15.{digits}f}" for k in names))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Pattern types, made by hand

PATTERN_TYPES = ("diagonal", "previous-token", "vertical", "block", "uniform")


def synthetic_pattern(kind: str, n: int = 8, *, sharpness: float = 0.9, block: int = 4) -> torch.Tensor:
    """An (n, n) weights matrix of one pattern type, float64, rows summing to 1.

    ``sharpness`` of each row's weight goes to the pattern's target(s); the rest is spread evenly,
    so the metrics are not all at their extremes. Kinds: diagonal (each token to itself),
    previous-token (to the one before; token 0 to itself), vertical (everyone to token 0, as heads
    that "park" on a first or separator token do), block (uniform within consecutive blocks of
    ``block`` tokens), uniform (every key alike).
    """
    n = check_size(n, "n", positive=True)
    block = check_size(block, "block", positive=True)
    target = torch.zeros(n, n, dtype=torch.float64)
    rows = torch.arange(n)
    if kind == "diagonal":
        target[rows, rows] = 1.0
    elif kind == "previous-token":
        target[rows, (rows - 1).clamp(min=0)] = 1.0
    elif kind == "vertical":
        target[:, 0] = 1.0
    elif kind == "block":
        same_block = (rows[:, None] // block) == (rows[None, :] // block)
        target = same_block.to(torch.float64)
        target = target / target.sum(-1, keepdim=True)
    elif kind == "uniform":
        return torch.full((n, n), 1.0 / n, dtype=torch.float64)
    else:
        raise ValueError(f"unknown pattern {kind!r}; choose one of {PATTERN_TYPES}")
    return sharpness * target + (1 - sharpness) / n


def classify_pattern(weights, *, threshold: float = 0.6) -> str:
    """Name the pattern type of one (n, n) weights matrix from simple averages (a rule of thumb).

    uniform: mean normalised entropy above 0.9; diagonal: mean self-weight above ``threshold``;
    previous-token: mean weight on position i − 1 above it; vertical: one key column whose mean
    weight is above it; block: most weight inside blocks of equal rows; otherwise mixed.
    """
    w = _weights(weights).detach().to(torch.float64)
    n = w.shape[-1]
    if normalised_entropy(w).mean() > 0.9:
        return "uniform"
    if self_attention_weight(w).mean() > threshold:
        return "diagonal"
    if n > 1 and w.diagonal(-1).mean() > threshold:
        return "previous-token"
    column = w.mean(0)
    if column.max() > threshold:
        return f"vertical (key {int(column.argmax())})"
    rows = torch.cdist(w, w) < 0.1  # rows that look alike form a block
    if (w * rows).sum(-1).mean() > threshold and rows.sum(-1).float().mean() > 1:
        return "block"
    return "mixed"


# --------------------------------------------------------------------------------------------
# The toy task and a tiny attention-only model


def make_toy_batch(batch: int, seq_len: int = 8, vocab: int = 10, *,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random digit sequences and the two answers at every position.

    Returns ``tokens`` (batch, seq_len) and ``targets`` (batch, seq_len, 2): ``[..., 0]`` the previous
    token (``IGNORE`` at position 0), ``[..., 1]`` the first token of the sequence.
    """
    tokens = torch.randint(0, vocab, (batch, seq_len), generator=generator)
    previous = torch.cat([torch.full((batch, 1), IGNORE), tokens[:, :-1]], dim=1)
    first = tokens[:, :1].expand(batch, seq_len)
    return tokens, torch.stack([previous, first], dim=-1)


class AttentionOnlyModel(nn.Module):
    """Embeddings → ``n_layers`` × (x + MultiHeadAttention(x)) → a linear read-out per question.

    No MLPs and no normalisation: whatever moves information between positions is attention, so
    its weights tell the whole story. ``forward(tokens)`` takes (B, n) token ids and returns logits
    (B, n, n_questions, vocab) and the list of each layer's weights, each (B, A, n, n).
    """

    def __init__(self, vocab: int = 10, seq_len: int = 8, d_model: int = 32, n_heads: int = 2,
                 d_head: int = 16, n_layers: int = 1, n_questions: int = 2, scale: float | None = None):
        super().__init__()
        self.vocab, self.n_questions = vocab, n_questions
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.layers = nn.ModuleList(MultiHeadAttention(d_model, n_heads, d_head) for _ in range(n_layers))
        for layer in self.layers:
            layer.scale = scale  # None: 1/sqrt(d_head)
        self.readout = nn.Linear(d_model, n_questions * vocab)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        b, n = tokens.shape
        x = self.tok_emb(tokens) + self.pos_emb.weight[:n]  # (B, n, d_model)
        all_weights = []
        for layer in self.layers:
            out, weights = layer(x)  # (B, n, d_model), (B, A, n, n)
            x = x + out
            all_weights.append(weights)
        logits = self.readout(x).view(b, n, self.n_questions, self.vocab)  # (B, n, questions, vocab)
        return logits, all_weights


def toy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every answer that exists (positions marked IGNORE skipped)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def train_toy_model(*, steps: int = 200, batch: int = 64, lr: float = 1e-2, seed: int = 0,
                    progress: bool = True, desc: str = "training", **model_kwargs):
    """Train an :class:`AttentionOnlyModel` on the two-question task with Adam.

    Everything random (initial weights, batches) follows ``seed``, so a run is reproducible.
    Returns ``(model, losses)`` with one training loss per step; the model is left in eval mode.
    """
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(seed)
    model = AttentionOnlyModel(**model_kwargs)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    seq_len, vocab = model.pos_emb.num_embeddings, model.vocab
    losses = []
    bar = tqdm(range(steps), desc=desc, disable=not progress)
    for step in bar:
        tokens, targets = make_toy_batch(batch, seq_len, vocab, generator=data)
        logits, _ = model(tokens)
        loss = toy_loss(logits, targets)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
        if step % 20 == 0 or step == steps - 1:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    return model.eval(), losses


@torch.no_grad()
def evaluate(model: AttentionOnlyModel, *, n: int = 1000, seed: int = 1234) -> dict[str, float]:
    """Accuracy per question (and the loss) on ``n`` fresh sequences drawn with ``seed``."""
    tokens, targets = make_toy_batch(n, model.pos_emb.num_embeddings, model.vocab,
                                     generator=torch.Generator().manual_seed(seed))
    logits = torch.cat([model(chunk)[0] for chunk in tokens.split(250)])  # chunks keep memory small
    correct = logits.argmax(-1) == targets
    valid = targets != IGNORE
    result = {
        "previous token": (correct[..., 0] & valid[..., 0]).sum().item() / valid[..., 0].sum().item(),
        "first token": (correct[..., 1] & valid[..., 1]).sum().item() / valid[..., 1].sum().item(),
    }
    result["loss"] = toy_loss(logits, targets).item()
    return result


def attention_gradients(model: AttentionOnlyModel, tokens: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Where the loss's gradient goes inside a one-layer model's attention, on one batch (notebook 08).

    Returns means over every (sequence, head, query) row: ``"peak"`` the largest weight; ``"scores"``
    ‖∂ℒ/∂scores‖ of the row (scores = the scaled logits the softmax takes); ``"queries"`` ‖∂ℒ/∂q‖ of the
    query vector; ``"ignored keys"`` the fraction of keys with weight under 1 %; ``"ignored share"`` the
    share of |∂ℒ/∂scores| that reaches those keys (the only signal that could make the head look there).
    """
    if len(model.layers) != 1:
        raise ValueError("attention_gradients reads a one-layer model")
    layer = model.layers[0]
    n = tokens.shape[1]
    x = model.tok_emb(tokens) + model.pos_emb.weight[:n]  # (B, n, d_model)
    q = split_heads(layer.q_proj(x), layer.n_heads)  # (B, A, n, d_head)
    k = split_heads(layer.k_proj(x), layer.n_heads)
    v = split_heads(layer.v_proj(x), layer.n_heads)
    scale = 1.0 / math.sqrt(layer.d_head) if layer.scale is None else layer.scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, A, n, n)
    weights = torch.softmax(scores, dim=-1)
    x = x + layer.out_proj(merge_heads(weights @ v))
    logits = model.readout(x).view(*tokens.shape, model.n_questions, model.vocab)
    grad_scores, grad_q = torch.autograd.grad(toy_loss(logits, targets), [scores, q])
    weights, grad_scores = weights.detach(), grad_scores.abs()
    ignored = weights < 0.01
    return {
        "peak": weights.amax(-1).mean().item(),
        "scores": grad_scores.norm(dim=-1).mean().item(),
        "queries": grad_q.norm(dim=-1).mean().item(),
        "ignored keys": ignored.double().mean().item(),
        "ignored share": (grad_scores * ignored).sum().item() / grad_scores.sum().item(),
    }


# --------------------------------------------------------------------------------------------
# Figures


def _as_matrix(w) -> np.ndarray:
    return _weights(w).detach().to(torch.float64).cpu().numpy()


def position_labels(tokens: Sequence) -> list[str]:
    """``["0:3", "1:1", "2:4", …]``: position and token, so repeated tokens still get distinct labels."""
    return [f"{i}:{t}" for i, t in enumerate(tokens)]


def _summary(w) -> str:
    m = {k: v.mean().item() for k, v in pattern_metrics(w).items()}
    return (f"entropy {m['entropy (norm.)']:.2f} · peak {m['peak']:.2f}\n"
            f"self {m['self']:.2f} · distance {m['distance']:.2f}")


@styled
def plot_heads(weights: Sequence, tokens: Sequence[str], titles: Sequence[str]) -> plt.Figure:
    """One token-labelled heatmap per (n, n) weights matrix, its mean metrics under the title;
    up to three per row, the whole figure :data:`~attn_course.plots.MAX_WIDTH` wide."""
    count = len(weights)
    ncols = min(count, 3)
    nrows = -(-count // ncols)
    width = MAX_WIDTH if ncols == 3 else min(MAX_WIDTH, 3.4 * ncols + 1.0)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, 3.7 * nrows), squeeze=False)
    for ax, w, title in zip(axes.flat, weights, titles):
        heatmap(_as_matrix(w), row_labels=tokens, col_labels=tokens, ax=ax, vmin=0.0, vmax=1.0,
                annotate=False, colorbar=False, title=f"{title}\n{_summary(w)}")
        ax.title.set_fontsize(10)
    for ax in list(axes.flat)[count:]:
        ax.axis("off")
    fig.tight_layout(rect=(0, 0, 0.9, 1))  # room on the right for the colour bar
    fig.colorbar(axes.flat[0].images[0], cax=fig.add_axes((0.91, 0.2, 0.015, 0.6)), label="weight")
    return fig


@styled
def _draw_head(weights_by_layer, tokens, layer: int, head: int) -> plt.Figure:
    w = _as_matrix(weights_by_layer[layer][head])
    metrics = {k: v.numpy() for k, v in pattern_metrics(torch.from_numpy(w)).items()}
    fig, (ax_map, ax_bar) = plt.subplots(1, 2, figsize=(MAX_WIDTH, 4.2), gridspec_kw={"width_ratios": [1.1, 1]})
    where = f"layer {layer}, head {head}" if len(weights_by_layer) > 1 else f"head {head}"
    heatmap(w, row_labels=tokens, col_labels=tokens, ax=ax_map, vmin=0.0, vmax=1.0, annotate=False,
            title=f"{where}: weights")
    positions = np.arange(len(tokens))
    width = 0.27
    for name, offset in [("entropy (norm.)", -width), ("peak", 0.0), ("self", width)]:
        ax_bar.bar(positions + offset, metrics[name], width, label=name)
    ax_bar.set_ylim(0, 1.3)
    ax_bar.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax_bar.set_xticks(positions, labels=list(tokens))
    ax_bar.set_xlabel("query")
    ax_bar.set_ylabel("metric (0 … 1)")
    ax_bar.set_title(f"mean distance {metrics['distance'].mean():.2f}, "
                     f"eff. positions {metrics['eff. positions'].mean():.2f}", fontsize=10)
    ax_bar.legend(fontsize=MIN_FONT, loc="upper center", ncol=3, frameon=False)
    fig.tight_layout()
    return fig


def head_explorer(weights_by_layer: Sequence, tokens: Sequence[str]):
    """Pick a head (and a layer, when there are several); see its token-labelled heatmap and per-query metrics.

    ``weights_by_layer[layer]`` is that layer's weights for one sequence, shaped (A, n, n).
    """
    import ipywidgets as widgets

    from .widgets import explorer

    weights_by_layer = [_weights(w).detach() for w in weights_by_layer]
    n_heads = weights_by_layer[0].shape[0]
    controls = {"head": widgets.Dropdown(options=list(range(n_heads)), value=0, description="head")}
    if len(weights_by_layer) > 1:  # a control with one option would only confuse
        controls = {"layer": widgets.Dropdown(options=list(range(len(weights_by_layer))), value=0,
                                              description="layer"), **controls}
    return explorer(lambda head, layer=0: _draw_head(weights_by_layer, list(tokens), layer, head),
                    controls, title="Head explorer")


@styled
def plot_loss_curves(runs: dict[str, Sequence[Sequence[float]]], *, title: str = "") -> plt.Figure:
    """Training loss per step (log scale), one colour per condition and one line per seed."""
    fig, ax = plt.subplots(figsize=(7.2, 4.2))
    for (label, curves), colour in zip(runs.items(), ("#3b75af", "#d1495b", "#2e8b57", "#8a63d2")):
        for k, losses in enumerate(curves):
            ax.plot(np.arange(1, len(losses) + 1), losses, color=colour, alpha=0.8, lw=1.4,
                    label=f"{label} ({len(curves)} seeds)" if k == 0 else None)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("training loss (log scale)")
    if title:
        ax.set_title(title)
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig

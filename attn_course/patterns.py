"""Reading attention: per-query pattern metrics, synthetic pattern types, and a tiny model to read.

Metrics take attention weights shaped ``(..., n_q, n_k)`` (rows = queries, each row sums to 1) and
return one number per query, shaped ``(..., n_q)``:

* normalised entropy  H / log(n_k) — 0 for a one-hot row, 1 for a uniform row (0 when n_k = 1);
* peak weight         the largest weight of the row;
* self-attention      the weight a query puts on its own position (the diagonal; square matrices);
* locality            |Σ_j w_ij·j − i| — how far the expected attended position lies from the query;
* effective positions exp(H) — how many keys the row spreads over (1 … n_k).

H uses the natural log and the convention 0·log 0 = 0.

The toy task ("two questions") asks, at every position of a random digit sequence, *which digit came
just before?* and *which digit started the sequence?*. No position can answer from its own token, so
the model must attend; a one-layer, two-head attention-only model learns it on a CPU in seconds.
"""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .multihead import MultiHeadAttention
from .plots import heatmap

__all__ = [
    "entropy",
    "normalised_entropy",
    "peak_weight",
    "self_attention_weight",
    "locality",
    "effective_positions",
    "pattern_metrics",
    "metrics_table",
    "PATTERN_TYPES",
    "synthetic_pattern",
    "classify_pattern",
    "make_toy_batch",
    "AttentionOnlyModel",
    "train_toy_model",
    "evaluate",
    "plot_heads",
    "head_explorer",
]

IGNORE = -100  # target value that the loss and the accuracy skip (no previous token at position 0)


def _weights(w) -> torch.Tensor:
    return w if isinstance(w, torch.Tensor) else torch.as_tensor(np.asarray(w))


def entropy(weights) -> torch.Tensor:
    """Shannon entropy (nats) of every row: (..., n_q, n_k) → (..., n_q); 0·log 0 counts as 0."""
    w = _weights(weights)
    return 0.0 - torch.special.xlogy(w, w).sum(-1)  # 0.0 − x: no "-0.00" for one-hot rows


def normalised_entropy(weights) -> torch.Tensor:
    """Entropy divided by its maximum log(n_k): (..., n_q, n_k) → (..., n_q), in [0, 1]."""
    w = _weights(weights)
    n_k = w.shape[-1]
    h = entropy(w)
    return h / math.log(n_k) if n_k > 1 else torch.zeros_like(h)


def peak_weight(weights) -> torch.Tensor:
    """Largest weight of every row: (..., n_q, n_k) → (..., n_q)."""
    return _weights(weights).amax(-1)


def self_attention_weight(weights) -> torch.Tensor:
    """Weight each query puts on its own position, w_ii: (..., n, n) → (..., n)."""
    return _weights(weights).diagonal(dim1=-2, dim2=-1)


def locality(weights) -> torch.Tensor:
    """|expected attended position − query position|: (..., n_q, n_k) → (..., n_q).

    The expected position of row i is Σ_j w_ij·j (keys counted from 0); query i sits at position i.
    """
    w = _weights(weights)
    keys = torch.arange(w.shape[-1], dtype=w.dtype)
    queries = torch.arange(w.shape[-2], dtype=w.dtype)
    return ((w * keys).sum(-1) - queries).abs()


def effective_positions(weights) -> torch.Tensor:
    """exp(entropy): how many keys the row is spread over, between 1 and n_k; (..., n_q)."""
    return entropy(weights).exp()


def pattern_metrics(weights) -> dict[str, torch.Tensor]:
    """All five metrics of a weights matrix (..., n, n), each (..., n)."""
    return {
        "entropy (norm.)": normalised_entropy(weights),
        "peak": peak_weight(weights),
        "self": self_attention_weight(weights),
        "locality": locality(weights),
        "eff. positions": effective_positions(weights),
    }


def metrics_table(weights, tokens: Sequence[str] | None = None, digits: int = 2) -> str:
    """A text table of the five metrics of one (n, n) weights matrix, one row per query, plus the mean."""
    metrics = pattern_metrics(_weights(weights).detach().to(torch.float64))
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


# --------------------------------------------------------------------------------------------
# Figures


def _as_matrix(w) -> np.ndarray:
    return _weights(w).detach().to(torch.float64).cpu().numpy()


def _summary(w) -> str:
    m = {k: v.mean().item() for k, v in pattern_metrics(_weights(w).detach().to(torch.float64)).items()}
    return (f"entropy {m['entropy (norm.)']:.2f} · peak {m['peak']:.2f} · self {m['self']:.2f}\n"
            f"locality {m['locality']:.2f} · eff. positions {m['eff. positions']:.2f}")


def plot_heads(weights: Sequence, tokens: Sequence[str], titles: Sequence[str]) -> plt.Figure:
    """One token-labelled heatmap per (n, n) weights matrix, its mean metrics under the title."""
    count = len(weights)
    fig, axes = plt.subplots(1, count, figsize=(4.3 * count, 4.6), squeeze=False)
    for ax, w, title in zip(axes[0], weights, titles):
        heatmap(_as_matrix(w), row_labels=tokens, col_labels=tokens, ax=ax, vmin=0.0, vmax=1.0,
                annotate=False, colorbar=False, title=f"{title}\n{_summary(w)}")
    fig.colorbar(axes[0, -1].images[0], ax=list(axes[0]), fraction=0.025, pad=0.02, label="weight")
    return fig


def _draw_head(weights_by_layer, tokens, layer: int, head: int) -> plt.Figure:
    w = _as_matrix(weights_by_layer[layer][head])
    metrics = {k: v.numpy() for k, v in pattern_metrics(torch.from_numpy(w)).items()}
    fig, (ax_map, ax_bar) = plt.subplots(1, 2, figsize=(10.5, 4.2), gridspec_kw={"width_ratios": [1.1, 1]})
    heatmap(w, row_labels=tokens, col_labels=tokens, ax=ax_map, vmin=0.0, vmax=1.0,
            title=f"layer {layer}, head {head}: weights")
    positions = np.arange(len(tokens))
    width = 0.27
    for k, (name, offset) in enumerate([("entropy (norm.)", -width), ("peak", 0.0), ("self", width)]):
        ax_bar.bar(positions + offset, metrics[name], width, label=name)
    ax_bar.set_ylim(0, 1.25)
    ax_bar.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax_bar.set_xticks(positions, labels=[f"{i}:{t}" for i, t in enumerate(tokens)])
    ax_bar.set_xlabel("query")
    ax_bar.set_ylabel("metric (0 … 1)")
    ax_bar.set_title(f"per query · mean locality {metrics['locality'].mean():.2f}, "
                     f"eff. positions {metrics['eff. positions'].mean():.2f}", fontsize=10)
    ax_bar.legend(fontsize=8, loc="upper center", ncol=3, frameon=False)
    fig.tight_layout()
    return fig


def head_explorer(weights_by_layer: Sequence, tokens: Sequence[str]):
    """Pick a layer and a head; see its token-labelled heatmap and per-query metrics.

    ``weights_by_layer[layer]`` is that layer's weights for one sequence, shaped (A, n, n).
    """
    import ipywidgets as widgets

    from .widgets import explorer

    weights_by_layer = [_weights(w).detach() for w in weights_by_layer]
    n_heads = weights_by_layer[0].shape[0]
    controls = {
        "layer": widgets.Dropdown(options=list(range(len(weights_by_layer))), value=0, description="layer"),
        "head": widgets.Dropdown(options=list(range(n_heads)), value=0, description="head"),
    }
    return explorer(lambda layer, head: _draw_head(weights_by_layer, list(tokens), layer, head),
                    controls, title="Head explorer")

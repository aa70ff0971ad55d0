"""Scaled dot-product attention: the reference, its five steps, a step-by-step explorer and its cost.

    attention(Q, K, V, mask) = softmax(Q Kᵀ / √d_k + mask) V

Shapes (any number of leading batch/head dimensions ``...``)::

    Q        (..., n_q, d_k)
    K        (..., n_k, d_k)
    V        (..., n_k, d_v)      d_v may differ from d_k
    mask     broadcastable to (..., n_q, n_k)
    weights  (..., n_q, n_k)      each row sums to 1 over the keys
    output   (..., n_q, d_v)

**Mask convention of the whole course** (the one ``F.scaled_dot_product_attention`` uses):

* a *boolean* mask says ``True`` = "this query may attend to this key" (keep), ``False`` = blocked;
* a *float* mask is *additive*: it is added to the scaled scores (``0`` keeps, ``-inf`` blocks).

A query whose every key is blocked (a "fully masked row") gets all-zero weights and a zero output,
exactly what ``F.scaled_dot_product_attention`` returns for it, instead of the NaN that a plain
softmax over ``-inf`` everywhere would produce.

Also here: the 4×8 worked example (:func:`worked_example`), the five intermediate matrices
(:func:`attention_steps`), figures of them and the "previous / next step" explorer
(:func:`attention_stepper`), deliberately broken variants for demonstrations
(:func:`attention_with_mistake`), and the cost model (:func:`score_matrix_bytes`,
:func:`measure_attention_cost`).
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from .dot import SOURCE_RAW_SCORES, format_matrix, print_matrix, worked_example  # one place each
from .plots import heatmap
from .widgets import explorer

__all__ = [
    "attention",
    "attention_steps",
    "attention_with_mistake",
    "attention_stepper",
    "measure_attention_cost",
    "plot_attention_steps",
    "plot_step",
    "score_matrix_bytes",
    "worked_example",
    "format_matrix",
    "print_matrix",
    "PUBLISHED",
    "MISTAKES",
    "STEP_NAMES",
]

# The four matrices as the article prints them (two decimals), to compare with what we compute.
PUBLISHED = {
    "scores": SOURCE_RAW_SCORES,
    "scaled": [[0.25, 0.05, -0.05, 0.18], [-0.06, 0.31, -0.07, -0.14],
               [-0.13, -0.03, 0.32, -0.05], [0.21, -0.00, 0.01, 0.35]],
    "weights": [[0.29, 0.23, 0.21, 0.27], [0.23, 0.33, 0.23, 0.21],
                [0.21, 0.23, 0.33, 0.23], [0.26, 0.21, 0.22, 0.31]],
    "output": [[0.31, 0.21, 0.01, 0.32, 0.15, 0.06, 0.12, 0.15],
               [0.26, 0.26, 0.08, 0.24, 0.15, 0.11, 0.06, 0.12],
               [0.30, 0.15, 0.11, 0.29, 0.07, 0.16, 0.09, 0.09],
               [0.32, 0.19, 0.01, 0.35, 0.14, 0.06, 0.12, 0.15]],
}


def _tensor(x) -> torch.Tensor:
    return torch.from_numpy(np.asarray(x)) if isinstance(x, np.ndarray) else x


def _apply_mask(scaled: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Block the scores the mask forbids: bool (True = keep) → -inf; float → added."""
    if mask is None:
        return scaled
    mask = _tensor(mask).to(scaled.device)
    if mask.dtype == torch.bool:
        return scaled.masked_fill(~mask, float("-inf"))
    return scaled + mask.to(scaled.dtype)


def _safe_softmax(masked: torch.Tensor) -> torch.Tensor:
    """Softmax over the keys; a row that is -inf everywhere gives zeros instead of NaN."""
    blocked_row = torch.isneginf(masked).all(dim=-1, keepdim=True)  # (..., n_q, 1)
    weights = torch.softmax(masked.masked_fill(blocked_row, 0.0), dim=-1)
    return weights.masked_fill(blocked_row, 0.0)


def attention(Q, K, V, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention.

    Q: (..., n_q, d_k), K: (..., n_k, d_k), V: (..., n_k, d_v) — tensors or NumPy arrays;
    mask: None, a bool tensor (True = may attend) or an additive float tensor, broadcastable to
    (..., n_q, n_k). Returns ``(output, weights)`` of shapes (..., n_q, d_v) and (..., n_q, n_k).
    """
    Q, K, V = _tensor(Q), _tensor(K), _tensor(V)
    d_k = Q.shape[-1]
    scores = Q @ K.transpose(-2, -1)  # (..., n_q, n_k)
    scaled = scores / math.sqrt(d_k)
    weights = _safe_softmax(_apply_mask(scaled, mask))  # (..., n_q, n_k), rows sum to 1
    return weights @ V, weights  # (..., n_q, d_v)


STEP_NAMES = (
    "1 · scores  Q Kᵀ",
    "2 · scale  ÷ √d_k",
    "3 · mask",
    "4 · softmax over keys",
    "5 · weighted sum of values",
)


def attention_steps(Q, K, V, mask=None) -> list[tuple[str, torch.Tensor]]:
    """The five intermediate matrices, as ``(step name, matrix)`` pairs.

    Shapes: scores, scaled, masked and weights are (..., n_q, n_k); the output is (..., n_q, d_v).
    Without a mask, step 3 leaves the scaled scores unchanged.
    """
    Q, K, V = _tensor(Q), _tensor(K), _tensor(V)
    scores = Q @ K.transpose(-2, -1)
    scaled = scores / math.sqrt(Q.shape[-1])
    masked = _apply_mask(scaled, mask)
    weights = _safe_softmax(masked)
    output = weights @ V
    return list(zip(STEP_NAMES, (scores, scaled, masked, weights, output)))


# ----------------------------------------------------------------------------- mistakes on purpose
MISTAKES = {
    "softmax over queries": "softmax along axis -2: each *column* sums to 1, rows do not",
    "no scale": "scores not divided by √d_k",
    "mask after softmax": "masked weights zeroed after the softmax: rows no longer sum to 1",
    "values before softmax": "V multiplied into the scores before the softmax",
}


def attention_with_mistake(Q, K, V, mistake: str, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A deliberately wrong attention, for demonstrations; ``mistake`` is a key of :data:`MISTAKES`.

    Returns ``(output, weights)`` as the buggy code would.
    """
    Q, K, V = _tensor(Q), _tensor(K), _tensor(V)
    scaled = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if mistake == "softmax over queries":
        weights = torch.softmax(_apply_mask(scaled, mask), dim=-2)
    elif mistake == "no scale":
        weights = _safe_softmax(_apply_mask(scaled * math.sqrt(Q.shape[-1]), mask))
    elif mistake == "mask after softmax":
        weights = torch.softmax(scaled, dim=-1)
        if mask is not None:
            weights = weights * _tensor(mask).to(weights.dtype)
    elif mistake == "values before softmax":
        weights = _safe_softmax(_apply_mask(scaled, mask))
        return torch.softmax(scaled @ V, dim=-1), weights  # (n_q, d_v): a softmax over features
    else:
        raise ValueError(f"unknown mistake {mistake!r}; choose one of {sorted(MISTAKES)}")
    return weights @ V, weights


# ----------------------------------------------------------------------------- figures and explorer
def _labels(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def plot_step(
    steps: list[tuple[str, torch.Tensor]],
    step: int,
    *,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    ax: plt.Axes | None = None,
) -> plt.Figure:
    """One step (1-based) of :func:`attention_steps` on a 2-D example as a labelled heatmap."""
    name, matrix = steps[step - 1]
    matrix = matrix.detach()
    n_q = matrix.shape[-2]
    rows = list(query_labels) if query_labels is not None else _labels("q", n_q)
    if step == 5:
        cols, xlabel = [f"d{j}" for j in range(matrix.shape[-1])], "value feature"
    else:
        cols, xlabel = list(key_labels) if key_labels is not None else _labels("k", matrix.shape[-1]), "key"
    signed = step != 4
    return heatmap(matrix, row_labels=rows, col_labels=cols, title=f"step {name}   {tuple(matrix.shape)}",
                   xlabel=xlabel, ylabel="query", signed=signed, ax=ax)


def plot_attention_steps(steps, *, query_labels=None, key_labels=None) -> plt.Figure:
    """All five steps side by side (the static overview of :func:`attention_stepper`)."""
    widths = [steps[i][1].shape[-1] for i in range(5)]
    fig, axes = plt.subplots(1, 5, figsize=(24, 4.2), gridspec_kw={"width_ratios": widths})
    for step, ax in enumerate(axes, 1):
        plot_step(steps, step, query_labels=query_labels, key_labels=key_labels, ax=ax)
        ax.set_title(steps[step - 1][0], fontsize=11)
    fig.tight_layout()
    return fig


def _step_buttons(n_steps: int):
    """An ipywidgets control with "previous / next step" buttons whose ``value`` is the step (1…n)."""
    import ipywidgets as widgets
    import traitlets

    class StepButtons(widgets.HBox):
        value = traitlets.Int(1)

        def __init__(self):
            self.previous = widgets.Button(description="◀ previous step", layout=widgets.Layout(width="150px"))
            self.next = widgets.Button(description="next step ▶", layout=widgets.Layout(width="150px"))
            self.label = widgets.Label()
            super().__init__([self.previous, self.label, self.next])
            self.previous.on_click(lambda _: self._move(-1))
            self.next.on_click(lambda _: self._move(+1))
            self.observe(lambda _: self._update(), names="value")
            self._update()

        def _move(self, delta: int) -> None:
            self.value = min(max(self.value + delta, 1), n_steps)

        def _update(self) -> None:
            self.label.value = f"step {self.value} of {n_steps}"
            self.previous.disabled = self.value == 1
            self.next.disabled = self.value == n_steps

    return StepButtons()


def attention_stepper(Q, K, V, mask=None, *, query_labels=None, key_labels=None):
    """Step through the five steps of attention on a small 2-D example, one labelled heatmap per step.

    Live in a Jupyter kernel ("previous / next step" buttons); a static figure of step 1 elsewhere
    (:func:`plot_attention_steps` draws all five at once).
    """
    steps = attention_steps(Q, K, V, mask)

    def draw(step: int) -> plt.Figure:
        return plot_step(steps, step, query_labels=query_labels, key_labels=key_labels)

    return explorer(draw, {"step": _step_buttons(len(steps))}, title="Scaled dot-product attention, step by step")


# ----------------------------------------------------------------------------- cost
def score_matrix_bytes(n: int, *, batch: int = 1, heads: int = 1, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of the attention score (or weight) tensor of shape (batch, heads, n, n) in ``dtype``."""
    element = torch.empty((), dtype=dtype).element_size()
    return batch * heads * n * n * element


def measure_attention_cost(ns: Sequence[int], d: int = 64, *, repeats: int = 5, min_seconds: float = 0.05,
                           threads: int | None = 1, seed: int = 0) -> list[dict]:
    """Time :func:`attention` (float32, width ``d``) for each sequence length in ``ns``.

    After one warm-up call, runs at least ``repeats`` times and until ``min_seconds`` have passed, and
    keeps the fastest run (the least disturbed by other work on the machine). ``threads`` fixes
    PyTorch's thread count during the measurement (``None`` leaves it). Returns one dict per n:
    ``n``, ``seconds`` and ``score_bytes`` (the ``nbytes`` of the actual (n, n) weight tensor, which
    equals :func:`score_matrix_bytes`).
    """
    generator = torch.Generator().manual_seed(seed)
    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    rows = []
    try:
        for n in ns:
            Q, K, V = (torch.randn(n, d, generator=generator) for _ in range(3))
            _, weights = attention(Q, K, V)  # warm-up
            best, spent, runs = math.inf, 0.0, 0
            while runs < repeats or (spent < min_seconds and runs < 100):
                start = time.perf_counter()
                attention(Q, K, V)
                elapsed = time.perf_counter() - start
                best, spent, runs = min(best, elapsed), spent + elapsed, runs + 1
            rows.append({"n": n, "seconds": best, "score_bytes": weights.nbytes})
    finally:
        torch.set_num_threads(saved_threads)
    return rows

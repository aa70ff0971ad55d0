"""Scaled dot-product attention (notebook 05): the reference, its five steps, a step-by-step explorer, its cost.

    attention(Q, K, V, mask) = softmax(Q Kᵀ / √d_k + mask) V

Shapes (any number of leading batch/head dimensions ``...``)::

    Q        (..., n_q, d_k)
    K        (..., n_k, d_k)
    V        (..., n_k, d_v)      d_v may differ from d_k
    mask     broadcastable to (..., n_q, n_k)
    weights  (..., n_q, n_k)      each row sums to 1 over the keys it may attend to
    output   (..., n_q, d_v)

**Mask convention of the whole course** (the one ``F.scaled_dot_product_attention`` uses):

* a *boolean* mask says ``True`` = "this query may attend to this key" (keep), ``False`` = blocked;
* a *float* mask is *additive*: it is added to the scaled scores (``0`` keeps, ``-inf`` blocks).

The masking itself is :func:`attn_course.softmax.masked_softmax`, the course's one mask rule: a query
whose every key is blocked (a "fully masked row") gets all-zero weights and a zero output, as
``F.scaled_dot_product_attention`` returns for it from PyTorch 2.5 on (notebook 06 tells that story).

Also here: the five intermediate matrices (:func:`attention_steps`), figures of them and the
"previous / next step" explorer (:func:`attention_stepper`), deliberately broken variants for
demonstrations (:func:`attention_with_mistake`), and the cost (:func:`score_matrix_bytes`,
:func:`measure_attention_cost`, :func:`plot_attention_cost`). The 4×8 worked example and
``print_matrix`` live in :mod:`attn_course.dot`.
"""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from .dot import SOURCE_RAW_SCORES, worked_example
from .plots import MAX_WIDTH, MIN_FONT, heatmap, line_plot, styled
from .softmax import masked_softmax
from .timing import time_ms
from .widgets import explorer

__all__ = [
    "attention",
    "attention_steps",
    "attention_with_mistake",
    "attention_stepper",
    "measure_attention_cost",
    "plot_attention_cost",
    "plot_attention_steps",
    "plot_step",
    "score_matrix_bytes",
    "PUBLISHED",
    "MISTAKES",
    "STEP_NAMES",
]

# The four matrices as source article 003 prints them (two decimals), to compare with what we compute.
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


def check_qkv(q, k, v, names: str = "Q, K, V", *, arrays: bool = True):
    """Validate query, key and value inputs; returns them as tensors (NumPy arrays converted when ``arrays``).

    Expects floating-point tensors of one dtype, q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v),
    and raises a one-sentence error naming the argument otherwise, instead of a deep PyTorch traceback
    or a silently wrong answer.
    """
    labels = [name.strip() for name in names.split(",")]
    checked = []
    for label, x in zip(labels, (q, k, v)):
        if arrays:
            x = _tensor(x)
        if not isinstance(x, torch.Tensor):
            kinds = "a torch.Tensor or a NumPy array" if arrays else "a torch.Tensor"
            raise TypeError(f"{label} must be {kinds}, but you passed a {type(x).__name__}; "
                            f"wrap it with torch.tensor(...) first.")
        if not x.is_floating_point():
            raise TypeError(f"{label} must be a floating-point tensor, but yours has dtype {x.dtype}; "
                            f"convert it with .float().")
        checked.append(x)
    q, k, v = checked
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"{names} must share one dtype, but you passed {q.dtype}, {k.dtype}, {v.dtype}; "
                        f"convert them with .to(torch.float32) (or another common dtype).")
    if q.dim() < 1 or k.dim() < 2 or v.dim() < 2:
        raise ValueError(f"{labels[1]} and {labels[2]} must have at least 2 axes, (..., n_k, d), but you passed "
                         f"shapes {tuple(k.shape)} and {tuple(v.shape)}.")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{labels[0]} has d_k = {q.shape[-1]} (shape {tuple(q.shape)}) but {labels[1]} has "
                         f"d_k = {k.shape[-1]} (shape {tuple(k.shape)}); queries and keys need the same last axis.")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{labels[1]} has n_k = {k.shape[-2]} rows (shape {tuple(k.shape)}) but {labels[2]} has "
                         f"{v.shape[-2]} (shape {tuple(v.shape)}); you need one value row per key.")
    return q, k, v


def attention(Q, K, V, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention.

    Q: (..., n_q, d_k), K: (..., n_k, d_k), V: (..., n_k, d_v) — tensors or NumPy arrays;
    mask: None, a bool tensor (True = may attend) or an additive float tensor, broadcastable to
    (..., n_q, n_k). Returns ``(output, weights)`` of shapes (..., n_q, d_v) and (..., n_q, n_k);
    a query with no allowed key gets zero weights and a zero output.
    """
    Q, K, V = check_qkv(Q, K, V)
    scaled = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (..., n_q, n_k)
    weights = masked_softmax(scaled, mask, dim=-1)  # (..., n_q, n_k), rows sum to 1 (or 0 if fully masked)
    return weights @ V, weights  # (..., n_q, d_v)


STEP_NAMES = (
    "1 · scores Q Kᵀ",
    "2 · scaled ÷ √d_k",
    "3 · masked",
    "4 · weights (softmax)",
    "5 · output = weights V",
)


def _shown_masked(scaled: torch.Tensor, mask) -> torch.Tensor:
    """Step 3 as a matrix to look at: the scaled scores with -inf where the mask blocks (what the
    softmax of :func:`masked_softmax` sees). The weights themselves always come from masked_softmax."""
    if mask is None:
        return scaled
    mask = torch.as_tensor(_tensor(mask))
    if mask.dtype == torch.bool:
        return scaled.masked_fill(~mask, float("-inf"))
    return scaled + mask.to(scaled.dtype)


def attention_steps(Q, K, V, mask=None) -> list[tuple[str, torch.Tensor]]:
    """The five intermediate matrices, as ``(step name, matrix)`` pairs.

    Shapes: scores, scaled, masked and weights are (..., n_q, n_k); the output is (..., n_q, d_v).
    Without a mask, step 3 leaves the scaled scores unchanged.
    """
    Q, K, V = check_qkv(Q, K, V)
    scores = Q @ K.transpose(-2, -1)  # (..., n_q, n_k)
    scaled = scores / math.sqrt(Q.shape[-1])
    weights = masked_softmax(scaled, mask, dim=-1)
    output = weights @ V  # (..., n_q, d_v)
    return list(zip(STEP_NAMES, (scores, scaled, _shown_masked(scaled, mask), weights, output)))


# ----------------------------------------------------------------------------- mistakes on purpose
MISTAKES = {
    "softmax over queries": "softmax along axis -2: each *column* sums to 1, rows do not",
    "no scale": "scores not divided by √d_k",
    "mask after softmax": "blocked weights zeroed after the softmax: rows no longer sum to 1",
    "mask after softmax, renormalised": "blocked weights zeroed after the softmax, then each row divided by "
                                        "its sum: right on paper, 0/0 = NaN on a fully masked row or when the "
                                        "allowed weights underflow",
    "values before softmax": "V multiplied into the scores before the softmax",
}


def attention_with_mistake(Q, K, V, mistake: str, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A deliberately wrong attention, for demonstrations; ``mistake`` is a key of :data:`MISTAKES`
    (``mask``, when given, is a bool mask). Returns ``(output, weights)`` as the buggy code would."""
    if mistake not in MISTAKES:
        raise ValueError(f"unknown mistake {mistake!r}; choose one of {sorted(MISTAKES)}")
    Q, K, V = check_qkv(Q, K, V)
    scaled = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (..., n_q, n_k)
    if mistake == "softmax over queries":
        weights = torch.softmax(_shown_masked(scaled, mask), dim=-2)
    elif mistake == "no scale":
        weights = masked_softmax(scaled * math.sqrt(Q.shape[-1]), mask)
    elif mistake.startswith("mask after softmax"):
        weights = torch.softmax(scaled, dim=-1)
        if mask is not None:
            weights = weights * torch.as_tensor(_tensor(mask)).to(weights.dtype)  # blocked weights → 0
            if mistake.endswith("renormalised"):
                weights = weights / weights.sum(dim=-1, keepdim=True)  # 0/0 where nothing is left
    else:  # "values before softmax"
        weights = masked_softmax(scaled, mask)
        return torch.softmax(scaled @ V, dim=-1), weights  # (..., n_q, d_v): a softmax over features
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
    colorbar: bool = True,
) -> plt.Figure:
    """One step (1-based) of :func:`attention_steps` on a 2-D example as a labelled heatmap.

    Weights (step 4) use the fixed colour scale 0…1, so near-uniform rows look near-uniform;
    signed matrices use a scale symmetric about 0; blocked scores (-inf) are grey and marked −∞.
    """
    name, matrix = steps[step - 1]
    matrix = matrix.detach()
    if matrix.dim() != 2:
        raise ValueError(f"plot_step draws a 2-D example; this one has shape {tuple(matrix.shape)}")
    rows = list(query_labels) if query_labels is not None else _labels("q", matrix.shape[-2])
    if step == 5:
        cols, xlabel = [f"d{j}" for j in range(matrix.shape[-1])], "value feature"
    else:
        cols, xlabel = list(key_labels) if key_labels is not None else _labels("k", matrix.shape[-1]), "key"
    scale = dict(signed=False, vmin=0.0, vmax=1.0) if step == 4 else dict(signed=True)
    fig = heatmap(matrix, row_labels=rows, col_labels=cols, title=f"{name}   {tuple(matrix.shape)}",
                  xlabel=xlabel, ylabel="query", ax=ax, colorbar=colorbar, **scale)
    ax = ax if ax is not None else fig.axes[0]
    for (i, j) in torch.nonzero(torch.isneginf(matrix)).tolist():
        ax.text(j, i, "−∞", ha="center", va="center", fontsize=MIN_FONT, color="#555555")
    return fig


@styled
def plot_attention_steps(steps, *, query_labels=None, key_labels=None, title: str = "") -> plt.Figure:
    """All five steps on one page (the static overview of :func:`attention_stepper`): steps 1–3 on the
    first row, the weights and the output on the second; every cell annotated, no colour bars."""
    fig = plt.figure(figsize=(MAX_WIDTH, 6.6))
    grid = fig.add_gridspec(2, 3)
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[0, 2]),
            fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1:])]
    for step, ax in enumerate(axes, 1):
        plot_step(steps, step, query_labels=query_labels, key_labels=key_labels, ax=ax, colorbar=False)
        ax.set_title(steps[step - 1][0])
        if step not in (1, 4):
            ax.set_ylabel("")
    if title:
        fig.suptitle(title)
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
    for label, value in (("n", n), ("batch", batch), ("heads", heads)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{label} must be a non-negative integer, but you passed {value!r}.")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float16, but you passed {dtype!r}.")
    element = torch.empty((), dtype=dtype).element_size()
    return batch * heads * n * n * element


def measure_attention_cost(ns: Sequence[int], d: int = 64, *, threads: int | None = 1, min_run_time: float = 0.05,
                           rounds: int = 3, seed: int = 0) -> list[dict]:
    """Time :func:`attention` (float32, no mask, width ``d``) for each sequence length in ``ns``.

    Timing is :func:`attn_course.timing.time_ms` (the median of repeated calls after a warm-up), taken
    ``rounds`` times; the fastest round is kept, the one least disturbed by other work on the machine.
    ``threads`` fixes PyTorch's thread count during the measurement (``None`` leaves it). Returns
    one dict per n: ``n``, ``ms`` and ``score_bytes`` (the ``nbytes`` of the actual (n, n) weight
    tensor, which equals :func:`score_matrix_bytes`).
    """
    generator = torch.Generator().manual_seed(seed)
    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    rows = []
    try:
        for n in ns:
            Q, K, V = (torch.randn(n, d, generator=generator) for _ in range(3))  # (n, d) each
            _, weights = attention(Q, K, V)  # (n, n)
            ms = min(time_ms(lambda: attention(Q, K, V), min_run_time=min_run_time) for _ in range(rounds))
            rows.append({"n": n, "ms": ms, "score_bytes": weights.nbytes})
    finally:
        torch.set_num_threads(saved_threads)
    return rows


@styled
def plot_attention_cost(rows: Sequence[dict]) -> plt.Figure:
    """:func:`measure_attention_cost`'s rows against n: the time on log–log axes with the n² line drawn
    through the middle point, the time per score entry (flat = exactly n²), and the weight matrix's bytes
    with the 4·n² line."""
    ns = [r["n"] for r in rows]
    mid = len(ns) // 2
    ms = [r["ms"] for r in rows]
    fig, (ax_time, ax_entry, ax_mem) = plt.subplots(1, 3, figsize=(MAX_WIDTH, 3.6))
    line_plot(ns, {"measured": ms, "reference ∝ n²": [ms[mid] * (n / ns[mid]) ** 2 for n in ns]},
              logx=True, logy=True, xlabel="n", ylabel="milliseconds", title="time", ax=ax_time)
    line_plot(ns, {"time per entry": [t * 1e6 / n**2 for t, n in zip(ms, ns)]}, logx=True,
              xlabel="n", ylabel="ns per score entry", title="time / n²", ax=ax_entry)
    ax_entry.set_ylim(bottom=0)
    line_plot(ns, {"measured nbytes": [r["score_bytes"] for r in rows], "reference 4·n²": [4 * n**2 for n in ns]},
              logx=True, logy=True, xlabel="n", ylabel="bytes", title="weight matrix", ax=ax_mem)
    fig.tight_layout()
    return fig

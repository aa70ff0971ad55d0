"""Checks for notebook 07 (multi-head attention): split_heads, merge_heads, MultiHeadAttention.

Oracles: ``torch.nn.MultiheadAttention`` (weights copied in) wherever A·d_head = d_model, and the
course's reference :class:`attn_course.multihead.MultiHeadAttention` (itself tested against it)
where A·d_head ≠ d_model.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..multihead import merge_heads as ref_merge
from ..multihead import split_heads as ref_split
from ._core import CheckFailed, as_tensor, call, check, describe, expect_close, expect_shape, fail

__all__ = ["check_split_heads", "check_merge_heads", "check_multi_head_attention"]

VIEW_HINT = (" `.view` needs a contiguous tensor and `.transpose` makes a non-contiguous one: use "
             "`.reshape(...)`, or `.contiguous().view(...)`.")

# ---- what the classic mistakes produce ------------------------------------------------------

SPLIT_NO_TRANSPOSE = ("heads split by a reshape straight to (B, A, n, d_head) without a transpose: each "
                      "'head' then holds pieces of several positions (heads mixed with positions). Reshape "
                      "to (B, n, A, d_head) first, then swap axes 1 and 2 with .transpose(1, 2).")
SPLIT_STRIDED = ("the features were split in the wrong order: head h got every A-th feature instead of the "
                 "block of d_head consecutive features h·d_head … (h+1)·d_head − 1. Reshape the last axis "
                 "as (A, d_head), not (d_head, A).")
SPLIT_FORGOT_TRANSPOSE = ("the head axis is still after the positions, (B, n, A, d_head): add .transpose(1, 2) "
                          "so that it becomes (B, A, n, d_head).")
MERGE_NO_TRANSPOSE = ("heads merged by a reshape straight to (B, n, A·d_head) without a transpose: rows of "
                      "the result mix positions (heads mixed with positions). Do .transpose(1, 2) first, "
                      "giving (B, n, A, d_head), then reshape.")
MERGE_INTERLEAVED = ("wrong concat order: the features come out interleaved, ordered (d_head, A) instead "
                     "of (A, d_head). Concatenate whole heads: head 0's d_head features, then head 1's, …")
MERGE_REVERSED = "wrong concat order: the heads are concatenated last head first; head 0 must come first."
MERGE_FORGOT_RESHAPE = "the result is still (B, n, A, d_head): reshape the last two axes into one of size A·d_head."
MERGE_AVERAGED = ("the heads were averaged (or summed) instead of concatenated; multi-head attention "
                  "concatenates them to A·d_head features.")


def _split_pitfalls(x: torch.Tensor, a: int):
    b, n, width = x.shape
    d = width // a
    return [
        (SPLIT_NO_TRANSPOSE, lambda: x.reshape(b, a, n, d)),
        (SPLIT_STRIDED, lambda: x.reshape(b, n, d, a).permute(0, 3, 1, 2)),
        (SPLIT_FORGOT_TRANSPOSE, lambda: x.reshape(b, n, a, d)),
    ]


def _merge_pitfalls(x: torch.Tensor):
    b, a, n, d = x.shape
    return [
        (MERGE_NO_TRANSPOSE, lambda: x.reshape(b, n, a * d)),
        (MERGE_INTERLEAVED, lambda: x.permute(0, 2, 3, 1).reshape(b, n, d * a)),
        (MERGE_REVERSED, lambda: ref_merge(x.flip(1))),
        (MERGE_FORGOT_RESHAPE, lambda: x.transpose(1, 2)),
        (MERGE_AVERAGED, lambda: x.mean(1)),
        (MERGE_AVERAGED, lambda: x.sum(1)),
    ]


def _call_with_view_hint(fn, *args):
    try:
        return call(fn, *args)
    except CheckFailed as exc:
        text = str(exc)
        if type(exc) is CheckFailed and ("view size is not compatible" in text or "contiguous" in text):
            raise CheckFailed(text + VIEW_HINT) from None
        raise


@check("split heads", expects="a function split_heads(x, n_heads) turning (B, n, A·d_head) into (B, A, n, d_head)")
def check_split_heads(fn):
    gen = torch.Generator().manual_seed(7)
    cases = [((2, 5, 12), 3, torch.float32), ((1, 4, 6), 6, torch.float32),
             ((3, 1, 8), 2, torch.float32), ((2, 3, 8), 2, torch.float64)]
    for shape, a, dtype in cases:
        x = torch.randn(*shape, generator=gen, dtype=dtype)
        b, n, width = shape
        case = f"x of shape {shape}, n_heads={a}"
        out = as_tensor(_call_with_view_hint(fn, x, a), f"split_heads(x, {a})")
        expect_close(out, ref_split(x, a), f"split_heads(x, {a})", case=case, pitfalls=_split_pitfalls(x, a))
    return f"matches the reference on {len(cases)} cases: (B, n, A·d_head) → (B, A, n, d_head), one block of features per head"


@check("merge heads", expects="a function merge_heads(x) turning (B, A, n, d_head) into (B, n, A·d_head)")
def check_merge_heads(fn):
    gen = torch.Generator().manual_seed(8)
    cases = [((2, 3, 5, 4), torch.float32), ((1, 6, 4, 1), torch.float32),
             ((3, 2, 1, 4), torch.float32), ((2, 2, 3, 4), torch.float64)]
    for shape, dtype in cases:
        x = torch.randn(*shape, generator=gen, dtype=dtype)
        # contiguous, as `weights @ v` gives it inside the module
        case = f"x of shape {shape}"
        out = as_tensor(_call_with_view_hint(fn, x), "merge_heads(x)")
        expect_close(out, ref_merge(x), "merge_heads(x)", case=case, pitfalls=_merge_pitfalls(x))
    return f"matches the reference on {len(cases)} cases and undoes split_heads: (B, A, n, d_head) → (B, n, A·d_head)"


# ---- the module ---------------------------------------------------------------------------

def _linear(module: nn.Module, *names: str) -> nn.Linear | None:
    for name in names:
        layer = getattr(module, name, None)
        if isinstance(layer, nn.Linear):
            return layer
    return None


def _projections(module: nn.Module, d_model: int, a: int, d_head: int):
    """The module's W^Q, W^K, W^V, W^O as (Linear, rows) slices, after checking their sizes."""
    q, k, v = (_linear(module, f"{p}_proj", f"W_{p}", f"w_{p}", f"W{p.upper()}") for p in "qkv")
    o = _linear(module, "out_proj", "o_proj", "c_proj", "W_o", "w_o")
    fused = _linear(module, "qkv_proj", "c_attn", "in_proj")
    width = a * d_head
    if o is None or (fused is None and None in (q, k, v)):
        found = [name for name, m in module.named_children() if isinstance(m, nn.Linear)]
        fail(f"expected nn.Linear layers named q_proj, k_proj, v_proj and out_proj (W^Q, W^K, W^V, W^O); "
             f"found Linear layers {found or 'none'}. Create them in __init__ with those names.")
    if o.in_features != width:
        if o.in_features == d_model:
            fail(f"W^O (out_proj) has the wrong input size when A·d_head ≠ d_model: it takes {o.in_features} "
                 f"= d_model inputs, but the concatenated heads have A·d_head = {a}·{d_head} = {width} features. "
                 f"Use nn.Linear(n_heads * d_head, d_model).")
        fail(f"W^O (out_proj) takes {o.in_features} inputs; the concatenated heads have A·d_head = {width}.")
    if o.out_features != d_model:
        fail(f"W^O (out_proj) gives {o.out_features} outputs; it must map back to d_model = {d_model}.")
    layers = {"q": (q, 0), "k": (k, 0), "v": (v, 0)} if fused is None else {
        "q": (fused, 0), "k": (fused, width), "v": (fused, 2 * width)}
    if fused is not None and fused.out_features != 3 * width:
        fail(f"the fused projection gives {fused.out_features} outputs; expected 3·A·d_head = {3 * width}.")
    for name, (layer, _) in layers.items():
        if layer.in_features != d_model:
            fail(f"W^{name.upper()} takes {layer.in_features} inputs; the input vectors have d_model = {d_model}.")
        if fused is None and layer.out_features != width:
            hint = (" It should project to A·d_head, not to d_model — use the d_head you were given."
                    if layer.out_features == d_model or layer.out_features == (d_model // a) * a else "")
            fail(f"W^{name.upper()} ({name}_proj) gives {layer.out_features} outputs; expected "
                 f"A·d_head = {a}·{d_head} = {width}.{hint}")
    return layers, o, width


@torch.no_grad()
def _randomise(layers, o, width, gen, dtype):
    """Fill the learner's weights with seeded values large enough that every mistake shows."""
    seen = set()
    for layer, start in list(layers.values()) + [(o, None)]:
        rows = slice(None) if start is None else slice(start, start + width)
        fan_in = layer.in_features
        w = torch.randn(layer.weight[rows].shape, generator=gen, dtype=torch.float64) * 1.6 / math.sqrt(fan_in)
        layer.weight[rows] = w.to(layer.weight.dtype)
        if layer.bias is not None and (id(layer), start) not in seen:
            layer.bias[rows] = (0.3 * torch.randn(layer.bias[rows].shape, generator=gen, dtype=torch.float64)).to(layer.bias.dtype)
        seen.add((id(layer), start))


def _params(layers, o, width, d_model):
    """Plain weight/bias tensors (float64) of W^Q, W^K, W^V, W^O, biases as zeros when absent."""
    def take(layer, start):
        rows = slice(None) if start is None else slice(start, start + width)
        w = layer.weight[rows].detach().to(torch.float64)
        b = (layer.bias[rows].detach().to(torch.float64) if layer.bias is not None
             else torch.zeros(w.shape[0], dtype=torch.float64))
        return w, b
    p = {name: take(*layers[name]) for name in "qkv"}
    p["o"] = take(o, None)
    return p


def _forward(p, x, a, *, scale, split="ok", merge="ok", softmax_dim=-1, out_proj=True):
    """Multi-head attention from plain tensors, optionally with one classic mistake."""
    b, n, _ = x.shape

    def lin(name, t):
        w, bias = p[name]
        return t @ w.T + bias

    def do_split(t):
        d = t.shape[-1] // a
        if split == "no_transpose":
            return t.reshape(b, a, n, d)
        return ref_split(t, a)

    q, k, v = (do_split(lin(name, x)) for name in "qkv")
    weights = torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=softmax_dim)
    heads = weights @ v  # (B, A, n, d_head)
    if merge == "no_transpose":
        cat = heads.reshape(b, n, -1)
    elif merge == "interleaved":
        cat = heads.permute(0, 2, 3, 1).reshape(b, n, -1)
    else:
        cat = ref_merge(heads)
    return (lin("o", cat) if out_proj else cat), weights


SCALE_D_MODEL = ("the scores were divided by √d_model; each head's dot product has only d_head terms, so the "
                 "scale is 1/√d_head.")
SCALE_NONE = "the scores were not scaled: divide them by √d_head before the softmax."
SCALE_D_HEAD = "the scores were divided by d_head; divide by √d_head."
SOFTMAX_AXIS = "the softmax ran over the queries (dim=-2); it must run over the keys (dim=-1)."
NO_OUT_PROJ = "W^O was not applied: pass the concatenated heads through out_proj."


@check("multi-head attention",
       expects="an nn.Module class MultiHeadAttention(d_model, n_heads, d_head) whose forward(x) returns (out, weights)")
def check_multi_head_attention(module_cls):
    gen = torch.Generator().manual_seed(4)
    # (d_model, A, d_head, B, n, dtype): A·d_head = d_model, ≠ d_model (twice, one GloVe-sized), one position
    cases = [(12, 3, 4, 2, 5, torch.float32), (10, 3, 4, 2, 4, torch.float32),
             (50, 3, 16, 1, 6, torch.float32), (8, 2, 4, 3, 1, torch.float32), (12, 4, 3, 2, 4, torch.float64)]
    compared_with_torch = 0
    for d_model, a, d_head, b, n, dtype in cases:
        case = f"d_model={d_model}, n_heads={a}, d_head={d_head}, x of shape {(b, n, d_model)}"
        if isinstance(module_cls, nn.Module):
            fail("got a module instance; pass the class itself, `check_multi_head_attention(MultiHeadAttention)`, "
                 "so that the check can build it with several sizes.")
        module = call(module_cls, d_model, a, d_head=d_head)
        if not isinstance(module, nn.Module):
            fail(f"MultiHeadAttention({d_model}, {a}, d_head={d_head}) gave {describe(module)}; expected an "
                 "nn.Module (does the class inherit from nn.Module and call super().__init__()?).")
        layers, o, width = _projections(module, d_model, a, d_head)
        module = module.to(dtype).eval()
        _randomise(layers, o, width, gen, dtype)
        p = _params(layers, o, width, d_model)
        x = torch.randn(b, n, d_model, generator=gen, dtype=dtype)

        with torch.no_grad():
            result = call(module, x)
        if isinstance(result, torch.Tensor) or not isinstance(result, (tuple, list)) or len(result) != 2:
            fail(f"forward(x) returned {describe(result)}; expected a pair (out, weights): out (B, n, d_model) "
                 f"and the attention weights (B, A, n, n).")
        out = as_tensor(result[0], "out (the first value forward returns)")
        weights = as_tensor(result[1], "weights (the second value forward returns)")
        if tuple(out.shape) != (b, n, d_model):
            hint = NO_OUT_PROJ if tuple(out.shape) == (b, n, width) else ""
            expect_shape(out, (b, n, d_model), f"out ({case})", hint)
        expect_shape(weights, (b, a, n, n), f"weights ({case})",
                     "Return the weights of every head, before they are averaged, shaped (B, A, n, n).")

        x64 = x.to(torch.float64)
        if a * d_head == d_model:  # the independent oracle: PyTorch's own module with the same weights
            oracle = nn.MultiheadAttention(d_model, a, batch_first=True).to(torch.float64).eval()
            with torch.no_grad():
                oracle.in_proj_weight.copy_(torch.cat([p["q"][0], p["k"][0], p["v"][0]]))
                oracle.in_proj_bias.copy_(torch.cat([p["q"][1], p["k"][1], p["v"][1]]))
                oracle.out_proj.weight.copy_(p["o"][0])
                oracle.out_proj.bias.copy_(p["o"][1])
                want_out, want_w = oracle(x64, x64, x64, average_attn_weights=False)
            compared_with_torch += 1
        else:
            want_out, want_w = _forward(p, x64, a, scale=1 / math.sqrt(d_head))

        def wrong(**kw):
            return lambda: _forward(p, x64, a, **{"scale": 1 / math.sqrt(d_head), **kw})

        mistakes = [
            (SPLIT_NO_TRANSPOSE, wrong(split="no_transpose")),
            (SCALE_D_MODEL, wrong(scale=1 / math.sqrt(d_model))),
            (SCALE_NONE, wrong(scale=1.0)),
            (SCALE_D_HEAD, wrong(scale=1 / d_head)),
            (SOFTMAX_AXIS, wrong(softmax_dim=-2)),
            (MERGE_NO_TRANSPOSE, wrong(merge="no_transpose")),
            (MERGE_INTERLEAVED, wrong(merge="interleaved")),
            (NO_OUT_PROJ, wrong(out_proj=False)),
        ]
        weight_pitfalls = [(msg, (lambda f=f: f()[1])) for msg, f in mistakes[:5]]
        out_pitfalls = [(msg, (lambda f=f: f()[0])) for msg, f in mistakes]
        tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-9, rtol=1e-7)
        expect_close(weights, want_w, "the attention weights", case=case, pitfalls=weight_pitfalls, **tol)
        expect_close(out, want_out, "out", case=case, pitfalls=out_pitfalls, **tol)
    return (f"matches nn.MultiheadAttention on {compared_with_torch} cases (weights copied) and the reference "
            f"on {len(cases) - compared_with_torch} with A·d_head ≠ d_model")

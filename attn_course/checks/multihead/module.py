"""check_MultiHeadAttention: the learner's four projections found, the cases, the check, and its measured causes."""

from __future__ import annotations

import math
import re

import numpy as np
import torch

from ..compare import Failure, same
from ..core import Learner, LearnerRaised, LearnerTimedOut, check, expect_close, fail, fmt, learner_error
from ..kit import Suspects, bool_hint, call_explained, explain_raise, half_rounded, unpack
from ..result import Diagnosis
from .module_mistakes import MODULE_MISTAKES, Case, multihead
from .shared import PATTERNS, and_


# ============================================================================ the module: finding its layers
_ROLE_TOKENS = {"q": {"q", "query", "queries", "wq"}, "k": {"k", "key", "keys", "wk"},
                "v": {"v", "value", "values", "wv"}, "o": {"o", "out", "output", "wo", "c_proj", "proj", "dense"},
                "qkv": {"qkv", "c_attn", "in_proj", "wqkv", "attn"}}
_ROLE_NAMES = {"q": "W^Q (q_proj)", "k": "W^K (k_proj)", "v": "W^V (v_proj)", "o": "W^O (out_proj)"}


def _role(name: str) -> str | None:
    """Which projection a layer's name says it is (``q_proj``, ``W_q``, ``query``, ``out_proj``, ``c_attn``…)."""
    last = name.rsplit(".", 1)[-1].lower()
    tokens = {t for t in re.split(r"[_\W\d]+", last) if t} | {last}
    return next((role for role in ("qkv", "q", "k", "v", "o") if tokens & _ROLE_TOKENS[role]), None)


def _sizes_cause(role: str, p_in: int, p_out: int, want: tuple[int, int], a: int, d_head: int, d_model: int) -> str:
    """What a projection's (in, out) sizes say went wrong, if they say it; the heads' side should be A·d_head wide."""
    if (p_in, p_out) == want[::-1]:
        return f"nn.Linear takes (in_features, out_features); yours has them the other way round: {p_in} in"
    heads, other, other_want = (p_in, p_out, want[1]) if role == "o" else (p_out, p_in, want[0])
    if role == "qkv" or other != other_want or heads == a * d_head:
        return ""
    if heads == d_model:
        return (f"you sized W^O for d_model = {d_model} inputs, but the concatenated heads have A·d_head = "
                f"{a * d_head} features" if role == "o" else f"you projected to d_model = {d_model} features; the "
                f"heads need A·d_head = {a * d_head}") + " (they differ when d_head ≠ d_model / A)"
    if heads == a * (d_model // a) and d_model // a != d_head:
        return f"you used d_model // n_heads = {d_model // a}, not d_head (default ⌈d_model / n_heads⌉ = {d_head})"
    if heads % d_head == 0:
        made = heads // d_head
        return (f"your projection makes {made} head{'s' if made != 1 else ''} of width d_head = {d_head}, but "
                f"n_heads = {a}: the head count is hard-coded or taken from somewhere else")
    if heads % a == 0:
        return (f"your projection makes n_heads = {a} heads of width {heads // a}, but d_head = {d_head} here "
                "(default ⌈d_model / n_heads⌉)")
    return ""


def _layers(info: dict, d_model: int, a: int, d_head: int, tried: str) -> dict:
    """The learner's W^Q, W^K, W^V, W^O as {"q": layer name, …} after checking their sizes, with ``linears`` (name →
    (in, out, bias)), ``fused`` and ``guessed`` (four unnamed layers taken in creation order)."""
    linears = {name: spec for name, kind, spec in info.get("modules", []) if spec is not None}
    width = a * d_head
    found: dict[str, list[str]] = {}
    for name in linears:
        if role := _role(name):
            found.setdefault(role, []).append(name)
    fused = len(found.get("qkv", [])) == 1 and not all(len(found.get(r, [])) == 1 for r in "qkv")
    named = len(found.get("o", [])) == 1 and (fused or all(len(found.get(r, [])) == 1 for r in "qkv"))
    guessed = not named and len(linears) == 4 and not found
    if guessed:  # four unnamed layers (the Annotated Transformer's clones(nn.Linear, 4)): creation order Q, K, V, O
        found, named = {role: [name] for role, name in zip("qkvo", linears)}, True
    if not named:
        missing = [_ROLE_NAMES[r] for r in "qkvo" if not found.get(r) and not (r != "o" and found.get("qkv"))]
        several = [f"{_ROLE_NAMES[r]}: {', '.join(found[r])}" for r in "qkvo" if len(found.get(r, [])) > 1]
        cause = (f"no nn.Linear layer of yours is named as {and_(missing)}: it was never created in __init__, is not "
                 "an nn.Linear, or has another name" if missing else
                 f"several layers are named as one projection ({'; '.join(several)})")
        fail("W^Q, W^K, W^V, W^O not found", tried=tried, cause=cause,
             got=f"nn.Linear layers: {', '.join(f'{n} ({s[0]} → {s[1]})' for n, s in linears.items()) or 'none'}",
             expected="nn.Linear layers q_proj, k_proj, v_proj (d_model → A·d_head) and out_proj (A·d_head → "
                      "d_model), or one fused qkv_proj (d_model → 3·A·d_head) and out_proj",
             fix="create the projections in __init__ as nn.Linear layers with the names in the docstring")
    qkv = [("qkv", "the fused projection", d_model, "d_model", 3 * width, "3·A·d_head",
            "qkv_proj = nn.Linear(d_model, 3 * n_heads * d_head): q, k and v side by side")] if fused else [
        (r, f"W^{r.upper()}", d_model, "d_model", width, "A·d_head",
         f"{r}_proj = nn.Linear(d_model, n_heads * d_head)") for r in "qkv"]
    o = ("o", "W^O", width, "A·d_head", d_model, "d_model",
         "out_proj = nn.Linear(n_heads * d_head, d_model): W^O maps the concatenated heads back to d_model")
    for role, label, want_in, in_name, want_out, out_name, create in [*qkv, o]:
        name = found[role][0]
        p_in, p_out = linears[name][:2]
        if p_in != want_in:
            shown = "d_model" if role == "o" and p_in == d_model else p_in
            summary = f"{label} takes {shown} inputs, not {in_name} = {want_in}"
        elif p_out != want_out:
            summary = f"{label} gives {p_out} outputs, not {out_name} = {want_out}"
        else:
            continue
        only_width = role in ("q", "k", "v") and p_in == want_in  # the heads' side alone is wrong
        fail(summary, tried=tried, got=f"{name} = nn.Linear({p_in}, {p_out})",
             expected=f"nn.Linear({in_name} = {want_in}, {out_name} = {want_out}): {a} heads of d_head = {d_head}",
             cause=_sizes_cause(role, p_in, p_out, (want_in, want_out), a, d_head, d_model),
             fix=("use the d_head you are given (default ⌈d_model / n_heads⌉): " if only_width else "create ")
             + create)
    roles = {r: found["qkv" if fused and r != "o" else r][0] for r in "qkvo"}
    return {**roles, "fused": fused, "guessed": guessed, "linears": linears}


def _weights_for(layers: dict, d_model: int, width: int, gen: torch.Generator) -> tuple[dict, dict]:
    """Seeded W^Q, W^K, W^V, W^O and biases: (float64 values for the oracle, float32 tensors by parameter name)."""
    P, params, linears = {}, {}, layers["linears"]
    for role in "qkvo":
        fan_in, fan_out = (width, d_model) if role == "o" else (d_model, width)
        w = torch.randn(fan_out, fan_in, generator=gen, dtype=torch.float64) * 1.2 / math.sqrt(fan_in)
        b = 0.3 * torch.randn(fan_out, generator=gen, dtype=torch.float64)  # drawn even for a layer without bias
        b = b if linears[layers[role]][2] else torch.zeros_like(b)  # (so that the later draws stay the same)
        P[role] = (w.to(torch.float32).to(torch.float64), b.to(torch.float32).to(torch.float64))
    groups = [("qkv", layers["q"])] if layers["fused"] else [(r, layers[r]) for r in "qkv"]
    for roles, name in [*groups, ("o", layers["o"])]:
        params[f"{name}.weight"] = torch.cat([P[r][0] for r in roles]).to(torch.float32)
        if linears[name][2]:
            params[f"{name}.bias"] = torch.cat([P[r][1] for r in roles]).to(torch.float32)
    return P, params


# ============================================================================ the module: cases and check
def _cases() -> list[dict]:
    g = torch.Generator().manual_seed(11)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()  # (n_q, n_k): query i sees keys 0 … i
    key_padding = (torch.arange(6) < torch.tensor([6, 3])[:, None])[:, None, None, :]  # (2, 1, 1, 6)
    decoder = causal & (torch.arange(5) < torch.tensor([5, 2])[:, None])[:, None, None, :]  # (2, 1, 5, 5)
    per_head = torch.rand(2, 3, 4, 6, generator=g) < 0.5  # (B, A, n_q, n_k)
    per_head[..., 0] = True  # no fully masked row here
    per_head[1, :, :, 0] = False
    per_head[1, :, :, 5] = True
    fully = torch.ones(2, 1, 4, 4, dtype=torch.bool)  # (B, 1, n_q, n_k)
    fully[1, 0, 2] = False  # query 2 of sequence 1 may attend to nothing
    fully[0, 0, :, 3] = False
    return [
        dict(name="self-attention, d_model = 15, 3 heads of 5", d=15, a=3, h=5, b=2, n=7),
        dict(name="A·d_head ≠ d_model: d_model = 10, 3 heads of 4", d=10, a=3, h=4, b=2, n=4),
        dict(name="A·d_head ≠ d_model: d_model = 6, 2 heads of 5", d=6, a=2, h=5, b=2, n=3),
        dict(name="default d_head: MultiHeadAttention(16, 4), heads of 16 / 4 = 4", d=16, a=4, h=None, b=1, n=6),
        dict(name="default d_head when 4 heads do not divide d_model = 10: ⌈10 / 4⌉ = 3", d=10, a=4, h=None, b=2, n=3),
        dict(name="one head and one position", d=4, a=1, h=4, b=3, n=1),
        dict(name="6 heads of width 1", d=6, a=6, h=1, b=2, n=4),
        dict(name="a causal mask (5, 5)", d=12, a=3, h=4, b=2, n=5, mask=causal),
        dict(name="cross-attention, x_kv another sequence of the same length", d=10, a=2, h=4, b=2, n=5, m=5),
        dict(name="cross-attention, x_kv with n_k = 7 keys for n_q = 4 queries", d=12, a=2, h=6, b=2, n=4, m=7),
        dict(name="cross-attention with a key-padding mask (2, 1, 1, 6)", d=12, a=3, h=4, b=2, n=3, m=6,
             mask=key_padding),
        dict(name="a decoder mask (2, 1, 5, 5): causal and padding", d=8, a=2, h=4, b=2, n=5, mask=decoder),
        dict(name="a different mask per head (2, 3, 4, 6), cross-attention", d=9, a=3, h=3, b=2, n=4, m=6,
             mask=per_head),
        dict(name="a fully masked row (query 2 of sequence 1 may attend to nothing)", d=8, a=2, h=4, b=2, n=4,
             mask=fully),
    ]


def _unpack(result, tried: str, b: int, a: int, n_q: int, n_k: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    shapes = [tuple(t.shape) if isinstance(t, (torch.Tensor, np.ndarray)) else None for t in result] \
        if isinstance(result, (tuple, list)) else []
    if shapes == [(b, a, n_q, n_k), (b, n_q, d)]:
        fail("forward returned (weights, out), not (out, weights)", tried=tried,
             got=f"first a tensor of shape {(b, a, n_q, n_k)} (the weights), then one of shape {(b, n_q, d)} (out)",
             expected=f"out {(b, n_q, d)}, then the weights {(b, a, n_q, n_k)}",
             cause="you returned the two results in the opposite order", fix="end forward with `return out, weights`")
    return unpack(result, ("out", "weights"), tried=tried, fix="end forward with `return self.out_proj(...), weights`")


def _forward_hint(exc: LearnerRaised, mask, n: int, m: int | None, wide: bool) -> dict:
    """Cause and fix of an exception in forward, from what this case adds (``wide``: A·d_head ≠ d_model)."""
    shapeish = any(w in exc.message for w in ("size", "shape", "dimension", "broadcast", "match"))
    if mask is not None and shapeish:
        return dict(cause=f"the mask {tuple(mask.shape)} does not broadcast against the scores (B, A, n_q, n_k), "
                          "though the same module ran without a mask: an added axis (unsqueeze) or a reshape moved its "
                          "axes",
                    fix="use the mask as it is: (n_q, n_k), (B, 1, n_q, n_k), (B, 1, 1, n_k) and (B, A, n_q, n_k) all "
                        "broadcast against the scores")
    if m is not None and m != n and shapeish:
        return dict(cause=f"with x_kv of {m} positions and x_q of {n}, your code mixes the two lengths: keys and "
                          "values have n_k rows (from x_kv), queries n_q (from x_q)",
                    fix="k = k_proj(x_kv), v = v_proj(x_kv); reshape each with its own length")
    if bool_hint(exc):
        return bool_hint(exc)
    if wide and shapeish:
        return dict(cause="your forward assumes A·d_head = d_model somewhere (a reshape to d_model, or "
                          "d_model // n_heads as the head width)",
                    fix="reshape with n_heads and d_head, and merge to n_heads·d_head features")
    return explain_raise(exc, patterns=PATTERNS)


_PARTS = (("weights", "the weights", ("batch entries", "heads", "queries", "keys"),
           "return the weights of every head, shaped (B, A, n_q, n_k)"),
          ("out", "out", ("batch entries", "queries", "features"),
           "out has one row per query and d_model features: (B, n_q, d_model)"))


@check("MultiHeadAttention", kind="class",
       expects="an nn.Module class MultiHeadAttention(d_model, n_heads, d_head=None) whose forward(x_q, x_kv=None, "
               "mask=None) returns (out, weights)")
def check_MultiHeadAttention(cls: Learner) -> str:
    info = cls.inspect()
    if not info.get("module_class"):
        fail("MultiHeadAttention is not an nn.Module", tried="checking the class MultiHeadAttention",
             got=f"a class with bases {', '.join(info.get('bases') or []) or 'object'}",
             expected="a subclass of nn.Module", fix="define `class MultiHeadAttention(nn.Module):` and call "
             "super().__init__() first in __init__")
    gen = torch.Generator().manual_seed(4)
    suspects = Suspects(MODULE_MISTAKES, atol=2e-5, rtol=1e-4)
    with_torch, cases = 0, _cases()
    for case in cases:
        d, a, b, n, m, mask = case["d"], case["a"], case["b"], case["n"], case.get("m"), case.get("mask")
        d_head = case["h"] if case["h"] is not None else -(-d // a)
        inputs = f"x_q {(b, n, d)}" + (f", x_kv {(b, m, d)}" if m else ", x_kv=None")
        inputs += "" if mask is None else f", mask {tuple(mask.shape)}"
        given = (d, a) if case["h"] is None else (d, a, d_head)  # MultiHeadAttention's arguments
        tried = f"MultiHeadAttention{given} then forward({inputs}) — {case['name']}"
        refused = [(kind, "", f"your __init__ refuses d_model = {d} with {a} heads; with d_head given (or its default "
                    "⌈d_model / n_heads⌉) A need not divide d_model", "drop the divisibility check: W^Q maps d_model → "
                    "n_heads·d_head, W^O maps it back") for kind in ("AssertionError", "ValueError") if d % a]
        module = call_explained(cls.construct, *given, tried=tried, expected="a module", patterns=[*refused, *PATTERNS])
        minfo = module.inspect()
        if minfo.get("kind") != "module":
            fail("MultiHeadAttention(...) is not an nn.Module", tried=tried, got=str(minfo.get("type")),
                 expected="an nn.Module", fix="define `class MultiHeadAttention(nn.Module):`")
        module.method("eval")()  # a deterministic forward: dropout, if the learner added any, off
        layers = _layers(minfo, d, a, d_head, tried)
        P, params = _weights_for(layers, d, a * d_head, gen)
        call_explained(module.set_parameters, params, tried=f"loading weights into {tried}",
                       expected="nn.Linear layers")
        x_q = torch.randn(b, n, d, generator=gen)
        x_kv = torch.randn(b, m, d, generator=gen) if m else None
        sig = minfo.get("forward_signature") or []
        if (m or mask is not None) and not any(p["kind"] == "VAR_POSITIONAL" for p in sig) and \
                len([p for p in sig if p["kind"] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]) < 3:
            fail("forward does not take (x_q, x_kv=None, mask=None)", tried=tried,
                 got=f"forward({', '.join(p['name'] for p in sig)})", expected="forward(x_q, x_kv=None, mask=None)",
                 fix="add the parameters x_kv=None (keys and values from x_q when None) and mask=None")
        args = (x_q,) if m is None and mask is None else (x_q, x_kv) if mask is None else (x_q, x_kv, mask)
        try:
            result = module(*args)
        except LearnerRaised as exc:
            raise Failure(learner_error(exc, tried=tried, expected="(out, weights)",
                                        **_forward_hint(exc, mask, n, m, a * d_head != d))) from None
        got = dict(zip(("out", "weights"), _unpack(result, tried, b, a, n, m or n, d)))
        ctx = Case(P, x_q, x_kv, mask, a, d_head, d, layers["fused"])
        with_torch += ctx.by_torch
        mine = lambda c, view: got[view] if c is ctx else None  # noqa: E731 - the learner's answer, for the engine
        try:
            for view, what, axes, fix in _PARTS:  # the weights first: out depends on them
                want = getattr(ctx, view)
                half_rounded(got[view], want, tried=tried, what="out's values" if view == "out" else what, fix=fix)
                suspects.expect(got[view], want, (ctx, view), tried=tried, again=mine, distinguish=[(ctx, "out")],
                                what=what, axes=axes, fix=fix if got[view].shape != want.shape else "")
        except Failure as failure:
            if not failure.diagnosis.cause:
                _explain_mismatch(failure.diagnosis, module, args, result, got, ctx, tried, layers)
            raise
        if case is cases[0]:
            _expect_gradient(module, P, x_q, a, d_head, tried, gen, got["out"])
    return (f"matches nn.MultiheadAttention on {with_torch} cases (weights copied) and the float64 reference on "
            f"{len(cases) - with_torch} (A·d_head ≠ d_model, a fully masked row): self-, causal and cross-attention, "
            "masks of four shapes")


# ============================================================================ the module: measured causes
def _explain_mismatch(d: Diagnosis, module: Learner, args: tuple, result, got: dict, ctx: Case, tried: str,
                      layers: dict) -> None:
    """Add a cause to the diagnosis ``d`` of a mismatch no known mistake explains, when a measurement finds one."""
    try:
        again = module(*args)
    except (LearnerRaised, LearnerTimedOut):
        again = None
    if isinstance(again, (tuple, list)) and len(again) == 2 and all(isinstance(t, torch.Tensor) for t in again) \
            and not all(isinstance(u, torch.Tensor) and same(t, u, atol=0.0, rtol=0.0) for t, u in zip(again, result)):
        fail("different results for the same input", tried=tried + ", twice",
             got="two calls with the same input, in eval() mode, gave different numbers", expected="the same result",
             cause="something random runs in forward even in eval() mode: dropout that ignores self.training "
                   "(F.dropout(w, p) drops by default, training=True) or random numbers drawn in forward",
             fix="use an nn.Dropout layer (eval() turns it off) or F.dropout(w, p, training=self.training)")
    out, weights = got["out"], got["weights"]
    weights_shaped = tuple(weights.shape) == tuple(ctx.weights.shape)
    if weights_shaped and same(weights, ctx.weights, atol=2e-5, rtol=1e-4):
        diff = (out.to(torch.float64) - ctx.out).flatten(0, -2) if out.shape == ctx.out.shape else None  # (B·n_q, d)
        if diff is not None and diff.shape[0] > 1 and same(diff, diff[:1].expand_as(diff), atol=2e-5, rtol=1e-4):
            d.summary, d.cause = "out off by one vector at every position", (
                "your out differs from the expected one by the same vector at every batch entry and query: a constant "
                "(a bias) added or missing")
            return
    elif weights_shaped and weights.is_floating_point() and (
            _fitted_scale(d, ctx, weights) or _broken_property(d, ctx, weights)):
        return
    if not _masked_rows_only(d, ctx, out, weights) and layers["guessed"]:
        d.cause = (f"your four nn.Linear layers ({', '.join(layers['linears'])}) have no names that say which is "
                   "which, so the check took them in the order they were created as W^Q, W^K, W^V, W^O")
        d.fix = "name them q_proj, k_proj, v_proj and out_proj as the docstring says (or create them in that order); " \
                "then compare your steps with the docstring"


def _fitted_scale(d: Diagnosis, ctx: Case, weights: torch.Tensor) -> bool:
    """Name the factor c when the learner's weights are masked_softmax(c·q·kᵀ) for some c other than 1/√d_head."""
    P, x_q, x_kv, mask, a, d_head = ctx.P, ctx.x_q, ctx.x_kv, ctx.mask, ctx.a, ctx.d_head
    raw = multihead(P, x_q, x_kv, None, a, d_head, scale=1.0, returns="raw_scores")[1]  # (B, A, n_q, n_k)
    w = weights.detach().to(torch.float64)
    ok = (w > 0) & ctx.allowed
    count = ok.sum(-1, keepdim=True).clamp(min=1)
    centred = lambda t: torch.where(ok, t - torch.where(ok, t, 0.0).sum(-1, keepdim=True) / count, 0.0)  # noqa: E731
    log_w, r = centred(w.clamp(min=1e-300).log()), centred(raw)  # over each row's allowed keys
    den = float((r * r).sum())
    c = float((log_w * r).sum()) / den if den >= 1e-12 else 0.0  # least squares: log w ≈ c·raw + row constant
    if not math.isfinite(c) or abs(c) < 1e-6 or abs(c * math.sqrt(d_head) - 1) < 1e-4 or \
            not same(w, multihead(P, x_q, x_kv, mask, a, d_head, scale=c)[1], atol=2e-5, rtol=1e-4):
        return False
    named = {"1/(2·√d_head)": 1 / (2 * math.sqrt(d_head)), "1/√n_heads": 1 / math.sqrt(a),
             # the textbook scale, though d_head is given: floored, it can equal n_heads (10 // 3 = 3)
             "1/√(d_model // n_heads)": 1 / math.sqrt(max(ctx.x_q.shape[-1] // a, 1)),
             "1/(n_heads·√d_head)": 1 / (a * math.sqrt(d_head)), "1/d_head²": 1 / d_head ** 2,
             "2/√d_head": 2 / math.sqrt(d_head), "−1/√d_head": -1 / math.sqrt(d_head)}
    name = " or ".join(k for k, v in named.items() if abs(c - v) <= 1e-3 * abs(v))  # all the names of that number
    d.summary = f"scores multiplied by {name or fmt(c)}, not 1/√d_head"
    d.cause = (f"your weights are the softmax of q·kᵀ × {fmt(c)} (= 1/{fmt(1 / c)}"
               + (f", that is {name}" + (", the same number here" if " or " in name else "") if name else "")
               + f"); the scale is 1/√d_head = 1/{fmt(math.sqrt(d_head))}")
    d.fix = "divide the scores q @ k.transpose(-2, -1) by math.sqrt(d_head), once"
    return True


def _broken_property(d: Diagnosis, ctx: Case, weights: torch.Tensor) -> bool:
    """Name the first property of right weights that the learner's break: blocked keys, allowed keys, row sums."""
    w, full = weights.detach().to(torch.float64), ctx.allowed
    leak, missing = (w.abs() > 1e-6) & ~full, (w.abs() <= 1e-12) & full & (ctx.weights > 1e-6)
    if leak.any():
        where = tuple(int(i) for i in leak.nonzero()[0])
        d.summary = "weight on blocked keys"
        d.cause = (f"your weights put {fmt(float(w[where]))} on entry {where} (batch, head, query, key), which the "
                   "mask blocks (False = may not attend)")
    elif missing.any():
        where = tuple(int(i) for i in missing.nonzero()[0])
        d.summary = "zero weight on keys the mask allows"
        d.cause = (f"your weights are exactly 0 at entry {where} (batch, head, query, key), which "
                   + ("no mask blocks" if ctx.mask is None else "the mask allows")
                   + "; a softmax over the allowed keys is never exactly 0 on one of them")
    else:
        sums = w.sum(-1)[full.any(-1)]  # the rows with at least one allowed key
        if not (sums.numel() and torch.isfinite(sums).all() and float((sums - 1).abs().max()) > 1e-3):
            return False
        lo, hi = float(sums.min()), float(sums.max())
        d.summary = "weight rows do not sum to 1"
        d.cause = ("each query's weights are a distribution over its keys and sum to 1; yours sum to "
                   + (f"{fmt(lo)}" if hi - lo < 1e-6 else f"between {fmt(lo)} and {fmt(hi)}"))
    return True


def _masked_rows_only(d: Diagnosis, ctx: Case, out: torch.Tensor, weights: torch.Tensor) -> bool:
    """Name a difference confined to the queries that may attend to nothing (every key masked)."""
    empty = ~ctx.allowed.any(-1)  # (B, A, n_q): queries that may attend to nothing (none without a mask)
    for got, want, rows, what in ((weights, ctx.weights, empty, "weights"), (out, ctx.out, empty.all(1), "out")):
        if not empty.any() or tuple(got.shape) != tuple(want.shape) or same(got, want, atol=2e-5, rtol=1e-4):
            continue
        bad_rows = (~torch.isclose(got.to(torch.float64), want, atol=2e-5, rtol=1e-4, equal_nan=True)).any(-1)
        if bad_rows.any() and not (bad_rows & ~rows).any():
            d.summary = f"{what} wrong only for the queries that may attend to nothing"
            d.cause = (f"your {what} {'differ' if what == 'weights' else 'differs'} only for the queries that may "
                       "attend to nothing (every key masked): their weights are all 0, so their heads give zero "
                       "vectors and their out is out_proj(0), the bias")
            d.fix = ("for a fully masked row, return zero weights (masked_softmax(scores, mask) does) and let out_proj "
                     "map the zero vector as it maps any other")
            return True
    return False


def _expect_gradient(module: Learner, P: dict, x_q: torch.Tensor, a: int, d_head: int, tried: str,
                     gen: torch.Generator, first: torch.Tensor) -> None:
    """out must be differentiable: gradients reach x_q (and so the projections), as autograd gives them; this second
    call on the same x_q must give the same out as the first (``first``)."""
    upstream = torch.randn(*x_q.shape[:-1], P["o"][0].shape[0], generator=gen)
    x = x_q.to(torch.float64).requires_grad_(True)
    with torch.enable_grad():  # the oracle's gradient, whatever grad mode the learner's forward left behind
        (want,) = torch.autograd.grad((multihead(P, x, None, None, a, d_head)[0] * upstream).sum(), x)
    tried = f"{tried}, then out.backward(g): the gradient with respect to x_q"
    try:
        again, grads = module.vjp((x_q,), upstream, wrt=(0,), index=0)
    except (LearnerRaised, LearnerTimedOut) as exc:
        raise Failure(learner_error(exc, tried=tried, expected="a gradient for x_q")) from None
    out = again[0] if isinstance(again, (tuple, list)) and again else None
    if isinstance(out, torch.Tensor) and out.shape == first.shape and not same(out, first, atol=1e-5, rtol=1e-5):
        fail("different results for the same input", tried=tried, got="the second call of forward on the same x_q, "
             f"in eval() mode, gave out off by up to {fmt(float((out.double() - first.double()).abs().max()))} from "
             "the first", expected="the same out", cause="something in forward changes from one call to the next: "
             "state kept on self between calls (a cache of keys and values, a counter) or random numbers drawn "
             "(dropout that ignores self.training)", fix="compute out from the inputs alone: store nothing on self "
             "in forward, and let eval() turn any dropout off (nn.Dropout, or F.dropout(w, p, training=self.training))")
    got = grads[0] if isinstance(grads, tuple) and grads else None
    if not isinstance(got, torch.Tensor):
        fail("no gradient flows back through out", tried=tried, got="out does not depend on x_q through autograd",
             expected=f"a gradient of shape {tuple(x_q.shape)}",
             cause="forward cut the autograd graph (.detach(), torch.no_grad() or torch.set_grad_enabled(False), "
                   ".item()/.tolist() or a NumPy round trip), so W^Q, W^K, W^V, W^O could never be trained",
             fix="compute out with torch operations only, without detaching it")
    expect_close(got, want, tried=tried, what="the gradient", atol=1e-4, rtol=1e-3)

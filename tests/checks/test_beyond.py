"""Checks of notebook 13 (attn_course.checks.beyond): every mistake the checks name is rejected with that
diagnosis, correct alternatives (einsum, cumsum instead of a loop, float64 inside, other chunk sizes, a
gather of the kept key blocks…) are accepted, and both verdicts survive record → replay (the fixtures).

The answers below are written as a learner would type them, independently of the checks' own variants."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_course.checks.beyond import (check_block_sparse_attention, check_causal_linear_attention,
                                       check_chunked_linear_attention, check_linear_attention,
                                       check_positive_random_features)
from attn_course.checks.result import Status
from tests.checks.test_voice import assert_voice


def phi(x):
    return F.elu(x) + 1


# ============================================================================ linear attention
def lin_ref(q, k, v):
    fq, fk = phi(q), phi(k)
    return (fq @ (fk.transpose(-2, -1) @ v)) / (fq @ fk.sum(-2).unsqueeze(-1))


def lin_einsum(q, k, v):
    fq, fk = phi(q), phi(k)
    kv = torch.einsum("...jd,...je->...de", fk, v)
    return torch.einsum("...id,...de->...ie", fq, kv) / torch.einsum("...id,...d->...i", fq, fk.sum(-2))[..., None]


def lin_float64_inside(q, k, v):
    return lin_ref(q.double(), k.double(), v.double()).to(q.dtype)


def lin_where_exp(q, k, v):  # elu + 1 written by hand
    f = lambda x: torch.where(x > 0, x + 1, torch.exp(x))
    fq, fk = f(q), f(k)
    return (fq @ (fk.mT @ v)) / (fq * fk.sum(-2, keepdim=True)).sum(-1, keepdim=True)


@pytest.mark.parametrize("answer", [lin_ref, lin_einsum, lin_float64_inside, lin_where_exp])
def test_linear_attention_accepts(accepts, answer):
    accepts(check_linear_attention, answer)


def lin_no_norm(q, k, v):
    return phi(q) @ (phi(k).mT @ v)


def lin_identity(q, k, v):
    return (q @ (k.mT @ v)) / (q @ k.sum(-2).unsqueeze(-1))


def lin_elu(q, k, v):
    fq, fk = F.elu(q), F.elu(k)
    return (fq @ (fk.mT @ v)) / (fq @ fk.sum(-2).unsqueeze(-1))


def lin_relu(q, k, v):
    fq, fk = torch.relu(q), torch.relu(k)
    return (fq @ (fk.mT @ v)) / (fq @ fk.sum(-2).unsqueeze(-1))


def lin_scaled(q, k, v):
    return lin_ref(q / math.sqrt(q.shape[-1]), k / math.sqrt(q.shape[-1]), v)


def lin_quadratic(q, k, v):
    a = phi(q) @ phi(k).mT
    return (a @ v) / a.sum(-1, keepdim=True)


def lin_softmax(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def lin_float32_state(q, k, v):
    fq, fk = phi(q), phi(k)
    kv = torch.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))  # float32 whatever the input
    kv += fk.mT @ v
    return (fq.float() @ kv) / (fq.float() @ fk.float().sum(-2).unsqueeze(-1))


def lin_times_norm(q, k, v):
    fq, fk = phi(q), phi(k)
    return (fq @ (fk.mT @ v)) * (fq @ fk.sum(-2).unsqueeze(-1))


def lin_mean_u(q, k, v):  # mean instead of sum for Σ_j φ(k_j)
    fq, fk = phi(q), phi(k)
    return (fq @ (fk.mT @ v)) / (fq @ fk.mean(-2).unsqueeze(-1))


def lin_elu_in_place(q, k, v):  # right values, but F.elu_ overwrites the caller's k
    fq, fk = phi(q), F.elu_(k) + 1
    return (fq @ (fk.mT @ v)) / (fq @ fk.sum(-2).unsqueeze(-1))


@pytest.mark.parametrize("answer,phrases", [
    (lin_elu_in_place, ["k changed in place"]),
    (lin_no_norm, ["normaliser missing"]),
    (lin_times_norm, ["multiplied by the normaliser instead of dividing"]),
    (lin_mean_u, ["off by a factor of n_k", "n_k times the expected one"]),
    (lin_identity, ["φ not positive: no feature map"]),
    (lin_elu, ["φ not positive: elu(x) without + 1"]),
    (lin_relu, ["φ = relu"]),
    (lin_scaled, ["scaled by 1/√d_k"]),
    (lin_quadratic, ["builds the full 64 × 64 matrix", "O(n²)"]),
    (lin_softmax, ["softmax attention instead of linear"]),
    (lin_float32_state, ["computed in float32, not the input's float64"]),
])
def test_linear_attention_rejects(rejects, answer, phrases):
    assert_voice(rejects(check_linear_attention, answer, *phrases))


def test_linear_attention_stub_is_not_attempted(rejects, unfinished):
    rejects(check_linear_attention, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)


# ============================================================================ the recurrence
def rec_ref(q, k, v):
    fq, fk = phi(q), phi(k)
    C = torch.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=q.dtype)
    u = torch.zeros(q.shape[:-2] + (q.shape[-1],), dtype=q.dtype)
    outs = []
    for t in range(q.shape[-2]):
        C = C + torch.einsum("...d,...e->...de", fk[..., t, :], v[..., t, :])
        u = u + fk[..., t, :]
        outs.append(torch.einsum("...d,...de->...e", fq[..., t, :], C) / (fq[..., t, :] * u).sum(-1, keepdim=True))
    return torch.stack(outs, dim=-2)


def rec_cumsum(q, k, v):  # the running sums all at once: (n, d_k, d_v) per position, no (n, n) matrix
    fq, fk = phi(q), phi(k)
    C = torch.cumsum(fk[..., :, :, None] * v[..., :, None, :], dim=-3)
    u = torch.cumsum(fk, dim=-2)
    return (fq[..., None, :] @ C)[..., 0, :] / (fq * u).sum(-1, keepdim=True)


def rec_late(q, k, v):  # the classic off-by-one: read, then update
    fq, fk = phi(q), phi(k)
    C = torch.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=q.dtype)
    u = torch.zeros(q.shape[:-2] + (q.shape[-1],), dtype=q.dtype)
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for t in range(q.shape[-2]):
        out[..., t, :] = (fq[..., t, None, :] @ C)[..., 0, :] / (fq[..., t, :] * u).sum(-1, keepdim=True)
        C = C + fk[..., t, :, None] * v[..., t, None, :]
        u = u + fk[..., t, :]
    return out


def rec_loop(q, k, v, mistake=""):  # the docstring's loop, with one learner's slip switched on
    fq, fk = phi(q), phi(k)
    C = (torch.ones if mistake == "C_ones" else torch.zeros)(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=q.dtype)
    u = (torch.ones if mistake == "u_ones" else torch.zeros)(q.shape[:-2] + (q.shape[-1],), dtype=q.dtype)
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for t in range(q.shape[-1] if mistake == "bound" else q.shape[-2]):
        kv_t = v[..., t, None, :] if mistake == "no_phik" else fk[..., t, :, None] * v[..., t, None, :]
        C = kv_t if mistake == "C_reset" else C + kv_t
        u = fk[..., t, :] if mistake == "u_reset" else u + fk[..., t, :]
        num = (fq[..., t, None, :] @ C)[..., 0, :]
        den = {"axis0": (fq[..., t, :] * u).sum(0, keepdim=True), "no_phiq": u.sum(-1, keepdim=True),
               "no_u": fq[..., t, :].sum(-1, keepdim=True), "mean": (fq[..., t, :] * u).mean(-1, keepdim=True)}.get(
            mistake, (fq[..., t, :] * u).sum(-1, keepdim=True))
        out[..., t, :] = num * den if mistake == "times" else num / den
    return out


def rec_late_guarded(q, k, v):
    return torch.nan_to_num(rec_late(q, k, v))


def rec_no_norm(q, k, v):
    fq, fk = phi(q), phi(k)
    C = torch.cumsum(fk[..., :, :, None] * v[..., :, None, :], dim=-3)
    return (fq[..., None, :] @ C)[..., 0, :]


def rec_reset(q, k, v):
    return v.clone()  # each position sees only itself: its output is its own value


def rec_noncausal(q, k, v):
    return lin_ref(q, k, v)


def rec_quadratic(q, k, v):
    a = (phi(q) @ phi(k).mT).tril()
    return (a @ v) / a.sum(-1, keepdim=True)


@pytest.mark.parametrize("answer", [rec_ref, rec_cumsum, rec_loop])
def test_causal_linear_attention_accepts(accepts, answer):
    accepts(check_causal_linear_attention, answer)


@pytest.mark.parametrize("answer,phrases", [
    (rec_late, ["state update off by one", "position 0 sees nothing"]),
    (rec_late_guarded, ["state update off by one"]),
    (rec_no_norm, ["normaliser missing"]),
    (rec_reset, ["state not accumulated"]),
    (rec_noncausal, ["not causal"]),
    (rec_quadratic, ["builds the full 40 × 40 matrix"]),
])
def test_causal_linear_attention_rejects(rejects, answer, phrases):
    assert_voice(rejects(check_causal_linear_attention, answer, *phrases))


@pytest.mark.parametrize("mistake,phrases", [
    ("C_reset", ["state C not accumulated"]),
    ("u_reset", ["normaliser state u not accumulated"]),
    ("C_ones", ["state C starts at ones", "torch.ones instead of torch.zeros"]),
    ("u_ones", ["normaliser state u starts at ones"]),
    ("no_phik", ["φ(k_t) missing from the state update"]),
    ("times", ["multiplied by the normaliser instead of dividing"]),
    ("axis0", ["normaliser summed over axis 0"]),
    ("no_phiq", ["normaliser without φ(q_t)"]),
    ("no_u", ["normaliser without u_t"]),
    ("mean", ["off by a factor of d_k"]),
    ("bound", ["loop bound d_k instead of n", "q.shape[-1]"]),
])
def test_causal_linear_attention_names_loop_slips(rejects, mistake, phrases):
    answer = lambda q, k, v: rec_loop(q, k, v, mistake=mistake)
    assert_voice(rejects(check_causal_linear_attention, answer, *phrases))


# ============================================================================ chunkwise
def chunk_ref(q, k, v, chunk_size, *, mistake=""):
    fq, fk = phi(q), phi(k)
    C = (torch.ones if mistake == "ones_C" else torch.zeros)(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=q.dtype)
    u = (torch.ones if mistake == "ones_u" else torch.zeros)(q.shape[:-2] + (q.shape[-1], 1), dtype=q.dtype)
    outs = []
    n = q.shape[-2]
    stop = n - n % chunk_size if mistake == "tail" else q.shape[-1] if mistake == "bound" else n
    for s in range(0, stop, chunk_size):
        a_q, a_k, a_v = fq[..., s:s + chunk_size, :], fk[..., s:s + chunk_size, :], v[..., s:s + chunk_size, :]
        a = a_q @ a_k.mT
        a = {"strict": a.tril(-1), "full": a, "upper": a.triu()}.get(mistake, a.tril())
        if mistake == "early":
            C, u = C + a_k.mT @ a_v, u + a_k.sum(-2)[..., None]
        own = a * a_v if mistake == "elementwise" else a @ a_v
        rows = {"colsum": a.sum(-2, keepdim=True), "no_keepdim": a.sum(-1), "rowmean": a.mean(-1, keepdim=True)}.get(
            mistake, a.sum(-1, keepdim=True))
        num, den = own + a_q @ C, rows + a_q @ u
        if mistake in ("no_state", "no_C", "no_own"):
            num = a_q @ C if mistake == "no_own" else own
        if mistake in ("no_state", "no_u"):
            den = rows
        outs.append(num * den if mistake == "times" else num / den)
        if mistake != "early":
            add_u = {"u_mean": a_k.mean(-2)[..., None], "u_all": a_k.sum()}.get(mistake, a_k.sum(-2)[..., None])
            C = a_k.mT @ a_v if mistake in ("reset", "reset_C") else C + a_k.mT @ a_v
            u = add_u if mistake in ("reset", "reset_u") else u + add_u
    out = torch.cat(outs, dim=-2)
    if out.shape[-2] < n:  # rows the loop never reached
        out = torch.cat([out, torch.zeros(q.shape[:-2] + (n - out.shape[-2], v.shape[-1]), dtype=q.dtype)], dim=-2)
    return out


def chunk_split_einsum(q, k, v, chunk_size):  # torch.split and einsum, a causal mask built by comparison
    outs, C, u = [], 0, 0
    for qc, kc, vc in zip(*(torch.split(t, chunk_size, dim=-2) for t in (phi(q), phi(k), v))):
        m = qc.shape[-2]
        keep = torch.arange(m)[:, None] >= torch.arange(m)[None, :]
        a = torch.einsum("...id,...jd->...ij", qc, kc) * keep
        num = a @ vc + (qc @ C if torch.is_tensor(C) else 0)
        den = a.sum(-1, keepdim=True) + (qc @ u if torch.is_tensor(u) else 0)
        outs.append(num / den)
        C = C + kc.mT @ vc
        u = u + kc.sum(-2, keepdim=True).mT
    return torch.cat(outs, -2)


def chunk_float64_inside(q, k, v, chunk_size):
    return chunk_ref(q.double(), k.double(), v.double(), chunk_size).to(q.dtype)


def chunk_batched(q, k, v, chunk_size):  # every chunk's A in one batched product over a padded (m, c) view
    n, c = q.shape[-2], chunk_size
    m = -(-n // c)
    fq, fk, vv = (F.pad(t, (0, 0, 0, m * c - n)).unflatten(-2, (m, c)) for t in (phi(q), phi(k), v))
    a = (fq @ fk.mT).tril()  # (..., m, c, c)
    kv = fk.mT @ vv  # (..., m, d_k, d_v): each chunk's own sum
    C = kv.cumsum(-3) - kv  # the state before each chunk
    z = fk.sum(-2)
    u = z.cumsum(-2) - z  # (..., m, d_k)
    out = (a @ vv + fq @ C) / (a.sum(-1, keepdim=True) + fq @ u[..., None])
    return out.flatten(-3, -2)[..., :n, :]


def chunk_linalg_matmul(q, k, v, chunk_size):  # every product with torch.linalg.matmul, the documented alias of @
    mm, fq, fk = torch.linalg.matmul, phi(q), phi(k)
    outs, C, u = [], 0.0, 0.0
    for s in range(0, q.shape[-2], chunk_size):
        qc, kc, vc = fq[..., s:s + chunk_size, :], fk[..., s:s + chunk_size, :], v[..., s:s + chunk_size, :]
        a = mm(qc, kc.mT).tril()
        outs.append((mm(a, vc) + (mm(qc, C) if torch.is_tensor(C) else 0)) /
                    (a.sum(-1, keepdim=True) + (mm(qc, u) if torch.is_tensor(u) else 0)))
        C, u = C + mm(kc.mT, vc), u + kc.sum(-2).unsqueeze(-1)
    return torch.cat(outs, -2)


@pytest.mark.parametrize("answer", [chunk_ref, chunk_split_einsum, chunk_float64_inside, chunk_batched,
                                    chunk_linalg_matmul])
def test_chunked_linear_attention_accepts(accepts, answer):
    accepts(check_chunked_linear_attention, answer)


def chunk_ignores_size(q, k, v, chunk_size):  # chunks of 1: the recurrence, right values, chunk_size unused
    return rec_ref(q, k, v)


def chunk_one_block(q, k, v, chunk_size):
    return rec_quadratic(q, k, v)


@pytest.mark.parametrize("mistake,phrases", [
    ("early", ["chunk counted twice"]),
    ("strict", ["diagonal left out inside a chunk"]),
    ("full", ["no causal mask inside a chunk"]),
    ("upper", ["upper triangle"]),
    ("no_state", ["state not carried across chunks"]),
    ("tail", ["last, shorter chunk"]),
    ("no_C", ["state C not carried across chunks"]),
    ("no_u", ["normaliser state u not carried across chunks"]),
    ("reset", ["state not accumulated: only the previous chunk carried"]),
    ("reset_C", ["state C not accumulated"]),
    ("reset_u", ["normaliser state u not accumulated"]),
    ("ones_C", ["state C starts at ones"]),
    ("ones_u", ["normaliser state u starts at ones"]),
    ("no_own", ["the chunk's own keys missing from the numerator"]),
    ("elementwise", ["A * v_c instead of A @ v_c"]),
    ("colsum", ["row sums of A taken over the queries"]),
    ("no_keepdim", ["keepdim missing in the row sum"]),
    ("times", ["multiplied by the normaliser instead of dividing"]),
    ("rowmean", ["row sums of A as a mean"]),
    ("u_mean", ["u grows by the mean of φ(k_c)"]),
    ("u_all", ["u grows by the sum of every entry"]),
    ("bound", ["loop bound d_k instead of n"]),
])
def test_chunked_linear_attention_rejects(rejects, mistake, phrases):
    answer = lambda q, k, v, chunk_size: chunk_ref(q, k, v, chunk_size, mistake=mistake)
    assert_voice(rejects(check_chunked_linear_attention, answer, *phrases))


def test_chunked_linear_attention_rejects_work_of_the_wrong_shape(rejects):
    assert_voice(rejects(check_chunked_linear_attention, chunk_ignores_size, "not computed in chunks of chunk_size"))
    assert_voice(rejects(check_chunked_linear_attention, chunk_one_block, "builds the full 48 × 48 matrix"))


def test_chunked_last_chunk_garbage_is_named(rejects):
    def garbage_tail(q, k, v, chunk_size):
        out = chunk_ref(q, k, v, chunk_size)
        n = q.shape[-2]
        if n % chunk_size:
            out[..., n - n % chunk_size:, :] = 7.0  # rows never written (torch.empty)
        return out

    assert_voice(rejects(check_chunked_linear_attention, garbage_tail, "last, shorter chunk"))


# ============================================================================ random features
def rf_ref(x, omega):
    return torch.exp(x @ omega.T - (x ** 2).sum(-1, keepdim=True) / 2) / math.sqrt(omega.shape[0])


def rf_einsum_norm(x, omega):
    w = torch.einsum("...nd,rd->...nr", x, omega)
    return torch.exp(w - 0.5 * torch.linalg.vector_norm(x, dim=-1, keepdim=True) ** 2) * omega.shape[0] ** -0.5


def rf_log_space(x, omega):  # the 1/√n_f folded into the exponent
    return torch.exp(x @ omega.mT - (x * x).sum(-1, keepdim=True) / 2 - 0.5 * math.log(omega.shape[0]))


def rf_float64_inside(x, omega):
    return rf_ref(x.double(), omega.double()).to(x.dtype)


@pytest.mark.parametrize("answer", [rf_ref, rf_einsum_norm, rf_log_space, rf_float64_inside])
def test_positive_random_features_accepts(accepts, answer):
    accepts(check_positive_random_features, answer)


@pytest.mark.parametrize("answer,phrases", [
    (lambda x, o: torch.exp(x @ o.T - (x * x).sum(-1, keepdim=True) / 2), ["1/√n_f missing"]),
    (lambda x, o: torch.exp(x @ o.T - (x * x).sum(-1, keepdim=True) / 2) / o.shape[0], ["divided by n_f instead of √n_f"]),
    (lambda x, o: torch.exp(x @ o.T) / math.sqrt(o.shape[0]), ["exp(−|x|²/2) missing"]),
    (lambda x, o: torch.exp(x @ o.T - (x * x).sum(-1, keepdim=True)) / math.sqrt(o.shape[0]), ["|x|² not halved"]),
    (lambda x, o: torch.exp(x @ o.T + (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(o.shape[0]), ["sign of |x|²/2"]),
    (lambda x, o: (x @ o.T - (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(o.shape[0]), ["exp missing"]),
    (lambda x, o: torch.exp(x @ o - (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(o.shape[0]),
     ["projection transposed"]),
    (lambda x, o: torch.exp(x - (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(o.shape[0]),
     ["random projection missing"]),
    (lambda x, o: torch.exp(x @ o.T - (x * x).mean(-1, keepdim=True) / 2) / math.sqrt(o.shape[0]), ["|x|² as a mean"]),
    (lambda x, o: torch.exp(x @ o.T - (x * x).sum(-2, keepdim=True) / 2) / math.sqrt(o.shape[0]),
     ["|x|² summed over the rows"]),
    (lambda x, o: torch.exp(x @ o.T - x.sum(-1, keepdim=True) / 2) / math.sqrt(o.shape[0]), ["|x|² without the squares"]),
    (lambda x, o: torch.exp(x @ o.T) * torch.exp(-(x * x).sum(-1, keepdim=True) / 2) / math.sqrt(o.shape[0]),
     ["taken separately", "inf times that is inf"]),
    (lambda x, o: torch.cat([torch.sin(x @ o.T), torch.cos(x @ o.T)], -1) * torch.exp((x * x).sum(-1, keepdim=True) / 2)
     / math.sqrt(o.shape[0]), ["trigonometric features"]),
])
def test_positive_random_features_rejects(rejects, answer, phrases):
    assert_voice(rejects(check_positive_random_features, answer, *phrases))


def rf_exponent_clamped(x, omega):  # "to keep exp from overflowing"
    z = x @ omega.T - (x * x).sum(-1, keepdim=True) / 2
    return torch.exp(torch.clamp(z, max=20.0)) / math.sqrt(omega.shape[0])


def rf_exponent_clamped_in_float64_then_back(x, omega):  # a wider dtype inside, the same clamp
    z = x.double() @ omega.double().T - (x.double() ** 2).sum(-1, keepdim=True) / 2
    return (torch.minimum(z, torch.tensor(25.0, dtype=torch.float64)).exp() / omega.shape[0] ** 0.5).to(x.dtype)


@pytest.mark.parametrize("answer, level", [(rf_exponent_clamped, "20"), (rf_exponent_clamped_in_float64_then_back, "25")])
def test_positive_random_features_names_a_clamped_exponent(rejects, answer, level):
    """The check's last case has exponents up to ≈ 38 (features ~1e16): a clamp of the exponent shows, at its level."""
    d = rejects(check_positive_random_features, answer, f"exponent clamped at about {level}", f"max={level}").diagnosis
    assert "x (3, 4) of norm 5" in d.tried, d.tried
    assert_voice(rejects(check_positive_random_features, answer))


# ============================================================================ block-sparse attention
def bs_ref(q, k, v, layout, block_size, mistake=""):
    scale = {"sqrt_mul": math.sqrt(q.shape[-1]), "sqrt_n": 1 / math.sqrt(q.shape[-2])}.get(mistake, 1 / math.sqrt(q.shape[-1]))
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    b = block_size
    for i in range(layout.shape[0]):
        qb = q[..., i * b:(i + 1) * b, :] * scale
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for j in range(layout.shape[1]):
            if not layout[i, j]:
                continue
            s = qb @ k[..., j * b:(j + 1) * b, :].mT
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s if mistake == "no_max" else s - new)
            row_sum = p.mean(-1, keepdim=True) if mistake == "mean" else p.sum(-1, keepdim=True)
            l = row_sum if mistake == "l_last" else l + row_sum if mistake == "l_plain" else \
                l * torch.exp(m - new) + row_sum
            pv = p @ v[..., j * b:(j + 1) * b, :]
            acc = pv if mistake == "acc_last" else acc + pv if mistake == "acc_plain" else acc * torch.exp(m - new) + pv
            if mistake != "m_stuck":  # forgetting m = new
                m = new
        out[..., i * b:(i + 1) * b, :] = acc * l if mistake == "times" else acc / l
    return out


def bs_gather(q, k, v, layout, block_size):  # the kept key blocks gathered, one softmax per query block
    b, outs = block_size, []
    for i in range(layout.shape[0]):
        cols = torch.cat([torch.arange(j * b, min((j + 1) * b, k.shape[-2])) for j in layout[i].nonzero().flatten()])
        s = q[..., i * b:(i + 1) * b, :] @ k[..., cols, :].mT / math.sqrt(q.shape[-1])
        outs.append(torch.softmax(s, -1) @ v[..., cols, :])
    return torch.cat(outs, -2)


def bs_dense_masked(q, k, v, layout, block_size):
    mask = layout.repeat_interleave(block_size, 0)[:q.shape[-2]].repeat_interleave(block_size, 1)[:, :k.shape[-2]]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def bs_transposed(q, k, v, layout, block_size):
    return bs_ref(q, k, v, layout.T.contiguous(), block_size) if layout.shape[0] == layout.shape[1] else \
        bs_ref(q, k, v, layout, block_size)


def bs_all_tiles_then_skip(q, k, v, layout, block_size):  # computes every tile, keeps the layout's
    b, scale = block_size, 1 / math.sqrt(q.shape[-1])
    outs = []
    for i in range(layout.shape[0]):
        tiles = [(j, q[..., i * b:(i + 1) * b, :] @ k[..., j * b:(j + 1) * b, :].mT * scale)
                 for j in range(layout.shape[1])]
        s = torch.cat([t for j, t in tiles if layout[i, j]], -1)
        cols = torch.cat([torch.arange(j * b, min((j + 1) * b, k.shape[-2])) for j, _ in tiles if layout[i, j]])
        outs.append(torch.softmax(s, -1) @ v[..., cols, :])
    return torch.cat(outs, -2)


def bs_ref_global_max(q, k, v, layout, block_size):  # amax over the whole tile (every row and batch entry)
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    b = block_size
    for i in range(layout.shape[0]):
        qb = q[..., i * b:(i + 1) * b, :] * scale
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for j in layout[i].nonzero().flatten().tolist():
            s = qb @ k[..., j * b:(j + 1) * b, :].mT
            new = torch.maximum(m, s.amax())
            p = torch.exp(s - new)
            l = l * torch.exp(m - new) + p.sum(-1, keepdim=True)
            acc = acc * torch.exp(m - new) + p @ v[..., j * b:(j + 1) * b, :]
            m = new
        out[..., i * b:(i + 1) * b, :] = acc / l
    return out


def bs_loop(q, k, v, layout, block_size, *, visited=lambda row: row, m0=-math.inf):
    """A learner's block-sparse loop: query block i visits the key blocks where ``visited(layout[i])`` is True, its
    running maximum starting at ``m0`` (right with the defaults)."""
    scale, b = 1 / math.sqrt(q.shape[-1]), block_size
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for i in range(layout.shape[0]):
        qb = q[..., i * b:(i + 1) * b, :] * scale
        m = torch.full(qb.shape[:-1] + (1,), m0, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for j in visited(layout[i]).nonzero().flatten().tolist():
            s = qb @ k[..., j * b:(j + 1) * b, :].mT
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - new)
            l = l * torch.exp(m - new) + p.sum(-1, keepdim=True)
            acc = acc * torch.exp(m - new) + p @ v[..., j * b:(j + 1) * b, :]
            m = new
        out[..., i * b:(i + 1) * b, :] = acc / l
    return out


def bs_inverted(q, k, v, layout, block_size):  # True taken as "masked out", as key_padding_mask means it
    return bs_loop(q, k, v, layout, block_size, visited=lambda row: ~row)


def bs_square_layout_assumed(q, k, v, layout, block_size):  # key blocks counted by the layout's rows
    rows = layout.shape[0]
    return bs_loop(q, k, v, layout, block_size, visited=lambda row: row & (torch.arange(len(row)) < rows))


def bs_max_from_zero(q, k, v, layout, block_size):  # the running maximum starts at 0, not −inf
    return bs_loop(q, k, v, layout, block_size, m0=0.0)


def bs_every_tile_elementwise(q, k, v, layout, block_size):  # scores by broadcasting, every tile, then masked
    b, scale = block_size, 1 / math.sqrt(q.shape[-1])
    s = (q[..., :, None, :] * k[..., None, :, :]).sum(-1) * scale  # (..., n_q, n_k), a product written out
    keep = layout.repeat_interleave(b, 0)[:q.shape[-2]].repeat_interleave(b, 1)[:, :k.shape[-2]]
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


def bs_unscaled(q, k, v, layout, block_size):
    return bs_ref(q * math.sqrt(q.shape[-1]), k, v, layout, block_size)


def bs_ones_column(q, k, v, layout, block_size):  # ℓ kept as the last column of acc: v with a column of ones
    ones = torch.ones(v.shape[:-1] + (1,), dtype=v.dtype)
    out = bs_ref(q, k, torch.cat([v, ones], -1), layout, block_size)  # (..., n_q, d_v + 1) = acc / ℓ, 1
    return out[..., :-1]


@pytest.mark.parametrize("answer", [bs_ref, bs_gather, bs_ones_column])
def test_block_sparse_attention_accepts(accepts, answer):
    accepts(check_block_sparse_attention, answer)


@pytest.mark.parametrize("answer,phrases", [
    (bs_transposed, ["block layout transposed"]),
    (bs_inverted, ["block layout inverted", "True means the tile is kept"]),
    (bs_square_layout_assumed, ["key"]),
    (bs_max_from_zero, ["wrong"]),
    (bs_every_tile_elementwise, ["skipped blocks still computed"]),
    (bs_dense_masked, ["skipped blocks still computed"]),
    (bs_all_tiles_then_skip, ["skipped blocks still computed"]),
    (bs_unscaled, ["scores not scaled"]),
    (lambda q, k, v, layout, b: bs_ref_global_max(q, k, v, layout, b), ["one running maximum for all rows"]),
    (lambda q, k, v, layout, b: F.scaled_dot_product_attention(q, k, v), ["layout ignored"]),
])
def test_block_sparse_attention_rejects(rejects, answer, phrases):
    assert_voice(rejects(check_block_sparse_attention, answer, *phrases))


@pytest.mark.parametrize("mistake,phrases", [
    ("sqrt_mul", ["scores multiplied by √d_k instead of divided"]),
    ("sqrt_n", ["scaled by 1/√n_q instead of 1/√d_k"]),
    ("times", ["multiplied by the running sum instead of dividing"]),
    ("m_stuck", ["only the last tile counted", "m = m_new missing"]),
    ("l_last", ["running sum ℓ overwritten"]),
    ("acc_last", ["accumulator overwritten"]),
    ("l_plain", ["running sum ℓ not rescaled"]),
    ("acc_plain", ["accumulator not rescaled"]),
    ("no_max", ["maximum not subtracted inside exp"]),
    ("mean", ["off by a factor of block_size"]),
])
def test_block_sparse_attention_names_tile_loop_slips(rejects, mistake, phrases):
    answer = lambda q, k, v, layout, b: bs_ref(q, k, v, layout, b, mistake=mistake)
    assert_voice(rejects(check_block_sparse_attention, answer, *phrases))


# ============================================================================ causes measured when no known mistake fits
def bs_wrong_rescale(q, k, v, layout, block_size):  # exp(m_new − m_old) where exp(m_old − m_new) belongs
    scale, b = 1 / math.sqrt(q.shape[-1]), block_size
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for i in range(layout.shape[0]):
        qb = q[..., i * b:(i + 1) * b, :] * scale
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for j in layout[i].nonzero().flatten().tolist():
            s = qb @ k[..., j * b:(j + 1) * b, :].mT
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            p, corr = torch.exp(s - new), torch.exp(new - m).nan_to_num(posinf=0.0)
            l, acc, m = l * corr + p.sum(-1, keepdim=True), acc * corr + p @ v[..., j * b:(j + 1) * b, :], new
        out[..., i * b:(i + 1) * b, :] = acc / l
    return out


def bs_last_block_off(q, k, v, layout, block_size):
    out = bs_ref(q, k, v, layout, block_size)
    out[..., -block_size:, :] *= 1.5
    return out


def chunk_u_doubled(q, k, v, chunk_size):  # u grows by twice the chunk's key features
    fq, fk = phi(q), phi(k)
    C = torch.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=q.dtype)
    u = torch.zeros(q.shape[:-2] + (q.shape[-1], 1), dtype=q.dtype)
    outs = []
    for s in range(0, q.shape[-2], chunk_size):
        a_q, a_k, a_v = fq[..., s:s + chunk_size, :], fk[..., s:s + chunk_size, :], v[..., s:s + chunk_size, :]
        a = (a_q @ a_k.mT).tril()
        outs.append((a @ a_v + a_q @ C) / (a.sum(-1, keepdim=True) + a_q @ u))
        C, u = C + a_k.mT @ a_v, u + 2 * a_k.sum(-2)[..., None]
    return torch.cat(outs, -2)


@pytest.mark.parametrize("check,answer,phrases", [
    (check_block_sparse_attention, bs_wrong_rescale, ["wrong where a query block keeps several key blocks"]),
    (check_block_sparse_attention, bs_last_block_off, ["wrong only in query blocks 3", "rows 24–31"]),
    (check_chunked_linear_attention, chunk_u_doubled, ["only the first chunk right", "rows 0 … 1"]),
])
def test_measured_causes(rejects, check, answer, phrases):
    result = rejects(check, answer, *phrases)
    assert_voice(result)
    assert "tiles of a query block are combined" in result.diagnosis.cause or answer is not bs_wrong_rescale


def bs_wrong_with_several(q, k, v, layout, block_size):  # every row off as soon as any block keeps several tiles
    out = bs_ref(q, k, v, layout, block_size)
    return out * 1.1 if bool((layout.sum(-1) > 1).any()) else out


@pytest.mark.parametrize("answer,phrases", [
    (lambda q, k, v, layout, b: bs_ref(q, k, v, layout, b) * 0 + bs_ref(-q, k, v, layout, b),
     ["wrong even with one tile per query block"]),
    (lambda q, k, v, layout, b: bs_ref(q, k, v, layout, b, mistake="no_max") + 0 * q.sum() * float("nan"),
     ["wrong even with one tile per query block", "(NaN)"]),
    (bs_wrong_with_several, ["right with one tile per query block, wrong with several"]),
])
def test_block_sparse_one_tile_probe(rejects, answer, phrases):
    assert_voice(rejects(check_block_sparse_attention, answer, *phrases))


@pytest.mark.parametrize("answer,phrases", [
    (lambda q, k, v, c: chunk_ref(q, k, v, c) * (1.0 if c == q.shape[-2] else 1.1), ["right as one chunk"]),
    (lambda q, k, v, c: chunk_ref(q, k, v, c) * 1.1, ["wrong even as one chunk"]),
])
def test_chunked_one_chunk_probe(rejects, answer, phrases):
    assert_voice(rejects(check_chunked_linear_attention, answer, *phrases))


# ============================================================================ wrong shapes and dtypes no known mistake explains
def bs_whole_query_blocks(q, k, v, layout, block_size):  # range(n_q // block_size): the last, shorter block left out
    b = block_size
    return torch.cat([bs_ref(q[..., i * b:(i + 1) * b, :], k, v, layout[i:i + 1], b)
                      for i in range(q.shape[-2] // b)], -2)


def lin_float64_not_converted_back(q, k, v):
    return lin_ref(q.double(), k.double(), v.double())  # float32 inputs: the result stays float64


def rec_one_position_short(q, k, v):  # range(n - 1): the loop stops one position early
    fq, fk = phi(q), phi(k)
    C = torch.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=q.dtype)
    u = torch.zeros(q.shape[:-2] + (q.shape[-1],), dtype=q.dtype)
    outs = []
    for t in range(q.shape[-2] - 1):
        C = C + fk[..., t, :, None] * v[..., t, None, :]
        u = u + fk[..., t, :]
        outs.append((fq[..., t, None, :] @ C)[..., 0, :] / (fq[..., t, :] * u).sum(-1, keepdim=True))
    return torch.stack(outs, dim=-2)


def chunk_whole_chunks_only(q, k, v, chunk_size):  # the last, shorter chunk never computed nor returned
    fq, fk = phi(q), phi(k)
    C = torch.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=q.dtype)
    u = torch.zeros(q.shape[:-2] + (q.shape[-1], 1), dtype=q.dtype)
    outs = []
    for s in range(0, q.shape[-2] - chunk_size + 1, chunk_size):
        a_q, a_k, a_v = fq[..., s:s + chunk_size, :], fk[..., s:s + chunk_size, :], v[..., s:s + chunk_size, :]
        a = (a_q @ a_k.mT).tril()
        outs.append((a @ a_v + a_q @ C) / (a.sum(-1, keepdim=True) + a_q @ u))
        C, u = C + a_k.mT @ a_v, u + a_k.sum(-2)[..., None]
    return torch.cat(outs, -2)


@pytest.mark.parametrize("check,answer,phrases", [
    (check_block_sparse_attention, bs_whole_query_blocks, ["wrong shape (16, 2), expected (21, 2)",
                                                           "a multiple of the block"]),
    (check_linear_attention, lin_float64_not_converted_back, ["result in float64, not the input's float32",
                                                              "a float32 tensor, like the input"]),
    (check_causal_linear_attention, rec_one_position_short, ["wrong shape (8, 2), expected (9, 2)"]),
    (check_chunked_linear_attention, chunk_whole_chunks_only, ["wrong shape (8, 2), expected (9, 2)"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_wrong_shapes_and_dtypes_are_reported_as_such(rejects, check, answer, phrases):
    result = rejects(check, answer, *phrases)
    assert_voice(result)
    assert "rows" not in result.diagnosis.summary  # no measurement of rows on a result of another shape


# ============================================================================ an ε in the normaliser, both states at ones
def lin_with_eps(q, k, v, eps=1e-6):  # the linear transformer's code adds an ε: not the docstring's formula
    fq, fk = phi(q), phi(k)
    return (fq @ (fk.mT @ v)) / (fq @ fk.sum(-2).unsqueeze(-1) + eps)


def rec_states_at_ones(q, k, v):
    fq, fk = phi(q), phi(k)
    C = torch.ones(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=q.dtype)
    u = torch.ones(q.shape[:-2] + (q.shape[-1],), dtype=q.dtype)
    outs = []
    for t in range(q.shape[-2]):
        C = C + fk[..., t, :, None] * v[..., t, None, :]
        u = u + fk[..., t, :]
        outs.append((fq[..., t, None, :] @ C)[..., 0, :] / (fq[..., t, :] * u).sum(-1, keepdim=True))
    return torch.stack(outs, dim=-2)


@pytest.mark.parametrize("check,answer,phrases", [
    (check_linear_attention, lin_with_eps, ["each row off by a tiny factor: the normaliser"]),
    (check_causal_linear_attention, rec_states_at_ones, ["states C and u start at ones", "u = torch.zeros"]),
], ids=["eps", "ones"])
def test_an_eps_is_not_called_float32_and_both_states_at_ones_are_named(rejects, check, answer, phrases):
    result = rejects(check, answer, *phrases)
    assert_voice(result)
    assert "float32" not in result.diagnosis.summary


# ============================================================================ audit D: NumPy inside
def chunked_in_numpy(q, k, v, chunk_size):  # the docstring's steps, chunk by chunk, in NumPy
    q, k, v = q.numpy(), k.numpy(), v.numpy()
    phi_q, phi_k = np.where(q > 0, q + 1, np.exp(np.minimum(q, 0))), np.where(k > 0, k + 1, np.exp(np.minimum(k, 0)))
    state = np.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=q.dtype)
    norm = np.zeros(q.shape[:-2] + (q.shape[-1], 1), dtype=q.dtype)
    out = []
    for s in range(0, q.shape[-2], chunk_size):
        fq, fk, vc = phi_q[..., s:s + chunk_size, :], phi_k[..., s:s + chunk_size, :], v[..., s:s + chunk_size, :]
        a = np.tril(fq @ np.swapaxes(fk, -1, -2))
        out.append((a @ vc + fq @ state) / (a.sum(-1, keepdims=True) + fq @ norm))
        state = state + np.swapaxes(fk, -1, -2) @ vc
        norm = norm + fk.sum(-2)[..., None]
    return torch.from_numpy(np.concatenate(out, axis=-2))


def test_chunked_linear_attention_in_numpy_is_accepted(accepts):
    """No torch tensor is built, so the probe counts no (chunk, chunk) product: that is no evidence of a
    recurrence, and the right values pass."""
    accepts(check_chunked_linear_attention, chunked_in_numpy)


# ============================================================================ feature maps named, inputs left unchanged
def _lin(phi_q, phi_k=None, phi_v=None):
    """Linear attention with the feature maps given for q, k (q's unless given) and v (none unless given)."""
    def linear_attention(q, k, v):
        fq, fk = phi_q(q), (phi_k or phi_q)(k)
        vv = v if phi_v is None else phi_v(v)
        return (fq @ (fk.mT @ vv)) / (fq @ fk.sum(-2).unsqueeze(-1))
    return linear_attention


@pytest.mark.parametrize("answer,phrases", [
    (_lin(lambda x: torch.relu(x) + 1), ["φ = relu(x) + 1", "entry becomes 1"]),
    (_lin(lambda x: x.clamp(min=0) + 1, phi_k=phi), ["φ = relu(x) + 1 on q only"]),
    (_lin(lambda x: torch.where(x > 0, x, torch.expm1(x))), ["φ not positive: elu(x) without + 1"]),
    (_lin(phi, phi_v=phi), ["φ applied to v too", "feature map"]),
    (_lin(lambda x: torch.relu(x) + 1, phi_v=lambda x: torch.relu(x) + 1), ["φ = relu(x) + 1 applied to v too"]),
    (_lin(F.elu, phi_v=F.elu), ["φ = elu(x) without + 1 applied to v too"]),
])
def test_linear_attention_names_other_feature_maps(rejects, answer, phrases):
    assert_voice(rejects(check_linear_attention, answer, *phrases))


def rec_phi_on_v(q, k, v):
    fq, fk, fv = phi(q), phi(k), phi(v)
    a = (fq @ fk.mT).tril()
    return (a @ fv) / a.sum(-1, keepdim=True)


def test_causal_linear_attention_names_phi_on_v(rejects):
    assert_voice(rejects(check_causal_linear_attention, rec_phi_on_v, "φ applied to v too"))


@pytest.mark.parametrize("answer", [
    _lin(lambda x: F.elu(x, alpha=1.0) + 1.0),
    _lin(lambda x: torch.where(x > 0, x + 1, x.exp())),
    _lin(lambda x: F.elu(x) + torch.ones_like(x)),
    lambda q, k, v: torch.einsum("...id,...de->...ie", phi(q), torch.einsum("...jd,...je->...de", phi(k), v))
    / (phi(q) * phi(k).sum(-2, keepdim=True)).sum(-1, keepdim=True),
    lambda q, k, v: (phi(q) @ (phi(k).mT @ v)) * (1.0 / (phi(q) @ phi(k).mT.sum(-1, keepdim=True))),
])
def test_linear_attention_accepts_more_ways(accepts, answer):
    accepts(check_linear_attention, answer)


def rf_x_squared_in_place(x, omega):
    proj = x @ omega.T
    x.mul_(x)  # the right numbers, but the caller's x now holds its squares
    return torch.exp(proj - x.sum(-1, keepdim=True) / 2) / math.sqrt(omega.shape[0])


def rf_omega_scaled_in_place(x, omega):
    omega /= math.sqrt(math.sqrt(omega.shape[0]))  # folds a scale into the caller's omega
    return torch.exp(x @ omega.T * math.sqrt(math.sqrt(omega.shape[0])) - (x * x).sum(-1, keepdim=True) / 2) \
        / math.sqrt(omega.shape[0])


def bs_q_scaled_in_place(q, k, v, layout, block_size):
    q /= math.sqrt(q.shape[-1])  # the scale folded into the caller's q
    return bs_ref(q * math.sqrt(q.shape[-1]), k, v, layout, block_size)


def bs_v_in_place(q, k, v, layout, block_size):
    out = bs_ref(q, k, v, layout, block_size)
    v.zero_()  # clears the caller's v after use
    return out


@pytest.mark.parametrize("check,answer,phrases", [
    (check_positive_random_features, rf_x_squared_in_place, ["x changed in place"]),
    (check_positive_random_features, rf_omega_scaled_in_place, ["omega changed in place"]),
    (check_block_sparse_attention, bs_q_scaled_in_place, ["q changed in place"]),
    (check_block_sparse_attention, bs_v_in_place, ["v changed in place"]),
])
def test_inputs_changed_in_place_are_named(rejects, check, answer, phrases):
    assert_voice(rejects(check, answer, *phrases))


@pytest.mark.parametrize("answer", [
    lambda x, o: torch.exp(torch.einsum("...nd,rd->...nr", x, o) - x.pow(2).sum(-1, keepdim=True) / 2)
    / math.sqrt(o.shape[0]),
    lambda x, o: torch.exp(x @ o.T - 0.5 * (x @ x.mT).diagonal(dim1=-2, dim2=-1)[..., None]) / o.shape[0] ** 0.5,
    lambda x, o: (x @ o.T - (x * x).sum(-1, keepdim=True) / 2).exp().div(math.sqrt(o.shape[0])),
    lambda x, o: torch.exp(x.clone().matmul(o.T).sub_((x * x).sum(-1, keepdim=True) / 2)) / math.sqrt(o.shape[0]),
    lambda x, o: torch.from_numpy(rf_ref(x.double(), o.double()).numpy()).to(x.dtype),
])
def test_positive_random_features_accepts_more_ways(accepts, answer):
    accepts(check_positive_random_features, answer)


def bs_query_blocks_gathered(q, k, v, layout, block_size):
    """Per query block, the kept key blocks concatenated, then one softmax: a clone of q scaled in place."""
    q = q.clone()
    q *= 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for i in range(layout.shape[0]):
        rows = slice(i * block_size, (i + 1) * block_size)
        cols = torch.cat([torch.arange(j * block_size, min((j + 1) * block_size, k.shape[-2]))
                          for j in layout[i].nonzero().flatten().tolist()])
        out[..., rows, :] = torch.softmax(q[..., rows, :] @ k[..., cols, :].mT, -1) @ v[..., cols, :]
    return out


@pytest.mark.parametrize("answer", [
    bs_query_blocks_gathered,
    lambda q, k, v, layout, b: bs_ref(q.clone(), k.clone(), v.clone(), layout.clone(), b),
    lambda q, k, v, layout, b: bs_ref(q.contiguous(), k, v, layout.bool(), int(b)),
])
def test_block_sparse_attention_accepts_more_ways(accepts, answer):
    accepts(check_block_sparse_attention, answer)


# ============================================================================ round 3: a layout read the other way round
def bs_query_blocks_from_columns(q, k, v, layout, block_size):
    """Query blocks counted by layout.shape[1] and key blocks by layout.shape[0]: right on square layouts only."""
    b = block_size
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for i in range(layout.shape[1]):
        keep = [j for j in range(layout.shape[0]) if layout[i, j]]
        cols = torch.cat([torch.arange(j * b, min((j + 1) * b, k.shape[-2])) for j in keep])
        s = q[..., i * b:(i + 1) * b, :] @ k[..., cols, :].mT / math.sqrt(q.shape[-1])
        out[..., i * b:(i + 1) * b, :] = torch.softmax(s, -1) @ v[..., cols, :]
    return out


def bs_query_blocks_from_keys(q, k, v, layout, block_size):
    """One query block per key block: ⌈n_k / block_size⌉ of them."""
    b, out = block_size, torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for i in range(-(-k.shape[-2] // b)):
        cols = torch.cat([torch.arange(j * b, min((j + 1) * b, k.shape[-2])) for j in layout[i].nonzero().flatten()])
        s = q[..., i * b:(i + 1) * b, :] @ k[..., cols, :].mT / math.sqrt(q.shape[-1])
        out[..., i * b:(i + 1) * b, :] = torch.softmax(s, -1) @ v[..., cols, :]
    return out


@pytest.mark.parametrize("answer", [bs_query_blocks_from_columns, bs_query_blocks_from_keys])
def test_block_sparse_attention_names_a_layout_read_the_other_way_round_that_raises(rejects, answer):
    d = rejects(check_block_sparse_attention, answer, "block layout read the other way round", "IndexError",
                "block of queries (⌈n_q / block_size⌉ = 3)", "block of keys (⌈n_k / block_size⌉ = 4)").diagnosis
    assert_voice(rejects(check_block_sparse_attention, answer))
    assert "one step too far" not in d.cause, d

"""Checks of notebook 01 (attn_course.checks.dot): every wrong answer rejected with its diagnosis,
every correct alternative accepted, and the same verdict when the grader replays the log.

The wrong answers are the classic mistakes and plausible unforeseen ones (wrong einsum subscripts,
sums over the wrong axis, keepdim slips, NumPy results, .T on batched input, the wrong norm,
off-by-one loops, in-place edits of the inputs, wrong dtypes). Each is listed with the words its
diagnosis must contain; an entry marked ``named=False`` is one no known mistake explains, where the
diagnosis only measures what is wrong (and must not blame a mistake).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_course import dot
from attn_course.checks.dot import check_cosine_scores, check_query_scores, check_query_scores_loop, check_score_matrix
from attn_course.checks.result import Status

warnings.filterwarnings("ignore", message="The use of `x.T`")


def W(fn, *phrases, named=True):
    """A wrong answer: the function, the phrases its diagnosis must contain, whether it names a mistake."""
    return pytest.param(fn, phrases, named, id=getattr(fn, "__name__", "wrong"))


def in_one_voice(result):
    """Every diagnosis fills the template: a short summary, what was tried, got, expected and what to do."""
    d = result.diagnosis
    assert d is not None and d.summary and d.tried and d.got and d.expected and d.fix, result.text()
    assert len(d.summary) <= 60, f"summary too long for a grade table: {d.summary!r}"


def rejects_as(rejects, check, fn, phrases, named):
    result = rejects(check, fn, *phrases)
    in_one_voice(result)
    assert bool(result.diagnosis.cause) == named, (
        f"{'no mistake named' if named else 'a cause was guessed'}:\n{result.text()}")
    return result


# ============================================================================ one query against every key
def stack_loop(q, K):
    return torch.stack([(q * k).sum() for k in K])


def preallocated_loop(q, K):
    scores = torch.zeros(K.shape[0], dtype=K.dtype)
    for j in range(K.shape[0]):
        scores[j] = torch.dot(q, K[j])
    return scores


def float32_loop(q, K):  # torch.zeros(n) is float32: a float32 result for float64 input is allowed
    scores = torch.zeros(len(K))
    for j, key in enumerate(K):
        scores[j] = q @ key
    return scores


def item_loop(q, K):
    return torch.tensor([float(q @ k) for k in K], dtype=K.dtype)


def tensor_of_list(q, K):
    return torch.tensor([torch.dot(q, k) for k in K])


def entries_loop(q, K):  # a loop over the d entries, adding one column of products at a time
    total = torch.zeros(K.shape[0], dtype=K.dtype)
    for i in range(q.shape[0]):
        total = total + K[:, i] * q[i]
    return total


def clone_then_in_place(q, K):
    products = K.clone()
    products.mul_(q)
    return products.sum(-1)


def via_numpy_back(q, K):
    return torch.from_numpy(np.dot(K.numpy(), q.numpy()))


ONE_QUERY_RIGHT = [
    lambda q, K: K @ q, lambda q, K: torch.mv(K, q), lambda q, K: torch.matmul(K, q),
    lambda q, K: torch.einsum("nd,d->n", K, q), lambda q, K: torch.einsum("d,nd->n", q, K),
    lambda q, K: (q * K).sum(dim=1), lambda q, K: (K * q).sum(-1), lambda q, K: torch.sum(K * q, 1),
    lambda q, K: q @ K.T, lambda q, K: q @ K.mT, lambda q, K: (q[None] @ K.T).squeeze(0),
    lambda q, K: (K @ q[:, None]).squeeze(-1), lambda q, K: torch.tensordot(K, q, dims=1), lambda q, K: F.linear(q, K),
    lambda q, K: torch.inner(K, q), lambda q, K: torch.vmap(torch.dot, in_dims=(None, 0))(q, K),
    lambda q, K: K.double() @ q.double(), lambda q, K: torch.stack(list(map(lambda k: k @ q, K))),
    stack_loop, preallocated_loop, float32_loop, item_loop, tensor_of_list, entries_loop, clone_then_in_place,
    via_numpy_back, dot.query_scores, dot.query_scores_loop,
]


def _loop(q, K, keys):
    return torch.stack([(q * K[j]).sum() for j in keys])


def loop_one_short(q, K):
    return _loop(q, K, range(len(K) - 1))


def loop_from_one(q, K):
    return _loop(q, K, range(1, len(K)))


def loop_over_entries_count(q, K):
    scores = []
    for j in range(len(q)):
        scores.append(torch.dot(q, K[j]))
    return torch.stack(scores)


def return_inside_loop(q, K):
    scores = []
    for key in K:
        scores.append(q @ key)
        return torch.stack(scores)


def inner_loop_one_short(q, K):
    scores = []
    for key in K:
        total = 0.0
        for i in range(len(q) - 1):
            total = total + q[i] * key[i]
        scores.append(torch.as_tensor(total, dtype=K.dtype))
    return torch.stack(scores)


def mul_in_place(q, K):
    K.mul_(q)
    return K.sum(-1)


def doubles_q_in_place(q, K):  # a wrong result, and the caller's q changed: the change is what is named
    q[0] = q[0] * 2
    return K @ q


def times_equals(q, K):
    K *= q
    return K.sum(dim=-1)


def integer_preallocated(q, K):
    scores = torch.zeros(K.shape[0], dtype=torch.long)
    for j in range(K.shape[0]):
        scores[j] = q @ K[j]
    return scores


def raise_system_exit(q, K):
    raise SystemExit(1)


def loop_over_columns(q, K):  # raises for non-square K, gives Kᵀ q for a square one
    return torch.stack([(q * column).sum() for column in K.T])


def fixed_range(q, K):  # a loop count typed in: raises for fewer keys, too few scores for more
    return torch.stack([(q * K[j]).sum() for j in range(4)])


def last_key_only(q, K):  # `score = …` overwritten on every pass
    for key in K:
        score = (q * key).sum()
    return torch.stack([score])


def running_total(q, K):  # the total is never reset for the next key
    total, scores = 0.0, []
    for key in K:
        total = total + (q * key).sum()
        scores.append(total)
    return torch.stack(scores)


def first_product_only(q, K):  # the inner loop returns after the first entry
    scores = []
    for key in K:
        for i in range(len(q)):
            scores.append(q[i] * key[i])
            break
    return torch.stack(scores)


ONE_QUERY_WRONG = [
    W(lambda q, K: q @ K, "columns of K", "K @ q"),
    W(lambda q, K: K.T @ q, "columns of K"),
    W(lambda q, K: torch.einsum("d,dn->n", q, K), "columns of K"),
    W(lambda q, K: torch.matmul(q, K), "columns of K"),
    W(lambda q, K: (K * q).sum(0), "axis 0", "dim=-1"),
    W(lambda q, K: (K * q).sum(), "summed over everything"),
    W(lambda q, K: torch.einsum("d,nd->", q, K), "summed over everything"),
    W(lambda q, K: K * q, "not added up"),
    W(lambda q, K: torch.einsum("d,nd->nd", q, K), "not added up"),
    W(lambda q, K: torch.einsum("d,nd->d", q, K), "axis 0", "einsum"),
    W(lambda q, K: K @ q[:, None], "column", "squeeze(-1)"),
    W(lambda q, K: (K * q).sum(-1, keepdim=True), "column", "keepdim"),
    W(lambda q, K: q[None] @ K.T, "a row"),
    W(lambda q, K: (K @ q[:, None]).squeeze(), ".squeeze()", "single key"),
    W(lambda q, K: F.cosine_similarity(K, q[None], dim=-1), "cosine"),
    W(lambda q, K: (K * q).mean(-1), "averaged"),
    W(lambda q, K: K @ q / math.sqrt(q.shape[0]), "√d", "notebook 02"),
    W(lambda q, K: torch.softmax(K @ q, -1), "softmax"),
    W(lambda q, K: (K - q).norm(dim=-1), "distance"),
    W(lambda q, K: -((K - q) ** 2).sum(-1), "distance"),
    W(lambda q, K: (K @ q).abs(), "absolute"),
    W(loop_one_short, "one key early"),
    W(loop_from_one, "skips the first key"),
    W(loop_over_entries_count, "vector's entries", "K.shape[0]"),
    W(return_inside_loop, "inside the loop"),
    W(inner_loop_one_short, "last entry of each vector"),
    W(lambda q, K: K[:, 1:] @ q[1:], "first entry of each vector"),
    W(lambda q, K: torch.dot(q, K), "torch.dot"),
    W(lambda q, K: torch.mm(K, q), "torch.mm"),
    W(lambda q, K: np.dot(K, q), "NumPy"),
    W(lambda q, K: K.numpy() @ q.numpy(), "NumPy"),
    W(lambda q, K: torch.from_numpy(K) @ q, "torch.from_numpy"),
    W(mul_in_place, "K in place", "x = x * y"),
    W(times_equals, "K in place"),
    W(doubles_q_in_place, "changed its input q in place", "a wrong result", "x[…] = …"),
    W(lambda q, K: (K.half() @ q.half()).float(), "float16"),
    W(lambda q, K: (K.bfloat16() * q.bfloat16()).sum(-1).to(K.dtype), "bfloat16"),
    W(lambda q, K: (K @ q).half(), "float16"),
    W(integer_preallocated, "integer"),
    W(lambda q, K: (K @ q).long(), "integer"),
    W(lambda q, K: K.flip(0) @ q, "reverse order", "counts down"),
    W(lambda q, K: torch.roll(K @ q, 1), "shifted by 1 place", "K[j - 1]"),
    # the right scores sorted are no index slip (issue 22): the sort is named
    W(lambda q, K: (K @ q).sort().values, "sorted in ascending order", "a sort"),
    W(lambda q, K: torch.sort(K @ q, descending=True).values, "sorted in descending order"),
    W(lambda q, K: torch.zeros(len(K)), "all zeros", named=False),
    W(lambda q, K: [q @ k for k in K], "Python list", "torch.stack"),
    W(lambda q, K: tuple(K @ q), "Python tuple"),
    W(lambda q, K: None, "None", "return"),
    W(lambda q, K: float((K @ q).sum()), "Python number"),
    W(lambda q, K: (K @ q) * 2, "factor of 2", "2 times"),
    W(lambda q, K: K @ q + 1, "shifted", named=False),
    W(raise_system_exit, "SystemExit"),
    W(lambda q, K: undefined_name, "NameError", named=True),  # noqa: F821  (a NameError explains itself)
    # mistakes a red team found, named from the evidence of every case (review of notebooks 01/02)
    W(loop_over_columns, "columns of K"),
    W(lambda q, K: torch.einsum("dn,d->n", K, q), "columns of K"),
    W(fixed_range, "shape (4,) whatever the input", "fixed"),
    W(last_key_only, "only the last key's score kept"),
    W(running_total, "running total"),
    W(first_product_only, "only the first product"),
    W(lambda q, K: torch.stack([(q * K).sum()]), "summed over everything"),
    W(lambda q, K: K.sum(-1), "does not depend on q", "never uses the values of q"),
    W(lambda q, K: torch.stack([q @ q for _ in K]), "does not depend on K"),
    W(lambda q, K: (K @ q).unsqueeze(0), "a row", "unsqueeze(0)"),
    W(lambda q, K: torch.ones(len(K)), "does not depend on q and K", "whatever its inputs hold"),
    # issue 22: the mutation set's slips, named from what they do on every case
    W(lambda q, K: (q / K).sum(-1), "q divided by the keys", "multiply the entries"),
    W(lambda q, K: K, "does not depend on q"),
]


# query_scores_loop and query_scores are one check body (the same cases, table and measurements) under two names:
# every answer is judged by one of them, and the test below shows the other says the same.
@pytest.mark.parametrize("fn", ONE_QUERY_RIGHT)
def test_one_query_checks_accept_correct_alternatives(fn, accepts):
    accepts(check_query_scores_loop if "loop" in getattr(fn, "__name__", "") else check_query_scores, fn)


@pytest.mark.parametrize("fn, phrases, named", ONE_QUERY_WRONG)
def test_one_query_checks_name_each_mistake(fn, phrases, named, rejects):
    rejects_as(rejects, check_query_scores_loop if "loop" in fn.__name__ else check_query_scores, fn, phrases, named)


@pytest.mark.parametrize("fn", [stack_loop, loop_one_short, lambda q, K: q @ K, lambda q, K: None, mul_in_place])
def test_the_two_one_query_checks_are_one_body(fn):
    loop, vectorised = check_query_scores_loop.evaluate(fn), check_query_scores.evaluate(fn)
    assert loop.status is vectorised.status and loop.summary == vectorised.summary
    if loop.diagnosis is not None:
        parts = [(name, text.replace("query_scores_loop", "query_scores")) for name, text in loop.diagnosis.parts()]
        assert parts == vectorised.diagnosis.parts()


def test_issue_11_item_9_einsum_and_sum_over_dim_1_pass(accepts):
    # rejected before: the check passed NumPy arrays that the docstring mentioned only in passing
    result = accepts(check_query_scores, lambda q, K: torch.einsum("d,nd->n", q, K))
    assert "✓" in result.headline()
    accepts(check_query_scores, lambda q, K: (q * K).sum(dim=1))


def loop_over_six_keys(q, K):  # the example had six keys
    return torch.stack([(q * K[j]).sum() for j in range(6)])


def loop_over_the_query_size(q, K):  # q.shape[0] is d, not the number of keys
    return torch.stack([(q * K[j]).sum() for j in range(q.shape[0])])


def test_a_loop_bound_that_is_not_the_keys_axis_is_named(rejects):  # adversarial audit g1
    rejects(check_query_scores_loop, loop_over_six_keys, "IndexError", "past the end of this axis", "range(6)",
            "range(K.shape[0])")
    rejects(check_query_scores_loop, loop_over_the_query_size, "the loop runs over the vector's entries")  # known


def test_one_query_inputs_are_tensors_only():
    # the docstring says tensors: no case hands the learner a NumPy array
    from attn_course.checks.dot import _one_query_cases

    for case in _one_query_cases():
        assert all(isinstance(a, torch.Tensor) for a in case.args)


@pytest.mark.parametrize("check", [check_query_scores_loop, check_query_scores])
def test_one_query_not_attempted_and_not_a_function(check, rejects, unfinished):
    rejects(check, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    assert check.evaluate(namespace={}).status is Status.NOT_ATTEMPTED
    rejects(check, torch.zeros(3), "not a function")


# ============================================================================ the score matrix
def batch_loop(Q, K):  # loops over every leading index, then matrix products of 2-D slices
    lead = Q.shape[:-2]
    Qf, Kf = Q.reshape(-1, *Q.shape[-2:]), K.reshape(-1, *K.shape[-2:])
    return torch.stack([q @ k.T for q, k in zip(Qf, Kf)]).reshape(*lead, Q.shape[-2], K.shape[-2])


def bmm_flattened(Q, K):
    Qf, Kf = Q.reshape(-1, *Q.shape[-2:]), K.reshape(-1, *K.shape[-2:])
    return torch.bmm(Qf, Kf.transpose(1, 2)).reshape(*Q.shape[:-1], K.shape[-2])


SCORE_RIGHT = [
    lambda Q, K: Q @ K.transpose(-2, -1), lambda Q, K: Q @ K.mT, lambda Q, K: torch.matmul(Q, K.transpose(-1, -2)),
    lambda Q, K: torch.einsum("...qd,...kd->...qk", Q, K), lambda Q, K: torch.einsum("...ij,...kj->...ik", Q, K),
    lambda Q, K: (Q.unsqueeze(-2) * K.unsqueeze(-3)).sum(-1), lambda Q, K: (K @ Q.mT).mT,
    lambda Q, K: Q @ K.swapaxes(-1, -2), lambda Q, K: Q @ K.movedim(-1, -2),
    lambda Q, K: (Q.double() @ K.double().mT).to(Q.dtype), lambda Q, K: Q.matmul(K.mT).contiguous(),
    batch_loop, bmm_flattened, dot.score_matrix,
]


def transpose_in_place(Q, K):
    return Q @ K.transpose_(-2, -1)


def zip_loop(Q, K):
    return torch.stack([q @ k.T for q, k in zip(Q, K)])


def rows_loop_2d(Q, K):
    S = torch.zeros(Q.shape[0], K.shape[0], dtype=Q.dtype)
    for i in range(Q.shape[0]):
        for j in range(K.shape[0]):
            S[i, j] = Q[i] @ K[j]
    return S


def every_axis_reversed(Q, K):  # K.T's error with no ".T" in the line that raised it: named by the rows that raise
    return Q @ K.permute(*reversed(range(K.ndim)))  # it and that no right 2-D result rules out (K @ Q.T gives K Qᵀ)


SCORE_WRONG = [
    W(lambda Q, K: Q @ K, "K not transposed", "K.transpose(-2, -1)"),
    W(lambda Q, K: K @ Q.mT, "rows and columns swapped"),
    W(lambda Q, K: torch.einsum("...qd,...kd->...kq", Q, K), "rows and columns swapped", "einsum"),
    W(lambda Q, K: (Q @ K.mT).mT, "rows and columns swapped"),
    W(lambda Q, K: Q @ K.T, "K.T on batched input", "K.mT"),
    W(every_axis_reversed, "K.T on batched input"),
    W(lambda Q, K: Q @ K.transpose(0, 1), "transpose(0, 1)"),
    W(lambda Q, K: Q @ K.transpose(1, 2), "transpose(1, 2)"),
    W(lambda Q, K: Q @ K.permute(0, 2, 1), "permute(0, 2, 1)"),
    W(lambda Q, K: Q @ K.t(), "2-D only"),
    W(lambda Q, K: torch.mm(Q, K.T), "2-D only"),
    W(lambda Q, K: F.linear(Q, K), "2-D only"),
    W(rows_loop_2d, "loop over the first axis"),
    W(lambda Q, K: torch.bmm(Q, K.mT), "torch.bmm"),
    W(lambda Q, K: torch.einsum("qd,kd->qk", Q, K), "einsum without '...'"),
    W(lambda Q, K: torch.einsum("bqd,bkd->bqk", Q, K), "einsum without '...'"),
    W(lambda Q, K: torch.einsum("bhqd,bhkd->bhqk", Q, K), "einsum without '...'"),
    W(lambda Q, K: Q.reshape(-1, Q.shape[-1]) @ K.reshape(-1, K.shape[-1]).T, "flattened"),
    W(lambda Q, K: (Q.unsqueeze(-2) * K.unsqueeze(-3)).sum(-2), "summed over the keys axis"),
    W(lambda Q, K: Q * K, "entry-by-entry"),
    W(lambda Q, K: (Q * K).sum(-1), "entry-by-entry"),
    W(lambda Q, K: Q.mT @ K, "Qᵀ K"),
    W(zip_loop, "loop over the first axis"),
    W(lambda Q, K: (Q @ K.mT).squeeze(), ".squeeze()"),
    W(lambda Q, K: dot.cosine_scores(Q, K), "cosine"),
    W(lambda Q, K: Q @ K.mT / math.sqrt(Q.shape[-1]), "√d", "notebook 02"),
    W(lambda Q, K: Q @ K.mT / Q.shape[-1], "averaged"),
    W(lambda Q, K: torch.softmax(Q @ K.mT, -1), "softmax"),
    W(lambda Q, K: Q[..., :-1] @ K[..., :-1].mT, "last entry of each vector"),
    W(lambda Q, K: np.einsum("...qd,...kd->...qk", Q.numpy(), K.numpy()), "NumPy"),
    W(transpose_in_place, "K in place"),
    W(lambda Q, K: torch.from_numpy(Q) @ K.mT, "torch.from_numpy"),
    W(lambda Q, K: torch.from_numpy(Q.numpy() @ K.numpy().T), "ValueError", "line", named=False),
    W(lambda Q, K: (Q.half() @ K.half().mT).to(Q.dtype), "float16"),
    W(lambda Q, K: (Q @ K.mT).long(), "integer"),
    W(lambda Q, K: (Q @ K.mT).tolist(), "Python list", ".tolist()"),
    W(lambda Q, K: (Q @ K.mT)[..., :-1], "wrong shape", named=False),
    W(lambda Q, K: (Q @ K.mT).reshape(-1), "wrong shape", "reshape"),
    W(lambda Q, K: Q @ K.mT / 0 * 0, "NaN", named=False),
    W(lambda Q, K: Q @ K.mT * 2, "factor of 2", "2 times"),
    W(lambda Q, K: Q @ K.mT if Q.ndim < 4 else 1.5 * Q @ K.mT, "wrong with 4-D input only"),
    W(lambda Q, K: Q @ K.mT if Q.ndim == 2 else (Q @ K.mT).flatten(0, 1), "wrong shape with batched input only"),
    # red-team review of notebooks 01/02
    W(lambda Q, K: torch.einsum("...qd,...dk->...qk", Q, K), "K not transposed"),  # raises unless n_k = d
    W(lambda Q, K: Q @ K.transpose(2, 3), "transpose(2, 3)"),  # the LLMs-from-scratch 4-D form
    W(lambda Q, K: Q @ K.reshape(*K.shape[:-2], K.shape[-1], K.shape[-2]), "reshaped instead of transposed"),
    W(lambda Q, K: torch.inner(Q, K), "torch.inner"),
    W(lambda Q, K: torch.tensordot(Q, K, dims=([-1], [-1])), "torch.inner"),
    W(lambda Q, K: Q @ Q.mT, "does not depend on K"),
    W(lambda Q, K: (Q[(0,) * (Q.ndim - 2)] @ K[(0,) * (K.ndim - 2)].mT).expand(*Q.shape[:-1], K.shape[-2]).clone(),
      "first batch entry only"),
]


@pytest.mark.parametrize("fn", SCORE_RIGHT)
def test_score_matrix_accepts_correct_alternatives(fn, accepts):
    accepts(check_score_matrix, fn)


@pytest.mark.parametrize("fn, phrases, named", SCORE_WRONG)
def test_score_matrix_names_each_mistake(fn, phrases, named, rejects):
    rejects_as(rejects, check_score_matrix, fn, phrases, named)


def test_score_matrix_not_attempted_and_not_a_function(rejects, unfinished):
    rejects(check_score_matrix, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_score_matrix, "Q @ K.T", "not a function")


# ============================================================================ cosine similarity
def unit(x, eps):
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


COSINE_RIGHT = [
    dot.cosine_scores,
    lambda Q, K, eps=1e-8: unit(Q, eps) @ unit(K, eps).mT,
    lambda Q, K, eps=1e-8: F.cosine_similarity(Q.unsqueeze(-2), K.unsqueeze(-3), dim=-1, eps=eps),
    lambda Q, K, eps=1e-8: F.normalize(Q, dim=-1, eps=eps) @ F.normalize(K, dim=-1, eps=eps).transpose(-2, -1),
    lambda Q, K, eps=1e-8: (unit(Q, eps) @ unit(K, eps).mT).clamp(-1, 1),
    lambda Q, K, eps=1e-8: Q / torch.linalg.vector_norm(Q, dim=-1, keepdim=True).clamp(min=eps)
    @ (K / torch.linalg.vector_norm(K, dim=-1, keepdim=True).clamp(min=eps)).mT,
    lambda Q, K, eps=1e-8: (Q * torch.rsqrt((Q * Q).sum(-1, keepdim=True).clamp_min(eps * eps)))
    @ (K * torch.rsqrt((K * K).sum(-1, keepdim=True).clamp_min(eps * eps))).mT,
    lambda Q, K, eps=1e-8: torch.einsum("...qd,...kd->...qk", unit(Q, eps), unit(K, eps)),
    lambda Q, K, eps=1e-8: (Q / torch.maximum(Q.norm(dim=-1, keepdim=True), torch.tensor(eps, dtype=Q.dtype)))
    @ (K / torch.maximum(K.norm(dim=-1, keepdim=True), torch.tensor(eps, dtype=K.dtype))).mT,
    lambda Q, K, eps=1e-8: dot.cosine_scores(Q.double(), K.double(), eps).to(Q.dtype),
    lambda Q, K, eps=1e-8: dot.cosine_scores(Q.float(), K.float(), eps),  # float32 for float64 input is allowed
    lambda Q, K, **kwargs: dot.cosine_scores(Q, K, kwargs.get("eps", 1e-8)),
]


def normalise_in_place(Q, K, eps=1e-8):
    Q /= Q.norm(dim=-1, keepdim=True).clamp_min(eps)
    K /= K.norm(dim=-1, keepdim=True).clamp_min(eps)
    return Q @ K.mT


def _both(prep):
    return lambda Q, K, eps=1e-8: prep(Q, eps) @ prep(K, eps).mT


COSINE_WRONG = [
    W(lambda Q, K, eps=1e-8: Q @ K.mT, "lengths not divided out"),
    W(lambda Q, K, eps=1e-8: unit(Q, eps) @ K.mT, "only the queries"),
    W(lambda Q, K, eps=1e-8: Q @ unit(K, eps).mT, "only the keys"),
    W(_both(lambda x, e: x / x.norm(dim=-2, keepdim=True).clamp_min(e)), "wrong axis"),
    W(lambda Q, K, eps=1e-8: F.normalize(Q, eps=eps) @ F.normalize(K, eps=eps).mT, "dim=1"),
    W(_both(lambda x, e: x / x.norm().clamp_min(e)), "whole matrix"),
    W(_both(lambda x, e: x / x.norm(p=1, dim=-1, keepdim=True).clamp_min(e)), "L1"),
    W(lambda Q, K, eps=1e-8: (Q @ K.mT) / ((Q * Q).sum(-1, keepdim=True) * (K * K).sum(-1).unsqueeze(-2)).clamp_min(eps),
      "squared lengths"),
    W(lambda Q, K, eps=1e-8: 1 - unit(Q, eps) @ unit(K, eps).mT, "1 − cos"),
    W(lambda Q, K, eps=1e-8: (unit(Q, eps) @ unit(K, eps).mT).abs(), "absolute"),
    W(lambda Q, K, eps=1e-8: torch.arccos((unit(Q, eps) @ unit(K, eps).mT).clamp(-1, 1)), "angle"),
    W(_both(lambda x, e: x / x.norm(dim=-1, keepdim=True)), "not clamped", "NaN"),
    W(lambda Q, K, eps=1e-8: unit(Q, 1e-8) @ unit(K, 1e-8).mT, "eps ignored"),
    W(lambda Q, K, eps=1e-8: F.cosine_similarity(Q.unsqueeze(-2), K.unsqueeze(-3), dim=-1), "eps ignored"),
    W(lambda Q, K, eps=1e-8: F.normalize(Q, dim=-1) @ F.normalize(K, dim=-1).mT, "eps ignored"),
    W(_both(lambda x, e: x / (x.norm(dim=-1, keepdim=True) + e)), "eps added instead of clamped"),
    W(_both(lambda x, e: x / (x * x).sum(-1, keepdim=True).clamp_min(e).sqrt()), "squared length at eps"),
    W(_both(lambda x, e: x / x.norm(dim=-1, keepdim=True).clamp_max(e)), "clamp_max"),
    W(_both(lambda x, e: x / x.norm(dim=-1).clamp_min(e)), "keepdim missing"),
    W(lambda Q, K, eps=1e-8: (Q @ K.mT) / (Q.norm(dim=-1) * K.norm(dim=-1)).clamp_min(eps), "entry by entry"),
    W(lambda Q, K, eps=1e-8: F.cosine_similarity(Q, K, dim=-1, eps=eps), "key i only"),
    W(lambda Q, K, eps=1e-8: unit(Q, eps) @ unit(K, eps).T, "K.T on batched input"),
    W(lambda Q, K, eps=1e-8: unit(K, eps) @ unit(Q, eps).mT, "rows and columns swapped"),
    W(lambda Q, K, eps=1e-8: (unit(Q, eps) @ unit(K, eps).mT).numpy(), "NumPy"),
    W(normalise_in_place, "in place"),
    W(lambda Q, K, eps=1e-8: (unit(Q, eps).half() @ unit(K, eps).half().mT).to(Q.dtype), "float16"),
    W(lambda Q, K, eps=1e-8: (unit(Q, eps) @ unit(K, eps).mT).tolist(), "Python list", ".tolist()"),
    W(lambda Q, K, epsilon=1e-8: unit(Q, epsilon) @ unit(K, epsilon).mT, "no parameter eps", "renamed"),
    W(lambda Q, K: unit(Q, 1e-8) @ unit(K, 1e-8).mT, "no parameter eps"),
    W(lambda Q, K, eps: unit(Q, eps) @ unit(K, eps).mT, "no default value", "eps=1e-8"),
    W(lambda Q, K, eps=1e-8: 0.99 * unit(Q, eps) @ unit(K, eps).mT, "factor of 0.99", named=False),
    W(lambda Q, K, eps=1e-8: unit(Q, eps / 2) @ unit(K, eps / 2).mT, "wrong with a given eps only", "other than the default"),
    # the older convention (the product of the lengths clamped once) is not the docstring's
    W(lambda Q, K, eps=1e-8: (Q @ K.mT) / (Q.norm(dim=-1, keepdim=True) * K.norm(dim=-1).unsqueeze(-2)).clamp_min(eps),
      "clamped the product of the lengths", "each length"),
    W(_both(lambda x, e: x / torch.where(x.norm(dim=-1, keepdim=True) == 0, e, x.norm(dim=-1, keepdim=True))),
      "eps ignored", "only for zero lengths"),
    # issue 22: a slip in normalising one side only is named with that side; a slip named by the message of an
    # exception alone (the same broadcast error as keepdim missing) is not
    W(lambda Q, K, eps=1e-8: Q / eps @ unit(K, eps).mT, "divided by eps, not by their lengths (queries)", "eps itself"),
    W(_both(lambda x, e: x / e), "rows divided by eps, not by their lengths", "eps itself"),
    W(lambda Q, K, eps=1e-8: Q * Q.norm(dim=-1, keepdim=True) @ unit(K, eps).mT, "multiplied by the lengths (queries)"),
    W(lambda Q, K, eps=1e-8: unit(Q, eps) @ (K / K.norm(dim=-1, keepdim=True)).mT, "lengths not clamped (keys)"),
    W(lambda Q, K, eps=1e-8: unit(Q, eps) @ (K / K.norm(dim=0, keepdim=True).clamp_min(eps)).mT,
      "norm over the wrong axis (keys)"),
    W(lambda Q, K, eps=1e-8: (Q / Q.norm(dim=-1).clamp_min(eps)) @ unit(K, eps).mT, "keepdim missing (queries)"),
]


def test_a_broadcast_error_is_not_blamed_on_a_mistake_that_gives_the_same_message_on_one_case_only(rejects):
    result = rejects(check_cosine_scores, lambda Q, K, eps=1e-8: unit(Q, eps) * unit(K, eps).mT, "RuntimeError")
    assert "keepdim" not in result.text()


@pytest.mark.parametrize("fn", COSINE_RIGHT)
def test_cosine_accepts_correct_alternatives(fn, accepts):
    accepts(check_cosine_scores, fn)


@pytest.mark.parametrize("fn, phrases, named", COSINE_WRONG)
def test_cosine_names_each_mistake(fn, phrases, named, rejects):
    rejects_as(rejects, check_cosine_scores, fn, phrases, named)


def test_cosine_eps_cases_tell_the_two_clamping_conventions_apart():
    # The docstring clamps each length, max(‖q‖, eps)·max(‖k‖, eps); the older convention clamps the product
    # max(‖q‖·‖k‖, eps). They agree whenever one vector has length 1, so the eps = 0.5 case also pairs a query of
    # length 3 with a key of length 0.3 (product 0.9 ≥ eps, but 0.3 < eps).
    from attn_course.checks.dot import _cosine_cases

    eps_cases = [case for case in _cosine_cases() if "eps" in case.tags]
    assert eps_cases
    differ = False
    for case in eps_cases:
        Q, K = case.args
        eps = case.kwargs["eps"]
        each = dot.cosine_scores(Q.double(), K.double(), eps)
        product = (Q.double() @ K.double().mT) / (Q.double().norm(dim=-1, keepdim=True)
                                                 * K.double().norm(dim=-1).unsqueeze(-2)).clamp_min(eps)
        differ = differ or not torch.allclose(each, product)
        assert not torch.allclose(each, dot.cosine_scores(Q.double(), K.double(), 1e-8))  # eps matters
    assert differ


def test_cosine_not_attempted_and_not_a_function(rejects, unfinished):
    rejects(check_cosine_scores, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    rejects(check_cosine_scores, 3, "not a function")


# ============================================================ audit A: typed-in lengths, clamped cosines
def typed_in_three(q, K):  # the example's vectors had 3 entries
    scores = []
    for key in K:
        total = 0.0
        for i in range(3):
            total = total + q[i] * key[i]
        scores.append(total)
    return torch.stack(scores)


def typed_in_eight_raises(q, K):  # past the end of every shorter vector: the IndexError is named
    return torch.stack([sum(q[i] * K[j, i] for i in range(8)) for j in range(len(K))])


def typed_in_ten_key_first(q, K):  # longer than every vector; K[j, i] first names dimension 1 in the message
    return torch.stack([sum(K[j, i] * q[i] for i in range(10)) for j in range(len(K))])


def typed_in_seven(q, K):
    return torch.stack([sum(q[i] * k[i] for i in range(7)) for k in K])


def typed_in_slice_five(q, K):  # a slice: shorter vectors are kept whole, longer ones cut
    return torch.stack([(q[:5] * k[:5]).sum() for k in K])


def typed_in_written_out(q, K):  # three products written out by hand
    return torch.stack([q[0] * k[0] + q[1] * k[1] + q[2] * k[2] for k in K])


TYPED_LENGTH_WRONG = [
    W(typed_in_three, "the vector length typed in as 3", "range(3)", "len(q)"),
    W(typed_in_eight_raises, "IndexError", "the vector length typed in as 8", "range(8)", "runs past its end"),
    W(typed_in_ten_key_first, "IndexError", "a vector length typed in", "more than this vector has"),
    W(typed_in_seven, "the vector length typed in as 7"),
    W(typed_in_slice_five, "the vector length typed in as 5", "q[:5]"),
    W(typed_in_written_out, "the vector length typed in as 3"),
    W(lambda q, K: K[:, :2] @ q[:2], "the vector length typed in as 2", "q[:2]"),
]


@pytest.mark.parametrize("fn, phrases, named", TYPED_LENGTH_WRONG)
def test_a_vector_length_typed_in_is_named(fn, phrases, named, rejects):
    rejects_as(rejects, check_query_scores_loop if fn.__name__.startswith("typed") else check_query_scores, fn, phrases,
               named)


def loop_over_len_q(q, K):
    return torch.stack([sum(q[i] * k[i] for i in range(len(q))) for k in K])


def loop_over_key_width(q, K):
    scores = []
    for j in range(K.shape[0]):
        total = torch.zeros((), dtype=K.dtype)
        for i in range(K.shape[1]):
            total = total + K[j, i] * q[i]
        scores.append(total)
    return torch.stack(scores)


def loop_zip(q, K):
    return torch.stack([sum(a * b for a, b in zip(q, key)) for key in K])


def slice_of_full_length(q, K):  # a slice up to the vector's own length keeps every entry
    return torch.stack([(q[:q.numel()] * key[:key.shape[-1]]).sum() for key in K])


def loop_over_numel(q, K):
    return torch.stack([torch.stack([q[i] * key[i] for i in range(q.numel())]).sum() for key in K])


@pytest.mark.parametrize("fn", [loop_over_len_q, loop_over_key_width, loop_zip, slice_of_full_length, loop_over_numel])
def test_loops_over_the_vector_length_pass(fn, accepts):
    accepts(check_query_scores_loop, fn)


def cos_matrix(Q, K, eps):
    return unit(Q, eps) @ unit(K, eps).mT


COSINE_CLAMPED = [
    W(lambda Q, K, eps=1e-8: cos_matrix(Q, K, eps).clamp(min=0), "negative cosines set to 0", "down to −1"),
    W(lambda Q, K, eps=1e-8: torch.relu(cos_matrix(Q, K, eps)), "negative cosines set to 0"),
    W(lambda Q, K, eps=1e-8: cos_matrix(Q, K, eps).clamp(0, 1), "negative cosines set to 0"),
    W(lambda Q, K, eps=1e-8: F.relu(Q @ K.mT) / (Q.norm(dim=-1, keepdim=True).clamp_min(eps)
                                                 * K.norm(dim=-1).clamp_min(eps).unsqueeze(-2)),
      "negative cosines set to 0"),  # the dot products clamped before the division: the same numbers
    W(lambda Q, K, eps=1e-8: torch.where(cos_matrix(Q, K, eps) < 0, 0.0, cos_matrix(Q, K, eps)),
      "negative cosines set to 0"),
]


@pytest.mark.parametrize("fn, phrases, named", COSINE_CLAMPED)
def test_cosine_clamped_at_zero_is_named(fn, phrases, named, rejects):
    rejects_as(rejects, check_cosine_scores, fn, phrases, named)


@pytest.mark.parametrize("fn", [
    lambda Q, K, eps=1e-8: cos_matrix(Q, K, eps).clamp(min=-1),  # a clamp at −1 changes nothing
    lambda Q, K, eps=1e-8: cos_matrix(Q, K, eps).clamp(-1.0, 1.0).to(Q.dtype),
    lambda Q, K, eps=1e-8: torch.nn.CosineSimilarity(dim=-1, eps=eps)(Q[..., :, None, :], K[..., None, :, :]),
    lambda Q, K, eps=1e-8: (Q @ K.mT) / (torch.linalg.norm(Q, dim=-1, keepdim=True).clamp(min=eps)
                                         * torch.linalg.norm(K, dim=-1).clamp(min=eps).unsqueeze(-2)),
    lambda Q, K, eps=1e-8: torch.matmul(F.normalize(Q, p=2.0, dim=-1, eps=eps),
                                        F.normalize(K, p=2.0, dim=-1, eps=eps).transpose(-1, -2)),
    lambda Q, K, eps=1e-8: torch.relu(cos_matrix(Q, K, eps)) - torch.relu(-cos_matrix(Q, K, eps)),  # relu and back
])
def test_cosine_alternatives_near_a_clamp_pass(fn, accepts):
    accepts(check_cosine_scores, fn)


# ============================================================ red team A: a bound past the end is not a typed-in length
def bound_plus_one(q, K):  # range(len(q) + 1): raises at index len(q) on every vector, as range(9) does
    return torch.stack([sum(q[i] * K[j, i] for i in range(len(q) + 1)) for j in range(len(K))])


def indices_from_one(q, K):  # 1-based indices: the same IndexError on every vector
    return torch.stack([sum(K[j, i] * q[i] for i in range(1, K.shape[1] + 1)) for j in range(len(K))])


def bound_of_the_longer_axis(q, K):  # max(len(q), len(K)): right where d ≥ n_k, past the end elsewhere
    return torch.stack([sum(q[i] * K[j, i] for i in range(max(len(q), len(K)))) for j in range(len(K))])


@pytest.mark.parametrize("fn", [bound_plus_one, indices_from_one, bound_of_the_longer_axis])
def test_a_bound_past_the_end_is_not_named_a_typed_in_length(fn, rejects):
    result = rejects(check_query_scores_loop, fn, "IndexError")
    assert "typed in" not in result.text(), result.text()


# =============================================================================== audit round 3 A: results kept between calls
_SEEN: dict = {}


def r3_scores_cached_by_shape(q, K):  # "faster": remembers the scores of every shape it has seen
    key = ("one", tuple(q.shape), tuple(K.shape), q.dtype)
    if key not in _SEEN:
        _SEEN[key] = K @ q
    return _SEEN[key]


def r3_matrix_cached_by_shape(Q, K):
    key = ("matrix", tuple(Q.shape), tuple(K.shape), Q.dtype)
    if key not in _SEEN:
        _SEEN[key] = Q @ K.transpose(-2, -1)
    return _SEEN[key]


def r3_cosine_cached_by_shape(Q, K, eps=1e-8):
    key = ("cosine", tuple(Q.shape), tuple(K.shape), Q.dtype, eps)
    if key not in _SEEN:
        _SEEN[key] = F.normalize(Q, dim=-1, eps=eps) @ F.normalize(K, dim=-1, eps=eps).transpose(-2, -1)
    return _SEEN[key]


class R3CountingScores:  # right for the first calls, then a "warm-up" scale creeps in
    def __init__(self):
        self.calls = 0

    def __call__(self, q, K):
        self.calls += 1
        return K @ q * (1.0 if self.calls <= 6 else 1.5)


@pytest.mark.parametrize("check,fn", [(check_query_scores, r3_scores_cached_by_shape),
                                      (check_query_scores_loop, r3_scores_cached_by_shape),
                                      (check_score_matrix, r3_matrix_cached_by_shape),
                                      (check_cosine_scores, r3_cosine_cached_by_shape)])
def test_a_result_cached_by_shape_is_rejected(check, fn, rejects):  # every case had its own shapes: all passed
    _SEEN.clear()
    rejects(check, fn, "an earlier result returned again", "a result kept from an earlier call")


def test_a_result_that_drifts_after_some_calls_is_rejected(rejects):
    rejects(check_query_scores, R3CountingScores(), "wrong on new values of the same shapes", "a call counter")

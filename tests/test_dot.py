"""Notebook 01: the reference dot-product code against PyTorch, and each check against its pitfalls.

For every check: each pitfall it claims is rejected with a message naming it; correct alternatives
(einsum, matmul, loops, NumPy output, float64) pass; an unfinished function is "not attempted";
a non-callable, a list, a wrong shape or NaN gets a clear message.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_course import dot
from attn_course.checks._core import NotAttempted
from attn_course.checks.dot import check_cosine_scores, check_query_scores, check_query_scores_loop, check_score_matrix
from checking import rejects


def unfinished(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- reference implementations


def test_reference_scores_match_pytorch():
    g = torch.Generator().manual_seed(0)
    q, K = torch.randn(7, generator=g, dtype=torch.float64), torch.randn(5, 7, generator=g, dtype=torch.float64)
    expected = torch.mv(K, q)
    torch.testing.assert_close(dot.query_scores_loop(q, K), expected)
    torch.testing.assert_close(dot.query_scores(q, K), expected)


def test_reference_score_matrix_matches_einsum_on_batched_input():
    g = torch.Generator().manual_seed(1)
    Q, K = torch.randn(2, 3, 4, 5, generator=g), torch.randn(2, 3, 6, 5, generator=g)
    torch.testing.assert_close(dot.score_matrix(Q, K), torch.einsum("bhqd,bhkd->bhqk", Q, K))


def test_reference_cosine_matches_torch_cosine_similarity_including_zero_vectors():
    g = torch.Generator().manual_seed(2)
    Q, K = torch.randn(2, 3, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    K[0, 2] = 0.0
    expected = F.cosine_similarity(Q.unsqueeze(-2), K.unsqueeze(-3), dim=-1)
    torch.testing.assert_close(dot.cosine_scores(Q, K), expected)
    assert torch.all(dot.cosine_scores(Q, K)[0, :, 2] == 0)


def test_worked_example_recomputes_the_sources_printed_scores():
    Q, K, V = dot.worked_example()
    assert Q.shape == K.shape == V.shape == (4, 8)
    S = dot.score_matrix(Q, K)
    printed = torch.tensor(dot.SOURCE_RAW_SCORES, dtype=torch.float64)
    assert (S - printed).abs().max() <= 0.005  # equal to the printed two decimals
    assert dot.format_matrix(S[0], 2).split() == ["0.70", "0.14", "-0.14", "0.51"]
    assert dot.format_matrix(S[3], 2).split() == ["0.60", "-0.00", "0.02", "1.00"]


def test_worked_example_later_steps_match_the_source_too():
    # the source's scaled scores and weights for Q0 (0.25 0.05 -0.05 0.18 / 0.29 0.23 0.21 0.27)
    Q, K, V = dot.worked_example()
    scaled = dot.score_matrix(Q, K)[0] / 8**0.5
    assert dot.format_matrix(scaled, 2).split() == ["0.25", "0.05", "-0.05", "0.18"]
    assert dot.format_matrix(torch.softmax(scaled, -1), 2).split() == ["0.29", "0.23", "0.21", "0.27"]


def test_toy_sentence_retrieves_the_expected_words():
    tokens, features, keys = dot.toy_sentence()
    assert keys.shape == (len(tokens), len(features))
    assert tokens[int(dot.query_scores(torch.tensor([1.0, 0, 0, 0], dtype=torch.float64), keys).argmax())] == "cat"


# ---------------------------------------------------------------- one query: loop and vectorised

ONE_QUERY = [check_query_scores_loop, check_query_scores]


@pytest.mark.parametrize("check", ONE_QUERY)
@pytest.mark.parametrize(
    "fn",
    [
        lambda q, K: K @ q,
        lambda q, K: torch.einsum("kd,d->k", torch.as_tensor(K), torch.as_tensor(q)),
        lambda q, K: (torch.as_tensor(K) * torch.as_tensor(q)).sum(dim=-1),
        lambda q, K: torch.as_tensor(K).double() @ torch.as_tensor(q).double(),  # float64 answer
        lambda q, K: np.asarray(K) @ np.asarray(q),  # NumPy answer
        lambda q, K: torch.stack([(q * k).sum() for k in K]) if isinstance(K, torch.Tensor) else K @ q,
    ],
    ids=["matmul", "einsum", "mul-sum", "float64", "numpy-out", "loop"],
)
def test_one_query_checks_accept_correct_alternatives(check, fn, capsys):
    check(fn)
    assert "✓" in capsys.readouterr().out


def test_loop_with_preallocated_tensor_passes(capsys):
    def loop(q, K):
        scores = torch.zeros(K.shape[0], dtype=K.dtype)
        for j in range(K.shape[0]):
            scores[j] = torch.dot(q, K[j])
        return scores

    check_query_scores_loop(loop)
    assert "✓ query_scores_loop" in capsys.readouterr().out


@pytest.mark.parametrize("check", ONE_QUERY)
def test_one_query_transposed_K_is_named(check):
    rejects(check, lambda q, K: q @ K, "columns of K", "K @ q")


@pytest.mark.parametrize("check", ONE_QUERY)
def test_one_query_sum_over_wrong_axis_is_named(check):
    rejects(check, lambda q, K: (K * q).sum(0), "wrong axis")


@pytest.mark.parametrize("check", ONE_QUERY)
def test_one_query_cosine_instead_of_dot_is_named(check):
    rejects(check, lambda q, K: F.cosine_similarity(K, q.unsqueeze(0), dim=-1), "cosine similarities")


@pytest.mark.parametrize("check", ONE_QUERY)
def test_one_query_python_list_is_named(check):
    rejects(check, lambda q, K: [(q * k).sum() for k in K], "Python list", "torch.stack")


@pytest.mark.parametrize("check", ONE_QUERY)
def test_one_query_column_shape_is_named(check):
    rejects(check, lambda q, K: K @ q[:, None], "shape (4, 1)", "Squeeze")


@pytest.mark.parametrize("check", ONE_QUERY)
def test_one_query_summing_everything_is_named(check):
    rejects(check, lambda q, K: (K * q).sum(), "single number", "dim=-1")


@pytest.mark.parametrize("check", ONE_QUERY)
def test_one_query_unfinished_is_not_attempted(check):
    with pytest.raises(NotAttempted, match="not attempted"):
        check(unfinished)


@pytest.mark.parametrize("check", ONE_QUERY)
def test_one_query_non_callable_none_and_nan_get_messages(check):
    rejects(check, torch.zeros(3), "expected a function")  # a tensor instead of a function
    rejects(check, lambda q, K: None, "None", "return")
    rejects(check, lambda q, K: (K @ q) * float("nan"), "NaN")


def test_one_query_crash_on_non_square_keys_explains_the_shapes():
    def transposed_unless_square(q, K):  # right for square K only: q @ K crashes when n_k != d
        return K @ q if K.shape[0] == K.shape[1] else q @ K

    rejects(check_query_scores, transposed_unless_square, "raised RuntimeError", "K has shape (6, 3)", "q @ K needs K transposed")


# ---------------------------------------------------------------- the score matrix


@pytest.mark.parametrize(
    "fn",
    [
        lambda Q, K: Q @ K.transpose(-2, -1),
        lambda Q, K: Q @ K.mT,
        lambda Q, K: torch.matmul(Q, K.transpose(-1, -2)),
        lambda Q, K: torch.einsum("...qd,...kd->...qk", Q, K),
        lambda Q, K: (Q.unsqueeze(-2) * K.unsqueeze(-3)).sum(-1),
        lambda Q, K: (Q.double() @ K.double().transpose(-2, -1)).float(),
        lambda Q, K: np.einsum("...qd,...kd->...qk", Q.numpy(), K.numpy()),  # NumPy answer
    ],
    ids=["transpose", "mT", "matmul", "einsum", "broadcast-sum", "via-float64", "numpy-out"],
)
def test_score_matrix_accepts_correct_alternatives(fn, capsys):
    check_score_matrix(fn)
    assert "✓ score_matrix" in capsys.readouterr().out


def test_score_matrix_K_instead_of_K_transposed_is_named():
    rejects(check_score_matrix, lambda Q, K: Q @ K, "K instead of Kᵀ")


def test_score_matrix_K_dot_T_on_batched_input_is_named():
    def dot_T(Q, K):
        return Q @ K.T if K.ndim == 2 else Q @ K.permute(*reversed(range(K.ndim)))  # what K.T does

    rejects(check_score_matrix, dot_T, "K.T on a batched tensor")


def test_score_matrix_real_K_dot_T_is_named(recwarn):
    rejects(check_score_matrix, lambda Q, K: Q @ K.T, "K.T")


def test_score_matrix_fixed_axes_transpose_is_named():
    # K.transpose(0, 1) is right for 2-D input; on batched input it swaps the batch axis, and is named
    rejects(check_score_matrix, lambda Q, K: Q @ K.transpose(0, 1), "fixed axes", "K.transpose(-2, -1)")


def test_score_matrix_heads_axes_transpose_is_named():
    fn = lambda Q, K: Q @ K.transpose(1, 2) if K.ndim == 4 else Q @ K.transpose(-2, -1)  # noqa: E731
    rejects(check_score_matrix, fn, "K.transpose(1, 2)")


def test_score_matrix_rows_and_columns_swapped_is_named():
    rejects(check_score_matrix, lambda Q, K: K @ Q.transpose(-2, -1), "rows and columns are swapped")


def test_score_matrix_wrong_shape_is_named():
    message = rejects(check_score_matrix, lambda Q, K: (Q @ K.transpose(-2, -1)).reshape(-1), "has shape")
    assert "queries on rows" in message or "arranged" in message


def test_score_matrix_crash_from_transposing_is_explained():
    rejects(check_score_matrix, lambda Q, K: Q @ K.transpose(1, 2), "raised", "K.transpose(-2, -1)")


def test_score_matrix_unfinished_list_nan_noncallable():
    with pytest.raises(NotAttempted, match="not attempted"):
        check_score_matrix(unfinished)
    rejects(check_score_matrix, lambda Q, K: (Q @ K.transpose(-2, -1)).tolist(), "Python list")
    rejects(check_score_matrix, lambda Q, K: Q @ K.transpose(-2, -1) / 0 * 0, "NaN")
    rejects(check_score_matrix, "Q @ K.T", "expected a function")


# ---------------------------------------------------------------- cosine similarity


@pytest.mark.parametrize(
    "fn",
    [
        dot.cosine_scores,
        lambda Q, K, eps=1e-8: F.cosine_similarity(Q.unsqueeze(-2), K.unsqueeze(-3), dim=-1, eps=eps),
        lambda Q, K, eps=1e-8: F.normalize(Q, dim=-1, eps=eps) @ F.normalize(K, dim=-1, eps=eps).mT,
        lambda Q, K, eps=1e-8: (Q @ K.mT) / (Q.norm(dim=-1, keepdim=True) * K.norm(dim=-1).unsqueeze(-2)).clamp_min(eps),
        lambda Q, K, eps=1e-8: dot.cosine_scores(Q.double(), K.double()).numpy(),
    ],
    ids=["reference", "F.cosine_similarity", "F.normalize", "divide-after", "numpy-out"],
)
def test_cosine_accepts_correct_alternatives(fn, capsys):
    check_cosine_scores(fn)
    assert "✓ cosine_scores" in capsys.readouterr().out


def _unit(x, dim=-1):
    return x / x.norm(dim=dim, keepdim=True).clamp_min(1e-8)


@pytest.mark.parametrize(
    "fn, phrase",
    [
        (lambda Q, K: Q @ K.mT, "raw dot products"),
        (lambda Q, K: _unit(Q) @ K.mT, "only the queries"),
        (lambda Q, K: Q @ _unit(K).mT, "only the keys"),
        (lambda Q, K: _unit(Q, -2) @ _unit(K, -2).mT, "wrong axis"),
        (lambda Q, K: 1 - _unit(Q) @ _unit(K).mT, "cosine *distance*"),
        (lambda Q, K: (Q @ K.mT) / ((Q * Q).sum(-1, keepdim=True) * (K * K).sum(-1).unsqueeze(-2)), "squared"),
    ],
    ids=["unnormalised", "only-Q", "only-K", "wrong-axis", "distance", "squared-norms"],
)
def test_cosine_pitfalls_are_named(fn, phrase):
    rejects(check_cosine_scores, fn, phrase)


def test_cosine_zero_vector_nan_is_named():
    fn = lambda Q, K, eps=1e-8: (Q / Q.norm(dim=-1, keepdim=True)) @ (K / K.norm(dim=-1, keepdim=True)).mT  # noqa: E731
    rejects(check_cosine_scores, fn, "all-zero key", "clamp_min")


def test_cosine_unfinished_list_noncallable():
    with pytest.raises(NotAttempted, match="not attempted"):
        check_cosine_scores(unfinished)
    rejects(check_cosine_scores, lambda Q, K: dot.cosine_scores(Q, K).tolist(), "Python list")
    rejects(check_cosine_scores, 3, "expected a function")
    rejects(check_cosine_scores, lambda Q, K: dot.cosine_scores(Q, K)[..., :1], "shape")

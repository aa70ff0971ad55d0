"""attn_course.dot (notebook 01): the reference dot-product code against PyTorch, the worked example
against its source, the matrix printer other notebooks use, and the notebook's figures.

The checks of notebook 01 are tested in tests/checks/test_dot.py.
"""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attn_course import dot, plots  # noqa: E402


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


def test_reference_cosine_clamps_each_length_at_eps_as_its_docstring_says():
    # a key of length 0.1 with eps = 0.5 counts as length 0.5: as F.normalize and F.cosine_similarity (2.x) do
    q = torch.tensor([[0.6, 0.8]], dtype=torch.float64)
    K = torch.tensor([[0.1, 0.0], [3.0, 4.0]], dtype=torch.float64)
    out = dot.cosine_scores(q, K, eps=0.5)
    torch.testing.assert_close(out, F.normalize(q, dim=-1, eps=0.5) @ F.normalize(K, dim=-1, eps=0.5).T)
    torch.testing.assert_close(out, F.cosine_similarity(q.unsqueeze(-2), K.unsqueeze(-3), dim=-1, eps=0.5))
    assert out[0, 0].item() == pytest.approx(0.6 * 0.1 / 0.5)


def test_references_leave_their_inputs_unchanged():
    g = torch.Generator().manual_seed(3)
    Q, K = torch.randn(2, 3, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    Q0, K0 = Q.clone(), K.clone()
    dot.score_matrix(Q, K), dot.cosine_scores(Q, K), dot.query_scores(Q[0, 0], K[0]), dot.query_scores_loop(Q[0, 0], K[0])
    assert torch.equal(Q, Q0) and torch.equal(K, K0)


def test_worked_example_recomputes_the_sources_printed_scores():
    Q, K, V = dot.worked_example()
    assert Q.shape == K.shape == V.shape == (4, 8)
    S = dot.score_matrix(Q, K)
    printed = torch.tensor(dot.SOURCE_RAW_SCORES, dtype=torch.float64)
    assert (S - printed).abs().max() < 1e-12  # one-decimal inputs: the two-decimal table is exact
    assert dot.format_matrix(S[0], 2).split() == ["0.70", "0.14", "-0.14", "0.51"]
    # S[3, 1] is exactly 0: the machine's BLAS leaves a residue of either sign (±1e-17); it prints as 0.00 on every machine
    assert dot.format_matrix(S[3], 2).split() == ["0.60", "0.00", "0.02", "1.00"]
    assert S.argmax(dim=-1).tolist() == [0, 1, 2, 3]
    assert [round(c, 2) for c in F.cosine_similarity(Q, K, dim=-1).tolist()] == [0.95, 0.96, 0.96, 0.96]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_format_matrix_prints_a_rounding_residue_as_zero_but_keeps_a_small_negative(dtype):
    eps = torch.finfo(dtype).eps
    for residue in (eps, -eps, 1e-17, -1e-17):
        assert dot.format_matrix(torch.tensor([1.0, residue], dtype=dtype), 2).split() == ["1.00", "0.00"]
    assert dot.format_matrix(torch.tensor([1.0, -0.004], dtype=dtype), 2).split() == ["1.00", "-0.00"]
    assert dot.format_matrix(torch.tensor([[-0.0, float("-inf")], [float("nan"), 0.5]], dtype=dtype), 1).split() == [
        "0.0", "-inf", "nan", "0.5"]
    assert dot.format_matrix(torch.tensor([3, -1]), 0).split() == ["3", "-1"]


def test_worked_example_later_steps_match_the_source_too():
    # the source's scaled scores and weights for Q0 (0.25 0.05 -0.05 0.18 / 0.29 0.23 0.21 0.27)
    Q, K, V = dot.worked_example()
    scaled = dot.score_matrix(Q, K)[0] / 8**0.5
    assert dot.format_matrix(scaled, 2).split() == ["0.25", "0.05", "-0.05", "0.18"]
    assert dot.format_matrix(torch.softmax(scaled, -1), 2).split() == ["0.29", "0.23", "0.21", "0.27"]


def test_format_and_print_matrix_for_every_notebook(capsys):
    m = torch.tensor([[1.0, -0.001], [0.5, 2.25]])
    assert dot.format_matrix(m, 2) == "  1.00 -0.00\n  0.50  2.25"
    assert dot.format_matrix(m, 1, labels=["a", "bb"]) == "     a   1.0 -0.0\n    bb   0.5  2.2"  # 2.25 rounds to even
    assert dot.format_matrix(torch.tensor([1.0, 2.0]), 0) == " 1 2"
    dot.print_matrix("weights", m)
    assert capsys.readouterr().out == "weights  shape (2, 2)\n  1.00 -0.00\n  0.50  2.25\n"


def test_toy_sentence_retrieves_the_expected_words():
    tokens, features, keys = dot.toy_sentence()
    assert keys.shape == (len(tokens), len(features))
    who = torch.tensor([1.0, 0, 0, 0], dtype=torch.float64)
    where = torch.tensor([0.0, 1.0, 0, -0.5], dtype=torch.float64)
    assert tokens[int(dot.query_scores(who, keys).argmax())] == "cat"
    assert tokens[int(dot.query_scores(where, keys).argmax())] == "mat"


def test_dot_versus_cosine_example_prefers_different_keys():
    q, K = torch.tensor([1.0, 0.2]), torch.tensor([[0.9, 0.3], [2.5, 2.5]])
    assert int(dot.query_scores(q, K).argmax()) == 1 and int(dot.cosine_scores(q[None], K)[0].argmax()) == 0


def _figures():
    tokens, _, keys = dot.toy_sentence()
    questions = {"who sat? (sat asks for an animal)": torch.tensor([1.0, 0, 0, 0], dtype=torch.float64),
                 "where? (on asks for a place)": torch.tensor([0.0, 1.0, 0, -0.5], dtype=torch.float64)}
    Q, K, _ = dot.worked_example()
    yield "retrieval", dot.plot_retrieval(tokens, keys, questions)
    yield "dot vs cosine", dot.plot_dot_vs_cosine(torch.tensor([1.0, 0.2]), torch.tensor([[0.9, 0.3], [2.5, 2.5]]),
                                                  ["A", "B"])
    yield "worked example heatmap", plots.heatmap(dot.score_matrix(Q, K), row_labels=[f"Q{i}" for i in range(4)],
                                                  col_labels=[f"K{j}" for j in range(4)],
                                                  title="Scores S = Q Kᵀ of the running example (unscaled)")


@pytest.mark.slow
def test_notebook_figures_are_readable_at_1366x768():
    for name, fig in _figures():
        assert plots.readability_problems(fig) == [], name
        plt.close(fig)


def test_dot_versus_cosine_labels_do_not_overlap():
    # 01[24] drew its labels at the arrow tips, on top of each other: now they sit in a legend
    fig = dot.plot_dot_vs_cosine(torch.tensor([1.0, 0.2]), torch.tensor([[0.9, 0.3], [2.5, 2.5]]), ["A", "B"])
    fig.canvas.draw()
    ax = fig.axes[0]
    assert not [t for t in ax.texts if t.get_text().strip()]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["query", "key A: dot 0.96, cosine 0.99", "key B: dot 3.00, cosine 0.83"]
    plt.close(fig)


def test_mismatched_d_gets_a_clear_message():
    with pytest.raises(ValueError, match=r"Q has d = 8 \(shape \(4, 8\)\) but K has d = 7"):
        dot.score_matrix(torch.randn(4, 8), torch.randn(5, 7))
    with pytest.raises(ValueError, match="Q has d = 8"):
        dot.cosine_scores(torch.randn(4, 8), torch.randn(5, 7))
    for fn in (dot.query_scores, dot.query_scores_loop):
        with pytest.raises(ValueError, match="q has d = 8"):
            fn(torch.randn(8), torch.randn(5, 7))
    with pytest.raises(TypeError, match="Q must be a torch.Tensor"):
        dot.score_matrix(torch.randn(4, 8).numpy(), torch.randn(5, 8).numpy())  # NumPy's transpose(-2, -1) is not Kᵀ
    with pytest.raises(TypeError, match="floating-point tensors .* torch.int64"):
        dot.cosine_scores(torch.ones(2, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long))

"""Notebook 08 (attn_course.patterns): the reference pattern metrics against independent computations,
the toy model, the gradient measurement and the figures."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")

from attn_course import patterns as ref  # noqa: E402
from attn_course.plots import readability_problems  # noqa: E402


# ---- reference metrics vs independent computations ----------------------------------------

def test_entropy_matches_torch_categorical_and_handles_zeros():
    torch.manual_seed(0)
    w = torch.softmax(torch.randn(3, 5, 7, dtype=torch.float64), -1)
    torch.testing.assert_close(ref.entropy(w), torch.distributions.Categorical(probs=w).entropy())
    torch.testing.assert_close(ref.normalised_entropy(w), ref.entropy(w) / math.log(7))
    causal = torch.softmax(torch.randn(4, 4).masked_fill(torch.ones(4, 4).triu(1).bool(), -math.inf), -1)
    assert torch.isfinite(ref.normalised_entropy(causal)).all()
    assert ref.normalised_entropy(causal)[0] == 0  # the first row is one-hot
    assert (ref.normalised_entropy(torch.ones(2, 1)) == 0).all()


def test_metric_extremes_on_one_hot_and_uniform_rows():
    eye, uniform = torch.eye(5), torch.full((5, 5), 0.2)
    torch.testing.assert_close(ref.normalised_entropy(uniform), torch.ones(5, dtype=torch.float64))  # float64, as entropy
    torch.testing.assert_close(ref.effective_positions(uniform), torch.full((5,), 5.0, dtype=torch.float64))
    torch.testing.assert_close(ref.effective_positions(eye), torch.ones(5, dtype=torch.float64))
    torch.testing.assert_close(ref.self_attention_weight(eye), torch.ones(5))
    torch.testing.assert_close(ref.attention_distance(eye), torch.zeros(5))
    torch.testing.assert_close(ref.peak_weight(uniform), torch.full((5,), 0.2))
    # uniform over 5 keys: query i's mean distance is the mean of |j − i| over j = 0 … 4
    torch.testing.assert_close(ref.attention_distance(uniform), torch.tensor([2.0, 1.4, 1.2, 1.4, 2.0]))
    # two-sided attention does not cancel: half on i − 1, half on i + 1 is distance 1 (the distance of the mean is 0)
    two_sided = torch.zeros(4, 4)
    two_sided[2, [1, 3]] = 0.5
    assert ref.attention_distance(two_sided)[2] == 1.0


def test_metrics_accept_numpy():
    w = np.full((3, 3), 1 / 3)
    np.testing.assert_allclose(ref.normalised_entropy(w).numpy(), np.ones(3))
    np.testing.assert_allclose(ref.attention_distance(w).numpy(), [1.0, 2 / 3, 1.0])


def test_synthetic_patterns_have_their_signature():
    m = {k: {name: v.mean().item() for name, v in ref.pattern_metrics(ref.synthetic_pattern(k)).items()}
         for k in ref.PATTERN_TYPES}
    for kind in ref.PATTERN_TYPES:
        torch.testing.assert_close(ref.synthetic_pattern(kind).sum(-1), torch.ones(8, dtype=torch.float64))
    assert m["diagonal"]["self"] > 0.9 and m["diagonal"]["distance"] < 0.3
    assert m["previous-token"]["self"] < 0.2 and 0.9 < m["previous-token"]["distance"] < 1.2
    assert m["vertical"]["distance"] > 3
    assert m["uniform"]["distance"] < m["vertical"]["distance"]
    assert m["uniform"]["entropy (norm.)"] == pytest.approx(1.0)
    assert m["block"]["eff. positions"] == pytest.approx(4.878, abs=1e-3)
    with pytest.raises(ValueError):
        ref.synthetic_pattern("spiral")


def test_metrics_table_lists_every_query():
    table = ref.metrics_table(ref.synthetic_pattern("uniform", 4), tokens=list("abcd"))
    assert len(table.splitlines()) == 6 and "eff. positions" in table and "4.00" in table


def test_toy_batch_targets():
    tokens, targets = ref.make_toy_batch(5, 8, 10, generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (5, 8) and targets.shape == (5, 8, 2)
    assert (targets[:, 0, 0] == ref.IGNORE).all()
    assert torch.equal(targets[:, 1:, 0], tokens[:, :-1])
    assert torch.equal(targets[..., 1], tokens[:, :1].expand(5, 8))


@pytest.mark.slow
def test_toy_model_learns_and_is_reproducible():
    torch.set_num_threads(1)
    model_a, losses_a = ref.train_toy_model(steps=60, progress=False)
    model_b, losses_b = ref.train_toy_model(steps=60, progress=False)
    assert losses_a == losses_b
    acc = ref.evaluate(model_a, n=200)
    assert acc == ref.evaluate(model_b, n=200)
    assert acc["previous token"] > 0.9 and acc["first token"] > 0.9
    assert losses_a[-1] < losses_a[0] / 5
    logits, weights = model_a(torch.zeros(1, 8, dtype=torch.long))
    assert logits.shape == (1, 8, 2, 10) and weights[0].shape == (1, 2, 8, 8)


@pytest.mark.slow
def test_figures_are_readable_at_1366_and_the_explorer_builds():
    labels = ref.position_labels([3, 1, 4, 1, 5, 9, 2, 6])
    assert labels[:4] == ["0:3", "1:1", "2:4", "3:1"] and len(set(labels)) == 8
    five = [ref.synthetic_pattern(k) for k in ref.PATTERN_TYPES]
    for fig in (ref.plot_heads(five, [str(i) for i in range(8)], list(ref.PATTERN_TYPES)),
                ref.plot_heads(five[:2], labels, ["head 0", "head 1"]),
                ref.head_explorer([torch.stack(five[:2])], labels),  # no kernel here: a static figure
                ref.head_explorer([torch.stack(five[:2]), torch.stack(five[2:4])], labels),
                ref.plot_loss_curves({"scaled": [[2.0, 0.5, 0.01]] * 3, "no scale": [[2.0, 1.5, 1.0]] * 3},
                                     title="Same model, d_head = 256: with and without the scale")):
        assert isinstance(fig, matplotlib.figure.Figure)
        assert readability_problems(fig) == []


def test_head_explorer_offers_a_layer_control_only_with_several_layers(monkeypatch):
    import attn_course.widgets as widgets

    seen = []
    monkeypatch.setattr(widgets, "explorer", lambda draw, controls, title="": seen.append(list(controls)))
    w = torch.stack([ref.synthetic_pattern(k) for k in ("diagonal", "vertical")])
    ref.head_explorer([w], list("abcdefgh"))
    ref.head_explorer([w, w], list("abcdefgh"))
    assert seen == [["head"], ["layer", "head"]]


def test_normalised_entropy_uses_the_allowed_keys():
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    uniform_causal = causal.double() / causal.sum(-1, keepdim=True)  # row i spread evenly over its i + 1 keys
    torch.testing.assert_close(ref.normalised_entropy(uniform_causal, causal), torch.tensor([0.0, 1.0, 1.0, 1.0],
                                                                                            dtype=torch.float64))
    # without the mask row 1 is measured against all 4 keys: log 2 / log 4 = 0.5
    assert ref.normalised_entropy(uniform_causal)[1].item() == pytest.approx(0.5)
    padding = torch.tensor([True, True, True, False])[None, None, :]  # (1, 1, 4): the last key is padding
    w = torch.tensor([[1 / 3, 1 / 3, 1 / 3, 0.0]], dtype=torch.float64).expand(2, 4)[None]
    torch.testing.assert_close(ref.normalised_entropy(w, padding), torch.ones(1, 2, dtype=torch.float64))
    nothing = torch.zeros(1, 3, dtype=torch.bool)  # a fully masked row: zero weights, entropy 0
    assert ref.normalised_entropy(torch.zeros(1, 3), nothing).item() == 0.0


def test_attention_gradients_at_initialisation():
    torch.set_num_threads(1)
    tokens, targets = ref.make_toy_batch(64, generator=torch.Generator().manual_seed(5))
    stats = {}
    for scale in (None, 1.0):
        torch.manual_seed(0)
        stats[scale] = ref.attention_gradients(ref.AttentionOnlyModel(d_head=128, scale=scale), tokens, targets)
    scaled, unscaled = stats[None], stats[1.0]
    assert unscaled["peak"] > 0.7 > scaled["peak"]
    assert unscaled["scores"] < scaled["scores"]  # through the saturated softmax: less reaches the scores …
    assert unscaled["queries"] > scaled["queries"]  # … yet more reaches the queries
    assert unscaled["ignored keys"] > 0.5 and unscaled["ignored share"] < 0.05
    with pytest.raises(ValueError):
        ref.attention_gradients(ref.AttentionOnlyModel(n_layers=2), tokens, targets)




def test_synthetic_pattern_needs_a_positive_n():
    with pytest.raises(ValueError, match="n must be a positive integer"):
        ref.synthetic_pattern("diagonal", 0)
    with pytest.raises(ValueError, match="block must be a positive integer"):
        ref.synthetic_pattern("block", 8, block=0)

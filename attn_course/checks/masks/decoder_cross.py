"""Checks of the decoder mask (causal AND key padding) and the cross-attention mask, both (B, 1, n_q, n_k)."""

from __future__ import annotations

import torch

from ..core import Learner, check
from .answers import COUNTED, PAD_ID, POLARITY, TRIANGLES, Judge, compare, expect_inputs_unchanged, mask_of

_KEY_PADDING = "(src_ids != pad_id)[:, None, None, :]"


def _heads_hints(B: int, n_q: int, n_k: int) -> list[tuple]:
    """Shapes that get the heads axis wrong: missing, or bigger than 1."""
    return [((B, n_q, n_k), "no heads axis", "a (B, n_q, n_k) mask lines B up with the heads axis of scores "
             "(B, H, n_q, n_k)", "return (B, 1, n_q, n_k): mask[:, None]"),
            *[((B, h, n_q, n_k), f"a heads axis of size {h}, not 1", f"you repeated the mask for {h} heads; a heads "
               "axis of size 1 broadcasts over any number", "mask[:, None], without expand or repeat")
              for h in range(2, 17)]]


def _pair_regions(real_q: torch.Tensor, real_k: torch.Tensor, causal: bool) -> list[tuple[str, torch.Tensor]]:
    """Regions of a (B, 1, n_q, n_k) mask."""
    i, j = torch.arange(real_q.shape[1])[:, None], torch.arange(real_k.shape[1])[None, :]
    pad_keys, pad_queries = ~real_k[:, None, None, :], ~real_q[:, None, :, None]
    return [("<pad> keys", pad_keys), ("rows of <pad> queries", pad_queries),
            ("<pad> keys or rows of <pad> queries", pad_keys | pad_queries),
            *([("later keys (j > i)", j > i), ("the diagonal (j = i)", j == i),
               ("real earlier keys (j < i)", (j < i) & ~pad_keys)] if causal else [("real source keys", ~pad_keys)])]


def _decoder_mistakes(ids: torch.Tensor, pad_id: int) -> list[tuple]:
    B, T = ids.shape
    ones = torch.ones(T, T, dtype=torch.bool)
    causal, real = ones.tril(), ids != pad_id
    keys, queries = real[:, None, None, :], real[:, None, :, None]  # (B, 1, 1, T), (B, 1, T, 1)
    counted = torch.arange(T)[None, :] < real.sum(-1, keepdim=True)  # padding assumed at the end

    def padded(kept: torch.Tensor, q_too: bool = False) -> torch.Tensor:  # causal & kept keys (& kept query rows)
        return causal & kept[:, None, None, :] & (kept[:, None, :, None] if q_too else True)

    negate, key_part = "negate it: ~mask", "causal & (tgt_ids != pad_id)[:, None, None, :]"
    mistakes = []
    for q_too, tag in ((False, ""), (True, "+q")):  # each mistake alone, and with the <pad> query rows blocked too
        rows = queries if q_too else True
        mistakes += [
            ("queries" + tag, "padding blocked on the queries instead of the keys", "you blocked the rows of <pad> "
             "queries, not the <pad> keys, so real tokens still read <pad>",
             "block the columns of <pad> tokens: (tgt_ids != pad_id)[:, None, None, :]", causal & queries),
            ("nopad" + tag, "the padding part is missing", "you used the causal mask alone",
             f"AND it with the key-padding mask: {key_part}", None if q_too else causal),
            ("nocausal" + tag, "the causal part is missing", "you used the padding mask alone, so tokens see later "
             "tokens", "AND it with torch.tril(torch.ones(T, T, dtype=torch.bool))", keys & rows),
            ("or" + tag, "causal OR padding instead of AND", "you combined the two masks with | (OR)",
             "both must hold: combine with & (AND)", (causal | keys) & rows),
            *[(key + tag, summary, cause, fix, part(ones) & keys & rows)
              for key, summary, cause, fix, part in TRIANGLES],
            ("zero" + tag, *PAD_ID, "compare with the argument: tgt_ids != pad_id", padded(ids != 0, q_too)),
            ("count" + tag, *COUNTED, "compare the ids: tgt_ids != pad_id", padded(counted, q_too))]
    return mistakes + [
        ("zeros", "everything is masked", "no query may attend to any key", key_part,
         torch.zeros(B, 1, T, T, dtype=torch.bool)),
        ("transposed", "transposed: rows and columns swapped", "your rows are the keys and your columns the queries",
         "mask[..., i, j] says whether query i may attend to key j", padded(real).transpose(-2, -1)),
        ("polarity", *POLARITY, negate, ~padded(real)),
        ("pad-polarity", "padding part inverted (== pad_id)", "your padding part (tgt_ids == pad_id) allows only <pad> "
         "keys", f"compare with !=: {key_part}", padded(ids == pad_id)),
        ("polarity+q", *POLARITY, negate, ~padded(real, True)),
        ("rows-too", "<pad> query rows blocked as well", "the docstring blocks only <pad> keys (a <pad> query's output "
         "is never used); blocking their rows too leaves them fully masked", f"drop the query part: {key_part}",
         padded(real, True))]


@check("decoder_mask", expects="a function decoder_mask(tgt_ids, pad_id) returning a (B, 1, T, T) bool tensor")
def check_decoder_mask(fn: Learner) -> str:
    cases = [(torch.tensor([[1, 5, 6, 2, 2], [2, 2, 1, 0, 7], [1, 3, 4, 6, 0]]), 2),  # right, left padding; a real 0
             (torch.tensor([[1, 5, 6, 7, 0, 0], [1, 8, 9, 4, 3, 2]]), 0),  # right padding
             (torch.tensor([[0, 0, 1, 5, 6], [0, 1, 7, 8, 9], [1, 4, 3, 2, 5]]), 0),  # left padding (generation)
             (torch.tensor([[0, 0, 0], [1, 5, 6]]), 0),  # a sequence of <pad> only
             (torch.tensor([[4]]), 0)]  # T = 1, B = 1
    judge = Judge(fn, _decoder_mistakes, cases, lambda ids, pad: (ids.shape[0], 1, ids.shape[1], ids.shape[1]))
    for case in cases:
        (ids, pad_id), (B, T) = case, case[0].shape
        tried, keys = f"decoder_mask(tgt_ids {(B, T)}, pad_id={pad_id})", (ids != pad_id)[:, None, None, :]
        batch_for_time = ("your causal part is sized by tgt_ids.shape[0] (the batch size B), not by T = "
                          "tgt_ids.shape[1]", "causal = torch.ones(T, T, dtype=torch.bool).tril()",
                          lambda: torch.ones(B, B, dtype=torch.bool).tril() & keys)
        got = mask_of(fn, case, tried, (B, 1, T, T), constructs=[batch_for_time])
        compare(got, torch.ones(T, T, dtype=torch.bool).tril() & keys, judge, case, tried=tried,
                hints=_heads_hints(B, T, T), index_names=" (batch, head, query, key)",
                regions=_pair_regions(ids != pad_id, ids != pad_id, True))
    expect_inputs_unchanged(fn, cases, names=("tgt_ids",), call=lambda case: f"decoder_mask(tgt_ids, pad_id={case[1]})")
    return "causal AND key padding (right and left padding, an all-<pad> sequence), with a heads axis of size 1"


def _cross_mistakes(tgt: torch.Tensor, src: torch.Tensor, pad_id: int) -> list[tuple]:
    (B, T), S = tgt.shape, src.shape[1]
    src_real, queries = src != pad_id, (tgt != pad_id)[:, None, :, None]
    expected = src_real[:, None, None, :].expand(B, 1, T, S)
    return [("tgt", "target padding blocked instead of source padding", "you blocked the rows of target <pad> "
             "queries, not the source <pad> keys", "block the source <pad> columns: " + _KEY_PADDING, queries),
            ("tgt-too", "target padding rows blocked as well", "in cross-attention only the source padding (the "
             "columns) is blocked", "drop the target part: " + _KEY_PADDING, expected & queries),
            ("causal", "a causal part in cross-attention", "the whole source is known before the decoder starts, so "
             "nothing is causal here", "block only the source padding",
             expected & torch.ones(T, S, dtype=torch.bool).tril()),
            ("polarity", POLARITY[0], POLARITY[1] + "; real source tokens should be True", "negate it: ~mask",
             ~expected),
            ("zero", *PAD_ID, "compare with the argument: src_ids != pad_id", (src != 0)[:, None, None, :]),
            ("count", *COUNTED, "compare the ids: src_ids != pad_id",
             (torch.arange(S)[None, :] < src_real.sum(-1, keepdim=True))[:, None, None, :]),
            ("ones", "nothing is masked", "every target query sees every source key, <pad> included",
             "block the source <pad> keys: " + _KEY_PADDING, torch.ones(B, 1, T, S, dtype=torch.bool))]


@check("cross_attention_mask",
       expects="a function cross_attention_mask(tgt_ids, src_ids, pad_id) returning a (B, 1, T, S) bool tensor")
def check_cross_attention_mask(fn: Learner) -> str:
    cases = [(torch.tensor([[1, 5, 6, 7, 0, 0], [1, 8, 9, 4, 3, 2]]), torch.tensor([[4, 9, 0, 0], [3, 5, 7, 2]]), 0),
             (torch.tensor([[1, 5, 2, 2, 2], [1, 3, 4, 6, 2], [1, 2, 2, 2, 2]]),
              torch.tensor([[7, 8, 9, 2, 2, 2, 2], [5, 6, 2, 2, 2, 2, 2], [4, 4, 4, 4, 4, 4, 4]]), 2),
             (torch.tensor([[1, 2, 3], [1, 0, 0]]), torch.tensor([[0, 0, 4, 5], [6, 7, 8, 9]]), 0),  # left-padded src
             (torch.tensor([[1, 4], [1, 5]]), torch.tensor([[0, 0, 0], [5, 6, 7]]), 0),  # a source of <pad> only
             (torch.tensor([[1]]), torch.tensor([[3]]), 0)]  # T = S = 1, B = 1
    judge = Judge(fn, _cross_mistakes, cases, lambda tgt, src, pad: (len(tgt), 1, tgt.shape[1], src.shape[1]))
    for case in cases:
        (tgt, src, pad_id), (B, T), S = case, case[0].shape, case[1].shape[1]
        tried = f"cross_attention_mask(tgt_ids {(B, T)}, src_ids {(B, S)}, pad_id={pad_id})"
        swapped = ("rows and columns swapped", "rows are the target queries (T), columns the source keys (S)",
                   f"return (B, 1, T, S) = {(B, 1, T, S)}")
        hints = [((B, 1, S, T), *swapped), ((B, S, T), *swapped), *_heads_hints(B, T, S),
                 ((B, 1, 1, S), "not expanded to the T target rows", "you returned the (B, 1, 1, S) key-padding mask; "
                  "the docstring asks for one row per target query", "mask.expand(-1, 1, T, -1), T = tgt_ids.shape[1]"),
                 ((B, 1, S, S), "one row per source token", "the rows of cross-attention are the target queries, not "
                  "the source tokens", "take T from tgt_ids: T = tgt_ids.shape[1]"),
                 ((B, 1, B, S), "rows counted from tgt_ids.shape[0]", "tgt_ids.shape[0] is the batch size; the target "
                  "length is tgt_ids.shape[1]", "T = tgt_ids.shape[1] (or shape[-1])"),
                 *[((B, 1, rows, T), "columns are target tokens", "the keys of cross-attention are the source tokens",
                    "build the columns from src_ids: (src_ids != pad_id)") for rows in (T, 1)]]
        compare(mask_of(fn, case, tried, (B, 1, T, S)), (src != pad_id)[:, None, None, :].expand(B, 1, T, S), judge,
                case, tried=tried, hints=hints, regions=_pair_regions(tgt != pad_id, src != pad_id, False),
                index_names=" (batch, head, query, key)")
    expect_inputs_unchanged(fn, cases, names=("tgt_ids", "src_ids"),
                            call=lambda case: f"cross_attention_mask(tgt_ids, src_ids, pad_id={case[2]})")
    return ("rows = target, columns = source, only source padding blocked (right and left padding, an all-<pad> "
            "source), with a heads axis of size 1")

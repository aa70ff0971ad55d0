"""Checks for notebook 06: causal, padding, decoder, cross-attention and additive masks, and the masked softmax.

A bool mask is True where a query may attend to a key. A wrong mask is named by one :class:`~..kit.Suspects` per check
run over the check's table of known mistakes, else by the region that holds its wrong pairs ("later keys", "<pad>
keys"…). Oracles: ``torch.tril`` and comparisons of the ids; ``masked_fill`` (additive);
``F.scaled_dot_product_attention`` (masked softmax).
"""

from .additive import check_additive_mask
from .causal_padding import check_causal_mask, check_padding_mask_from_ids, check_padding_mask_from_lengths
from .decoder_cross import check_cross_attention_mask, check_decoder_mask
from .masked_softmax import check_masked_softmax

__all__ = ["check_causal_mask", "check_padding_mask_from_lengths", "check_padding_mask_from_ids", "check_decoder_mask",
           "check_cross_attention_mask", "check_additive_mask", "check_masked_softmax"]

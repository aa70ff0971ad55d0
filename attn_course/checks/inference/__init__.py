"""Checks for notebook 11 (attention at inference): KVCache, the two masks, merge_partials and the tiled
sliding_window_attention, against float64 oracles (:mod:`.oracle`). When no known mistake reproduces a wrong answer,
the check measures what it can: which keys a query saw, which factor each side of a merge got, in which setting
(one tile, no window…) the answer goes wrong."""

from __future__ import annotations

from .kv_cache import check_KVCache
from .masks import check_bottom_right_causal_mask, check_sliding_window_mask
from .merge import check_merge_partials
from .sliding_window import check_sliding_window_attention  # registers the probe inference.work

__all__ = ["check_KVCache", "check_bottom_right_causal_mask", "check_merge_partials", "check_sliding_window_mask",
           "check_sliding_window_attention"]

"""GPU peak throughput from the vendors' datasheets, for "% of peak" in notebook 09's benchmark.

:data:`PEAK_TFLOPS` holds the dense (no sparsity) float16/bfloat16 tensor-core peaks, in TFLOP/s, at
boost clock. Sustained clocks are lower, so no kernel reaches 100 %. :func:`peak_tflops` looks a GPU up
by the name ``torch.cuda.get_device_name`` gives; an unknown GPU (or dtype) gets no peak, and then no
percentage is reported.
"""

from __future__ import annotations

import re

import torch

__all__ = ["PEAK_TFLOPS", "PEAK_SOURCE", "peak_tflops"]

#: (regular expression on the device name, model, {dtype name: TFLOP/s}); the first match wins, so
#: the more specific variants (PCIe, NVL) come before the plain model name.
PEAK_TFLOPS: list[tuple[str, str, dict[str, float]]] = [
    (r"H100.*PCIe", "NVIDIA H100 PCIe", {"float16": 756.0, "bfloat16": 756.0}),
    (r"H100.*NVL", "NVIDIA H100 NVL", {"float16": 835.0, "bfloat16": 835.0}),
    (r"H100", "NVIDIA H100 SXM5", {"float16": 989.4, "bfloat16": 989.4}),
    (r"H200.*NVL", "NVIDIA H200 NVL", {"float16": 835.0, "bfloat16": 835.0}),
    (r"H200", "NVIDIA H200 SXM", {"float16": 989.4, "bfloat16": 989.4}),
    (r"A100", "NVIDIA A100", {"float16": 312.0, "bfloat16": 312.0}),
    (r"L40S", "NVIDIA L40S", {"float16": 362.0, "bfloat16": 362.0}),
    (r"\bL4\b", "NVIDIA L4", {"float16": 121.0, "bfloat16": 121.0}),
    (r"\bA10\b", "NVIDIA A10", {"float16": 125.0, "bfloat16": 125.0}),
    (r"\bT4\b", "NVIDIA T4", {"float16": 65.0}),
    (r"V100", "NVIDIA V100 SXM2", {"float16": 125.0}),
]
PEAK_SOURCE = "vendor datasheet, dense (no sparsity) tensor-core peak at boost clock"


def peak_tflops(device_name: str, dtype: torch.dtype | str) -> tuple[float | None, str | None]:
    """(peak TFLOP/s, matched model) for this GPU name and dtype; (None, None) for an unknown GPU, and
    (None, model) for a known GPU without a tensor-core peak in that dtype."""
    key = str(dtype).replace("torch.", "")
    for pattern, model, peaks in PEAK_TFLOPS:
        if re.search(pattern, device_name):
            return peaks.get(key), model
    return None, None

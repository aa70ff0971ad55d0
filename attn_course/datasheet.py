"""GPU peak throughput and memory bandwidth from the vendors' datasheets, for "% of peak" in notebook
09's benchmark and the recompute-or-store argument of notebook 10: one table, each row with its source.

:data:`GPUS` holds, per GPU model, the dense (no sparsity) float16/bfloat16 tensor-core peak in
TFLOP/s at boost clock and the memory bandwidth in TB/s, with the datasheet they come from.
Datasheets print the tensor-core figures *with* sparsity; the dense peak is half of that. Sustained
clocks are lower than boost, so no kernel reaches 100 %. :func:`peak_tflops` and :func:`bandwidth`
look a GPU up by the name ``torch.cuda.get_device_name`` gives; an unknown GPU (or dtype) gets no
figure, and then no percentage is reported. :func:`table` prints the whole table.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import torch

from .tables import format_table

__all__ = ["Gpu", "GPUS", "PEAK_TFLOPS", "PEAK_SOURCE", "peak_tflops", "bandwidth", "lookup", "table"]


class Gpu(NamedTuple):
    """One datasheet row: ``pattern`` (a regular expression on the CUDA device name), ``model``,
    ``tflops`` ({dtype name: dense tensor-core TFLOP/s}), ``bandwidth`` (memory, TB/s), ``source``."""

    pattern: str
    model: str
    tflops: dict[str, float]
    bandwidth: float
    source: str


_HOPPER = ("dense FP16/BF16 tensor core: the figure with sparsity ÷ 2, rounded as in NVIDIA's H100 whitepaper "
           "(SXM5: 1,979 → 989.4)")
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023): " + _HOPPER
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024): " + _HOPPER
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021): FP16/BF16 tensor core, with sparsity ÷ 2"

#: The first matching row wins, so the more specific variants (PCIe, NVL, 80GB) come before the plain model.
GPUS: list[Gpu] = [
    Gpu(r"H100.*PCIe", "NVIDIA H100 PCIe", {"float16": 756.0, "bfloat16": 756.0}, 2.0, _H100),
    Gpu(r"H100.*NVL", "NVIDIA H100 NVL", {"float16": 835.0, "bfloat16": 835.0}, 3.9, _H100),
    Gpu(r"H100", "NVIDIA H100 SXM5", {"float16": 989.4, "bfloat16": 989.4}, 3.35, _H100),
    Gpu(r"H200.*NVL", "NVIDIA H200 NVL", {"float16": 835.0, "bfloat16": 835.0}, 4.8, _H200),
    Gpu(r"H200", "NVIDIA H200 SXM", {"float16": 989.4, "bfloat16": 989.4}, 4.8, _H200),
    Gpu(r"A100.*PCIe.*80GB|A100 80GB PCIe", "NVIDIA A100 80GB PCIe", {"float16": 312.0, "bfloat16": 312.0}, 1.935,
        _A100),
    Gpu(r"A100.*80GB", "NVIDIA A100 80GB SXM", {"float16": 312.0, "bfloat16": 312.0}, 2.039, _A100),
    Gpu(r"A100", "NVIDIA A100 40GB", {"float16": 312.0, "bfloat16": 312.0}, 1.555, _A100),
    Gpu(r"L40S", "NVIDIA L40S", {"float16": 362.0, "bfloat16": 362.0}, 0.864,
        "NVIDIA L40S GPU datasheet (2023): FP16/BF16 tensor core, with sparsity ÷ 2"),
    Gpu(r"\bL4\b", "NVIDIA L4", {"float16": 121.0, "bfloat16": 121.0}, 0.3,
        "NVIDIA L4 Tensor Core GPU datasheet (2023): FP16/BF16 tensor core, with sparsity ÷ 2"),
    Gpu(r"\bA10\b", "NVIDIA A10", {"float16": 125.0, "bfloat16": 125.0}, 0.6,
        "NVIDIA A10 Tensor Core GPU datasheet (2021): FP16/BF16 tensor core, with sparsity ÷ 2"),
    Gpu(r"\bT4\b", "NVIDIA T4", {"float16": 65.0}, 0.32,
        "NVIDIA T4 Tensor Core GPU datasheet (2019): mixed-precision FP16/FP32 (no bfloat16 tensor cores)"),
    Gpu(r"V100", "NVIDIA V100 SXM2", {"float16": 125.0}, 0.9,
        "NVIDIA V100 Tensor Core GPU datasheet (2020): tensor performance, SXM2 (no bfloat16 tensor cores)"),
]
#: The same peaks as (pattern, model, {dtype: TFLOP/s}), the form earlier versions exposed.
PEAK_TFLOPS: list[tuple[str, str, dict[str, float]]] = [(g.pattern, g.model, g.tflops) for g in GPUS]
PEAK_SOURCE = "vendor datasheet, dense (no sparsity) tensor-core peak at boost clock"


def lookup(device_name: str) -> Gpu | None:
    """The datasheet row for this CUDA device name (None for a GPU not in the table)."""
    return next((g for g in GPUS if re.search(g.pattern, device_name)), None)


def peak_tflops(device_name: str, dtype: torch.dtype | str) -> tuple[float | None, str | None]:
    """(peak TFLOP/s, matched model) for this GPU name and dtype; (None, None) for an unknown GPU, and
    (None, model) for a known GPU without a tensor-core peak in that dtype."""
    gpu = lookup(device_name)
    if gpu is None:
        return None, None
    return gpu.tflops.get(str(dtype).replace("torch.", "")), gpu.model


def bandwidth(device_name: str) -> tuple[float | None, str | None]:
    """(memory bandwidth in TB/s, matched model) for this GPU name; (None, None) when unknown."""
    gpu = lookup(device_name)
    return (gpu.bandwidth, gpu.model) if gpu else (None, None)


def table() -> str:
    """Every row of :data:`GPUS` as a text table: model, float16 and bfloat16 peaks, bandwidth, source."""
    rows = [[g.model, g.tflops.get("float16"), g.tflops.get("bfloat16"), g.bandwidth, g.source] for g in GPUS]
    return format_table(["GPU", "fp16 TFLOP/s", "bf16 TFLOP/s", "TB/s", "source"], rows,
                        formats={"fp16 TFLOP/s": ".1f", "bf16 TFLOP/s": ".1f", "TB/s": ".3g"})

"""attn_course.datasheet: GPU peaks from the vendors' datasheets, looked up by the name CUDA reports."""

import pytest
import torch

from attn_course import datasheet


@pytest.mark.parametrize("name, dtype, peak, model", [
    ("NVIDIA H100 80GB HBM3", torch.float16, 989.4, "NVIDIA H100 SXM5"),
    ("NVIDIA H100 PCIe", torch.bfloat16, 756.0, "NVIDIA H100 PCIe"),
    ("NVIDIA H100 NVL", "float16", 835.0, "NVIDIA H100 NVL"),
    ("NVIDIA H200", torch.bfloat16, 989.4, "NVIDIA H200 SXM"),
    ("NVIDIA A100-SXM4-80GB", torch.float16, 312.0, "NVIDIA A100"),
    ("NVIDIA A10", torch.float16, 125.0, "NVIDIA A10"),
    ("NVIDIA L4", torch.float16, 121.0, "NVIDIA L4"),
    ("Tesla T4", torch.bfloat16, None, "NVIDIA T4"),  # no bfloat16 tensor cores: no peak, no percentage
    ("Some Future GPU", torch.float16, None, None),
])
def test_peaks_by_device_name(name, dtype, peak, model):
    assert datasheet.peak_tflops(name, dtype) == (peak, model)


def test_specific_variants_come_before_the_plain_model():
    patterns = [p for p, _, _ in datasheet.PEAK_TFLOPS]
    assert patterns.index(r"H100.*PCIe") < patterns.index(r"H100")
    assert patterns.index(r"H200.*NVL") < patterns.index(r"H200")

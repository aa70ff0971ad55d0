"""attn_course.datasheet: GPU peaks and bandwidths from the vendors' datasheets, one table with sources,
looked up by the name CUDA reports."""

import pytest
import torch

from attn_course import datasheet


@pytest.mark.parametrize("name, dtype, peak, model", [
    ("NVIDIA H100 80GB HBM3", torch.float16, 989.4, "NVIDIA H100 SXM5"),
    ("NVIDIA H100 PCIe", torch.bfloat16, 756.0, "NVIDIA H100 PCIe"),
    ("NVIDIA H100 NVL", "float16", 835.0, "NVIDIA H100 NVL"),
    ("NVIDIA H200", torch.bfloat16, 989.4, "NVIDIA H200 SXM"),
    ("NVIDIA A100-SXM4-80GB", torch.float16, 312.0, "NVIDIA A100 80GB SXM"),
    ("NVIDIA A100-SXM4-40GB", torch.bfloat16, 312.0, "NVIDIA A100 40GB"),
    ("NVIDIA A10", torch.float16, 125.0, "NVIDIA A10"),
    ("NVIDIA L4", torch.float16, 121.0, "NVIDIA L4"),
    ("Tesla T4", torch.bfloat16, None, "NVIDIA T4"),  # no bfloat16 tensor cores: no peak, no percentage
    ("Some Future GPU", torch.float16, None, None),
])
def test_peaks_by_device_name(name, dtype, peak, model):
    assert datasheet.peak_tflops(name, dtype) == (peak, model)


def test_specific_variants_come_before_the_plain_model():
    patterns = [g.pattern for g in datasheet.GPUS]
    assert patterns.index(r"H100.*PCIe") < patterns.index(r"H100")
    assert patterns.index(r"H200.*NVL") < patterns.index(r"H200")
    assert patterns.index(r"A100.*80GB") < patterns.index(r"A100")
    assert [p for p, _, _ in datasheet.PEAK_TFLOPS] == patterns  # the older view of the same table


@pytest.mark.parametrize("name, tb_s", [("NVIDIA H100 80GB HBM3", 3.35), ("NVIDIA H200", 4.8),
                                        ("NVIDIA A100-SXM4-80GB", 2.039), ("Some Future GPU", None)])
def test_bandwidth_by_device_name(name, tb_s):
    assert datasheet.bandwidth(name)[0] == tb_s


def test_every_row_has_a_source_and_the_table_shows_them_all():
    for gpu in datasheet.GPUS:
        assert "datasheet" in gpu.source and gpu.bandwidth > 0 and gpu.tflops.get("float16", 0) > 0
    text = datasheet.table()
    assert text.splitlines()[0].split()[:2] == ["GPU", "fp16"]
    for gpu in datasheet.GPUS:
        assert gpu.model in text
    assert text.count("datasheet") == len(datasheet.GPUS)

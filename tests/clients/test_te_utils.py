"""TransformerEngine's small public helpers: transformer_engine.pytorch.utils' initialisers,
attention mask function and compute capability, and te.DType."""
import math

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch.constants import TE_DType
from transformer_engine.pytorch.utils import attention_mask_func, init_method_normal, scaled_init_method_normal


@pytest.mark.parametrize("make, std", [(lambda: init_method_normal(0.02), 0.02),
                                       (lambda: scaled_init_method_normal(0.02, 8), 0.02 / math.sqrt(16))])
def test_initialisers_draw_in_place_with_their_standard_deviation(make, std):
    weight = torch.empty(2000, 500)
    assert make()(weight) is weight
    assert abs(weight.mean().item()) < 1e-4 and abs(weight.std().item() - std) / std < 0.01


def test_attention_mask_func_masks_true_positions_in_place():
    scores = torch.randn(2, 3, 4, 4)
    mask = torch.ones(4, 4, dtype=torch.bool).triu(1)  # True above the diagonal: masked out
    kept = scores.clone()
    assert attention_mask_func(scores, mask) is scores
    assert torch.equal(scores[..., mask], torch.full_like(scores[..., mask], -10000.0))
    assert torch.equal(scores[..., ~mask], kept[..., ~mask])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_no_gpu_has_no_compute_capability():
    assert te.get_device_compute_capability() == (0, 0)


def test_dtype_names_the_torch_dtypes_both_ways():
    for te_dtype in te.DType:
        assert TE_DType[te_dtype.to_torch()] is te_dtype
    assert te.DType.kFloat8E4M3.to_torch() == torch.float8_e4m3fn and TE_DType[torch.bfloat16] == te.DType.kBFloat16

"""te.optimizers' multi-tensor helpers (the apex amp_C interface Megatron-Core's gradient
clipping and optimizers call) against plain per-tensor PyTorch."""
import pytest
import torch

from transformer_engine.pytorch.optimizers import (MultiTensorApply, multi_tensor_applier, multi_tensor_l2norm,
                                                   multi_tensor_scale, multi_tensor_scale_tensor)

SHAPES = [(5,), (3, 7), (0,), (2, 3, 4)]


def _flag():
    return torch.zeros(1, dtype=torch.int32)


def _sources(dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(shape, generator=generator).to(dtype) for shape in SHAPES]
    tensors.append(torch.randn(6, 4, generator=generator).to(dtype).t())  # non-contiguous
    return tensors


@pytest.mark.parametrize("dst_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("src_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tensor_scale", [False, True], ids=["float", "tensor"])
def test_scale_matches_per_tensor_pytorch(src_dtype, dst_dtype, tensor_scale):
    sources = _sources(src_dtype)
    destinations = [torch.full(t.shape, 7.0, dtype=dst_dtype) for t in sources]
    flag = _flag()
    op, scale = (multi_tensor_scale_tensor, torch.tensor(0.375)) if tensor_scale else (multi_tensor_scale, 0.375)
    multi_tensor_applier(op, flag, [sources, destinations], scale)
    for src, dst in zip(sources, destinations):
        assert torch.equal(dst, (src.float() * 0.375).to(dst_dtype))  # one rounding, from fp32
    assert flag.item() == 0


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_scale_flags_non_finite_sources_and_never_clears(bad):
    sources = _sources()
    sources[1][2, 3] = bad
    destinations = [torch.empty_like(t) for t in sources]
    flag = _flag()
    multi_tensor_applier(multi_tensor_scale, flag, [sources, destinations], 2.0)
    assert flag.item() == 1
    multi_tensor_applier(multi_tensor_scale, flag, [_sources(), destinations], 2.0)
    assert flag.item() == 1  # a later clean call leaves it set, as amp_C does


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_l2norm_total_and_per_tensor(dtype):
    tensors = _sources(dtype)
    flag = _flag()
    total, per_tensor = multi_tensor_applier(multi_tensor_l2norm, flag, [tensors], True)
    expected = torch.stack([torch.linalg.vector_norm(t.float()) for t in tensors])
    torch.testing.assert_close(per_tensor, expected)
    torch.testing.assert_close(total, torch.linalg.vector_norm(expected).reshape(1))
    assert total.dtype == per_tensor.dtype == torch.float32 and flag.item() == 0
    total_only, none = multi_tensor_applier(multi_tensor_l2norm, flag, [tensors], False)
    assert torch.equal(total_only, total) and none.numel() == 0


def test_l2norm_flags_overflow_and_handles_no_tensors():
    flag = _flag()
    total, _ = multi_tensor_applier(multi_tensor_l2norm, flag, [[torch.tensor([float("nan"), 1.0])]], False)
    assert torch.isnan(total).all() and flag.item() == 1
    total, per_tensor = multi_tensor_applier(multi_tensor_l2norm, _flag(), [[]], True)
    assert torch.equal(total, torch.zeros(1)) and per_tensor.numel() == 0


def test_bad_input_names_the_problem():
    flag = _flag()
    with pytest.raises(ValueError, match="tensor_lists must hold 2 lists, got 1"):
        multi_tensor_applier(multi_tensor_scale, flag, [[torch.ones(2)]], 1.0)
    with pytest.raises(ValueError, match=r"differ in length: \[2, 1\]"):
        multi_tensor_applier(multi_tensor_scale, flag, [[torch.ones(2), torch.ones(3)], [torch.ones(2)]], 1.0)
    with pytest.raises(ValueError, match=r"tensor 0 has different shapes"):
        multi_tensor_applier(multi_tensor_scale, flag, [[torch.ones(2)], [torch.ones(3)]], 1.0)
    with pytest.raises(ValueError, match="noop_flag must be a one-element tensor"):
        multi_tensor_applier(multi_tensor_l2norm, torch.zeros(2, dtype=torch.int32), [[torch.ones(2)]], False)
    with pytest.raises(ValueError, match="scale must be a one-element tensor"):
        multi_tensor_applier(multi_tensor_scale_tensor, flag, [[torch.ones(2)], [torch.ones(2)]], 0.5)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        MultiTensorApply(0)

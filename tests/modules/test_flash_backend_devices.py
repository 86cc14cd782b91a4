"""Where DotProductAttention's flash backend runs: the CPU kernel on the CPU; on CUDA and MUSA the
op's Triton implementation (triton/attention.py) for what it takes, PyTorch's SDPA for the rest
(a bias tensor, a dense mask, dropout, head dims past 256, no triton installed); nowhere else.
The Triton kernels' numerics are tested in tests/ops/test_triton_attention*.py."""
import pytest
import torch

from transformer_engine.pytorch.attention import masks
from transformer_engine.pytorch.attention.backends import AttentionProblem, describe, select_backend
from transformer_engine.pytorch.attention.backends import flash
from transformer_engine.pytorch.attention.backends.base import AttentionConfig
from transformer_engine.pytorch.attention.backends.flash import FlashBackend

PLAIN = dict(dtype=torch.bfloat16, num_heads=8, num_gqa_groups=2, head_dim_qk=128, head_dim_v=128, causal="top_left",
             has_mask=False, has_bias=False, dropout=0.0)


def config(device_type, **changes):
    return AttentionConfig(device_type=device_type, **{**PLAIN, **changes})


@pytest.fixture
def triton_installed(monkeypatch):
    monkeypatch.setattr(flash, "triton_status", lambda: (True, "triton (stand-in)"))


@pytest.mark.parametrize("device_type", ["cuda", "musa"])
def test_accelerators_take_the_triton_kernel(triton_installed, device_type):
    for changes in ({}, dict(causal="bottom_right", has_mask=True), dict(has_alibi=True, has_sink=True),
                    dict(dtype=torch.float32, head_dim_qk=256, head_dim_v=192)):
        assert FlashBackend().supports(config(device_type, **changes)) is None, changes
    assert select_backend(config(device_type)).name == "flash"


@pytest.mark.parametrize("changes,words", [
    (dict(has_bias=True), "no bias tensor"),
    (dict(has_mask=True, dense_mask=True), "no dense mask"),
    (dict(dropout=0.1), "no dropout"),
    (dict(head_dim_qk=512, head_dim_v=512), "head dims up to 256"),
    (dict(dtype=torch.float64), "float32, bfloat16 or float16"),
], ids=["bias", "dense_mask", "dropout", "head_dim", "float64"])
def test_what_the_triton_kernel_leaves_to_sdpa(triton_installed, changes, words):
    reason = FlashBackend().supports(config("cuda", **changes))
    assert reason is not None and words in reason
    assert select_backend(config("cuda", **changes)).name == "sdpa"


def test_without_triton_the_accelerators_take_sdpa(monkeypatch):
    monkeypatch.setattr(flash, "triton_status", lambda: (False, "triton is not installed"))
    assert "Triton, which is not installed" in FlashBackend().supports(config("cuda"))
    assert select_backend(config("cuda")).name == "sdpa"


def test_the_cpu_kernel_takes_what_triton_leaves():
    for changes in (dict(has_bias=True), dict(dense_mask=True, has_mask=True), dict(dropout=0.1),
                    dict(head_dim_qk=576, head_dim_v=512)):
        assert FlashBackend().supports(config("cpu", **changes)) is None, changes


def test_other_devices_are_refused():
    assert "runs on the CPU, CUDA and MUSA (this call is on xpu)" in FlashBackend().supports(config("xpu"))


def test_the_head_dim_bound_is_the_kernels():
    triton_attention = pytest.importorskip("transformer_engine.pytorch.triton.attention")
    assert flash.TRITON_MAX_HEAD_DIM == triton_attention.MAX_HEAD_DIM


def _described(mask_type, pad_kv=None, arbitrary=None, trailing_padding=True):
    q, k = torch.zeros(2, 4, 6, 16), torch.zeros(2, 4, 6, 16)
    spec = masks.build_mask(mask_type, (-1, -1), 6, 6, q.device, pad_kv=pad_kv, arbitrary=arbitrary,
                            trailing_padding=trailing_padding)
    return describe(q, k, k, AttentionProblem(spec=spec, bias=None, scale=0.25, dropout=0.0))


def test_which_masks_are_dense():
    trailing = torch.tensor([[False] * 4 + [True] * 2, [False] * 6])
    holes = torch.tensor([[False, True, False, False, True, False], [False] * 6])
    assert not _described("padding", pad_kv=trailing).dense_mask
    assert _described("padding", pad_kv=holes, trailing_padding=False).dense_mask
    assert _described("arbitrary", arbitrary=torch.rand(2, 1, 6, 6) > 0.5).dense_mask
    assert not _described("causal").dense_mask

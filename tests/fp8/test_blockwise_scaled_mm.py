"""torch._scaled_mm's block-scaled GEMM for Float8BlockScaling's forward layout
(custom_ops/_blockwise_scaled_mm.py), on the CPU with _scaled_mm stood in for: the first call of a
layout compares it with the fp8_block_gemm op and keeps it only where they agree; a stand-in
that misreads the scales or refuses the call leaves that layout with the op for good; layouts
it does not take never reach it; under torch.compile only judged layouts take it."""
import pytest
import torch

from numerics import assert_close
from transformer_engine.pytorch.fp8.block_tensor import Float8BlockTensor
from transformer_engine.pytorch.custom_ops import _blockwise_scaled_mm as blockwise
from transformer_engine.pytorch.custom_ops.fp8_block_gemm import fp8_block_gemm

E4M3 = torch.float8_e4m3fn


def expand(scale_inv, rows_per_scale, rows):
    """[row blocks, k blocks] -> a factor per row and k element ([rows, k])."""
    return scale_inv.repeat_interleave(rows_per_scale, 0)[:rows].repeat_interleave(128, 1)


def cublas_like(mat_a, mat_b, scale_a, scale_b, out_dtype):
    """_scaled_mm's block-scaled product as the module assumes cuBLAS reads it: scale_a
    [m, k / 128], scale_b [k / 128, n / 128] (or [k / 128, n])."""
    m, n = mat_a.shape[0], mat_b.shape[1]
    b_rows_per_scale = 128 if scale_b.shape[1] != n else 1
    a = mat_a.float() * expand(scale_a, 1, m)
    b = mat_b.t().float() * expand(scale_b.t(), b_rows_per_scale, n)
    return (a @ b.t()).to(out_dtype)


@pytest.fixture
def operands():
    x = torch.randn(64, 256) * torch.logspace(-1, 1, 256)
    w = torch.randn(128, 256) * 0.05
    a = Float8BlockTensor.quantize(x, (1, 128), E4M3, "pow2")
    b = Float8BlockTensor.quantize(w, (128, 128), E4M3, "pow2")
    return a, b, torch.randn(128)


@pytest.fixture
def on_hopper(monkeypatch):
    """As on an sm_90 GPU, with no layout judged yet; returns the log of _scaled_mm calls."""
    monkeypatch.setattr(blockwise, "takes_blockwise", lambda device: True)
    monkeypatch.setattr(blockwise, "_verdicts", {})
    calls = []
    return calls


def stand_in(monkeypatch, calls, implementation):
    def scaled_mm(mat_a, mat_b, scale_a, scale_b, out_dtype):
        calls.append(tuple(scale_b.shape))
        return implementation(mat_a, mat_b, scale_a, scale_b, out_dtype)
    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)


def fallback_counting(a, b, bias, counter):
    def run():
        counter.append(1)
        return fp8_block_gemm(a.data, a.scale_inv, a.block, False, b.data, b.scale_inv, b.block, False, bias,
                              torch.bfloat16)
    return run


def test_an_agreeing_layout_is_kept_after_one_comparison(monkeypatch, on_hopper, operands):
    a, b, bias = operands
    stand_in(monkeypatch, on_hopper, cublas_like)
    fallbacks = []
    want = fallback_counting(a, b, bias, [])()
    for _ in range(3):
        got = blockwise.block_gemm(a, b, torch.bfloat16, bias, fallback_counting(a, b, bias, fallbacks))
        assert_close(got.float(), want.float(), dtype=torch.bfloat16, name="blockwise _scaled_mm")
    assert len(on_hopper) == 3 and len(fallbacks) == 1  # compared once, then _scaled_mm alone
    assert list(blockwise._verdicts.values()) == [True]


@pytest.mark.parametrize("misreading", ["scales_swapped", "refuses"])
def test_a_layout_it_gets_wrong_or_refuses_stays_with_the_op(monkeypatch, on_hopper, operands, misreading):
    a, b, bias = operands

    def wrong(mat_a, mat_b, scale_a, scale_b, out_dtype):
        if misreading == "refuses":
            raise RuntimeError("CUDA error: scale_b must be outer-dim-major")
        return cublas_like(mat_a, mat_b, scale_a * 2.0, scale_b, out_dtype)  # a misread layout

    stand_in(monkeypatch, on_hopper, wrong)
    want = fallback_counting(a, b, bias, [])()
    for _ in range(2):
        assert torch.equal(blockwise.block_gemm(a, b, torch.bfloat16, bias, fallback_counting(a, b, bias, [])), want)
    assert len(on_hopper) == 1  # judged on the first call, never asked again
    assert list(blockwise._verdicts.values()) == [False]


def test_layouts_it_does_not_take_never_reach_it(monkeypatch, on_hopper, operands):
    a, b, bias = operands
    stand_in(monkeypatch, on_hopper, lambda *args: pytest.fail("_scaled_mm called"))
    mx = Float8BlockTensor.quantize(torch.randn(64, 256), (1, 32), E4M3, "e8m0")
    transposed = Float8BlockTensor(a.data, a.scale_inv, a.block, transposed=True)
    for left, right in ((transposed, b),
                        (mx, mx), (a, Float8BlockTensor.quantize(torch.randn(120, 256), (1, 128), E4M3, "fp32"))):
        counter = []
        blockwise.block_gemm(left, right, torch.float32, None, lambda: counter.append(1) or torch.zeros(1))
        assert counter == [1]


def test_under_compile_only_judged_layouts_take_it(monkeypatch, on_hopper, operands):
    a, b, bias = operands
    stand_in(monkeypatch, on_hopper, cublas_like)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    counter = []
    blockwise.block_gemm(a, b, torch.bfloat16, bias, fallback_counting(a, b, bias, counter))
    assert on_hopper == [] and counter == [1]


def test_only_hopper_and_later_cuda_devices_take_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    assert not blockwise.takes_blockwise(torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert blockwise.takes_blockwise(torch.device("cuda"))
    assert not blockwise.takes_blockwise(torch.device("cpu"))

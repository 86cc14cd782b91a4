"""FP8 GEMM paths: the CPU path dequantises and never calls torch._scaled_mm; the
accelerator path's torch._scaled_mm call (operand layout, scales, bias) is checked against
the dequantised product on the CPU, where _scaled_mm exists as a slow reference."""
import pytest
import torch

from transformer_engine.pytorch.fp8.tensor import Float8Tensor
from transformer_engine.pytorch.ops import fp8_gemm as gemm
from numerics import assert_close, fp8_gemm_emulation, sqnr_db


def quantized(shape, fp8_dtype, amax_target):
    x = torch.randn(shape)
    scale = torch.tensor([amax_target]) / x.abs().amax()
    return Float8Tensor.quantize(x, scale, fp8_dtype)[0], x


@pytest.mark.parametrize("b_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_scaled_mm_call_equals_the_dequantised_product(b_dtype, out_dtype):
    a, _ = quantized((32, 64), torch.float8_e4m3fn, 400.0)
    b, _ = quantized((48, 64), b_dtype, 50000.0 if b_dtype == torch.float8_e5m2 else 400.0)
    bias = torch.randn(48)
    # the bias is added to the rounded product, as the call does
    want = (a.dequantize() @ b.dequantize().t()).to(out_dtype) + bias.to(out_dtype)
    got = gemm.scaled_mm(a, b, out_dtype, bias)
    assert got.dtype == out_dtype and got.shape == (32, 48)
    assert_close(got, want, dtype=out_dtype, name="scaled_mm")


def test_cpu_path_dequantises_and_never_calls_scaled_mm(monkeypatch):
    a, x = quantized((32, 64), torch.float8_e4m3fn, 400.0)
    b, w = quantized((16, 64), torch.float8_e4m3fn, 400.0)
    assert not gemm._scaled_mm_applies(a, b)
    monkeypatch.setattr(torch, "_scaled_mm", lambda *args, **kwargs: pytest.fail("_scaled_mm called on CPU"))
    y = gemm.fp8_gemm(a, b, torch.float32)
    assert torch.equal(y, fp8_gemm_emulation(a.dequantize(), b.dequantize()))
    assert sqnr_db(x @ w.t(), y) >= 25


def test_scaled_mm_needs_multiples_of_16_and_an_e4m3_operand(monkeypatch):
    monkeypatch.setattr(gemm, "_SCALED_MM_DEVICES", {"cpu"})  # as if the CPU had the FP8 GEMM
    e5m2_a, _ = quantized((32, 64), torch.float8_e5m2, 50000.0)
    e5m2_b, _ = quantized((16, 64), torch.float8_e5m2, 50000.0)
    e4m3_b, _ = quantized((16, 64), torch.float8_e4m3fn, 400.0)
    odd, _ = quantized((30, 64), torch.float8_e4m3fn, 400.0)
    assert gemm._scaled_mm_applies(e5m2_a, e4m3_b)
    assert not gemm._scaled_mm_applies(e5m2_a, e5m2_b)
    assert not gemm._scaled_mm_applies(odd, e4m3_b)

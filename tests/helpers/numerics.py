"""The one place tests get tolerances and compare tensors (TE_API.md section 6)."""
import math
from typing import Optional

import torch

# dtype -> (rtol, atol), TransformerEngine's reference-test values.
_TOLERANCES = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1.3e-6, 1e-5),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float8_e4m3fn: (0.125, 0.0675),
    torch.float8_e5m2: (0.25, 0.125),
}


def tolerances(dtype: torch.dtype) -> dict:
    """{"rtol": ..., "atol": ...} for results stored in `dtype`."""
    rtol, atol = _TOLERANCES[dtype]
    return {"rtol": rtol, "atol": atol}


def describe_difference(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 0.0, atol: float = 0.0) -> str:
    """Where two same-shaped tensors are furthest outside |a - e| <= atol + rtol |e|, and by how much."""
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if a.numel() == 0:
        return "empty tensors"
    diff = (a - e).abs()
    diff = torch.where(torch.isnan(a) != torch.isnan(e), torch.full_like(diff, math.inf), diff.nan_to_num(0.0))
    excess = diff - (atol + rtol * e.abs().nan_to_num(0.0))
    index = tuple(int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
    return (f"worst at {index}: actual {a[index].item()!r}, expected {e[index].item()!r} "
            f"(|diff| {diff[index].item():.3g}); {int((excess > 0).sum())} of {a.numel()} elements outside; "
            f"max |diff| {diff.max().item():.3g}, max |expected| {e.abs().max().item():.3g}")


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: Optional[torch.dtype] = None,
                 name: str = "tensor", **overrides) -> None:
    """Shape, dtype and values (tolerances of `dtype`, default actual.dtype) must match."""
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    tol = tolerances(dtype or actual.dtype)
    tol.update(overrides)
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if not torch.allclose(a, e, rtol=tol["rtol"], atol=tol["atol"], equal_nan=True):
        raise AssertionError(f"{name} differs beyond rtol={tol['rtol']}, atol={tol['atol']}: "
                             + describe_difference(actual, expected, tol["rtol"], tol["atol"]))


def assert_two_reference(ours: torch.Tensor, plain: torch.Tensor, exact: torch.Tensor, factor: float,
                         name: str = "tensor", floor: Optional[float] = None) -> None:
    """The fused-kernel rule: ours's max error against an exact (fp32/fp64) result is at most
    `factor` times the error plain PyTorch makes in the same low precision (2x forward,
    3x backward), plus a floor: by default one ulp of the low precision at the tensor's scale."""
    exact = exact.detach().double()
    err_ours = (ours.detach().double() - exact).abs().max().item() if exact.numel() else 0.0
    err_plain = (plain.detach().double() - exact).abs().max().item() if exact.numel() else 0.0
    if floor is None:
        floor = torch.finfo(ours.dtype).eps * (exact.abs().max().item() if exact.numel() else 0.0)
    assert err_ours <= factor * err_plain + floor, (
        f"{name}: error {err_ours:.3g} vs exact exceeds {factor} x plain PyTorch's {err_plain:.3g} "
        f"(+ floor {floor:.3g}); " + describe_difference(ours, exact))


def sqnr_db(signal: torch.Tensor, approximation: torch.Tensor) -> float:
    """Signal-to-quantisation-noise ratio in dB: 10 log10(|s|^2 / |s - a|^2)."""
    s, a = signal.detach().double(), approximation.detach().double()
    noise = (s - a).square().sum().item()
    return math.inf if noise == 0 else 10 * math.log10(s.square().sum().item() / noise)


def assert_value_error_naming(call, words) -> None:
    """call() raises ValueError whose message contains every one of `words` (the argument's
    name, the sizes or dtypes involved)."""
    import pytest
    with pytest.raises(ValueError) as info:
        call()
    for word in words:
        assert word in str(info.value), f"{word!r} not in: {info.value}"


def fp32_quotient(numerator: float, denominator) -> torch.Tensor:
    """numerator / denominator correctly rounded to fp32 (as a kernel's fp32 division is):
    the float64 quotient of fp32 values rounds to the right fp32 value. Not `float / tensor`,
    which PyTorch computes as a multiplication by the rounded reciprocal."""
    denominator = torch.as_tensor(denominator, dtype=torch.float32)
    return (torch.tensor(numerator, dtype=torch.float64) / denominator.double()).float()


# Mantissa bits (after the leading one) of the dtypes a GEMM rounds its result to.
_MANTISSA_BITS = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}


def assert_fp8_gemm_result(actual: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                           bias: Optional[torch.Tensor] = None, name: str = "gemm") -> None:
    """actual is TransformerEngine's FP8 GEMM a @ b.T (+ bias) of the dequantised operands
    a [m, k], b [n, k]: the exact result (float64) with fp32 summation error, at most 2^-20
    of the sum of the terms' magnitudes (about 1e-6, fp32's tolerance), then rounded ONCE to
    actual.dtype, so within half a unit in its last place. A GEMM that rounds its sums to bf16
    first, or adds the bias after a rounding, misses by a whole bf16 rounding step."""
    a64, b64 = a.detach().double(), b.detach().double()
    exact = a64 @ b64.t()
    magnitude = a64.abs() @ b64.abs().t()
    if bias is not None:
        exact, magnitude = exact + bias.detach().double(), magnitude + bias.detach().double().abs()
    assert actual.shape == exact.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(exact.shape)}"
    exponent = torch.frexp(exact).exponent.double()  # |exact| in [2^(e-1), 2^e)
    smallest_normal_exponent = math.log2(torch.finfo(actual.dtype).tiny) + 1
    half_ulp = torch.exp2(torch.clamp(exponent, min=smallest_normal_exponent) - 2 - _MANTISSA_BITS[actual.dtype])
    tolerance = half_ulp + 2.0 ** -20 * magnitude
    diff = (actual.detach().double() - exact).abs()
    outside = ~(diff <= tolerance)
    if outside.any():
        worst = int((diff - tolerance).argmax())
        raise AssertionError(f"{name}: {int(outside.sum())} of {exact.numel()} elements are not the exact result "
                             f"rounded once to {actual.dtype}; worst: actual {actual.flatten()[worst].item()!r}, "
                             f"exact {exact.flatten()[worst].item()!r}, tolerance {tolerance.flatten()[worst].item():.3g}")


def assert_same_fp8(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal FP8 codes everywhere, except that any NaN code matches any NaN code."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    nan = torch.isnan(want.float())
    assert torch.equal(torch.isnan(got.float()), nan)
    got_bits, want_bits = got.view(torch.uint8)[~nan], want.view(torch.uint8)[~nan]
    assert torch.equal(got_bits, want_bits), (got_bits != want_bits).nonzero()[:5]

"""What every Triton kernel writing FP8 shares: the saturating cast's clamp and the amax rule.

The cast saturates: |v| beyond the format's max becomes +-max, NaN stays NaN. The clamp is
written with comparisons, not min/max, which return the non-NaN operand on the GPU; the
conversion itself is round-to-nearest-even (cvt.rn.satfinite on sm_89 and later).
An amax skips NaN and counts inf: magnitudes with NaN read as 0, reduced with a plain max.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def saturate(v, fp8_max):
    """v (float32) clamped to [-fp8_max, fp8_max], NaN kept."""
    return tl.where(tl.abs(v) > fp8_max, tl.where(v > 0, fp8_max, -fp8_max), v)


@triton.jit
def magnitude(x):
    """|x| with NaN as 0: what an amax reduces (0 never raises one)."""
    return tl.where(x == x, tl.abs(x), 0.0)


def fp8_max(fp8_dtype: torch.dtype) -> float:
    return float(torch.finfo(fp8_dtype).max)


def amax_of_partials(partials: torch.Tensor) -> torch.Tensor:
    """The second reduction of an amax: the max of the programs' partial amaxes (which hold no
    NaN, so torch's max is the amax), 0 over none."""
    return partials.amax() if partials.numel() else partials.new_zeros(())


@triton.jit
def e8m0_to_float(exponent):
    """2^(e - 127) as float32 for biased E8M0 exponents (int32); 255 is NaN, 0 the subnormal 2^-127."""
    bits = tl.where(exponent == 0, 0x00400000, exponent << 23)
    value = bits.to(tl.float32, bitcast=True)
    return tl.where(exponent == 255, float("nan"), value)

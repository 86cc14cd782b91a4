"""The GEMM of two FP8 operands (fp8/codes.py, fp8/block_tensor.py), with TransformerEngine's
numerics on every device.

FP8: the products of the FP8 *codes* are summed in fp32, each operand's scale_inv is applied
once in fp32, the bias is added in fp32, and the result is rounded once to the output dtype.
Block-scaled operands (fp8/block_tensor.py) multiply their dequantised values: exact where
their scales are powers of two (MXFP8's E8M0, 'pow2' blocks), with one fp32 rounding per
element otherwise.
- CUDA (and MUSA where torch_musa implements it): per-tensor operands go to torch._scaled_mm,
  the FP8 tensor-core GEMM; block-scaled ones to the fp8_block_gemm op (custom_ops/fp8_block_gemm.py:
  a Triton kernel multiplying the codes on the tensor cores, each k-block's sums scaled in fp32),
  or on Hopper and later, for the forward GEMM's layouts, to _scaled_mm's block-scaled cuBLAS
  GEMM once a first call has found it to agree with that op (custom_ops/_blockwise_scaled_mm.py).
- Everywhere else the scaled_gemm op (custom_ops/scaled_gemm.py) takes the codes and the scale_invs.
  On the CPU the codes themselves go to our gemm_bf16 kernel, which widens them (exactly) while
  packing its tiles or, for a's few rows (decoding), as it reads b where it lies; sums in fp32
  on the AMX tiles or the AVX512-BF16 dot products, or by fp32 FMAs on CPUs without bf16 matrix
  units; and applies scale and bias in its fp32 epilogue (PyTorch's CPU bf16 GEMM cannot serve:
  it rounds its output to bf16). Devices without a kernel run the op's fp32 reference.
  Block-scaled operands with power-of-two scales go to the fp8_block_gemm op on the CPU: the
  same gemm_bf16 kernel, widening each code times its block's scale as it reads it; other
  block-scaled operands are dequantised for scaled_gemm (in fp32 on CPUs whose GEMMs are fp32).
"""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from ..custom_ops._blockwise_scaled_mm import block_gemm
from ..custom_ops.fp8_block_gemm import fp8_block_gemm
from ..custom_ops.fp8_cast import fp8_dequantize
from ..custom_ops.linear import linear, linear_accumulate
from ..custom_ops.scaled_gemm import scaled_gemm, scaled_gemm_accumulate
from ..triton._device import has_e4m3
from .block_tensor import Float8BlockPair, Float8BlockTensor
from .codes import Float8Codes
from .high_precision_operand import HighPrecisionOperand, HybridPair
from .nvfp4_gemm import Nvfp4Operand, carries_rht, is_nvfp4, nvfp4_gemm, nvfp4_gemm_accumulate

Fp8Operand = Union[Float8Codes, Float8BlockTensor, Float8BlockPair, Nvfp4Operand]

# Device types that have torch._scaled_mm kernels for FP8 (CUDA always; MUSA until a call
# shows that this torch_musa build lacks them).
_SCALED_MM_DEVICES = {"cuda", "musa"}


def fp8_gemm(a: Fp8Operand, b: Fp8Operand, out_dtype: torch.dtype, bias: Optional[Tensor] = None) -> Tensor:
    """a @ b.T for FP8 operands a [m, k] and b [n, k] -> [m, n] in out_dtype (+ bias [n]).
    Operands are per-tensor (Float8Codes) or block-scaled (fp8/block_tensor.py), each
    with its blocks along k, or both NVFP4 (fp8/nvfp4_gemm.py); a hybrid operand gives its
    row-wise usage; a high-precision operand, or NVFP4 against another scheme, goes to
    mixed_gemm."""
    a, b = _usage_read(a), _usage_read(b)
    if _mixed(a, b):
        return mixed_gemm(a, b, out_dtype, bias)
    if is_nvfp4(a) or is_nvfp4(b):
        return nvfp4_gemm(a, b, out_dtype, bias)
    if _scaled_mm_applies(a, b):
        try:
            return scaled_mm(a, b, out_dtype, bias)
        except (NotImplementedError, RuntimeError):
            if a.device.type != "musa":
                raise
            _SCALED_MM_DEVICES.discard("musa")  # this torch_musa has no FP8 GEMM: the fp32 path from now on
    if not isinstance(a, Float8Codes) and not isinstance(b, Float8Codes):
        a_blocks, b_blocks = _blocks(a), _blocks(b)
        if a.device.type != "cpu":
            return block_gemm(a_blocks, b_blocks, out_dtype, bias, lambda: fp8_block_gemm(
                *_block_operand(a_blocks), *_block_operand(b_blocks), bias, out_dtype))
        if _bf16_sums(a, b):
            # The CPU kernel reads the codes and scales where they lie: no dequantised copy.
            return fp8_block_gemm(*_block_operand(a_blocks), *_block_operand(b_blocks), bias, out_dtype)
    a_values, b_values, a_scale_inv, b_scale_inv = _scaled_gemm_operands(a, b)
    # A weight kept across microbatches comes packed for the CPU kernel (fp8/codes.py).
    b_packed = b.packed_for_cpu_gemm() if isinstance(b, Float8Codes) and b_values is b.data else None
    return scaled_gemm(a_values, b_values, a_scale_inv, b_scale_inv, bias, out_dtype, b_packed)


def fp8_gemm_accumulate(a: Fp8Operand, b: Fp8Operand, out: Tensor) -> None:
    """out += a @ b.T for FP8 operands (a weight gradient added into main_grad). Where
    scaled_gemm serves (the CPU everywhere), scaled_gemm_accumulate adds out to the scaled sums
    in fp32 before the one rounding, as TE's GEMM with accumulate=True; the GPU GEMMs form the
    product in fp32 and it is added after."""
    a, b = _usage_read(a), _usage_read(b)
    if _mixed(a, b):
        linear_accumulate(*_mixed_values(a, b, out.dtype), out)
        return
    if is_nvfp4(a) or is_nvfp4(b):
        nvfp4_gemm_accumulate(a, b, out)
        return
    if _scaled_mm_applies(a, b) or (a.device.type != "cpu" and not isinstance(a, Float8Codes)
                                    and not isinstance(b, Float8Codes)):
        out.add_(fp8_gemm(a, b, torch.float32))
        return
    scaled_gemm_accumulate(*_scaled_gemm_operands(a, b), out)


def _usage_read(x):
    """The operand a GEMM contracting x's last dimension reads: a hybrid pair's row-wise usage."""
    return x.forward_usage() if isinstance(x, HybridPair) else x


def _mixed(a, b) -> bool:
    return isinstance(a, HighPrecisionOperand) or isinstance(b, HighPrecisionOperand) or is_nvfp4(a) != is_nvfp4(b)


def mixed_gemm(a, b, out_dtype: torch.dtype, bias: Optional[Tensor] = None) -> Tensor:
    """a @ b.T where an operand is kept in high precision (IdentityQuantizer) or the two are of
    schemes no kernel multiplies together (NVFP4 and an FP8 one, from HybridQuantizers): the
    high-precision GEMM of the operands' values, each quantized one dequantised exactly. Two
    high-precision operands give the module's own high-precision GEMM, bit for bit."""
    a_values, b_values = _mixed_values(a, b, out_dtype)
    return linear(a_values, b_values, None if bias is None else bias.to(a_values.dtype)).to(out_dtype)


def _mixed_values(a, b, out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """Both operands' values in one high-precision dtype: the first high-precision operand's (a
    is the activation or gradient: the module's high-precision GEMM casts the weight to its
    dtype too), else out_dtype (fp32 for an FP8 out_dtype)."""
    held = [x.values.dtype for x in (a, b) if isinstance(x, HighPrecisionOperand)]
    dtype = held[0] if held else out_dtype
    if not dtype.is_floating_point or dtype.itemsize == 1:
        dtype = torch.float32
    if any(is_nvfp4(x) and carries_rht(x) for x in (a, b)):
        raise NotImplementedError("a GEMM of NVFP4 codes of Hadamard-transformed values against another "
                                      "scheme: the transform only cancels between two transformed operands")
    return a.dequantize(dtype), b.dequantize(dtype)


def _scaled_gemm_operands(a: Fp8Operand, b: Fp8Operand) -> Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    """(a values, b values, a_scale_inv, b_scale_inv), scaled_gemm's first arguments: on a CPU with bf16 sums,
    per-tensor codes as they are (the kernel widens them) and exact block values in bf16; else fp32."""
    bf16_sums = _bf16_sums(a, b)
    dtype = torch.bfloat16 if bf16_sums else torch.float32
    (a_values, a_scale_inv), (b_values, b_scale_inv) = (_values_and_scale_inv(x, dtype, codes_as_they_are=bf16_sums)
                                                        for x in (a, b))
    return a_values, b_values, a_scale_inv, b_scale_inv


def _bf16_sums(a: Fp8Operand, b: Fp8Operand) -> bool:
    """Whether the CPU sums these operands' products on our gemm_bf16 kernel, which widens the
    codes as it reads them: on every CPU, wherever every value the GEMM multiplies is exact in
    bf16. On CPUs whose GEMMs are fp32 (cpu_gemm_dtype) the kernel's FMA tiers sum the same exact
    products in fp32 that ATen's fp32 GEMM would, without the pass that writes both operands in
    fp32 first: te.Linear(1024, 5632) forward + backward over 2048 tokens under DelayedScaling,
    Float8CurrentScaling and Float8BlockScaling 1.09-1.30x faster on 2 Zen 3 cores (AVX2), MXFP8
    on par (benchmarks/results/avx2_zen3/fp8_gemm_route.md)."""
    return a.device.type == "cpu" and _exact_in_bf16(a) and _exact_in_bf16(b)


def _blocks(x: Union[Float8BlockTensor, Float8BlockPair]) -> Float8BlockTensor:
    """A block-scaled operand's codes with their blocks along k."""
    return x.rowwise if isinstance(x, Float8BlockPair) else x


def _block_operand(x: Float8BlockTensor) -> Tuple[Tensor, Tensor, Tuple[int, int], bool]:
    """fp8_block_gemm's arguments for one operand: (codes, scale_inv, block, transposed)."""
    return x.data, x.scale_inv, x.block, x.transposed


def _exact_in_bf16(x: Fp8Operand) -> bool:
    """Whether the values the GEMM multiplies are exact in bf16: per-tensor FP8 codes always
    (the scale is applied after the sums), block-scaled values where the scales are powers of two."""
    return isinstance(x, Float8Codes) or x.power_of_two_scales


def _values_and_scale_inv(x: Fp8Operand, dtype: torch.dtype,
                          codes_as_they_are: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """(what the GEMM multiplies, in dtype; the factor applied to the sums, None for 1): a
    per-tensor operand's codes (exact in bf16 and fp32; as they are where the CPU kernel
    widens them itself) and scale_inv; a block-scaled operand's dequantised values."""
    if isinstance(x, Float8Codes) and codes_as_they_are:
        return x.data, x.scale_inv
    if isinstance(x, Float8Codes):
        # Our cast kernel with a unit scale: the same exact values as .to(dtype), 3x faster
        # (16M E4M3 codes to bf16: 15 ms against 47 ms on 2 Zen 5 cores).
        return fp8_dequantize(x.data, x.scale_inv.new_ones(1), dtype), x.scale_inv
    return x.dequantize(dtype), None


def _scaled_mm_applies(a, b) -> bool:
    """torch._scaled_mm takes per-tensor scales, dimensions in multiples of 16 and at least
    one E4M3 operand, on GPUs that multiply E4M3 (CUDA sm_89 and later)."""
    return (a.device.type in _SCALED_MM_DEVICES and isinstance(a, Float8Codes) and isinstance(b, Float8Codes)
            and has_e4m3(a.device)
            and a.data.dim() == 2 and all(size % 16 == 0 for size in (*a.shape, b.shape[0]))
            and torch.float8_e4m3fn in (a.dtype, b.dtype))


def scaled_mm(a: Float8Codes, b: Float8Codes, out_dtype: torch.dtype, bias: Optional[Tensor] = None) -> Tensor:
    """a @ b.T by torch._scaled_mm: the product of the codes, accumulated in fp32 and
    multiplied by both scale_invs. With a bias the GEMM returns fp32, so that the bias is
    added in fp32 before the one rounding (_scaled_mm's own bias argument refuses fp32
    outputs). _scaled_mm wants its second operand column-major, which b's row-major codes
    [n, k] are once viewed as [k, n]."""
    out = torch._scaled_mm(a.data, b.data.t(), scale_a=a.scale_inv.reshape(()).float(),
                           scale_b=b.scale_inv.reshape(()).float(),
                           out_dtype=out_dtype if bias is None else torch.float32)
    return out if bias is None else (out + bias.float()).to(out_dtype)

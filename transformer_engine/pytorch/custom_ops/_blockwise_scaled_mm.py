"""torch._scaled_mm (cuBLAS's block-scaled FP8 GEMM) for Float8BlockScaling's forward GEMM on
Hopper and later: 1 x 128 activations times 128 x 128 (or 1 x 128) weights, both operands
row-major along k, fp32 scales.

cuBLAS reads each operand's scales in a layout of its own, which cannot be checked without a
GPU. So the first call of each layout on each device computes the product both ways, by
_scaled_mm and by the fp8_block_gemm op (the Triton kernel, verified against the reference),
and keeps _scaled_mm for that layout only where the two agree; a layout it refuses or gets
wrong stays with fp8_block_gemm. Under torch.compile only layouts already judged take it.
"""
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

Key = Tuple[str, Tuple[int, int], Tuple[int, int], torch.dtype, torch.dtype]
_verdicts: Dict[Key, bool] = {}  # (device, a's block, b's block, a's and b's formats) -> _scaled_mm agrees
_AGREEMENT = 1e-3  # relative to the product's largest magnitude; a misread scale layout is off by O(1)


def takes_blockwise(device: torch.device) -> bool:
    """CUDA devices whose _scaled_mm has block-scaled FP8 kernels (sm_90 and later)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def _layout(a, b) -> Optional[Key]:
    """The call's layout where _scaled_mm may take it: a in 1 x 128 blocks, b in 128 x 128 or
    1 x 128, neither stored transposed (_scaled_mm wants a row-major and b column-major, which
    b's row-major codes [n, k] are once viewed as [k, n]), fp32 scales, sizes in multiples of 16."""
    if a.transposed or b.transposed or a.block != (1, 128) or b.block not in ((128, 128), (1, 128)):
        return None
    if a.scale_inv.dtype != torch.float32 or any(size % 16 for size in (*a.data.shape, b.data.shape[0])):
        return None
    return (str(a.data.device), a.block, b.block, a.data.dtype, b.data.dtype)


def _scaled_mm(a, b, out_dtype: torch.dtype) -> Tensor:
    # scale_a [m, k / 128] with m outermost in memory; scale_b [k / 128, n / 128] (or [k / 128, n]).
    scale_a = a.scale_inv.t().contiguous().t()
    return torch._scaled_mm(a.data, b.data.t(), scale_a=scale_a, scale_b=b.scale_inv.t(), out_dtype=out_dtype)


def block_gemm(a, b, out_dtype: torch.dtype, bias: Optional[Tensor], fallback: Callable[[], Tensor]) -> Tensor:
    """a @ b^T (+ bias) of Float8BlockTensors by _scaled_mm where its layout has been found to
    agree with fallback() (the fp8_block_gemm op), else by fallback()."""
    key = _layout(a, b) if takes_blockwise(a.data.device) else None
    verdict = _verdicts.get(key) if key is not None else False
    if verdict is False or (verdict is None and torch.compiler.is_compiling()):
        return fallback()
    try:
        out = _scaled_mm(a, b, torch.float32)  # fp32, so that the bias is added before the one rounding
    except (RuntimeError, ValueError):
        _verdicts[key] = False
        return fallback()
    result = (out if bias is None else out + bias.float()).to(out_dtype)
    if verdict is None:
        expected = fallback()
        # Both round once to out_dtype: allow that rounding's ulp besides the summation order.
        tolerance = (_AGREEMENT + torch.finfo(out_dtype).eps) * expected.float().abs().max().item()
        difference = (result.float() - expected.float()).abs().max().item() if result.numel() else 0.0
        _verdicts[key] = difference <= tolerance
        if not _verdicts[key]:
            return expected
    return result

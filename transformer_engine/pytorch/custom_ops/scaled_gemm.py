"""The GEMM of FP8 values with TransformerEngine's numerics, as a dispatcher op: its fake
kernel and the reference on devices without a kernel. Not differentiable itself: the Linear
modules call it inside their own autograd rules.

    scaled_gemm(a [m, k], b [n, k], a_scale_inv [1] | None, b_scale_inv [1] | None,
                bias [n] | None, out_dtype, b_packed=None) -> [m, n]
        round_to_out_dtype(a_scale_inv * b_scale_inv * (a @ b^T) + bias), with fp32 sums and the
        scales and bias applied in fp32. a and b are each bf16 or FP8 codes (float8_e4m3fn,
        float8_e5m2; on the CPU: our gemm_bf16 kernel, which widens the codes to bf16 exactly
        while packing, on AMX tiles or AVX512-BF16 dot products where present), or both fp32
        (the CPU's fp32 GEMM). Passing codes and their scale_invs gives TE's FP8 GEMM.
        b_packed: pack_operand(b) of this b at the active CPU tier, for a b that serves many
        GEMMs (a weight across microbatches): the CPU kernel then skips packing it; other
        devices ignore it.

    scaled_gemm_accumulate(a, b, a_scale_inv, b_scale_inv, out [m, n]) -> None
        out += the same product, in place, out's values added in fp32 before the one rounding:
        a weight gradient added into main_grad, as TE's GEMM with accumulate=True.
"""
from typing import Optional

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE, kernels
from ._registry import serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)


@torch.library.register_fake(f"{NAMESPACE}::scaled_gemm")
def _scaled_gemm_fake(a, b, a_scale_inv, b_scale_inv, bias, out_dtype, b_packed=None):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


@torch.library.register_fake(f"{NAMESPACE}::scaled_gemm_accumulate")
def _scaled_gemm_accumulate_fake(a, b, a_scale_inv, b_scale_inv, out):
    return None


serve_on_accelerators("scaled_gemm", reference.scaled_gemm)
serve_on_accelerators("scaled_gemm_accumulate", reference.scaled_gemm_accumulate)


def scaled_gemm(a: Tensor, b: Tensor, a_scale_inv: Optional[Tensor], b_scale_inv: Optional[Tensor],
                bias: Optional[Tensor], out_dtype: torch.dtype, b_packed: Optional[Tensor] = None) -> Tensor:
    """a_scale_inv * b_scale_inv * (a @ b^T) + bias for a [m, k], b [n, k] (each bf16 or FP8
    codes, or both fp32): fp32 sums, scales and bias applied in fp32, one rounding to out_dtype.
    b_packed: pack_operand(b), where b serves many GEMMs on the CPU."""
    return _ops.scaled_gemm(a, b, a_scale_inv, b_scale_inv, bias, out_dtype, b_packed)


def pack_operand(b: Tensor) -> Tensor:
    """b [n, k] (bf16 or FP8 codes, on the CPU) in the layout the CPU GEMM kernel of the active
    tier reads, behind a header naming the tier and [n, k]: scaled_gemm's b_packed. Pack again
    after b's values or the tier (limit_cpu_isa) change: scaled_gemm refuses a packing for
    another [n, k] or tier."""
    return kernels.gemm_pack_b(b)


def scaled_gemm_accumulate(a: Tensor, b: Tensor, a_scale_inv: Optional[Tensor], b_scale_inv: Optional[Tensor],
                           out: Tensor) -> None:
    """out += a_scale_inv * b_scale_inv * (a @ b^T) in place (out [m, n], rows contiguous): fp32
    sums, out added in fp32, one rounding to out's dtype."""
    _ops.scaled_gemm_accumulate(a, b, a_scale_inv, b_scale_inv, out)

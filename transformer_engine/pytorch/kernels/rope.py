"""Rotary position embedding as dispatcher ops: fake kernels for tracing and autograd rules.

The ops (schemas in bindings/schemas.cpp):
    rope_fwd(input, freqs, tensor_format, interleaved, cu_seqlens?, start_positions?) -> output
    rope_bwd(grad_output, freqs, tensor_format, interleaved, cu_seqlens?, start_positions?) -> grad_input
input [s, b, h, d] ('sbhd'), [b, s, h, d] ('bshd') or [t, h, d] ('thd'); freqs [max_seq_len, 1, 1,
d2] float32 angles. Formula and position rules: reference/rope.py; argument checks, as the
compiled op's, in kernels/_rope_checks.py. The op is linear in input, so rope_bwd is its transpose
and rope_fwd in turn the transpose of rope_bwd (double backward is exact). Like
TransformerEngine's fused kernel, the ops do not differentiate freqs; the plain-PyTorch path
(reference.rope_fwd) does.
"""
from typing import Optional

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from . import _rope_checks
from ._registry import serve_reference_where_no_kernel

_ops = getattr(torch.ops, NAMESPACE)


@torch.library.register_fake(f"{NAMESPACE}::rope_fwd")
def _rope_fwd_fake(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions):
    _rope_checks.rope_fwd(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions)
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@torch.library.register_fake(f"{NAMESPACE}::rope_bwd")
def _rope_bwd_fake(grad_output, freqs, tensor_format, interleaved, cu_seqlens, start_positions):
    _rope_checks.rope_bwd(grad_output, freqs, tensor_format, interleaved, cu_seqlens, start_positions)
    return torch.empty_like(grad_output, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    _input, freqs, tensor_format, interleaved, cu_seqlens, start_positions = inputs
    ctx.save_for_backward(freqs, cu_seqlens, start_positions)
    ctx.tensor_format, ctx.interleaved = tensor_format, interleaved


def _transpose_with(op):
    """Autograd rule of a linear op whose transpose is `op`: the gradient of the input only."""
    def backward(ctx, grad):
        freqs, cu_seqlens, start_positions = ctx.saved_tensors
        grad_input = op(grad, freqs, ctx.tensor_format, ctx.interleaved, cu_seqlens, start_positions)
        return grad_input, None, None, None, None, None
    return backward


torch.library.register_autograd(f"{NAMESPACE}::rope_fwd", _transpose_with(_ops.rope_bwd),
                                setup_context=_setup_context)
torch.library.register_autograd(f"{NAMESPACE}::rope_bwd", _transpose_with(_ops.rope_fwd),
                                setup_context=_setup_context)

for _name in ("rope_fwd", "rope_bwd"):
    serve_reference_where_no_kernel(_name, getattr(reference, _name), triton_module="rope",
                                    check=getattr(_rope_checks, _name))


def rope(input: Tensor, freqs: Tensor, tensor_format: str = "sbhd", interleaved: bool = False,
         cu_seqlens: Optional[Tensor] = None, start_positions: Optional[Tensor] = None) -> Tensor:
    """Rotates the first freqs.shape[-1] channels of every head; differentiable in input."""
    return _ops.rope_fwd(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions)

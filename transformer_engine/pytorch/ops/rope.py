"""Rotary position embedding as dispatcher ops: fake kernels for tracing and autograd rules.

The ops (schemas in bindings/schemas.cpp):
    rope_fwd(input, freqs, tensor_format, interleaved, cu_seqlens?, start_positions?) -> output
    rope_bwd(grad_output, freqs, tensor_format, interleaved, cu_seqlens?, start_positions?) -> grad_input
input [s, b, h, d] ('sbhd'), [b, s, h, d] ('bshd') or [t, h, d] ('thd'); freqs [max_seq_len, 1, 1,
d2] float32 angles. Formula and position rules: reference/rope.py. The op is linear in input, so
rope_bwd is its transpose and rope_fwd in turn the transpose of rope_bwd (double backward is
exact). Like TransformerEngine's fused kernel, the ops do not differentiate freqs; the
plain-PyTorch path (reference.rope_fwd) does.
"""
from typing import Optional

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from ._registry import serve_reference_where_no_kernel

_ops = getattr(torch.ops, NAMESPACE)
_EXPECTED_DIMS = {"sbhd": 4, "bshd": 4, "thd": 3}


def _check_layout(op: str, input: Tensor, freqs: Tensor, tensor_format: str) -> None:
    """The shape checks the fake kernels can make without reading cu_seqlens/start_positions."""
    if tensor_format not in _EXPECTED_DIMS:
        raise ValueError(f"{op}: tensor_format must be 'sbhd', 'bshd' or 'thd', got {tensor_format!r}")
    if input.dim() != _EXPECTED_DIMS[tensor_format]:
        raise ValueError(f"{op}: input in {tensor_format!r} format must be {_EXPECTED_DIMS[tensor_format]}-D, "
                         f"got shape {tuple(input.shape)}")
    if freqs.device != input.device:
        raise ValueError(f"{op}: freqs is on {freqs.device} but input is on {input.device}")
    if freqs.dim() != 4 or freqs.shape[-1] > input.shape[-1]:
        raise ValueError(f"{op}: freqs must be [max_seq_len, 1, 1, rotary_dim] with rotary_dim at most the head dim; "
                         f"got freqs {tuple(freqs.shape)}, input {tuple(input.shape)}")


@torch.library.register_fake(f"{NAMESPACE}::rope_fwd")
def _rope_fwd_fake(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions):
    _check_layout("rope_fwd", input, freqs, tensor_format)
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@torch.library.register_fake(f"{NAMESPACE}::rope_bwd")
def _rope_bwd_fake(grad_output, freqs, tensor_format, interleaved, cu_seqlens, start_positions):
    _check_layout("rope_bwd", grad_output, freqs, tensor_format)
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
    serve_reference_where_no_kernel(_name, getattr(reference, _name))


def rope(input: Tensor, freqs: Tensor, tensor_format: str = "sbhd", interleaved: bool = False,
         cu_seqlens: Optional[Tensor] = None, start_positions: Optional[Tensor] = None) -> Tensor:
    """Rotates the first freqs.shape[-1] channels of every head; differentiable in input."""
    return _ops.rope_fwd(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions)

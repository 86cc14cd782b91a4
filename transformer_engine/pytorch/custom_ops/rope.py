"""Rotary position embedding as dispatcher ops: fake kernels for tracing and autograd rules.

The ops (schemas in bindings/rope_ops.cpp):
    rope_fwd(input, freqs, tensor_format, interleaved, cu_seqlens?, start_positions?) -> output
    rope_bwd(grad_output, freqs, tensor_format, interleaved, cu_seqlens?, start_positions?) -> grad_input
input [s, b, h, d] ('sbhd'), [b, s, h, d] ('bshd') or [t, h, d] ('thd'); freqs [max_seq_len, 1, 1,
d2] float32 angles. Formula and position rules: reference/rope.py. The op is linear in input, so
rope_bwd is its transpose and rope_fwd in turn the transpose of rope_bwd (double backward is exact).
Like TransformerEngine's fused kernel, the ops do not differentiate freqs; the plain-PyTorch path
(reference.rope_fwd) does.

The argument checks below are bindings/rope_ops.cpp's, in Python, with its messages: run by the
fake kernels and before the Triton kernel or the reference on accelerators. The checks on the
values of cu_seqlens and start_positions (and on the positions they make freqs cover) read them
on the host, as the compiled op does: one synchronisation with the device per call that passes
them. Fake and meta tensors hold no values: the fake kernels check shapes, dtypes and devices only.
"""
from typing import List, Optional

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE, kernels
from . import _checks
from ._checks import aten_name, fail, shape_text
from ._registry import direct_call_applies, serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)

# --- argument checks (bindings/rope_ops.cpp's) ---------------------------------------------
_DIMS = {"sbhd": 4, "bshd": 4, "thd": 3}


def _index_vector(op: str, arg: str, t: Tensor, input_name: str, input: Tensor) -> None:
    _checks.same_device(op, arg, t, input_name, input)
    if t.dtype not in (torch.int32, torch.int64):
        fail(op, f"{arg} must be int32 or int64, got {aten_name(t.dtype)}")
    if t.dim() != 1:
        fail(op, f"{arg} must be 1-D, got shape {shape_text(t.shape)}")


def _check_cu_seqlens(op: str, input_name: str, input: Tensor, cu: List[int]) -> None:
    if cu[0] != 0:
        fail(op, f"cu_seqlens must start at 0, got {cu[0]}")
    for b in range(1, len(cu)):
        if cu[b] < cu[b - 1]:
            fail(op, f"cu_seqlens must be non-decreasing, but cu_seqlens[{b}] = {cu[b]} < "
                     f"cu_seqlens[{b - 1}] = {cu[b - 1]}")
    if cu[-1] != input.shape[0]:
        fail(op, f"cu_seqlens ends at {cu[-1]} but {input_name} has {input.shape[0]} tokens "
                 f"(shape {shape_text(input.shape)})")


def _rope(op: str, input_name: str, input: Tensor, freqs: Tensor, tensor_format: str,
          cu_seqlens: Optional[Tensor], start_positions: Optional[Tensor]) -> None:
    if tensor_format not in _DIMS:
        fail(op, f"tensor_format must be 'sbhd', 'bshd' or 'thd', got '{tensor_format}'")
    _checks.kernel_dtype(op, input_name, input)
    if input.dtype == torch.float64:
        fail(op, f"{input_name} must be float32, bfloat16 or float16, got float64 (the plain-PyTorch path, "
                 "fused=False, handles float64)")
    dims = _DIMS[tensor_format]
    if input.dim() != dims:
        fail(op, f"{input_name} in '{tensor_format}' format must be {dims}-D, got shape {shape_text(input.shape)}")
    _checks.same_device(op, "freqs", freqs, input_name, input)
    _checks.dtype(op, "freqs", freqs, torch.float32)
    if freqs.dim() != 4 or freqs.shape[1] != 1 or freqs.shape[2] != 1:
        fail(op, f"freqs must have shape [max_seq_len, 1, 1, rotary_dim], got {shape_text(freqs.shape)}")
    rotary_dim, head_dim = freqs.shape[3], input.shape[-1]
    if rotary_dim <= 0 or rotary_dim % 2:
        fail(op, f"the rotary dim (freqs' last, shape {shape_text(freqs.shape)}) must be even and positive")
    if rotary_dim > head_dim:
        fail(op, f"the rotary dim {rotary_dim} (freqs shape {shape_text(freqs.shape)}) exceeds the head dim of "
                 f"{input_name} {shape_text(input.shape)}")

    if tensor_format == "thd":
        if cu_seqlens is None:
            fail(op, "the 'thd' format needs cu_seqlens")
        _index_vector(op, "cu_seqlens", cu_seqlens, input_name, input)
        if cu_seqlens.shape[0] < 1:
            fail(op, f"cu_seqlens needs at least one entry (0), got shape {shape_text(cu_seqlens.shape)}")
        seq_len, batch = input.shape[0], cu_seqlens.shape[0] - 1
    else:
        if cu_seqlens is not None:
            fail(op, f"cu_seqlens is only meaningful for the 'thd' format, got '{tensor_format}'")
        sbhd = tensor_format == "sbhd"
        seq_len, batch = (input.shape[0], input.shape[1]) if sbhd else (input.shape[1], input.shape[0])
    if start_positions is not None:
        _index_vector(op, "start_positions", start_positions, input_name, input)
        if start_positions.shape[0] != batch:
            fail(op, f"start_positions has shape {shape_text(start_positions.shape)} but there are {batch} sequences")

    # The values, read in one transfer: each sequence's length, its start position, the rows of freqs they need.
    indices = [t for t in (cu_seqlens if tensor_format == "thd" else None, start_positions) if t is not None]
    if not all(_checks.holds_values(t) for t in indices):
        return
    values = torch.cat([t.to(torch.int64) for t in indices]).tolist() if indices else []
    if tensor_format == "thd":
        cu, starts = values[:batch + 1], values[batch + 1:]
        _check_cu_seqlens(op, input_name, input, cu)
    else:
        starts = values
    for b, start in enumerate(starts):
        if start < 0:
            fail(op, f"start_positions[{b}] = {start} is negative")
    if tensor_format == "thd":  # sequences without tokens need no position
        needed = max((cu[b + 1] - cu[b] + (starts[b] if starts else 0) for b in range(batch) if cu[b + 1] > cu[b]),
                     default=0)
    else:
        needed = seq_len + max(starts, default=0) if batch > 0 and seq_len > 0 else 0
    if needed > freqs.shape[0]:
        fail(op, f"freqs (shape {shape_text(freqs.shape)}) covers {freqs.shape[0]} positions but the tokens of "
                 f"{input_name} (shape {shape_text(input.shape)}) need {needed} "
                 "(sequence lengths plus start_positions)")


def _check_rope_fwd(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions):
    _rope("rope_fwd", "input", input, freqs, tensor_format, cu_seqlens, start_positions)


def _check_rope_bwd(grad_output, freqs, tensor_format, interleaved, cu_seqlens, start_positions):
    _rope("rope_bwd", "grad_output", grad_output, freqs, tensor_format, cu_seqlens, start_positions)


@torch.library.register_fake(f"{NAMESPACE}::rope_fwd")
def _rope_fwd_fake(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions):
    _check_rope_fwd(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions)
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@torch.library.register_fake(f"{NAMESPACE}::rope_bwd")
def _rope_bwd_fake(grad_output, freqs, tensor_format, interleaved, cu_seqlens, start_positions):
    _check_rope_bwd(grad_output, freqs, tensor_format, interleaved, cu_seqlens, start_positions)
    return torch.empty_like(grad_output, memory_format=torch.contiguous_format)


# rope_fwd's and rope_bwd's autograd kernels are C++ (bindings/rope_ops.cpp: each the
# other's transpose, so every order of derivative works).
serve_on_accelerators("rope_fwd", reference.rope_fwd, triton_module="rope", check=_check_rope_fwd)
serve_on_accelerators("rope_bwd", reference.rope_bwd, triton_module="rope", check=_check_rope_bwd)


def rope(input: Tensor, freqs: Tensor, tensor_format: str = "sbhd", interleaved: bool = False,
         cu_seqlens: Optional[Tensor] = None, start_positions: Optional[Tensor] = None) -> Tensor:
    """Rotates the first freqs.shape[-1] channels of every head; differentiable in input."""
    if direct_call_applies((input, freqs, cu_seqlens, start_positions)):
        return kernels.direct.rope(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions)
    return _ops.rope_fwd(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions)

"""Rotary position embedding with the ops' exact signatures and semantics, in plain PyTorch.

Shapes: input [s, b, h, d] ('sbhd'), [b, s, h, d] ('bshd') or [t, h, d] ('thd': packed
sequences, sequence i holding tokens cu_seqlens[i]:cu_seqlens[i+1], positions restarting at 0);
freqs [max_seq_len, 1, 1, d2] angles; start_positions [b] offsets each sequence's positions.
Only the first d2 channels rotate; the rest pass through. Arithmetic in float32 (float64 for
float64 input), the result rounded once to the input dtype:
    forward:  y  = x * cos + rotate(x) * sin
    backward: dx = dy * cos - rotate(dy * sin)     (rotate is antisymmetric)
rotate(x) = cat(-x2, x1) over the halves x1, x2 of the d2 channels, or, interleaved, the same
on each adjacent pair (x[2k], x[2k+1]) -> (-x[2k+1], x[2k]).
Everything is differentiable with autograd (in input and in freqs).
"""
from typing import Optional

import torch
from torch import Tensor

FORMATS = ("sbhd", "bshd", "thd")


def rotate(x: Tensor, interleaved: bool) -> Tensor:
    """Each channel pair turned by 90 degrees: (a, b) -> (-b, a)."""
    if interleaved:
        first, second = x[..., 0::2], x[..., 1::2]
        return torch.stack((-second, first), dim=-1).flatten(-2)
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def token_positions(input: Tensor, tensor_format: str, cu_seqlens: Optional[Tensor],
                    start_positions: Optional[Tensor]) -> Tensor:
    """The position of every token: [s, b] (sbhd), [b, s] (bshd) or [t] (thd), int64."""
    if tensor_format not in FORMATS:
        raise ValueError(f"tensor_format must be one of {FORMATS}, got {tensor_format!r}")
    device = input.device
    if tensor_format == "thd":
        if cu_seqlens is None:
            raise ValueError("the 'thd' format needs cu_seqlens")
        tokens = torch.arange(input.shape[0], device=device)
        cu = cu_seqlens.to(device=device, dtype=torch.long)
        sequence = torch.searchsorted(cu[1:], tokens, right=True)  # [t]: which sequence
        positions = tokens - cu[sequence]
        offsets = start_positions.to(device=device, dtype=torch.long)[sequence] if start_positions is not None else 0
        return positions + offsets
    seq_dim = 0 if tensor_format == "sbhd" else 1
    positions = torch.arange(input.shape[seq_dim], device=device)
    offsets = start_positions.to(device=device, dtype=torch.long) if start_positions is not None else None
    if tensor_format == "sbhd":
        return positions[:, None] + (offsets[None, :] if offsets is not None else 0)  # [s, b or 1]
    return positions[None, :] + (offsets[:, None] if offsets is not None else 0)  # [b or 1, s]


def _angles(input: Tensor, freqs: Tensor, tensor_format: str, cu_seqlens: Optional[Tensor],
            start_positions: Optional[Tensor]) -> Tensor:
    """freqs gathered at every token's position, shaped to broadcast over input's heads."""
    if freqs.dim() != 4 or freqs.shape[1] != 1 or freqs.shape[2] != 1:
        raise ValueError(f"freqs must have shape [max_seq_len, 1, 1, rotary_dim], got {tuple(freqs.shape)}")
    rotary_dim, head_dim = freqs.shape[-1], input.shape[-1]
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"the rotary dim {rotary_dim} (freqs shape {tuple(freqs.shape)}) must be even and at most "
                         f"the head dim of input {tuple(input.shape)}")
    positions = token_positions(input, tensor_format, cu_seqlens, start_positions)
    if torch.compiler.is_compiling():  # reading the value would break the graph in two: assert in it
        if positions.numel():
            torch._assert_async(positions.max() < freqs.shape[0], "freqs covers fewer positions than the tokens need")
    elif positions.numel() and int(positions.max()) >= freqs.shape[0]:
        raise ValueError(f"freqs (shape {tuple(freqs.shape)}) covers {freqs.shape[0]} positions but the tokens of "
                         f"input (shape {tuple(input.shape)}) need {int(positions.max()) + 1}")
    return freqs[:, 0, 0, :][positions].unsqueeze(-2)  # [..., 1, d2]


def _apply(input: Tensor, freqs: Tensor, tensor_format: str, interleaved: bool, cu_seqlens: Optional[Tensor],
           start_positions: Optional[Tensor], backward: bool) -> Tensor:
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    angles = _angles(input, freqs, tensor_format, cu_seqlens, start_positions).to(acc)
    rotary_dim = angles.shape[-1]
    x = input[..., :rotary_dim].to(acc)
    cos, sin = angles.cos(), angles.sin()
    if backward:
        rotated = x * cos - rotate(x * sin, interleaved)
    else:
        rotated = x * cos + rotate(x, interleaved) * sin
    return torch.cat((rotated.to(input.dtype), input[..., rotary_dim:]), dim=-1)


def rope_fwd(input: Tensor, freqs: Tensor, tensor_format: str, interleaved: bool, cu_seqlens: Optional[Tensor],
             start_positions: Optional[Tensor]) -> Tensor:
    return _apply(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions, backward=False)


def rope_bwd(grad_output: Tensor, freqs: Tensor, tensor_format: str, interleaved: bool,
             cu_seqlens: Optional[Tensor], start_positions: Optional[Tensor]) -> Tensor:
    return _apply(grad_output, freqs, tensor_format, interleaved, cu_seqlens, start_positions, backward=True)

"""Rotary position embedding forward and backward in Triton, with the ops' signatures and
numerics (reference/rope.py): the angles' cos and sin and all arithmetic in float32, the
rotated channels rounded once to the input's dtype, the channels past the rotary dim copied
unchanged.

A program rotates one token's block of heads: it finds the token's position (its index in
its sequence, plus start_positions), loads the position's angles once and evaluates their cos
and sin once for all the heads of the block, so the trigonometry costs a fraction of an
element's memory traffic. cos and sin come from one float32 range reduction and two short
polynomials (_sin_cos): within 1e-7 of the exact values (PyTorch's float32 ones: 3.5e-8),
without the float64 arithmetic libdevice's sinf / cosf carry for huge angles. Each head is a
row of head_dim channels, contiguous after the heads of the same token: a block of heads is
one contiguous stretch of memory. Channel pairs are (k, k + d2/2), or (2k, 2k + 1) when
interleaved; for pair (f, s) with angles (a_f, a_s):
    forward:  y_f = x_f cos a_f - x_s sin a_f      y_s = x_s cos a_s + x_f sin a_s
    backward: dx_f = dy_f cos a_f + dy_s sin a_s   dx_s = dy_s cos a_s - dy_f sin a_f
In 'thd' format a token's sequence is the number of sequence ends (cu_seqlens[1:]) at or
before it, counted from cu_seqlens in the kernel.

The input is fp32, bf16 or fp16 with a head dim of at most MAX_HEAD_DIM; the ops' checks
(custom_ops/rope.py) have refused everything else before the launch.
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

MAX_HEAD_DIM = 4096
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TILE_ELEMENTS = 2048  # channels of a block of heads a program holds per tile
_SEQUENCES_BLOCK = 256  # cu_seqlens entries compared per step of the 'thd' sequence search


def supports(op_name: str, args: tuple) -> bool:
    """Whether the kernel runs op_name(*args): fp32 / bf16 / fp16 input, head dim at most MAX_HEAD_DIM."""
    input = args[0]
    return input.dtype in _DTYPES and input.shape[-1] <= MAX_HEAD_DIM


# pi/2 split into three float32 parts, so that angle - k pi/2 by fused multiply-adds is exact
# before its last rounding. Up to |angle| ~ 1e6 (positions of a million-token context at
# frequency 1) the results are within 1e-7 of the exact sin and cos (PyTorch's: 3.5e-8); beyond,
# the rounding of angle * 2/pi may pick the next quadrant and |r| exceeds pi/4 (3.3e-7 at 2e6),
# still far below the float32 angle's own uncertainty there (its ulp is 0.125).
_TWO_OVER_PI = tl.constexpr(0.6366197723675814)
_PIO2_HIGH = tl.constexpr(1.5707963705062866)
_PIO2_MID = tl.constexpr(-4.371138828673793e-08)
_PIO2_LOW = tl.constexpr(-1.7151245100058819e-15)


@triton.jit
def _sin_cos(angle):
    """(sin(angle), cos(angle)) in float32: angle = k pi/2 + r with |r| <= pi/4 (r exact up to one
    rounding, by fused multiply-adds), the classic single-precision minimax polynomials of sin
    and cos on r (Cephes' coefficients), and the quadrant k mod 4 choosing and negating them.
    NaN and inf give NaN."""
    k = tl.floor(angle * _TWO_OVER_PI + 0.5)
    r = tl.fma(k, -_PIO2_HIGH, angle)
    r = tl.fma(k, -_PIO2_MID, r)
    r = tl.fma(k, -_PIO2_LOW, r)
    z = r * r
    sin_r = r + r * z * ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1)
    cos_r = 1.0 - 0.5 * z + z * z * ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2)
    quadrant = k.to(tl.int32)
    odd = (quadrant & 1) != 0
    sin = tl.where(odd, cos_r, sin_r)
    cos = tl.where(odd, sin_r, cos_r)
    return tl.where((quadrant & 2) != 0, -sin, sin), tl.where(((quadrant + 1) & 2) != 0, -cos, cos)


@triton.jit
def _rope_kernel(X, Y, FREQS, CU_SEQLENS, START_POSITIONS, seq_len, batch, heads, head_dim, pairs,
                 FORMAT: tl.constexpr, INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr, HAS_START: tl.constexpr,
                 HEADS_BLOCK: tl.constexpr, PAIRS_BLOCK: tl.constexpr, PASS_BLOCK: tl.constexpr,
                 SEQUENCES_BLOCK: tl.constexpr):
    token = tl.program_id(0)
    # The token's sequence and its position in it.
    if FORMAT == "thd":
        sequence = 0
        for first in range(0, batch, SEQUENCES_BLOCK):
            entries = first + tl.arange(0, SEQUENCES_BLOCK)
            ends = tl.load(CU_SEQLENS + 1 + entries, mask=entries < batch, other=0)
            sequence += tl.sum(((ends <= token) & (entries < batch)).to(tl.int32), axis=0)
        position = token - tl.load(CU_SEQLENS + sequence)
    elif FORMAT == "sbhd":
        sequence = token % batch
        position = token // batch
    else:
        sequence = token // seq_len
        position = token % seq_len
    if HAS_START:
        position += tl.load(START_POSITIONS + sequence)
    # pairs = d2 / 2 is an argument of its own so that Triton sees its divisibility (16 for the
    # usual head dims) and vectorises the loads at pairs and the masks against it.
    rotary_dim = 2 * pairs
    angles_row = FREQS + position.to(tl.int64) * rotary_dim

    head = tl.program_id(1) * HEADS_BLOCK + tl.arange(0, HEADS_BLOCK)
    rows = (token.to(tl.int64) * heads + head) * head_dim  # [HEADS_BLOCK] offsets of the heads' rows
    head_ok = head < heads
    if INTERLEAVED:
        # Pair k is channels (2k, 2k + 1): one contiguous load, split into its even and odd channels.
        channel = tl.arange(0, 2 * PAIRS_BLOCK)
        channel_ok = channel < rotary_dim
        angle_first, angle_second = tl.split(tl.reshape(
            tl.load(angles_row + channel, mask=channel_ok, other=0.0), [PAIRS_BLOCK, 2]))
        offsets = rows[:, None] + channel[None, :]  # [HEADS_BLOCK, 2 * PAIRS_BLOCK]
        mask = head_ok[:, None] & channel_ok[None, :]
        x_first, x_second = tl.split(tl.reshape(
            tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32), [HEADS_BLOCK, PAIRS_BLOCK, 2]))
    else:
        # Pair k is channels (k, k + d2/2): the two halves of the rotary channels.
        pair = tl.arange(0, PAIRS_BLOCK)
        pair_ok = pair < pairs
        angle_first = tl.load(angles_row + pair, mask=pair_ok, other=0.0)
        angle_second = tl.load(angles_row + pairs + pair, mask=pair_ok, other=0.0)
        offsets = rows[:, None] + pair[None, :]  # [HEADS_BLOCK, PAIRS_BLOCK]
        mask = head_ok[:, None] & pair_ok[None, :]
        x_first = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
        x_second = tl.load(X + offsets + pairs, mask=mask, other=0.0).to(tl.float32)

    sin_first, cos_first = _sin_cos(angle_first)
    sin_second, cos_second = _sin_cos(angle_second)
    sin_first, cos_first = sin_first[None, :], cos_first[None, :]
    sin_second, cos_second = sin_second[None, :], cos_second[None, :]
    if BACKWARD:
        y_first = x_first * cos_first + x_second * sin_second
        y_second = x_second * cos_second - x_first * sin_first
    else:
        y_first = x_first * cos_first - x_second * sin_first
        y_second = x_second * cos_second + x_first * sin_second

    if INTERLEAVED:
        rotated = tl.reshape(tl.join(y_first, y_second), [HEADS_BLOCK, 2 * PAIRS_BLOCK])
        tl.store(Y + offsets, rotated.to(Y.dtype.element_ty), mask=mask)
    else:
        tl.store(Y + offsets, y_first.to(Y.dtype.element_ty), mask=mask)
        tl.store(Y + offsets + pairs, y_second.to(Y.dtype.element_ty), mask=mask)

    if PASS_BLOCK > 0:  # channels [rotary_dim, head_dim) are copied as they are
        channel = rotary_dim + tl.arange(0, PASS_BLOCK)
        offsets = rows[:, None] + channel[None, :]
        mask = head_ok[:, None] & (channel < head_dim)[None, :]
        tl.store(Y + offsets, tl.load(X + offsets, mask=mask, other=0.0), mask=mask)


def _rope(input: Tensor, freqs: Tensor, tensor_format: str, interleaved: bool, cu_seqlens, start_positions,
          backward: bool) -> Tensor:
    x = input.contiguous()
    output = torch.empty_like(x)
    heads, head_dim, rotary_dim = x.shape[-2], x.shape[-1], freqs.shape[-1]
    if tensor_format == "thd":
        tokens, seq_len, batch = x.shape[0], x.shape[0], cu_seqlens.shape[0] - 1
    else:
        seq_len, batch = (x.shape[0], x.shape[1]) if tensor_format == "sbhd" else (x.shape[1], x.shape[0])
        tokens = seq_len * batch
    if tokens == 0 or heads == 0:
        return output
    pairs_block = triton.next_power_of_2(rotary_dim // 2)
    pass_block = triton.next_power_of_2(head_dim - rotary_dim) if head_dim > rotary_dim else 0
    widest = max(2 * pairs_block, pass_block)
    heads_block = min(triton.next_power_of_2(heads), max(1, _TILE_ELEMENTS // widest))
    angles = freqs.reshape(freqs.shape[0], rotary_dim).contiguous()  # [max_seq_len, d2]
    # int64 index vectors; an unused pointer argument gets the angles.
    cu = cu_seqlens.to(torch.int64).contiguous() if tensor_format == "thd" else angles
    start = start_positions.to(torch.int64).contiguous() if start_positions is not None else angles
    _rope_kernel[(tokens, triton.cdiv(heads, heads_block))](
        x, output, angles, cu, start, seq_len, batch, heads, head_dim, rotary_dim // 2, FORMAT=tensor_format,
        INTERLEAVED=interleaved, BACKWARD=backward, HAS_START=start_positions is not None, HEADS_BLOCK=heads_block,
        PAIRS_BLOCK=pairs_block, PASS_BLOCK=pass_block, SEQUENCES_BLOCK=_SEQUENCES_BLOCK,
        num_warps=4 if heads_block * widest <= 1024 else 8)
    return output


def rope_fwd(input: Tensor, freqs: Tensor, tensor_format: str, interleaved: bool, cu_seqlens,
             start_positions) -> Tensor:
    return _rope(input, freqs, tensor_format, interleaved, cu_seqlens, start_positions, backward=False)


def rope_bwd(grad_output: Tensor, freqs: Tensor, tensor_format: str, interleaved: bool, cu_seqlens,
             start_positions) -> Tensor:
    return _rope(grad_output, freqs, tensor_format, interleaved, cu_seqlens, start_positions, backward=True)

"""The attention-softmax ops (scaled_softmax_fwd / scaled_softmax_bwd) in Triton, with the ops'
signatures and numerics (reference/softmax.py): z = scale * input in float32 whatever the
input dtype (fp32, bf16, fp16), 'padding' sets masked logits to -10000 (a fully masked row
comes out uniform, 1/sk), 'causal' and 'causal_bottom_right' drop the keys j > i + offset
(offset 0, or sk - sq) to exactly 0, and a row left with no key is all 0. Outputs rounded once.

A program takes a [rows, sk] tile, a whole row per register block: the row max, the
exponentials and their sum stay in registers, so the input is read once and the output
written once. The padding mask is read through its broadcast strides (stride 0 along a
broadcast dimension), never materialised. Backward: dx = scale * y * (dy - sum(dy * y)),
0 at masked and dropped keys.

Rows are at most MAX_KEYS long; the launchers are called only for what supports() accepts,
the reference serves the rest (float64, longer rows).
"""
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

MAX_KEYS = 16384  # a row of 32768 fp32 values spills registers at any warp count
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TILE_ELEMENTS = 4096  # rows per program so that a tile holds about this many elements
_MASKED_LOGIT = tl.constexpr(-10000.0)  # TE's value for a padding-masked logit


def supports(op_name: str, args: tuple) -> bool:
    """Whether the kernels run op_name(*args): fp32 / bf16 / fp16 scores, rows of at most
    MAX_KEYS keys. args[0] is the forward's input, args[1] the backward's output."""
    scores = args[0] if op_name == "scaled_softmax_fwd" else args[1]
    return scores.dtype in _DTYPES and scores.shape[-1] <= MAX_KEYS


@triton.jit
def _row_tile(MASK, n_rows, sq, sk, heads, causal_offset, mask_stride_b, mask_stride_h, mask_stride_q,
              PADDING: tl.constexpr, CAUSAL: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """This program's ROWS rows of the flattened [batch * heads * sq, sk] scores: (element
    offsets, in-bounds mask, keys that reach the output, padding-masked keys), each [ROWS, BLOCK]."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    in_tile = (rows < n_rows)[:, None] & (cols < sk)[None, :]
    offsets = rows[:, None].to(tl.int64) * sk + cols[None, :]
    query = rows % sq
    kept = in_tile
    if CAUSAL:
        kept = kept & (cols[None, :] <= (query + causal_offset)[:, None])
    if PADDING:
        batch_head = rows // sq
        mask_row = ((batch_head // heads).to(tl.int64) * mask_stride_b
                    + (batch_head % heads).to(tl.int64) * mask_stride_h + query.to(tl.int64) * mask_stride_q)
        masked = tl.load(MASK + mask_row[:, None] + cols[None, :], mask=in_tile, other=0) != 0
    else:
        masked = tl.zeros_like(in_tile)
    return offsets, in_tile, kept, masked


@triton.jit
def _softmax_fwd_kernel(X, MASK, Y, n_rows, sq, sk, heads, causal_offset, mask_stride_b, mask_stride_h,
                        mask_stride_q, scale, PADDING: tl.constexpr, CAUSAL: tl.constexpr, BLOCK: tl.constexpr,
                        ROWS: tl.constexpr):
    offsets, in_tile, kept, masked = _row_tile(MASK, n_rows, sq, sk, heads, causal_offset, mask_stride_b,
                                               mask_stride_h, mask_stride_q, PADDING, CAUSAL, BLOCK, ROWS)
    z = tl.load(X + offsets, mask=in_tile, other=0.0).to(tl.float32) * scale
    if PADDING:
        z = tl.where(masked, _MASKED_LOGIT, z)
    z = tl.where(kept, z, float("-inf"))
    peak = tl.max(z, axis=1)
    # Dropped keys (and lanes past the row) count 0: exp(-inf - peak) is NaN in a row with no key.
    # A NaN or +inf score makes its row's sum, and so the row, NaN (as the reference).
    e = tl.where(kept, tl.exp(z - peak[:, None]), 0.0)
    inverse_sum = 1.0 / tl.sum(e, axis=1)
    y = tl.where(kept, e * inverse_sum[:, None], 0.0)  # a row with no key: 0, not 0 * inf
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=in_tile)


@triton.jit
def _softmax_bwd_kernel(DY, Y, MASK, DX, n_rows, sq, sk, heads, causal_offset, mask_stride_b, mask_stride_h,
                        mask_stride_q, scale, PADDING: tl.constexpr, CAUSAL: tl.constexpr, BLOCK: tl.constexpr,
                        ROWS: tl.constexpr):
    offsets, in_tile, kept, masked = _row_tile(MASK, n_rows, sq, sk, heads, causal_offset, mask_stride_b,
                                               mask_stride_h, mask_stride_q, PADDING, CAUSAL, BLOCK, ROWS)
    y = tl.load(Y + offsets, mask=in_tile, other=0.0).to(tl.float32)
    dy = tl.load(DY + offsets, mask=in_tile, other=0.0).to(tl.float32)
    # The sum runs over every key, masked ones included (a fully masked row's y is 1/sk).
    dot = tl.sum(dy * y, axis=1)
    dx = (scale * y) * (dy - dot[:, None])
    dx = tl.where(kept & ~masked, dx, 0.0)
    tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=in_tile)


def _tile(sk: int) -> Tuple[int, int, int]:
    """(register block for a row, rows per program, warps): up to 32 fp32 values of a row per
    thread, 16 for the longest rows (16384 keys spill registers on 16 warps, not on 32)."""
    block = triton.next_power_of_2(sk)
    warps = 4 if block <= 2048 else 8 if block <= 8192 else 32
    return block, max(1, min(16, _TILE_ELEMENTS // block)), warps


def _launch(kernel, inputs: tuple, output: Tensor, mask: Optional[Tensor], scale: float, mask_type: str) -> None:
    """Runs kernel(*inputs, MASK, output, <sizes, mask strides, scale>) over the rows of the
    scores [b, h, sq, sk] or [b*h, sq, sk] (contiguous, not empty; output has their shape)."""
    sq, sk = output.shape[-2:]
    heads = output.shape[1] if output.dim() == 4 else 1
    rows = output.numel() // sk
    strides = (0, 0, 0)
    if mask is None:
        mask = output  # never read: PADDING is off
    else:
        if mask.stride(-1) != 1:
            mask = mask.contiguous()
        # [b|1, h|1, sq|1, sk] -> [b, h, sq, sk] with stride 0 along the broadcast dimensions.
        mask = mask.expand(output.shape).view(torch.uint8)
        strides = mask.stride()[:3]
    block, tile_rows, warps = _tile(sk)
    kernel[(triton.cdiv(rows, tile_rows),)](
        *inputs, mask, output, rows, sq, sk, heads, sk - sq if mask_type == "causal_bottom_right" else 0, *strides,
        scale, PADDING=mask_type == "padding", CAUSAL=mask_type in ("causal", "causal_bottom_right"), BLOCK=block,
        ROWS=tile_rows, num_warps=warps)


def scaled_softmax_fwd(input: Tensor, mask: Optional[Tensor], scale: float, mask_type: str) -> Tensor:
    x = input.contiguous()
    output = torch.empty_like(x)
    if x.numel():
        _launch(_softmax_fwd_kernel, (x,), output, mask, scale, mask_type)
    return output


def scaled_softmax_bwd(grad_output: Tensor, output: Tensor, mask: Optional[Tensor], scale: float,
                       mask_type: str) -> Tensor:
    y, dy = output.contiguous(), grad_output.contiguous()
    grad_input = torch.empty_like(y)
    if y.numel():
        _launch(_softmax_bwd_kernel, (dy, y), grad_input, mask, scale, mask_type)
    return grad_input

"""The activations in Triton, with the ops' signatures and numerics (reference/activation.py and
the CPU kernels' activation_math.h): bias added to input in float32, the activation and its
derivative in float32, one rounding to the output dtype. Each activation is its own compiled
variant: FN (the function of x, or of a gated input's a half) and GATED are constexpr.

Layout: input is [rows, in_cols]; the output (and grad_output) [rows, out_cols], out_cols =
in_cols / 2 for a gated activation, whose b element lies out_cols after its a element. A
program covers a [ROWS, BLOCK_COLS] tile of the output (so a row of any length spans several
programs), on a 1-D grid that enumerates (row group, column block) pairs. A plain activation
without bias needs no rows and runs as one flat row, as the CPU kernels do.

activation_fp8 rounds the activation to input's dtype (activation_fwd's output) before
scaling, so its codes are those of fp8_quantize(activation_fwd(...)); each program writes the
max |y| of its tile (NaN skipped, inf counted) and the partials are reduced afterwards.
The bias gradient: a program walks a fixed run of row tiles of one column block, accumulating
the unrounded float32 gradient; its partial row is summed with the others' in a second,
fixed-order reduction, so the result is deterministic.

Inputs are fp32, bf16 or fp16 (the ops' checks refuse the rest); the launchers are called only
for what supports() accepts.
"""
import math
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..reference.activation import GATE_OF, GATED, output_shape
from ._device import fp8_runs, resident_programs
from ._fp8 import amax_of_partials, magnitude, saturate

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TILE_ELEMENTS = 4096  # output elements per program (per loop step in the backward)
_DBIAS_BLOCK_COLS = 1024  # narrower column blocks with a bias gradient: fewer row partials per column

# FN: the function applied to x (plain) or to the a half (gated).
GELU = tl.constexpr(0)
QGELU = tl.constexpr(1)
RELU = tl.constexpr(2)
SRELU = tl.constexpr(3)
SILU = tl.constexpr(4)
SIGMOID = tl.constexpr(5)
CLAMPED_SILU = tl.constexpr(6)
_FUNCTIONS = {"gelu": GELU, "qgelu": QGELU, "relu": RELU, "srelu": SRELU, "silu": SILU, "sigmoid": SIGMOID,
              "clamped_silu": CLAMPED_SILU}

_TWO_SQRT_2_OVER_PI = tl.constexpr(2.0 * math.sqrt(2.0 / math.pi))
_GELU_CUBIC = tl.constexpr(0.044715)
_GELU_CUBIC_SLOPE = tl.constexpr(3 * 0.044715)  # of du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
_QGELU_ALPHA = tl.constexpr(1.702)
# In Triton 3.9's interpreter `constant * tensor` fails where `tensor * constant` works: the
# kernels put these constants on the right.

# Position of input in each op's arguments.
_INPUT_AT = {"activation_fwd": 0, "activation_bwd": 1, "activation_bwd_dbias": 1, "activation_fp8": 0}


def supports(op_name: str, args: tuple) -> bool:
    """Whether the kernels run op_name(*args): an fp32, bf16 or fp16 input, and for
    activation_fp8 an FP8 format the device converts."""
    input = args[_INPUT_AT[op_name]]
    if op_name == "activation_fp8" and not fp8_runs(input.device, args[6]):
        return False
    return input.dtype in _DTYPES


@triton.jit
def _sigmoid(x):
    """1 / (1 + e^-x): 0 far left (e^-x = inf), 1 far right, NaN for NaN. (tl.sigmoid is the
    same formula but fails in the interpreter of Triton 3.9.)"""
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _value_and_derivative(x, FN: tl.constexpr, limit, alpha):
    """(f(x), f'(x)) in float32. The forward uses only the value: the compiler drops the rest."""
    if FN == GELU:
        # 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): no cancellation
        # in 1 + tanh(u) for very negative x. d/dx = s + x s (1 - s) 2 du/dx.
        s = _sigmoid(x * _TWO_SQRT_2_OVER_PI * (x * x * _GELU_CUBIC + 1.0))
        two_du_dx = (x * x * _GELU_CUBIC_SLOPE + 1.0) * _TWO_SQRT_2_OVER_PI
        value = x * s
        derivative = x * s * (1.0 - s) * two_du_dx + s
    elif FN == RELU:
        # x < 0 is false for NaN: a NaN stays NaN (tl.maximum may drop it on the GPU).
        value = tl.where(x < 0.0, 0.0, x)
        derivative = tl.where(x > 0.0, 1.0, 0.0)
    elif FN == SRELU:
        r = tl.where(x < 0.0, 0.0, x)
        value = r * r
        derivative = r + r
    elif FN == SIGMOID:
        value = _sigmoid(x)
        derivative = value * (1.0 - value)
    else:
        # x sigmoid(slope x), d/dx = s (1 + slope x (1 - s)); clamped_silu at min(x, limit), with
        # no gradient above the limit.
        if FN == QGELU:
            slope = _QGELU_ALPHA
            clamped = x
        elif FN == SILU:
            slope = 1.0
            clamped = x
        else:
            slope = alpha
            clamped = tl.where(x > limit, limit, x)
        s = _sigmoid(clamped * slope)
        value = clamped * s
        derivative = s * (clamped * slope * (1.0 - s) + 1.0)
        if FN == CLAMPED_SILU:
            derivative = tl.where(x > limit, 0.0, derivative)
    return value, derivative


@triton.jit
def _linear_value_and_derivative(b, CLAMPED: tl.constexpr, limit):
    """The b half's factor of a gated activation and its derivative: b, or clamped_swiglu's
    clamp(b, -limit, limit) + 1 with no gradient outside the clamp."""
    if CLAMPED:
        value = tl.where(b > limit, limit, tl.where(b < -limit, -limit, b)) + 1.0
        derivative = tl.where((b > limit) | (b < -limit), 0.0, 1.0)
    else:
        value = b
        derivative = tl.full(b.shape, 1.0, tl.float32)
    return value, derivative


@triton.jit
def _load_bias(BIAS, cols, col_ok):
    """A [1, BLOCK_COLS] row of bias in float32."""
    return tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]


@triton.jit
def _activation_fwd_kernel(X, BIAS, Y, SCALE, AMAX_PARTIAL, n_rows, in_cols, out_cols, limit, alpha,
                           FN: tl.constexpr, GATED: tl.constexpr, HAS_BIAS: tl.constexpr, TO_FP8: tl.constexpr,
                           ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """Y [n_rows, out_cols] = act(X + BIAS), or its FP8 codes saturate(y * SCALE) with this
    program's max |y| in AMAX_PARTIAL[program]."""
    program = tl.program_id(0)
    col_blocks = tl.cdiv(out_cols, BLOCK_COLS)
    rows = (program // col_blocks).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = (program % col_blocks).to(tl.int64) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_ok = cols < out_cols
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    a_offsets = rows[:, None] * in_cols + cols[None, :]
    a = tl.load(X + a_offsets, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        a = a + _load_bias(BIAS, cols, col_ok)
    y, _ = _value_and_derivative(a, FN, limit, alpha)
    if GATED:
        b = tl.load(X + out_cols + a_offsets, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            b = b + _load_bias(BIAS + out_cols, cols, col_ok)
        linear, _ = _linear_value_and_derivative(b, FN == CLAMPED_SILU, limit)
        y = y * linear
    y_offsets = rows[:, None] * out_cols + cols[None, :]
    if TO_FP8:
        if Y.dtype.element_ty == tl.float8e4nv:
            fp8_max = 448.0
        else:
            fp8_max = 57344.0
        y = y.to(X.dtype.element_ty).to(tl.float32)  # rounded as activation_fwd's output is
        tl.store(Y + y_offsets, saturate(y * tl.load(SCALE), fp8_max).to(Y.dtype.element_ty), mask=mask)
        tile_amax = tl.max(tl.max(tl.where(mask, magnitude(y), 0.0), axis=1), axis=0)
        tl.store(AMAX_PARTIAL + program, tile_amax)
    else:
        tl.store(Y + y_offsets, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _activation_bwd_kernel(DY, X, BIAS, DX, DBIAS_PARTIAL, n_rows, in_cols, out_cols, limit, alpha,
                           tiles_per_program, FN: tl.constexpr, GATED: tl.constexpr, HAS_BIAS: tl.constexpr,
                           WITH_DBIAS: tl.constexpr, ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """DX [n_rows, in_cols] = DY * act'(X + BIAS) (both halves' gradients for a gated act) over
    tiles_per_program consecutive row tiles of one column block; with WITH_DBIAS, the sum of
    this program's (unrounded) DX rows in DBIAS_PARTIAL[row group, :]."""
    program = tl.program_id(0)
    col_blocks = tl.cdiv(out_cols, BLOCK_COLS)
    row_group = program // col_blocks
    cols = (program % col_blocks).to(tl.int64) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_ok = cols < out_cols
    if HAS_BIAS:
        bias_a = _load_bias(BIAS, cols, col_ok)
        if GATED:
            bias_b = _load_bias(BIAS + out_cols, cols, col_ok)
    dbias_a = tl.zeros([ROWS, BLOCK_COLS], dtype=tl.float32)
    dbias_b = tl.zeros([ROWS, BLOCK_COLS], dtype=tl.float32)
    for i in range(0, tiles_per_program):
        rows = (row_group * tiles_per_program + i).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        mask = (rows < n_rows)[:, None] & col_ok[None, :]
        a_offsets = rows[:, None] * in_cols + cols[None, :]
        dy = tl.load(DY + rows[:, None] * out_cols + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        a = tl.load(X + a_offsets, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            a = a + bias_a
        gate, d_gate = _value_and_derivative(a, FN, limit, alpha)
        if GATED:
            b = tl.load(X + out_cols + a_offsets, mask=mask, other=0.0).to(tl.float32)
            if HAS_BIAS:
                b = b + bias_b
            linear, d_linear = _linear_value_and_derivative(b, FN == CLAMPED_SILU, limit)
            grad_a = dy * linear * d_gate
            grad_b = dy * gate * d_linear
            tl.store(DX + out_cols + a_offsets, grad_b.to(DX.dtype.element_ty), mask=mask)
            if WITH_DBIAS:
                dbias_b += tl.where(mask, grad_b, 0.0)
        else:
            grad_a = dy * d_gate
        tl.store(DX + a_offsets, grad_a.to(DX.dtype.element_ty), mask=mask)
        if WITH_DBIAS:
            # Masked elements see a bias alone, whose derivative may be NaN: keep them out.
            dbias_a += tl.where(mask, grad_a, 0.0)
    if WITH_DBIAS:
        partial = DBIAS_PARTIAL + row_group.to(tl.int64) * in_cols
        tl.store(partial + cols, tl.sum(dbias_a, axis=0), mask=col_ok)
        if GATED:
            tl.store(partial + out_cols + cols, tl.sum(dbias_b, axis=0), mask=col_ok)


def _kind(activation: str) -> Tuple[int, bool]:
    """(FN, GATED) of an activation's name."""
    return _FUNCTIONS[GATE_OF.get(activation, activation)].value, activation in GATED


def _layout(input: Tensor, activation: str, flat: bool) -> Tuple[int, int, int]:
    """(rows, in_cols, out_cols) of input seen as [rows, in_cols]; flat: one row of every element."""
    in_cols = input.shape[-1]
    if flat:
        return 1, input.numel(), input.numel()
    rows = input.numel() // in_cols if in_cols else 0
    return rows, in_cols, in_cols // 2 if activation in GATED else in_cols


def _tile(rows: int, out_cols: int, max_block_cols: int = _TILE_ELEMENTS) -> Tuple[int, int, int]:
    """(ROWS, BLOCK_COLS, warps): a tile of about _TILE_ELEMENTS output elements, as wide as the
    row allows (coalesced rows), as many rows as fill it."""
    block_cols = min(triton.next_power_of_2(out_cols), max_block_cols)
    tile_rows = min(triton.next_power_of_2(rows), max(1, _TILE_ELEMENTS // block_cols))
    return tile_rows, block_cols, 8 if tile_rows * block_cols >= 4096 else 4


def _forward(input: Tensor, bias: Optional[Tensor], activation: str, limit: float, alpha: float, output: Tensor,
             scale: Optional[Tensor]) -> Optional[Tensor]:
    """Writes act(input + bias) into output (its FP8 codes when scale is given, returning the
    amax partials)."""
    fn, gated = _kind(activation)
    rows, in_cols, out_cols = _layout(input, activation, flat=not gated and bias is None)
    if output.numel() == 0:
        return None
    tile_rows, block_cols, warps = _tile(rows, out_cols)
    programs = triton.cdiv(rows, tile_rows) * triton.cdiv(out_cols, block_cols)
    amax_partial = torch.empty(programs, dtype=torch.float32, device=input.device) if scale is not None else None
    _activation_fwd_kernel[(programs,)](
        input, bias if bias is not None else input, output, scale if scale is not None else input,
        amax_partial if amax_partial is not None else output, rows, in_cols, out_cols, limit, alpha, FN=fn,
        GATED=gated, HAS_BIAS=bias is not None, TO_FP8=scale is not None, ROWS=tile_rows, BLOCK_COLS=block_cols,
        num_warps=warps)
    return amax_partial


def _row_groups(device: torch.device, row_tiles: int, col_blocks: int) -> int:
    """Programs per column block with a bias gradient (each keeps one partial row), so that all
    column blocks together fill the GPU."""
    return max(1, min(row_tiles, resident_programs(device) // col_blocks))


def _backward(grad_output: Tensor, input: Tensor, bias: Optional[Tensor], activation: str, limit: float,
              alpha: float, with_dbias: bool) -> Tuple[Tensor, Optional[Tensor]]:
    fn, gated = _kind(activation)
    x, dy = input.contiguous(), grad_output.contiguous()
    bias = bias.contiguous() if bias is not None else None
    rows, in_cols, out_cols = _layout(x, activation, flat=not gated and bias is None)
    grad_input = torch.empty_like(x)
    if x.numel() == 0:
        return grad_input, torch.zeros_like(bias) if with_dbias else None
    tile_rows, block_cols, warps = _tile(rows, out_cols, _DBIAS_BLOCK_COLS if with_dbias else _TILE_ELEMENTS)
    row_tiles, col_blocks = triton.cdiv(rows, tile_rows), triton.cdiv(out_cols, block_cols)
    row_groups = _row_groups(x.device, row_tiles, col_blocks) if with_dbias else row_tiles
    tiles_per_program = triton.cdiv(row_tiles, row_groups)
    row_groups = triton.cdiv(row_tiles, tiles_per_program)
    dbias_partial = (torch.empty(row_groups, in_cols, dtype=torch.float32, device=x.device) if with_dbias
                     else grad_input)  # never written without a bias gradient
    _activation_bwd_kernel[(row_groups * col_blocks,)](
        dy, x, bias if bias is not None else x, grad_input, dbias_partial, rows, in_cols, out_cols, limit, alpha,
        tiles_per_program, FN=fn, GATED=gated, HAS_BIAS=bias is not None, WITH_DBIAS=with_dbias, ROWS=tile_rows,
        BLOCK_COLS=block_cols, num_warps=warps)
    # The second reduction: [row_groups, in_cols] partials, summed in a fixed order.
    return grad_input, dbias_partial.sum(dim=0).to(bias.dtype) if with_dbias else None


def activation_fwd(input: Tensor, bias: Optional[Tensor], activation: str, limit: float, alpha: float) -> Tensor:
    x = input.contiguous()
    output = torch.empty(output_shape(x, activation), dtype=x.dtype, device=x.device)
    _forward(x, bias.contiguous() if bias is not None else None, activation, limit, alpha, output, None)
    return output


def activation_bwd(grad_output: Tensor, input: Tensor, bias: Optional[Tensor], activation: str, limit: float,
                   alpha: float) -> Tensor:
    return _backward(grad_output, input, bias, activation, limit, alpha, with_dbias=False)[0]


def activation_bwd_dbias(grad_output: Tensor, input: Tensor, bias: Tensor, activation: str, limit: float,
                         alpha: float) -> Tuple[Tensor, Tensor]:
    return _backward(grad_output, input, bias, activation, limit, alpha, with_dbias=True)


def activation_fp8(input: Tensor, bias: Optional[Tensor], activation: str, limit: float, alpha: float, scale: Tensor,
                   fp8_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    x = input.contiguous()
    data = torch.empty(output_shape(x, activation), dtype=fp8_dtype, device=x.device)
    amax_partial = _forward(x, bias.contiguous() if bias is not None else None, activation, limit, alpha, data,
                            scale)
    if amax_partial is None:  # no elements, no programs
        return data, torch.zeros((), dtype=torch.float32, device=x.device)
    return data, amax_of_partials(amax_partial)

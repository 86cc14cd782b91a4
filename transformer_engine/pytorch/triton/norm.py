"""LayerNorm / RMSNorm forward and backward in Triton, with the ops' signatures and numerics
(reference/norm.py): statistics and arithmetic in float32 whatever the input dtype (fp32,
bf16, fp16), gamma = 1 + weight under zero_centered_gamma, outputs rounded once. The same
two kernels serve the fused forms: a residual added first (sum = input + residual, rounded to
input's dtype and normalised; its backward adds grad_sum before the one rounding), and the
output cast to FP8 (codes of the rounded output times the scale, saturated; amax over the
rounded output from per-program partials), with or without the high-precision output.

Forward: a program normalises a [rows, hidden] tile, a whole row per register block. A row
whose float32 variance overflows (finite values beyond ~1.8e19, whose squares pass FLT_MAX)
takes its statistics from the row divided by its largest deviation, which cannot overflow;
rows holding an inf or a NaN keep their non-finite statistics, as the CPU kernels do.
Backward: a program walks a fixed run of rows, writes their input gradients and accumulates
its own partial weight (and bias) gradients in float32; the partials are summed in a second,
fixed-order reduction, so the parameter gradients are deterministic.

The hidden size is at most MAX_HIDDEN (one register block per row), the input and weight
fp32, bf16 or fp16; the launchers are called only for what supports() accepts, the reference
serves the rest (float64, larger rows).
"""
from typing import NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._device import fp8_runs, resident_programs
from ._fp8 import amax_of_partials, fp8_max, magnitude, saturate

MAX_HIDDEN = 65536
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TILE_ELEMENTS = 4096  # forward: rows per program so that a tile holds about this many elements


# Positions of (input, weight) in each op's arguments.
_INPUT_AND_WEIGHT = {"layernorm_fwd": (0, 1), "rmsnorm_fwd": (0, 1), "layernorm_bwd": (1, 4), "rmsnorm_bwd": (1, 3),
                     "add_layernorm_fwd": (0, 2), "add_rmsnorm_fwd": (0, 2), "add_layernorm_bwd": (2, 5),
                     "add_rmsnorm_bwd": (2, 4), "layernorm_fp8_fwd": (0, 1), "rmsnorm_fp8_fwd": (0, 1)}


# Position of fp8_dtype in the norm -> FP8 ops' arguments.
_FP8_DTYPE_AT = {"layernorm_fp8_fwd": 4, "rmsnorm_fp8_fwd": 3}


def supports(op_name: str, args: tuple) -> bool:
    """Whether the kernels run op_name(*args): fp32 / bf16 / fp16 input and weight, hidden size
    up to MAX_HIDDEN, an FP8 output in a format the device converts."""
    input, weight = (args[i] for i in _INPUT_AND_WEIGHT[op_name])
    if op_name in _FP8_DTYPE_AT and not fp8_runs(input.device, args[_FP8_DTYPE_AT[op_name]]):
        return False
    return input.dtype in _DTYPES and weight.dtype in _DTYPES and 0 < input.shape[-1] <= MAX_HIDDEN


@triton.jit
def _norm_fwd_kernel(X, R, W, B, Y, SUM, MEAN, RSTD, SCALE, Y_FP8, AMAX_PARTIAL, n_rows, n_cols, eps,
                     CENTERED: tl.constexpr, ZERO_CENTERED_GAMMA: tl.constexpr, HAS_BIAS: tl.constexpr,
                     HAS_RESIDUAL: tl.constexpr, WRITE_OUTPUT: tl.constexpr, FP8_MAX: tl.constexpr,
                     BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """FP8_MAX 0: no FP8 output (Y_FP8, SCALE and AMAX_PARTIAL unused). Without WRITE_OUTPUT, Y
    only gives the output's dtype (the FP8 codes are of the output rounded to it)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    offsets = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        summed = (x + tl.load(R + offsets, mask=mask, other=0.0).to(tl.float32)).to(SUM.dtype.element_ty)
        tl.store(SUM + offsets, summed, mask=mask)
        x = summed.to(tl.float32)  # the statistics are of the rounded sum, as the next layer sees it
    if CENTERED:
        mean = tl.sum(x, axis=1) / n_cols
        deviation = tl.where(mask, x - mean[:, None], 0.0)
    else:
        mean = tl.zeros([ROWS], dtype=tl.float32)
        deviation = x
    variance = tl.sum(deviation * deviation, axis=1) / n_cols
    rstd = 1.0 / tl.sqrt(variance + eps)
    # Overflowed rows: var(d) = peak^2 var(d / peak), so rstd = (1 / peak) / sqrt(var(d / peak) + eps / peak^2).
    peak = tl.max(tl.abs(deviation), axis=1)
    overflowed = (variance == float("inf")) & (peak < float("inf"))
    peak = tl.where(overflowed, peak, 1.0)
    scaled = deviation * (1.0 / peak)[:, None]  # one division per row; the scaled variance needs no exactness
    scaled_variance = tl.sum(scaled * scaled, axis=1) / n_cols
    rstd = tl.where(overflowed, (1.0 / peak) / tl.sqrt(scaled_variance + eps / (peak * peak)), rstd)

    gamma = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    if ZERO_CENTERED_GAMMA:
        gamma = gamma + 1.0
    y = deviation * rstd[:, None] * gamma[None, :]
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    output = y.to(Y.dtype.element_ty)
    if WRITE_OUTPUT:
        tl.store(Y + offsets, output, mask=mask)
    if FP8_MAX > 0:
        rounded = output.to(tl.float32)
        codes = saturate(rounded * tl.load(SCALE), FP8_MAX).to(Y_FP8.dtype.element_ty)
        tl.store(Y_FP8 + offsets, codes, mask=mask)
        # Rows past the end hold the bias: they must not raise the amax.
        tile_amax = tl.max(tl.max(tl.where(mask, magnitude(rounded), 0.0), axis=1), axis=0)
        tl.store(AMAX_PARTIAL + tl.program_id(0), tile_amax)
    tl.store(MEAN + rows, mean, mask=row_ok)
    tl.store(RSTD + rows, rstd, mask=row_ok)


@triton.jit
def _norm_bwd_kernel(DY, DSUM, X, MEAN, RSTD, W, DX, DW_PARTIAL, DB_PARTIAL, n_rows, n_cols, rows_per_program,
                     CENTERED: tl.constexpr, ZERO_CENTERED_GAMMA: tl.constexpr, HAS_DSUM: tl.constexpr,
                     BLOCK: tl.constexpr):
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    col_ok = cols < n_cols
    gamma = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    if ZERO_CENTERED_GAMMA:
        gamma = gamma + 1.0
    dweight = tl.zeros([BLOCK], dtype=tl.float32)
    dbias = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, rows_per_program):
        row = program * rows_per_program + i
        mask = col_ok & (tl.full([BLOCK], row, tl.int32) < n_rows)
        offsets = row.to(tl.int64) * n_cols + cols
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
        # Past the last row (the last program's run) dy and x are 0: any row's statistics do.
        stats_row = tl.minimum(row, n_rows - 1)
        rstd = tl.load(RSTD + stats_row)
        if CENTERED:
            mean = tl.load(MEAN + stats_row)
            xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        else:
            xhat = x * rstd
        gdy = dy * gamma
        # dx = rstd (g dy - mean(g dy) - xhat mean(g dy xhat)); RMSNorm has no mean(g dy) term.
        dx = gdy - xhat * (tl.sum(gdy * xhat, axis=0) / n_cols)
        if CENTERED:
            dx = dx - tl.sum(gdy, axis=0) / n_cols
        dx = rstd * dx
        if HAS_DSUM:  # a residual add's other uses of its sum
            dx = dx + tl.load(DSUM + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)
        dweight += dy * xhat
        dbias += dy
    tl.store(DW_PARTIAL + program.to(tl.int64) * n_cols + cols, dweight, mask=col_ok)
    if CENTERED:
        tl.store(DB_PARTIAL + program.to(tl.int64) * n_cols + cols, dbias, mask=col_ok)


def _block(n_cols: int) -> Tuple[int, int]:
    """(register block for a row, warps)."""
    block = triton.next_power_of_2(n_cols)
    return block, 4 if block <= 2048 else 8 if block <= 8192 else 16


class _Forward(NamedTuple):
    output: Tensor  # input's shape, or an empty [0] placeholder when not asked for
    sum: Optional[Tensor]  # input + residual, with a residual
    mean: Tensor
    rstd: Tensor
    fp8_data: Optional[Tensor]  # with an FP8 output
    amax: Optional[Tensor]


def _forward(input: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float, zero_centered_gamma: bool,
             centered: bool, residual: Optional[Tensor] = None, scale: Optional[Tensor] = None,
             fp8_dtype: Optional[torch.dtype] = None, return_output: bool = True) -> _Forward:
    hidden = input.shape[-1]
    x = input.contiguous()
    rows = x.numel() // hidden
    device = input.device
    output = torch.empty_like(x) if return_output else x.new_empty(0)
    sum = torch.empty_like(x) if residual is not None else None
    mean = torch.empty(input.shape[:-1], dtype=torch.float32, device=device)
    rstd = torch.empty_like(mean)
    fp8_data = torch.empty(x.shape, dtype=fp8_dtype, device=device) if fp8_dtype is not None else None
    block, warps = _block(hidden)
    tile_rows = max(1, min(16, _TILE_ELEMENTS // block))
    programs = triton.cdiv(rows, tile_rows)
    amax_partial = torch.empty(programs, dtype=torch.float32, device=device) if fp8_dtype is not None else None
    if rows:
        # Pointers a variant does not use get a tensor of the right dtype that it never touches.
        _norm_fwd_kernel[(programs,)](
            x, residual.contiguous() if residual is not None else x, weight.contiguous(),
            bias.contiguous() if bias is not None else weight, output if return_output else x,
            sum if sum is not None else x, mean, rstd, scale.contiguous() if scale is not None else mean,
            fp8_data if fp8_data is not None else x, amax_partial if amax_partial is not None else mean, rows, hidden,
            eps, CENTERED=centered, ZERO_CENTERED_GAMMA=zero_centered_gamma, HAS_BIAS=bias is not None,
            HAS_RESIDUAL=residual is not None,
            WRITE_OUTPUT=return_output, FP8_MAX=fp8_max(fp8_dtype) if fp8_dtype is not None else 0.0, BLOCK=block,
            ROWS=tile_rows, num_warps=warps)
    amax = amax_of_partials(amax_partial) if amax_partial is not None else None
    return _Forward(output, sum, mean, rstd, fp8_data, amax)


def _backward(grad_output: Tensor, input: Tensor, mean: Optional[Tensor], rstd: Tensor, weight: Tensor,
              zero_centered_gamma: bool, grad_sum: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    hidden = input.shape[-1]
    x, dy = input.contiguous(), grad_output.contiguous()
    rows = x.numel() // hidden
    grad_input = torch.empty_like(x)
    centered = mean is not None
    if not rows:  # grad_sum is empty too
        zeros = torch.zeros(hidden, dtype=weight.dtype, device=weight.device)
        return grad_input, zeros, zeros.clone() if centered else None
    programs = min(rows, resident_programs(input.device))  # each keeps one partial row of parameter gradients
    rows_per_program = triton.cdiv(rows, programs)
    programs = triton.cdiv(rows, rows_per_program)
    dweight_partial = torch.empty(programs, hidden, dtype=torch.float32, device=input.device)
    dbias_partial = torch.empty_like(dweight_partial) if centered else dweight_partial  # RMSNorm: never written
    block, warps = _block(hidden)
    _norm_bwd_kernel[(programs,)](
        dy, grad_sum.contiguous() if grad_sum is not None else dy, x, mean.contiguous() if centered else rstd,
        rstd.contiguous(), weight.contiguous(), grad_input, dweight_partial, dbias_partial, rows, hidden,
        rows_per_program, CENTERED=centered, ZERO_CENTERED_GAMMA=zero_centered_gamma, HAS_DSUM=grad_sum is not None,
        BLOCK=block, num_warps=warps)
    # The second reduction: [programs, hidden] partials, summed in a fixed order.
    dweight = dweight_partial.sum(dim=0).to(weight.dtype)
    return grad_input, dweight, dbias_partial.sum(dim=0).to(weight.dtype) if centered else None


def layernorm_fwd(input: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float,
                  zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor]:
    out = _forward(input, weight, bias, eps, zero_centered_gamma, centered=True)
    return out.output, out.mean, out.rstd


def layernorm_bwd(grad_output: Tensor, input: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor,
                  zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return _backward(grad_output, input, mean, rstd, weight, zero_centered_gamma)


def rmsnorm_fwd(input: Tensor, weight: Tensor, eps: float, zero_centered_gamma: bool) -> Tuple[Tensor, Tensor]:
    out = _forward(input, weight, None, eps, zero_centered_gamma, centered=False)
    return out.output, out.rstd


def rmsnorm_bwd(grad_output: Tensor, input: Tensor, rstd: Tensor, weight: Tensor,
                zero_centered_gamma: bool) -> Tuple[Tensor, Tensor]:
    grad_input, dweight, _ = _backward(grad_output, input, None, rstd, weight, zero_centered_gamma)
    return grad_input, dweight


def add_layernorm_fwd(input: Tensor, residual: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float,
                      zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    out = _forward(input, weight, bias, eps, zero_centered_gamma, centered=True, residual=residual)
    return out.output, out.sum, out.mean, out.rstd


def add_layernorm_bwd(grad_output: Tensor, grad_sum: Tensor, sum: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor,
                      zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return _backward(grad_output, sum, mean, rstd, weight, zero_centered_gamma, grad_sum=grad_sum)


def add_rmsnorm_fwd(input: Tensor, residual: Tensor, weight: Tensor, eps: float,
                    zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor]:
    out = _forward(input, weight, None, eps, zero_centered_gamma, centered=False, residual=residual)
    return out.output, out.sum, out.rstd


def add_rmsnorm_bwd(grad_output: Tensor, grad_sum: Tensor, sum: Tensor, rstd: Tensor, weight: Tensor,
                    zero_centered_gamma: bool) -> Tuple[Tensor, Tensor]:
    grad_input, dweight, _ = _backward(grad_output, sum, None, rstd, weight, zero_centered_gamma, grad_sum=grad_sum)
    return grad_input, dweight


def layernorm_fp8_fwd(input: Tensor, weight: Tensor, bias: Optional[Tensor], scale: Tensor, fp8_dtype: torch.dtype,
                      eps: float, zero_centered_gamma: bool,
                      return_output: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    out = _forward(input, weight, bias, eps, zero_centered_gamma, centered=True, scale=scale, fp8_dtype=fp8_dtype,
                   return_output=return_output)
    return out.fp8_data, out.amax, out.mean, out.rstd, out.output


def rmsnorm_fp8_fwd(input: Tensor, weight: Tensor, scale: Tensor, fp8_dtype: torch.dtype, eps: float,
                    zero_centered_gamma: bool, return_output: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    out = _forward(input, weight, None, eps, zero_centered_gamma, centered=False, scale=scale, fp8_dtype=fp8_dtype,
                   return_output=return_output)
    return out.fp8_data, out.amax, out.rstd, out.output

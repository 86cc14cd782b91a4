"""LayerNorm / RMSNorm forward and backward in Triton, with the ops' signatures and numerics
(reference/norm.py): statistics and arithmetic in float32 whatever the input dtype (fp32,
bf16, fp16), gamma = 1 + weight under zero_centered_gamma, outputs rounded once.

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
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

MAX_HIDDEN = 65536
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TILE_ELEMENTS = 4096  # forward: rows per program so that a tile holds about this many elements


# Positions of (input, weight) in each op's arguments.
_INPUT_AND_WEIGHT = {"layernorm_fwd": (0, 1), "rmsnorm_fwd": (0, 1), "layernorm_bwd": (1, 4), "rmsnorm_bwd": (1, 3)}


def supports(op_name: str, args: tuple) -> bool:
    """Whether the kernels run op_name(*args): fp32 / bf16 / fp16 input and weight, hidden size
    up to MAX_HIDDEN."""
    input, weight = (args[i] for i in _INPUT_AND_WEIGHT[op_name])
    return input.dtype in _DTYPES and weight.dtype in _DTYPES and 0 < input.shape[-1] <= MAX_HIDDEN


@triton.jit
def _norm_fwd_kernel(X, W, B, Y, MEAN, RSTD, n_rows, n_cols, eps,
                     CENTERED: tl.constexpr, ZERO_CENTERED_GAMMA: tl.constexpr, HAS_BIAS: tl.constexpr,
                     BLOCK: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    offsets = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
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
    scaled = deviation / peak[:, None]
    scaled_variance = tl.sum(scaled * scaled, axis=1) / n_cols
    rstd = tl.where(overflowed, (1.0 / peak) / tl.sqrt(scaled_variance + eps / (peak * peak)), rstd)

    gamma = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    if ZERO_CENTERED_GAMMA:
        gamma = gamma + 1.0
    y = deviation * rstd[:, None] * gamma[None, :]
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + rows, mean, mask=row_ok)
    tl.store(RSTD + rows, rstd, mask=row_ok)


@triton.jit
def _norm_bwd_kernel(DY, X, MEAN, RSTD, W, DX, DW_PARTIAL, DB_PARTIAL, n_rows, n_cols, rows_per_program,
                     CENTERED: tl.constexpr, ZERO_CENTERED_GAMMA: tl.constexpr, BLOCK: tl.constexpr):
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
        tl.store(DX + offsets, (rstd * dx).to(DX.dtype.element_ty), mask=mask)
        dweight += dy * xhat
        dbias += dy
    tl.store(DW_PARTIAL + program.to(tl.int64) * n_cols + cols, dweight, mask=col_ok)
    if CENTERED:
        tl.store(DB_PARTIAL + program.to(tl.int64) * n_cols + cols, dbias, mask=col_ok)


def _block(n_cols: int) -> Tuple[int, int]:
    """(register block for a row, warps)."""
    block = triton.next_power_of_2(n_cols)
    return block, 4 if block <= 2048 else 8 if block <= 8192 else 16


def _forward(input: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float, zero_centered_gamma: bool,
             centered: bool) -> Tuple[Tensor, Tensor, Tensor]:
    hidden = input.shape[-1]
    x = input.contiguous()
    rows = x.numel() // hidden
    output = torch.empty_like(x)
    mean = torch.empty(input.shape[:-1], dtype=torch.float32, device=input.device)
    rstd = torch.empty_like(mean)
    if rows:
        block, warps = _block(hidden)
        tile_rows = max(1, min(16, _TILE_ELEMENTS // block))
        _norm_fwd_kernel[(triton.cdiv(rows, tile_rows),)](
            x, weight.contiguous(), bias.contiguous() if bias is not None else weight, output, mean, rstd, rows,
            hidden, eps, CENTERED=centered, ZERO_CENTERED_GAMMA=zero_centered_gamma, HAS_BIAS=bias is not None,
            BLOCK=block, ROWS=tile_rows, num_warps=warps)
    return output, mean, rstd


def _programs(device: torch.device, rows: int) -> int:
    """Backward programs: a few per multiprocessor on a GPU (each keeps one partial row of
    parameter gradients), 16 elsewhere (the interpreter runs programs one by one)."""
    if device.type == "cuda":
        return min(rows, 4 * torch.cuda.get_device_properties(device).multi_processor_count)
    return min(rows, 16)


def _backward(grad_output: Tensor, input: Tensor, mean: Optional[Tensor], rstd: Tensor, weight: Tensor,
              zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    hidden = input.shape[-1]
    x, dy = input.contiguous(), grad_output.contiguous()
    rows = x.numel() // hidden
    grad_input = torch.empty_like(x)
    centered = mean is not None
    if not rows:
        zeros = torch.zeros(hidden, dtype=weight.dtype, device=weight.device)
        return grad_input, zeros, zeros.clone() if centered else None
    programs = _programs(input.device, rows)
    rows_per_program = triton.cdiv(rows, programs)
    programs = triton.cdiv(rows, rows_per_program)
    dweight_partial = torch.empty(programs, hidden, dtype=torch.float32, device=input.device)
    dbias_partial = torch.empty_like(dweight_partial) if centered else dweight_partial  # RMSNorm: never written
    block, warps = _block(hidden)
    _norm_bwd_kernel[(programs,)](
        dy, x, mean.contiguous() if centered else rstd, rstd.contiguous(), weight.contiguous(), grad_input,
        dweight_partial, dbias_partial, rows, hidden, rows_per_program, CENTERED=centered,
        ZERO_CENTERED_GAMMA=zero_centered_gamma, BLOCK=block, num_warps=warps)
    # The second reduction: [programs, hidden] partials, summed in a fixed order.
    dweight = dweight_partial.sum(dim=0).to(weight.dtype)
    return grad_input, dweight, dbias_partial.sum(dim=0).to(weight.dtype) if centered else None


def layernorm_fwd(input: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float,
                  zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return _forward(input, weight, bias, eps, zero_centered_gamma, centered=True)


def layernorm_bwd(grad_output: Tensor, input: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor,
                  zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return _backward(grad_output, input, mean, rstd, weight, zero_centered_gamma)


def rmsnorm_fwd(input: Tensor, weight: Tensor, eps: float, zero_centered_gamma: bool) -> Tuple[Tensor, Tensor]:
    output, _, rstd = _forward(input, weight, None, eps, zero_centered_gamma, centered=False)
    return output, rstd


def rmsnorm_bwd(grad_output: Tensor, input: Tensor, rstd: Tensor, weight: Tensor,
                zero_centered_gamma: bool) -> Tuple[Tensor, Tensor]:
    grad_input, dweight, _ = _backward(grad_output, input, None, rstd, weight, zero_centered_gamma)
    return grad_input, dweight

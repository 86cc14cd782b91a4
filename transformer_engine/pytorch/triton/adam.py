"""The multi-tensor Adam / AdamW step in Triton, with the op's signature and the reference's
formula and order of operations (reference/adam.py), in float32:
    g = grad * inv_grad_scale            (+ weight_decay * p   for L2 Adam)
    m = lerp(m, g, 1 - beta1);   v = v * beta2 + (1 - beta2) * g * g
    p = p * (1 - lr * weight_decay)      (AdamW)
    p = p + (-step_size * m) / (sqrt(v) / sqrt(bc2) + eps)
with PyTorch's lerp (a fused multiply-add from m, or from g when the weight is 0.5 or more),
IEEE-rounded square root and divisions, and every scalar rounded to float32 as PyTorch rounds
a Python float it multiplies a float32 tensor by. p is the float32 master when master_params
is given (the param, bf16/fp16, receives it rounded once), else the param widened.

One launch per (param dtype, grad dtype, alignment) of a param group, not one per tensor: the
tensors are cut into chunks of CHUNK elements and a small device table lists, per chunk, the
addresses of its first param, grad, moment and master element and its length; program i
updates chunk i. A chunk is walked in unmasked register blocks (vectorised loads where every
address of the group is 16-byte aligned) and one masked block for its tail. The table costs one
host-to-device copy of 48 bytes per chunk per step, asynchronous to the host.

Params, moments and masters are contiguous (the op's checks refuse others), so the kernel
updates the caller's tensors themselves; a non-contiguous grad is read from a contiguous copy.
"""
import math
import struct
from collections import defaultdict
from typing import List

import torch
import triton
import triton.language as tl
from torch import Tensor

CHUNK = 16384  # elements a program updates
_BLOCK = 2048  # elements per register block: 16 per thread of 4 warps
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TRITON_TYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def supports(op_name: str, args: tuple) -> bool:
    """Whether the kernel runs the step: fp32 / bf16 / fp16 params and grads."""
    params, grads = args[0], args[1]
    return all(t.dtype in _DTYPES for t in (*params, *grads))


@triton.jit
def _update(PARAM, GRAD, EXP_AVG, EXP_AVG_SQ, MASTER, offsets, mask, inv_grad_scale, weight_decay, lerp_weight,
            beta2, one_minus_beta2, decay, bias_correction2_sqrt, eps, neg_step_size,
            HAS_MASTER: tl.constexpr, ADAM_W: tl.constexpr, LERP_FROM_GRAD: tl.constexpr):
    """One register block of elements; mask is None for a block wholly inside the chunk."""
    if HAS_MASTER:
        p = tl.load(MASTER + offsets, mask=mask)
    else:
        p = tl.load(PARAM + offsets, mask=mask).to(tl.float32)
    g = tl.load(GRAD + offsets, mask=mask).to(tl.float32) * inv_grad_scale
    if not ADAM_W:
        g = g + weight_decay * p  # L2: the decay enters the moments
    m = tl.load(EXP_AVG + offsets, mask=mask)
    # PyTorch's lerp: m + w (g - m) for a weight w below 0.5, else g - (1 - w) (g - m); lerp_weight is w or -(1 - w).
    if LERP_FROM_GRAD:
        m = tl.fma(lerp_weight, g - m, g)
    else:
        m = tl.fma(lerp_weight, g - m, m)
    # PyTorch's addcmul: v beta2 + ((1 - beta2) g) g, the last product and the sum fused.
    v = tl.fma(one_minus_beta2 * g, g, tl.load(EXP_AVG_SQ + offsets, mask=mask) * beta2)
    if ADAM_W:
        p = p * decay  # decoupled decay, before the Adam update
    # sqrt(v) / sqrt(bc2) rather than sqrt(v / bc2), and (-step_size m) / denom: PyTorch's order.
    denom = tl.div_rn(tl.sqrt_rn(v), bias_correction2_sqrt) + eps
    p = p + tl.div_rn(neg_step_size * m, denom)
    tl.store(EXP_AVG + offsets, m, mask=mask)
    tl.store(EXP_AVG_SQ + offsets, v, mask=mask)
    if HAS_MASTER:
        tl.store(MASTER + offsets, p, mask=mask)
    tl.store(PARAM + offsets, p.to(PARAM.dtype.element_ty), mask=mask)


@triton.jit
def _adam_kernel(TABLE, inv_grad_scale, weight_decay, lerp_weight, beta2, one_minus_beta2, decay,
                 bias_correction2_sqrt, eps, neg_step_size, PARAM_TYPE: tl.constexpr, GRAD_TYPE: tl.constexpr,
                 HAS_MASTER: tl.constexpr, ADAM_W: tl.constexpr, LERP_FROM_GRAD: tl.constexpr,
                 ALIGNED: tl.constexpr, BLOCK: tl.constexpr):
    row = TABLE + tl.program_id(0).to(tl.int64) * 6  # [6]: see _chunk_table
    param = tl.load(row).to(tl.pointer_type(PARAM_TYPE))
    grad = tl.load(row + 1).to(tl.pointer_type(GRAD_TYPE))
    exp_avg = tl.load(row + 2).to(tl.pointer_type(tl.float32))
    exp_avg_sq = tl.load(row + 3).to(tl.pointer_type(tl.float32))
    master = tl.load(row + 4).to(tl.pointer_type(tl.float32))
    count = tl.load(row + 5)
    if ALIGNED:  # addresses from the table carry no alignment the compiler can see
        param = tl.multiple_of(param, 16)
        grad = tl.multiple_of(grad, 16)
        exp_avg = tl.multiple_of(exp_avg, 16)
        exp_avg_sq = tl.multiple_of(exp_avg_sq, 16)
        master = tl.multiple_of(master, 16)
    whole = count - count % BLOCK
    for start in range(0, whole, BLOCK):
        _update(param, grad, exp_avg, exp_avg_sq, master, start + tl.arange(0, BLOCK), None, inv_grad_scale,
                weight_decay, lerp_weight, beta2, one_minus_beta2, decay, bias_correction2_sqrt, eps, neg_step_size,
                HAS_MASTER, ADAM_W, LERP_FROM_GRAD)
    if whole < count:
        offsets = whole + tl.arange(0, BLOCK)
        _update(param, grad, exp_avg, exp_avg_sq, master, offsets, offsets < count, inv_grad_scale, weight_decay,
                lerp_weight, beta2, one_minus_beta2, decay, bias_correction2_sqrt, eps, neg_step_size, HAS_MASTER,
                ADAM_W, LERP_FROM_GRAD)


def _float32(x: float) -> float:
    """x rounded to float32, as PyTorch rounds lerp's weight."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _chunk_table(rows: List[List[int]], element_bytes: List[int]) -> Tensor:
    """[chunks, 6] int64 from one row per tensor (5 addresses, numel): each chunk's addresses
    advanced to its first element, and its length. Tensors without elements own no chunk."""
    tensors = torch.tensor(rows, dtype=torch.int64)  # [n, 6]
    numel = tensors[:, 5]
    chunks = (numel + CHUNK - 1) // CHUNK  # [n]
    owner = torch.repeat_interleave(torch.arange(len(rows)), chunks)  # [c]: the tensor of each chunk
    first_chunk = torch.cumsum(chunks, 0) - chunks  # [n]
    start = (torch.arange(owner.numel()) - first_chunk[owner]) * CHUNK  # [c]: each chunk's first element
    table = tensors[owner]
    table[:, :5] += start[:, None] * torch.tensor(element_bytes, dtype=torch.int64)[None, :]
    table[:, 5] = torch.clamp(table[:, 5] - start, max=CHUNK)
    return table


def multi_tensor_adam(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor],
                      master_params: List[Tensor], lr: float, beta1: float, beta2: float, eps: float, step: int,
                      bias_correction: bool, weight_decay: float, adam_w_mode: bool, inv_grad_scale: float) -> None:
    has_master = bool(master_params)
    grads = [g.contiguous() for g in grads]  # alive until the launches are queued
    groups = defaultdict(list)  # (device, param dtype, grad dtype, aligned) -> table rows
    for k, (param, grad) in enumerate(zip(params, grads)):
        if param.numel() == 0:
            continue
        addresses = [param.data_ptr(), grad.data_ptr(), exp_avgs[k].data_ptr(), exp_avg_sqs[k].data_ptr(),
                     master_params[k].data_ptr() if has_master else 0]
        aligned = all(address % 16 == 0 for address in addresses)
        groups[(param.device, param.dtype, grad.dtype, aligned)].append(addresses + [param.numel()])

    # The scalars as the reference computes them, in double; the launch rounds them to float32 as
    # PyTorch rounds a Python float for a float32 tensor.
    bias_correction1 = 1 - beta1 ** step if bias_correction else 1.0
    bias_correction2 = 1 - beta2 ** step if bias_correction else 1.0
    lerp_weight = _float32(1 - beta1)
    lerp_from_grad = abs(lerp_weight) >= 0.5
    scalars = (inv_grad_scale, weight_decay, -(1 - lerp_weight) if lerp_from_grad else lerp_weight, beta2, 1 - beta2,
               1 - lr * weight_decay, math.sqrt(bias_correction2), eps, -(lr / bias_correction1))
    for (device, param_dtype, grad_dtype, aligned), rows in groups.items():
        element_bytes = [param_dtype.itemsize, grad_dtype.itemsize, 4, 4, 4 if has_master else 0]
        # A pageable source is staged at once, so the copy need not block the host.
        table = _chunk_table(rows, element_bytes).to(device, non_blocking=True)
        _adam_kernel[(table.shape[0],)](
            table, *scalars, PARAM_TYPE=_TRITON_TYPES[param_dtype],
            GRAD_TYPE=_TRITON_TYPES[grad_dtype], HAS_MASTER=has_master, ADAM_W=adam_w_mode,
            LERP_FROM_GRAD=lerp_from_grad, ALIGNED=aligned, BLOCK=_BLOCK, num_warps=4)

"""The cross-entropy ops (cross_entropy_fwd / cross_entropy_bwd) in Triton, with the ops'
signatures and numerics (reference/cross_entropy.py): float32 math whatever the logits'
dtype (fp32, bf16, fp16), loss in float32, the gradient rounded once to the logits' dtype.

Forward, a program per row, for vocabularies of any size (128k-256k: never a whole row in
registers). Pass 1 walks the row in CHUNK-wide slices keeping, per lane, a running max m and
the sum s of exp(x - m) (rescaled when the max grows), and with label smoothing the sum of
(x - x_t) / 2 / V (the mean of the halved differences, each at most FLT_MAX, which stays in
fp32's range where the sum would not); the lanes are combined once at the end, so a slice
costs no cross-thread reduction, and one exponential per logit (two would make a bf16 row
bound by the GPU's exponential units rather than by memory). The loss is formed relative to
the row max M, as the reference, and halved:
    loss / 2 = (1 - eps) (log S / 2 + (M - x_t) / 2) + eps (log S / 2 + mean (M - x) / 2)
             = log S / 2 + (M - x_t) / 2 - eps mean (x - x_t) / 2
where mean (x - x_t) sums differences of nearby logits (a sum of the raw logits near 1e5 would
lose the small part to rounding). M - x_t reaches 2 FLT_MAX (logits [-3e38, 3e38]) where its
half does not; eps mean (x - x_t) / 2 is at most FLT_MAX, and the difference, the sum of two
nonnegative terms of at most FLT_MAX, passes FLT_MAX only where the loss passes 2 FLT_MAX, the
doubling (exact) only where the loss passes FLT_MAX. x - M below -FLT_MAX is -inf, whose exp
is 0, as the exact one rounds to. Pass 2, when compute_grad, reads the row again and writes
    grad = k (exp(x - M) / S - eps / V - (1 - eps) [c == t])
with k the grad_scale (one for the tensor or one per row), applied last, the one-hot term
subtracted after the rest (one class: exactly 0, the two roundings of 1 - eps cancelling).
Ignored rows write loss 0 and a zero gradient without reading the logits. Like the CPU
kernel, the smoothing sum is skipped when eps is 0 (a -inf logit makes it inf, and 0 * inf NaN).
A target outside [0, V) that is not ignore_index (which the op's checks refuse where they
can read it) gives a NaN loss and a NaN gradient row instead of reading out of bounds.
The vocabulary split's partials (cross_entropy_partials) take the mean of (x - x_0) / 2 from the
row's first logit x_0 in the same pass and move it to the shard's max: mean (m_r - x) / 2 =
(m_r - x_0) / 2 - mean (x - x_0) / 2, two terms of at most FLT_MAX whose difference is in
[0, FLT_MAX]; a shard of -inf logits alone gives a sum of exponentials and a mean gap of 0.
Backward: grad_logits = grad * grad_loss[row], in float32, rounded once.
"""
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MAX_CHUNK = 4096  # logits per slice of a row; each lane keeps three fp32 values across the slices
_BWD_BLOCK = 4096  # elements per backward program


def supports(op_name: str, args: tuple) -> bool:
    """Whether the kernels run op_name(*args): fp32 / bf16 / fp16 logits (grad), any vocabulary;
    the sharded ops' per-row statistics in float32."""
    if op_name == "cross_entropy_sharded_grad" and not all(t.dtype == torch.float32 for t in args[3:5]):
        return False
    return args[0].dtype in _DTYPES


@triton.jit
def _row_statistics(LOGITS, row_start, vocab, pivot, weight, SMOOTHING: tl.constexpr, CHUNK: tl.constexpr):
    """(max M, sum of exp(x - M), sum of (x - pivot) / 2 * weight when SMOOTHING) over a row of
    vocab logits. The halved differences are at most FLT_MAX; weight 1 / vocab gives their mean,
    in fp32's range where their sum is not."""
    lanes = tl.arange(0, CHUNK)
    running_max = tl.full([CHUNK], float("-inf"), tl.float32)
    running_sum = tl.zeros([CHUNK], tl.float32)  # of exp(x - running_max), per lane
    deviation_sum = tl.zeros([CHUNK], tl.float32)  # of (x - pivot) / 2 * weight, per lane
    half_pivot = pivot * 0.5
    for start in range(0, vocab, CHUNK):
        cols = start + lanes
        in_row = cols < vocab
        x = tl.load(LOGITS + row_start + cols, mask=in_row, other=float("-inf")).to(tl.float32)
        # One exponential per logit, exp(-|x - m|): the factor that rescales the sum to a new
        # max x > m, else x's own term. NaN propagates through both (a NaN logit makes its
        # row NaN, as the reference); a -inf logit adds 0 (exp(-inf - -inf) would be NaN).
        larger = tl.maximum(x, running_max, propagate_nan=tl.PropagateNan.ALL)
        smaller = tl.minimum(x, running_max, propagate_nan=tl.PropagateNan.ALL)
        ratio = tl.where(x == float("-inf"), 0.0, tl.exp(smaller - larger))
        running_sum = tl.where(x > running_max, running_sum * ratio + 1.0, running_sum + ratio)
        running_max = larger
        if SMOOTHING:
            deviation_sum += tl.where(in_row, (x * 0.5 - half_pivot) * weight, 0.0)
    row_max = tl.max(running_max, axis=0)
    lane_factor = tl.where(running_max == row_max, 1.0, tl.exp(running_max - row_max))
    sum_exp = tl.sum(running_sum * lane_factor, axis=0)
    # A +inf logit: the reference's exp(inf - inf) is NaN, here the lane's sum restarted at 1.
    sum_exp = tl.where(row_max == float("inf"), float("nan"), sum_exp)
    return row_max, sum_exp, tl.sum(deviation_sum, axis=0)


@triton.jit
def _cross_entropy_fwd_kernel(LOGITS, TARGET, GRAD_SCALE, LOSS, GRAD, vocab, ignore_index, label_smoothing,
                              grad_scale_stride, HAS_GRAD_SCALE: tl.constexpr, SMOOTHING: tl.constexpr,
                              COMPUTE_GRAD: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    row_start = row.to(tl.int64) * vocab
    lanes = tl.arange(0, CHUNK)
    target = tl.load(TARGET + row)
    if target == ignore_index:
        tl.store(LOSS + row, 0.0)
        if COMPUTE_GRAD:
            for start in range(0, vocab, CHUNK):
                cols = start + lanes
                tl.store(GRAD + row_start + cols, tl.zeros([CHUNK], GRAD.dtype.element_ty), mask=cols < vocab)
    else:
        valid_target = (target >= 0) & (target < vocab)
        x_target = tl.load(LOGITS + row_start + tl.where(valid_target, target, 0)).to(tl.float32)
        x_target = tl.where(valid_target, x_target, float("nan"))
        # The smoothing sum's pivot; a non-finite x_t makes the loss inf or NaN through (M - x_t) / 2 anyway.
        pivot = tl.where(tl.abs(x_target) < float("inf"), x_target, 0.0)
        eps = tl.full([], label_smoothing, tl.float32)  # fp32 throughout (the interpreter's scalars are fp64)
        row_max, sum_exp, deviation_mean = _row_statistics(LOGITS, row_start, vocab, pivot, 1.0 / vocab, SMOOTHING,
                                                           CHUNK)
        half_loss = tl.log(sum_exp) * 0.5 + (row_max * 0.5 - x_target * 0.5)
        if SMOOTHING:
            half_loss = half_loss - eps * deviation_mean
        tl.store(LOSS + row, half_loss * 2.0)

        if COMPUTE_GRAD:
            if HAS_GRAD_SCALE:
                factor = tl.load(GRAD_SCALE + row.to(tl.int64) * grad_scale_stride).to(tl.float32)
            else:
                factor = 1.0
            inverse_sum = tl.where(valid_target, 1.0 / sum_exp, float("nan"))
            smoothing = eps / vocab
            for start in range(0, vocab, CHUNK):
                cols = start + lanes
                in_row = cols < vocab
                x = tl.load(LOGITS + row_start + cols, mask=in_row, other=0.0).to(tl.float32)
                # The one-hot term last and the factor after, as the CPU kernel's target element:
                # where the softmax is exactly 1 the two roundings of 1 - eps cancel.
                grad = tl.exp(x - row_max) * inverse_sum - smoothing
                grad = tl.where(cols == target, grad - (1.0 - eps), grad) * factor
                tl.store(GRAD + row_start + cols, grad.to(GRAD.dtype.element_ty), mask=in_row)


@triton.jit
def _cross_entropy_bwd_kernel(GRAD, GRAD_LOSS, GRAD_LOGITS, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < vocab
    offsets = row.to(tl.int64) * vocab + cols
    factor = tl.load(GRAD_LOSS + row).to(tl.float32)
    grad = tl.load(GRAD + offsets, mask=in_row, other=0.0).to(tl.float32)
    tl.store(GRAD_LOGITS + offsets, (grad * factor).to(GRAD_LOGITS.dtype.element_ty), mask=in_row)


@triton.jit
def _partials_kernel(LOGITS, TARGET, PARTIALS, shard, vocab_start, ignore_index, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    row_start = row.to(tl.int64) * shard
    first = tl.load(LOGITS + row_start).to(tl.float32)
    pivot = tl.where(tl.abs(first) < float("inf"), first, 0.0)  # a non-finite logit makes the mean so anyway
    row_max, sum_exp, deviation_mean = _row_statistics(LOGITS, row_start, shard, pivot, 1.0 / shard, True, CHUNK)
    # mean (max - x) / 2; 0 for a shard of -inf logits alone, as the reference (whose sum_exp
    # _row_statistics makes 0 too).
    mean_gap = tl.where(row_max == float("-inf"), 0.0, (row_max * 0.5 - pivot * 0.5) - deviation_mean)
    target = tl.load(TARGET + row)
    local = target - vocab_start
    inside = (local >= 0) & (local < shard) & (target != ignore_index)
    target_logit = tl.load(LOGITS + row_start + tl.where(inside, local, 0)).to(tl.float32)
    out = PARTIALS + row.to(tl.int64) * 4
    tl.store(out, row_max)
    tl.store(out + 1, sum_exp)
    tl.store(out + 2, mean_gap)
    tl.store(out + 3, tl.where(inside, target_logit, 0.0))


@triton.jit
def _sharded_grad_kernel(LOGITS, TARGET, ROW_MAX, SUM_EXP, GRAD_LOSS, GRAD, shard, vocab_start, vocab_size,
                         ignore_index, label_smoothing, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    row_start = row.to(tl.int64) * shard
    lanes = tl.arange(0, CHUNK)
    target = tl.load(TARGET + row)
    kept = target != ignore_index
    row_max = tl.load(ROW_MAX + row)
    sum_exp = tl.load(SUM_EXP + row)
    factor = tl.where(kept, tl.load(GRAD_LOSS + row).to(tl.float32), 0.0)  # ignored rows: a zero gradient
    for start in range(0, shard, CHUNK):
        cols = start + lanes
        in_row = cols < shard
        x = tl.load(LOGITS + row_start + cols, mask=in_row, other=0.0).to(tl.float32)
        grad = tl.exp(x - row_max) / sum_exp - label_smoothing / vocab_size
        grad = tl.where(cols + vocab_start == target, grad - (1.0 - label_smoothing), grad)
        tl.store(GRAD + row_start + cols, (grad * factor).to(GRAD.dtype.element_ty), mask=in_row)


def cross_entropy_fwd(logits: Tensor, target: Tensor, label_smoothing: float, ignore_index: int,
                      compute_grad: bool, grad_scale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    rows, vocab = logits.shape
    x, target = logits.contiguous(), target.contiguous()
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    grad = torch.empty_like(x) if compute_grad else logits.new_empty((0, vocab))
    if rows:
        chunk = _chunk(vocab)
        has_scale = grad_scale is not None
        # grad_scale [] or [N]: its stride along the rows is its number of dimensions, 0 or 1.
        _cross_entropy_fwd_kernel[(rows,)](
            x, target, grad_scale.contiguous() if has_scale else loss, loss, grad if compute_grad else x, vocab,
            ignore_index, label_smoothing, grad_scale.dim() if has_scale else 0, HAS_GRAD_SCALE=has_scale,
            SMOOTHING=label_smoothing != 0, COMPUTE_GRAD=compute_grad, CHUNK=chunk,
            num_warps=4 if chunk <= 1024 else 8)
    return loss, grad


def cross_entropy_bwd(grad: Tensor, grad_loss: Tensor) -> Tensor:
    rows, vocab = grad.shape
    grad, grad_loss = grad.contiguous(), grad_loss.contiguous()
    grad_logits = torch.empty_like(grad)
    if grad.numel():
        block = min(triton.next_power_of_2(vocab), _BWD_BLOCK)
        # Rows on the first grid axis, which may exceed the 65535 programs the others allow.
        _cross_entropy_bwd_kernel[(rows, triton.cdiv(vocab, block))](
            grad, grad_loss, grad_logits, vocab, BLOCK=block, num_warps=4 if block <= 1024 else 8)
    return grad_logits


def _chunk(vocab: int) -> int:
    return min(triton.next_power_of_2(vocab), _MAX_CHUNK)


def cross_entropy_partials(logits: Tensor, target: Tensor, vocab_start: int, ignore_index: int) -> Tensor:
    rows, shard = logits.shape
    x, target = logits.contiguous(), target.contiguous()
    partials = torch.empty((rows, 4), dtype=torch.float32, device=logits.device)
    if rows and shard:
        chunk = _chunk(shard)
        _partials_kernel[(rows,)](x, target, partials, shard, vocab_start, ignore_index, CHUNK=chunk,
                                  num_warps=4 if chunk <= 1024 else 8)
    return partials


def cross_entropy_sharded_grad(logits: Tensor, target: Tensor, vocab_start: int, row_max: Tensor, sum_exp: Tensor,
                               label_smoothing: float, vocab_size: int, ignore_index: int,
                               grad_loss: Tensor) -> Tensor:
    rows, shard = logits.shape
    x = logits.contiguous()
    grad = torch.empty_like(x)
    if rows and shard:
        chunk = _chunk(shard)
        _sharded_grad_kernel[(rows,)](x, target.contiguous(), row_max.contiguous(), sum_exp.contiguous(),
                                      grad_loss.contiguous(), grad, shard, vocab_start, vocab_size, ignore_index,
                                      label_smoothing, CHUNK=chunk, num_warps=4 if chunk <= 1024 else 8)
    return grad

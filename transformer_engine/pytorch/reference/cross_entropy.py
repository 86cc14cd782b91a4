"""The cross-entropy ops with their exact signatures and semantics, in plain PyTorch.

logits [N, V]; target [N] int64 in [0, V) or ignore_index. Math in float32 (float64 for
float64 logits). With lse = logsumexp(x), label smoothing eps and target t:
    loss[n] = (1 - eps) * (lse - x_t) + eps * (lse - mean_c x_c)      (0 where ignored)
(TE's formula), formed relative to the row max m (smoothed_loss below) as
    2 * ((1 - eps) * (log s / 2 + (m - x_t) / 2) + eps * (log s / 2 + mean (m - x) / 2))
with s = sum exp(x - m), so that m does not absorb log s (logits of 1e30: log 2, not 0), and
every term is in fp32's range wherever the loss is: the gaps m - x reach 2 FLT_MAX (logits
[-3e38, 3e38]; halved, never past FLT_MAX), and mean (m - x) / 2 is summed as
(m - x) / 2 / V (in range where the sum is not: logits [1e30, 1e30, 3e38]). Without smoothing
the mean is left out (a -inf logit makes it inf, which would make 0 * inf NaN).
    grad[n] = softmax(x) - eps / V - (1 - eps) * onehot(t)             (0 where ignored)
in that order (one class: exactly 0); exp(x - m) is 0 where x - m is past -FLT_MAX, as the exact
value rounds to.
grad = grad_scale * d loss[n] / d logits[n] (grad_scale [] or [N], 1 when None), computed in
float32 and rounded once to logits' dtype; cross_entropy_bwd scales its rows.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def smoothed_loss(log_sum: Tensor, target_gap: Tensor, mean_gap: Tensor, label_smoothing: float) -> Tensor:
    """The loss from log s, target_gap = (m - x_t) / 2 and mean_gap = mean (m - x) / 2 (m the row
    max, s = sum exp(x - m)): twice (1 - eps) (log s / 2 + target_gap) + eps (log s / 2 + mean_gap).
    The gaps are at most FLT_MAX, weighted by at most 1, and the two weighted terms are
    nonnegative: their sum passes FLT_MAX only where the loss passes 2 FLT_MAX, and the doubling,
    exact, only where the loss passes FLT_MAX. mean_gap is not read without smoothing."""
    half = log_sum * 0.5 + target_gap
    if label_smoothing != 0:
        half = (1 - label_smoothing) * half + label_smoothing * (log_sum * 0.5 + mean_gap)
    return half * 2


def cross_entropy_fwd(logits: Tensor, target: Tensor, label_smoothing: float, ignore_index: int,
                      compute_grad: bool, grad_scale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    x = logits.to(_acc_dtype(logits.dtype))
    kept = target != ignore_index
    safe_target = torch.where(kept, target, 0).unsqueeze(-1)  # [N, 1]
    row_max = x.amax(dim=-1, keepdim=True)
    log_sum = torch.logsumexp(x - row_max, dim=-1)  # x - m below -FLT_MAX is -inf: exp 0 either way
    half_gap = row_max * 0.5 - x * 0.5  # (m - x) / 2, in [0, FLT_MAX]
    target_gap = half_gap.gather(-1, safe_target).squeeze(-1)
    mean_gap = (half_gap / x.shape[-1]).sum(dim=-1)  # each term at most FLT_MAX / V
    loss = torch.where(kept, smoothed_loss(log_sum, target_gap, mean_gap, label_smoothing), 0.0)
    if not compute_grad:
        return loss, logits.new_empty((0, logits.shape[-1]))
    onehot = torch.zeros_like(x).scatter_(-1, safe_target, 1.0)
    # The one-hot term last: where the softmax is exactly 1, both roundings of 1 - eps cancel.
    grad = torch.softmax(x, dim=-1) - label_smoothing / x.shape[-1] - (1 - label_smoothing) * onehot
    grad = torch.where(kept.unsqueeze(-1), grad, 0.0)
    if grad_scale is not None:
        grad = grad * grad_scale.reshape(-1, 1)  # [] or [N] -> a factor per row
    return loss, grad.to(logits.dtype)


def cross_entropy_bwd(grad: Tensor, grad_loss: Tensor) -> Tensor:
    return (grad.to(grad_loss.dtype) * grad_loss.unsqueeze(-1)).to(grad.dtype)


# --- the vocabulary split over ranks (parallel_cross_entropy with a process group) -----------
# Rank r holds logits [N, Vs], the classes [vocab_start, vocab_start + Vs). Its per-row partials
# (m_r = max x, s_r = sum exp(x - m_r), the mean over its classes of (m_r - x) / 2, x_t where t is
# one of its classes else 0) combine over the W ranks into m = max m_r, s = sum s_r exp(m_r - m),
# mean (m - x) / 2 = sum over r of (mean_r (m_r - x) / 2 + (m - m_r) / 2) / W, and x_t;
# smoothed_loss of them is the unsplit loss (custom_ops/sharded_cross_entropy.py). Each rank's
# gradient is its slice of the unsplit one.

def cross_entropy_partials(logits: Tensor, target: Tensor, vocab_start: int, ignore_index: int) -> Tensor:
    """[N, 4]: (max, sum of exp(x - max), mean of (max - x) / 2, the target's logit or 0) per row
    of a shard; the halved gaps are at most FLT_MAX, their mean too. A -inf logit adds 0 to the
    sum, and a logit equal to the max a gap of 0: a shard of -inf logits alone (vocabulary
    padding masked out) has sum 0 and mean gap 0, and adds to the row only its gap from the
    other shards' max, inf (exp(-inf - -inf) and -inf - -inf would be NaN)."""
    x = logits.to(_acc_dtype(logits.dtype))
    shard = x.shape[-1]
    row_max = x.amax(dim=-1, keepdim=True)
    sum_exp = torch.where(x == float("-inf"), 0.0, torch.exp(x - row_max)).sum(dim=-1)
    mean_gap = (torch.where(x == row_max, 0.0, row_max * 0.5 - x * 0.5) / shard).sum(dim=-1)
    row_max = row_max.squeeze(-1)
    local = target - vocab_start
    inside = (local >= 0) & (local < shard) & (target != ignore_index)
    target_logit = x.gather(-1, torch.where(inside, local, 0).unsqueeze(-1)).squeeze(-1)
    return torch.stack([row_max, sum_exp, mean_gap, torch.where(inside, target_logit, 0.0)], dim=-1)


def cross_entropy_sharded_grad(logits: Tensor, target: Tensor, vocab_start: int, row_max: Tensor, sum_exp: Tensor,
                               label_smoothing: float, vocab_size: int, ignore_index: int,
                               grad_loss: Tensor) -> Tensor:
    """This shard's slice of grad_loss[n] * d loss[n] / d logits[n], from the combined max and
    sum of exponentials [N]; rounded once to logits' dtype."""
    x = logits.to(_acc_dtype(logits.dtype))
    shard = x.shape[-1]
    local = target - vocab_start
    kept = target != ignore_index
    inside = (local >= 0) & (local < shard) & kept
    onehot = torch.zeros_like(x).scatter_(-1, torch.where(inside, local, 0).unsqueeze(-1), 1.0) * inside.unsqueeze(-1)
    grad = torch.exp(x - row_max.unsqueeze(-1)) / sum_exp.unsqueeze(-1)
    grad = grad - label_smoothing / vocab_size - (1 - label_smoothing) * onehot  # the one-hot term last, as above
    grad = torch.where(kept.unsqueeze(-1), grad * grad_loss.to(x.dtype).unsqueeze(-1), 0.0)
    return grad.to(logits.dtype)

"""The cross-entropy ops with their exact signatures and semantics, in plain PyTorch.

logits [N, V]; target [N] int64 in [0, V) or ignore_index. Math in float32 (float64 for
float64 logits). With lse = logsumexp(x), label smoothing eps and target t:
    loss[n] = (1 - eps) * (lse - x_t) + eps * (lse - mean_c x_c)      (0 where ignored)
formed relative to the row max m as (1 - eps) * (log s - (x_t - m)) + eps * (log s - mean (x - m))
with s = sum exp(x - m), so that m does not absorb log s (logits of 1e30: log 2, not 0).
    grad[n] = softmax(x) - eps / V - (1 - eps) * onehot(t)             (0 where ignored)
in that order (one class: exactly 0), and mean (x - m) summed as (x - m) / V (in range where
the sum of the deviations is not: logits [1e30, 1e30, 3e38]).
grad = grad_scale * d loss[n] / d logits[n] (grad_scale [] or [N], 1 when None), computed in
float32 and rounded once to logits' dtype; cross_entropy_bwd scales its rows.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def cross_entropy_fwd(logits: Tensor, target: Tensor, label_smoothing: float, ignore_index: int,
                      compute_grad: bool, grad_scale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    x = logits.to(_acc_dtype(logits.dtype))
    kept = target != ignore_index
    safe_target = torch.where(kept, target, 0).unsqueeze(-1)  # [N, 1]
    shifted = x - x.amax(dim=-1, keepdim=True)
    log_sum = torch.logsumexp(shifted, dim=-1)
    nll = log_sum - shifted.gather(-1, safe_target).squeeze(-1)
    smooth = log_sum - (shifted / x.shape[-1]).sum(dim=-1)  # the mean, summed without overflowing
    loss = torch.where(kept, (1 - label_smoothing) * nll + label_smoothing * smooth, 0.0)
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
# (m_r = max x, s_r = sum exp(x - m_r), sum x, x_t where t is one of its classes else 0) combine
# over the ranks into m = max m_r, s = sum s_r exp(m_r - m) and the sums, and then
#     loss = log s + m - x_t - eps (sum x / V - x_t)
# which is the unsplit loss; each rank's gradient is its slice of the unsplit one.

def cross_entropy_partials(logits: Tensor, target: Tensor, vocab_start: int, ignore_index: int) -> Tensor:
    """[N, 4]: (max, sum of exp(x - max), sum of x, the target's logit or 0) per row of a shard."""
    x = logits.to(_acc_dtype(logits.dtype))
    shard = x.shape[-1]
    row_max = x.amax(dim=-1)
    sum_exp = torch.exp(x - row_max.unsqueeze(-1)).sum(dim=-1)
    local = target - vocab_start
    inside = (local >= 0) & (local < shard) & (target != ignore_index)
    target_logit = x.gather(-1, torch.where(inside, local, 0).unsqueeze(-1)).squeeze(-1)
    return torch.stack([row_max, sum_exp, x.sum(dim=-1), torch.where(inside, target_logit, 0.0)], dim=-1)


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

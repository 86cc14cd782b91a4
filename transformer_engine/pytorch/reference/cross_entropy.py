"""The cross-entropy ops with their exact signatures and semantics, in plain PyTorch.

logits [N, V]; target [N] int64 in [0, V) or ignore_index. Math in float32 (float64 for
float64 logits). With lse = logsumexp(x), label smoothing eps and target t:
    loss[n] = (1 - eps) * (lse - x_t) + eps * (lse - mean_c x_c)      (0 where ignored)
formed relative to the row max m as (1 - eps) * (log s - (x_t - m)) + eps * (log s - mean (x - m))
with s = sum exp(x - m), so that m does not absorb log s (logits of 1e30: log 2, not 0).
    grad[n] = softmax(x) - (1 - eps) * onehot(t) - eps / V             (0 where ignored)
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
    smooth = log_sum - shifted.mean(dim=-1)
    loss = torch.where(kept, (1 - label_smoothing) * nll + label_smoothing * smooth, 0.0)
    if not compute_grad:
        return loss, logits.new_empty((0, logits.shape[-1]))
    onehot = torch.zeros_like(x).scatter_(-1, safe_target, 1.0)
    grad = torch.softmax(x, dim=-1) - (1 - label_smoothing) * onehot - label_smoothing / x.shape[-1]
    grad = torch.where(kept.unsqueeze(-1), grad, 0.0)
    if grad_scale is not None:
        grad = grad * grad_scale.reshape(-1, 1)  # [] or [N] -> a factor per row
    return loss, grad.to(logits.dtype)


def cross_entropy_bwd(grad: Tensor, grad_loss: Tensor) -> Tensor:
    return (grad.to(grad_loss.dtype) * grad_loss.unsqueeze(-1)).to(grad.dtype)

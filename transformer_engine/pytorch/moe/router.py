"""TE's MoE router functions (TE >= 2.7; its import path transformer_engine.pytorch.router), which Megatron-Core imports
for moe_router_fusion: top-k routing with a score function, the scores for the load-balancing loss, and
that loss. Plain PyTorch: the device-independent version a fused kernel can later replace.

Numerics follow TE's kernels: logits are read in their own dtype and every score, sum and gradient is
computed in float32; probs and gradients are rounded once, to the logits' (or probs') dtype, at the end;
the aux-loss scores stay float32. The backward passes are written out (TE's formulas, not autograd's), so
the sqrtsoftplus gradient stays finite where softplus underflows to 0. Differences from TE, all deliberate:
ties between equal scores are broken as torch.topk breaks them on the device (TE's kernel prefers the lower
expert index; the selected scores are the same), so the order of dense top-k indices is by score; with an
expert_bias the returned probs gather the unbiased scores (as Megatron does) instead of subtracting the bias
again, which in float32 loses the low bits of small scores; zero tokens give empty outputs (TE refuses
them); logits and topk_indices need not be contiguous, and no tensor has to be on CUDA.
"""
import enum
import math
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["RoutingMapFormat", "QBHistogramMode", "fused_topk_with_score_function",
           "fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss"]


class RoutingMapFormat(enum.IntEnum):
    """Layout of the routing map: BYTEMAP is bool [..., num_experts]; BITMAP_U8 is uint8
    [..., ceil(num_experts / 8)] where bit e % 8 of byte e // 8 is expert e (LSB first)."""
    BYTEMAP = 0
    BITMAP_U8 = 1


class QBHistogramMode(enum.IntEnum):
    """How TE's CUDA kernel accumulates the quantile-balancing histogram; both give the same counts."""
    TWO_KERNEL = 0
    FUSED_ATOMIC = 1


_SCORE_FUNCTIONS = ("softmax", "sigmoid", "sqrtsoftplus")
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INDEX_DTYPES = (torch.int16, torch.int32, torch.int64)
# TE's epsilon: added to a normalising sum so that a row of zero scores gives zeros, not NaN.
_EPS = 1e-20
# softplus(x) is taken as x above this, where log1p(exp(x)) equals x in float32 (TE's and torch's threshold).
_SOFTPLUS_THRESHOLD = 20.0


def _sqrt_softplus(x: Tensor) -> Tensor:
    return F.softplus(x, threshold=_SOFTPLUS_THRESHOLD).sqrt()


def _sqrt_softplus_slope(x: Tensor, y: Tensor) -> Tensor:
    """d sqrt(softplus(x)) / dx = sigmoid(x) / (2 y); the epsilon keeps it finite (0) where y underflows."""
    slope = torch.where(x > _SOFTPLUS_THRESHOLD, torch.ones_like(x), torch.sigmoid(x))
    return slope / (2.0 * y + _EPS)


def _activation(x: Tensor, score_function: str) -> Tensor:
    if score_function == "sigmoid":
        return torch.sigmoid(x)
    if score_function == "sqrtsoftplus":
        return _sqrt_softplus(x)
    return torch.softmax(x, dim=-1)


def _normalize(act: Tensor) -> Tensor:
    return act / (act.sum(dim=-1, keepdim=True) + _EPS)


def _normalize_backward(grad: Tensor, act: Tensor) -> Tensor:
    """Gradient through p = act / (sum(act) + eps): g / d - sum(g * act) / d^2 with d = sum(act) + eps."""
    denom = act.sum(dim=-1, keepdim=True) + _EPS
    return grad / denom - (grad * act).sum(dim=-1, keepdim=True) / (denom * denom)


def _score_backward(grad: Tensor, saved: Tensor, score_function: str) -> Tensor:
    """Gradient through sigmoid (saved = its output) or sqrtsoftplus (saved = its input)."""
    if score_function == "sigmoid":
        return grad * saved * (1.0 - saved)
    return grad * _sqrt_softplus_slope(saved, _sqrt_softplus(saved))


def _topk_indices(scores: Tensor, topk: int, num_groups: Optional[int], group_topk: Optional[int]) -> Tensor:
    """[tokens, topk] indices of the best scores; with group_topk, only within the group_topk groups (of
    num_groups contiguous, equal groups of experts) whose best topk // group_topk scores sum highest."""
    if not group_topk:
        return scores.topk(topk, dim=-1).indices
    num_tokens, num_experts = scores.shape
    group_size = num_experts // num_groups
    group_scores = scores.reshape(num_tokens, num_groups, group_size).topk(topk // group_topk, dim=-1).values.sum(-1)
    kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_scores.topk(group_topk).indices, True)
    masked = scores.masked_fill(~kept.repeat_interleave(group_size, dim=1), -math.inf)
    return masked.topk(topk, dim=-1).indices


def _qb_indices(biased: Tensor, topk: int) -> tuple:
    """Quantile balancing: the best topk + 1 experts, less the one at the cutoff (the lowest of those
    scores; among experts tied there, the highest index). Returns ([tokens, topk] indices, [tokens] cutoff)."""
    values, indices = biased.topk(topk + 1, dim=-1)
    cutoff = values[:, -1]
    dropped = torch.where(values == cutoff[:, None], indices, -1).argmax(dim=-1, keepdim=True)
    kept = torch.ones_like(indices, dtype=torch.bool).scatter_(1, dropped, False)
    return indices[kept].reshape(-1, topk), cutoff


def _qb_accumulate(histogram: Tensor, raw: Tensor, cutoff: Tensor, bin_bounds: Tensor) -> None:
    """histogram[e, b] += the tokens whose cutoff - raw score of e (the bias e would need to be picked)
    falls in bin b of num_bins equal bins over bin_bounds, the outer bins open-ended. float32 as in TE."""
    num_experts, num_bins = histogram.shape
    lower, upper = bin_bounds[0], bin_bounds[1]
    scale = torch.full_like(lower, num_bins) / (upper - lower)  # not num_bins / t: that is num_bins * (1 / t)
    bins = torch.floor((cutoff[:, None] - raw - lower) * scale).clamp_(0, num_bins - 1)
    flat = bins.long() + torch.arange(num_experts, device=raw.device) * num_bins
    counts = torch.bincount(flat.reshape(-1), minlength=num_experts * num_bins)
    histogram.add_(counts.view(num_experts, num_bins).to(histogram.dtype))


class _TopkWithScoreFunction(torch.autograd.Function):
    """probs [..., E] (logits' dtype) and the [tokens, topk] routed indices; backward to the logits."""

    @staticmethod
    def forward(ctx, logits, topk, use_pre_softmax, num_groups, group_topk, scaling_factor, score_function,
                expert_bias, qb_histogram, qb_bin_bounds):
        num_experts = logits.shape[-1]
        # Contiguous so that any layout of the same logits gives the same bits (CPU's vectorised and
        # scalar sigmoid/exp differ in the last place).
        x = logits.reshape(-1, num_experts).float().contiguous()
        post_softmax = score_function == "softmax" and not use_pre_softmax
        act = x if post_softmax else _activation(x, score_function)
        selection = act if expert_bias is None else act + expert_bias
        if qb_histogram is None:
            indices = _topk_indices(selection, topk, num_groups, group_topk)
        else:
            indices, cutoff = _qb_indices(selection, topk)
            _qb_accumulate(qb_histogram, act, cutoff, qb_bin_bounds)
            ctx.mark_dirty(qb_histogram)
        picked = act.gather(1, indices)
        if post_softmax:
            weights = torch.softmax(picked, dim=-1)
            saved = weights
        elif score_function == "softmax":
            weights, saved = picked, act
        else:
            weights = _normalize(picked) if topk > 1 else picked
            saved = picked if score_function == "sigmoid" else x.gather(1, indices)
        ctx.scale = 1.0 if scaling_factor is None else scaling_factor
        probs = torch.zeros_like(x, dtype=logits.dtype).scatter_(1, indices, (weights * ctx.scale).to(logits.dtype))
        ctx.save_for_backward(indices, saved)
        ctx.mode = "post_softmax" if post_softmax else score_function
        ctx.topk, ctx.shape, ctx.dtype = topk, logits.shape, logits.dtype
        ctx.mark_non_differentiable(indices)
        return probs.view(logits.shape), indices, qb_histogram

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_probs, _grad_indices, _grad_histogram):
        indices, saved = ctx.saved_tensors
        grad_probs = grad_probs.reshape(-1, ctx.shape[-1])
        grad = grad_probs.gather(1, indices).float() * ctx.scale
        if ctx.mode == "softmax":  # softmax over all experts, then top-k: every logit gets a gradient
            routed = torch.zeros_like(saved).scatter_(1, indices, grad)
            dot = (grad * saved.gather(1, indices)).sum(dim=-1, keepdim=True)
            return (saved * (routed - dot)).to(ctx.dtype).view(ctx.shape), *([None] * 9)
        if ctx.mode == "post_softmax":  # saved = softmax over the routed logits
            grad = saved * (grad - (grad * saved).sum(dim=-1, keepdim=True))
        else:
            if ctx.topk > 1:
                act = saved if ctx.mode == "sigmoid" else _sqrt_softplus(saved)
                grad = _normalize_backward(grad, act)
            grad = _score_backward(grad, saved, ctx.mode)
        grad_logits = torch.zeros_like(grad_probs, dtype=torch.float32).scatter_(1, indices, grad)
        return grad_logits.to(ctx.dtype).view(ctx.shape), *([None] * 9)


class _ScoresForAuxLoss(torch.autograd.Function):
    """float32 scores [..., E] (normalised over all experts) and the [tokens, topk] indices of the best."""

    @staticmethod
    def forward(ctx, logits, topk, score_function):
        x = logits.reshape(-1, logits.shape[-1]).float().contiguous()  # as in _TopkWithScoreFunction
        act = _activation(x, score_function)
        scores = act if score_function == "softmax" else _normalize(act)
        indices = scores.topk(topk, dim=-1).indices
        ctx.save_for_backward({"softmax": scores, "sigmoid": act, "sqrtsoftplus": x}[score_function])
        ctx.score_function, ctx.shape, ctx.dtype = score_function, logits.shape, logits.dtype
        ctx.mark_non_differentiable(indices)
        return scores.view(logits.shape), indices

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_scores, _grad_indices):
        (saved,) = ctx.saved_tensors
        grad = grad_scores.reshape(saved.shape).float()
        if ctx.score_function == "softmax":
            grad = saved * (grad - (grad * saved).sum(dim=-1, keepdim=True))
        else:
            act = saved if ctx.score_function == "sigmoid" else _sqrt_softplus(saved)
            grad = _score_backward(_normalize_backward(grad, act), saved, ctx.score_function)
        return grad.to(ctx.dtype).view(ctx.shape), None, None


class _MoEAuxLoss(torch.autograd.Function):
    """coeff * sum_e (sum_t probs[t, e]) * tokens_per_expert[e], coeff a float32 0-dim tensor."""

    @staticmethod
    def forward(ctx, probs, tokens_per_expert, coeff):
        ctx.save_for_backward(tokens_per_expert, coeff)
        ctx.shape = probs.shape
        loss = (probs.float().sum(dim=0) * tokens_per_expert.float()).sum() * coeff
        return loss.to(probs.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        tokens_per_expert, coeff = ctx.saved_tensors
        grad_row = coeff * tokens_per_expert.float() * grad_loss.float()
        return grad_row.to(grad_loss.dtype).expand(ctx.shape).contiguous(), None, None


def _check_logits(logits: Tensor, name: str) -> None:
    if logits.dim() < 1 or logits.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name}: logits must be float32, bfloat16 or float16 [..., num_experts], got "
                         f"{logits.dtype} of shape {tuple(logits.shape)}")


def _check_topk(topk: int, num_experts: int, name: str) -> None:
    if not 1 <= topk <= num_experts:
        raise ValueError(f"{name}: topk must be in [1, num_experts]; got topk={topk}, num_experts={num_experts}")


def _check_score_function(score_function: str, name: str) -> None:
    if score_function not in _SCORE_FUNCTIONS:
        raise ValueError(f"{name}: score_function must be one of {_SCORE_FUNCTIONS}, got {score_function!r}")


def _routing_map_format(routing_map_format: Union[str, RoutingMapFormat, int]) -> RoutingMapFormat:
    """TE accepts the enum, its int value, or the lowercase name."""
    if isinstance(routing_map_format, int):
        if routing_map_format in tuple(RoutingMapFormat):
            return RoutingMapFormat(routing_map_format)
        raise ValueError(f"routing_map_format must be 0 (BYTEMAP) or 1 (BITMAP_U8), got {routing_map_format!r}")
    if isinstance(routing_map_format, str):
        if routing_map_format in ("bytemap", "bitmap_u8"):
            return RoutingMapFormat[routing_map_format.upper()]
        raise ValueError(f"routing_map_format must be 'bytemap' or 'bitmap_u8', got {routing_map_format!r}")
    raise TypeError(f"routing_map_format must be a RoutingMapFormat, an int or a string, got {routing_map_format!r}")


def _check_groups(num_groups: Optional[int], group_topk: int, topk: int, num_experts: int) -> None:
    name = "fused_topk_with_score_function"
    if num_groups is None or num_groups <= 0:
        raise ValueError(f"{name}: group_topk={group_topk} needs num_groups > 0, got num_groups={num_groups}")
    if num_experts % num_groups or topk % group_topk or group_topk > num_groups:
        raise ValueError(f"{name}: num_groups must divide num_experts, group_topk must divide topk and be at most "
                         f"num_groups; got num_experts={num_experts}, num_groups={num_groups}, topk={topk}, "
                         f"group_topk={group_topk}")
    if topk // group_topk > num_experts // num_groups:
        raise ValueError(f"{name}: topk // group_topk = {topk // group_topk} experts per group exceed the group "
                         f"size num_experts // num_groups = {num_experts // num_groups}")


def _check_expert_bias(expert_bias: Tensor, score_function: str, num_experts: int) -> None:
    name = "fused_topk_with_score_function"
    if score_function == "softmax":
        raise ValueError(f"{name}: expert_bias needs score_function 'sigmoid' or 'sqrtsoftplus', got 'softmax'")
    if expert_bias.dtype != torch.float32 or tuple(expert_bias.shape) != (num_experts,):
        raise ValueError(f"{name}: expert_bias must be float32 [num_experts={num_experts}], got {expert_bias.dtype} "
                         f"of shape {tuple(expert_bias.shape)}")


def _check_topk_indices(topk_indices: Tensor, logits: Tensor, topk: int, routing_map_format) -> None:
    name = "fused_topk_with_score_function"
    expected = (*logits.shape[:-1], topk)
    if routing_map_format != RoutingMapFormat.BYTEMAP:
        raise ValueError(f"{name}: topk_indices replaces the routing map; it cannot go with {routing_map_format!r}")
    if topk_indices.dtype not in _INDEX_DTYPES or tuple(topk_indices.shape) != expected:
        raise ValueError(f"{name}: topk_indices must be int16, int32 or int64 of shape [..., topk] = {expected}, got "
                         f"{topk_indices.dtype} of shape {tuple(topk_indices.shape)}")
    if topk_indices.device != logits.device:
        raise ValueError(f"{name}: topk_indices is on {topk_indices.device}, logits on {logits.device}")
    if topk_indices.dtype == torch.int16 and logits.shape[-1] > torch.iinfo(torch.int16).max:
        raise ValueError(f"{name}: int16 topk_indices cannot hold num_experts={logits.shape[-1]}")


def _check_qb(logits: Tensor, topk: int, num_groups, group_topk, score_function: str, expert_bias, histogram,
              bin_bounds, histogram_mode) -> None:
    """Quantile balancing (TE's Kimi K3 router): sigmoid scores, an expert_bias, no groups."""
    name = "fused_topk_with_score_function"
    num_experts = logits.shape[-1]
    if histogram is None or bin_bounds is None or histogram_mode is None:
        raise ValueError(f"{name}: qb_histogram, qb_bin_bounds and qb_histogram_mode go together; got "
                         f"{[v is not None for v in (histogram, bin_bounds, histogram_mode)]} given")
    if score_function != "sigmoid" or expert_bias is None or num_groups is not None or group_topk is not None:
        raise ValueError(f"{name}: quantile balancing needs score_function='sigmoid', an expert_bias and no groups; "
                         f"got {score_function!r}, expert_bias {'given' if expert_bias is not None else 'None'}, "
                         f"num_groups={num_groups}, group_topk={group_topk}")
    if histogram_mode not in ("two_kernel", "fused_atomic"):
        raise ValueError(f"{name}: qb_histogram_mode must be 'two_kernel' or 'fused_atomic', got {histogram_mode!r}")
    if topk >= num_experts:
        raise ValueError(f"{name}: quantile balancing needs topk < num_experts; got topk={topk}, "
                         f"num_experts={num_experts}")
    if (histogram.dtype != torch.int32 or histogram.dim() != 2 or histogram.shape[0] != num_experts
            or histogram.shape[1] == 0 or histogram.device != logits.device):
        raise ValueError(f"{name}: qb_histogram must be int32 [num_experts={num_experts}, num_bins > 0] on "
                         f"{logits.device}, got {histogram.dtype} of shape {tuple(histogram.shape)} on "
                         f"{histogram.device}")
    if bin_bounds.dtype != torch.float32 or tuple(bin_bounds.shape) != (2,) or bin_bounds.device != logits.device:
        raise ValueError(f"{name}: qb_bin_bounds must be float32 [2] on {logits.device}, got {bin_bounds.dtype} of "
                         f"shape {tuple(bin_bounds.shape)} on {bin_bounds.device}")
    lower, upper = bin_bounds.tolist()  # reads the device: TE also checks the values once per tensor version
    if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
        raise ValueError(f"{name}: qb_bin_bounds must be finite with lower < upper, got [{lower}, {upper}]")


def fused_topk_with_score_function(
    logits: Tensor,
    topk: int,
    use_pre_softmax: bool,
    num_groups: Optional[int],
    group_topk: Optional[int],
    scaling_factor: Optional[float],
    score_function: str,
    expert_bias: Optional[Tensor],
    routing_map_format: Union[str, RoutingMapFormat, int] = RoutingMapFormat.BYTEMAP,
    topk_indices: Optional[Tensor] = None,
    qb_histogram: Optional[Tensor] = None,
    qb_bin_bounds: Optional[Tensor] = None,
    qb_histogram_mode: Optional[str] = None,
) -> tuple:
    """Routes each token (row of logits [..., E], float32/bfloat16/float16) to its topk experts.

    score_function "softmax": probs = softmax of the topk logits, or with use_pre_softmax the topk of the
    softmax over all E. "sigmoid" / "sqrtsoftplus" (sqrt(log(1 + e^x))): the topk scores, divided by their
    sum (+1e-20) when topk > 1; expert_bias (float32 [E]) is added for choosing the experts only.
    group_topk (with num_groups dividing E): choose among the group_topk groups of E // num_groups
    contiguous experts whose best topk // group_topk scores sum highest. probs are then multiplied by
    scaling_factor (None: 1).

    qb_histogram (int32 [E, num_bins], updated in place), qb_bin_bounds (float32 [lower, upper]) and
    qb_histogram_mode ("two_kernel" or "fused_atomic", the same here) turn on quantile balancing: sigmoid
    with an expert_bias, the best topk + 1 less the one at the cutoff, and histogram[e, bin of
    cutoff - sigmoid(logit e)] += 1 for every token and expert.

    Returns probs (logits' dtype and shape, zero off the routed experts; differentiable w.r.t. logits) and
    the routing map: bool [..., E] (routing_map_format "bytemap"), uint8 [..., ceil(E / 8)] ("bitmap_u8",
    see RoutingMapFormat), or the topk_indices buffer [..., topk] (int16/32/64) filled with the routed
    experts by descending score.
    """
    name = "fused_topk_with_score_function"
    routing_map_format = _routing_map_format(routing_map_format)
    _check_logits(logits, name)
    num_experts = logits.shape[-1]
    _check_topk(topk, num_experts, name)
    _check_score_function(score_function, name)
    if group_topk is not None and group_topk < 0:
        raise ValueError(f"{name}: group_topk must be None, 0 (no groups) or positive, got {group_topk}")
    if group_topk:
        _check_groups(num_groups, group_topk, topk, num_experts)
    if expert_bias is not None:
        _check_expert_bias(expert_bias, score_function, num_experts)
    if topk_indices is not None:
        _check_topk_indices(topk_indices, logits, topk, routing_map_format)
    if any(v is not None for v in (qb_histogram, qb_bin_bounds, qb_histogram_mode)):
        _check_qb(logits, topk, num_groups, group_topk, score_function, expert_bias, qb_histogram, qb_bin_bounds,
                  qb_histogram_mode)
    probs, indices, _ = _TopkWithScoreFunction.apply(
        logits, topk, use_pre_softmax, num_groups, group_topk, scaling_factor, score_function, expert_bias,
        qb_histogram, qb_bin_bounds)
    if topk_indices is not None:
        return probs, topk_indices.copy_(indices.view(topk_indices.shape))
    return probs, _routing_map(indices, logits.shape, routing_map_format)


def _routing_map(indices: Tensor, shape: torch.Size, routing_map_format: RoutingMapFormat) -> Tensor:
    """The [tokens, topk] indices as a bool map, or bit-packed as TE's BITMAP_U8 (distinct bits: add = or)."""
    num_tokens, num_experts = indices.shape[0], shape[-1]
    if routing_map_format == RoutingMapFormat.BYTEMAP:
        routing_map = torch.zeros(num_tokens, num_experts, dtype=torch.bool, device=indices.device)
        return routing_map.scatter_(1, indices, True).view(shape)
    bitmap = torch.zeros(num_tokens, (num_experts + 7) // 8, dtype=torch.uint8, device=indices.device)
    bitmap.scatter_add_(1, indices // 8, torch.bitwise_left_shift(1, indices % 8).to(torch.uint8))
    return bitmap.view(*shape[:-1], bitmap.shape[1])


def fused_compute_score_for_moe_aux_loss(
    logits: Tensor,
    topk: int,
    score_function: str,
    routing_map_format: Union[str, RoutingMapFormat, int] = RoutingMapFormat.BYTEMAP,
) -> tuple:
    """Scores for the load-balancing loss from logits [..., E] (float32/bfloat16/float16): softmax over all
    E, or sigmoid / sqrtsoftplus divided by their sum over all E (+1e-20).

    Returns the routing map of each token's topk best scores (as in fused_topk_with_score_function) and the
    scores, float32 with the logits' shape, differentiable w.r.t. logits (the gradient in the logits' dtype).
    """
    name = "fused_compute_score_for_moe_aux_loss"
    routing_map_format = _routing_map_format(routing_map_format)
    _check_logits(logits, name)
    _check_topk(topk, logits.shape[-1], name)
    _check_score_function(score_function, name)
    scores, indices = _ScoresForAuxLoss.apply(logits, topk, score_function)
    return _routing_map(indices, logits.shape, routing_map_format), scores


def fused_moe_aux_loss(
    probs: Tensor,
    tokens_per_expert: Tensor,
    total_num_tokens: Union[int, Tensor],
    num_experts: int,
    topk: int,
    coeff: float,
) -> Tensor:
    """Switch-Transformer load-balancing loss: sum_e (sum_t probs[t, e]) * tokens_per_expert[e] * C with
    C = num_experts * coeff / topk / total_num_tokens^2, C computed in float32 step by step as TE does.

    probs: [tokens, cols] float32/bfloat16/float16, cols a multiple of num_experts (sequences side by side
    for the sequence-level loss). tokens_per_expert: cols counts, int16/int32/int64/float32/bfloat16.
    total_num_tokens: an int, or a one-element tensor read on the device (no host sync): int64 in TE, and
    here also a float, as Megatron's padding-mask path computes it (a sum of counts / topk).
    Returns a 0-dim tensor in probs' dtype, differentiable w.r.t. probs.
    """
    name = "fused_moe_aux_loss"
    if probs.dim() != 2 or probs.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name}: probs must be float32, bfloat16 or float16 [tokens, cols], got {probs.dtype} of "
                         f"shape {tuple(probs.shape)}")
    cols = probs.shape[1]
    if num_experts <= 0 or topk <= 0 or cols % num_experts:
        raise ValueError(f"{name}: num_experts and topk must be positive and num_experts divide probs' columns; "
                         f"got num_experts={num_experts}, topk={topk}, probs of shape {tuple(probs.shape)}")
    if tokens_per_expert.numel() != cols or tokens_per_expert.dtype not in _INDEX_DTYPES + _FLOAT_DTYPES[:2]:
        raise ValueError(f"{name}: tokens_per_expert must hold probs.shape[1]={cols} int16/int32/int64/float32/"
                         f"bfloat16 counts, got {tokens_per_expert.dtype} of shape {tuple(tokens_per_expert.shape)}")
    if isinstance(total_num_tokens, Tensor):
        if total_num_tokens.numel() != 1 or total_num_tokens.dtype == torch.bool or total_num_tokens.is_complex():
            raise ValueError(f"{name}: a tensor total_num_tokens must hold one count, got {total_num_tokens.dtype} "
                             f"of shape {tuple(total_num_tokens.shape)}")
        total = total_num_tokens.reshape(()).to(device=probs.device, dtype=torch.float32)
    elif total_num_tokens <= 0:
        raise ValueError(f"{name}: total_num_tokens must be positive, got {total_num_tokens}")
    else:
        total = torch.full((), float(total_num_tokens), dtype=torch.float32, device=probs.device)
    # Each step rounded to float32, in TE's order: (num_experts * coeff) / topk / total / total.
    c = torch.full((), float(num_experts), dtype=torch.float32, device=probs.device) * coeff / topk / total / total
    return _MoEAuxLoss.apply(probs, tokens_per_expert.reshape(cols), c)

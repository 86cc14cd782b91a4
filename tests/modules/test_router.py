"""TE's MoE router functions (transformer_engine.pytorch.router): forward and gradients against an independent
autograd reference written here with masks and sorts (fp32/bf16/fp16 logits, odd expert counts, zero tokens,
non-contiguous and 3-D logits, groups, expert_bias, scaling_factor, quantile balancing, both routing-map
formats and dense indices), against Megatron-Core's unfused functions when megatron.core imports, and the
errors for bad arguments."""
import math

import pytest
import torch
import torch.nn.functional as F

from transformer_engine.pytorch.router import (RoutingMapFormat, fused_compute_score_for_moe_aux_loss,
                                               fused_moe_aux_loss, fused_topk_with_score_function)
from numerics import assert_close, assert_value_error_naming


def ref_topk(logits, topk, use_pre_softmax=False, num_groups=None, group_topk=None, scaling_factor=None,
             score_function="softmax", expert_bias=None):
    """Routing by full-width masks and sorts (no gather/scatter), differentiated by autograd."""
    x = logits.reshape(-1, logits.shape[-1]).float()
    num_tokens, num_experts = x.shape
    if score_function == "softmax":
        scores = torch.softmax(x, dim=-1) if use_pre_softmax else x
    else:
        scores = torch.sigmoid(x) if score_function == "sigmoid" else F.softplus(x).sqrt()
    choice = scores.detach() + (0.0 if expert_bias is None else expert_bias)
    if group_topk:
        in_groups = choice.view(num_tokens, num_groups, -1)
        group_score = in_groups.sort(dim=-1, descending=True).values[..., : topk // group_topk].sum(-1)
        best_groups = group_score.argsort(dim=-1, descending=True)[:, :group_topk]
        allowed = torch.zeros(num_tokens, num_groups, dtype=torch.bool)
        allowed[torch.arange(num_tokens)[:, None], best_groups] = True
        choice = choice.where(allowed.repeat_interleave(num_experts // num_groups, dim=1), -math.inf)
    routed = torch.zeros(num_tokens, num_experts, dtype=torch.bool)
    routed[torch.arange(num_tokens)[:, None], choice.argsort(dim=-1, descending=True)[:, :topk]] = True
    if score_function == "softmax":
        probs = scores * routed if use_pre_softmax else torch.softmax(x.masked_fill(~routed, -math.inf), dim=-1)
    else:
        probs = scores * routed
        probs = probs / (probs.sum(dim=-1, keepdim=True) + 1e-20) if topk > 1 else probs
    if scaling_factor is not None:
        probs = probs * scaling_factor
    return probs.to(logits.dtype).view(logits.shape), routed.view(logits.shape)


def ref_scores_for_aux_loss(logits, topk, score_function):
    x = logits.float()
    if score_function == "softmax":
        scores = torch.softmax(x, dim=-1)
    else:
        act = torch.sigmoid(x) if score_function == "sigmoid" else F.softplus(x).sqrt()
        scores = act / (act.sum(dim=-1, keepdim=True) + 1e-20)
    best = scores.detach().argsort(dim=-1, descending=True)[..., :topk]
    return torch.zeros_like(scores, dtype=torch.bool).scatter(-1, best, True), scores


def distinct_logits(num_tokens, num_experts, dtype=torch.float32, num_groups=None, per_group=1):
    """randn * 2 in dtype, each row redrawn until no two logits (nor two groups' sums of their best
    per_group) are equal: bf16 rows tie often, and then torch.topk and the reference may pick differently."""
    rows = []
    while len(rows) < num_tokens:
        row = (torch.randn(num_experts) * 2).to(dtype)
        group_sums = row.float().view(num_groups or 1, -1).topk(per_group).values.sum(-1)
        if row.unique().numel() == num_experts and group_sums.unique().numel() == group_sums.numel():
            rows.append(row)
    return torch.stack(rows) if rows else torch.empty(0, num_experts, dtype=dtype)


def forward_backward(fn, logits, grad_weights, *args, **kwargs):
    """fn's two outputs and d(sum(out * grad_weights))/d logits, out being the differentiable one."""
    logits = logits.detach().requires_grad_()
    first, second = fn(logits, *args, **kwargs)
    out = second if first.dtype == torch.bool or first.dtype == torch.uint8 else first
    (out.float() * grad_weights).sum().backward()
    return first, second, logits.grad


def unpack_bits(bitmap, num_experts):
    bits = (bitmap.long()[..., None] >> torch.arange(8, device=bitmap.device)) & 1
    return bits.flatten(-2)[..., :num_experts].bool()


DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (num_tokens, num_experts, topk, num_groups, group_topk)
ROUTING_SHAPES = [(37, 13, 3, None, None), (29, 24, 4, 4, 2), (16, 8, 1, None, None), (5, 6, 6, 3, 3)]


@pytest.mark.parametrize("score_function,use_pre_softmax,bias", [
    ("softmax", False, False), ("softmax", True, False), ("sigmoid", False, False), ("sigmoid", False, True),
    ("sqrtsoftplus", False, False), ("sqrtsoftplus", False, True)])
@pytest.mark.parametrize("shape", ROUTING_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_topk_against_reference(device, score_function, use_pre_softmax, bias, shape, dtype):
    num_tokens, num_experts, topk, num_groups, group_topk = shape
    logits = distinct_logits(num_tokens, num_experts, dtype, num_groups, topk // (group_topk or topk))
    expert_bias = torch.randn(num_experts) * 0.3 if bias else None
    grad_weights = torch.randn(num_tokens, num_experts)
    kwargs = dict(use_pre_softmax=use_pre_softmax, num_groups=num_groups, group_topk=group_topk,
                  scaling_factor=1.7, score_function=score_function, expert_bias=expert_bias)
    probs_ref, map_ref, grad_ref = forward_backward(ref_topk, logits, grad_weights, topk, **kwargs)
    probs, routing_map, grad = forward_backward(
        fused_topk_with_score_function, logits.to(device), grad_weights.to(device), topk, use_pre_softmax,
        num_groups, group_topk, 1.7, score_function, None if expert_bias is None else expert_bias.to(device))
    assert probs.dtype == dtype and routing_map.dtype == torch.bool and grad.dtype == dtype
    assert torch.equal(routing_map.cpu(), map_ref)
    assert (routing_map.sum(-1) == topk).all()
    assert_close(probs, probs_ref, name="probs")
    assert_close(grad, grad_ref, name="grad_logits", atol=1e-5 if dtype == torch.float32 else 1e-3)


def test_expert_bias_chooses_but_does_not_weigh():
    logits = torch.randn(11, 10)
    expert_bias = torch.zeros(10)
    expert_bias[[2, 7]] = 100.0  # experts 2 and 7 win every token, with their unbiased sigmoid weights
    probs, routing_map = fused_topk_with_score_function(logits, 2, False, None, None, None, "sigmoid", expert_bias)
    assert routing_map[:, [2, 7]].all() and routing_map.sum() == 22
    picked = torch.sigmoid(logits[:, [2, 7]])
    assert_close(probs[:, [2, 7]], picked / picked.sum(-1, keepdim=True))


def test_groups_restrict_the_choice():
    # Expert 0 has the best single score, but its group (0-3) loses on the sum of its best two.
    logits = torch.tensor([[5.0, -5, -5, -5, 3, 2.9, -5, -5, 2.5, 2.4, -5, -5]])
    _, routing_map = fused_topk_with_score_function(logits, 2, False, 3, 1, None, "softmax", None)
    assert routing_map.nonzero()[:, 1].tolist() == [4, 5]
    _, routing_map = fused_topk_with_score_function(logits, 2, False, None, None, None, "softmax", None)
    assert routing_map.nonzero()[:, 1].tolist() == [0, 4]


def test_layouts_and_sizes():
    base = torch.randn(24, 15)  # logits: its transpose, non-contiguous [15, 24]
    logits = base.t()
    weights = torch.randn(15, 24)
    for fn, args in [(fused_topk_with_score_function, (4, False, 4, 2, 0.5, "sigmoid", None)),
                     (fused_topk_with_score_function, (3, True, None, None, None, "softmax", None)),
                     (fused_compute_score_for_moe_aux_loss, (4, "sqrtsoftplus"))]:
        strided = forward_backward(fn, logits, weights, *args)
        dense = forward_backward(fn, logits.contiguous(), weights, *args)
        folded = forward_backward(fn, logits.reshape(3, 5, 24), weights.reshape(3, 5, 24), *args)
        for a, b, c in zip(strided, dense, folded):
            assert torch.equal(a, b) and torch.equal(a, c.reshape(a.shape))
    one_token = fused_topk_with_score_function(logits[0], 2, False, None, None, None, "softmax", None)
    assert one_token[0].shape == (24,) and one_token[1].shape == (24,)


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 8)], ids=str)
def test_zero_tokens(shape):
    logits = torch.randn(shape, requires_grad=True)
    probs, routing_map = fused_topk_with_score_function(logits, 2, False, 2, 1, None, "sigmoid", torch.zeros(8))
    scores_map, scores = fused_compute_score_for_moe_aux_loss(logits, 2, "softmax", "bitmap_u8")
    assert probs.shape == shape and routing_map.shape == shape and scores.shape == shape
    assert scores_map.shape == (*shape[:-1], 1) and scores_map.dtype == torch.uint8
    (probs.sum() + scores.sum()).backward()
    assert logits.grad.shape == shape
    loss = fused_moe_aux_loss(probs.reshape(0, 8).detach(), torch.ones(8, dtype=torch.int64), 1, 8, 2, 0.1)
    assert loss.item() == 0.0


def test_routing_map_formats_and_dense_indices():
    logits = torch.randn(9, 21)
    args = (5, False, None, None, None, "sigmoid", None)
    probs, bytemap = fused_topk_with_score_function(logits, *args)
    for fmt in ["bitmap_u8", RoutingMapFormat.BITMAP_U8, 1]:
        _, bitmap = fused_topk_with_score_function(logits, *args, routing_map_format=fmt)
        assert bitmap.dtype == torch.uint8 and bitmap.shape == (9, 3)
        assert torch.equal(unpack_bits(bitmap, 21), bytemap)
    bitmap, _ = fused_compute_score_for_moe_aux_loss(logits, 5, "sigmoid", RoutingMapFormat.BITMAP_U8)
    assert torch.equal(unpack_bits(bitmap, 21), fused_compute_score_for_moe_aux_loss(logits, 5, "sigmoid")[0])
    for dtype in [torch.int16, torch.int32, torch.int64]:
        buffer = torch.full((9, 5), -1, dtype=dtype)
        dense_probs, indices = fused_topk_with_score_function(logits, *args, topk_indices=buffer)
        assert indices is buffer and torch.equal(dense_probs, probs)
        assert torch.equal(torch.zeros_like(bytemap).scatter(1, indices.long(), True), bytemap)
        picked = logits.gather(1, indices.long())
        assert (picked[:, :-1] >= picked[:, 1:]).all()  # by descending score


def test_sqrtsoftplus_gradient_stays_finite():
    # softplus underflows to 0 at -200 (autograd: 0 * inf = nan); above 20 it is x itself.
    logits = torch.tensor([[-200.0, -50.0, 25.0, 0.5], [-200.0, -201.0, -202.0, -203.0]], requires_grad=True)
    probs, _ = fused_topk_with_score_function(logits, 4, False, None, None, None, "sqrtsoftplus", None)
    _, scores = fused_compute_score_for_moe_aux_loss(logits, 2, "sqrtsoftplus")
    (probs * torch.randn(2, 4)).sum().backward()
    (scores * torch.randn(2, 4)).sum().backward()
    assert torch.isfinite(logits.grad).all() and torch.isfinite(probs).all() and torch.isfinite(scores).all()
    assert probs[1].sum() == 0  # every score underflowed: zeros, not nan, thanks to the 1e-20


@pytest.mark.parametrize("score_function", ["softmax", "sigmoid", "sqrtsoftplus"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_scores_for_aux_loss_against_reference(device, score_function, dtype):
    logits = distinct_logits(33, 17, dtype)
    weights = torch.randn(33, 17)
    map_ref, scores_ref, grad_ref = forward_backward(ref_scores_for_aux_loss, logits, weights, 4, score_function)
    routing_map, scores, grad = forward_backward(fused_compute_score_for_moe_aux_loss, logits.to(device),
                                                 weights.to(device), 4, score_function)
    assert scores.dtype == torch.float32 and grad.dtype == dtype and routing_map.dtype == torch.bool
    assert torch.equal(routing_map.cpu(), map_ref)
    assert_close(scores, scores_ref, name="scores")
    assert_close(grad, grad_ref, name="grad_logits", atol=1e-5 if dtype == torch.float32 else 1e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("count_dtype", [torch.int32, torch.int64, torch.float32, torch.bfloat16], ids=str)
def test_aux_loss_against_formula(device, dtype, count_dtype):
    num_experts, topk, coeff = 12, 3, 1e-2
    probs = torch.rand(40, 2 * num_experts).to(dtype)  # two sequences side by side (sequence-level loss)
    tokens_per_expert = torch.randint(0, 30, (2 * num_experts,)).to(count_dtype)
    c = num_experts * coeff / topk / 40 / 40
    expected = (probs.double().sum(0) * tokens_per_expert.double()).sum() * c
    for total in [40, torch.tensor(40), torch.tensor(120.0) / 3]:  # the last as Megatron's padding-mask path
        p = probs.detach().to(device).requires_grad_()
        loss = fused_moe_aux_loss(p, tokens_per_expert.to(device), total if isinstance(total, int) else
                                  total.to(device), num_experts, topk, coeff)
        loss.backward(torch.tensor(2.0, dtype=dtype, device=device))
        assert loss.dtype == dtype and loss.shape == ()
        assert_close(loss, expected, name="aux_loss")
        grad_row = (2 * c * tokens_per_expert.double()).expand(40, -1)
        assert p.grad.dtype == dtype and p.grad.is_contiguous()
        assert_close(p.grad, grad_row, name="grad_probs")


def test_quantile_balancing():
    num_tokens, num_experts, topk, num_bins = 23, 10, 3, 7
    logits = torch.randn(num_tokens, num_experts, requires_grad=True)
    expert_bias = torch.randn(num_experts) * 0.2
    bounds = torch.tensor([-0.5, 0.6])
    histogram = torch.zeros(num_experts, num_bins, dtype=torch.int32)
    qb = dict(qb_histogram=histogram, qb_bin_bounds=bounds, qb_histogram_mode="fused_atomic")
    probs, routing_map = fused_topk_with_score_function(logits, topk, False, None, None, 1.3, "sigmoid",
                                                        expert_bias, **qb)
    raw = torch.sigmoid(logits.detach())
    biased = raw + expert_bias
    cutoff = biased.sort(dim=-1, descending=True).values[:, topk]  # the (topk + 1)-th best, dropped
    assert torch.equal(routing_map, biased > cutoff[:, None])
    probs_ref, _ = ref_topk(logits.detach(), topk, scaling_factor=1.3, score_function="sigmoid",
                            expert_bias=expert_bias)
    assert_close(probs, probs_ref)
    scale = torch.tensor(float(num_bins)) / (bounds[1] - bounds[0])
    bins = torch.floor((cutoff[:, None] - raw - bounds[0]) * scale).clamp(0, num_bins - 1).long()
    expected = torch.stack([torch.bincount(bins[:, e], minlength=num_bins) for e in range(num_experts)])
    assert torch.equal(histogram, expected.int())
    fused_topk_with_score_function(logits, topk, False, None, None, 1.3, "sigmoid", expert_bias, **qb)
    assert torch.equal(histogram, 2 * expected.int())  # accumulates
    probs.sum().backward()
    assert torch.isfinite(logits.grad).all()
    # Two experts tied at the cutoff: the higher index is the one dropped.
    tied = torch.tensor([[3.0, 1.0, 2.0, 0.0, 2.0, -1.0]])
    _, routing_map = fused_topk_with_score_function(tied, 2, False, None, None, None, "sigmoid", torch.zeros(6),
                                                    qb_histogram=torch.zeros(6, 2, dtype=torch.int32),
                                                    qb_bin_bounds=bounds, qb_histogram_mode="two_kernel")
    assert routing_map.nonzero()[:, 1].tolist() == [0, 2]


def test_bad_input():
    logits = torch.randn(4, 12)
    topk = fused_topk_with_score_function
    h = torch.zeros(12, 4, dtype=torch.int32)
    bounds = torch.tensor([0.0, 1.0])
    cases = [
        (lambda: topk(logits.double(), 2, False, None, None, None, "softmax", None), ["logits", "float64"]),
        (lambda: topk(torch.tensor(1.0), 1, False, None, None, None, "softmax", None), ["logits", "()"]),
        (lambda: topk(logits, 13, False, None, None, None, "softmax", None), ["topk=13", "num_experts=12"]),
        (lambda: topk(logits, 0, False, None, None, None, "softmax", None), ["topk=0"]),
        (lambda: topk(logits, 2, False, None, None, None, "relu", None), ["score_function", "'relu'"]),
        (lambda: topk(logits, 4, False, 5, 1, None, "softmax", None), ["num_groups=5", "num_experts=12"]),
        (lambda: topk(logits, 3, False, 4, 2, None, "softmax", None), ["topk=3", "group_topk=2"]),
        (lambda: topk(logits, 4, False, 2, 4, None, "softmax", None), ["group_topk=4", "num_groups=2"]),
        (lambda: topk(logits, 4, False, 6, 1, None, "softmax", None), ["= 4", "= 2"]),
        (lambda: topk(logits, 4, False, None, 2, None, "softmax", None), ["num_groups=None"]),
        (lambda: topk(logits, 2, False, None, None, None, "softmax", torch.zeros(12)), ["expert_bias", "softmax"]),
        (lambda: topk(logits, 2, False, None, None, None, "sigmoid", torch.zeros(11)), ["expert_bias", "(11,)"]),
        (lambda: topk(logits, 2, False, None, None, None, "sigmoid", torch.zeros(12).half()),
         ["expert_bias", "float16"]),
        (lambda: topk(logits, 2, False, None, None, None, "sigmoid", None, "bits"), ["routing_map_format", "'bits'"]),
        (lambda: topk(logits, 2, False, None, None, None, "sigmoid", None, 2), ["routing_map_format", "2"]),
        (lambda: topk(logits, 2, False, None, None, None, "sigmoid", None,
                      topk_indices=torch.zeros(4, 3, dtype=torch.int64)), ["topk_indices", "(4, 2)", "(4, 3)"]),
        (lambda: topk(logits, 2, False, None, None, None, "sigmoid", None,
                      topk_indices=torch.zeros(4, 2)), ["topk_indices", "float32"]),
        (lambda: topk(logits, 2, False, None, None, None, "sigmoid", None, "bitmap_u8",
                      topk_indices=torch.zeros(4, 2, dtype=torch.int64)), ["topk_indices", "BITMAP_U8"]),
        (lambda: topk(logits, 2, False, None, None, None, "sigmoid", torch.zeros(12), qb_histogram=h),
         ["qb_histogram", "qb_bin_bounds"]),
        (lambda: topk(logits, 2, False, None, None, None, "softmax", None, qb_histogram=h, qb_bin_bounds=bounds,
                      qb_histogram_mode="two_kernel"), ["sigmoid", "'softmax'"]),
        (lambda: topk(logits, 2, False, None, None, None, "sigmoid", torch.zeros(12), qb_histogram=h,
                      qb_bin_bounds=bounds, qb_histogram_mode="atomic"), ["qb_histogram_mode", "'atomic'"]),
        (lambda: topk(logits, 12, False, None, None, None, "sigmoid", torch.zeros(12), qb_histogram=h,
                      qb_bin_bounds=bounds, qb_histogram_mode="two_kernel"), ["topk=12", "num_experts=12"]),
        (lambda: topk(logits, 2, False, None, None, None, "sigmoid", torch.zeros(12), qb_histogram=h[:5],
                      qb_bin_bounds=bounds, qb_histogram_mode="two_kernel"), ["qb_histogram", "(5, 4)"]),
        (lambda: topk(logits, 2, False, None, None, None, "sigmoid", torch.zeros(12), qb_histogram=h,
                      qb_bin_bounds=torch.tensor([1.0, 0.0]), qb_histogram_mode="two_kernel"),
         ["qb_bin_bounds", "[1.0, 0.0]"]),
        (lambda: fused_compute_score_for_moe_aux_loss(logits, 13, "softmax"), ["topk=13", "num_experts=12"]),
        (lambda: fused_compute_score_for_moe_aux_loss(logits, 2, "tanh"), ["score_function", "'tanh'"]),
        (lambda: fused_moe_aux_loss(logits[0], torch.ones(12), 4, 12, 2, 0.1), ["probs", "(12,)"]),
        (lambda: fused_moe_aux_loss(logits, torch.ones(12), 4, 5, 2, 0.1), ["num_experts=5", "(4, 12)"]),
        (lambda: fused_moe_aux_loss(logits, torch.ones(11), 4, 12, 2, 0.1), ["tokens_per_expert", "(11,)"]),
        (lambda: fused_moe_aux_loss(logits, torch.ones(12).half(), 4, 12, 2, 0.1), ["tokens_per_expert", "float16"]),
        (lambda: fused_moe_aux_loss(logits, torch.ones(12), 0, 12, 2, 0.1), ["total_num_tokens", "0"]),
        (lambda: fused_moe_aux_loss(logits, torch.ones(12), torch.tensor([4, 4]), 12, 2, 0.1),
         ["total_num_tokens", "(2,)"]),
        (lambda: fused_moe_aux_loss(logits, torch.ones(12), 4, 12, 0, 0.1), ["topk=0"]),
    ]
    for call, words in cases:
        assert_value_error_naming(call, words)


@pytest.fixture(scope="module")
def moe_utils():
    return pytest.importorskip("megatron.core.transformer.moe.moe_utils")


@pytest.mark.parametrize("score_function,use_pre_softmax,bias,groups", [
    ("softmax", False, False, None), ("softmax", True, False, (4, 2)), ("sigmoid", False, True, (4, 2)),
    ("sqrtsoftplus", False, True, None), ("sigmoid", False, False, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_against_megatron(moe_utils, score_function, use_pre_softmax, bias, groups, dtype):
    num_groups, group_topk = groups or (None, None)
    logits = distinct_logits(45, 32, dtype, num_groups, 6 // (group_topk or 6))
    weights = torch.randn(45, 32)
    kwargs = dict(use_pre_softmax=use_pre_softmax, num_groups=num_groups, group_topk=group_topk,
                  scaling_factor=2.5, score_function=score_function,
                  expert_bias=torch.randn(32) * 0.3 if bias else None)
    ours = forward_backward(fused_topk_with_score_function, logits, weights, 6, **kwargs)
    theirs = forward_backward(moe_utils.topk_routing_with_score_function, logits, weights, 6, **kwargs)
    assert torch.equal(ours[1], theirs[1])
    assert_close(ours[0], theirs[0], name="probs")
    assert_close(ours[2], theirs[2], name="grad_logits", atol=1e-5 if dtype == torch.float32 else 1e-3)

    ours = forward_backward(fused_compute_score_for_moe_aux_loss, logits, weights, 6, score_function)
    theirs = forward_backward(moe_utils.compute_routing_scores_for_aux_loss, logits, weights, 6, score_function)
    assert torch.equal(ours[0], theirs[0])
    assert_close(ours[1], theirs[1], name="scores")
    assert_close(ours[2], theirs[2], name="grad_logits", atol=1e-5 if dtype == torch.float32 else 1e-3)

    probs = ours[1].detach().requires_grad_()
    tokens_per_expert = ours[0].sum(0)
    losses = []
    for fused in [True, False]:
        loss = moe_utils.switch_load_balancing_loss_func(probs, tokens_per_expert, 45, 6, 32, 1e-2, fused=fused)
        loss.backward()
        losses.append((loss, probs.grad))
        probs.grad = None
    assert_close(losses[0][0], losses[1][0], name="aux_loss")
    assert_close(losses[0][1], losses[1][1], name="grad_probs")


def test_megatron_fused_path_calls_ours(moe_utils):
    """Megatron imports these functions when TE >= 2.7 and calls them by keyword (moe_router_fusion)."""
    assert moe_utils.fused_topk_with_score_function is fused_topk_with_score_function
    logits = torch.randn(20, 16)
    args = dict(topk=4, use_pre_softmax=False, num_groups=4, group_topk=2, scaling_factor=None,
                score_function="sigmoid", expert_bias=torch.randn(16))
    fused = moe_utils.topk_routing_with_score_function(logits, fused=True, **args)
    unfused = moe_utils.topk_routing_with_score_function(logits, fused=False, **args)
    assert torch.equal(fused[1], unfused[1])
    assert_close(fused[0], unfused[0])

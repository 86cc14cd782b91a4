"""Cross-entropy over logits near fp32's largest values (issue 43, item 4).

With label smoothing eps and row max m the loss is
    log s + (1 - eps) (m - x_t) + eps mean(m - x)          (s = sum exp(x - m))
three terms that are never negative, so it is finite whenever each weighted term is, though
m - x_t or mean(m - x) alone may lie past fp32's range: over [-3e38, 3e38] with eps 0.1 and the
target at the max, mean(m - x) = 3e38 and the loss 3e37, and with the target at -3e38 and eps
0.9, m - x_t = 6e38 and the loss 3.3e38. Every implementation (the CPU kernel on every SIMD
tier, the Triton kernels, the reference, the vocabulary split over shards) must form its terms
without overflowing, give inf exactly where the exact loss is past fp32's range, and a finite
gradient softmax - eps / V - (1 - eps) onehot throughout; fp32 and bf16 logits, ignored rows,
-inf logits (with the split vocabulary, a shard of them alone). The truth is float64 arithmetic on the
same logits (which holds every one of these values): torch's cross_entropy for the loss (a -inf
logit makes a smoothed loss inf, as in torch and TE), the gradient's formula for the gradient.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import transformer_engine.pytorch as te
from gloo_ranks import run_on_ranks
from numerics import assert_close, tolerances
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.custom_ops.sharded_cross_entropy import loss_from_sums, rank_sums

ops = torch.ops.portable_te
IGNORE = -100
BIG = 3e38
SMOOTHINGS = [0.0, 0.1, 0.5, 0.9, 1.0]
DTYPES = [torch.float32, torch.bfloat16]
FLT_MAX = torch.finfo(torch.float32).max


def long_rows(dtype):
    """[10, 150] (a vocabulary with 4-vector steps, lone vectors and a tail on every SIMD tier)
    and its targets: extremes among N(0, 9) logits, in vector bodies and the tail."""
    generator = torch.Generator().manual_seed(43)
    x = torch.randn(10, 150, generator=generator, dtype=torch.float64) * 3
    target = torch.tensor([17, 149, 149, 149, 0, 1, 3, 5, IGNORE, 31])
    top = torch.finfo(dtype).max
    x[0] = BIG  # all equal: log V
    x[1] = -BIG
    x[2, 7], x[2, 149] = BIG, -BIG  # m - x_t = 6e38, the target in the tail
    x[3, :75], x[3, 149] = -BIG, BIG  # mean(m - x) = 4.5e38, the target at the max
    x[4], x[4, 100] = 1e30, BIG  # 1e30 beside 3e38 (issue 31)
    x[5, ::2], x[5, 1::2] = BIG, -BIG  # the target at -3e38
    x[6, 3], x[6, 140:] = top, -top  # the largest finite logits of the dtype
    x[7, 10], x[7, 20], x[7, 30] = float("-inf"), BIG, -BIG
    x[8], x[8, 64] = -BIG, BIG  # ignored
    x[9, 31], x[9, 32] = BIG, -BIG  # across a vector boundary, the target at the max
    return x.to(dtype), target


def short_rows(dtype):
    """Three classes: the issue's [1e30, 1e30, 3e38] and its neighbours, every target but a
    -inf one (whose (1 - eps) (m - x_t) is 0 * inf, NaN, with eps 1). Split in three shards, the
    last row's third holds a -inf logit alone."""
    rows = [([1e30, 1e30, BIG], (0, 1, 2)), ([-BIG, BIG, 1e30], (0, 1, 2)), ([-BIG, -BIG, BIG], (0, 1, 2)),
            ([BIG, BIG, BIG], (0, 1, 2)), ([-BIG, BIG, float("-inf")], (0, 1))]
    x = torch.tensor([row for row, targets in rows for _ in targets], dtype=torch.float64)
    return x.to(dtype), torch.tensor([t for _, targets in rows for t in targets])


CASES = {"long": long_rows, "short": short_rows}


def truth(x, target, eps):
    """float64 (loss [N], gradient [N, V]) of the logits x as they are (in their dtype)."""
    x64 = x.double()
    loss = F.cross_entropy(x64, target, label_smoothing=eps, ignore_index=IGNORE, reduction="none")
    kept = target != IGNORE
    onehot = F.one_hot(torch.where(kept, target, 0), x.shape[-1]).double()
    grad = torch.softmax(x64, dim=-1) - eps / x.shape[-1] - (1 - eps) * onehot
    return loss, torch.where(kept.unsqueeze(-1), grad, 0.0)


def assert_matches_truth(loss, grad, x, target, eps):
    want_loss, want_grad = truth(x, target, eps)
    # None of the cases sits within 1% of fp32's largest value, where rounding could go either way.
    ratio = want_loss / FLT_MAX
    assert not ((ratio > 0.99) & (ratio < 1.01)).any()
    want = want_loss.float()  # inf where the exact loss is past fp32's range
    assert loss.dtype == torch.float32
    assert_close(loss.cpu(), want, name=f"loss (eps {eps})", rtol=1e-5, atol=1e-5)
    if grad is not None:
        assert grad.dtype == x.dtype and torch.isfinite(grad).all(), f"grad (eps {eps}) not finite"
        assert_close(grad.cpu(), want_grad.to(x.dtype), name=f"grad (eps {eps})", **tolerances(x.dtype))


def on(device, x, target):
    return x.to(device), target.to(device)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reference_is_exact(case, dtype):
    """The reference is the other tests' oracle: it must hold to the float64 truth itself."""
    x, target = CASES[case](dtype)
    for eps in SMOOTHINGS:
        loss, grad = reference.cross_entropy_fwd(x, target, eps, IGNORE, True)
        assert_matches_truth(loss, grad, x, target, eps)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_kernel_on_every_tier(cpu_tier, case, dtype):
    x, target = CASES[case](dtype)
    for eps in SMOOTHINGS:
        assert_matches_truth(*ops.cross_entropy_fwd(x, target, eps, IGNORE, True), x, target, eps)
        loss, _ = ops.cross_entropy_fwd(x, target, eps, IGNORE, False)  # the loss alone
        assert_matches_truth(loss, None, x, target, eps)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_backend(backend, case, dtype):
    """The CPU kernels and the Triton kernels (in the interpreter without a GPU)."""
    x, target = on(backend.device, *CASES[case](dtype))
    for eps in SMOOTHINGS:
        assert_matches_truth(*ops.cross_entropy_fwd(x, target, eps, IGNORE, True), x.cpu(), target.cpu(), eps)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_through_autograd(backend, dtype):
    """The public entry points, the gradient scaled in the backward (unreduced loss) or in the
    forward (mean), and TE's parallel_cross_entropy."""
    x, target = long_rows(dtype)
    grad_loss = torch.linspace(0.5, 2.0, target.numel(), dtype=torch.float64)
    kept = (target != IGNORE).sum()
    for eps in (0.1, 0.9):
        want_loss, want_grad = truth(x, target, eps)
        logits = x.clone().to(backend.device).requires_grad_()
        loss = te.kernels.cross_entropy(logits, target.to(backend.device), label_smoothing=eps, reduction="none")
        loss.backward(grad_loss.float().to(backend.device))
        assert_close(loss.cpu(), want_loss.float(), rtol=1e-5)
        assert_close(logits.grad.cpu(), (want_grad * grad_loss.unsqueeze(-1)).to(dtype), **tolerances(dtype))
        for run in (lambda x, t: te.kernels.cross_entropy(x, t, label_smoothing=eps),
                    lambda x, t: te.parallel_cross_entropy(x.unsqueeze(0), t.unsqueeze(0), eps, True)):
            logits = x.clone().to(backend.device).requires_grad_()
            run(logits, target.to(backend.device)).backward()
            assert torch.isfinite(logits.grad).all()
            assert_close(logits.grad.cpu(), (want_grad / kept).to(dtype), **tolerances(dtype))


def sharded(x, target, eps, shards):
    """(loss, grad) from the shards' partials, combined as the ranks' all-reduces combine them."""
    width = x.shape[-1] // shards
    pieces = [x[:, i * width:(i + 1) * width].contiguous() for i in range(shards)]
    partials = [ops.cross_entropy_partials(p, target, i * width, IGNORE) for i, p in enumerate(pieces)]
    row_max = torch.stack([p[:, 0] for p in partials]).amax(dim=0)
    sums = sum(rank_sums(p, row_max, shards) for p in partials)
    loss = loss_from_sums(row_max, sums, target, eps, IGNORE)
    sum_exp = sums[:, 0].contiguous()
    ones = torch.ones(target.shape, device=x.device)
    grads = [ops.cross_entropy_sharded_grad(p, target, i * width, row_max, sum_exp, eps, x.shape[-1], IGNORE, ones)
             for i, p in enumerate(pieces)]
    return loss, torch.cat(grads, dim=-1)


@pytest.mark.parametrize("case, shards", [("long", 2), ("long", 3), ("short", 3)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sharded_vocabulary(backend, case, shards, dtype):
    """cross_entropy_partials (the reference on CPU, Triton on the other backends) combined over
    the shards, and each shard's gradient."""
    x, target = CASES[case](dtype)
    for eps in SMOOTHINGS:
        loss, grad = sharded(*on(backend.device, x, target), eps, shards)
        assert_matches_truth(loss, grad, x, target, eps)


def _rank_main(rank, world):
    x, target = long_rows(torch.float32)
    out = {}
    for eps in (0.0, 0.1, 0.9):
        mine = x.chunk(world, dim=-1)[rank].clone().requires_grad_()
        loss = te.parallel_cross_entropy(mine.unsqueeze(0), target.unsqueeze(0), eps, False, dist.group.WORLD, IGNORE)
        loss.sum().backward()
        out[eps] = (loss.detach().squeeze(0), mine.grad)
    return out


def test_sharded_over_two_ranks():
    x, target = long_rows(torch.float32)
    results = run_on_ranks(_rank_main, 2)
    for eps, (loss, _) in results[0].items():
        grad = torch.cat([results[rank][eps][1] for rank in (0, 1)], dim=-1)
        assert torch.equal(loss, results[1][eps][0])
        assert_matches_truth(loss, grad, x, target, eps)

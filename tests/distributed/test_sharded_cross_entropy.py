"""Cross-entropy over a vocabulary split across ranks: the cross_entropy_partials and
cross_entropy_sharded_grad ops on every backend (the Triton kernels in the interpreter)
against the reference, their partials combined as the ranks combine them giving the unsplit
loss and gradient, and parallel_cross_entropy over two gloo ranks equal to it on one."""
import pytest
import torch
import torch.distributed as dist

import transformer_engine.pytorch as te
from backends import assert_refused
from gloo_ranks import run_on_ranks
from numerics import assert_close
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.custom_ops import _registry
from transformer_engine.pytorch.custom_ops.sharded_cross_entropy import loss_from_sums, rank_sums

ops = torch.ops.portable_te
IGNORE = -100


def make(rows, vocab, dtype, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=generator) * 4).to(dtype).to(device)
    target = torch.randint(0, vocab, (rows,), generator=generator).to(device)
    if rows > 2:
        target[1] = IGNORE
    return logits, target


def combined(logits, target, shards, label_smoothing):
    """(loss, grad) from the shards' partials combined as the ranks' all-reduces combine them."""
    pieces = logits.chunk(shards, dim=-1)
    width, vocab = pieces[0].shape[-1], logits.shape[-1]
    partials = [ops.cross_entropy_partials(p.contiguous(), target, i * width, IGNORE) for i, p in enumerate(pieces)]
    row_max = torch.stack([p[:, 0] for p in partials]).amax(dim=0)
    sums = sum(rank_sums(p, row_max, shards) for p in partials)
    loss = loss_from_sums(row_max, sums, target, label_smoothing, IGNORE)
    sum_exp = sums[:, 0].contiguous()
    grad_loss = torch.linspace(0.5, 1.5, target.numel(), device=logits.device)
    grads = [ops.cross_entropy_sharded_grad(p.contiguous(), target, i * width, row_max, sum_exp, label_smoothing,
                                            vocab, IGNORE, grad_loss) for i, p in enumerate(pieces)]
    return loss, torch.cat(grads, dim=-1), grad_loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("rows, vocab, shards", [(6, 96, 3), (5, 8192, 2), (0, 64, 2)], ids=str)
def test_combined_partials_give_the_unsplit_loss_and_gradient(backend, dtype, label_smoothing, rows, vocab, shards):
    logits, target = make(rows, vocab, dtype, backend.device)
    loss, grad, grad_loss = combined(logits, target, shards, label_smoothing)
    want_loss, want_grad = reference.cross_entropy_fwd(logits, target, label_smoothing, IGNORE, True,
                                                       grad_loss)
    assert_close(loss, want_loss, dtype=torch.float32, name="loss", atol=1e-5 * 4 * max(1, vocab) ** 0.5)
    assert grad.dtype == dtype
    assert_close(grad, want_grad, dtype=dtype, name="grad")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_the_ops_match_the_reference_on_every_backend(backend, dtype):
    logits, target = make(7, 300, dtype, backend.device, seed=1)
    target[3] = 150 + 7  # inside the shard [150, 300) below
    shard = logits[:, 150:].contiguous()
    got = ops.cross_entropy_partials(shard, target, 150, IGNORE)
    want = reference.cross_entropy_partials(shard, target, 150, IGNORE)
    assert_close(got, want, dtype=torch.float32, name="partials", atol=1e-4)
    row_max, sum_exp = want[:, 0].contiguous(), want[:, 1].contiguous()
    grad_loss = torch.rand(7, device=backend.device)
    got = ops.cross_entropy_sharded_grad(shard, target, 150, row_max, sum_exp, 0.1, 300, IGNORE, grad_loss)
    want = reference.cross_entropy_sharded_grad(shard, target, 150, row_max, sum_exp, 0.1, 300, IGNORE, grad_loss)
    assert_close(got, want, dtype=dtype, name="sharded grad")
    assert not got[1].any()  # the ignored row


def _rows(n=4, vocab=32, dtype=torch.float32):
    return torch.randn(n, vocab, dtype=dtype), torch.zeros(n, dtype=torch.int64)


@pytest.mark.parametrize("call, words", [
    (lambda: ops.cross_entropy_partials(torch.randn(2, 3, 4), torch.zeros(2, dtype=torch.int64), 0, IGNORE),
     ["logits", "[2, 3, 4]"]),
    (lambda: ops.cross_entropy_partials(_rows()[0], torch.zeros(4, dtype=torch.int32), 0, IGNORE), ["target", "Int"]),
    (lambda: ops.cross_entropy_partials(_rows()[0], torch.zeros(5, dtype=torch.int64), 0, IGNORE),
     ["target", "[5]", "[4]"]),
    (lambda: ops.cross_entropy_sharded_grad(*_rows(), 0, torch.zeros(3), torch.ones(4), 0.0, 32, IGNORE,
                                            torch.ones(4)), ["row_max", "[3]", "[4]"]),
    (lambda: ops.cross_entropy_sharded_grad(*_rows(), 16, torch.zeros(4), torch.ones(4), 0.0, 32, IGNORE,
                                            torch.ones(4)), ["[16, 48)", "vocab_size 32"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_raises_value_error(backend, call, words):
    assert_refused(backend, call, words)


def test_dispatch():
    path = "triton" if _registry.triton_impls() else "reference"
    for name in ("cross_entropy_partials", "cross_entropy_sharded_grad"):
        assert _registry.op_paths(name) == {"cpu": "reference", "cuda": path, "musa": path}


def _rank_main(rank: int, world: int):
    logits, target = make(4 * 3, 256, torch.float32, "cpu", seed=5)  # the same on every rank
    logits, target = logits.view(4, 3, 256), target.view(4, 3)
    out = {}
    for reduce_loss in (False, True):
        mine = logits.chunk(world, dim=-1)[rank].clone().requires_grad_()
        loss = te.parallel_cross_entropy(mine, target, 0.1, reduce_loss, dist.group.WORLD, IGNORE)
        (loss * torch.linspace(1, 2, loss.numel()).view(loss.shape)).sum().backward()
        out[reduce_loss] = (loss.detach(), mine.grad)
    return out


def test_parallel_cross_entropy_over_two_ranks_equals_one():
    world = 2
    results = run_on_ranks(_rank_main, world)
    logits, target = make(4 * 3, 256, torch.float32, "cpu", seed=5)
    logits, target = logits.view(4, 3, 256), target.view(4, 3)
    for reduce_loss in (False, True):
        whole = logits.clone().requires_grad_()
        want = te.parallel_cross_entropy(whole, target, 0.1, reduce_loss, None, IGNORE)
        (want * torch.linspace(1, 2, want.numel()).view(want.shape)).sum().backward()
        for rank in range(world):
            loss, grad = results[rank][reduce_loss]
            assert_close(loss, want.detach(), dtype=torch.float32, name=f"rank {rank} loss", atol=1e-5)
            assert_close(grad, whole.grad.chunk(world, dim=-1)[rank], dtype=torch.float32, name=f"rank {rank} grad")

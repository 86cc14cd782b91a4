"""Cross-entropy over a vocabulary split across ranks, as two dispatcher ops (defined here, not
in C++; formulas in reference/cross_entropy.py):

    cross_entropy_partials(logits [N, Vs], target [N], vocab_start, ignore_index) -> [N, 4]
        per row of this rank's classes [vocab_start, vocab_start + Vs): max, sum of exp(x - max),
        mean of (max - x) / 2, and the target's logit where the target is one of them (else 0)
    cross_entropy_sharded_grad(logits, target, vocab_start, row_max [N], sum_exp [N],
                               label_smoothing, vocab_size, ignore_index, grad_loss [N]) -> [N, Vs]
        this rank's slice of the gradient, from the max and sum combined over the ranks

On CUDA and MUSA the Triton kernels (triton/cross_entropy.py) run them; the reference elsewhere.
sharded_cross_entropy() all-reduces the partials over the process group (rank_sums,
loss_from_sums) and differentiates.
"""
import torch
import torch.distributed as dist
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from ..reference.cross_entropy import smoothed_loss
from . import _checks
from ._checks import fail, shape_text
from ._registry import serve_reference_on_cpu, serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)
_fragment = torch.library.Library(NAMESPACE, "FRAGMENT")
_fragment.define("cross_entropy_partials(Tensor logits, Tensor target, int vocab_start, int ignore_index) -> Tensor")
_fragment.define("cross_entropy_sharded_grad(Tensor logits, Tensor target, int vocab_start, Tensor row_max, "
                 "Tensor sum_exp, float label_smoothing, int vocab_size, int ignore_index, Tensor grad_loss) -> Tensor")


def _check_rows(op: str, logits: Tensor, target: Tensor, **per_row: Tensor) -> None:
    _checks.kernel_dtype(op, "logits", logits)
    if logits.dim() != 2:
        fail(op, f"logits must be [N, V] (this rank's classes last), got shape {shape_text(logits.shape)}")
    _checks.dtype(op, "target", target, torch.int64)
    for name, tensor in {"target": target, **per_row}.items():
        _checks.same_device(op, name, tensor, "logits", logits)
        _checks.shape(op, name, tensor, logits.shape[:1], "one per row of logits")


def check_partials(logits, target, vocab_start, ignore_index):
    _check_rows("cross_entropy_partials", logits, target)


def check_sharded_grad(logits, target, vocab_start, row_max, sum_exp, label_smoothing, vocab_size, ignore_index,
                       grad_loss):
    _check_rows("cross_entropy_sharded_grad", logits, target, row_max=row_max, sum_exp=sum_exp, grad_loss=grad_loss)
    if not vocab_start + logits.shape[1] <= vocab_size:
        fail("cross_entropy_sharded_grad", f"classes [{vocab_start}, {vocab_start + logits.shape[1]}) "
                                           f"do not lie within vocab_size {vocab_size}")


@torch.library.register_fake(f"{NAMESPACE}::cross_entropy_partials")
def _partials_fake(logits, target, vocab_start, ignore_index):
    check_partials(logits, target, vocab_start, ignore_index)
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return logits.new_empty((logits.shape[0], 4), dtype=dtype)


@torch.library.register_fake(f"{NAMESPACE}::cross_entropy_sharded_grad")
def _sharded_grad_fake(logits, target, vocab_start, row_max, sum_exp, label_smoothing, vocab_size, ignore_index,
                       grad_loss):
    check_sharded_grad(logits, target, vocab_start, row_max, sum_exp, label_smoothing, vocab_size, ignore_index,
                       grad_loss)
    return torch.empty_like(logits)


for _name, _check in (("cross_entropy_partials", check_partials), ("cross_entropy_sharded_grad", check_sharded_grad)):
    serve_reference_on_cpu(_name, getattr(reference, _name), check=_check)
    serve_on_accelerators(_name, getattr(reference, _name), triton_module="cross_entropy", check=_check)


def rank_sums(partials: Tensor, row_max: Tensor, world: int) -> Tensor:
    """[N, 3], what this rank adds to the sums over the ranks, from its partials [N, 4] and the max m
    over all of them [N]: its sum of exponentials moved to m, its share of mean (m - x) / 2 over
    the whole vocabulary, and the target's logit or 0. The share is (mean of its (m_r - x) / 2 +
    (m - m_r) / 2) / world (equal shards): two terms in [0, FLT_MAX] whose exact sum, the mean of
    its (m - x) / 2, is in [0, FLT_MAX] too."""
    shard_max, sum_exp, mean_gap, target_logit = partials.unbind(-1)
    moved_gap = (mean_gap + (row_max * 0.5 - shard_max * 0.5)) / world
    return torch.stack([sum_exp * torch.exp(shard_max - row_max), moved_gap, target_logit], dim=-1)


def loss_from_sums(row_max: Tensor, sums: Tensor, target: Tensor, label_smoothing: float,
                   ignore_index: int) -> Tensor:
    """The per-row loss [N] (0 at ignore_index) from the max over the ranks [N] and the sum of their
    rank_sums [N, 3]: reference.cross_entropy.smoothed_loss, every term in fp32's range where the
    loss is."""
    sum_exp, mean_gap, target_logit = sums.unbind(-1)
    target_gap = row_max * 0.5 - target_logit * 0.5  # (m - x_t) / 2, at most FLT_MAX
    loss = smoothed_loss(torch.log(sum_exp), target_gap, mean_gap, label_smoothing)
    return torch.where(target != ignore_index, loss, 0.0)


class _ShardedCrossEntropy(torch.autograd.Function):
    """Per-row loss [N] of logits [N, Vs] holding this rank's Vs classes, rank r the classes
    [r Vs, (r + 1) Vs) of V = Vs * world; the same on every rank."""

    @staticmethod
    def forward(ctx, logits, target, label_smoothing, ignore_index, group):
        shard, world = logits.shape[-1], dist.get_world_size(group)
        vocab_start, vocab = dist.get_rank(group) * shard, world * shard
        partials = _ops.cross_entropy_partials(logits, target, vocab_start, ignore_index)  # [N, 4]
        row_max = partials[:, 0].clone()
        dist.all_reduce(row_max, dist.ReduceOp.MAX, group=group)
        sums = rank_sums(partials, row_max, world)  # [N, 3]
        dist.all_reduce(sums, dist.ReduceOp.SUM, group=group)
        loss = loss_from_sums(row_max, sums, target, label_smoothing, ignore_index)
        ctx.save_for_backward(logits, target, row_max, sums[:, 0])
        ctx.vocab_start, ctx.vocab = vocab_start, vocab
        ctx.label_smoothing, ctx.ignore_index = label_smoothing, ignore_index
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        logits, target, row_max, sum_exp = ctx.saved_tensors
        grad = _ops.cross_entropy_sharded_grad(logits, target, ctx.vocab_start, row_max, sum_exp, ctx.label_smoothing,
                                               ctx.vocab, ctx.ignore_index, grad_loss.contiguous())
        return grad, None, None, None, None


def sharded_cross_entropy(logits: Tensor, target: Tensor, label_smoothing: float, ignore_index: int,
                          group: "dist.ProcessGroup") -> Tensor:
    """Per-row loss of logits [N, Vs], this rank's slice of the vocabulary (rank r holding classes
    [r Vs, (r + 1) Vs)), against the global target [N]; differentiable in logits."""
    return _ShardedCrossEntropy.apply(logits.contiguous(), target.contiguous(), label_smoothing, ignore_index, group)

"""Cross-entropy over a vocabulary split across ranks, as two dispatcher ops (defined here, not
in C++; formulas in reference/cross_entropy.py):

    cross_entropy_partials(logits [N, Vs], target [N], vocab_start, ignore_index) -> [N, 4]
        per row of this rank's classes [vocab_start, vocab_start + Vs): max, sum of exp(x - max),
        sum of x, and the target's logit where the target is one of them (else 0)
    cross_entropy_sharded_grad(logits, target, vocab_start, row_max [N], sum_exp [N],
                               label_smoothing, vocab_size, ignore_index, grad_loss [N]) -> [N, Vs]
        this rank's slice of the gradient, from the max and sum combined over the ranks

On CUDA and MUSA the Triton kernels (triton/cross_entropy.py) run them; the reference elsewhere.
sharded_cross_entropy() all-reduces the partials over the process group and differentiates.
"""
import torch
import torch.distributed as dist
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
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


class _ShardedCrossEntropy(torch.autograd.Function):
    """Per-row loss [N] of logits [N, Vs] holding this rank's Vs classes, rank r the classes
    [r Vs, (r + 1) Vs) of V = Vs * world; the same on every rank."""

    @staticmethod
    def forward(ctx, logits, target, label_smoothing, ignore_index, group):
        shard = logits.shape[-1]
        vocab_start, vocab = dist.get_rank(group) * shard, dist.get_world_size(group) * shard
        partials = _ops.cross_entropy_partials(logits, target, vocab_start, ignore_index)  # [N, 4]
        row_max = partials[:, 0].clone()
        dist.all_reduce(row_max, dist.ReduceOp.MAX, group=group)
        # Each rank's sum of exponentials moved to the common max; the sums add over ranks.
        sums = torch.stack([partials[:, 1] * torch.exp(partials[:, 0] - row_max), partials[:, 2], partials[:, 3]], -1)
        dist.all_reduce(sums, dist.ReduceOp.SUM, group=group)
        sum_exp, total, target_logit = sums.unbind(-1)
        loss = torch.log(sum_exp) + row_max - target_logit - label_smoothing * (total / vocab - target_logit)
        loss = torch.where(target != ignore_index, loss, 0.0)
        ctx.save_for_backward(logits, target, row_max, sum_exp)
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

"""The p2p ring's attention (context_parallel.py): this rank's queries against every rank's K/V
block, the blocks passed round the ring of a process group.

Each step attends one block with its own softmax and log-sum-exp and folds it into the running
output; backward recomputes each block's probabilities from the final log-sum-exp (nothing per
step is saved) and sends the block's dK/dV on with it, so that they come home summed over
every rank's queries after a full turn. The exchange of the next block is in flight while the
current one is attended (collectives.ring_shift is asynchronous).

Shapes: q5 is q [b, h, sq, dk] grouped by key/value head, [b, g, h/g, sq, dk]; k [b, g, skv, dk],
v [b, g, skv, dv]; mask bool [B, 1, sq, skv] (True = masked, B 1 or b) or None. All block
arithmetic is fp32, whatever the input dtype: a block's output and log-sum-exp are partial
results that later blocks rescale, and backward's probabilities exp(s - lse) subtract nearly
equal numbers.
"""
import dataclasses
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..parallel.collectives import ring_shift, wait


def _finite(lse: Tensor) -> Tensor:
    """lse with -inf (rows that saw no key) as 0, so that exp(s - lse) is 0 there, not NaN."""
    return lse.masked_fill(lse == float("-inf"), 0.0)


def _scores(q5: Tensor, k: Tensor, mask: Optional[Tensor], scale: float) -> Tensor:
    """[b, g, h/g, sq, skv]: scale * q k^T, -inf where masked."""
    scores = torch.matmul(q5, k.unsqueeze(2).transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(mask.unsqueeze(1), float("-inf"))  # [B, 1, sq, skv] -> [B, 1, 1, sq, skv]
    return scores


def _block_forward(q5: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], scale: float) -> Tuple[Tensor, Tensor]:
    """(out [b, g, h/g, sq, dv], lse [b, g, h/g, sq]): the block's own softmax attention and the
    log-sum-exp of its scores; a row with every key masked has out 0 and lse -inf."""
    scores = _scores(q5, k, mask, scale)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - _finite(lse).unsqueeze(-1))
    return torch.matmul(probs, v.unsqueeze(2)), lse


def _merge(out: Tensor, lse: Tensor, block_out: Tensor, block_lse: Tensor) -> None:
    """Folds a block into the running (out, lse), in place (views of the running tensors):
    lse' = log(e^lse + e^block_lse), out' = e^(lse - lse') out + e^(block_lse - lse') block_out.
    The weights are exponentials of lse differences, which 16-bit floats would round to 2-3
    digits, and a rank merges cp blocks: hence fp32."""
    merged = torch.logaddexp(lse, block_lse)
    base = _finite(merged).unsqueeze(-1)
    out.mul_(torch.exp(lse.unsqueeze(-1) - base)).add_(block_out * torch.exp(block_lse.unsqueeze(-1) - base))
    lse.copy_(merged)


def _block_backward(q5: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], scale: float, dout5: Tensor,
                    lse: Tensor, delta: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq [b, g, h/g, sq, dk], dk [b, g, skv, dk], dv [b, g, skv, dv]) of one block.

    dout5 [b, g, h/g, sq, dv]; lse, delta [b, g, h/g, sq]: the final log-sum-exp and
    rowsum(dout * out). p = exp(s - lse) is the block's share of the whole softmax, so
    dv = p^T dout, ds = p (dout v^T - delta), dq = scale ds k, dk = scale ds^T q; a group's
    query heads add into their shared key/value head."""
    probs = torch.exp(_scores(q5, k, mask, scale) - _finite(lse).unsqueeze(-1))
    dv = torch.matmul(probs.transpose(-1, -2), dout5).sum(2)
    dprobs = torch.matmul(dout5, v.unsqueeze(2).transpose(-1, -2))
    dscores = probs * (dprobs - delta.unsqueeze(-1)) * scale
    return torch.matmul(dscores, k.unsqueeze(2)), torch.matmul(dscores.transpose(-1, -2), q5).sum(2), dv


@dataclasses.dataclass(frozen=True)
class Block:
    """What one ring step attends: query rows `rows` against key columns `cols` of the block it
    holds, with `mask` (bool [B, 1, rows, cols], True = masked) or None (all visible)."""
    rows: slice
    cols: slice
    mask: Optional[Tensor]


class RingAttention(torch.autograd.Function):
    """q [b, h, sq, dk] against the K/V blocks k [b, g, skv, dk], v [b, g, skv, dv] of every rank
    of `group`, passed round the ring; -> [b, h, sq, dv] in q's dtype. blocks[i]: what step i
    attends of the block it holds, that of ring rank (rank - i) mod size; scale multiplies q k^T."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, blocks: List[Block], scale: float, group) -> Tensor:
        b, h, sq, dk = q.shape
        g, dv = k.shape[1], v.shape[-1]
        q5 = q.float().unflatten(1, (g, h // g))  # [b, g, h/g, sq, dk]
        kv = torch.cat((k, v), dim=-1)  # [b, g, skv, dk + dv]: one message per step
        out = q5.new_zeros(b, g, h // g, sq, dv)
        lse = q5.new_full((b, g, h // g, sq), float("-inf"))
        for step, block in enumerate(blocks):
            incoming = ring_shift(kv, group) if step + 1 < len(blocks) else None
            k_block, v_block = kv[:, :, block.cols].float().split((dk, dv), dim=-1)
            part, part_lse = _block_forward(q5[:, :, :, block.rows], k_block, v_block, block.mask, scale)
            _merge(out[:, :, :, block.rows], lse[:, :, :, block.rows], part, part_lse)
            if incoming is not None:
                kv = wait(incoming)
        result = out.flatten(1, 2).to(q.dtype)  # [b, h, sq, dv]
        ctx.save_for_backward(q, k, v, result, lse)
        ctx.blocks, ctx.scale, ctx.group = blocks, scale, group
        return result

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        q, k, v, result, lse = ctx.saved_tensors
        g, dk = k.shape[1], k.shape[-1]
        q5 = q.float().unflatten(1, (g, -1))  # [b, g, h/g, sq, dk]
        dout = grad.float().unflatten(1, (g, -1))  # [b, g, h/g, sq, dv]
        delta = (dout * result.float().unflatten(1, (g, -1))).sum(-1)  # [b, g, h/g, sq]
        dq = torch.zeros_like(q5)
        kv = torch.cat((k, v), dim=-1)  # [b, g, skv, dk + dv]
        travelling = None  # the held block's dK/dV so far, fp32: each rank adds its share
        for step, block in enumerate(ctx.blocks):
            incoming = ring_shift(kv, ctx.group) if step + 1 < len(ctx.blocks) else None
            k_block, v_block = kv[:, :, block.cols].float().split((dk, kv.shape[-1] - dk), dim=-1)
            rows = block.rows
            dq_part, dk_part, dv_part = _block_backward(q5[:, :, :, rows], k_block, v_block, block.mask, ctx.scale,
                                                        dout[:, :, :, rows], lse[:, :, :, rows], delta[:, :, :, rows])
            dq[:, :, :, rows] += dq_part
            dkv = kv.new_zeros(kv.shape, dtype=torch.float32)
            dkv[:, :, block.cols] = torch.cat((dk_part, dv_part), dim=-1)
            if travelling is not None:
                dkv += wait(travelling)
            travelling = ring_shift(dkv, ctx.group)  # to the next rank, which holds this block next
            if incoming is not None:
                kv = wait(incoming)
        dk_home, dv_home = wait(travelling).split((dk, kv.shape[-1] - dk), dim=-1)  # this rank's own block
        return dq.flatten(1, 2).to(q.dtype), dk_home.to(k.dtype), dv_home.to(v.dtype), None, None, None

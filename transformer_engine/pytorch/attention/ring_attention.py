"""The p2p ring's attention (context_parallel.py): this rank's queries against every rank's K/V
block, the blocks passed round the ring of a process group.

Each step attends one block with its own softmax and log-sum-exp and folds it into the running
output; backward recomputes each block's probabilities from the final log-sum-exp (nothing per
step is saved) and sends the block's dK/dV on with it, so that they come home summed over
every rank's queries after a full turn. The exchange of the next block is in flight while the
current one is attended (collectives.ring_shift is asynchronous).

A block is attended by one of two engines, the same for every block of a call: on the CPU the
package's flash kernel (te.kernels.flash_attention's ops: the block's causal structure as a
window, its other masking as a dense mask it reads by broadcast, GQA by indexing; its backward,
given the final output and log-sum-exp, is exactly the block's share of the gradients);
elsewhere matmuls over the block's scores.

Shapes: q [b, h, sq, dk]; k [b, g, skv, dk], v [b, g, skv, dv]. All block arithmetic is fp32,
whatever the input dtype: a block's output and log-sum-exp are partial results that later
blocks rescale, and backward's probabilities exp(s - lse) subtract nearly equal numbers.
"""
import dataclasses
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..custom_ops.attention import MAX_HEAD_DIM, flash_attention_backward, flash_attention_forward
from ..parallel.collectives import ring_shift, wait
from .masks import causal_mask


@dataclasses.dataclass(frozen=True)
class Block:
    """What one ring step attends: query rows `rows` against key columns `cols` of the block it
    holds. causal: query i of the rows sees keys 0 .. i of the columns (the rows and columns
    are then the same tokens in the same order); mask: bool [B, 1, rows, cols], True = masked,
    B 1 or b, or None (all visible besides `causal`)."""
    rows: slice
    cols: slice
    mask: Optional[Tensor]
    causal: bool = False

    @property
    def window(self) -> Tuple[int, int]:
        """The causal structure as a flash-attention window (left, right)."""
        return (-1, 0) if self.causal else (-1, -1)

    def dense_mask(self, rows: int, cols: int, device: torch.device) -> Optional[Tensor]:
        """Everything the block masks as one bool [B | 1, 1, rows, cols], or None."""
        if not self.causal:
            return self.mask
        causal = causal_mask("top_left", rows, cols, device).view(1, 1, rows, cols)
        return causal if self.mask is None else causal | self.mask


def _finite(lse: Tensor) -> Tensor:
    """lse with -inf (rows that saw no key) as 0, so that exp(s - lse) is 0 there, not NaN."""
    return lse.masked_fill(lse == float("-inf"), 0.0)


class MatmulBlocks:
    """A block's attention from its [b, g, h/g, rows, cols] scores (any device)."""
    name = "matmul"

    @staticmethod
    def _scores(q: Tensor, k: Tensor, block: Block, scale: float) -> Tensor:
        """[b, g, h/g, rows, cols]: scale * q k^T, -inf where masked."""
        q5 = q.unflatten(1, (k.shape[1], -1))  # [b, g, h/g, rows, dk]
        scores = torch.matmul(q5, k.unsqueeze(2).transpose(-1, -2)) * scale
        mask = block.dense_mask(q.shape[2], k.shape[2], q.device)
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(1), float("-inf"))  # [B, 1, rows, cols] -> [B, 1, 1, rows, cols]
        return scores

    @staticmethod
    def forward(q: Tensor, k: Tensor, v: Tensor, block: Block, scale: float) -> Tuple[Tensor, Tensor]:
        """(out [b, h, rows, dv], lse [b, h, rows]): the block's own softmax attention and the
        log-sum-exp of its scores; a row with every key masked has out 0 and lse -inf."""
        scores = MatmulBlocks._scores(q, k, block, scale)
        lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - _finite(lse).unsqueeze(-1))
        return torch.matmul(probs, v.unsqueeze(2)).flatten(1, 2), lse.flatten(1, 2)

    @staticmethod
    def backward(q: Tensor, k: Tensor, v: Tensor, block: Block, scale: float, dout: Tensor, out: Tensor,
                 lse: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """(dq [b, h, rows, dk], dk [b, g, cols, dk], dv [b, g, cols, dv]) of one block, from the
        final out and lse of its rows: p = exp(s - lse) is the block's share of the whole
        softmax, so dv = p^T dout, ds = p (dout v^T - delta) with delta = rowsum(dout * out),
        dq = scale ds k, dk = scale ds^T q; a group's query heads add into their key/value head."""
        g = k.shape[1]
        dout5 = dout.unflatten(1, (g, -1))  # [b, g, h/g, rows, dv]
        delta = (dout5 * out.unflatten(1, (g, -1))).sum(-1, keepdim=True)
        probs = torch.exp(MatmulBlocks._scores(q, k, block, scale) - _finite(lse.unflatten(1, (g, -1))).unsqueeze(-1))
        dv = torch.matmul(probs.transpose(-1, -2), dout5).sum(2)
        dprobs = torch.matmul(dout5, v.unsqueeze(2).transpose(-1, -2))
        dscores = probs * (dprobs - delta) * scale
        dq = torch.matmul(dscores, k.unsqueeze(2)).flatten(1, 2)
        return dq, torch.matmul(dscores.transpose(-1, -2), q.unflatten(1, (g, -1))).sum(2), dv


class FlashBlocks:
    """A block's attention on the CPU flash kernel: the block's causal structure as its window,
    the rest of its mask as the kernel's dense mask. The log-sum-exp is fp64, as the kernel
    keeps it."""
    name = "flash"

    @staticmethod
    def forward(q: Tensor, k: Tensor, v: Tensor, block: Block, scale: float) -> Tuple[Tensor, Tensor]:
        return flash_attention_forward(q, k, v, scale, block.window, block.mask)

    @staticmethod
    def backward(q: Tensor, k: Tensor, v: Tensor, block: Block, scale: float, dout: Tensor, out: Tensor,
                 lse: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        return flash_attention_backward(dout, q, k, v, out, lse, scale, block.window, block.mask)


def engine_for(q: Tensor, k: Tensor, v: Tensor):
    """FlashBlocks on the CPU within the kernel's head dims, else MatmulBlocks."""
    fits = max(k.shape[-1], v.shape[-1]) <= MAX_HEAD_DIM
    return FlashBlocks if q.device.type == "cpu" and fits else MatmulBlocks


def _merge(out: Tensor, lse: Tensor, block_out: Tensor, block_lse: Tensor) -> None:
    """Folds a block into the running (out, lse), in place (views of the running tensors):
    lse' = log(e^lse + e^block_lse), out' = e^(lse - lse') out + e^(block_lse - lse') block_out.
    The weights are exponentials of lse differences, which 16-bit floats would round to 2-3
    digits, and a rank merges cp blocks: hence fp32 (the lse in the engine's dtype)."""
    merged = torch.logaddexp(lse, block_lse)
    base = _finite(merged).unsqueeze(-1)
    out.mul_(torch.exp(lse.unsqueeze(-1) - base)).add_(block_out * torch.exp(block_lse.unsqueeze(-1) - base))
    lse.copy_(merged)


class RingAttention(torch.autograd.Function):
    """q [b, h, sq, dk] against the K/V blocks k [b, g, skv, dk], v [b, g, skv, dv] of every rank
    of `group`, passed round the ring; -> [b, h, sq, dv] in q's dtype. blocks[i]: what step i
    attends of the block it holds, that of ring rank (rank - i) mod size; scale multiplies q k^T."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, blocks: List[Block], scale: float, group) -> Tensor:
        b, h, sq, dk = q.shape
        dv = v.shape[-1]
        engine = engine_for(q, k, v)
        q32 = q.float()
        kv = torch.cat((k, v), dim=-1)  # [b, g, skv, dk + dv]: one message per step
        out = q32.new_zeros(b, h, sq, dv)
        lse = None
        for step, block in enumerate(blocks):
            incoming = ring_shift(kv, group) if step + 1 < len(blocks) else None
            k_block, v_block = kv[:, :, block.cols].float().split((dk, dv), dim=-1)
            part, part_lse = engine.forward(q32[:, :, block.rows], k_block, v_block, block, scale)
            if lse is None:  # [b, h, sq] in the engine's lse dtype
                lse = part_lse.new_full((b, h, sq), float("-inf"))
            _merge(out[:, :, block.rows], lse[:, :, block.rows], part, part_lse)
            if incoming is not None:
                kv = wait(incoming)
        result = out.to(q.dtype)  # [b, h, sq, dv]
        ctx.save_for_backward(q, k, v, result, lse)
        ctx.blocks, ctx.scale, ctx.group, ctx.engine = blocks, scale, group, engine
        return result

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        q, k, v, result, lse = ctx.saved_tensors
        dk = k.shape[-1]
        q32, dout, out = q.float(), grad.float(), result.float()  # delta from the output as returned
        dq = torch.zeros_like(q32)
        kv = torch.cat((k, v), dim=-1)  # [b, g, skv, dk + dv]
        travelling = None  # the held block's dK/dV so far, fp32: each rank adds its share
        for step, block in enumerate(ctx.blocks):
            incoming = ring_shift(kv, ctx.group) if step + 1 < len(ctx.blocks) else None
            k_block, v_block = kv[:, :, block.cols].float().split((dk, kv.shape[-1] - dk), dim=-1)
            rows = block.rows
            dq_part, dk_part, dv_part = ctx.engine.backward(q32[:, :, rows], k_block, v_block, block, ctx.scale,
                                                            dout[:, :, rows], out[:, :, rows], lse[:, :, rows])
            dq[:, :, rows] += dq_part
            dkv = kv.new_zeros(kv.shape, dtype=torch.float32)
            dkv[:, :, block.cols] = torch.cat((dk_part, dv_part), dim=-1)
            if travelling is not None:
                dkv += wait(travelling)
            travelling = ring_shift(dkv, ctx.group)  # to the next rank, which holds this block next
            if incoming is not None:
                kv = wait(incoming)
        dk_home, dv_home = wait(travelling).split((dk, kv.shape[-1] - dk), dim=-1)  # this rank's own block
        return dq.to(q.dtype), dk_home.to(k.dtype), dv_home.to(v.dtype), None, None, None

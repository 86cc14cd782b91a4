"""How one GEMM y = x W^T of a tensor-parallel module is split over its group, and the
exchanges that split implies (Megatron-LM's scheme, as TransformerEngine implements it).

column: W [out / size, in] on each rank, y sharded along its features. The input is every
    rank's whole x; its gradient is the sum of the ranks' partial dgrads (all-reduce). With
    sequence parallelism x arrives sharded along the tokens and is all-gathered first, and the
    dgrad sum is reduce-scattered back to the tokens' shards.
row: W [out, in / size], x sharded along its features; each rank's product is partial and the
    output is their sum (all-reduce), or, with sequence parallelism, rank r's token shard of it
    (reduce-scatter), whose gradient is then all-gathered in the backward.

Under FP8 a gathered operand travels as its codes (one byte per element) and scales. Per-tensor
recipes: every rank casts with the same scale (delayed scaling's agreed one, or current scaling's
from the amax reduced over the group, as TE's quantizers with_amax_reduction). Block recipes:
each rank casts its shard, and the codes with their block scales are gathered, which is the cast
of the whole tensor when no block spans two shards (the shard's rows a multiple of every block's
height; 1 x n blocks always); otherwise the shards are gathered in high precision and cast whole.

Overlap: a GEMM over a gathered operand (the forward's input under column + sequence parallelism,
the backward's output gradient under row + sequence parallelism) multiplies this rank's own
shard while the others are on the wire, then the rest (gemm_gathered).
"""
import dataclasses
from typing import Callable, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ..fp8.block_tensor import Float8BlockPair, Float8BlockTensor
from ..fp8.codes import Float8Codes
from ..tensor.float8_tensor import Float8CurrentScalingQuantizer, _PerTensorQuantizer
from ..tensor.for_recipe import with_columnwise
from ..tensor.quantizer import Quantizer
from .collectives import all_gather, all_reduce, group_rank, group_size, reduce_scatter, wait

MODES = ("column", "row")


@dataclasses.dataclass(frozen=True, eq=False)
class GemmSplit:
    """group: the tensor-parallel process group (more than one rank); mode: 'column' or 'row';
    sequence_parallel: the tokens are sharded outside the GEMM (see the module docstring)."""
    group: object
    mode: str
    sequence_parallel: bool

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"GemmSplit: mode must be 'column' or 'row', got {self.mode!r}")

    @property
    def size(self) -> int:
        return group_size(self.group)

    @property
    def gathers_input(self) -> bool:
        """The forward all-gathers x's token shards (and the backward reduce-scatters dgrad)."""
        return self.mode == "column" and self.sequence_parallel

    @property
    def gathers_grad_output(self) -> bool:
        """The backward all-gathers the output gradient's token shards."""
        return self.mode == "row" and self.sequence_parallel

    def tokens_out(self, tokens_in: int) -> int:
        """Rows of y for `tokens_in` rows of x on this rank."""
        if self.gathers_input:
            return tokens_in * self.size
        if self.gathers_grad_output:
            return tokens_in // self.size
        return tokens_in

    def gather(self, x: Tensor) -> Tensor:
        """[tokens / size, f] on each rank -> [tokens, f] (waited for)."""
        return wait(all_gather(x, self.group))

    def gather_rows(self, x: Tensor) -> "GatheredRows":
        """x's token shards [tokens / size, f] all-gathered, the exchange issued now."""
        whole = all_gather(x, self.group)
        return GatheredRows(x, lambda: wait(whole))

    def gather_operand(self, x: Tensor, quantizer: Quantizer, local_codes: Optional[object] = None) -> "GatheredRows":
        """The FP8 operand of the gathered x [tokens, f] from this rank's shard x, the exchange
        issued now: per-tensor codes cast here (or `local_codes`, cast by a fused producer) and
        gathered; block-scaled codes and scales gathered where no block spans two shards;
        otherwise x gathered, then cast (no shard of its own: the cast needs the whole)."""
        if isinstance(quantizer, _PerTensorQuantizer):
            if not isinstance(local_codes, Float8Codes):
                local_codes = self.agreeing(with_columnwise(quantizer, False)).operand_of(x)
            data = all_gather(local_codes.data, self.group)
            return GatheredRows(local_codes, lambda: Float8Codes(wait(data), local_codes.scale_inv))
        layout = getattr(quantizer, "block_layout", None)
        heights = () if layout is None else (layout.rowwise[0], layout.columnwise[0])
        if layout is None or any(height > 1 and x.shape[0] % height for height in heights):
            whole = all_gather(x, self.group)  # a block would span two shards
            return GatheredRows(None, lambda: quantizer.operand_of(wait(whole)))
        local = quantizer.operand_of(x)
        rowwise = self._gather_blocks(local.rowwise)
        columnwise = rowwise if local.columnwise is local.rowwise else self._gather_blocks(local.columnwise)
        return GatheredRows(local, lambda: Float8BlockPair(rowwise(), columnwise()))

    def _gather_blocks(self, part: Optional[Float8BlockTensor]) -> Callable[[], Optional[Float8BlockTensor]]:
        """A shard's block-scaled codes [rows, cols] and block scales, their gather along the
        rows issued now; the function returns the gathered blocks once they have arrived."""
        if part is None:
            return lambda: None
        data, scale_inv = all_gather(part.data, self.group), all_gather(part.scale_inv, self.group)
        return lambda: dataclasses.replace(part, data=wait(data), scale_inv=wait(scale_inv))

    def gemm_gathered(self, gathered: "GatheredRows", gemm: Callable[[object], Tensor]) -> Tuple[Tensor, object]:
        """(gemm(the gathered operand) [tokens, n], the gathered operand). This rank's own rows are
        multiplied while the other shards are on the wire; then the rows before and after them,
        one GEMM each, and the three joined in rank order. Every call takes this path, so the
        bits do not depend on when the exchange finishes (a GEMM's rows can depend on how many
        it is given: the CPU's small-m kernels)."""
        if gathered.own is None:
            whole = gathered.finish()
            return gemm(whole), whole
        own = gemm(gathered.own)  # [tokens / size, n]
        whole = gathered.finish()
        rank, rows = group_rank(self.group), own.shape[0]
        before = [gemm(_rows(whole, 0, rank * rows))] if rank > 0 else []
        after = [gemm(_rows(whole, (rank + 1) * rows, self.size * rows))] if rank < self.size - 1 else []
        return torch.cat(before + [own] + after), whole

    def agreeing(self, quantizer: Quantizer) -> Quantizer:
        """`quantizer`, or for current scaling a copy of it that takes the amax over the group
        (so that the shards are cast with one scale and their codes can be gathered)."""
        if not isinstance(quantizer, Float8CurrentScalingQuantizer) or quantizer.with_amax_reduction:
            return quantizer
        reducing = quantizer.copy()
        reducing.with_amax_reduction, reducing.amax_reduction_group = True, self.group
        return reducing

    def reduce_output(self, y: Tensor) -> Tensor:
        """A row-parallel GEMM's partial y [tokens, out] -> the ranks' sum, or this rank's
        token shard of it under sequence parallelism (waited for)."""
        if self.mode != "row":
            return y
        return wait(reduce_scatter(y, self.group) if self.sequence_parallel else all_reduce(y, self.group))

    def reduce_grad_input(self, dgrad: Tensor) -> Tensor:
        """A column-parallel GEMM's partial dgrad [tokens, in] -> the ranks' sum (or this rank's
        token shard of it), still in flight: wait() where it is needed, after the weight-gradient
        GEMM has run beside it."""
        if self.mode != "column":
            return dgrad
        return reduce_scatter(dgrad, self.group) if self.sequence_parallel else all_reduce(dgrad, self.group)


class GatheredRows(NamedTuple):
    """An operand being all-gathered along its rows (the tokens): `own`, this rank's shard of it,
    ready now (None where only the whole can be cast), and `finish()`, which waits for the
    exchange and returns the whole [tokens, ...]."""
    own: Optional[object]
    finish: Callable[[], object]


def _rows(operand, start: int, stop: int):
    """Rows [start, stop) of a GEMM operand (a tensor or FP8 codes)."""
    return operand[start:stop] if isinstance(operand, Tensor) else operand.rows(start, stop)

"""Context parallelism for te.DotProductAttention: the sequence split over the ranks of cp_group.

Sharding (TransformerEngine's load-balanced split): each sequence is cut into 2 cp equal chunks
and rank r holds chunks r and 2 cp - 1 - r, in that order, so that under a causal mask every
rank has the same share of the work. sbhd / bshd: the local sequence dimension holds the two
chunks (so its length is even). thd: every packed sequence is cut that way; cu_seqlens_* are
the global ones, cu_seqlens_*_padded (default: cu_seqlens_*) give each sequence's slot, a
multiple of 2 cp tokens, and rank r packs its two chunks of sequence i from
cu_seqlens_*_padded[i] / cp on.

Inside, a rank's tokens are a head-major padded batch [b, n, s, d] (sbhd / bshd: a view of the
input; thd: one row per sequence holding its local chunks) with each token's position in its
sequence (_Tokens). Masks are computed from positions, not from where a token sits, so keys
may arrive in any order: key j is kept for query i when j's position lies in the window around
i's aligned position (causal is the window (-1, 0)) and both are real tokens (thd padding is
not). Rows left with no key come out as zeros.

Communication types (cp_comm_type):
  p2p: K/V travel round the ring (collectives.ring_shift), one block per step, the next block's
    exchange in flight while the current one is attended (ring_attention.py; on the CPU each
    block runs on the flash kernel). Each step's partial attention comes with its log-sum-exp
    and is merged into the running output in fp32.
    The backward pass runs the ring again: each block's probabilities are recomputed from the
    saved log-sum-exp, and the block's dK/dV travel with it, arriving home after a full turn.
  all_gather: K/V all-gathered along the sequence; the local queries attend over all of it on
    the package's backends. The gathered K/V's gradient is reduce-scattered back.
  a2a: an all-to-all trades the sequence shards for head shards (heads and GQA groups divide by
    cp); each rank attends over the whole sequence with its heads on the package's backends,
    and an all-to-all trades back. Both exchanges are their own adjoints in backward.
  a2a+p2p: cp_group = [a2a group, p2p group]: a2a within the first group, then the p2p ring
    over the second, with cp rank = a2a size * p2p rank + a2a rank.
"""
import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor

from ..parallel.autograd import exchanged, gather
from ..parallel.collectives import group_rank, group_size
from . import masks
from .backends import AttentionProblem
from .masks import MaskSpec
from .packing import Packing, check_cu_seqlens, pack_padded, packing, pad_packed
from .ring_attention import Block, RingAttention

COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
_RING_TYPES = ("p2p", "a2a+p2p")
_HEAD_TYPES = ("a2a", "a2a+p2p")
# thd's types are the padding variants DotProductAttention maps every thd mask type to.
_MASK_TYPES = {"sbhd": ("no_mask", "causal", "causal_bottom_right"),
               "bshd": ("no_mask", "causal", "causal_bottom_right"),
               "thd": ("padding", "padding_causal", "padding_causal_bottom_right")}

# attend(q [b, h, sq, dk], k [b, g, skv, dk], v [b, g, skv, dv], problem) -> [b, h, sq, dv]:
# one call of the package's attention backends (DotProductAttention's backend selection).
Attend = Callable[[Tensor, Tensor, Tensor, AttentionProblem], Tensor]


def check_group(cp_group, cp_comm_type: str) -> None:
    """ValueError unless cp_comm_type is one of COMM_TYPES and cp_group fits it: None (no
    context parallelism), a ProcessGroup, or for 'a2a+p2p' the pair [a2a group, p2p group]."""
    if cp_comm_type not in COMM_TYPES:
        raise ValueError(f"cp_comm_type must be one of {COMM_TYPES}, got {cp_comm_type!r}")
    if cp_group is None:
        return
    if cp_comm_type == "a2a+p2p":
        pair = isinstance(cp_group, (list, tuple)) and len(cp_group) == 2
        if not pair or not all(isinstance(group, dist.ProcessGroup) for group in cp_group):
            raise ValueError("cp_comm_type='a2a+p2p' takes cp_group = [a2a group, p2p group], two "
                             f"torch.distributed ProcessGroups, got {cp_group!r}")
    elif not isinstance(cp_group, dist.ProcessGroup):
        raise ValueError(f"cp_group must be a torch.distributed ProcessGroup with cp_comm_type={cp_comm_type!r} "
                         f"(a pair of them only with 'a2a+p2p'), got {type(cp_group).__name__}")


def size_and_rank(cp_group) -> Tuple[int, int]:
    """(ranks, this rank's place) in the context-parallel group: (1, 0) for None; for the pair
    [a2a group, p2p group] the a2a rank counts fastest, rank = a2a size * p2p rank + a2a rank."""
    if cp_group is None:
        return 1, 0
    if isinstance(cp_group, (list, tuple)):
        inner, outer = cp_group
        return group_size(inner) * group_size(outer), group_size(inner) * group_rank(outer) + group_rank(inner)
    return group_size(cp_group), group_rank(cp_group)


@dataclasses.dataclass(frozen=True)
class _Tokens:
    """Where a run of tokens sits in its sequences.

    positions: int64 [B, s], each token's position in its global sequence; B = 1 for sbhd / bshd
        (every batch entry alike), b for thd (one row per packed sequence).
    valid: bool [B, s], False for thd padding (past the sequence's length, or an unused slot of
        the padded batch); None when every token is real.
    """
    positions: Tensor
    valid: Optional[Tensor]

    @staticmethod
    def cat(runs: Sequence["_Tokens"]) -> "_Tokens":
        """The runs one after the other along the sequence."""
        valid = None if runs[0].valid is None else torch.cat([run.valid for run in runs], dim=1)
        return _Tokens(torch.cat([run.positions for run in runs], dim=1), valid)


@dataclasses.dataclass(frozen=True)
class _Split:
    """One side's sequences (the queries', or the keys' and values') and their split over cp ranks.

    fmt: the qkv_format. cp: ranks. local: the sequence length of this side's padded batch
    (sbhd / bshd: the local shard; thd: the longest local share of a sequence). chunk: int64
    [B], each sequence's chunk, 1 / (2 cp) of its padded length. lengths: int64 [B], each thd
    sequence's real tokens (None for sbhd / bshd). packed: thd's padded-batch slots in the local
    packed tokens (None for sbhd / bshd).
    """
    fmt: str
    cp: int
    local: int
    chunk: Tensor
    lengths: Optional[Tensor]
    packed: Optional[Packing]

    def tokens(self, rank: int) -> _Tokens:
        """Where cp rank `rank`'s tokens sit: its chunks rank and 2 cp - 1 - rank."""
        slot = torch.arange(self.local, device=self.chunk.device)  # [local]
        chunk = self.chunk.unsqueeze(-1)  # [B, 1]
        later = (2 * self.cp - 1 - rank) * chunk + slot - chunk
        positions = torch.where(slot < chunk, rank * chunk + slot, later)  # [B, local]
        if self.lengths is None:
            return _Tokens(positions, None)
        return _Tokens(positions, (slot < 2 * chunk) & (positions < self.lengths.unsqueeze(-1)))

    def ranks(self, first: int, count: int) -> _Tokens:
        """The tokens of cp ranks first .. first + count - 1, one after the other (what an
        all-to-all or all-gather over those ranks puts together)."""
        return _Tokens.cat([self.tokens(rank) for rank in range(first, first + count)])

    def total(self) -> Tensor:
        """int64 [B]: each sequence's global length in real tokens."""
        return 2 * self.cp * self.chunk if self.lengths is None else self.lengths

    def to_batch(self, x: Tensor) -> Tensor:
        """[s, b, n, d] (sbhd), [b, s, n, d] (bshd) or [t, n, d] (thd) -> [b, n, local, d]."""
        if self.fmt == "sbhd":
            return x.permute(1, 2, 0, 3)
        if self.fmt == "bshd":
            return x.permute(0, 2, 1, 3)
        return pad_packed(x, self.packed).transpose(1, 2)  # [b, local, n, d] -> [b, n, local, d]

    def from_batch(self, out: Tensor) -> Tensor:
        """[b, h, local, dv] -> [s, b, h * dv] (sbhd), [b, s, h * dv] (bshd) or [t, h * dv] (thd)."""
        b, h, s, dv = out.shape
        if self.fmt == "sbhd":
            return out.permute(2, 0, 1, 3).reshape(s, b, h * dv)
        if self.fmt == "bshd":
            return out.transpose(1, 2).reshape(b, s, h * dv)
        return pack_padded(out.transpose(1, 2), self.packed).reshape(-1, h * dv)  # [b, s, h, dv] -> [t, h * dv]


def _split(fmt: str, x: Tensor, cp: int, side: str, cu_seqlens: Optional[Tensor],
           cu_seqlens_padded: Optional[Tensor]) -> _Split:
    """The split of one side (`side` 'q' or 'kv', x that side's local layer), checked."""
    if fmt != "thd":
        local = x.shape[0 if fmt == "sbhd" else 1]
        if local % 2:
            raise ValueError(f"context parallelism: each rank holds 2 of the 2 * cp_size = {2 * cp} chunks of the "
                             f"sequence, so the local {side} sequence length must be even, got {local} "
                             f"({fmt} shape {tuple(x.shape)})")
        return _Split(fmt, cp, local, torch.tensor([local // 2], device=x.device), None, None)
    name, padded_name = f"cu_seqlens_{side}", f"cu_seqlens_{side}_padded"
    if cu_seqlens is None:
        raise ValueError(f"qkv_format='thd' needs {name} (int32 [b + 1], the global sequences)")
    padded, slot_name = (cu_seqlens, name) if cu_seqlens_padded is None else (cu_seqlens_padded, padded_name)
    tokens = x.shape[0]
    check_cu_seqlens(slot_name, padded, tokens * cp)  # the local tokens are 1 / cp of every slot
    check_cu_seqlens(name, cu_seqlens, tokens * cp, covers_all_tokens=False)
    if padded.shape != cu_seqlens.shape:
        raise ValueError(f"{padded_name} {tuple(padded.shape)} must have the shape of {name} {tuple(cu_seqlens.shape)}")
    lengths, slots = (cu_seqlens[1:] - cu_seqlens[:-1]).long(), (padded[1:] - padded[:-1]).long()  # [b]
    if bool((slots % (2 * cp)).any()) or bool((lengths > slots).any()):
        raise ValueError(f"context parallelism with qkv_format='thd' splits each sequence into 2 * cp_size = "
                         f"{2 * cp} chunks: every slot of {slot_name} must be a multiple of {2 * cp} tokens and hold "
                         f"its sequence of {name}; got slots {slots.tolist()}, lengths {lengths.tolist()}")
    chunk = slots // (2 * cp)  # [b]
    local = int(2 * chunk.max()) if chunk.numel() else 0
    return _Split("thd", cp, local, chunk, lengths, packing(padded // cp, None, local, tokens))


def _mask(queries: _Tokens, keys: _Tokens, window: Tuple[int, int], offset: Union[int, Tensor]) -> Optional[Tensor]:
    """bool [B, 1, sq, skv], True where key j is masked out for query i, or None when nothing is.

    Query i is aligned with key position positions_i + offset (offset [B, 1]: each sequence's
    global skv - sq for bottom-right alignment, 0 for top-left); keys more than window[0]
    before it or window[1] after it are masked (a bound < 0 is unlimited), and so is every
    pair with a padding token."""
    left, right = window
    if left < 0 and right < 0 and queries.valid is None and keys.valid is None:
        return None
    query = (queries.positions + offset).unsqueeze(-1)  # [B, sq, 1]
    key = keys.positions.unsqueeze(-2)  # [B, 1, skv]
    masked = torch.zeros(torch.broadcast_shapes(query.shape, key.shape), dtype=torch.bool, device=key.device)
    if left >= 0:
        masked |= key < query - left
    if right >= 0:
        masked |= key > query + right
    if queries.valid is not None:
        masked |= ~queries.valid.unsqueeze(-1)
    if keys.valid is not None:
        masked |= ~keys.valid.unsqueeze(-2)
    return masked.unsqueeze(1)


_ALL = slice(None)


def _ring_blocks(queries: _Tokens, keys_of: Callable[[int], _Tokens], rank: int, size: int,
                 window: Tuple[int, int], offset: Union[int, Tensor], half: Optional[int]) -> List[Block]:
    """The block of each ring step: step i holds the keys of ring rank (rank - i) mod size,
    whose tokens keys_of gives.

    half: the chunk length when the load-balanced causal split lets off-diagonal steps run at
    half size unmasked (sbhd / bshd, equal query and key shards, window (-1, 0)): a block from
    an earlier rank is seen whole by all local queries in its first chunk, its second chunk
    lying after them all; a block from a later rank is seen whole by the second local chunk
    only, which comes after both of its chunks; the rank's own block is a plain causal one (its
    two chunks in order on both sides). None: every block whole, masked by position."""
    blocks = []
    for step in range(size):
        source = (rank - step) % size
        if half is not None and source == rank:
            blocks.append(Block(_ALL, _ALL, None, causal=True))
        elif half is None:
            blocks.append(Block(_ALL, _ALL, _mask(queries, keys_of(source), window, offset)))
        elif source < rank:
            blocks.append(Block(_ALL, slice(0, half), None))
        else:
            blocks.append(Block(slice(half, None), _ALL, None))
    return blocks


def _exchange(parts: Sequence[Tensor], group) -> List[Tensor]:
    """One all-to-all for several tensors [cp, ...] (part j to rank j): flattened per part and
    concatenated into one message."""
    flat = torch.cat([part.reshape(part.shape[0], -1) for part in parts], dim=1)  # [cp, sum of part sizes]
    got = exchanged(flat, group)
    pieces = got.split([part[0].numel() for part in parts], dim=1)
    return [piece.reshape(part.shape) for piece, part in zip(pieces, parts)]


def _scatter_heads(x: Tensor, parts: Tensor) -> Tensor:
    """Rank j's share of x [b, n, s, d] (head group j) as part j: [cp, b, n / cp, s, d]."""
    b, n, s, d = x.shape
    return x.reshape(b, parts, n // parts, s, d).transpose(0, 1)


def _joined_sequence(parts: Tensor) -> Tensor:
    """[cp, b, n, s, d], part i rank i's sequence shard -> [b, n, cp s, d], the shards in rank order."""
    cp, b, n, s, d = parts.shape
    return parts.permute(1, 2, 0, 3, 4).reshape(b, n, cp * s, d)


def _split_sequence(x: Tensor, parts: int) -> Tensor:
    """[b, n, cp s, d] -> [cp, b, n, s, d], rank i's sequence shard as part i."""
    b, n, s, d = x.shape
    return x.reshape(b, n, parts, s // parts, d).permute(2, 0, 1, 3, 4)


def _joined_heads(parts: Tensor) -> Tensor:
    """[cp, b, n, s, d], part j head group j -> [b, cp n, s, d]."""
    cp, b, n, s, d = parts.shape
    return parts.transpose(0, 1).reshape(b, cp * n, s, d)


def _heads_for_sequence(q: Tensor, k: Tensor, v: Tensor, group, attend_whole: Callable) -> Tensor:
    """a2a: q [b, h, sq, dk], k [b, g, skv, dk], v [b, g, skv, dv], the local sequence shards
    with every head -> the ranks' shards joined (rank order) with h / cp and g / cp heads ->
    attend_whole(q, k, v) [b, h / cp, cp sq, dv] -> back to [b, h, sq, dv]."""
    size, dk = group_size(group), k.shape[-1]
    kv = torch.cat((k, v), dim=-1)  # [b, g, skv, dk + dv]
    q_parts, kv_parts = _exchange([_scatter_heads(q, size), _scatter_heads(kv, size)], group)
    k_all, v_all = _joined_sequence(kv_parts).split((dk, v.shape[-1]), dim=-1)
    out = attend_whole(_joined_sequence(q_parts), k_all, v_all)  # [b, h / cp, cp sq, dv]
    (back,) = _exchange([_split_sequence(out, size)], group)
    return _joined_heads(back)


# --- entry -----------------------------------------------------------------------------------

def attention(q: Tensor, k: Tensor, v: Tensor, *, cp_group, cp_comm_type: str, qkv_format: str,
              attn_mask_type: str, window: Tuple[int, int], bottom_right: bool, cu_seqlens_q: Optional[Tensor],
              cu_seqlens_kv: Optional[Tensor], cu_seqlens_q_padded: Optional[Tensor],
              cu_seqlens_kv_padded: Optional[Tensor], scale: float, dropout: float, attend: Attend) -> Tensor:
    """Attention of this rank's queries over the whole sequence, split over cp_group.

    q [sq, b, h, dk] (sbhd), [b, sq, h, dk] (bshd) or [tq, h, dk] (thd), this rank's shard
    (module docstring); k / v likewise with g heads and dk / dv channels. attn_mask_type is
    canonical (thd: its padding variant), window resolved; bottom_right: where the diagonal of
    the causal mask and window sits (masks.aligns_bottom_right). cu_seqlens_* (thd): the global
    int32 [b + 1] offsets. scale multiplies q k^T; dropout is the probability in effect.
    attend runs the package's backends (all_gather, a2a). Returns [sq, b, h * dv] /
    [b, sq, h * dv] / [tq, h * dv], this rank's shard of the output.
    """
    check_group(cp_group, cp_comm_type)
    cp, rank = size_and_rank(cp_group)
    if attn_mask_type not in _MASK_TYPES[qkv_format]:
        raise NotImplementedError(f"context parallelism with qkv_format={qkv_format!r} supports attn_mask_type in "
                                  f"{_MASK_TYPES[qkv_format]}, got {attn_mask_type!r}")
    if dropout > 0 and cp_comm_type in _RING_TYPES:
        raise NotImplementedError(f"cp_comm_type={cp_comm_type!r} runs without attention_dropout (got {dropout}): "
                                  "use 'all_gather' or 'a2a', or dropout 0")
    queries = _split(qkv_format, q, cp, "q", cu_seqlens_q, cu_seqlens_q_padded)
    keys = _split(qkv_format, k, cp, "kv", cu_seqlens_kv, cu_seqlens_kv_padded)
    if queries.chunk.shape != keys.chunk.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_kv must describe as many sequences, got "
                         f"{queries.chunk.numel()} and {keys.chunk.numel()}")
    offset = (keys.total() - queries.total()).unsqueeze(-1) if bottom_right else 0
    q, k, v = queries.to_batch(q), keys.to_batch(k), keys.to_batch(v)  # [b, n, local, d]

    def problem(spec: MaskSpec) -> AttentionProblem:
        return AttentionProblem(spec=spec, bias=None, scale=scale, dropout=dropout)

    if cp_comm_type in _HEAD_TYPES:
        heads_group = cp_group[0] if cp_comm_type == "a2a+p2p" else cp_group
        heads = group_size(heads_group)
        if q.shape[1] % heads or k.shape[1] % heads:
            raise ValueError(f"cp_comm_type={cp_comm_type!r} spreads the heads over {heads} ranks: "
                             f"num_attention_heads ({q.shape[1]} on this rank) and num_gqa_groups ({k.shape[1]}) "
                             f"must divide by {heads}")

    if cp_comm_type == "p2p":
        half = queries.local // 2 if qkv_format != "thd" and keys.local == queries.local and window == (-1, 0) else None
        blocks = _ring_blocks(queries.tokens(rank), keys.tokens, rank, cp, window, offset, half)
        out = RingAttention.apply(q, k, v, blocks, scale, cp_group)
    elif cp_comm_type == "all_gather":
        kv = torch.cat((k, v), dim=-1).permute(2, 0, 1, 3).contiguous()  # [skv, b, g, dk + dv]: gathered along dim 0
        kv_all = gather(kv, cp_group).permute(1, 2, 0, 3)  # [b, g, cp skv, dk + dv], rank order
        k_all, v_all = kv_all.split((k.shape[-1], v.shape[-1]), dim=-1)
        mask = _mask(queries.tokens(rank), keys.ranks(0, cp), window, offset)
        out = attend(q, k_all, v_all, problem(MaskSpec(explicit=mask)))
    elif cp_comm_type == "a2a":
        def whole(q_all: Tensor, k_all: Tensor, v_all: Tensor) -> Tensor:
            q_tokens, k_tokens = queries.ranks(0, cp), keys.ranks(0, cp)
            if qkv_format == "thd":
                return attend(q_all, k_all, v_all, problem(MaskSpec(explicit=_mask(q_tokens, k_tokens, window, offset))))
            # sbhd / bshd: the joined shards reordered into the sequence, so the plain causal
            # masks stay structural (no mask tensor); slot i of the joined shards holds position
            # q_order[i], the output goes back by the same index.
            q_order, k_order = q_tokens.positions[0], k_tokens.positions[0]
            q_seq = q_all.index_select(2, torch.argsort(q_order))
            k_seq, v_seq = (t.index_select(2, torch.argsort(k_order)) for t in (k_all, v_all))
            spec = masks.build_mask(attn_mask_type, window, q_seq.shape[2], k_seq.shape[2], q.device,
                                    bottom_right_diagonal=bottom_right)
            out_seq = attend(q_seq, k_seq, v_seq, problem(spec))
            return out_seq.index_select(2, q_order)
        out = _heads_for_sequence(q, k, v, cp_group, whole)
    else:  # a2a+p2p: a2a over the first group, then the ring over the second
        heads_group, ring_group = cp_group
        heads, ring_rank = group_size(heads_group), group_rank(ring_group)

        def ring(q_all: Tensor, k_all: Tensor, v_all: Tensor) -> Tensor:
            blocks = _ring_blocks(queries.ranks(heads * ring_rank, heads), lambda src: keys.ranks(heads * src, heads),
                                  ring_rank, group_size(ring_group), window, offset, None)
            return RingAttention.apply(q_all, k_all, v_all, blocks, scale, ring_group)
        out = _heads_for_sequence(q, k, v, heads_group, ring)
    return queries.from_batch(out)

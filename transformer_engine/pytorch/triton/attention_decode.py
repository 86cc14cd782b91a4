"""Flash-decoding and paged KV caches for triton/attention.py's forward (flash_attention_fwd hands
them here): the op's numerics (reference/attention.py) with every feature the main forward has
(causal top-left / bottom-right and any window, GQA / MQA, dk != dv, ALiBi, sinks, the max logit).

Rows. A program takes one (sequence, key/value head) and a block of BLOCK_M query rows of its
query heads: while a head's lq queries fit a block, the block packs the queries of
BLOCK_M // lq heads (of all the group's for a decode step, so that K and V are read once for
them), else each head's queries take blocks of their own (a paged prefill).

Splits (flash-decoding). A decode step has a few query tokens per sequence and a long cache: its
batch * kv_heads programs would leave most of a GPU idle, so the key blocks a program sees are cut
into `splits` parts of as many whole blocks each, one program per part (grid: splits, batch *
kv_heads * row_blocks), chosen by split_count() to fill the GPU's multiprocessors. Each part keeps
FlashAttention-2's running max m, sum l of exp(s - m) and unnormalised output in fp32 over its
keys and writes them to a workspace, part[split, program, row, :dv] and stats[split, program,
(m, l), row]; a second kernel merges a program's parts in split order, each scaled once by
exp(m_split - max over splits of m), so the result does not depend on scheduling (the same bits
run to run; another split count sums in another order, within fp32's rounding). The merge, or
the part kernel itself when there is one split, joins the sink, divides once and rounds out once
to q's dtype; lse = m + log l (fp32, returned float64 like attention.py's forward).

Paged caches: k and v are pools [pages, page_size, g, d]; key j of sequence i is row
page_table[i, j // page_size] * page_size + j % page_size of the pool (reference._unpaged), each
sequence's length from cu_seqlens_kv. Everything else (bias, mask, dropout, softcap, float64)
attention.supports() leaves to the reference.
"""
from typing import NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._device import resident_programs
from .attention import (BLOCK_M, _block, _block_at, _common, _dot_fp32_by, _key_range, _logits, _sequence, _strides,
                        finished_rows)

# Decode-shaped: at most 16 queries per sequence. Up to there a (sequence, head) is one block of
# the main forward (BLOCK_M = 64 rows, a quarter or less of them used), so batch * heads programs
# are all its parallelism and splitting the keys pays; 16 rows also fill one tensor-core tile (the
# smallest M of a dot), and cover speculative decoding's drafts. Longer query runs bring query
# blocks of their own and go to the main forward (paged ones stay here, unsplit).
DECODE_MAX_SQ = 16
# A part walks at least this many keys (4 blocks): its partial output (rows x dv fp32, written
# once and read once by the merge) stays small next to the K and V rows it reads.
MIN_SPLIT_KEYS = 256
# The programs the splits aim for per multiprocessor: a part streams its keys once (bound by
# memory), and two of them let one's loads overlap the other's arithmetic.
PROGRAMS_PER_MULTIPROCESSOR = 2


class Plan(NamedTuple):
    """How the kernels cut one call: rows of a program (BLOCK_M), row blocks per (sequence,
    key/value head), and parts of each program's keys."""
    block_rows: int
    row_blocks: int
    splits: int


def split_count(keys: int, programs: int, slots: int) -> int:
    """The parts to split each program's `keys` into: enough that `programs` times it fills
    `slots` (programs the GPU runs at once), each part MIN_SPLIT_KEYS keys or more; 1 when the
    programs fill the GPU by themselves."""
    if programs == 0 or programs >= slots:
        return 1
    return max(1, min(triton.cdiv(slots, programs), keys // MIN_SPLIT_KEYS))


def block_rows(ratio: int, max_sq: int) -> int:
    """Rows of a program: the query rows of a group of heads (ratio * max_sq) for a decode step,
    at least 16 (a dot's smallest M) and at most the main forward's BLOCK_M."""
    if max_sq > DECODE_MAX_SQ:
        return BLOCK_M
    return min(max(16, triton.next_power_of_2(ratio * max_sq)), BLOCK_M)


def row_blocks(ratio: int, lq: int, rows: int) -> int:
    """Blocks of `rows` rows that the queries of a (sequence of lq queries, key/value head with
    `ratio` query heads) take: heads packed rows // lq to a block while lq fits one, else
    ceil(lq / rows) blocks per head (_blocks_of in the kernels, which grows with lq)."""
    width = max(min(lq, rows), 1)
    return triton.cdiv(ratio, min(ratio, rows // width)) * triton.cdiv(lq, rows)


def _keys_seen(max_sq: int, max_skv: int, window: Tuple[int, int], bottom_right: bool) -> int:
    """The most keys one program's rows see: top-left, keys up to the last query's position plus
    the right bound; a window bounded on both sides, its width plus the rows' positions."""
    left, right = window
    keys = max_skv
    if right >= 0 and not bottom_right:
        keys = min(keys, max_sq + right)
    if left >= 0 and right >= 0:
        keys = min(keys, left + right + max_sq)
    return keys


def plan(q: Tensor, k: Tensor, page_table: Optional[Tensor], batch: int, max_sq: int, max_skv: int,
         window: Tuple[int, int], bottom_right: bool) -> Optional[Plan]:
    """This module's cut of the call, or None where the main forward runs it (no page table,
    and not a decode step that splitting speeds up). The GPU's multiprocessors set the splits
    (_device.resident_programs; on CPU tensors, the interpreter's nominal 16 programs)."""
    kv_heads = k.shape[2] if page_table is not None else k.shape[1]
    ratio = q.shape[1] // kv_heads
    rows = block_rows(ratio, max_sq)
    blocks = row_blocks(ratio, max_sq, rows)
    splits = 1
    if max_sq <= DECODE_MAX_SQ:
        slots = resident_programs(q.device, PROGRAMS_PER_MULTIPROCESSOR)
        splits = split_count(_keys_seen(max_sq, max_skv, window, bottom_right), batch * kv_heads * blocks, slots)
    if page_table is None and splits == 1:
        return None
    return Plan(rows, blocks, splits)


# --- kernels ------------------------------------------------------------------------------------

@triton.jit
def _program(kv_heads, row_blocks):
    """(sequence, key/value head, row block) of this program (grid axis 1: batch * kv_heads *
    row_blocks, in that order)."""
    pid = tl.program_id(1)
    return pid // row_blocks // kv_heads, pid // row_blocks % kv_heads, pid % row_blocks


@triton.jit
def _blocks_of(lq, ratio, BLOCK_M: tl.constexpr):
    """row_blocks(ratio, lq, BLOCK_M): 0 for an empty sequence."""
    width = tl.maximum(tl.minimum(lq, BLOCK_M), 1)
    return tl.cdiv(ratio, tl.minimum(ratio, BLOCK_M // width)) * tl.cdiv(lq, BLOCK_M)


@triton.jit
def _rows(block, lq, ratio, kvh, BLOCK_M: tl.constexpr):
    """Row block `block` (< _blocks_of, lq >= 1) of key/value head kvh: each row's query head,
    its query position (lq where the row is not real, which _logits then masks) and whether
    it is real. Rows r of a block: head r // width of the block's heads, query r % width."""
    width = tl.minimum(lq, BLOCK_M)  # a head's rows in one block
    head_blocks = tl.cdiv(lq, BLOCK_M)  # blocks of one head's queries (1 while they fit)
    per_block = tl.minimum(ratio, BLOCK_M // width)  # heads in one block (1 past a block)
    r = tl.arange(0, BLOCK_M)
    in_group = block // head_blocks * per_block + r // width
    t = block % head_blocks * BLOCK_M + r % width
    real = (r < per_block * width) & (in_group < ratio) & (t < lq)
    return kvh * ratio + in_group, tl.where(real, t, lq), real


@triton.jit
def _row_offsets(seq, h, t, sb, sh, st, start):
    """Element offsets of rows (sequence seq, heads h, tokens start + t) of a tensor with strides
    (sb, sh, st)."""
    return seq.to(tl.int64) * sb + h.to(tl.int64) * sh + (start + t).to(tl.int64) * st


@triton.jit
def _split_keys(t, real, lq, lkv, shift, window_left, window_right, BLOCK_N: tl.constexpr):
    """[lo, hi) of the keys this part (grid axis 0) walks: the key blocks the real rows see, cut
    into num_programs(0) parts of as many whole blocks each (the last ones shorter or empty)."""
    t0 = tl.min(tl.where(real, t, lq), axis=0)
    t1 = tl.max(tl.where(real, t, 0), axis=0)
    lo, hi = _key_range(t0, t1, lkv, shift, window_left, window_right, BLOCK_N)
    per_part = tl.cdiv(tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_N), tl.num_programs(0)) * BLOCK_N
    first = lo + tl.program_id(0) * per_part
    return first, tl.minimum(hi, first + per_part)


@triton.jit
def _key_tokens(PAGES, seq, start_kv, offs_n, keys, pages_sb, page_size, PAGED: tl.constexpr):
    """The rows of keys offs_n of sequence seq among k's and v's token rows: after the
    sequence's start, or in a paged pool row page_table[seq, j // page_size] * page_size +
    j % page_size."""
    if PAGED:
        page = tl.load(PAGES + seq.to(tl.int64) * pages_sb + offs_n // page_size, mask=keys, other=0)
        return page.to(tl.int64) * page_size + offs_n % page_size
    return start_kv + offs_n


@triton.jit
def _finish(OUT, LSE, ROW_MAX, SINK, m_i, l_i, acc, h, real, rows_o, rows_l, offs_dv, dv, HAS_SINK: tl.constexpr):
    """Rows' max logit m; the sink's exp(offset) joined to the sum l; out = acc / l rounded once
    to OUT's dtype and lse = m + log l, or zeros and -inf where the sum is empty."""
    tl.store(ROW_MAX + rows_l, m_i, mask=real)
    out, lse = finished_rows(acc, m_i, l_i, SINK + h, real, HAS_SINK)
    tl.store(OUT + rows_o[:, None] + offs_dv[None, :], out.to(OUT.dtype.element_ty),
             mask=real[:, None] & (offs_dv < dv)[None, :])
    tl.store(LSE + rows_l, lse, mask=real)


@triton.jit
def _slot(split, BLOCK_M: tl.constexpr):
    """The first workspace row of (split, this program): part [splits, programs, BLOCK_M, dv],
    stats [splits, programs, 2 (m, l), BLOCK_M]; small enough for int32 (split only when the
    programs are fewer than the GPU holds)."""
    return (split * tl.num_programs(1) + tl.program_id(1)) * BLOCK_M


@triton.jit
def _part_kernel(Q, K, V, PAGES, LENS, STARTS, SLOPES, SINK, OUT, LSE, ROW_MAX, PART, STATS,
                 q_sb, q_sh, q_st, k_sb, k_sh, k_st, v_sb, v_sh, v_st, o_sb, o_sh, o_st, l_sb, l_sh, l_st,
                 pages_sb, page_size, batch, kv_heads, ratio, row_blocks, dk, dv, scale, window_left, window_right,
                 slopes_sb, BOTTOM_RIGHT: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SINK: tl.constexpr,
                 PAGED: tl.constexpr, SPLIT: tl.constexpr, FP32: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One part of one row block's keys (grid: splits, batch * kv_heads * row_blocks): its m, l
    and unnormalised output to the workspace with SPLIT, else the finished rows."""
    seq, kvh, block = _program(kv_heads, row_blocks)
    lq, lkv, start_q, start_kv = _sequence(LENS, STARTS, batch, seq)
    if block >= _blocks_of(lq, ratio, BLOCK_M):
        return
    h, t, real = _rows(block, lq, ratio, kvh, BLOCK_M)
    shift = lkv - lq if BOTTOM_RIGHT else 0
    offs_dk, offs_dv = tl.arange(0, BLOCK_DK), tl.arange(0, BLOCK_DV)
    q = tl.load(Q + _row_offsets(seq, h, t, q_sb, q_sh, q_st, start_q)[:, None] + offs_dk[None, :],
                mask=real[:, None] & (offs_dk < dk)[None, :], other=0.0)  # [BLOCK_M, BLOCK_DK]
    slope = tl.load(SLOPES + seq * slopes_sb + h, mask=real, other=0.0)[:, None] if HAS_ALIBI else 0.0
    k_base = K + seq.to(tl.int64) * k_sb + kvh * k_sh  # k_sb, v_sb 0 for a pool: rows from the page table
    v_base = V + seq.to(tl.int64) * v_sb + kvh * v_sh
    lo, hi = _split_keys(t, real, lq, lkv, shift, window_left, window_right, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for k0 in range(lo, hi, BLOCK_N):
        offs_n = k0 + tl.arange(0, BLOCK_N)
        keys = offs_n < lkv
        tokens = _key_tokens(PAGES, seq, start_kv, offs_n, keys, pages_sb, page_size, PAGED)
        k = tl.trans(_block_at(k_base, k_st, 0, tokens, keys, offs_dk, dk))  # [BLOCK_DK, BLOCK_N]
        s = _logits(q, k, t, offs_n, lq, lkv, shift, scale, slope, window_left, window_right, HAS_ALIBI, FP32)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen yet: exp(-inf) = 0
        p = tl.exp(s - base[:, None])
        alpha = tl.exp(m_i - base)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = _block_at(v_base, v_st, 0, tokens, keys, offs_dv, dv)  # [BLOCK_N, BLOCK_DV]
        acc = acc * alpha[:, None] + _dot_fp32_by(p, v, FP32)
        m_i = m_new
    if SPLIT:  # every row, real or not (-inf, 0, 0): the merge reads whole blocks
        slot = _slot(tl.program_id(0), BLOCK_M)
        r = tl.arange(0, BLOCK_M)
        tl.store(PART + (slot + r)[:, None] * dv + offs_dv[None, :], acc, mask=(offs_dv < dv)[None, :])
        tl.store(STATS + 2 * slot + r, m_i)
        tl.store(STATS + 2 * slot + BLOCK_M + r, l_i)
    else:
        _finish(OUT, LSE, ROW_MAX, SINK, m_i, l_i, acc, h, real, _row_offsets(seq, h, t, o_sb, o_sh, o_st, start_q),
                _row_offsets(seq, h, t, l_sb, l_sh, l_st, start_q), offs_dv, dv, HAS_SINK)


@triton.jit
def _merge_kernel(PART, STATS, LENS, STARTS, SINK, OUT, LSE, ROW_MAX, o_sb, o_sh, o_st, l_sb, l_sh, l_st,
                  batch, kv_heads, ratio, row_blocks, splits, dv, HAS_SINK: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_DV: tl.constexpr):
    """A row block's parts merged in split order (grid: 1, batch * kv_heads * row_blocks): the
    joint max M over the parts first, then l = sum l_s exp(m_s - M) and O = sum O_s exp(m_s - M),
    fp32; then finished."""
    seq, kvh, block = _program(kv_heads, row_blocks)
    lq, lkv, start_q, start_kv = _sequence(LENS, STARTS, batch, seq)
    if block >= _blocks_of(lq, ratio, BLOCK_M):
        return
    h, t, real = _rows(block, lq, ratio, kvh, BLOCK_M)
    r = tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    joint = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for split in range(splits):
        joint = tl.maximum(joint, tl.load(STATS + 2 * _slot(split, BLOCK_M) + r))
    base = tl.where(joint == float("-inf"), 0.0, joint)  # rows no part saw: every factor exp(-inf) = 0
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for split in range(splits):
        slot = _slot(split, BLOCK_M)
        factor = tl.exp(tl.load(STATS + 2 * slot + r) - base)
        l_i += tl.load(STATS + 2 * slot + BLOCK_M + r) * factor
        part = tl.load(PART + (slot + r)[:, None] * dv + offs_dv[None, :], mask=(offs_dv < dv)[None, :], other=0.0)
        acc += part * factor[:, None]
    _finish(OUT, LSE, ROW_MAX, SINK, joint, l_i, acc, h, real, _row_offsets(seq, h, t, o_sb, o_sh, o_st, start_q),
            _row_offsets(seq, h, t, l_sb, l_sh, l_st, start_q), offs_dv, dv, HAS_SINK)


# --- host side ----------------------------------------------------------------------------------

def _kv_strides(t: Tensor, paged: bool) -> Tuple[int, int, int]:
    """(sequence, head, token) strides of k or v: a pool [pages, page_size, g, d] is one run of
    token rows (pages follow each other: the op's check), addressed through the page table."""
    return (0, t.stride(2), t.stride(1)) if paged else tuple(_strides(t))


def _row_strides(t: Tensor) -> Tuple[int, int, int]:
    """(sequence, head, token) strides of a per-row tensor: [b, h, s], or packed [t, h]."""
    return (0, t.stride(1), t.stride(0)) if t.dim() == 2 else tuple(t.stride())


def forward(cut: Plan, q: Tensor, k: Tensor, v: Tensor, lengths: Tensor, starts: Tensor, alibi_slopes: Optional[Tensor],
            softmax_offset: Optional[Tensor], page_table: Optional[Tensor], scale: float, window: Tuple[int, int],
            bottom_right: bool, return_max_logit: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """flash_attention_fwd's (out, lse float64, max_logit) cut as `cut` says; lengths int32
    [2, batch] and starts int64 [2, batch] as attention._sequences gives them, q, k, v with
    unit channel strides."""
    paged = page_table is not None
    batch, heads, kv_heads = lengths.shape[1], q.shape[1], k.shape[2] if paged else k.shape[1]
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
    row_max = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
    programs = batch * kv_heads * cut.row_blocks
    if programs:
        scalars, constexprs = _common(q, k, alibi_slopes, window[0], window[1], bottom_right)
        dv = v.shape[-1]
        split = cut.splits > 1
        part = stats = lse  # the workspace, unused without a split
        if split:  # each part's rows: output [splits, programs, rows, dv], (m, l) [splits, programs, 2, rows]
            part = torch.empty(cut.splits, programs, cut.block_rows, dv, dtype=torch.float32, device=q.device)
            stats = torch.empty(cut.splits, programs, 2, cut.block_rows, dtype=torch.float32, device=q.device)
        table = page_table.contiguous() if paged else lengths
        slopes = alibi_slopes.contiguous() if alibi_slopes is not None else lse
        sink = softmax_offset.contiguous() if softmax_offset is not None else lse
        constexprs.update(BLOCK_M=cut.block_rows, HAS_SINK=softmax_offset is not None, BLOCK_DV=_block(dv))
        _part_kernel[(cut.splits, programs)](
            q, k, v, table, lengths, starts, slopes, sink, out, lse, row_max, part, stats, *_strides(q),
            *_kv_strides(k, paged), *_kv_strides(v, paged), *_strides(out), *_row_strides(lse),
            table.stride(0) if paged else 0, k.shape[1] if paged else 1, batch, kv_heads, heads // kv_heads,
            cut.row_blocks, dv=dv, scale=float(scale), **scalars, PAGED=paged, SPLIT=split, **constexprs)
        if split:
            merge = {name: constexprs[name] for name in ("HAS_SINK", "BLOCK_M", "BLOCK_DV")}
            _merge_kernel[(1, programs)](part, stats, lengths, starts, sink, out, lse, row_max, *_strides(out),
                                         *_row_strides(lse), batch, kv_heads, heads // kv_heads, cut.row_blocks,
                                         cut.splits, dv, **merge)
    max_logit = q.new_empty(0, dtype=torch.float32)
    if return_max_logit:
        max_logit = row_max.amax(dim=0) if row_max.dim() == 2 else row_max.amax(dim=(0, 2))
    return out, lse.double(), max_logit

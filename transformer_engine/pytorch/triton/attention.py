"""Flash attention forward and backward in Triton, with the ops' signatures and numerics
(reference/attention.py) for what supports() accepts: fp32 / bf16 / fp16 q, k, v of head dims up
to MAX_HEAD_DIM, padded [b, h, s, d] or packed [t, h, d] with cu_seqlens (and padded starts),
causal top-left or bottom-right and any window, GQA / MQA by index (no repeated K/V), ALiBi slopes
and attention sinks; a paged KV cache in the forward. The reference serves the rest (a bias tensor
or dense mask, dropout, softcap, float64).

flash_attention_fwd hands a call with a page table, and a decode step (a few queries per
sequence) whose keys are worth splitting over more programs, to triton/attention_decode.py
(flash-decoding); the kernels below run the rest.

Forward (FlashAttention-2's order): a program takes BLOCK_M queries of one (sequence, head) and
walks the key blocks its window reaches, keeping per row the running max m, the running sum l of
exp(s - m) and the unnormalised output in fp32; out = O / l rounded once, lse = m + log l. With
16-bit inputs the products of two inputs (S, dP) run on the tensor cores as they are, exact in
fp32; those with P or dS take them as two 16-bit parts each (_dot_fp32_by), about 16 bits of
them, where FlashAttention's GPU kernels round them to 8: the results agree with the CPU
kernel's and the reference's to the output dtype's rounding. fp32 inputs keep fp32 products
throughout (no TF32).

Backward, deterministic (every gradient element summed by one program in a fixed order): D =
rowsum(dO * out) first; then a program per (sequence, key/value head, key block) walks the query
heads of its group and their query blocks, recomputing P = exp(s - lse), and sums dV = P^T dO and
dK = scale dS^T Q with dS = P (dP - D), dP = dO V^T; a program per (sequence, head, query block)
walks the key blocks for dQ = scale dS K. A sink's gradient, -sum exp(offset - lse) D, is summed
on the host.
"""
from typing import List, NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._fp8 import amax_of_partials, magnitude, saturate

MAX_HEAD_DIM = 256
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BLOCK_M, BLOCK_N = 64, 64


def supports(op_name: str, args: tuple) -> bool:
    """Whether the kernels run op_name(*args): the forward's q at args[0], the backward's at
    args[1]; no bias, mask, dropout or softcap; a paged cache in the forward only (the backward's
    check refuses one: decoding runs without gradients)."""
    forward = op_name == "flash_attention_fwd"
    q, v = (args[0], args[2]) if forward else (args[1], args[3])
    offset = 0 if forward else 3  # the backward's options follow grad_out, out and lse
    bias, mask, page_table = args[offset + 8], args[offset + 9], args[offset + 12]
    softcap, dropout = args[offset + 17], args[offset + 18]
    return (q.dtype in _DTYPES and max(q.shape[-1], v.shape[-1]) <= MAX_HEAD_DIM and bias is None and mask is None
            and (page_table is None or forward) and softcap == 0.0 and dropout == 0.0)


@triton.jit
def _dot(a, b, FP32: tl.constexpr):
    """a @ b in fp32 sums: with FP32 the operands as fp32 (no TF32), else 16-bit operands on the
    tensor cores. FP32 is set for fp32 inputs, and in Triton's interpreter (CPU tensors), whose
    dot of bf16 operands is wrong in Triton 3.9: there the 16-bit values (P already rounded to
    the input dtype) are widened exactly, and the products are the GPU's."""
    if FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _dot_fp32_by(a, b, FP32: tl.constexpr):
    """a @ b for fp32 a (P, dS) and b of the inputs' dtype. 16-bit b: a as the sum of two parts
    of b's dtype (a's leading bits, then the rest), two dots, so that a carries about 16 bits
    (2^-17 of each term) instead of one rounding to 8 (2^-9 in bf16, which FlashAttention's GPU
    kernels take), as the CPU kernel keeps P and dS in fp32; fp32 b: one fp32 dot."""
    if b.dtype == tl.float32:
        return _dot(a, b, FP32)
    high = a.to(b.dtype)
    low = (a - high.to(tl.float32)).to(b.dtype)
    return _dot(high, b, FP32) + _dot(low, b, FP32)


@triton.jit
def finished_rows(acc, m_i, l_i, sinks, rows, HAS_SINK: tl.constexpr):
    """(out in fp32, lse) of rows from their unnormalised output acc [rows, dv], running max m
    and sum l of exp(s - m): with HAS_SINK each row's sink logit (read at `sinks` where `rows`)
    joins the sum as exp(offset); a row whose sum is empty gives zeros and lse -inf."""
    if HAS_SINK:
        sink = tl.load(sinks, mask=rows, other=0.0)
        joint = tl.maximum(m_i, sink)
        carry = tl.exp(m_i - joint)  # 0 where the row saw no key
        l_i = l_i * carry + tl.exp(sink - joint)
        acc = acc * carry[:, None]
        m_i = joint
    seen = l_i > 0.0
    out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
    return out, lse


@triton.jit
def fp8_values(x, E5M2: tl.constexpr):
    """x (fp32) on the FP8 grid, saturating, to nearest even (the casts' rounding): the values of
    its E4M3 (or E5M2) codes, in fp32, exact in every 16-bit dtype. FP8 attention's P and G."""
    if E5M2:
        return saturate(x, 57344.0).to(tl.float8e5).to(tl.float32)
    return saturate(x, 448.0).to(tl.float8e4nv).to(tl.float32)


@triton.jit
def _sequence(LENS, STARTS, batch, seq):
    """(lq, lkv, start_q, start_kv) of sequence seq: LENS [2, batch] int32, STARTS [2, batch] int64."""
    return tl.load(LENS + seq), tl.load(LENS + batch + seq), tl.load(STARTS + seq), tl.load(STARTS + batch + seq)


@triton.jit
def _query_block(LENS, STARTS, batch, heads, ratio, BOTTOM_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr):
    """This program's block of queries (grid: query blocks, batch * heads): (sequence, head, its
    key/value head, lq, lkv, start_q, start_kv, first query t0, key position minus query
    position, the queries, which of them are inside the sequence)."""
    seq, h = tl.program_id(1) // heads, tl.program_id(1) % heads
    lq, lkv, start_q, start_kv = _sequence(LENS, STARTS, batch, seq)
    t0 = tl.program_id(0) * BLOCK_M
    shift = lkv - lq if BOTTOM_RIGHT else 0
    offs_m = t0 + tl.arange(0, BLOCK_M)
    return seq, h, h // ratio, lq, lkv, start_q, start_kv, t0, shift, offs_m, offs_m < lq


@triton.jit
def _block_at(base, token_stride, start, offs, inside, offs_d, d):
    """Tokens start + offs of one head (base: its token 0) as [len(offs), len(offs_d)], zero
    outside `inside` and past d channels."""
    return tl.load(base + (start + offs)[:, None].to(tl.int64) * token_stride + offs_d[None, :],
                   mask=inside[:, None] & (offs_d < d)[None, :], other=0.0)


@triton.jit
def _load_rows(BASE, seq, head, sb, sh, st, start, offs, inside, offs_d, d):
    """_block_at of (sequence seq, head) of a tensor with strides (sb, sh, st)."""
    return _block_at(BASE + seq.to(tl.int64) * sb + head * sh, st, start, offs, inside, offs_d, d)


@triton.jit
def _store_rows(BASE, seq, head, sb, sh, st, start, offs, inside, offs_d, d, value):
    """value into the rows _load_rows reads, rounded once to BASE's dtype."""
    tl.store(BASE + seq.to(tl.int64) * sb + head * sh + (start + offs)[:, None].to(tl.int64) * st + offs_d[None, :],
             value.to(BASE.dtype.element_ty), mask=inside[:, None] & (offs_d < d)[None, :])


@triton.jit
def _row_values(BASE, seq, head, sb, sh, st, start, offs, inside, other):
    """One value per row (lse, D) of (sequence seq, head), `other` outside."""
    return tl.load(BASE + seq.to(tl.int64) * sb + head * sh + (start + offs).to(tl.int64) * st, mask=inside,
                   other=other)


@triton.jit
def _store_row_values(BASE, seq, head, sb, sh, st, start, offs, inside, value):
    tl.store(BASE + seq.to(tl.int64) * sb + head * sh + (start + offs).to(tl.int64) * st, value, mask=inside)


@triton.jit
def _logits(q, k, offs_m, offs_n, lq, lkv, shift, scale, slope, window_left, window_right,
            HAS_ALIBI: tl.constexpr, FP32: tl.constexpr):
    """The logits [BLOCK_M, BLOCK_N] of queries offs_m against keys offs_n (k as [d, BLOCK_N]),
    -inf where unseen: scale q.k - slope |pos - j| (pos = t + shift) within the window."""
    s = _dot(q, k, FP32) * scale
    pos = offs_m + shift
    if HAS_ALIBI:
        s -= slope * tl.abs(pos[:, None] - offs_n[None, :]).to(tl.float32)
    seen = (offs_n[None, :] < lkv) & (offs_m[:, None] < lq)
    if window_left >= 0:
        seen &= offs_n[None, :] >= pos[:, None] - window_left
    if window_right >= 0:
        seen &= offs_n[None, :] <= pos[:, None] + window_right
    return tl.where(seen, s, float("-inf"))


@triton.jit
def _key_range(t0, t1, lkv, shift, window_left, window_right, BLOCK_N: tl.constexpr):
    """[lo, hi) of the keys queries [t0, t1] see, lo rounded down to a key block."""
    lo = 0
    hi = lkv
    if window_left >= 0:
        lo = tl.maximum(t0 + shift - window_left, 0)
    if window_right >= 0:
        hi = tl.minimum(tl.maximum(t1 + shift + window_right + 1, 0), lkv)
    return lo // BLOCK_N * BLOCK_N, hi


@triton.jit
def _fwd_kernel(Q, K, V, OUT, LSE, ROW_MAX, LENS, STARTS, SLOPES, SINK,
                q_sb, q_sh, q_st, k_sb, k_sh, k_st, v_sb, v_sh, v_st, o_sb, o_sh, o_st, l_sb, l_sh, l_st,
                batch, heads, ratio, dk, dv, scale, window_left, window_right, slopes_sb,
                BOTTOM_RIGHT: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SINK: tl.constexpr, FP32: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    seq, h, kvh, lq, lkv, start_q, start_kv, t0, shift, offs_m, rows = _query_block(LENS, STARTS, batch, heads, ratio,
                                                                                      BOTTOM_RIGHT, BLOCK_M)
    if t0 >= lq:
        return
    offs_dk, offs_dv = tl.arange(0, BLOCK_DK), tl.arange(0, BLOCK_DV)
    q = _load_rows(Q, seq, h, q_sb, q_sh, q_st, start_q, offs_m, rows, offs_dk, dk)
    slope = tl.load(SLOPES + seq * slopes_sb + h) if HAS_ALIBI else 0.0
    k_base = K + seq.to(tl.int64) * k_sb + kvh * k_sh
    v_base = V + seq.to(tl.int64) * v_sb + kvh * v_sh
    lo, hi = _key_range(t0, tl.minimum(t0 + BLOCK_M, lq) - 1, lkv, shift, window_left, window_right, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for k0 in range(lo, hi, BLOCK_N):
        offs_n = k0 + tl.arange(0, BLOCK_N)
        keys = offs_n < lkv
        k = tl.trans(_block_at(k_base, k_st, start_kv, offs_n, keys, offs_dk, dk))  # [BLOCK_DK, BLOCK_N]
        s = _logits(q, k, offs_m, offs_n, lq, lkv, shift, scale, slope, window_left, window_right, HAS_ALIBI, FP32)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen yet: exp(-inf) = 0
        p = tl.exp(s - base[:, None])
        alpha = tl.exp(m_i - base)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = _block_at(v_base, v_st, start_kv, offs_n, keys, offs_dv, dv)
        acc = acc * alpha[:, None] + _dot_fp32_by(p, v, FP32)
        m_i = m_new
    _store_row_values(ROW_MAX, seq, h, l_sb, l_sh, l_st, start_q, offs_m, rows, m_i)
    out, lse = finished_rows(acc, m_i, l_i, SINK + h + 0 * offs_m, rows, HAS_SINK)  # every row: head h's sink
    _store_rows(OUT, seq, h, o_sb, o_sh, o_st, start_q, offs_m, rows, offs_dv, dv, out)
    _store_row_values(LSE, seq, h, l_sb, l_sh, l_st, start_q, offs_m, rows, lse)


@triton.jit
def _delta_kernel(OUT, DOUT, DELTA, n_rows, dv, factor, BLOCK_ROWS: tl.constexpr, BLOCK_DV: tl.constexpr):
    """DELTA[r] = factor * the sum over channels of dO[r] * out[r], rows of a contiguous [rows, dv]
    (factor 1, or FP8 attention's scale_invs)."""
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_DV)
    inside = (rows < n_rows)[:, None] & (cols < dv)[None, :]
    offsets = rows[:, None].to(tl.int64) * dv + cols[None, :]
    o = tl.load(OUT + offsets, mask=inside, other=0.0).to(tl.float32)
    do = tl.load(DOUT + offsets, mask=inside, other=0.0).to(tl.float32)
    tl.store(DELTA + rows, tl.sum(o * do, axis=1) * factor, mask=rows < n_rows)


@triton.jit
def _dkdv_kernel(Q, K, V, DOUT, LSE, DELTA, DK, DV, LENS, STARTS, SLOPES,
                 q_sb, q_sh, q_st, k_sb, k_sh, k_st, v_sb, v_sh, v_st, do_sb, do_sh, do_st, l_sb, l_sh, l_st,
                 batch, heads, kv_heads, dk, dv, scale, window_left, window_right, slopes_sb,
                 probs_scale, grad_scores_scale, dp_factor, dk_factor, dv_factor,
                 BOTTOM_RIGHT: tl.constexpr, HAS_ALIBI: tl.constexpr, FP32: tl.constexpr,
                 FP8: tl.constexpr, GRAD_E5M2: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """dK, dV of one key block of one (sequence, key/value head): its query heads in order,
    each one's query blocks that reach the block in order (DELTA laid out as LSE). dp_factor,
    dk_factor (the softmax scale without FP8) and dv_factor scale dP's, dK's and dV's sums; with
    FP8, P's E4M3 codes (P * probs_scale) enter dV and G's (G * grad_scores_scale) dK."""
    pid_n, pid_bg = tl.program_id(0), tl.program_id(1)
    seq, kvh = pid_bg // kv_heads, pid_bg % kv_heads
    ratio = heads // kv_heads
    lq, lkv, start_q, start_kv = _sequence(LENS, STARTS, batch, seq)
    k0 = pid_n * BLOCK_N
    if k0 >= lkv:
        return
    shift = lkv - lq if BOTTOM_RIGHT else 0
    offs_n = k0 + tl.arange(0, BLOCK_N)
    offs_dk, offs_dv = tl.arange(0, BLOCK_DK), tl.arange(0, BLOCK_DV)
    keys = offs_n < lkv
    k = _load_rows(K, seq, kvh, k_sb, k_sh, k_st, start_kv, offs_n, keys, offs_dk, dk)  # [BLOCK_N, BLOCK_DK]
    v = _load_rows(V, seq, kvh, v_sb, v_sh, v_st, start_kv, offs_n, keys, offs_dv, dv)
    dk_acc = tl.zeros([BLOCK_N, BLOCK_DK], tl.float32)
    dv_acc = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    # The queries that see keys [k0, k0 + BLOCK_N): pos in [k0 - window_right, k0 + BLOCK_N - 1 + window_left].
    q_lo = 0
    q_hi = lq
    if window_right >= 0:
        q_lo = tl.maximum(k0 - shift - window_right, 0)
    if window_left >= 0:
        q_hi = tl.minimum(tl.maximum(k0 + BLOCK_N - 1 - shift + window_left + 1, 0), lq)
    q_lo = q_lo // BLOCK_M * BLOCK_M
    for h in range(kvh * ratio, kvh * ratio + ratio):
        slope = tl.load(SLOPES + seq * slopes_sb + h) if HAS_ALIBI else 0.0
        q_base = Q + seq.to(tl.int64) * q_sb + h * q_sh
        do_base = DOUT + seq.to(tl.int64) * do_sb + h * do_sh
        for t0 in range(q_lo, q_hi, BLOCK_M):
            offs_m = t0 + tl.arange(0, BLOCK_M)
            rows = offs_m < lq
            q = _block_at(q_base, q_st, start_q, offs_m, rows, offs_dk, dk)
            do = _block_at(do_base, do_st, start_q, offs_m, rows, offs_dv, dv)
            lse = _row_values(LSE, seq, h, l_sb, l_sh, l_st, start_q, offs_m, rows, float("inf"))
            delta = _row_values(DELTA, seq, h, l_sb, l_sh, l_st, start_q, offs_m, rows, 0.0)
            s = _logits(q, tl.trans(k), offs_m, offs_n, lq, lkv, shift, scale, slope, window_left, window_right,
                        HAS_ALIBI, FP32)
            lse = tl.where(lse == float("-inf"), float("inf"), lse)  # a row that sees no key: P = 0
            p = tl.exp(s - lse[:, None])
            if FP8:
                dv_acc += _dot(tl.trans(fp8_values(p * probs_scale, False).to(do.dtype)), do, FP32)
            else:
                dv_acc += _dot_fp32_by(tl.trans(p), do, FP32)
            dp = _dot(do, tl.trans(v), FP32) * dp_factor
            ds = p * (dp - delta[:, None])
            if FP8:
                dk_acc += _dot(tl.trans(fp8_values(ds * grad_scores_scale, GRAD_E5M2).to(q.dtype)), q, FP32)
            else:
                dk_acc += _dot_fp32_by(tl.trans(ds), q, FP32)
    dk_acc *= dk_factor
    dv_acc *= dv_factor
    _store_rows(DK, seq, kvh, k_sb, k_sh, k_st, start_kv, offs_n, keys, offs_dk, dk, dk_acc)
    _store_rows(DV, seq, kvh, v_sb, v_sh, v_st, start_kv, offs_n, keys, offs_dv, dv, dv_acc)


@triton.jit
def _dq_kernel(Q, K, V, DOUT, LSE, DELTA, DQ, AMAX, LENS, STARTS, SLOPES,
               q_sb, q_sh, q_st, k_sb, k_sh, k_st, v_sb, v_sh, v_st, do_sb, do_sh, do_st, l_sb, l_sh, l_st,
               batch, heads, ratio, dk, dv, scale, window_left, window_right, slopes_sb,
               grad_scores_scale, dp_factor, dq_factor,
               BOTTOM_RIGHT: tl.constexpr, HAS_ALIBI: tl.constexpr, FP32: tl.constexpr,
               FP8: tl.constexpr, GRAD_E5M2: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """dQ of one query block of one (sequence, head): the key blocks it sees, in order; dQ's
    sums scaled by dq_factor (the softmax scale without FP8). With FP8, G's codes enter dQ and
    the program's max |G| goes to AMAX[its index] (every G is made once here)."""
    seq, h, kvh, lq, lkv, start_q, start_kv, t0, shift, offs_m, rows = _query_block(LENS, STARTS, batch, heads, ratio,
                                                                                      BOTTOM_RIGHT, BLOCK_M)
    if t0 >= lq:
        return
    offs_dk, offs_dv = tl.arange(0, BLOCK_DK), tl.arange(0, BLOCK_DV)
    q = _load_rows(Q, seq, h, q_sb, q_sh, q_st, start_q, offs_m, rows, offs_dk, dk)
    do = _load_rows(DOUT, seq, h, do_sb, do_sh, do_st, start_q, offs_m, rows, offs_dv, dv)
    lse = _row_values(LSE, seq, h, l_sb, l_sh, l_st, start_q, offs_m, rows, float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    delta = _row_values(DELTA, seq, h, l_sb, l_sh, l_st, start_q, offs_m, rows, 0.0)
    slope = tl.load(SLOPES + seq * slopes_sb + h) if HAS_ALIBI else 0.0
    k_base = K + seq.to(tl.int64) * k_sb + kvh * k_sh
    v_base = V + seq.to(tl.int64) * v_sb + kvh * v_sh
    lo, hi = _key_range(t0, tl.minimum(t0 + BLOCK_M, lq) - 1, lkv, shift, window_left, window_right, BLOCK_N)
    dq_acc = tl.zeros([BLOCK_M, BLOCK_DK], tl.float32)
    grad_amax = 0.0
    for k0 in range(lo, hi, BLOCK_N):
        offs_n = k0 + tl.arange(0, BLOCK_N)
        keys = offs_n < lkv
        k = _block_at(k_base, k_st, start_kv, offs_n, keys, offs_dk, dk)  # [BLOCK_N, BLOCK_DK]
        v = _block_at(v_base, v_st, start_kv, offs_n, keys, offs_dv, dv)
        s = _logits(q, tl.trans(k), offs_m, offs_n, lq, lkv, shift, scale, slope, window_left, window_right,
                    HAS_ALIBI, FP32)
        p = tl.exp(s - lse[:, None])
        dp = _dot(do, tl.trans(v), FP32) * dp_factor
        ds = p * (dp - delta[:, None])
        if FP8:
            grad_amax = tl.maximum(grad_amax, tl.max(tl.max(magnitude(ds), axis=1), axis=0))
            dq_acc += _dot(fp8_values(ds * grad_scores_scale, GRAD_E5M2).to(k.dtype), k, FP32)
        else:
            dq_acc += _dot_fp32_by(ds, k, FP32)
    dq_acc *= dq_factor
    if FP8:
        tl.store(AMAX + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), grad_amax)
    _store_rows(DQ, seq, h, q_sb, q_sh, q_st, start_q, offs_m, rows, offs_dk, dk, dq_acc)


# --- host side --------------------------------------------------------------------------------

def _sequences(q: Tensor, k: Tensor, cu_q: Optional[Tensor], cu_kv: Optional[Tensor], cu_q_padded: Optional[Tensor],
               cu_kv_padded: Optional[Tensor]) -> Tuple[int, Tensor, Tensor]:
    """(batch, lengths int32 [2, batch] (queries, keys), starts int64 [2, batch]) on q's device."""
    packed = q.dim() == 3
    if cu_q is None:
        batch = q.shape[0]
        lengths = torch.tensor([[q.shape[2]] * batch, [k.shape[2]] * batch], dtype=torch.int32)
        return batch, lengths.to(q.device), torch.zeros(2, batch, dtype=torch.int64, device=q.device)
    batch = cu_q.shape[0] - 1
    lengths = torch.stack([cu_q.diff(), cu_kv.diff()]).to(torch.int32)
    if packed:
        slot_q = (cu_q if cu_q_padded is None else cu_q_padded)[:-1]
        slot_kv = (cu_kv if cu_kv_padded is None else cu_kv_padded)[:-1]
        starts = torch.stack([slot_q, slot_kv]).to(torch.int64)
    else:
        starts = torch.zeros(2, batch, dtype=torch.int64, device=q.device)
    return batch, lengths.to(q.device).contiguous(), starts.to(q.device).contiguous()


def _strides(t: Tensor) -> List[int]:
    """(batch, head, token) strides of a [b, h, s, d] or packed [t, h, d] tensor."""
    return [0, t.stride(1), t.stride(0)] if t.dim() == 3 else [t.stride(0), t.stride(1), t.stride(2)]


def _unit_channels(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _block(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def _common(q: Tensor, k: Tensor, alibi_slopes: Optional[Tensor], window_left: int, window_right: int,
            bottom_right: bool) -> Tuple[dict, dict]:
    """The kernels' shared scalar arguments and constexprs."""
    slopes_sb = alibi_slopes.shape[1] if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0
    scalars = dict(dk=q.shape[-1], window_left=window_left, window_right=window_right, slopes_sb=slopes_sb)
    constexprs = dict(BOTTOM_RIGHT=bool(bottom_right), HAS_ALIBI=alibi_slopes is not None,
                      FP32=q.dtype == torch.float32 or q.device.type == "cpu", BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                      BLOCK_DK=_block(q.shape[-1]))
    return scalars, constexprs


def flash_attention_fwd(q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, alibi_slopes,
                        bias, mask, softmax_offset, dropout_rng, page_table, scale, window_left, window_right,
                        bottom_right, softcap, dropout, return_max_logit):
    """The op on the kernels above, or on attention_decode.py's for a paged cache or a decode
    step it splits (attention_decode.plan)."""
    from . import attention_decode  # it imports this module's helpers: imported once both exist
    q, k, v = (_unit_channels(t) for t in (q, k, v))
    batch, lengths, starts = _sequences(q, k, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded)
    max_sq, max_skv = lengths.amax(dim=1).tolist() if batch else (0, 0)  # one read back to the host
    decode = attention_decode.plan(q, k, page_table, batch, max_sq, max_skv, (window_left, window_right),
                                   bottom_right)
    if decode is not None:
        return attention_decode.forward(decode, q, k, v, lengths, starts, alibi_slopes, softmax_offset, page_table,
                                        scale, (window_left, window_right), bottom_right, return_max_logit)
    heads, kv_heads = q.shape[1], k.shape[1]
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
    row_max = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
    if batch and heads and max_sq:
        scalars, constexprs = _common(q, k, alibi_slopes, window_left, window_right, bottom_right)
        slopes = alibi_slopes.contiguous() if alibi_slopes is not None else lse
        sink = softmax_offset.contiguous() if softmax_offset is not None else lse
        lse_strides = [0, lse.stride(1), lse.stride(0)] if lse.dim() == 2 else list(lse.stride())
        _fwd_kernel[(triton.cdiv(max_sq, BLOCK_M), batch * heads)](
            q, k, v, out, lse, row_max, lengths, starts, slopes, sink, *_strides(q), *_strides(k), *_strides(v),
            *_strides(out), *lse_strides, batch, heads, heads // kv_heads, dv=v.shape[-1], scale=float(scale),
            **scalars, HAS_SINK=softmax_offset is not None, BLOCK_DV=_block(v.shape[-1]), **constexprs)
    max_logit = q.new_empty(0, dtype=torch.float32)
    if return_max_logit:
        max_logit = row_max.amax(dim=0) if row_max.dim() == 2 else row_max.amax(dim=(0, 2))
    return out, lse.double(), max_logit


class Fp8Backward(NamedTuple):
    """FP8 attention's backward (triton/attention_fp8.py): the scales of P's and G's codes, G's
    format, and the fp32 factors of D's, dP's and the gradients' sums (the binding's)."""
    probs_scale: float
    grad_scores_scale: float
    grad_e5m2: bool
    delta_factor: float
    dp_factor: float
    dq_factor: float
    dk_factor: float
    dv_factor: float


def backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, sequences: tuple,
             alibi_slopes: Optional[Tensor], softmax_offset: Optional[Tensor], scale: float, window: Tuple[int, int],
             bottom_right: bool, fp8: Optional[Fp8Backward] = None) -> Tuple[Tensor, ...]:
    """(dq, dk, dv in q's dtype, or fp32 with fp8; grad_softmax_offset fp32 [h] or empty; the
    max |G| (fp32 [1], FP8 only, else empty)); sequences = (cu_seqlens_q, cu_seqlens_kv, and
    their padded forms)."""
    # Contiguous, so that each gradient (made contiguous) is written with its input's strides;
    # out and dO too, which D's kernel reads as rows.
    q, k, v, grad_out, out = (t.contiguous() for t in (q, k, v, grad_out, out))
    batch, lengths, starts = _sequences(q, k, *sequences)
    heads, kv_heads = q.shape[1], k.shape[1]
    lse32 = lse.float().contiguous()
    delta = torch.zeros_like(lse32)
    dv_width = v.shape[-1]
    rows = out.numel() // dv_width if dv_width else 0
    if rows:
        _delta_kernel[(triton.cdiv(rows, 32),)](out, grad_out, delta, rows, dv_width,
                                                 1.0 if fp8 is None else fp8.delta_factor, BLOCK_ROWS=32,
                                                 BLOCK_DV=_block(dv_width))
    grad_dtype = q.dtype if fp8 is None else torch.float32
    dq, dk, dv = (torch.zeros(t.shape, dtype=grad_dtype, device=t.device) for t in (q, k, v))
    max_sq = int(lengths[0].max()) if batch else 0
    max_skv = int(lengths[1].max()) if batch else 0
    q_blocks = triton.cdiv(max_sq, BLOCK_M)
    amax = torch.zeros(batch * heads * q_blocks if fp8 is not None else 0, dtype=torch.float32, device=q.device)
    if batch and heads and max_sq and max_skv:
        scalars, constexprs = _common(q, k, alibi_slopes, window_left=window[0], window_right=window[1],
                                      bottom_right=bottom_right)
        slopes = alibi_slopes.contiguous() if alibi_slopes is not None else lse32
        lse_strides = [0, lse32.stride(1), lse32.stride(0)] if lse32.dim() == 2 else list(lse32.stride())
        shared = dict(dv=dv_width, scale=float(scale), BLOCK_DV=_block(dv_width), FP8=fp8 is not None,
                      GRAD_E5M2=fp8 is not None and fp8.grad_e5m2, **scalars, **constexprs)
        plain = Fp8Backward(1.0, 1.0, False, 1.0, 1.0, float(scale), float(scale), 1.0)
        f = plain if fp8 is None else fp8
        strides = [*_strides(q), *_strides(k), *_strides(v), *_strides(grad_out), *lse_strides]
        _dkdv_kernel[(triton.cdiv(max_skv, BLOCK_N), batch * kv_heads)](
            q, k, v, grad_out, lse32, delta, dk, dv, lengths, starts, slopes, *strides, batch, heads, kv_heads,
            probs_scale=f.probs_scale, grad_scores_scale=f.grad_scores_scale, dp_factor=f.dp_factor,
            dk_factor=f.dk_factor, dv_factor=f.dv_factor, **shared)
        _dq_kernel[(q_blocks, batch * heads)](
            q, k, v, grad_out, lse32, delta, dq, amax if fp8 is not None else delta, lengths, starts, slopes,
            *strides, batch, heads, heads // kv_heads, grad_scores_scale=f.grad_scores_scale,
            dp_factor=f.dp_factor, dq_factor=f.dq_factor, **shared)
    grad_offset = q.new_empty(0, dtype=torch.float32)
    if softmax_offset is not None:  # -sum over rows of exp(offset - lse) D, per head
        sink = softmax_offset.view(1, heads, 1) if lse.dim() == 3 else softmax_offset.view(1, heads)
        shares = (torch.exp(sink.double() - lse).nan_to_num(0.0) * delta.double())
        grad_offset = -(shares.sum(dim=(0, 2)) if lse.dim() == 3 else shares.sum(dim=0)).float()
    grad_amax = amax_of_partials(amax).reshape(1) if fp8 is not None else q.new_empty(0, dtype=torch.float32)
    return dq, dk, dv, grad_offset, grad_amax


def flash_attention_bwd(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                        cu_seqlens_kv_padded, alibi_slopes, bias, mask, softmax_offset, dropout_rng, page_table, scale,
                        window_left, window_right, bottom_right, softcap, dropout, bias_grad):
    sequences = (cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded)
    dq, dk, dv, grad_offset, _ = backward(grad_out, q, k, v, out, lse, sequences, alibi_slopes, softmax_offset, scale,
                                          (window_left, window_right), bottom_right)
    return dq, dk, dv, q.new_empty(0), grad_offset

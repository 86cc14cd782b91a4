"""FP8 attention's ops (flash_attention_fp8_fwd / _bwd) in Triton, with the ops' signatures and
numerics (reference/attention_fp8.py), for what supports() accepts: as triton/attention.py's,
on a device that converts to E4M3 (CUDA sm_89 and later, MUSA MP31; always in the interpreter).

Forward: a program takes BLOCK_M queries of one (sequence, head) and walks their keys twice: first
for each row's lse (running max and sum, the sink joined), then for P = exp(s - lse), whose E4M3
codes (P * probs_scale, saturating, to nearest even) multiply V on the tensor cores (both are
exact 16-bit values): out = (probs_si * v_si) * sum, fp32. Each program writes the max of its P;
their max is probs_amax. Backward: triton/attention.py's kernels with P's and G's codes in the
products (attention.Fp8Backward). q, k, v, out and grad_out hold code values; every factor is the
fp32 product of its scales, left to right, as the CPU binding computes them.
"""
from typing import List

import torch
import triton
import triton.language as tl

from ._device import has_e4m3
from ._fp8 import amax_of_partials
from .attention import (BLOCK_M, Fp8Backward, _block, _block_at, _common, _dot, _key_range, _load_rows, _logits,
                        _query_block, _sequences, _store_row_values, _store_rows, _strides, _unit_channels, backward,
                        fp8_values)
from .attention import supports as _supports_plain


def supports(op_name: str, args: tuple) -> bool:
    """As triton/attention.py's (without softcap, which the ops do not take), on a device with E4M3,
    without a paged cache (which the plain forward reads, the FP8 kernels do not)."""
    offset = 0 if op_name == "flash_attention_fp8_fwd" else 3
    plain = list(args[:offset + 17]) + [0.0] + list(args[offset + 17:offset + 19])  # softcap 0 where the plain op has it
    page_table = args[offset + 12]
    return (has_e4m3(args[offset].device) and page_table is None
            and _supports_plain(op_name.replace("_fp8", ""), tuple(plain)))


@triton.jit
def _fp8_fwd_kernel(Q, K, V, OUT, LSE, ROW_MAX, AMAX, LENS, STARTS, SLOPES, SINK,
                    q_sb, q_sh, q_st, k_sb, k_sh, k_st, v_sb, v_sh, v_st, o_sb, o_sh, o_st, l_sb, l_sh, l_st,
                    batch, heads, ratio, dk, dv, scale, window_left, window_right, slopes_sb, probs_scale,
                    out_factor, BOTTOM_RIGHT: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SINK: tl.constexpr,
                    FP32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr,
                    BLOCK_DV: tl.constexpr):
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
    # First pass: each row's lse.
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    for k0 in range(lo, hi, BLOCK_N):
        offs_n = k0 + tl.arange(0, BLOCK_N)
        k = tl.trans(_block_at(k_base, k_st, start_kv, offs_n, (offs_n < lkv), offs_dk, dk))
        s = _logits(q, k, offs_m, offs_n, lq, lkv, shift, scale, slope, window_left, window_right, HAS_ALIBI, FP32)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp(m_i - base) + tl.sum(tl.exp(s - base[:, None]), axis=1)
        m_i = m_new
    _store_row_values(ROW_MAX, seq, h, l_sb, l_sh, l_st, start_q, offs_m, rows, m_i)
    if HAS_SINK:
        sink = tl.load(SINK + h)
        joint = tl.maximum(m_i, sink)
        l_i = l_i * tl.exp(m_i - joint) + tl.exp(sink - joint)
        m_i = joint
    seen = l_i > 0.0
    lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
    lse_or_inf = tl.where(seen, lse, float("inf"))  # a row that sees nothing: P = 0
    # Second pass: P's codes times V.
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    probs_amax = 0.0
    for k0 in range(lo, hi, BLOCK_N):
        offs_n = k0 + tl.arange(0, BLOCK_N)
        keys = offs_n < lkv
        k = tl.trans(_block_at(k_base, k_st, start_kv, offs_n, keys, offs_dk, dk))
        s = _logits(q, k, offs_m, offs_n, lq, lkv, shift, scale, slope, window_left, window_right, HAS_ALIBI, FP32)
        p = tl.exp(s - lse_or_inf[:, None])
        probs_amax = tl.maximum(probs_amax, tl.max(tl.max(p, axis=1), axis=0))
        v = _block_at(v_base, v_st, start_kv, offs_n, keys, offs_dv, dv)
        acc += _dot(fp8_values(p * probs_scale, False).to(v.dtype), v, FP32)
    _store_rows(OUT, seq, h, o_sb, o_sh, o_st, start_q, offs_m, rows, offs_dv, dv, acc * out_factor)
    _store_row_values(LSE, seq, h, l_sb, l_sh, l_st, start_q, offs_m, rows, lse)
    tl.store(AMAX + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), probs_amax)


def _products(*values: float) -> float:
    """The fp32 product of values, left to right (the CPU binding's factors)."""
    product = torch.tensor(values[0], dtype=torch.float32)
    for value in values[1:]:
        product = product * torch.tensor(value, dtype=torch.float32)
    return float(product)


def flash_attention_fp8_fwd(q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                            alibi_slopes, bias, mask, softmax_offset, dropout_rng, page_table, scale, window_left,
                            window_right, bottom_right, dropout, return_max_logit, fp8_scales):
    q_si, k_si, v_si, probs_scale, probs_si = fp8_scales.tolist()
    q, k, v = (_unit_channels(t) for t in (q, k, v))
    batch, lengths, starts = _sequences(q, k, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded)
    heads, kv_heads = q.shape[1], k.shape[1]
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
    row_max = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
    max_sq = int(lengths[0].max()) if batch else 0
    q_blocks = triton.cdiv(max_sq, BLOCK_M)
    amax = torch.zeros(batch * heads * q_blocks, dtype=torch.float32, device=q.device)
    if batch and heads and max_sq:
        scalars, constexprs = _common(q, k, alibi_slopes, window_left, window_right, bottom_right)
        slopes = alibi_slopes.contiguous() if alibi_slopes is not None else lse
        sink = softmax_offset.contiguous() if softmax_offset is not None else lse
        lse_strides = [0, lse.stride(1), lse.stride(0)] if lse.dim() == 2 else list(lse.stride())
        _fp8_fwd_kernel[(q_blocks, batch * heads)](
            q, k, v, out, lse, row_max, amax, lengths, starts, slopes, sink, *_strides(q), *_strides(k),
            *_strides(v), *_strides(out), *lse_strides, batch, heads, heads // kv_heads, dv=v.shape[-1],
            scale=_products(scale, q_si, k_si), probs_scale=probs_scale, out_factor=_products(probs_si, v_si),
            **scalars, HAS_SINK=softmax_offset is not None, BLOCK_DV=_block(v.shape[-1]), **constexprs)
    max_logit = q.new_empty(0, dtype=torch.float32)
    if return_max_logit:
        max_logit = row_max.amax(dim=0) if row_max.dim() == 2 else row_max.amax(dim=(0, 2))
    return out, lse.double(), max_logit, amax_of_partials(amax).reshape(1)


def flash_attention_fp8_bwd(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                            cu_seqlens_kv_padded, alibi_slopes, bias, mask, softmax_offset, dropout_rng, page_table,
                            scale, window_left, window_right, bottom_right, dropout, bias_grad, fp8_scales,
                            grad_scores_format):
    f: List[float] = fp8_scales.tolist()  # q_si, k_si, v_si, out_si, do_si, probs_scale, probs_si, gs_scale, gs_si
    fp8 = Fp8Backward(probs_scale=f[5], grad_scores_scale=f[7], grad_e5m2=grad_scores_format == 1,
                      delta_factor=_products(f[4], f[3]), dp_factor=_products(f[4], f[2]),
                      dq_factor=_products(scale, f[8], f[1]), dk_factor=_products(scale, f[8], f[0]),
                      dv_factor=_products(f[6], f[4]))
    sequences = (cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded)
    dq, dk, dv, grad_offset, grad_amax = backward(grad_out, q, k, v, out, lse, sequences, alibi_slopes, softmax_offset,
                                                  _products(scale, f[0], f[1]), (window_left, window_right),
                                                  bottom_right, fp8)
    return dq, dk, dv, q.new_empty(0), grad_offset, grad_amax

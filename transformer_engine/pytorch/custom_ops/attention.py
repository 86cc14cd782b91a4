"""Flash attention as dispatcher ops: argument checks, fake kernels, autograd.

The ops (schemas and layouts in bindings/attention_ops.cpp; formula in reference/attention.py):
    flash_attention_fwd(q, k, v, cu_seqlens_q?, cu_seqlens_kv?, cu_seqlens_q_padded?,
                        cu_seqlens_kv_padded?, alibi_slopes?, bias?, mask?, softmax_offset?,
                        dropout_rng?, page_table?, scale, window_left, window_right, bottom_right,
                        softcap, dropout, return_max_logit) -> (out, lse, max_logit)
    flash_attention_bwd(grad_out, q, k, v, out, lse, <the same, bias_grad in place of
                        return_max_logit>) -> (grad_q, grad_k, grad_v, grad_bias, grad_softmax_offset)
The CPU kernel is kernels/cpu/attention; accelerators run triton/attention.py where it takes the
call (supports()), else the reference.
lse, the per-row log-sum-exp the backward reuses (fp64: the backward's probabilities then carry
no rounding of it), and max_logit are outputs without a gradient; q, k, v, bias and
softmax_offset have one.

The checks below are bindings/attention_ops.cpp's, in Python, with its messages: run by the fake
kernels and before the reference on accelerators. The values of cu_seqlens* are read on the host,
as the compiled op does; fake and meta tensors hold no values, so the fake kernels check shapes,
dtypes and devices only.
"""
import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from . import _checks
from ._checks import aten_name, fail, shape_text
from ._registry import no_double_backward, serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)

MAX_HEAD_DIM = 1024  # te_kernels::kAttentionMaxHeadDim


def _index_values(op: str, arg: str, t: Tensor, q: Tensor, entries: int) -> Optional[List[int]]:
    _checks.same_device(op, arg, t, "q", q)
    if t.dtype not in (torch.int32, torch.int64):
        fail(op, f"{arg} must be int32 or int64, got {aten_name(t.dtype)}")
    if t.dim() != 1 or t.shape[0] != entries:
        fail(op, f"{arg} must be 1-D with {entries} entries (sequences + 1), got shape {shape_text(t.shape)}")
    return t.tolist() if _checks.holds_values(t) else None


def _side(op: str, side: str, q: Tensor, cu: Optional[Tensor], padded: Optional[Tensor], batch: int, packed: bool,
          rows: int) -> bool:
    """read_side's checks; whether cu_seqlens_{side} was given."""
    cu_name = f"cu_seqlens_{side}"
    padded_name = cu_name + "_padded"
    if cu is None:
        if padded is not None:
            fail(op, f"{padded_name} needs {cu_name}")
        return False
    cu_values = _index_values(op, cu_name, cu, q, batch + 1)
    if cu_values is not None and cu_values[0] != 0:
        fail(op, f"{cu_name} must start at 0, got {cu_values[0]}")
    slot = cu_values
    if padded is not None:
        if not packed:
            fail(op, f"{padded_name} is only meaningful for packed (3-D) q, k, v")
        slot = _index_values(op, padded_name, padded, q, batch + 1)
    if cu_values is None or slot is None:
        return True
    for i in range(batch):
        length = cu_values[i + 1] - cu_values[i]
        if length < 0:
            fail(op, f"{cu_name} must be non-decreasing, but {cu_name}[{i + 1}] = {cu_values[i + 1]} < "
                     f"{cu_name}[{i}] = {cu_values[i]}")
        if packed:
            if not (slot[i] >= 0 and slot[i + 1] - slot[i] >= length and slot[i] + length <= rows):
                fail(op, f"sequence {i} of {side} ({length} tokens from token {slot[i]}) does not fit its slot of "
                         f"the {rows} packed tokens")
        elif length > rows:
            fail(op, f"sequence {i} of {side} has {length} tokens, more than the {rows} rows of the padded tensor")
    return True


def _dense_operand(op: str, arg: str, t: Tensor, q: Tensor, k: Tensor) -> None:
    _checks.same_device(op, arg, t, "q", q)
    if q.dim() != 4:
        fail(op, f"{arg} needs [batch, heads, sq, head_dim] q, k, v, not packed ones")
    b, h, sq, skv = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if not (t.dim() == 4 and t.shape[0] in (1, b) and t.shape[1] in (1, h) and tuple(t.shape[2:]) == (sq, skv)):
        fail(op, f"{arg} must be [1 or batch, 1 or heads, sq, skv] = [1 or {b}, 1 or {h}, {sq}, {skv}], got shape "
                 f"{shape_text(t.shape)}")


def _paging(op: str, q: Tensor, k: Tensor, v: Tensor, page_table: Tensor, batch: int) -> None:
    _checks.same_device(op, "page_table", page_table, "q", q)
    _checks.dtype(op, "page_table", page_table, torch.int32)
    if page_table.dim() != 2 or page_table.shape[0] < batch:
        fail(op, f"page_table must be [batch or more, pages per sequence] with batch = {batch}, got shape "
                 f"{shape_text(page_table.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.shape[0] > 1 and t.stride(0) != t.shape[1] * t.stride(1):
            fail(op, f"the pages of {name} must follow each other (stride(0) = page_size * stride(1)), got strides "
                     f"{list(t.stride())}")


def _pages_in_use(op: str, k: Tensor, page_table: Tensor, cu_seqlens_kv: Tensor) -> None:
    """Every page a sequence's keys use is a page of the pool (after the lengths' checks: each
    sequence fits its row of the table)."""
    if not (_checks.holds_values(cu_seqlens_kv) and _checks.holds_values(page_table)):
        return
    lengths, table, page_size = cu_seqlens_kv.diff().tolist(), page_table.tolist(), k.shape[1]
    for i, length in enumerate(lengths):
        for n in range(-(-length // page_size)):
            if not 0 <= table[i][n] < k.shape[0]:
                fail(op, f"page_table[{i}, {n}] = {table[i][n]} is not one of the cache's {k.shape[0]} pages")


def _attention(op: str, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
               cu_seqlens_kv_padded, alibi_slopes, bias, mask, softmax_offset, dropout_rng, page_table,
               window_left: int, window_right: int, softcap: float, dropout: float) -> None:
    _checks.high_precision_dtype(op, "q", q.dtype)
    _checks.same_device(op, "k", k, "q", q)
    _checks.same_device(op, "v", v, "q", q)
    _checks.dtype(op, "k", k, q.dtype)
    _checks.dtype(op, "v", v, q.dtype)
    if q.dim() not in (3, 4):
        fail(op, "q must be [batch, heads, sq, head_dim] or packed [tokens, heads, head_dim], got shape "
                 f"{shape_text(q.shape)}")
    paged = page_table is not None
    if paged:
        if k.dim() != 4 or v.dim() != 4:
            fail(op, "with page_table, k and v are a paged cache [pages, page_size, kv_heads, head_dim], got k "
                     f"{shape_text(k.shape)}, v {shape_text(v.shape)}")
    elif k.dim() != q.dim() or v.dim() != q.dim():
        fail(op, f"k and v must be {q.dim()}-D like q, got k {shape_text(k.shape)}, v {shape_text(v.shape)}")
    packed = q.dim() == 3
    if k.shape[:-1] != v.shape[:-1]:
        fail(op, f"k {shape_text(k.shape)} and v {shape_text(v.shape)} must agree in all but the head dim")
    if not packed and not paged and k.shape[0] != q.shape[0]:
        fail(op, f"q {shape_text(q.shape)} and k {shape_text(k.shape)} must have the same batch")
    if k.shape[-1] != q.shape[-1]:
        fail(op, f"k's head dim {k.shape[-1]} differs from q's {q.shape[-1]}")
    heads, kv_heads = q.shape[1], (k.shape[2] if paged else k.shape[1])
    if kv_heads <= 0 or heads % kv_heads:
        fail(op, f"the key/value heads of k {shape_text(k.shape)} must divide the query heads of q {shape_text(q.shape)}")
    if not (1 <= q.shape[-1] <= MAX_HEAD_DIM and 1 <= v.shape[-1] <= MAX_HEAD_DIM):
        fail(op, f"head dims must be in [1, {MAX_HEAD_DIM}], got q {shape_text(q.shape)}, v {shape_text(v.shape)}")
    if window_left < -1 or window_right < -1:
        fail(op, f"window bounds must be -1 (unlimited) or >= 0, got ({window_left}, {window_right})")
    if packed:
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            fail(op, "packed (3-D) q, k, v need cu_seqlens_q and cu_seqlens_kv")
        batch = cu_seqlens_q.shape[0] - 1 if cu_seqlens_q.dim() == 1 else 0
        if batch < 0:
            fail(op, f"cu_seqlens_q needs at least one entry (0), got shape {shape_text(cu_seqlens_q.shape)}")
    else:
        batch = q.shape[0]
    given_q = _side(op, "q", q, cu_seqlens_q, cu_seqlens_q_padded, batch, packed, q.shape[0] if packed else q.shape[2])
    if paged:
        if cu_seqlens_kv is None:
            fail(op, "a paged cache needs cu_seqlens_kv (each sequence's length)")
        _paging(op, q, k, v, page_table, batch)
    kv_rows = page_table.shape[1] * k.shape[1] if paged else k.shape[0] if packed else k.shape[2]
    given_kv = _side(op, "kv", q, cu_seqlens_kv, cu_seqlens_kv_padded, batch, packed and not paged, kv_rows)
    if paged:
        _pages_in_use(op, k, page_table, cu_seqlens_kv)
    if given_q != given_kv:
        fail(op, "give both cu_seqlens_q and cu_seqlens_kv, or neither")
    if alibi_slopes is not None:
        _checks.same_device(op, "alibi_slopes", alibi_slopes, "q", q)
        _checks.dtype(op, "alibi_slopes", alibi_slopes, torch.float32)
        per_head = alibi_slopes.dim() == 1 and alibi_slopes.shape[0] == heads
        per_sequence = alibi_slopes.dim() == 2 and tuple(alibi_slopes.shape) == (batch, heads)
        if not (per_head or per_sequence):
            fail(op, f"alibi_slopes must be [heads] = [{heads}] or [batch, heads] = [{batch}, {heads}], got shape "
                     f"{shape_text(alibi_slopes.shape)}")
    if paged and (bias is not None or mask is not None):
        fail(op, "bias and mask need contiguous k and v, not a paged cache")
    if bias is not None:
        _checks.dtype(op, "bias", bias, q.dtype)
        _dense_operand(op, "bias", bias, q, k)
    if mask is not None:
        _checks.dtype(op, "mask", mask, torch.bool)
        _dense_operand(op, "mask", mask, q, k)
    if softmax_offset is not None:
        _checks.same_device(op, "softmax_offset", softmax_offset, "q", q)
        _checks.dtype(op, "softmax_offset", softmax_offset, torch.float32)
        _checks.shape(op, "softmax_offset", softmax_offset, (heads,), "one sink logit per query head")
    if not (math.isfinite(softcap) and softcap >= 0):
        fail(op, f"softcap must be 0 (no cap) or a positive number, got {softcap}")
    if not 0 <= dropout < 1:
        fail(op, f"dropout must be in [0, 1), got {dropout}")
    if dropout > 0:
        if dropout_rng is None:
            fail(op, f"dropout {dropout} needs dropout_rng (seed, offset)")
        _checks.same_device(op, "dropout_rng", dropout_rng, "q", q)
        _checks.dtype(op, "dropout_rng", dropout_rng, torch.int64)
        _checks.shape(op, "dropout_rng", dropout_rng, (2,), "(seed, offset)")


def _out_shape(q: Tensor, v: Tensor) -> Tuple[int, ...]:
    return tuple(q.shape[:-1]) + (v.shape[-1],)


def _check_fwd(q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, alibi_slopes, bias,
               mask, softmax_offset, dropout_rng, page_table, scale, window_left, window_right, bottom_right, softcap,
               dropout, return_max_logit):
    _attention("flash_attention_fwd", q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
               alibi_slopes, bias, mask, softmax_offset, dropout_rng, page_table, window_left, window_right, softcap,
               dropout)


def _check_bwd(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
               alibi_slopes, bias, mask, softmax_offset, dropout_rng, page_table, scale, window_left, window_right,
               bottom_right, softcap, dropout, bias_grad, op="flash_attention_bwd"):
    if page_table is not None:
        fail(op, "a paged KV cache (page_table) has no backward: decoding runs without gradients")
    _attention(op, q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, alibi_slopes,
               bias, mask, softmax_offset, dropout_rng, None, window_left, window_right, softcap, dropout)
    for name, t in (("grad_out", grad_out), ("out", out)):
        _checks.same_device(op, name, t, "q", q)
        _checks.dtype(op, name, t, q.dtype)
        _checks.shape(op, name, t, _out_shape(q, v), "the attention output's shape")
    _checks.same_device(op, "lse", lse, "q", q)
    _checks.dtype(op, "lse", lse, torch.float64)
    _checks.shape(op, "lse", lse, q.shape[:-1], "one log-sum-exp per query row")
    if bias_grad and bias is None:
        fail(op, "bias_grad needs a bias")


# The ops' argument positions, for the fake kernels and autograd.
_BIAS, _SOFTMAX_OFFSET, _SCALE, _RETURN_MAX_LOGIT = 8, 10, 13, 19


def fake_forward(q: Tensor, v: Tensor, return_max_logit: bool, out_dtype: Optional[torch.dtype] = None) -> tuple:
    """The forward ops' (out, lse, max_logit) as fake tensors; out in q's dtype unless out_dtype."""
    max_logit = q.new_empty((q.shape[1],) if return_max_logit else (0,), dtype=torch.float32)
    return (q.new_empty(_out_shape(q, v), dtype=out_dtype or q.dtype), q.new_empty(q.shape[:-1], dtype=torch.float64),
            max_logit)


def fake_gradients(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], softmax_offset: Optional[Tensor],
                   bias_grad: bool, grad_dtype: Optional[torch.dtype] = None) -> tuple:
    """The backward ops' (grad_q, grad_k, grad_v, grad_bias, grad_softmax_offset) as fake tensors;
    the first three contiguous, in their input's dtype unless grad_dtype."""
    grad_bias = torch.empty_like(bias, memory_format=torch.contiguous_format) if bias_grad else q.new_empty(0)
    grad_offset = q.new_empty((q.shape[1],) if softmax_offset is not None else (0,), dtype=torch.float32)
    grads = (torch.empty_like(t, dtype=grad_dtype or t.dtype, memory_format=torch.contiguous_format) for t in (q, k, v))
    return (*grads, grad_bias, grad_offset)


@torch.library.register_fake(f"{NAMESPACE}::flash_attention_fwd")
def _fwd_fake(q, k, v, *args):
    _check_fwd(q, k, v, *args)
    return fake_forward(q, v, args[_RETURN_MAX_LOGIT - 3])


@torch.library.register_fake(f"{NAMESPACE}::flash_attention_bwd")
def _bwd_fake(grad_out, q, k, v, out, lse, *args):
    _check_bwd(grad_out, q, k, v, out, lse, *args)
    return fake_gradients(q, k, v, args[_BIAS - 3], args[_SOFTMAX_OFFSET - 3], args[-1])


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    out, lse, max_logit = output
    ctx.save_for_backward(q, k, v, out, lse, *inputs[3:_SCALE])  # the sequences and the optional operands
    ctx.options = inputs[_SCALE:_RETURN_MAX_LOGIT]  # scale, window_left, window_right, bottom_right, softcap, dropout
    ctx.bias_grad = ctx.needs_input_grad[_BIAS]
    ctx.mark_non_differentiable(lse, max_logit)


def _backward(ctx, grad_out, _grad_lse, _grad_max_logit):
    q, k, v, out, lse, *operands = ctx.saved_tensors
    grad_q, grad_k, grad_v, grad_bias, grad_offset = _ops.flash_attention_bwd(grad_out, q, k, v, out, lse, *operands,
                                                                              *ctx.options, ctx.bias_grad)
    grads = [None] * (_RETURN_MAX_LOGIT + 1)
    grads[:3] = grad_q, grad_k, grad_v
    grads[_BIAS] = grad_bias if ctx.bias_grad else None
    grads[_SOFTMAX_OFFSET] = grad_offset if ctx.needs_input_grad[_SOFTMAX_OFFSET] else None
    return tuple(grads)


torch.library.register_autograd(f"{NAMESPACE}::flash_attention_fwd", _backward, setup_context=_setup_context)
torch.library.register_autograd(f"{NAMESPACE}::flash_attention_bwd", no_double_backward("flash_attention_bwd"))
serve_on_accelerators("flash_attention_fwd", reference.flash_attention_fwd, triton_module="attention", check=_check_fwd)
serve_on_accelerators("flash_attention_bwd", reference.flash_attention_bwd, triton_module="attention", check=_check_bwd)


def flash_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, window_size: Tuple[int, int] = (-1, -1),
                    bottom_right: bool = False, cu_seqlens_q: Optional[Tensor] = None,
                    cu_seqlens_kv: Optional[Tensor] = None, cu_seqlens_q_padded: Optional[Tensor] = None,
                    cu_seqlens_kv_padded: Optional[Tensor] = None, alibi_slopes: Optional[Tensor] = None,
                    bias: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                    softmax_offset: Optional[Tensor] = None, softcap: float = 0.0, dropout: float = 0.0,
                    dropout_rng: Optional[Tensor] = None, page_table: Optional[Tensor] = None,
                    return_max_logit: bool = False) -> Tuple[Tensor, ...]:
    """(out, lse), or (out, lse, max_logit) with return_max_logit, of
    dropout(softmax(cap(scale q k^T) + ALiBi + bias, masked, sink)) v, differentiable in q, k, v,
    bias and softmax_offset.

    q [b, h, sq, dk], k [b, g, skv, dk], v [b, g, skv, dv], or packed [tokens, heads, d] with
    cu_seqlens_q / cu_seqlens_kv; window_size (left, right), (-1, 0) causal; bottom_right aligns
    the diagonal to the last key; mask bool [b | 1, h | 1, sq, skv], True = masked out. With
    page_table (int32 [b, pages], forward only), k and v are a paged KV cache
    [pages, page_size, g, d] and cu_seqlens_kv holds each sequence's cached length.
    dropout_rng, int64 (seed, offset), is drawn from torch's default generator when dropout > 0
    and it is not given (bindings/attention_ops.cpp has the rest)."""
    if dropout > 0 and dropout_rng is None:
        dropout_rng = torch.randint(2 ** 62, (2,), dtype=torch.int64, device=q.device)
    out, lse, max_logit = _ops.flash_attention_fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, alibi_slopes, bias, mask,
        softmax_offset, dropout_rng, page_table, float(scale), int(window_size[0]), int(window_size[1]),
        bool(bottom_right), float(softcap), float(dropout), bool(return_max_logit))
    return (out, lse, max_logit) if return_max_logit else (out, lse)


def flash_attention_forward(q: Tensor, k: Tensor, v: Tensor, scale: float, window_size: Tuple[int, int] = (-1, -1),
                            mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """The forward op alone, for a caller that runs its own backward (the p2p ring of context
    parallelism): (out, lse fp64) of softmax(scale q k^T, window, mask) v, q [b, h, sq, dk],
    k [b, g, skv, dk], v [b, g, skv, dv], mask bool [b | 1, h | 1, sq, skv] or None."""
    out, lse, _ = _ops.flash_attention_fwd(q, k, v, None, None, None, None, None, None, mask, None, None, None,
                                           float(scale), int(window_size[0]), int(window_size[1]), False, 0.0, 0.0,
                                           False)
    return out, lse


def flash_attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                             scale: float, window_size: Tuple[int, int] = (-1, -1),
                             mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """The backward op alone, flash_attention_forward's arguments with grad_out, out and lse:
    (grad_q, grad_k, grad_v). out and lse may be those of a larger softmax the call's keys are a
    part of (the p2p ring's final ones): the gradients are then that part's share."""
    grad_q, grad_k, grad_v, _, _ = _ops.flash_attention_bwd(grad_out, q, k, v, out, lse, None, None, None, None, None,
                                                            None, mask, None, None, None, float(scale),
                                                            int(window_size[0]), int(window_size[1]), False, 0.0,
                                                            0.0, False)
    return grad_q, grad_k, grad_v

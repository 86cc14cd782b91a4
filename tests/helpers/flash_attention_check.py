"""One flash-attention call against the float64 reference of the same call (the tests of the
flash ops share it), and the ops' positional arguments built from keywords."""
import torch

from numerics import assert_close
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.custom_ops.attention import flash_attention


def fwd_args(q, k, v, cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None,
             alibi_slopes=None, bias=None, mask=None, softmax_offset=None, dropout_rng=None, page_table=None,
             scale=1.0, window=(-1, -1), bottom_right=False, softcap=0.0, dropout=0.0, last=False):
    """flash_attention_fwd's arguments in schema order (`last`: return_max_logit; for the
    backward, after grad_out, q, k, v, out, lse: bias_grad)."""
    return (q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, alibi_slopes, bias, mask,
            softmax_offset, dropout_rng, page_table, scale, window[0], window[1], bottom_right, softcap, dropout, last)


def check_flash(q, k, v, window, bottom_right, dtype, cu=(None, None), padded=(None, None), slopes=None, scale=None,
                bias=None, mask=None, softmax_offset=None, softcap=0.0, dropout=0.0, dropout_rng=None):
    """Our op's out, max logit and gradients (q, k, v, and bias / softmax_offset when given)
    against the float64 reference of the same call; returns (out, grads)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    extra = {}
    if bias is not None:
        extra["bias"] = bias.to(dtype).requires_grad_()
    if softmax_offset is not None:
        extra["softmax_offset"] = softmax_offset.clone().requires_grad_()
    out, lse, logit = flash_attention(*leaves, scale, window, bottom_right, cu[0], cu[1], padded[0], padded[1], slopes,
                                      mask=mask, softcap=softcap, dropout=dropout, dropout_rng=dropout_rng,
                                      return_max_logit=True, **extra)
    grad_out = torch.randn_like(out)
    inputs = leaves + list(extra.values())
    grads = torch.autograd.grad(out, inputs, grad_out)
    exact = [t.detach().to(dtype).double() for t in (q, k, v)]
    exact_bias = extra["bias"].detach().double() if bias is not None else None
    exact_offset = softmax_offset.double() if softmax_offset is not None else None
    common = dict(cu_seqlens_q=cu[0], cu_seqlens_kv=cu[1], cu_seqlens_q_padded=padded[0],
                  cu_seqlens_kv_padded=padded[1], alibi_slopes=slopes, bias=exact_bias, mask=mask,
                  softmax_offset=exact_offset, dropout_rng=dropout_rng, scale=scale, window=window,
                  bottom_right=bottom_right, softcap=softcap, dropout=dropout)
    out_ref, lse_ref, logit_ref = reference.flash_attention_fwd(*fwd_args(*exact, last=True, **common))
    # D = rowsum(grad_out * out) from the op's own out (rounded to bf16 there), as the op defines it.
    bwd = fwd_args(*exact, last=bias is not None, **common)
    grads_ref = reference.flash_attention_bwd(grad_out.double(), *bwd[:3], out.detach().double(), lse_ref, *bwd[3:])
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    assert_close(out, out_ref, dtype=dtype, name="out")
    seen = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), seen), "rows with an empty denominator have lse -inf, and only they"
    assert_close(lse[seen], lse_ref[seen], dtype=torch.float32, name="lse")
    assert torch.equal(torch.isfinite(logit), torch.isfinite(logit_ref)), "heads that see no key have -inf"
    assert_close(logit[torch.isfinite(logit)], logit_ref[torch.isfinite(logit_ref)].float(), dtype=dtype,
                 name="max_logit")
    names = ["grad_q", "grad_k", "grad_v"] + [f"grad_{name}" for name in extra]
    wanted = list(grads_ref[:3]) + ([grads_ref[3]] if bias is not None else []) + (
        [grads_ref[4]] if softmax_offset is not None else [])
    for name, got, want in zip(names, grads, wanted):
        assert_close(got, want, dtype=dtype, name=name)
    return out, grads

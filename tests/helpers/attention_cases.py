"""Inputs, layouts and comparisons shared by the DotProductAttention tests."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch.attention.backends import SdpaBackend, UnfusedBackend, selection
from attention_reference import attention, keep_matrix
from numerics import assert_close, assert_two_reference

BACKENDS = {"sdpa": SdpaBackend(), "unfused": UnfusedBackend()}
MASK_TYPES = ["no_mask", "padding", "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right",
              "arbitrary"]
B, H, D = 2, 4, 8


@pytest.fixture(params=list(BACKENDS))
def attention_backend(request, monkeypatch):
    """Runs the test with only this attention backend in the preference list (its name; not
    conftest's `backend`, the kernel backend)."""
    monkeypatch.setattr(selection, "PREFERENCE", (BACKENDS[request.param],))
    return request.param


def to_format(x, fmt):
    """[b, s, h, d] -> the layout of fmt (a contiguous copy for sbhd)."""
    return x.transpose(0, 1).contiguous() if fmt == "sbhd" else x


def output_bhsd(out, fmt, h):
    """[s, b, h * d] (sbhd) or [b, s, h * d] (bshd) -> [b, h, s, d]."""
    if fmt == "sbhd":
        out = out.transpose(0, 1)
    return out.reshape(out.shape[0], out.shape[1], h, -1).transpose(1, 2)


def grad_bshd(x, fmt):
    return x.grad.transpose(0, 1) if fmt == "sbhd" else x.grad


def compare(ours, exact, plain, dtype, name, factor):
    """fp32: the fp32 tolerances against the fp64 result; bf16: the two-reference rule."""
    if dtype == torch.float32:
        assert_close(ours, exact, dtype=dtype, name=name)
    else:
        assert_two_reference(ours, plain, exact, factor, name=name)


def dense_case(mask_type, sq, skv, gqa, seed=0, window=(-1, -1), dv=D):
    """Inputs [b, s, h, d] for sbhd/bshd (v with dv channels), the attention_mask TE takes for
    mask_type, and the reference's keep [b, 1, sq, skv] (with the sliding window)."""
    g = 2 if gqa else H
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, sq, H, D, generator=gen)
    k = torch.randn(B, skv, g, D, generator=gen)
    v = torch.randn(B, skv, g, dv, generator=gen)
    lens_q = [sq, max(sq - 3, 1)]
    lens_kv = lens_q if sq == skv else [skv - 2, skv]
    mask = None
    if "padding" in mask_type:
        pad_q = torch.stack([torch.arange(sq) >= n for n in lens_q]).view(B, 1, 1, sq)
        pad_kv = torch.stack([torch.arange(skv) >= n for n in lens_kv]).view(B, 1, 1, skv)
        mask = pad_q if sq == skv else (pad_q, pad_kv)
    keep = torch.stack([keep_matrix(mask_type, sq, skv, lq, lkv, window) for lq, lkv in zip(lens_q, lens_kv)]).unsqueeze(1)
    if mask_type == "arbitrary":
        mask = torch.rand(B, 1, sq, skv, generator=gen) < 0.3
        mask[0, 0, 1] = True  # a query with every key masked
        keep = keep & ~mask
    return q, k, v, mask, keep


def run_dense(fmt, mask_type, sq, skv, gqa, dtype, module_kwargs=(), forward_kwargs=(), keep=None, bias=None,
              scale=None, inputs=None):
    """Runs ours and the references; returns (ours, exact, plain) triples for output and grads."""
    q, k, v, mask, case_keep = inputs if inputs is not None else dense_case(mask_type, sq, skv, gqa)
    keep = case_keep if keep is None else keep
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    m = te.DotProductAttention(H, (q.shape[-1], v.shape[-1]), num_gqa_groups=k.shape[2], qkv_format=fmt, attn_mask_type=mask_type,
                               **dict(module_kwargs))
    leaves = [to_format(t, fmt).clone().requires_grad_() for t in (q, k, v)]
    out = m(*leaves, attention_mask=mask, **dict(forward_kwargs))
    dy = torch.randn(B, H, sq, v.shape[-1]).to(dtype)
    output_bhsd(out, fmt, H).backward(dy)

    results = {"output": [output_bhsd(out, fmt, H)]}
    for name, got in zip(("grad_q", "grad_k", "grad_v"), leaves):
        results[name] = [grad_bshd(got, fmt)]
    for ref_dtype in (torch.float64, dtype):
        ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref_out = attention(*(t.transpose(1, 2) for t in ref_leaves), keep=keep, bias=bias, scale=scale,
                            dtype=ref_dtype)
        ref_out.backward(dy.to(ref_dtype))
        results["output"].append(ref_out)
        for name, leaf in zip(("grad_q", "grad_k", "grad_v"), ref_leaves):
            results[name].append(leaf.grad)
    return m, results


def check(results, dtype):
    for name, (ours, exact, plain) in results.items():
        compare(ours, exact, plain, dtype, name, 2 if name == "output" else 3)

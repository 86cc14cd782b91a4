"""te.DotProductAttention against plain-PyTorch attention (attention_reference.py) for every
mask type, format, GQA and backend; output and q/k/v gradients in fp32 and bf16."""
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
def backend(request, monkeypatch):
    """Runs the test with only this backend in the preference list."""
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


def dense_case(mask_type, sq, skv, gqa, seed=0):
    """Inputs [b, s, h, d] for sbhd/bshd, the attention_mask TE takes for mask_type, and the
    reference's keep [b, 1, sq, skv]."""
    g = 2 if gqa else H
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, sq, H, D, generator=gen)
    k = torch.randn(B, skv, g, D, generator=gen)
    v = torch.randn(B, skv, g, D, generator=gen)
    lens_q = [sq, max(sq - 3, 1)]
    lens_kv = lens_q if sq == skv else [skv - 2, skv]
    mask = None
    if "padding" in mask_type:
        pad_q = torch.stack([torch.arange(sq) >= n for n in lens_q]).view(B, 1, 1, sq)
        pad_kv = torch.stack([torch.arange(skv) >= n for n in lens_kv]).view(B, 1, 1, skv)
        mask = pad_q if sq == skv else (pad_q, pad_kv)
    keep = torch.stack([keep_matrix(mask_type, sq, skv, lq, lkv) for lq, lkv in zip(lens_q, lens_kv)]).unsqueeze(1)
    if mask_type == "arbitrary":
        mask = torch.rand(B, 1, sq, skv, generator=gen) < 0.3
        mask[0, 0, 1] = True  # a query with every key masked
        keep = ~mask
    return q, k, v, mask, keep


def run_dense(fmt, mask_type, sq, skv, gqa, dtype, module_kwargs=(), forward_kwargs=(), keep=None, bias=None,
              scale=None, inputs=None):
    """Runs ours and the references; returns (ours, exact, plain) triples for output and grads."""
    q, k, v, mask, case_keep = inputs if inputs is not None else dense_case(mask_type, sq, skv, gqa)
    keep = case_keep if keep is None else keep
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    m = te.DotProductAttention(H, D, num_gqa_groups=k.shape[2], qkv_format=fmt, attn_mask_type=mask_type,
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("mask_type", MASK_TYPES)
def test_self_attention(backend, mask_type, fmt, gqa, dtype):
    m, results = run_dense(fmt, mask_type, 7, 7, gqa, dtype)
    assert m.last_backend == backend
    check(results, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mask_type", MASK_TYPES)
@pytest.mark.parametrize("sq,skv", [(5, 9), (9, 5)], ids=["sq<skv", "sq>skv"])
def test_cross_attention(backend, mask_type, dtype, sq, skv):
    """sq != skv: top-left vs bottom-right alignment differ; with sq > skv bottom-right rows see
    no key and must come out zero (no NaN)."""
    m, results = run_dense("bshd", mask_type, sq, skv, True, dtype)
    check(results, dtype)
    assert torch.isfinite(results["output"][0]).all()


def thd_case(mask_type, lens_q, lens_kv, gqa, seed=0):
    g = 2 if gqa else H
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), H, D, generator=gen)
    k = torch.randn(sum(lens_kv), g, D, generator=gen)
    v = torch.randn(sum(lens_kv), g, D, generator=gen)
    return q, k, v


def cumulative(lens):
    return torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32)


def thd_reference(q, k, v, mask_type, lens_q, lens_kv, dtype):
    """Each packed sequence attended alone: [t, h, d] -> [t, h, dv]."""
    outs, cq, ckv = [], 0, 0
    for lq, lkv in zip(lens_q, lens_kv):
        keep = keep_matrix(mask_type, lq, lkv)
        seq = [x[c: c + n].transpose(0, 1).unsqueeze(0) for x, c, n in ((q, cq, lq), (k, ckv, lkv), (v, ckv, lkv))]
        outs.append(attention(*seq, keep=keep, dtype=dtype)[0].transpose(0, 1))  # [lq, h, dv]
        cq, ckv = cq + lq, ckv + lkv
    return torch.cat(outs)


@pytest.mark.parametrize("dtype,gqa,lens_q,lens_kv", [
    (torch.float32, False, [3, 7, 0, 5], [3, 7, 0, 5]),
    (torch.float32, True, [3, 7, 0, 5], [3, 7, 0, 5]),
    (torch.bfloat16, True, [3, 7, 0, 5], [3, 7, 0, 5]),
    (torch.bfloat16, False, [2, 5, 1], [4, 5, 6]),
    (torch.float32, True, [2, 5, 6], [4, 5, 1]),
], ids=["fp32-mha-self", "fp32-gqa-self", "bf16-gqa-self", "bf16-mha-cross", "fp32-gqa-cross"])
@pytest.mark.parametrize("mask_type", [t for t in MASK_TYPES if t != "arbitrary"])
def test_thd(backend, mask_type, gqa, dtype, lens_q, lens_kv):
    """TE treats every thd type as its padding variant: each sequence is attended on its own,
    with the mask type's alignment taken against that sequence's lengths."""
    q, k, v = (t.to(dtype) for t in thd_case(mask_type, lens_q, lens_kv, gqa))
    m = te.DotProductAttention(H, D, num_gqa_groups=k.shape[1], qkv_format="thd", attn_mask_type=mask_type)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = m(*leaves, cu_seqlens_q=cumulative(lens_q), cu_seqlens_kv=cumulative(lens_kv),
            max_seqlen_q=max(lens_q), max_seqlen_kv=max(lens_kv))
    assert out.shape == (sum(lens_q), H * D) and m.last_backend == backend
    dy = torch.randn(sum(lens_q), H, D).to(dtype)
    out.view(-1, H, D).backward(dy)
    results = {"output": [out.view(-1, H, D)], "grad_q": [leaves[0].grad], "grad_k": [leaves[1].grad],
               "grad_v": [leaves[2].grad]}
    for ref_dtype in (torch.float64, dtype):
        ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = thd_reference(*ref_leaves, mask_type, lens_q, lens_kv, ref_dtype)
        ref.backward(dy.to(ref_dtype))
        results["output"].append(ref)
        for name, leaf in zip(("grad_q", "grad_k", "grad_v"), ref_leaves):
            results[name].append(leaf.grad)
    check(results, dtype)

"""te.DotProductAttention against plain-PyTorch attention (attention_reference.py) for every
mask type, format, GQA and attention backend; output and q/k/v gradients in fp32 and bf16."""
import pytest
import torch

import transformer_engine.pytorch as te
from attention_cases import B, D, H, MASK_TYPES, attention_backend, check, run_dense  # noqa: F401 (a fixture)
from attention_reference import attention, keep_matrix


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("mask_type", MASK_TYPES)
def test_self_attention(attention_backend, mask_type, fmt, gqa, dtype):
    m, results = run_dense(fmt, mask_type, 7, 7, gqa, dtype)
    assert m.last_backend == attention_backend
    check(results, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mask_type", MASK_TYPES)
@pytest.mark.parametrize("sq,skv", [(5, 9), (9, 5)], ids=["sq<skv", "sq>skv"])
def test_cross_attention(attention_backend, mask_type, dtype, sq, skv):
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
def test_thd(attention_backend, mask_type, gqa, dtype, lens_q, lens_kv):
    """TE treats every thd type as its padding variant: each sequence is attended on its own,
    with the mask type's alignment taken against that sequence's lengths."""
    q, k, v = (t.to(dtype) for t in thd_case(mask_type, lens_q, lens_kv, gqa))
    m = te.DotProductAttention(H, D, num_gqa_groups=k.shape[1], qkv_format="thd", attn_mask_type=mask_type)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = m(*leaves, cu_seqlens_q=cumulative(lens_q), cu_seqlens_kv=cumulative(lens_kv),
            max_seqlen_q=max(lens_q), max_seqlen_kv=max(lens_kv))
    assert out.shape == (sum(lens_q), H * D) and m.last_backend == attention_backend
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


def test_thd_reaches_the_flash_kernel_packed(monkeypatch):
    """The flash kernel walks packed sequences by their cu_seqlens: DotProductAttention hands it
    q, k, v [t, h, d] as they are (no padded copy of the batch, no scatter back), gaps between
    the sequences (cu_seqlens_*_padded) included, whose tokens get a zero output and gradient.
    A dense bias over the padded batch still takes the padded path."""
    from transformer_engine.pytorch.attention.dot_product_attention import dot_product_attention as dpa_module
    padded = []
    pad_packed = dpa_module.pad_packed
    monkeypatch.setattr(dpa_module, "pad_packed", lambda *args: padded.append(args) or pad_packed(*args))
    lens, gap = [3, 7, 5], 2
    starts = [sum(lens[:i]) + gap * i for i in range(len(lens))]
    cu, cu_padded = cumulative(lens), torch.tensor(starts + [sum(lens) + gap * len(lens)], dtype=torch.int32)
    tokens = int(cu_padded[-1])
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(tokens, H, D, generator=gen).requires_grad_() for _ in range(3))
    m = te.DotProductAttention(H, D, qkv_format="thd", attn_mask_type="padding_causal")
    lengths = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_padded, cu_seqlens_kv_padded=cu_padded,
                   max_seqlen_q=max(lens), max_seqlen_kv=max(lens))
    out = m(q, k, v, **lengths).view(tokens, H, D)
    assert m.last_backend == "flash" and not padded
    dy = torch.randn(tokens, H, D, generator=gen)
    out.backward(dy)
    used = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens)])  # the sequences' tokens
    gaps = torch.ones(tokens, dtype=torch.bool).index_fill_(0, used, False)
    leaves = [t.detach()[used].double().requires_grad_() for t in (q, k, v)]
    ref = thd_reference(*leaves, "padding_causal", lens, lens, torch.float64)
    ref.backward(dy[used].double())
    torch.testing.assert_close(out[used].double(), ref, rtol=1e-5, atol=1e-5)
    for ours, leaf in zip((q, k, v), leaves):
        torch.testing.assert_close(ours.grad[used].double(), leaf.grad, rtol=1e-5, atol=1e-5)
        assert not ours.grad[gaps].any()
    assert not out[gaps].any()

    biased = te.DotProductAttention(H, D, qkv_format="thd", attn_mask_type="padding_causal")
    bias = torch.randn(1, H, max(lens), max(lens), generator=gen)
    biased(q, k, v, **lengths, core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
    assert padded

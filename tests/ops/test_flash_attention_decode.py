"""Decoding on the flash kernel: a few query tokens against a KV cache, contiguous or paged (the
kernel reads the page table: no gather), and flash-decoding's split of long key ranges over
more tasks when there are few (sequence, head) pairs. The paged result is the contiguous one bit
for bit; both against the float64 reference; the split's result is the same on any number of
threads; DotProductAttention decodes over InferenceParams' paged cache without gathering it, and
gathers the pages only for what the kernel does not read over pages (a bias tensor, gradients)."""
from collections import OrderedDict

import pytest
import torch

import transformer_engine.pytorch as te
from backends import assert_refused
from flash_attention_check import check_flash, fwd_args
from transformer_engine.pytorch.attention.backends import flash as flash_backend
from transformer_engine.pytorch.attention.dot_product_attention import dot_product_attention
from transformer_engine.pytorch.attention.inference import PagedKVCacheManager
from transformer_engine.pytorch.custom_ops.attention import flash_attention

ops = torch.ops.portable_te


def _paged(keys, lengths, page_size, pages_total, generator):
    """keys [b, g, s, d] -> (pool [pages_total, page_size, g, d], page_table int32 [b, ceil(s / page_size)]),
    each sequence's tokens on shuffled pages."""
    b, g, s, d = keys.shape
    per_sequence = -(-s // page_size)
    order = torch.randperm(pages_total, generator=generator)[:b * per_sequence].view(b, per_sequence)
    pool = torch.zeros(pages_total, page_size, g, d, dtype=keys.dtype)
    for i in range(b):
        for j in range(lengths[i]):
            pool[order[i, j // page_size], j % page_size] = keys[i, :, j]
    return pool, order.to(torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("terms", ["causal", "window_alibi_sink"])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_paged_cache_is_the_contiguous_one_bit_for_bit(layout, terms, dtype):
    generator = torch.Generator().manual_seed(0)
    b, h, g, s, d, page = 3, 4, 2, 300, 16, 16
    lengths_q, lengths_kv = [2, 1, 0], [300, 37, 5]
    q = torch.randn(b, h, 2, d, dtype=dtype)
    k, v = torch.randn(b, g, s, d, dtype=dtype), torch.randn(b, g, s, 8, dtype=dtype)
    k_pool, table = _paged(k, lengths_kv, page, 64, generator)
    v_pool, _ = _paged(v, lengths_kv, page, 64, torch.Generator().manual_seed(0))
    cu_q = torch.tensor([0, 2, 3, 3])
    cu_kv = torch.tensor([0, 300, 337, 342])
    options = dict(cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv)
    if terms != "causal":
        options.update(window_size=(40, 0), alibi_slopes=torch.rand(h), softmax_offset=torch.randn(h))
    else:
        options.update(window_size=(-1, 0))
    if layout == "packed":
        q_packed = torch.cat([q[i, :, :n].transpose(0, 1) for i, n in enumerate(lengths_q)])  # [3, h, d]
        k_packed = torch.cat([k[i, :, :n].transpose(0, 1) for i, n in enumerate(lengths_kv)])
        v_packed = torch.cat([v[i, :, :n].transpose(0, 1) for i, n in enumerate(lengths_kv)])
        want = flash_attention(q_packed, k_packed, v_packed, 0.25, bottom_right=True, **options)
        got = flash_attention(q_packed, k_pool, v_pool, 0.25, bottom_right=True, page_table=table, **options)
    else:
        want = flash_attention(q, k, v, 0.25, bottom_right=True, **options)
        got = flash_attention(q, k_pool, v_pool, 0.25, bottom_right=True, page_table=table, **options)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("sq", [1, 5])
def test_flash_decoding_split_against_the_reference(sq):
    """One (sequence, head) pair over 3000 keys: the kernel splits the keys into parts."""
    q, k, v = torch.randn(1, 2, sq, 32), torch.randn(1, 1, 3000, 32), torch.randn(1, 1, 3000, 16)
    check_flash(q, k, v, (-1, 0), True, torch.float32, softmax_offset=torch.randn(2), slopes=torch.rand(2))
    check_flash(q, k, v, (700, 0), True, torch.bfloat16)


def test_flash_decoding_gives_the_same_bits_on_any_number_of_threads():
    q, k, v = torch.randn(2, 2, 1, 64), torch.randn(2, 1, 5000, 64), torch.randn(2, 1, 5000, 64)
    previous = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(flash_attention(q, k, v, 0.125, (-1, 0), True))
    finally:
        torch.set_num_threads(previous)
    assert all(torch.equal(a, b) for a, b in zip(*results))


def _paged_call(**changes):
    q, pool, table = torch.zeros(2, 4, 1, 16), torch.zeros(6, 4, 2, 16), torch.tensor([[4, 1], [2, 0]], dtype=torch.int32)
    call = dict(cu_seqlens_q=torch.tensor([0, 1, 2]), cu_seqlens_kv=torch.tensor([0, 7, 10]), page_table=table,
                window=(-1, 0))
    tensors = dict(q=q, k=pool, v=pool)
    for name, value in changes.items():
        (tensors if name in tensors else call)[name] = value
    return lambda: ops.flash_attention_fwd(*fwd_args(tensors["q"], tensors["k"], tensors["v"], **call))


BAD_PAGED = [
    (_paged_call(page_table=torch.zeros(2, 2, dtype=torch.int64)), ["page_table", "Long", "Int"], False),
    (_paged_call(page_table=torch.zeros(1, 2, dtype=torch.int32)), ["page_table", "batch = 2", "[1, 2]"], False),
    (_paged_call(k=torch.zeros(6, 5, 2, 16)[:, :4], v=torch.zeros(6, 5, 2, 16)[:, :4]),
     ["pages of k", "follow each other"], False),
    (_paged_call(k=torch.zeros(2, 6, 4, 16)[0]), ["paged cache [pages, page_size, kv_heads, head_dim]"], False),
    (_paged_call(cu_seqlens_kv=None), ["a paged cache needs cu_seqlens_kv"], False),
    (_paged_call(page_table=torch.tensor([[4, 9], [2, 0]], dtype=torch.int32)),
     ["page_table[0, 1] = 9", "not one of the cache's 6 pages"], True),
    (_paged_call(cu_seqlens_kv=torch.tensor([0, 9, 12])), ["sequence 0 of kv", "9 tokens", "8 rows"], True),
    (_paged_call(mask=torch.zeros(2, 1, 1, 8, dtype=torch.bool)), ["bias and mask need contiguous k and v"], False),
]


@pytest.mark.parametrize("call,words,reads_values", BAD_PAGED, ids=lambda v: v if isinstance(v, str) else None)
def test_bad_paged_input_raises_value_error_naming_argument(backend, call, words, reads_values):
    assert_refused(backend, call, words, on_meta=not reads_values)


def test_paged_cache_has_no_backward():
    q = torch.randn(2, 4, 1, 16, requires_grad=True)
    pool, table = torch.randn(6, 4, 2, 16), torch.tensor([[4, 1], [2, 0]], dtype=torch.int32)
    out, _ = flash_attention(q, pool, pool, 0.25, cu_seqlens_q=torch.tensor([0, 1, 2]),
                             cu_seqlens_kv=torch.tensor([0, 7, 10]), page_table=table)
    with pytest.raises(ValueError, match="paged KV cache .* has no backward"):
        out.sum().backward()


@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_dot_product_attention_decodes_over_pages_without_gathering_them(fmt, monkeypatch):
    """Token-by-token decoding over a paged InferenceParams cache equals the contiguous cache's,
    with the pages never gathered into a contiguous copy."""
    torch.manual_seed(0)
    h, g, d, steps = 4, 2, 16, 6
    attention = te.DotProductAttention(h, d, num_gqa_groups=g, qkv_format=fmt, attn_mask_type="padding_causal",
                                       layer_number=1, softmax_type="learnable")
    torch.nn.init.normal_(attention.softmax_offset)
    tokens = [(torch.randn(2, 1, h, d), torch.randn(2, 1, g, d), torch.randn(2, 1, g, d)) for _ in range(steps)]

    def decode(paged):
        pages = dict(is_paged=True, page_size=2, total_num_pages=16) if paged else {}
        params = te.InferenceParams(2, 16, g, d, torch.float32, max_ctx_len=16 if fmt == "thd" else None,
                                    qkv_format=fmt, **pages)
        outs = []
        for q, k, v in tokens:
            params.pre_step(OrderedDict([(0, 1), (1, 1)]))
            if fmt == "sbhd":
                q, k, v = (t.transpose(0, 1) for t in (q, k, v))
            elif fmt == "thd":
                q, k, v = (t.reshape(2, *t.shape[2:]) for t in (q, k, v))
            kwargs = dict(cu_seqlens_q=params.cu_seqlens_q, cu_seqlens_kv=params.cu_seqlens_kv) if fmt == "thd" else {}
            with torch.no_grad():
                outs.append(attention(q, k, v, inference_params=params, **kwargs))
            assert attention.last_backend == "flash"
        return torch.stack(outs)

    contiguous = decode(False)

    def no_gather(*args, **kwargs):
        raise AssertionError("the paged cache was gathered")
    monkeypatch.setattr(PagedKVCacheManager, "gather", no_gather)
    monkeypatch.setattr(dot_product_attention, "gather_pages", no_gather)
    assert torch.equal(decode(True), contiguous)


def _decode_steps(attention, paged, steps, grad=False, bias=None):
    """One prompt of 3 tokens then `steps` single tokens for 2 sequences through attention over an
    InferenceParams cache (paged or not) -> the outputs [steps + 1] of [2, sq, h * d] and, with
    grad, each step's query gradient of sum(out)."""
    torch.manual_seed(1)
    h, g, d = 4, 2, 16
    pages = dict(is_paged=True, page_size=2, total_num_pages=16) if paged else {}
    params = te.InferenceParams(2, 16, g, d, torch.float32, **pages)
    outs, grads = [], []
    for step in range(steps + 1):
        sq = 3 if step == 0 else 1
        q, k, v = torch.randn(2, sq, h, d), torch.randn(2, sq, g, d), torch.randn(2, sq, g, d)
        params.pre_step(OrderedDict([(0, sq), (1, sq)]))
        kwargs = {}
        if bias is not None:
            skv = max(params.sequences.values())
            kwargs = dict(core_attention_bias_type="post_scale_bias", core_attention_bias=bias[:, :, :sq, :skv])
        q.requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            out = attention(q, k, v, inference_params=params, **kwargs)
        if grad:
            grads.append(torch.autograd.grad(out.sum(), q)[0])
        outs.append(out.detach())
    return outs, grads


def test_paged_decoding_gathers_the_pages_for_a_bias_and_for_gradients():
    """The kernel reads no bias tensor over pages and has no backward over them: a paged call with
    either gathers its pages first, and gives what the contiguous cache gives."""
    attention = te.DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="padding_causal",
                                       layer_number=1)
    bias = torch.randn(1, 4, 3, 16)
    for kwargs in (dict(bias=bias), dict(grad=True)):
        (paged, paged_grads), (contiguous, contiguous_grads) = (_decode_steps(attention, p, 4, **kwargs)
                                                                for p in (True, False))
        for got, want in zip(paged + paged_grads, contiguous + contiguous_grads):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        assert attention.last_backend == "flash"


@pytest.mark.parametrize("return_max_logit", [False, True])
def test_the_kernel_computes_the_max_logit_only_when_asked(return_max_logit, monkeypatch):
    asked = []

    def spy(*args, **kwargs):
        asked.append(kwargs["return_max_logit"])
        return flash_attention(*args, **kwargs)
    monkeypatch.setattr(flash_backend, "flash_attention", spy)
    attention = te.DotProductAttention(4, 16, return_max_logit=return_max_logit)
    q = torch.randn(5, 2, 4, 16)
    result = attention(q, q, q)
    assert asked == [return_max_logit]
    assert isinstance(result, tuple) == return_max_logit

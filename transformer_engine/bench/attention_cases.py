"""Attention benchmark cases: the masks that need a dense mask or bias everywhere but in a
flash kernel that reads them by their structure, and the terms a dense tensor carries anyway (a
post-scale bias) or the kernel draws itself (dropout).

Providers, all on the same head-major q [b, h, sq, d], k / v [b, g, skv, d] and upstream gradient:
    ours:    te.kernels.flash_attention (torch.ops.portable_te.flash_attention_fwd/bwd), the
             window, alignment, lengths and ALiBi slopes as arguments, the bias tensor [1, h, s, s]
             as it is, dropout drawn in the kernel
    eager:   PyTorch's own attention, torch.nn.functional.scaled_dot_product_attention, is_causal
             for a plain causal mask, else the dense bool mask or float bias [.., sq, skv] the call
             needs; its dropout_p for dropout
    unfused: our matmul + fused-softmax backend (attention/backends/unfused.py) with the dense mask,
             for sequences up to UNFUSED_MAX_SEQ tokens
    flex_compile: torch.compile(flex_attention) with the mask as a block mask and ALiBi as a
             score_mod, for the sliding window and ALiBi; forward only (PyTorch's CPU path has no
             flex backward)
FP8 attention (the fp8_* cases): ours is te.DotProductAttention under
te.autocast(DelayedScaling(fp8_dpa=True)), its FP8 casts included, and ours_bf16 the same call in
bf16 (the flash op above), against eager SDPA in bf16.
Packed sequences (thd) run ours on the packed tokens with cu_seqlens, the others on the padded
batch with its padding mask. Modes: "fwd" under torch.no_grad, "full" forward + backward.
Decoding (decode_case): one query token per sequence against a KV cache, forward only, ours over
the contiguous cache and over a paged one (page table read by the kernel), eager SDPA over the
contiguous cache and over the paged one gathered first (what plain PyTorch does with pages);
bytes = the cache's keys and values read once.
FLOP: 4 d per query-key pair the mask lets through in the forward (two products), 2.5 times that
again in the backward.
"""
import math
from typing import Callable, Dict, Iterator, NamedTuple, Optional, Sequence, Tuple

import torch

from ..common.recipe import DelayedScaling
from ..pytorch.attention.backends import AttentionProblem, UnfusedBackend
from ..pytorch.attention.dot_product_attention import DotProductAttention
from ..pytorch.attention.masks import MaskSpec, default_alibi_slopes
from ..pytorch.custom_ops.attention import flash_attention
from ..pytorch.fp8.context import autocast
from .harness import Case, suite_modes


class Config(NamedTuple):
    name: str
    batch: int
    seq: int
    heads: int
    head_dim: int
    window: int  # keys left of the diagonal; -1 for all
    alibi: bool
    lengths: Optional[Tuple[int, ...]]  # thd: the packed sequences' lengths (batch unused)
    bias: bool = False  # a learnt post-scale bias [1, h, s, s] (bf16), with its gradient
    dropout: float = 0.0
    fp8: bool = False  # ours in FP8 attention (DotProductAttention under fp8_dpa), ours_bf16 beside it


class DecodeConfig(NamedTuple):
    name: str
    batch: int
    context: int  # cached tokens per sequence
    heads: int
    kv_heads: int
    head_dim: int
    page_size: int


HEADLINE = [Config("causal", 2, 2048, 8, 64, -1, False, None)]
SUITE = HEADLINE + [Config("sliding_window_256", 1, 4096, 8, 64, 256, False, None),
                    Config("alibi_causal", 1, 4096, 8, 64, -1, True, None),
                    Config("thd_causal", 0, 3840, 8, 64, -1, False, (256, 3840, 512, 1024, 2048, 768, 3072, 1536)),
                    Config("bias_causal", 1, 2048, 8, 64, -1, False, None, bias=True),
                    Config("dropout_causal", 2, 2048, 8, 64, -1, False, None, dropout=0.1),
                    Config("fp8_causal", 1, 4096, 8, 128, -1, False, None, fp8=True)]
DECODE = [DecodeConfig("decode_gqa_8k", 1, 8192, 32, 8, 128, 64)]
# On a GPU also the size the vendors' flash kernels are quoted at (head dim 128, 8k tokens): on
# 2 CPU cores its unfused provider alone would take minutes.
ACCELERATOR = [Config("causal_8k", 1, 8192, 16, 128, -1, False, None)]
TINY = dict(HEADLINE=[Config("causal", 1, 70, 2, 16, -1, False, None)],
            SUITE=[Config("causal", 1, 70, 2, 16, -1, False, None), Config("sliding_window_256", 1, 90, 2, 16, 8, False, None),
                   Config("alibi_causal", 1, 40, 2, 16, -1, True, None),
                   Config("thd_causal", 0, 30, 2, 16, -1, False, (7, 30, 12)),
                   Config("bias_causal", 1, 33, 2, 16, -1, False, None, bias=True),
                   Config("dropout_causal", 1, 33, 2, 16, -1, False, None, dropout=0.1),
                   Config("fp8_causal", 1, 40, 2, 16, -1, False, None, fp8=True)],
            DECODE=[DecodeConfig("decode_gqa_8k", 1, 70, 4, 2, 16, 8)],
            ACCELERATOR=[Config("causal_8k", 1, 80, 2, 16, -1, False, None)])
DTYPE = torch.bfloat16
# The unfused backend's bf16 products take 10 s (forward) to 23 s (forward + backward) at the
# headline [2, 2048, 8, 64] on 2 cores of a CPU without bf16 matrix instructions; the longer
# sequences leave it out rather than spend most of the suite on it.
UNFUSED_MAX_SEQ = 2048


def _allowed_pairs(config: Config) -> int:
    """Query-key pairs a causal mask (with the window) lets through, summed over sequences and heads."""
    def pairs(s: int) -> int:
        if config.window < 0:
            return s * (s + 1) // 2
        w = config.window + 1  # keys per query once the window is full
        return sum(min(i + 1, w) for i in range(s))
    lengths = config.lengths or (config.seq,) * config.batch
    return config.heads * sum(pairs(s) for s in lengths)


def _dense(config: Config, device: torch.device) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(bool mask [b | 1, 1, s, s], True = masked out; ALiBi bias [1, h, s, s] or None)."""
    s = config.seq
    query, key = torch.arange(s, device=device).view(s, 1), torch.arange(s, device=device).view(1, s)
    masked = key > query
    if config.window >= 0:
        masked = masked | (key < query - config.window)
    masked = masked.view(1, 1, s, s)
    if config.lengths is not None:
        lengths = torch.tensor(config.lengths, device=device)
        pad = torch.arange(s, device=device) >= lengths.view(-1, 1)  # [b, s]
        masked = masked | pad[:, None, None, :] | pad[:, None, :, None]
    bias = None
    if config.alibi:
        slopes = default_alibi_slopes(config.heads).to(device).view(1, -1, 1, 1)
        bias = -slopes * (query - key).abs().float()
    return masked, bias


def _providers(config: Config, mode: str, device: torch.device) -> Dict[str, Callable[[], object]]:
    h, d, s = config.heads, config.head_dim, config.seq
    b = len(config.lengths) if config.lengths is not None else config.batch
    scale = 1.0 / math.sqrt(d)

    def tensors(*shape):
        return [torch.randn(*shape, dtype=DTYPE, device=device, requires_grad=mode == "full") for _ in range(3)]
    q, k, v = tensors(b, h, s, d)  # padded [b, h, s, d]
    grad_out = torch.randn(b, h, s, d, dtype=DTYPE, device=device)
    masked, bias = _dense(config, device)
    slopes = default_alibi_slopes(h).to(device) if config.alibi else None
    window = (config.window, 0)
    learnt = torch.randn(1, h, s, s, dtype=DTYPE, device=device, requires_grad=mode == "full") if config.bias else None
    inputs = (q, k, v) if learnt is None else (q, k, v, learnt)

    packed = None
    if config.lengths is not None:
        cu = torch.tensor([sum(config.lengths[:i]) for i in range(len(config.lengths) + 1)], device=device)
        qp, kp, vp = tensors(sum(config.lengths), h, d)  # packed [t, h, d]
        packed = (qp, kp, vp, cu, torch.randn_like(qp))

    def timed(forward: Callable[[], torch.Tensor], inputs: Sequence[torch.Tensor], grad: torch.Tensor):
        if mode == "fwd":
            def run_fwd():
                with torch.no_grad():
                    return forward()
            return run_fwd
        return lambda: torch.autograd.grad(forward(), inputs, grad)

    if packed is not None:
        qp, kp, vp, cu, grad_packed = packed
        ours = timed(lambda: flash_attention(qp, kp, vp, scale, window, False, cu, cu)[0], (qp, kp, vp), grad_packed)
    else:
        ours = timed(lambda: flash_attention(q, k, v, scale, window, False, alibi_slopes=slopes, bias=learnt,
                                             dropout=config.dropout)[0], inputs, grad_out)

    plain_causal = config.window < 0 and config.lengths is None and bias is None and learnt is None
    if bias is not None:
        sdpa_mask = bias.masked_fill(masked, float("-inf")).to(DTYPE)
    elif learnt is not None:  # the learnt bias with the mask folded in (a differentiable fill)
        sdpa_mask = None
    else:
        sdpa_mask = None if plain_causal else ~masked

    def sdpa():
        attn_mask = sdpa_mask if learnt is None else learnt.masked_fill(masked, float("-inf"))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=plain_causal,
                                                                scale=scale, dropout_p=config.dropout)
    providers = {"ours": ours, "eager": timed(sdpa, inputs, grad_out)}
    if config.fp8:
        providers["ours"], providers["ours_bf16"] = _fp8_attention(config, q, k, v, grad_out, timed), ours
    if s <= UNFUSED_MAX_SEQ and config.dropout == 0:
        def unfused():
            problem = AttentionProblem(spec=MaskSpec(explicit=masked), bias=bias if learnt is None else learnt,
                                       scale=scale, dropout=0.0)
            return UnfusedBackend().forward(q, k, v, problem)
        providers["unfused"] = timed(unfused, inputs, grad_out)
    if mode == "fwd" and (config.window >= 0 or config.alibi):  # PyTorch's own answer to these masks
        providers["flex_compile"] = _flex(config, q, k, v, scale, device)
    return providers


def _fp8_attention(config: Config, q, k, v, grad_out, timed) -> Callable[[], object]:
    """DotProductAttention under fp8_dpa (DelayedScaling) on q, k, v [b, h, s, d] seen as bshd."""
    module = DotProductAttention(config.heads, config.head_dim, qkv_format="bshd", attn_mask_type="causal")
    fp8_recipe = DelayedScaling(fp8_dpa=True)
    layers = [t.transpose(1, 2) for t in (q, k, v)]  # [b, h, s, d] -> [b, s, h, d] views

    def forward():
        with autocast(recipe=fp8_recipe):
            return module(*layers)
    b, h, s, d = q.shape
    return timed(forward, (q, k, v), grad_out.transpose(1, 2).reshape(b, s, h * d))


def _flex(config: Config, q, k, v, scale: float, device: torch.device) -> Callable[[], object]:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    lengths = torch.tensor(config.lengths, device=device) if config.lengths is not None else None
    slopes = default_alibi_slopes(config.heads).to(device) if config.alibi else None

    def keep(b, h, query, key):
        allowed = key <= query
        if config.window >= 0:
            allowed = allowed & (key >= query - config.window)
        if lengths is not None:
            allowed = allowed & (key < lengths[b]) & (query < lengths[b])
        return allowed

    def alibi(score, b, h, query, key):
        return score - slopes[h] * (query - key).abs()
    compiled = torch.compile(flex_attention)
    block_mask = []  # built on the first call: the catalog describes cases on fake tensors

    def run():
        if not block_mask:
            block_mask.append(create_block_mask(keep, q.shape[0] if lengths is not None else None, None, config.seq,
                                                config.seq, device=device.type))
        with torch.no_grad():
            return compiled(q, k, v, score_mod=alibi if config.alibi else None, block_mask=block_mask[0], scale=scale)
    return run


def attention_case(config: Config, mode: str, device: torch.device) -> Case:
    b = len(config.lengths) if config.lengths is not None else config.batch
    forward_flops = 4.0 * config.head_dim * _allowed_pairs(config)
    main_bytes = b * config.heads * config.seq * config.head_dim * DTYPE.itemsize
    return Case(op=f"attention_{config.name}", shape=(b, config.seq, config.heads, config.head_dim), dtype=DTYPE,
                mode=mode, device=device, bytes=None, main_bytes=main_bytes,
                flops=forward_flops * (1.0 if mode == "fwd" else 3.5), providers=_providers(config, mode, device))


def decode_case(config: DecodeConfig, device: torch.device) -> Case:
    b, s, h, g, d, page = (config.batch, config.context, config.heads, config.kv_heads, config.head_dim,
                           config.page_size)
    scale = 1.0 / math.sqrt(d)
    q = torch.randn(b, h, 1, d, dtype=DTYPE, device=device)
    k, v = (torch.randn(b, g, s, d, dtype=DTYPE, device=device) for _ in range(2))
    pages = -(-s // page)
    order = torch.randperm(b * pages, device=device)
    table = order.view(b, pages).to(torch.int32)

    def pool(cache):  # [b, g, s, d] -> pages [b * pages, page, g, d] in the shuffled order
        padded = torch.nn.functional.pad(cache, (0, 0, 0, pages * page - s)).transpose(1, 2)  # [b, pages * page, g, d]
        out = torch.empty(b * pages, page, g, d, dtype=DTYPE, device=device)
        out[order] = padded.reshape(b * pages, page, g, d)
        return out
    k_pages, v_pages = pool(k), pool(v)
    cu_q = torch.arange(b + 1, device=device)
    cu_kv = torch.arange(b + 1, device=device) * s

    def sdpa(keys, values):
        return torch.nn.functional.scaled_dot_product_attention(q, keys, values, scale=scale, enable_gqa=True)

    def gathered(pages_of):  # [b * pages, page, g, d] -> [b, g, s, d]
        return pages_of[table.long().flatten()].view(b, pages * page, g, d)[:, :s].transpose(1, 2)

    def no_grad(call):
        def run():
            with torch.no_grad():
                return call()
        return run
    providers = {
        "ours": no_grad(lambda: flash_attention(q, k, v, scale, (-1, 0), True)[0]),
        "ours_paged": no_grad(lambda: flash_attention(q, k_pages, v_pages, scale, (-1, 0), True, cu_seqlens_q=cu_q,
                                                      cu_seqlens_kv=cu_kv, page_table=table)[0]),
        "eager": no_grad(lambda: sdpa(k, v)),
        "eager_paged": no_grad(lambda: sdpa(gathered(k_pages), gathered(v_pages))),
    }
    cache_bytes = 2 * b * g * s * d * DTYPE.itemsize
    return Case(op=f"attention_{config.name}", shape=(b, s, h, d), dtype=DTYPE, mode="fwd", device=device,
                bytes=cache_bytes, main_bytes=cache_bytes, flops=4.0 * b * h * s * d, providers=providers)


def attention_cases(configs: Sequence[Config], device: torch.device,
                    modes: Sequence[str] = suite_modes(False)) -> Iterator[Case]:
    for config in configs:
        for mode in modes:
            yield attention_case(config, mode, device)


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    """Plain causal [2, 2048, 8, 64] bf16 alone when quick, else the masks with structure, the
    bias and dropout terms, FP8 attention and decoding too, and on a GPU causal [1, 8192, 16, 128]."""
    yield from attention_cases(HEADLINE if quick else SUITE, device, suite_modes(quick))
    if not quick:
        for config in DECODE:
            yield decode_case(config, device)
        if device.type != "cpu":
            yield from attention_cases(ACCELERATOR, device, suite_modes(quick))

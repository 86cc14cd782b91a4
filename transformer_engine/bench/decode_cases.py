"""Decoding: one token per sequence through a stack of Llama-style layers with a KV cache.

Config: hidden 2048, ffn 5632, 16 heads in 4 GQA groups, RMSNorm, SwiGLU, no bias (the layer
family's block, wider), 2 layers: 178 MB of bf16 weights, far beyond the caches, so a step at
small batch is bound by reading them. Each sequence holds CONTEXT tokens in the cache when the
timing starts and one more after every call; a call decodes one token for each of the batch's
sequences (batch 1 and 8), under torch.no_grad, in bf16 on every CPU: decoding's GEMMs have at
most 8 rows, which our kernel reads the weights for in place on every SIMD tier (on CPUs without
bf16 matrix units with fp32 FMAs, b widened in registers), and PyTorch's bf16 GEMV runs there too
(2.6 ms for [1, 4096] x [4096, 4096] on 2 Zen 3 cores, against 1.6 ms for ours).

Providers, on the same input token and (copied) parameters:
    ours:         te.TransformerLayer stack with te.InferenceParams, bf16 weights
    ours_fp8:     weights made by te.quantized_model_init(recipe=DelayedScaling()), run inside
                  te.autocast of that recipe: E4M3 weights, FP8 GEMMs
    ours_current, ours_block, ours_nvfp4: the same with Float8CurrentScaling(),
                  Float8BlockScaling() (128 x 128 weight blocks) and NVFP4BlockScaling()
    eager:        the plain-PyTorch block (layer_cases.LlamaBlock's weights) with its own KV
                  cache, attention by F.scaled_dot_product_attention over the cached tokens
    compile:      torch.compile of that plain decoding step (dynamic shapes: the cache grows)
Rows: tokens/s (the batch over the step's time) and GB/s of the bytes a step must read: every
weight as the provider stores it (bf16, or FP8 codes and their scales) and the KV cache; their
fraction of the same-run copy's bandwidth is the weight stream's.
"""
import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

from ..pytorch.fp8.quantized_tensor import QuantizedTensor
from .harness import Case
from .layer_cases import LlamaBlock, LlamaConfig, layer_state


@dataclass(frozen=True)
class DecodeConfig:
    block: LlamaConfig = LlamaConfig(hidden=2048, ffn=5632, heads=16, groups=4)
    layers: int = 2
    context: int = 256
    batches: tuple = (1, 8)
    # Decoding steps the cache has room for after the context; a provider called more often than
    # that starts again from the context (one call then also pays the prefill).
    room: int = 512


CONFIG = DecodeConfig()
# Sizes that make every case build and run in milliseconds (tests/bench/test_bench_cases.py).
TINY = dict(CONFIG=DecodeConfig(block=LlamaConfig(hidden=64, ffn=96, heads=4, groups=2), layers=2, context=5,
                                batches=(1, 3), room=4))
ROUNDS = 20
# (provider, recipe) of the TE stacks; the bf16 one has none.
RECIPES = {"ours": None, "ours_fp8": recipe.DelayedScaling, "ours_current": recipe.Float8CurrentScaling,
           "ours_block": recipe.Float8BlockScaling, "ours_nvfp4": recipe.NVFP4BlockScaling}


class PlainDecoder(torch.nn.Module):
    """The plain blocks (LlamaBlock's weights) decoding with a KV cache of their own: cache [batch,
    groups, context + room, head_dim] per layer and per k / v; step() appends one token per sequence
    and attends over the cached ones (no mask: the new token sees every earlier one)."""

    def __init__(self, cfg: DecodeConfig, batch: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.blocks = torch.nn.ModuleList(LlamaBlock(cfg.block, dtype, device) for _ in range(cfg.layers))
        shape = (batch, cfg.block.groups, cfg.context + cfg.room, cfg.block.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.layers)]
        self.v_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.layers)]

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """x [batch, s, hidden]: the tokens at positions [start, start + s) of every sequence."""
        block_cfg = self.cfg.block
        b, s, _ = x.shape
        end = start + s
        for block, k_cache, v_cache in zip(self.blocks, self.k_cache, self.v_cache):
            n = block.attn_norm(x)
            q = block.q(n).view(b, s, block_cfg.heads, block_cfg.head_dim).transpose(1, 2)  # [b, heads, s, d]
            k_cache[:, :, start:end] = block.k(n).view(b, s, block_cfg.groups, block_cfg.head_dim).transpose(1, 2)
            v_cache[:, :, start:end] = block.v(n).view(b, s, block_cfg.groups, block_cfg.head_dim).transpose(1, 2)
            repeat = block_cfg.heads // block_cfg.groups
            k = k_cache[:, :, :end].repeat_interleave(repeat, dim=1)  # [b, heads, end, d]
            v = v_cache[:, :, :end].repeat_interleave(repeat, dim=1)
            # Causal over the cache: query i (position start + i) sees keys up to start + i.
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=_causal_from(start, s, end, x.device))
            h = x + block.o(attn.transpose(1, 2).reshape(b, s, block_cfg.hidden))
            x = h + block.mlp(h)
        return x


def _causal_from(start: int, s: int, end: int, device: torch.device) -> Optional[torch.Tensor]:
    """The boolean mask [s, end] letting query i see keys [0, start + i]; None for one query (all)."""
    if s == 1:
        return None
    return torch.ones(s, end, dtype=torch.bool, device=device).tril(diagonal=start)


def te_stack(cfg: DecodeConfig, plain: PlainDecoder, dtype: torch.dtype, device: torch.device,
             fp8_recipe: Optional[recipe.Recipe]) -> torch.nn.ModuleList:
    """te.TransformerLayer per plain block, its parameters copied in; under fp8_recipe the weights
    are made by te.quantized_model_init of that recipe (stored quantised, cast as they load)."""
    block = cfg.block

    def layer(number: int) -> torch.nn.Module:
        return te.TransformerLayer(block.hidden, block.ffn, block.heads, num_gqa_groups=block.groups,
                                   layernorm_epsilon=block.eps, hidden_dropout=0.0, attention_dropout=0.0,
                                   self_attn_mask_type="padding_causal", normalization="RMSNorm",
                                   activation="swiglu", bias=False, attn_input_format="bshd", layer_number=number,
                                   params_dtype=dtype, device=device)
    with te.quantized_model_init(enabled=fp8_recipe is not None, recipe=fp8_recipe):
        layers = torch.nn.ModuleList(layer(i + 1) for i in range(cfg.layers))
    for ours, theirs in zip(layers, plain.blocks):
        ours.load_state_dict(layer_state(theirs), strict=False)
    return layers


class Steps:
    """One sequence of decoding calls over run(x [batch, s, hidden], start) -> output: the
    context first (start 0, here), then each call one token further, from the context again
    (prefill included) once the cache is full."""

    def __init__(self, cfg: DecodeConfig, run: Callable[[torch.Tensor, int], torch.Tensor], context: torch.Tensor,
                 token: torch.Tensor):
        self.cfg, self.run, self.context, self.token = cfg, run, context, token
        self.prefill()

    def prefill(self) -> None:
        with torch.no_grad():
            self.run(self.context, 0)
        self.steps = 0

    def __call__(self) -> torch.Tensor:
        if self.steps == self.cfg.room:
            self.prefill()
        self.steps += 1
        with torch.no_grad():
            return self.run(self.token, self.cfg.context + self.steps - 1)


def _described_only() -> None:
    raise RuntimeError("a case built to be described (te-bench list) is never run")


def te_run(cfg: DecodeConfig, layers: torch.nn.ModuleList, batch: int, dtype: torch.dtype,
           fp8_recipe: Optional[recipe.Recipe]) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """run(x [batch, s, hidden], start) of a TE stack with one te.InferenceParams: start 0 empties
    the cache first (the prefill)."""
    block = cfg.block
    params = te.InferenceParams(batch, cfg.context + cfg.room, num_heads_kv=block.groups, head_dim_k=block.head_dim,
                                dtype=dtype, qkv_format="bshd")

    def run(x: torch.Tensor, start: int) -> torch.Tensor:
        if start == 0:
            params.reset()
        params.pre_step(OrderedDict((seq, x.shape[1]) for seq in range(batch)))
        with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
            for layer in layers:
                x = layer(x, inference_params=params)
        return x
    return run


def weight_bytes(module: torch.nn.Module) -> int:
    """The bytes of a module's parameters that a forward GEMM reads: high-precision ones whole,
    quantised ones' row-wise codes and scales (the usage the forward GEMM takes)."""
    total = 0
    for p in module.parameters():
        if not isinstance(p, QuantizedTensor):
            total += p.numel() * p.element_size()
            continue
        operand = p._storage.operand
        usage = getattr(operand, "rowwise", None) or operand
        total += sum(value.numel() * value.element_size() for value in
                     (getattr(usage, f.name) for f in dataclasses.fields(usage) if not f.name.startswith("_"))
                     if isinstance(value, torch.Tensor))
    return total


def decode_case(cfg: DecodeConfig, batch: int, dtype: torch.dtype, device: torch.device) -> Case:
    block = cfg.block
    plain = PlainDecoder(cfg, batch, dtype, device)
    context = torch.randn(batch, cfg.context, block.hidden, dtype=dtype, device=device)
    token = torch.randn(batch, 1, block.hidden, dtype=dtype, device=device)
    # The KV cache a step reads: keys and values of every layer, half the room past the context
    # on average.
    cached = cfg.context + cfg.room // 2
    cache_bytes = 2 * cfg.layers * batch * cached * block.groups * block.head_dim * torch.finfo(dtype).bits // 8
    plain_bytes = weight_bytes(plain.blocks) + cache_bytes
    case = dict(op=f"decode_b{batch}", shape=(batch, cfg.context, block.hidden), dtype=dtype, mode="fwd",
                device=device, bytes=plain_bytes, main_bytes=plain_bytes - cache_bytes, tokens=batch,
                fp8_providers=("ours_fp8", "ours_current", "ours_block"))
    if is_fake(context):
        # te-bench list describes cases under FakeTensorMode, where no weight can be quantised
        # (a cast needs the values) and nothing is run: the providers are named only.
        return Case(**case, providers={name: _described_only for name in (*RECIPES, "eager", "compile")})
    providers: Dict[str, Callable[[], object]] = {}
    bytes_of = {"eager": plain_bytes, "compile": plain_bytes}
    for name, make_recipe in RECIPES.items():
        fp8_recipe = make_recipe() if make_recipe is not None else None
        layers = te_stack(cfg, plain, dtype, device, fp8_recipe)
        providers[name] = Steps(cfg, te_run(cfg, layers, batch, dtype, fp8_recipe), context, token)
        bytes_of[name] = weight_bytes(layers) + cache_bytes
    providers["eager"] = Steps(cfg, plain, context, token)
    providers["compile"] = Steps(cfg, torch.compile(plain, dynamic=True), context, token)
    return Case(**case, providers=providers, bytes_of=bytes_of)


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    """Batch 1 and 8, not in the quick suite (it compiles a decoder and builds five TE stacks), on
    the CPU (the GPU check has its own cases), in bf16."""
    if quick or device.type != "cpu":
        return
    for batch in CONFIG.batches:
        yield decode_case(CONFIG, batch, torch.bfloat16, device)

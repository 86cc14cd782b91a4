"""Model-level cases: a Llama-style TransformerLayer and its LayerNormMLP, one training step.

Config (issue 5): hidden 1024, ffn 2816, 16 heads in 4 GQA groups, RMSNorm, SwiGLU, no bias,
causal attention with RoPE, [batch 4, seq 512] tokens. A step is forward + backward, taking the
gradients of the input and of every parameter with torch.autograd.grad.

Providers, on the same input, upstream gradient and (copied) parameters:
    ours:      te.TransformerLayer / te.LayerNormMLP in the case's dtype
    ours_fp8:  the same inside te.autocast(recipe=DelayedScaling()): every GEMM in FP8
    eager:     a plain-PyTorch Llama block (LlamaBlock below) / its MLP half
    compile:   torch.compile of that plain module
    gemm_floor, gemm_floor_fp8: the GEMMs of the step alone, same shapes: every Linear's
               (forward, dgrad and wgrad; in the case's dtype through torch.mm, and in FP8
               through our scaled_gemm on E4M3/E5M2 codes, as ours_fp8 runs them) and, in the
               TransformerLayer, causal attention's six score and value products as batched
               GEMMs in the case's dtype over the causal blocks (attention_gemms): what those
               steps cannot go below. The step rows give their distance to it (vs_floor,
               above_floor_ms; ours_fp8's to gemm_floor_fp8).
FLOPs: the GEMMs of forward and backward (3 x 2 x tokens x weights) plus causal attention's
score and value products (half of the full [s, s] products, forward and backward).

The rows also give each eager provider's activation memory (harness.saved_bytes: what autograd
saves for the backward, each storage once), measured outside the timed rounds.
"""
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

from ..pytorch.custom_ops.scaled_gemm import scaled_gemm
from .harness import Case


@dataclass(frozen=True)
class LlamaConfig:
    hidden: int = 1024
    ffn: int = 2816
    heads: int = 16
    groups: int = 4
    batch: int = 4
    seq: int = 512
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


HEADLINE = LlamaConfig()
# Sizes that make every case build and run in milliseconds: tests/bench/test_bench_cases.py sets these
# attributes to them, so each family declares its own.
TINY = dict(HEADLINE=LlamaConfig(hidden=32, ffn=48, heads=4, groups=2, batch=2, seq=8))
ROUNDS = 5  # a step takes seconds on 2 CPU cores


class RMSNorm(torch.nn.Module):
    """Hugging Face Llama's RMSNorm: statistics in fp32, scaled in the input dtype."""

    def __init__(self, hidden: int, eps: float, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class LlamaMLP(torch.nn.Module):
    """RMSNorm then down(silu(gate(x)) * up(x)), no bias."""

    def __init__(self, cfg: LlamaConfig, dtype: torch.dtype, device: torch.device):
        super().__init__()
        factory = {"dtype": dtype, "device": device, "bias": False}
        self.norm = RMSNorm(cfg.hidden, cfg.eps, dtype, device)
        self.gate = torch.nn.Linear(cfg.hidden, cfg.ffn, **factory)
        self.up = torch.nn.Linear(cfg.hidden, cfg.ffn, **factory)
        self.down = torch.nn.Linear(cfg.ffn, cfg.hidden, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norm(x)
        return self.down(F.silu(self.gate(n)) * self.up(n))


class LlamaBlock(torch.nn.Module):
    """Pre-norm block: h = x + attention(norm(x)); out = h + mlp(h). x is [batch, seq, hidden];
    cos/sin are [seq, head_dim] (fp32) of the rotary embedding."""

    def __init__(self, cfg: LlamaConfig, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.cfg = cfg
        factory = {"dtype": dtype, "device": device, "bias": False}
        kv = cfg.groups * cfg.head_dim
        self.attn_norm = RMSNorm(cfg.hidden, cfg.eps, dtype, device)
        self.q = torch.nn.Linear(cfg.hidden, cfg.hidden, **factory)
        self.k = torch.nn.Linear(cfg.hidden, kv, **factory)
        self.v = torch.nn.Linear(cfg.hidden, kv, **factory)
        self.o = torch.nn.Linear(cfg.hidden, cfg.hidden, **factory)
        self.mlp = LlamaMLP(cfg, dtype, device)

    def rope(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        t32 = t.float()
        return (t32 * cos + rotate_half(t32) * sin).to(t.dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        b, s, _ = x.shape
        n = self.attn_norm(x)
        q = self.q(n).view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)  # [b, heads, s, d]
        k = self.k(n).view(b, s, cfg.groups, cfg.head_dim).transpose(1, 2)  # [b, groups, s, d]
        v = self.v(n).view(b, s, cfg.groups, cfg.head_dim).transpose(1, 2)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        repeat = cfg.heads // cfg.groups  # each group's key/value head serves `repeat` query heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [b, heads, s, d]
        h = x + self.o(attn.transpose(1, 2).reshape(b, s, cfg.hidden))
        return h + self.mlp(h)


def te_layer(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """The same block as te.TransformerLayer, [batch, seq, hidden] in and out."""
    return te.TransformerLayer(cfg.hidden, cfg.ffn, cfg.heads, num_gqa_groups=cfg.groups, layernorm_epsilon=cfg.eps,
                               hidden_dropout=0.0, attention_dropout=0.0, self_attn_mask_type="causal",
                               normalization="RMSNorm", activation="swiglu", bias=False, attn_input_format="bshd",
                               params_dtype=dtype, device=device)


def te_mlp(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    return te.LayerNormMLP(cfg.hidden, cfg.ffn, eps=cfg.eps, bias=False, normalization="RMSNorm", activation="swiglu",
                           params_dtype=dtype, device=device)


def mlp_state(plain: LlamaMLP, prefix: str = "") -> Dict[str, torch.Tensor]:
    """The plain MLP's parameters under te.LayerNormMLP's names (fc1 = [gate; up]: SwiGLU
    activates the first half)."""
    return {f"{prefix}layer_norm_weight": plain.norm.weight,
            f"{prefix}fc1_weight": torch.cat([plain.gate.weight, plain.up.weight]),
            f"{prefix}fc2_weight": plain.down.weight}


def layer_state(plain: LlamaBlock) -> Dict[str, torch.Tensor]:
    """The plain block's parameters under te.TransformerLayer's names."""
    qkv = "self_attention.layernorm_qkv."
    return {f"{qkv}layer_norm_weight": plain.attn_norm.weight, f"{qkv}query_weight": plain.q.weight,
            f"{qkv}key_weight": plain.k.weight, f"{qkv}value_weight": plain.v.weight,
            "self_attention.proj.weight": plain.o.weight, **mlp_state(plain.mlp, "layernorm_mlp.")}


def gemm_flops(cfg: LlamaConfig, with_attention: bool) -> float:
    tokens = cfg.batch * cfg.seq
    mlp_weights = cfg.hidden * 3 * cfg.ffn
    flops = 3 * 2.0 * tokens * mlp_weights
    if with_attention:
        attn_weights = cfg.hidden * (2 * cfg.hidden + 2 * cfg.groups * cfg.head_dim)
        flops += 3 * 2.0 * tokens * attn_weights
        # q k^T and p v, causal half, forward (2 products) and backward (4 products)
        flops += 3 * 2 * 2.0 * cfg.batch * cfg.heads * cfg.seq * cfg.seq * cfg.head_dim / 2
    return flops


def linear_weights(cfg: LlamaConfig, with_attention: bool) -> Tuple[Tuple[int, int], ...]:
    """[out, in] of each Linear GEMM of the block (fused as ours runs them: q, k, v in one, gate
    and up in one)."""
    mlp = ((2 * cfg.ffn, cfg.hidden), (cfg.hidden, cfg.ffn))
    if not with_attention:
        return mlp
    return ((cfg.hidden + 2 * cfg.groups * cfg.head_dim, cfg.hidden), (cfg.hidden, cfg.hidden)) + mlp


@dataclass(frozen=True)
class AttentionShape:
    """Causal self-attention's score and value products in a step: `count` times (once per
    layer) over queries, keys and values [batch_heads, seq, head_dim], per query head (a GQA
    group's key/value head takes part in the products of each of its query heads)."""
    batch_heads: int
    seq: int
    head_dim: int
    count: int = 1


CAUSAL_BLOCKS = 8  # query blocks of the attention floor


def attention_shape(cfg: LlamaConfig, layers: int = 1) -> AttentionShape:
    return AttentionShape(batch_heads=cfg.batch * cfg.heads, seq=cfg.seq, head_dim=cfg.head_dim, count=layers)


def attention_gemms(shape: AttentionShape, dtype: torch.dtype, device: torch.device) -> List[Callable[[], object]]:
    """The six products of causal attention's forward and backward as batched GEMMs: S = Q K^T,
    O = P V, dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q. Query block i (seq / 8 rows)
    meets the keys of blocks 0..i only, as a flash kernel's tiles do: 9/16 of the full products,
    the causal half and the other half of the diagonal blocks (one block when seq does not
    divide by 8: the full products)."""
    blocks = CAUSAL_BLOCKS if shape.seq % CAUSAL_BLOCKS == 0 else 1
    rows = shape.seq // blocks
    gemms = []
    for i in range(blocks):
        keys = (i + 1) * rows
        q, do = (torch.randn(shape.batch_heads, rows, shape.head_dim, dtype=dtype, device=device) for _ in range(2))
        k, v = (torch.randn(shape.batch_heads, keys, shape.head_dim, dtype=dtype, device=device) for _ in range(2))
        p = torch.randn(shape.batch_heads, rows, keys, dtype=dtype, device=device)  # P, and dS in its place
        gemms += [lambda q=q, k=k: torch.bmm(q, k.transpose(1, 2)), lambda p=p, v=v: torch.bmm(p, v),
                  lambda do=do, v=v: torch.bmm(do, v.transpose(1, 2)), lambda p=p, do=do: torch.bmm(p.transpose(1, 2), do),
                  lambda p=p, k=k: torch.bmm(p, k), lambda p=p, q=q: torch.bmm(p.transpose(1, 2), q)]
    return gemms * shape.count


def gemm_floor(weights: Sequence[Tuple[int, int]], tokens: int, dtype: torch.dtype, device: torch.device,
               fp8: bool, attention: Optional[AttentionShape] = None) -> Callable[[], object]:
    """The GEMMs of one training step alone, same shapes: for each weight w [out, in] of
    `weights`, y = x w^T, dx = dy w, dw = dy^T x over x [tokens, in]. fp8: scaled_gemm on the
    codes (x and w E4M3, dy E5M2, each layout already transposed where a GEMM needs it), outputs
    in dtype (dw in fp32, as the FP8 backward writes it before its dtype). With `attention`,
    also its products (attention_gemms), in dtype either way (TE's FP8 recipes leave attention
    in high precision unless fp8_dpa)."""
    gemms = attention_gemms(attention, dtype, device) if attention is not None else []
    for out_features, in_features in weights:
        x = torch.randn(tokens, in_features, dtype=dtype, device=device)
        w = torch.randn(out_features, in_features, dtype=dtype, device=device)
        dy = torch.randn(tokens, out_features, dtype=dtype, device=device)
        if not fp8:
            gemms += [lambda x=x, w=w: torch.mm(x, w.t()), lambda dy=dy, w=w: torch.mm(dy, w),
                      lambda dy=dy, x=x: torch.mm(dy.t(), x)]
            continue
        e4m3, e5m2, one = torch.float8_e4m3fn, torch.float8_e5m2, torch.ones(1, device=device)
        x8, w8, dy8 = x.to(e4m3), w.to(e4m3), dy.to(e5m2)
        x8t, w8t, dy8t = x8.t().contiguous(), w8.t().contiguous(), dy8.t().contiguous()
        gemms += [lambda x8=x8, w8=w8: scaled_gemm(x8, w8, one, one, None, dtype),
                  lambda dy8=dy8, w8t=w8t: scaled_gemm(dy8, w8t, one, one, None, dtype),
                  lambda dy8t=dy8t, x8t=x8t: scaled_gemm(dy8t, x8t, one, one, None, torch.float32)]

    def run():
        return [gemm() for gemm in gemms]
    return run


def gemm_floors(weights: Sequence[Tuple[int, int]], tokens: int, dtype: torch.dtype, device: torch.device,
                attention: Optional[AttentionShape] = None) -> Dict[str, Callable[[], object]]:
    """The providers gemm_floor (in dtype) and gemm_floor_fp8 of a step with these weights (and
    attention products)."""
    return {"gemm_floor": gemm_floor(weights, tokens, dtype, device, fp8=False, attention=attention),
            "gemm_floor_fp8": gemm_floor(weights, tokens, dtype, device, fp8=True, attention=attention)}


# Each step provider's floor: the FP8 step's GEMMs are FP8 ones.
FLOORS = {"ours": "gemm_floor", "eager": "gemm_floor", "compile": "gemm_floor", "ours_fp8": "gemm_floor_fp8"}


def training_step(module: torch.nn.Module, inputs: Tuple[torch.Tensor, ...], dy: torch.Tensor,
                  fp8_recipe=None) -> Callable[[], object]:
    x = inputs[0]
    params = [p for p in module.parameters() if p.requires_grad]

    def run():
        with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
            y = module(*inputs)
        return torch.autograd.grad(y, (x, *params), dy)
    return run


def layer_case(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device) -> Case:
    plain = LlamaBlock(cfg, dtype, device)
    ours = te_layer(cfg, dtype, device)
    ours.load_state_dict(layer_state(plain), strict=False)
    freqs = te.RotaryPositionEmbedding(cfg.head_dim)(cfg.seq).to(device)  # [s, 1, 1, d] fp32
    cos, sin = freqs[:, 0, 0].cos(), freqs[:, 0, 0].sin()  # [s, d]
    return _step_case("transformer_layer", cfg, dtype, device, _Call(lambda h: ours(h, rotary_pos_emb=freqs), ours),
                      plain, (cos, sin), gemm_flops(cfg, True), with_attention=True)


def mlp_case(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device) -> Case:
    plain = LlamaMLP(cfg, dtype, device)
    ours = te_mlp(cfg, dtype, device)
    ours.load_state_dict(mlp_state(plain), strict=False)
    return _step_case("layernorm_mlp", cfg, dtype, device, ours, plain, (), gemm_flops(cfg, False),
                      with_attention=False)


def _step_case(op: str, cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, ours: torch.nn.Module,
               plain: torch.nn.Module, plain_extra: Tuple[torch.Tensor, ...], flops: float,
               with_attention: bool) -> Case:
    """Training steps of ours (high precision and FP8) and plain (eager and compiled) on one
    input x [batch, seq, hidden] and upstream gradient; plain also takes plain_extra."""
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden, dtype=dtype, device=device, requires_grad=True)
    dy = torch.randn_like(x)
    return Case(op=op, shape=(cfg.batch, cfg.seq, cfg.hidden), dtype=dtype, mode="full", device=device, bytes=None,
                main_bytes=x.numel() * x.element_size(), flops=flops, tokens=cfg.batch * cfg.seq,
                providers={"ours": training_step(ours, (x,), dy),
                           "ours_fp8": training_step(ours, (x,), dy, recipe.DelayedScaling()),
                           "eager": training_step(plain, (x, *plain_extra), dy),
                           "compile": training_step(_Compiled(plain), (x, *plain_extra), dy),
                           **gemm_floors(linear_weights(cfg, with_attention), cfg.batch * cfg.seq, dtype, device,
                                         attention_shape(cfg) if with_attention else None)},
                saved_bytes_of=("ours", "ours_fp8", "eager"), floors=FLOORS)


class _Call(torch.nn.Module):
    """module's parameters, called through `call` (extra keyword arguments bound)."""

    def __init__(self, call: Callable, module: torch.nn.Module):
        super().__init__()
        self.module, self.call = module, call

    def forward(self, *args):
        return self.call(*args)


class _Compiled(torch.nn.Module):
    """torch.compile of module, keeping module's parameters visible to training_step."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module, self.compiled = module, torch.compile(module)

    def forward(self, *args):
        return self.compiled(*args)


def step_dtype(device: torch.device) -> torch.dtype:
    """The dtype of training steps on device: bf16 on accelerators and on CPUs with bf16 matrix
    instructions (AVX512-BF16 or AMX, where PyTorch's bf16 GEMMs run 2.5-3x its fp32 ones:
    394 against 136 GFLOP/s at [2048, 1024] x [1024, 2816] on 2 Zen 4 cores); fp32 on other
    CPUs, where PyTorch's bf16 GEMM backward runs near 1 GFLOP/s (minutes per eager step of the
    headline layer)."""
    if device.type != "cpu":
        return torch.bfloat16
    return torch.bfloat16 if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported() else torch.float32


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    """Not in the quick suite: a step takes seconds on a 2-core CPU. Dtype: step_dtype."""
    if quick:
        return
    dtype = step_dtype(device)
    yield mlp_case(HEADLINE, dtype, device)
    yield layer_case(HEADLINE, dtype, device)

"""A small decoder-only GPT over bytes, built from our modules, and its plain-PyTorch twin.

Both models map token ids [batch, seq] (int64, values < vocab) to logits [batch, seq, vocab]:
    embedding -> `layers` Llama-style pre-norm blocks (RMSNorm, causal self-attention with RoPE,
    SwiGLU MLP, no bias) -> final RMSNorm -> LM head (no bias).
    TeGPT:    torch.nn.Embedding, te.TransformerLayer (attn_input_format="bshd"), te.RMSNorm,
              te.Linear, rotary frequencies from te.RotaryPositionEmbedding.
    PlainGPT: torch.nn.Embedding, layer_cases.LlamaBlock, layer_cases.RMSNorm, torch.nn.Linear.
PlainGPT is initialised from a seed; TeGPT takes its parameters through te_state(), so every
variant of a benchmark starts from the same weights. The loss is the mean next-byte cross
entropy: te.parallel_cross_entropy for ours, torch.nn.functional.cross_entropy for plain.
"""
import math
from dataclasses import dataclass
from typing import Dict

import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te

from .layer_cases import LlamaBlock, LlamaConfig, RMSNorm, layer_state, te_layer

VOCAB = 256  # bytes


@dataclass(frozen=True)
class GPTConfig:
    """Model and batch sizes. hidden must divide by heads and heads by groups; the MLP is
    3 x hidden wide (SwiGLU); head_dim = hidden / heads must be even (RoPE rotates pairs)."""
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    groups: int = 4
    seq: int = 128
    batch: int = 8
    eps: float = 1e-5

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "groups", "seq", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig: {name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError(f"GPTConfig: hidden ({self.hidden}) must be divisible by heads ({self.heads}) "
                             "into an even head size (RoPE rotates pairs of channels)")
        if self.heads % self.groups:
            raise ValueError(f"GPTConfig: heads ({self.heads}) must be divisible by groups ({self.groups})")

    @property
    def block(self) -> LlamaConfig:
        return LlamaConfig(hidden=self.hidden, ffn=3 * self.hidden, heads=self.heads, groups=self.groups,
                           batch=self.batch, seq=self.seq, eps=self.eps)

    @property
    def tokens(self) -> int:
        """Tokens per training step."""
        return self.batch * self.seq

    def parameters(self) -> int:
        per_block = (2 * self.hidden * self.hidden  # q, o
                     + 2 * self.hidden * self.groups * (self.hidden // self.heads)  # k, v
                     + 3 * self.hidden * 3 * self.hidden  # gate, up, down
                     + 2 * self.hidden)  # two norms
        return self.layers * per_block + 2 * VOCAB * self.hidden + self.hidden


class PlainGPT(torch.nn.Module):
    """The plain-PyTorch GPT: the reference (eager) and torch.compile variants."""

    def __init__(self, cfg: GPTConfig, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.embed = torch.nn.Embedding(VOCAB, cfg.hidden, dtype=dtype, device=device)
        self.blocks = torch.nn.ModuleList(LlamaBlock(cfg.block, dtype, device) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps, dtype, device)
        self.head = torch.nn.Linear(cfg.hidden, VOCAB, bias=False, dtype=dtype, device=device)
        freqs = te.RotaryPositionEmbedding(cfg.hidden // cfg.heads)(cfg.seq).to(device)  # [s, 1, 1, d] fp32
        self.register_buffer("cos", freqs[:, 0, 0].cos(), persistent=False)  # [s, d]
        self.register_buffer("sin", freqs[:, 0, 0].sin(), persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 style: N(0, 0.02) weights, the residual-branch outputs (o, down) scaled by
        1/sqrt(2 layers) so the residual stream's variance does not grow with depth."""
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)  # norm weights
            else:
                std = 0.02 / math.sqrt(2 * self.cfg.layers) if name.endswith(("o.weight", "down.weight")) else 0.02
                p.normal_(0.0, std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        s = ids.shape[1]
        h = self.embed(ids)  # [b, s, hidden]
        for block in self.blocks:
            h = block(h, self.cos[:s], self.sin[:s])
        return self.head(self.norm(h))  # [b, s, vocab]

    def loss(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(ids)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())  # [b * s, vocab] -> scalar


class TeGPT(torch.nn.Module):
    """The same GPT from our modules (variants ours and ours_fp8)."""

    def __init__(self, cfg: GPTConfig, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.embed = torch.nn.Embedding(VOCAB, cfg.hidden, dtype=dtype, device=device)
        self.blocks = torch.nn.ModuleList(te_layer(cfg.block, dtype, device) for _ in range(cfg.layers))
        self.norm = te.RMSNorm(cfg.hidden, eps=cfg.eps, params_dtype=dtype, device=device)
        self.head = te.Linear(cfg.hidden, VOCAB, bias=False, params_dtype=dtype, device=device)
        self.rope = te.RotaryPositionEmbedding(cfg.hidden // cfg.heads)
        self.register_buffer("freqs", self.rope(cfg.seq).to(device), persistent=False)  # [s, 1, 1, head_dim]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        s = ids.shape[1]
        h = self.embed(ids)  # [b, s, hidden]
        for block in self.blocks:
            h = block(h, rotary_pos_emb=self.freqs[:s])
        return self.head(self.norm(h))  # [b, s, vocab]

    def loss(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return te.parallel_cross_entropy(self(ids), targets, reduce_loss=True)


def te_state(plain: PlainGPT) -> Dict[str, torch.Tensor]:
    """The plain model's parameters under TeGPT's state_dict names."""
    state = {"embed.weight": plain.embed.weight, "norm.weight": plain.norm.weight,
             "head.weight": plain.head.weight}
    for i, block in enumerate(plain.blocks):
        state.update({f"blocks.{i}.{name}": value for name, value in layer_state(block).items()})
    return state


def te_gpt_from(plain: PlainGPT, dtype: torch.dtype, device: torch.device) -> TeGPT:
    """A TeGPT holding copies of plain's parameters (FP8 metadata buffers keep their defaults)."""
    ours = TeGPT(plain.cfg, dtype, device)
    missing, unexpected = ours.load_state_dict(te_state(plain), strict=False)
    left = [name for name in missing if not name.endswith("_extra_state")]
    if left or unexpected:
        raise RuntimeError(f"te_state does not cover TeGPT: missing {left}, unexpected {unexpected}")
    return ours

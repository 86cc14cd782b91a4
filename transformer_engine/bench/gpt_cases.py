"""The gpt family: one call = one whole training step (forward, loss, backward, optimizer step) of
the small GPT of gpt_model.py on a fixed batch of random bytes (timing needs no real text).

Providers, each with its own copy of the same initial weights and its own optimizer state
(gpt.build_variant): ours, ours_fp8 (DelayedScaling), eager, compile (torch.compile of the
plain model's loss; the optimizer step stays eager). The quick suite leaves compile out:
inductor takes 20-45 s to compile even this small model's forward and backward on 2 cores,
more than the rest of the family's time. gemm_floor and gemm_floor_fp8 (layer_cases.gemm_floor):
the step's GEMMs alone (every block's Linear and attention products and the LM head's; forward,
dgrad, wgrad), the floor whose distance the other rows give (vs_floor, above_floor_ms). Mode
"step"; shape [batch, seq, hidden];
rows give tokens/s (batch x seq per call) and the eager providers' activation memory.
FLOPs: 3 x 2 x tokens x matrix weights (forward and backward of every GEMM, the LM head
included) plus causal attention's score and value products.
"""
from typing import Iterator

import torch

from .gpt import TrainConfig, build_variant, train_step
from .gpt_model import VOCAB, GPTConfig, PlainGPT
from .harness import Case
from .layer_cases import FLOORS, attention_shape, gemm_floors, linear_weights, step_dtype

HEADLINE = GPTConfig(layers=2, hidden=256, heads=4, groups=4, seq=256, batch=8)
QUICK = GPTConfig(layers=2, hidden=128, heads=4, groups=4, seq=128, batch=4)
# Sizes that make every case build and run in milliseconds: tests/bench/test_bench_cases.py sets these
# attributes to them, so each family declares its own.
TINY = dict(HEADLINE=GPTConfig(layers=1, hidden=32, heads=2, groups=2, seq=16, batch=2),
            QUICK=GPTConfig(layers=1, hidden=32, heads=2, groups=2, seq=8, batch=2))
PROVIDERS = ("ours", "ours_fp8", "eager", "compile")
QUICK_PROVIDERS = PROVIDERS[:3]
LR = 1e-3


def step_flops(cfg: GPTConfig) -> float:
    head_dim = cfg.hidden // cfg.heads
    weights = cfg.layers * cfg.hidden * (2 * cfg.hidden + 2 * cfg.groups * head_dim + 9 * cfg.hidden)
    flops = 3 * 2.0 * cfg.tokens * (weights + cfg.hidden * VOCAB)
    # q k^T and p v, causal half, forward (2 products) and backward (4 products), per layer
    return flops + cfg.layers * 3 * 2 * 2.0 * cfg.batch * cfg.heads * cfg.seq * cfg.seq * head_dim / 2


def gpt_case(cfg: GPTConfig, device: torch.device, providers=PROVIDERS) -> Case:
    dtype = step_dtype(device)
    torch.manual_seed(0)
    initial = PlainGPT(cfg, dtype, device)
    ids = torch.randint(0, VOCAB, (cfg.batch, cfg.seq + 1), device=device)
    inputs, targets = ids[:, :-1], ids[:, 1:]  # [batch, seq] each
    train_cfg = TrainConfig(model=cfg, lr=LR)

    def provider(name: str):
        trainee = build_variant(name, initial, train_cfg, dtype, device)
        return lambda: train_step(trainee, inputs, targets, LR)
    embed_bytes = cfg.tokens * cfg.hidden * initial.embed.weight.element_size()
    weights = linear_weights(cfg.block, with_attention=True) * cfg.layers + ((VOCAB, cfg.hidden),)  # + LM head
    return Case(op="gpt_train_step", shape=(cfg.batch, cfg.seq, cfg.hidden), dtype=dtype, mode="step", device=device,
                bytes=None, main_bytes=embed_bytes, flops=step_flops(cfg), tokens=cfg.tokens,
                providers={**{name: provider(name) for name in providers},
                           **gemm_floors(weights, cfg.tokens, dtype, device, attention_shape(cfg.block, cfg.layers))},
                saved_bytes_of=("ours", "ours_fp8", "eager"), floors=FLOORS)


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    """A [4, 128] batch through 2 layers of hidden 128 without compile when quick; [8, 256]
    through hidden 256 with every provider else."""
    if quick:
        yield gpt_case(QUICK, device, QUICK_PROVIDERS)
    else:
        yield gpt_case(HEADLINE, device)

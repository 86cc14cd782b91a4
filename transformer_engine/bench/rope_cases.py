"""Rotary position embedding benchmark cases.

Providers, all on the same t, freqs [s, 1, 1, d2] (fp32) and upstream gradient dy:
    ours:    te.attention.apply_rotary_pos_emb(..., fused=True) (torch.ops.portable_te.rope_fwd,
             and in "full" mode rope_bwd through autograd)
    eager:   the same call with fused=False: plain PyTorch (reference.rope_fwd) with autograd
    compile: torch.compile (default mode) of that plain-PyTorch call
Modes: "fwd" is the forward under torch.no_grad; "full" is forward + backward, taking dt with
torch.autograd.grad.
Minimal bytes (freqs, at most 1/(b*h) of t's size in fp32, left out as negligible):
    fwd = read t + write y;  full = fwd + read dy + write dt.
"""
from typing import Callable, Iterator, Sequence, Tuple

import torch

import transformer_engine.pytorch as te

from .harness import Case, suite_modes

Shape = Tuple[int, ...]
# (shape in tensor_format, dtype, tensor_format, interleaved, rotary_dim)
Config = Tuple[Shape, torch.dtype, str, bool, int]
HEADLINE = [((2048, 4, 16, 128), torch.bfloat16, "sbhd", False, 128)]
SUITE = HEADLINE + [((4, 2048, 16, 128), torch.bfloat16, "bshd", True, 128),
                    ((2048, 4, 16, 128), torch.bfloat16, "sbhd", False, 64),
                    ((2048, 4, 16, 128), torch.float32, "sbhd", False, 128)]
# Sizes that make every case build and run in milliseconds: tests/bench/test_bench_cases.py sets these
# attributes to them, so each family declares its own.
TINY = dict(HEADLINE=[((8, 2, 2, 16), torch.bfloat16, "sbhd", False, 16)],
            SUITE=[((8, 2, 2, 16), torch.bfloat16, "sbhd", False, 16),
                   ((2, 8, 2, 16), torch.bfloat16, "bshd", True, 8)])
_PASSES = {"fwd": 2, "full": 4}  # tensors of t's size moved: fwd t, y; full adds dy, dt


def provider(rope: Callable, t: torch.Tensor, dy: torch.Tensor, mode: str) -> Callable[[], object]:
    if mode == "fwd":
        def run_fwd():
            with torch.no_grad():
                return rope(t)
        return run_fwd

    def run_full():
        return torch.autograd.grad(rope(t), t, dy)
    return run_full


def rope_case(config: Config, mode: str, device: torch.device) -> Case:
    shape, dtype, tensor_format, interleaved, rotary_dim = config
    seq_len = shape[0] if tensor_format == "sbhd" else shape[1]
    freqs = te.RotaryPositionEmbedding(rotary_dim, interleaved=interleaved).to(device)(seq_len)
    t = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    dy = torch.randn(shape, dtype=dtype, device=device)

    def apply(fused: bool) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda x: te.attention.apply_rotary_pos_emb(x, freqs, tensor_format, interleaved=interleaved,
                                                           fused=fused)
    main_bytes = t.numel() * t.element_size()
    rotations = {"ours": apply(True), "eager": apply(False), "compile": torch.compile(apply(False))}
    op = f"rope_{tensor_format}{'_pairs' if interleaved else ''}_d2={rotary_dim}"
    return Case(op=op, shape=tuple(shape), dtype=dtype, mode=mode, device=device, bytes=_PASSES[mode] * main_bytes,
                main_bytes=main_bytes, providers={name: provider(fn, t, dy, mode) for name, fn in rotations.items()})


def rope_cases(configs: Sequence[Config], device: torch.device,
               modes: Sequence[str] = suite_modes(False)) -> Iterator[Case]:
    for config in configs:
        for mode in modes:
            yield rope_case(config, mode, device)


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    """The headline sbhd [2048, 4, 16, 128] bf16 alone when quick, else the full list."""
    return rope_cases(HEADLINE if quick else SUITE, device, suite_modes(quick))

"""Cross-entropy benchmark cases.

Providers, all on the same logits [tokens, vocab] and targets (a tenth of them ignored):
    ours:    te.kernels.cross_entropy (torch.ops.portable_te.cross_entropy_fwd; in "full" mode the
             gradient is written by the forward and cross_entropy_bwd scales it)
    eager:   torch.nn.functional.cross_entropy
    compile: torch.compile (default mode) of that same call
Modes: "fwd" (the mean loss under torch.no_grad) and "full" (loss and dlogits by
torch.autograd.grad).
Minimal bytes: fwd = read logits;  full = read logits + write dlogits.
"""
from typing import Iterator, Sequence, Tuple

import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te

from .harness import Case, suite_modes

HEADLINE = [((4096, 32000), torch.bfloat16)]
SUITE = HEADLINE + [((8192, 50304), torch.bfloat16), ((4096, 32000), torch.float32)]
# Sizes that make every case build and run in milliseconds: tests/bench/test_bench_cases.py sets these
# attributes to them, so each family declares its own.
TINY = dict(HEADLINE=[((4, 40), torch.bfloat16)], SUITE=[((4, 40), torch.bfloat16), ((3, 33), torch.float32)])
_PASSES = {"fwd": 1, "full": 2}


def cross_entropy_case(shape: Tuple[int, int], dtype: torch.dtype, mode: str, device: torch.device) -> Case:
    tokens, vocab = shape
    logits = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,), device=device)
    target[torch.rand(tokens, device=device) < 0.1] = -100
    forwards = {"ours": te.kernels.cross_entropy, "eager": F.cross_entropy, "compile": torch.compile(F.cross_entropy)}

    def provider(forward):
        if mode == "fwd":
            def run_fwd():
                with torch.no_grad():
                    return forward(logits, target)
            return run_fwd
        return lambda: torch.autograd.grad(forward(logits, target), logits)

    main_bytes = logits.numel() * logits.element_size()
    return Case(op="cross_entropy", shape=tuple(shape), dtype=dtype, mode=mode, device=device,
                bytes=_PASSES[mode] * main_bytes, main_bytes=main_bytes,
                providers={name: provider(fwd) for name, fwd in forwards.items()})


def cross_entropy_cases(shapes: Sequence[Tuple[Tuple[int, int], torch.dtype]], device: torch.device,
                        modes: Sequence[str] = suite_modes(False)) -> Iterator[Case]:
    for shape, dtype in shapes:
        for mode in modes:
            yield cross_entropy_case(shape, dtype, mode, device)


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    """The headline [4096, 32000] bf16 alone when quick, else the full list."""
    return cross_entropy_cases(HEADLINE if quick else SUITE, device, suite_modes(quick))

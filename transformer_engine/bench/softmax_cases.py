"""Attention-softmax benchmark cases (TE's ScaledSoftmax family).

Providers, all on the same scores x [b, h, sq, sk], padding mask and upstream gradient dy:
    ours:    te.kernels.scaled_softmax / scaled_masked_softmax / scaled_upper_triang_masked_softmax
             (torch.ops.portable_te.scaled_softmax_fwd, and in "full" mode its _bwd via autograd)
    eager:   the plain-PyTorch reference (fp32 math: upcast, scale, mask, softmax, downcast)
    compile: torch.compile (default mode) of that same reference
Modes: "fwd" under torch.no_grad; "full" is forward + backward, dx by torch.autograd.grad.
Minimal bytes (the mask, at most 1/2 of x, left out):
    fwd = read x + write y;  full = fwd + read y + read dy + write dx.
"""
from typing import Callable, Iterator, Optional, Sequence, Tuple

import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch import reference

from .harness import Case, suite_modes

Shape = Tuple[int, int, int, int]
SCALE = 0.125
# (op name, te function(x, mask, scale), reference mask_type)
OPS = (("softmax", lambda x, mask, scale: te.kernels.scaled_softmax(x, scale), "none"),
       ("masked_softmax", te.kernels.scaled_masked_softmax, "padding"),
       ("causal_softmax", lambda x, mask, scale: te.kernels.scaled_upper_triang_masked_softmax(x, scale), "causal"))
HEADLINE = [((4, 16, 512, 512), torch.bfloat16)]  # 16M elements
SUITE = HEADLINE + [((2, 16, 1024, 1024), torch.bfloat16), ((1, 8, 128, 16384), torch.bfloat16),
                    ((4, 16, 512, 512), torch.float32)]
# Sizes that make every case build and run in milliseconds: tests/bench/test_bench_cases.py sets these
# attributes to them, so each family declares its own.
TINY = dict(HEADLINE=[((1, 2, 8, 8), torch.bfloat16)],
            SUITE=[((1, 2, 8, 8), torch.bfloat16), ((1, 1, 4, 24), torch.float32)])
_PASSES = {"fwd": 2, "full": 5}


def provider(forward: Callable, x: torch.Tensor, mask: Optional[torch.Tensor], dy: torch.Tensor,
             mode: str) -> Callable[[], object]:
    if mode == "fwd":
        def run_fwd():
            with torch.no_grad():
                return forward(x, mask, SCALE)
        return run_fwd

    def run_full():
        return torch.autograd.grad(forward(x, mask, SCALE), x, dy)
    return run_full


def softmax_case(op: str, fused: Callable, mask_type: str, shape: Shape, dtype: torch.dtype, mode: str,
                 device: torch.device) -> Case:
    b, _, sq, sk = shape
    if mask_type == "causal":
        shape = (b, shape[1], sq, sq)
    x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    dy = torch.randn(shape, dtype=dtype, device=device)
    mask = torch.rand(b, 1, sq, sk, device=device) < 0.2 if mask_type == "padding" else None

    def plain(inp, m, scale):
        return reference.scaled_softmax_fwd(inp, m, scale, mask_type)

    main_bytes = x.numel() * x.element_size()
    forwards = {"ours": fused, "eager": plain, "compile": torch.compile(plain)}
    return Case(op=op, shape=tuple(shape), dtype=dtype, mode=mode, device=device,
                bytes=_PASSES[mode] * main_bytes, main_bytes=main_bytes,
                providers={name: provider(fwd, x, mask, dy, mode) for name, fwd in forwards.items()})


def softmax_cases(shapes: Sequence[Tuple[Shape, torch.dtype]], device: torch.device,
                  modes: Sequence[str] = suite_modes(False)) -> Iterator[Case]:
    """Every op and mode at each (shape, dtype), each built only when the run reaches it."""
    for shape, dtype in shapes:
        for op, fused, mask_type in OPS:
            for mode in modes:
                yield softmax_case(op, fused, mask_type, shape, dtype, mode, device)


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    """The headline [4, 16, 512, 512] bf16 alone when quick, else the full list."""
    return softmax_cases(HEADLINE if quick else SUITE, device, suite_modes(quick))

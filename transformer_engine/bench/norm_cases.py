"""LayerNorm and RMSNorm benchmark cases.

Providers, all on the same x [rows, hidden], weight (and bias) and upstream gradient dy:
    ours:    te.LayerNorm / te.RMSNorm (torch.ops.portable_te.layernorm_fwd / rmsnorm_fwd, and
             in "full" mode their *_bwd through autograd)
    eager:   torch.nn.functional.layer_norm / rms_norm
    compile: torch.compile (default mode) of that same eager function
Modes: "fwd" is the forward under torch.no_grad; "full" is forward + backward, taking dx, dweight
(and dbias) with torch.autograd.grad so no gradient accumulates across calls.
Minimal bytes (parameters and per-row statistics left out as negligible):
    fwd = read x + write y;  full = fwd + read x + read dy + write dx.
"""
from typing import Callable, Iterator, Sequence, Tuple

import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te

from .harness import Case

Shape = Tuple[int, ...]
EPS = 1e-5
OPS = ("layernorm", "rmsnorm")
MODES = ("fwd", "full")
HEADLINE = [((8192, 4096), torch.bfloat16)]
SUITE = HEADLINE + [((4096, 1024), torch.bfloat16), ((16384, 768), torch.bfloat16),
                    ((8192, 4096), torch.float32)]
_PASSES = {"fwd": 2, "full": 5}  # tensors of x's size moved: fwd x, y; full adds x, dy, dx
_MODULES = {"layernorm": te.LayerNorm, "rmsnorm": te.RMSNorm}


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, EPS)


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


_EAGER = {"layernorm": layer_norm, "rmsnorm": rms_norm}


def provider(forward: Callable, x: torch.Tensor, params: Tuple[torch.Tensor, ...], dy: torch.Tensor,
             mode: str) -> Callable[[], object]:
    """Zero-arg call of forward(x, *params): under no_grad ("fwd"), or with all gradients ("full")."""
    if mode == "fwd":
        def run_fwd():
            with torch.no_grad():
                return forward(x, *params)
        return run_fwd

    def run_full():
        return torch.autograd.grad(forward(x, *params), (x, *params), dy)
    return run_full


def norm_case(op: str, shape: Shape, dtype: torch.dtype, mode: str, device: torch.device) -> Case:
    """op "layernorm" or "rmsnorm" over the last dim of `shape`; parameters in `dtype` too."""
    module = _MODULES[op](shape[-1], eps=EPS, params_dtype=dtype, device=device)
    params = tuple(module.parameters())
    x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    dy = torch.randn(shape, dtype=dtype, device=device)
    main_bytes = x.numel() * x.element_size()
    forwards = {"ours": lambda inp, *_: module(inp), "eager": _EAGER[op], "compile": torch.compile(_EAGER[op])}
    return Case(op=op, shape=tuple(shape), dtype=dtype, mode=mode, device=device,
                bytes=_PASSES[mode] * main_bytes, main_bytes=main_bytes,
                providers={name: provider(fwd, x, params, dy, mode) for name, fwd in forwards.items()})


def norm_cases(shapes: Sequence[Tuple[Shape, torch.dtype]], device: torch.device) -> Iterator[Case]:
    """Every op and mode at each (shape, dtype), each built only when the run reaches it."""
    for shape, dtype in shapes:
        for op in OPS:
            for mode in MODES:
                yield norm_case(op, shape, dtype, mode, device)


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    """The headline [8192, 4096] bf16 alone when quick, else the full list."""
    return norm_cases(HEADLINE if quick else SUITE, device)

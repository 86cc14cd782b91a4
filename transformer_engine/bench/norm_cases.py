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

Fused cases, at the headline shape:
    add_layernorm / add_rmsnorm: ours te.kernels.add_* against x + residual then the norm (eager and
        compiled). "fwd" reads x, residual and writes s, y (4 tensors); "bwd" is the backward
        alone of a graph built once (retain_graph): reads dy, ds, s and writes dx (4 tensors).
    layernorm_fp8 / rmsnorm_fp8 (forward): ours te.kernels.*_fp8 against the norm then the
        per-tensor cast (reference.fp8_quantize); reads x, writes one FP8 byte per element.
"""
from typing import Callable, Iterator, Sequence, Tuple

import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te

from ..pytorch import reference
from .harness import Case, suite_modes

Shape = Tuple[int, ...]
EPS = 1e-5
OPS = ("layernorm", "rmsnorm")
HEADLINE = [((8192, 4096), torch.bfloat16)]
SUITE = HEADLINE + [((4096, 1024), torch.bfloat16), ((16384, 768), torch.bfloat16),
                    ((8192, 4096), torch.float32)]
# Sizes that make every case build and run in milliseconds: tests/bench/test_bench_cases.py sets these
# attributes to them, so each family declares its own.
TINY = dict(HEADLINE=[((8, 64), torch.bfloat16)], SUITE=[((8, 64), torch.bfloat16), ((5, 48), torch.float32)])
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


def norm_cases(shapes: Sequence[Tuple[Shape, torch.dtype]], device: torch.device,
               modes: Sequence[str] = suite_modes(False)) -> Iterator[Case]:
    """Every op and mode at each (shape, dtype), each built only when the run reaches it."""
    for shape, dtype in shapes:
        for op in OPS:
            for mode in modes:
                yield norm_case(op, shape, dtype, mode, device)


def add_norm(op: str, x: torch.Tensor, residual: torch.Tensor, *params: torch.Tensor):
    """(y, s) of PyTorch's composition: the residual add, then the norm."""
    s = x + residual
    return _EAGER[op](s, *params), s


def _ours_add_norm(op: str, x: torch.Tensor, residual: torch.Tensor, *params: torch.Tensor):
    return te.kernels.add_layernorm(x, residual, *params, EPS) if op == "layernorm" else te.kernels.add_rmsnorm(
        x, residual, *params, EPS)


def add_norm_case(op: str, shape: Shape, dtype: torch.dtype, mode: str, device: torch.device) -> Case:
    """add_<op>: "fwd" under no_grad, or "bwd" (the backward alone of a graph built once)."""
    module = _MODULES[op](shape[-1], eps=EPS, params_dtype=dtype, device=device)
    params = tuple(module.parameters())
    x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    residual = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    dy, ds = torch.randn(shape, dtype=dtype, device=device), torch.randn(shape, dtype=dtype, device=device)
    main_bytes = x.numel() * x.element_size()
    forwards = {"ours": lambda *a: _ours_add_norm(op, *a), "eager": lambda *a: add_norm(op, *a),
                "compile": torch.compile(lambda *a: add_norm(op, *a))}

    def fwd_provider(forward):
        def run():
            with torch.no_grad():
                return forward(x, residual, *params)
        return run

    def bwd_provider(forward):
        outputs = forward(x, residual, *params)
        def run():
            return torch.autograd.grad(outputs, (x, residual, *params), (dy, ds), retain_graph=True)
        return run

    make = fwd_provider if mode == "fwd" else bwd_provider
    return Case(op=f"add_{op}", shape=tuple(shape), dtype=dtype, mode=mode, device=device, bytes=4 * main_bytes,
                main_bytes=main_bytes, providers={name: make(fwd) for name, fwd in forwards.items()})


def norm_fp8_case(op: str, shape: Shape, dtype: torch.dtype, device: torch.device,
                  fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> Case:
    """<op>_fp8 forward: the FP8 codes and amax of the norm's output."""
    module = _MODULES[op](shape[-1], eps=EPS, params_dtype=dtype, device=device)
    params = tuple(p.detach() for p in module.parameters())
    x = torch.randn(shape, dtype=dtype, device=device)
    scale = torch.tensor([2.0], device=device)

    def composed(x, *params):
        return reference.fp8_quantize(_EAGER[op](x, *params), scale, fp8_dtype)

    def ours(x, *params):
        if op == "layernorm":
            return te.kernels.layernorm_fp8(x, *params, scale, fp8_dtype, EPS)
        return te.kernels.rmsnorm_fp8(x, *params, scale, fp8_dtype, EPS)

    forwards = {"ours": ours, "eager": composed, "compile": torch.compile(composed)}
    main_bytes = x.numel() * x.element_size()
    return Case(op=f"{op}_fp8", shape=tuple(shape), dtype=dtype, mode="fwd", device=device,
                bytes=main_bytes + x.numel(), main_bytes=main_bytes,
                providers={name: (lambda f=fwd: f(x, *params)) for name, fwd in forwards.items()})


def fused_cases(shapes: Sequence[Tuple[Shape, torch.dtype]], device: torch.device) -> Iterator[Case]:
    for shape, dtype in shapes:
        for op in OPS:
            for mode in ("fwd", "bwd"):
                yield add_norm_case(op, shape, dtype, mode, device)
            yield norm_fp8_case(op, shape, dtype, device)


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    """The headline [8192, 4096] bf16 alone when quick, else the full list; the fusions at the headline."""
    yield from norm_cases(HEADLINE if quick else SUITE, device, suite_modes(quick))
    yield from fused_cases(HEADLINE, device)

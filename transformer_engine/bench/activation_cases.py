"""Activation benchmark cases: gelu, swiglu and bias + gelu forward and forward + backward, and
the activation -> FP8 fusions of the forward and of the backward.

Providers, all on the same x [rows, cols] (bias [cols]) and upstream gradient dy:
    ours:    te.kernels.activation (torch.ops.portable_te.activation_fwd, and in "full" mode
             activation_bwd / activation_bwd_dbias through autograd); te.kernels.activation_fp8
    eager:   the activation written with PyTorch's functions (F.gelu(approximate="tanh"),
             F.silu(a) * b); for FP8 the reference, activation then fp8_quantize
    compile: torch.compile (default mode) of that same eager function
The backward -> FP8 cases (<activation>_bwd_fp8, mode "bwd": dx's E5M2 codes and their
transpose from dy and x, what an FP8 MLP's first GEMM takes in its backward) also run
ours_unfused: our activation_bwd, then our fp8_quantize_transpose of its output (the two passes
the fusion replaces); eager is the reference, activation_bwd then the cast and transpose.
Modes: "fwd" is the forward under torch.no_grad; "full" is forward + backward, taking dx (and
dbias) with torch.autograd.grad so no gradient accumulates across calls.
Minimal bytes (the bias left out as negligible), for x of X bytes and y of Y bytes:
    fwd = X + Y;  full = fwd + read x, dy, write dx = 3 X + 2 Y;  fp8 = X + Y / element size;
    bwd_fp8 = X + Y + 2 X / element size (the codes of dx and their transpose).
"""
from typing import Callable, Iterator, Optional, Tuple

import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.custom_ops.activation import activation_grad

from .harness import Case, suite_modes

Shape = Tuple[int, ...]


def gelu(x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return F.gelu(x if bias is None else x + bias, approximate="tanh")


def swiglu(x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    a, b = (x if bias is None else x + bias).chunk(2, dim=-1)
    return F.silu(a) * b


_EAGER = {"gelu": gelu, "swiglu": swiglu}
# (activation, x shape, with bias): at least 16M elements of x or of the output.
HEADLINE = [("gelu", (4096, 4096), False), ("swiglu", (4096, 8192), False)]
SUITE = HEADLINE + [("gelu", (4096, 4096), True)]
FP8 = [("gelu", (4096, 4096)), ("swiglu", (4096, 8192))]
# Sizes that make every case build and run in milliseconds: tests/bench/test_bench_cases.py sets these
# attributes to them, so each family declares its own.
TINY = dict(HEADLINE=[("gelu", (4, 16), False), ("swiglu", (4, 16), False)],
            SUITE=[("gelu", (4, 16), False), ("swiglu", (4, 16), False), ("gelu", (4, 16), True)],
            FP8=[("gelu", (4, 16)), ("swiglu", (4, 16))])


def _op_name(activation: str, with_bias: bool) -> str:
    return f"bias_{activation}" if with_bias else activation


def provider(forward: Callable, inputs: Tuple[torch.Tensor, ...], bias: Optional[torch.Tensor], dy: torch.Tensor,
             mode: str) -> Callable[[], object]:
    """Zero-arg call of forward(x, bias): under no_grad ("fwd"), or with all gradients ("full")."""
    x = inputs[0]
    if mode == "fwd":
        def run_fwd():
            with torch.no_grad():
                return forward(x, bias)
        return run_fwd

    def run_full():
        return torch.autograd.grad(forward(x, bias), inputs, dy)
    return run_full


def activation_case(activation: str, shape: Shape, with_bias: bool, dtype: torch.dtype, mode: str,
                    device: torch.device) -> Case:
    x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    bias = torch.randn(shape[-1], dtype=dtype, device=device, requires_grad=True) if with_bias else None
    out_shape = (*shape[:-1], shape[-1] // 2) if activation == "swiglu" else shape
    dy = torch.randn(out_shape, dtype=dtype, device=device)
    x_bytes, y_bytes = x.numel() * x.element_size(), dy.numel() * dy.element_size()
    inputs = (x,) if bias is None else (x, bias)
    eager = _EAGER[activation]
    forwards = {"ours": lambda inp, b: te.kernels.activation(inp, activation, b), "eager": eager,
                "compile": torch.compile(eager)}
    return Case(op=_op_name(activation, with_bias), shape=tuple(shape), dtype=dtype, mode=mode, device=device,
                bytes=(x_bytes + y_bytes) if mode == "fwd" else 3 * x_bytes + 2 * y_bytes, main_bytes=x_bytes,
                providers={name: provider(fwd, inputs, bias, dy, mode) for name, fwd in forwards.items()})


def activation_fp8_case(activation: str, shape: Shape, dtype: torch.dtype, device: torch.device) -> Case:
    x = torch.randn(shape, dtype=dtype, device=device)
    scale = torch.tensor([8.0], device=device)
    fp8 = torch.float8_e4m3fn
    compiled = torch.compile(reference.activation_fp8)
    out_numel = x.numel() // 2 if activation == "swiglu" else x.numel()
    x_bytes = x.numel() * x.element_size()
    return Case(op=f"{activation}_fp8", shape=tuple(shape), dtype=dtype, mode="fwd", device=device,
                bytes=x_bytes + out_numel, main_bytes=x_bytes,
                providers={"ours": lambda: te.kernels.activation_fp8(x, activation, scale, fp8),
                           "eager": lambda: reference.activation_fp8(x, None, activation, 7.0, 1.702, scale, fp8),
                           "compile": lambda: compiled(x, None, activation, 7.0, 1.702, scale, fp8)})


def activation_grad_fp8_case(activation: str, shape: Shape, dtype: torch.dtype, device: torch.device) -> Case:
    x = torch.randn(shape, dtype=dtype, device=device)
    dy = torch.randn((*shape[:-1], shape[-1] // 2) if activation == "swiglu" else shape, dtype=dtype, device=device)
    scale = torch.tensor([8.0], device=device)
    fp8 = torch.float8_e5m2
    compiled = torch.compile(reference.activation_bwd_fp8)
    ops = te.kernels

    def unfused():
        grad = activation_grad(dy, x, activation)[0]
        return ops.fp8_quantize_transpose(grad, scale, fp8)
    x_bytes, dy_bytes = x.numel() * x.element_size(), dy.numel() * dy.element_size()
    return Case(op=f"{activation}_bwd_fp8", shape=tuple(shape), dtype=dtype, mode="bwd", device=device,
                bytes=x_bytes + dy_bytes + 2 * x.numel(), main_bytes=x_bytes,
                providers={"ours": lambda: ops.activation_grad_fp8(dy, x, activation, scale, fp8, True),
                           "ours_unfused": unfused,
                           "eager": lambda: reference.activation_bwd_fp8(dy, x, activation, 7.0, 1.702, scale, fp8,
                                                                         True),
                           "compile": lambda: compiled(dy, x, activation, 7.0, 1.702, scale, fp8, True)})


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    """gelu and swiglu in bf16 when quick; bias + gelu and the FP8 fusion as well otherwise.
    Each case is built only when the run reaches it."""
    dtype = torch.bfloat16
    for activation, shape, with_bias in (HEADLINE if quick else SUITE):
        for mode in suite_modes(quick):
            yield activation_case(activation, shape, with_bias, dtype, mode, device)
    if not quick:
        for activation, shape in FP8:
            yield activation_fp8_case(activation, shape, dtype, device)
        for activation, shape in FP8:
            yield activation_grad_fp8_case(activation, shape, dtype, device)

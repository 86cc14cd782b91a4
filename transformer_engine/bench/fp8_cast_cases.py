"""FP8 cast benchmark cases: per-tensor casts, the block-scaled quantize of the block recipes, and
NVFP4's amax and cast (two passes over the input: the global amax sets every block's scale).

Providers on the same tensors:
    ours:    torch.ops.portable_te.fp8_quantize / fp8_dequantize (one fused pass: scale,
             saturate, round, store, and the amax of the input)
    eager:   the plain-PyTorch reference (transformer_engine.pytorch.reference.fp8_cast)
    compile: torch.compile (default mode) of that same reference
Minimal bytes: quantize reads the input and writes one byte per element (two with the fused
transpose) plus the block scales; dequantize reads one byte per element and writes the
output. All forward-only.
"""
from typing import Iterator, Tuple

import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch import reference

from .harness import Case

Shape = Tuple[int, ...]
HEADLINE = [((8192, 4096), torch.bfloat16)]
SUITE = HEADLINE + [((8192, 4096), torch.float32), ((4096, 1024), torch.bfloat16)]
# Sizes that make every case build and run in milliseconds: tests/bench/test_bench_cases.py sets these
# attributes to them, so each family declares its own.
TINY = dict(HEADLINE=[((128, 256), torch.bfloat16)], SUITE=[((128, 256), torch.bfloat16), ((64, 96), torch.float32)])


def quantize_case(shape: Shape, dtype: torch.dtype, device: torch.device, transpose: bool = False) -> Case:
    """input `dtype` -> E4M3 with a scale that uses the format's range; with `transpose`, the
    codes in both layouts (what a Linear's backward needs)."""
    x = torch.randn(shape, dtype=dtype, device=device)
    scale = torch.tensor([448.0 / 5.0], device=device)
    e4m3 = torch.float8_e4m3fn
    op = "fp8_quantize_transpose" if transpose else "fp8_quantize"
    ours, plain = getattr(te.kernels, op), getattr(reference, op)
    compiled = torch.compile(plain)
    return Case(op=op, shape=tuple(shape), dtype=dtype, mode="fwd", device=device,
                bytes=x.numel() * (x.element_size() + (2 if transpose else 1)), main_bytes=x.numel() * x.element_size(),
                providers={"ours": lambda: ours(x, scale, e4m3), "eager": lambda: plain(x, scale, e4m3),
                           "compile": lambda: compiled(x, scale, e4m3)})


def dequantize_case(shape: Shape, dtype: torch.dtype, device: torch.device) -> Case:
    """E4M3 -> `dtype`."""
    scale = torch.tensor([448.0 / 5.0], device=device)
    data, _ = te.kernels.fp8_quantize(torch.randn(shape, device=device), scale, torch.float8_e4m3fn)
    scale_inv = 1 / scale
    compiled = torch.compile(reference.fp8_dequantize)
    out_bytes = data.numel() * torch.empty((), dtype=dtype).element_size()
    return Case(op="fp8_dequantize", shape=tuple(shape), dtype=dtype, mode="fwd", device=device,
                bytes=data.numel() + out_bytes, main_bytes=out_bytes,
                providers={"ours": lambda: te.kernels.fp8_dequantize(data, scale_inv, dtype),
                           "eager": lambda: reference.fp8_dequantize(data, scale_inv, dtype),
                           "compile": lambda: compiled(data, scale_inv, dtype)})


def block_quantize_case(shape: Shape, dtype: torch.dtype, device: torch.device, block: Tuple[int, int],
                        scale_mode: str) -> Case:
    """input `dtype` -> E4M3 with one scale per block (Float8BlockScaling's 1 x 128 with
    power-of-two scales, MXFP8's 1 x 32 with E8M0 exponents)."""
    x = torch.randn(shape, dtype=dtype, device=device)
    e4m3 = torch.float8_e4m3fn
    compiled = torch.compile(reference.fp8_block_quantize)
    grid = (-(-shape[0] // block[0])) * (-(-shape[1] // block[1]))
    scale_bytes = grid * (1 if scale_mode == "e8m0" else 4)
    args = (block[0], block[1], e4m3, scale_mode, 0.0)
    return Case(op=f"fp8_block_quantize_{block[0]}x{block[1]}_{scale_mode}", shape=tuple(shape), dtype=dtype,
                mode="fwd", device=device, bytes=x.numel() * (x.element_size() + 1) + scale_bytes,
                main_bytes=x.numel() * x.element_size(),
                providers={"ours": lambda: te.kernels.fp8_block_quantize(x, block, e4m3, scale_mode),
                           "eager": lambda: reference.fp8_block_quantize(x, *args),
                           "compile": lambda: compiled(x, *args)})


def nvfp4_cases(shape: Shape, dtype: torch.dtype, device: torch.device) -> Iterator[Case]:
    """NVFP4 of `dtype` input, row-wise 1 x 16 blocks: the amax pass (reads the input), the cast
    with that amax (reads it again, writes half a byte per element and a scale per 16), and
    the dequantize."""
    x = torch.randn(shape, dtype=dtype, device=device)
    amax = te.kernels.nvfp4_amax(x, False, False)
    codes_bytes, scale_bytes = x.numel() // 2, x.numel() // 16
    compiled_amax, compiled_quantize = torch.compile(reference.nvfp4_amax), torch.compile(reference.nvfp4_quantize)
    compiled_dequantize = torch.compile(reference.nvfp4_dequantize)
    yield Case(op="nvfp4_amax", shape=tuple(shape), dtype=dtype, mode="fwd", device=device,
               bytes=x.numel() * x.element_size(), main_bytes=x.numel() * x.element_size(),
               providers={"ours": lambda: te.kernels.nvfp4_amax(x, False, False),
                          "eager": lambda: reference.nvfp4_amax(x, False, False),
                          "compile": lambda: compiled_amax(x, False, False)})
    cast = (amax, 1, False, False, None)
    yield Case(op="nvfp4_quantize", shape=tuple(shape), dtype=dtype, mode="fwd", device=device,
               bytes=x.numel() * x.element_size() + codes_bytes + scale_bytes, main_bytes=x.numel() * x.element_size(),
               providers={"ours": lambda: te.kernels.nvfp4_quantize(x, *cast),
                          "eager": lambda: reference.nvfp4_quantize(x, *cast),
                          "compile": lambda: compiled_quantize(x, *cast)})
    data, scales = te.kernels.nvfp4_quantize(x, *cast)
    out_bytes = x.numel() * x.element_size()
    yield Case(op="nvfp4_dequantize", shape=tuple(shape), dtype=dtype, mode="fwd", device=device,
               bytes=codes_bytes + scale_bytes + out_bytes, main_bytes=out_bytes,
               providers={"ours": lambda: te.kernels.nvfp4_dequantize(data, scales, amax, shape[1], dtype),
                          "eager": lambda: reference.nvfp4_dequantize(data, scales, amax, shape[1], dtype),
                          "compile": lambda: compiled_dequantize(data, scales, amax, shape[1], dtype)})


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    for shape, dtype in (HEADLINE if quick else SUITE):
        yield quantize_case(shape, dtype, device)
        yield quantize_case(shape, dtype, device, transpose=True)
        yield dequantize_case(shape, dtype, device)
    for shape, dtype in HEADLINE:
        yield block_quantize_case(shape, dtype, device, (1, 128), "pow2")
        yield block_quantize_case(shape, dtype, device, (1, 32), "e8m0")
        yield from nvfp4_cases(shape, dtype, device)

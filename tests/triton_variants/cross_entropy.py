"""Compile variants of triton/cross_entropy.py: the forward with and without the gradient,
label smoothing and a grad_scale, and the backward, in bf16, fp16 and fp32."""
from transformer_engine.pytorch.triton import cross_entropy as kernels

from . import POINTER


def variants():
    found = []
    for dtype, compute_grad, smoothing, grad_scale in (("bf16", True, False, True), ("bf16", True, True, False),
                                                       ("fp16", False, True, False), ("fp32", True, True, True)):
        data = POINTER[dtype]
        signature = {"LOGITS": data, "TARGET": "*i64", "GRAD_SCALE": "*fp32", "LOSS": "*fp32", "GRAD": data,
                     "vocab": "i32", "ignore_index": "i32", "label_smoothing": "fp32", "grad_scale_stride": "i32",
                     "HAS_GRAD_SCALE": "constexpr", "SMOOTHING": "constexpr", "COMPUTE_GRAD": "constexpr",
                     "CHUNK": "constexpr"}
        constexprs = {"HAS_GRAD_SCALE": grad_scale, "SMOOTHING": smoothing, "COMPUTE_GRAD": compute_grad,
                      "CHUNK": 4096}
        found.append((f"cross_entropy_fwd[{dtype},grad={compute_grad},smoothing={smoothing},scale={grad_scale}]",
                      kernels._cross_entropy_fwd_kernel, signature, constexprs))
    for dtype in ("bf16", "fp16", "fp32"):
        data = POINTER[dtype]
        found.append((f"cross_entropy_bwd[{dtype}]", kernels._cross_entropy_bwd_kernel,
                      {"GRAD": data, "GRAD_LOSS": "*fp32", "GRAD_LOGITS": data, "vocab": "i32", "BLOCK": "constexpr"},
                      {"BLOCK": 4096}))
    return found

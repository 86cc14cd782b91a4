"""Compile variants of triton/cross_entropy.py: the forward with and without the gradient,
label smoothing and a grad_scale, and the backward, in bf16, fp16 and fp32; the vocabulary
split's partials and gradient in bf16."""
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
    found.append(("cross_entropy_partials[bf16]", kernels._partials_kernel,
                  {"LOGITS": "*bf16", "TARGET": "*i64", "PARTIALS": "*fp32", "shard": "i32", "vocab_start": "i32",
                   "ignore_index": "i32", "CHUNK": "constexpr"}, {"CHUNK": 4096}))
    found.append(("cross_entropy_sharded_grad[bf16]", kernels._sharded_grad_kernel,
                  {"LOGITS": "*bf16", "TARGET": "*i64", "ROW_MAX": "*fp32", "SUM_EXP": "*fp32", "GRAD_LOSS": "*fp32",
                   "GRAD": "*bf16", "shard": "i32", "vocab_start": "i32", "vocab_size": "i32", "ignore_index": "i32",
                   "label_smoothing": "fp32", "CHUNK": "constexpr"}, {"CHUNK": 4096}))
    return found

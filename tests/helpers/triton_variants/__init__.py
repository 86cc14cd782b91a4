"""Per Triton kernel module (transformer_engine/pytorch/triton/<module>.py), the kernel
variants tests/helpers/triton_compile.py compiles: variants() -> [(name, kernel, signature, constexprs)]
in the dtypes and flags the ops launch them with."""

POINTER = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16", "e4m3": "*fp8e4nv", "e5m2": "*fp8e5", "u8": "*u8"}

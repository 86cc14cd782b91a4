"""Compile variants of triton/softmax.py: forward and backward with each mask kind (none,
padding, causal; the two causal alignments differ only in a runtime offset), in bf16, fp16
and fp32."""
from transformer_engine.pytorch.triton import softmax as kernels

from . import POINTER


def variants():
    found = []
    for dtype, padding, causal in (("bf16", False, False), ("bf16", True, False), ("fp16", False, True),
                                   ("fp32", True, False)):
        data = POINTER[dtype]
        mask = POINTER["u8"] if padding else data  # without a mask the output pointer stands in
        shape = {"n_rows": "i32", "sq": "i32", "sk": "i32", "heads": "i32", "causal_offset": "i32",
                 "mask_stride_b": "i64", "mask_stride_h": "i64", "mask_stride_q": "i64", "scale": "fp32",
                 "PADDING": "constexpr", "CAUSAL": "constexpr", "BLOCK": "constexpr", "ROWS": "constexpr"}
        constexprs = {"PADDING": padding, "CAUSAL": causal, "BLOCK": 2048, "ROWS": 2}
        name = f"{dtype},padding={padding},causal={causal}"
        found.append((f"softmax_fwd[{name}]", kernels._softmax_fwd_kernel,
                      {"X": data, "MASK": mask, "Y": data, **shape}, constexprs))
        found.append((f"softmax_bwd[{name}]", kernels._softmax_bwd_kernel,
                      {"DY": data, "Y": data, "MASK": mask, "DX": data, **shape}, constexprs))
    return found

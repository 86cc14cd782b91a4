"""Compile variants of triton/adam.py: AdamW and L2 Adam, with and without fp32 masters, lerp
from m (beta1 above 0.5) or from the gradient, aligned or not, over bf16, fp32 and fp16 params
and grads."""
import triton.language as tl

from transformer_engine.pytorch.triton import adam as kernels

_TYPES = {"fp32": tl.float32, "bf16": tl.bfloat16, "fp16": tl.float16}


def variants():
    found = []
    for param, grad, master, adam_w, from_grad, aligned in (
            ("fp32", "fp32", False, True, False, True), ("bf16", "bf16", True, True, False, True),
            ("fp16", "fp32", True, False, True, False), ("bf16", "bf16", False, False, False, False)):
        signature = {"TABLE": "*i64", **{name: "fp32" for name in (
            "inv_grad_scale", "weight_decay", "lerp_weight", "beta2", "one_minus_beta2", "decay",
            "bias_correction2_sqrt", "eps", "neg_step_size")},
            **{name: "constexpr" for name in ("PARAM_TYPE", "GRAD_TYPE", "HAS_MASTER", "ADAM_W", "LERP_FROM_GRAD",
                                              "ALIGNED", "BLOCK")}}
        constexprs = {"PARAM_TYPE": _TYPES[param], "GRAD_TYPE": _TYPES[grad], "HAS_MASTER": master,
                      "ADAM_W": adam_w, "LERP_FROM_GRAD": from_grad, "ALIGNED": aligned, "BLOCK": 2048}
        name = (f"adam[{param},grad={grad},master={master},{'adamw' if adam_w else 'l2'},"
                f"lerp_from={'grad' if from_grad else 'm'},aligned={aligned}]")
        found.append((name, kernels._adam_kernel, signature, constexprs))
    return found

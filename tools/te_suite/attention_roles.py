"""Casts this package's attention backends in the roles TE's attention tests compare.

TE's tests/pytorch/attention files ask `get_attention_backend` which of TE's three backends run
a configuration (the flash-attn package, cuDNN's fused attention, the unfused PyTorch path),
run DotProductAttention once per available backend, choosing it through the NVTE_FLASH_ATTN /
NVTE_FUSED_ATTN / NVTE_UNFUSED_ATTN environment variables, and compare the results. The package
itself reads no environment variable and reports every backend of its own in TE's unfused slot
(dot_product_attention/utils.py), so on its own those tests find one backend and skip.

Under the harness, two independent implementations take the two roles:
  - "FusedAttention" (cuDNN's F16_arbitrary_seqlen): our flash kernel (backends/flash.py);
  - "UnfusedDotProductAttention": our matmul + fused-softmax path (backends/unfused.py).
A call under a per-tensor recipe with fp8_dpa (TE's FP8 attention tests) runs our FP8 attention
(attention/fp8_attention.py) whatever the role: it is reported as cuDNN's FP8 fused backend
(FusedAttnBackend.FP8) where the flash kernel takes the call in high precision, and the unfused
role is left empty for it (it would run the same FP8 kernel).
`install()` answers `get_attention_backend` role by role (each role available when its backend
supports the call and the package runs it at all) and, while a DotProductAttention call runs,
narrows the package's backend preference to the role the tests' variables choose. The
flash-attn role stays empty: no such package is here. A test that names no role (both or
neither variable set) runs the package's own preference order.
"""
import dataclasses
import os
from contextlib import contextmanager

import torch

# Which of our backends (by its `name`) plays each TE role, by TE's environment variable for that role.
_ROLES = {"NVTE_FUSED_ATTN": "flash", "NVTE_UNFUSED_ATTN": "unfused"}


def _chosen_role():
    """The backend name the tests' variables choose, or None when they name no single role."""
    chosen = [name for variable, name in _ROLES.items() if os.environ.get(variable, "1") == "1"]
    return chosen[0] if len(chosen) == 1 else None


@contextmanager
def _preference(selection, backend_name):
    """selection.PREFERENCE narrowed to the backend of that name, for the block."""
    if backend_name is None:
        yield
        return
    saved = selection.PREFERENCE
    selection.PREFERENCE = tuple(b for b in saved if b.name == backend_name)
    try:
        yield
    finally:
        selection.PREFERENCE = saved


def _fp8_attention_call(params) -> bool:
    """Whether `params` describe an FP8 attention call: fp8 with a per-tensor recipe that asks
    for FP8 attention (attention/fp8_attention.py), or FP8 q/k/v (TE's tests ask so for the
    FP8 fused backend before they run a recipe with fp8_dpa)."""
    from transformer_engine.pytorch.attention import fp8_attention
    recipe = params.fp8_meta.get("recipe") if params.fp8 and isinstance(params.fp8_meta, dict) else None
    if recipe is None:
        return params.qkv_dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    return fp8_attention.asked(recipe) and fp8_attention.recipe_refusal(recipe) is None


def install() -> None:
    """Patches the package's get_attention_backend and DotProductAttention.forward for the
    session (before the test modules import them)."""
    from transformer_engine.pytorch.attention.backends import selection
    from transformer_engine.pytorch.attention.dot_product_attention import dot_product_attention, utils
    from transformer_engine.pytorch.cpp_extensions.fused_attn import FusedAttnBackend

    def get_attention_backend(params):
        fp8_call = _fp8_attention_call(params)
        if fp8_call:  # our FP8 attention casts the high-precision inputs itself
            params = dataclasses.replace(params, qkv_dtype=torch.bfloat16, fp8=False)
        with _preference(selection, _ROLES["NVTE_FUSED_ATTN"]):
            fused = not utils.unsupported_reasons(params)
        with _preference(selection, _ROLES["NVTE_UNFUSED_ATTN"]):
            unfused = not utils.unsupported_reasons(params) and not fp8_call
        # TE asks for the FP8 fused backend with NVTE_FUSED_ATTN_BACKEND=2: our FP8 attention.
        fp8_asked = os.environ.get("NVTE_FUSED_ATTN_BACKEND") == str(int(FusedAttnBackend.FP8))
        fused_backend = None
        if fused and fp8_call:
            fused_backend = FusedAttnBackend.FP8
        elif fused and not fp8_asked:
            fused_backend = FusedAttnBackend.F16_arbitrary_seqlen
        use_fused = fused and os.environ.get("NVTE_FUSED_ATTN", "1") == "1"
        use_unfused = unfused and os.environ.get("NVTE_UNFUSED_ATTN", "1") == "1"
        return False, None, use_fused, fused_backend, use_unfused, [False, fused, unfused]

    utils.get_attention_backend = get_attention_backend
    # The query asks the backends about the default device, "cuda" under the mapping, where the
    # tensors are the CPU's: answer for the CPU.
    utils.default_device = lambda: torch.device("cpu")

    forward = dot_product_attention.DotProductAttention.forward

    def forward_in_role(self, *args, **kwargs):
        with _preference(selection, _chosen_role()):
            return forward(self, *args, **kwargs)

    dot_product_attention.DotProductAttention.forward = forward_in_role

"""Small helpers shared by modules and ops, and the ones TransformerEngine's
transformer_engine.pytorch.utils offers user code (initialisers, the attention mask function,
the device's compute capability)."""
import math
from typing import Callable, Optional, Tuple

import torch


def default_device() -> torch.device:
    """The current accelerator (CUDA, MUSA, ...) if one is present, else the CPU.

    TransformerEngine hard-codes "cuda"; modules here default to this instead so the same
    model code runs on a machine without a GPU.
    """
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        return accelerator.current_accelerator()
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_module_input(module: str, arg: str, value: object, min_dim: int = 1) -> None:
    """Refuses what a module cannot compute on, before anything reads its shape: a non-tensor
    (TypeError), a non-floating tensor (TypeError; torch.nn.Linear refuses integer input too,
    where casting the weight to it would give zeros) or one of fewer than min_dim dims
    (ValueError). Only the type, dtype and rank are read, which are static under torch.compile."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{module}: {arg} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{module}: {arg} must be a floating-point tensor, got dtype {value.dtype}")
    if value.dim() < min_dim:
        raise ValueError(f"{module}: {arg} must have at least {min_dim} dimension(s), got shape {tuple(value.shape)}")


def forward_param(module: torch.nn.Module, name: str) -> Optional[torch.Tensor]:
    """module's parameter `name` as a forward reads it: from module._parameters (where
    torch.func.functional_call and FSDP2 put theirs too), without Module.__getattr__'s Python
    fallback, which costs a tenth of a small LayerNorm's time for two parameters; through
    getattr where something else provides it (a parametrization, a hook's plain attribute)."""
    value = module._parameters.get(name)
    return value if value is not None else getattr(module, name)


def init_method_normal(sigma: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """An initialiser drawing from N(0, sigma^2), in place."""
    def init(tensor: torch.Tensor) -> torch.Tensor:
        return torch.nn.init.normal_(tensor, mean=0.0, std=sigma)
    return init


def scaled_init_method_normal(sigma: float, num_layers: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """N(0, (sigma / sqrt(2 num_layers))^2): the output projections' initialiser, scaled by
    depth so that the residual stream's variance stays bounded."""
    return init_method_normal(sigma / math.sqrt(2.0 * num_layers))


def attention_mask_func(attention_scores: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """attention_scores with masked positions (attention_mask True) set to -10000, in place:
    what the unfused softmax paths apply before normalising."""
    return attention_scores.masked_fill_(attention_mask, -10000.0)


def get_device_compute_capability() -> Tuple[int, int]:
    """(major, minor) of the current CUDA or MUSA device; (0, 0) without one. Code that gates
    a GPU feature on it skips that feature on the CPU, where this package runs every recipe
    anyway (te.is_fp8_available() and the like answer for it)."""
    if torch.cuda.is_available():
        return tuple(torch.cuda.get_device_capability())
    if hasattr(torch, "musa") and torch.musa.is_available():
        return tuple(torch.musa.get_device_capability())
    return (0, 0)


def is_bf16_compatible() -> bool:
    """Whether bf16 tensors can be computed with on the current device: always here (the CPU
    computes bf16, widening where it has no bf16 units)."""
    return True


def is_non_tn_fp8_gemm_supported() -> bool:
    """Whether FP8 GEMMs take operands in layouts other than TN: yes (the codes are read
    through their strides, or transposed first)."""
    return True


def gpu_autocast_ctx(enabled: bool = True, dtype: torch.dtype = torch.bfloat16, **kwargs):
    """torch.autocast on the current device (TE's GPU autocast, on whatever device that is)."""
    return torch.autocast(device_type=default_device().type, enabled=enabled, dtype=dtype, **kwargs)


def get_cudnn_version() -> Tuple[int, int, int]:
    """(major, minor, patch) of the cuDNN PyTorch runs with (TE's helper). Attention here does
    not use cuDNN; a machine without it gets a RuntimeError, as TE's helper fails there."""
    encoded = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if encoded is None:
        raise RuntimeError("get_cudnn_version: cuDNN is not available on this machine")
    major, rest = divmod(encoded, 1000 if encoded < 90000 else 10000)  # cuDNN 9 moved to 5 digits
    minor, patch = divmod(rest, 100)
    return major, minor, patch


def _glu_blocks(tensor: torch.Tensor, interleave_size: int, where: str) -> int:
    """The number of gate/linear block pairs along dim 0; ValueError unless they tile it."""
    rows = tensor.shape[0] if tensor.dim() else 0
    if interleave_size <= 0 or rows % (2 * interleave_size):
        raise ValueError(f"{where}: dimension 0 ({rows}) must be a multiple of 2 * interleave_size "
                         f"(interleave_size={interleave_size})")
    return rows // (2 * interleave_size)


def interleave_glu_tensor(tensor: torch.Tensor, interleave_size: int) -> torch.Tensor:
    """A gated fc1 weight or bias in TE's block-interleaved layout along dim 0, from the
    contiguous one: [W_all; V_all] -> [W[0:k]; V[0:k]; W[k:2k]; V[k:2k]; ...] with
    k = interleave_size (the layout of te.ops' glu_interleave_size). A new tensor."""
    blocks = _glu_blocks(tensor, interleave_size, "interleave_glu_tensor")
    halves = tensor.reshape(2, blocks, interleave_size, *tensor.shape[1:])  # [2, blocks, k, ...]
    # One copy: clone lays the transposed blocks out contiguously, and the reshape is then a view.
    return halves.transpose(0, 1).clone(memory_format=torch.contiguous_format).reshape(tensor.shape)


def deinterleave_glu_tensor(tensor: torch.Tensor, interleave_size: int) -> torch.Tensor:
    """The inverse of interleave_glu_tensor: block-interleaved -> [W_all; V_all]. A new tensor."""
    blocks = _glu_blocks(tensor, interleave_size, "deinterleave_glu_tensor")
    pairs = tensor.reshape(blocks, 2, interleave_size, *tensor.shape[1:])  # [blocks, 2, k, ...]
    return pairs.transpose(0, 1).clone(memory_format=torch.contiguous_format).reshape(tensor.shape)

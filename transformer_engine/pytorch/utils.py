"""Small helpers shared by modules and ops."""
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

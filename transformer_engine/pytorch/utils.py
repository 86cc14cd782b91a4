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

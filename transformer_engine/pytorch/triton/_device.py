"""How many programs a kernel that keeps one partial result per program should launch."""
import torch

INTERPRETER_PROGRAMS = 16  # Triton's interpreter runs programs one after another


def resident_programs(device: torch.device, per_multiprocessor: int = 4) -> int:
    """A few programs per multiprocessor on a GPU (CUDA, or MUSA through torch_musa's same
    device-properties API), enough to fill it; INTERPRETER_PROGRAMS on CPU tensors."""
    if device.type in ("cuda", "musa"):
        module = torch.cuda if device.type == "cuda" else torch.musa
        return per_multiprocessor * module.get_device_properties(device).multi_processor_count
    return INTERPRETER_PROGRAMS

"""Backend choice: the first backend, in a fixed preference order, that supports the call."""
from typing import Optional, Sequence

from .base import AttentionBackend, AttentionConfig
from .flash import FlashBackend
from .sdpa import SdpaBackend
from .unfused import UnfusedBackend

# Our flash kernel first (the CPU's, or Triton's on CUDA / MUSA; masks it reads by their
# structure), then PyTorch's SDPA (flash / memory-efficient kernels where the device has them),
# then the matmul + fused-softmax backend.
PREFERENCE = (FlashBackend(), SdpaBackend(), UnfusedBackend())


def select_backend(config: AttentionConfig,
                   backends: Optional[Sequence[AttentionBackend]] = None) -> AttentionBackend:
    """The first of `backends` (default: PREFERENCE, read at call time) whose supports(config)
    is None; RuntimeError listing every backend's reason when none fits."""
    reasons = []
    backends = PREFERENCE if backends is None else backends
    for backend in backends:
        reason = backend.supports(config)
        if reason is None:
            return backend
        reasons.append(f"  {backend.name}: {reason}")
    raise RuntimeError("DotProductAttention: no attention backend supports this call\n" + "\n".join(reasons)
                       + f"\n(call: {config})")

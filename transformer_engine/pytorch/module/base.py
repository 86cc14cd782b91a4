"""The helpers of TE's module base that TE code imports (transformer_engine.pytorch.module.base).

TE's modules share cuBLAS workspaces and a dummy weight-gradient buffer through these. Here
GEMMs need no workspace, so get_workspace hands out an empty byte buffer of the device; the
dummy gradient is a real buffer of the asked shape, kept per (shape, dtype, device) as TE
keeps it, for code that passes it as the gradient of a weight whose gradient was accumulated
elsewhere (fuse_wgrad_accumulation)."""
from typing import Dict, Tuple

import torch

from ..utils import default_device

_dummy_wgrads: Dict[Tuple[tuple, torch.dtype, torch.device], torch.Tensor] = {}


def get_workspace() -> torch.Tensor:
    """An (empty) GEMM workspace on the current device."""
    return torch.empty(0, dtype=torch.uint8, device=default_device())


def get_multi_stream_cublas_workspace() -> list:
    """One workspace per GEMM stream: a single stream here."""
    return [get_workspace()]


def get_dummy_wgrad(shape: list, dtype: torch.dtype, zero: bool = False) -> torch.Tensor:
    """A buffer of `shape` and `dtype` on the current device, shared by every caller asking for
    the same; zeroed when `zero`."""
    key = (tuple(shape), dtype, default_device())
    if key not in _dummy_wgrads:
        _dummy_wgrads[key] = torch.empty(shape, dtype=dtype, device=key[2])
    if zero:
        _dummy_wgrads[key].zero_()
    return _dummy_wgrads[key]

"""The helpers of TE's module base that TE code imports (transformer_engine.pytorch.module.base),
and TransformerEngineBaseModule, the base of a user's own module with FP8 GEMMs.

TE's modules share cuBLAS workspaces and a dummy weight-gradient buffer through these. Here
GEMMs need no workspace, so get_workspace hands out an empty byte buffer of the device; the
dummy gradient is a real buffer of the asked shape, kept per (shape, dtype, device) as TE
keeps it, for code that passes it as the gradient of a weight whose gradient was accumulated
elsewhere (fuse_wgrad_accumulation)."""
from contextlib import contextmanager
from typing import Dict, Iterator, Tuple

import torch

from ..utils import default_device
from ._fp8_module import Fp8ModuleMixin

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


class TransformerEngineBaseModule(Fp8ModuleMixin, torch.nn.Module):
    """TE's base class for a module of one's own whose GEMMs follow te.autocast: it keeps the
    module's FP8 state (fp8_meta, quantizers, checkpointed as extra state) as te.Linear does.
    A forward runs inside `with self.prepare_forward_ctx(inp, num_gemms) as inp:`, which makes
    the state for the autocast region's recipe (3 forward and 2 backward slots per GEMM, in
    TE's FP8FwdTensorIdx / FP8BwdTensorIdx order) and sets `self.fp8`."""

    def __init__(self):
        super().__init__()
        self.fp8_meta = None
        self.fp8 = False

    @contextmanager
    def prepare_forward_ctx(self, inp: torch.Tensor, num_gemms: int = 1,
                            allow_non_contiguous: bool = False) -> Iterator[torch.Tensor]:
        """Yields `inp` (contiguous unless allow_non_contiguous) with the FP8 state of this
        forward in place: under an enabled te.autocast, fp8_meta sized for num_gemms GEMMs
        and self.fp8 True; otherwise self.fp8 False."""
        if not isinstance(num_gemms, int) or num_gemms < 1:
            raise ValueError(f"prepare_forward_ctx: num_gemms must be a positive int, got {num_gemms!r}")
        self.fp8_forward_slots, self.fp8_backward_slots = 3 * num_gemms, 2 * num_gemms
        context = self._fp8_context()
        self.fp8 = context is not None and context.enabled
        if self.fp8:
            self._record_fp8_forward(self._fp8_meta(context, inp.device))
        yield inp if allow_non_contiguous else inp.contiguous()

"""TransformerEngine's multi-tensor helpers (te.optimizers.multi_tensor_applier, multi_tensor_scale,
multi_tensor_scale_tensor, multi_tensor_l2norm, multi_tensor_unscale_l2norm, and the FP8 scale
computations multi_tensor_compute_scale_and_scale_inv / _inv_e8m0), the apex amp_C interface that Megatron-Core's
gradient clipping and mixed-precision optimizer call:

    multi_tensor_applier(op, noop_flag, tensor_lists, *args) == op(chunk_size, noop_flag, tensor_lists, *args)

noop_flag is an int32 tensor [1] that an op sets to 1 when it meets a non-finite value (the
overflow check of loss scaling) and never clears. Each op runs as one torch._foreach call per
list on the tensors' device: chunk_size, how TE's CUDA kernels split tensors into blocks, would
not change any result and is not used.
"""
import math
from typing import List, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..scaling import FLT_MAX, e8m0_exponent, round_down_to_power_of_2


class MultiTensorApply:
    """Calls op(chunk_size, noop_flag, tensor_lists, *args)."""

    def __init__(self, chunk_size: int):
        if not isinstance(chunk_size, int) or chunk_size <= 0:
            raise ValueError(f"MultiTensorApply: chunk_size must be a positive int, got {chunk_size!r}")
        self.chunk_size = chunk_size

    def __call__(self, op, noop_flag: Tensor, tensor_lists: Sequence[List[Tensor]], *args):
        return op(self.chunk_size, noop_flag, tensor_lists, *args)


multi_tensor_applier = MultiTensorApply(2048 * 32)  # TE's chunk size


def _check_lists(op: str, noop_flag: Tensor, tensor_lists: Sequence[List[Tensor]], count: int) -> None:
    if not isinstance(noop_flag, Tensor) or noop_flag.numel() != 1:
        raise ValueError(f"{op}: noop_flag must be a one-element tensor, got "
                         f"{tuple(noop_flag.shape) if isinstance(noop_flag, Tensor) else type(noop_flag).__name__}")
    if len(tensor_lists) != count:
        raise ValueError(f"{op}: tensor_lists must hold {count} lists, got {len(tensor_lists)}")
    lengths = [len(tensors) for tensors in tensor_lists]
    if len(set(lengths)) > 1:
        raise ValueError(f"{op}: the lists in tensor_lists differ in length: {lengths}")
    for i, tensors in enumerate(zip(*tensor_lists)):
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) > 1:
            raise ValueError(f"{op}: tensor {i} has different shapes in the lists: {sorted(shapes)}")


def _flag_non_finite(noop_flag: Tensor, magnitudes: List[Tensor]) -> None:
    """noop_flag := 1 when a magnitude (a per-tensor max |x| or norm) is inf or NaN; no host sync."""
    if magnitudes:
        bad = ~torch.isfinite(torch.stack(magnitudes)).all()
        noop_flag.copy_(torch.where(bad.to(noop_flag.device), torch.ones_like(noop_flag), noop_flag))


def _scale(op: str, noop_flag: Tensor, tensor_lists: Sequence[List[Tensor]], scale: Union[float, Tensor]) -> None:
    _check_lists(op, noop_flag, tensor_lists, 2)
    sources, destinations = tensor_lists
    if not sources:
        return
    # Products in fp32 whatever the dtypes (fp32 main params -> bf16 model params is the
    # common copy), one rounding to the destination's dtype.
    wide = [t.float() for t in sources]
    nonempty = [t for t in wide if t.numel()]  # the max norm of an empty tensor is undefined
    _flag_non_finite(noop_flag, list(torch._foreach_norm(nonempty, math.inf)) if nonempty else [])
    products = torch._foreach_mul(wide, scale.float() if isinstance(scale, Tensor) else float(scale))
    torch._foreach_copy_(list(destinations), products)


def multi_tensor_scale(chunk_size: int, noop_flag: Tensor, tensor_lists: Sequence[List[Tensor]],
                       scale: float) -> None:
    """tensor_lists = [sources, destinations]: destination := source * scale (computed in fp32,
    rounded to the destination's dtype); noop_flag := 1 if a source holds inf or NaN."""
    _scale("multi_tensor_scale", noop_flag, tensor_lists, scale)


def multi_tensor_scale_tensor(chunk_size: int, noop_flag: Tensor, tensor_lists: Sequence[List[Tensor]],
                              scale: Tensor) -> None:
    """multi_tensor_scale with the scale a one-element tensor (read on the device, no host sync)."""
    if not isinstance(scale, Tensor) or scale.numel() != 1:
        raise ValueError("multi_tensor_scale_tensor: scale must be a one-element tensor, got "
                         f"{tuple(scale.shape) if isinstance(scale, Tensor) else type(scale).__name__}")
    _scale("multi_tensor_scale_tensor", noop_flag, tensor_lists, scale.reshape(()))


def multi_tensor_l2norm(chunk_size: int, noop_flag: Tensor, tensor_lists: Sequence[List[Tensor]],
                        per_tensor: bool = False) -> Tuple[Tensor, Tensor]:
    """tensor_lists = [tensors]: (the l2 norm of all of them together, fp32 [1]; the norm of each,
    fp32 [len(tensors)] when per_tensor, else an empty tensor). Norms are summed in fp32;
    noop_flag := 1 if the total is inf or NaN."""
    _check_lists("multi_tensor_l2norm", noop_flag, tensor_lists, 1)
    tensors = list(tensor_lists[0])
    device = tensors[0].device if tensors else noop_flag.device
    if not tensors:
        return torch.zeros(1, dtype=torch.float32, device=device), torch.empty(0, dtype=torch.float32, device=device)
    norms = torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32))
    total = torch.linalg.vector_norm(norms).reshape(1)
    _flag_non_finite(noop_flag, [total])
    return total, norms if per_tensor else torch.empty(0, dtype=torch.float32, device=device)


def multi_tensor_unscale_l2norm(chunk_size: int, noop_flag: Tensor, tensor_lists: Sequence[List[Tensor]],
                                inv_scale: Tensor, per_tensor: bool = False) -> Tuple[Tensor, Tensor]:
    """multi_tensor_l2norm of the tensors times inv_scale (a one-element tensor; the loss scale's
    inverse), each product formed in fp32."""
    if not isinstance(inv_scale, Tensor) or inv_scale.numel() != 1:
        raise ValueError("multi_tensor_unscale_l2norm: inv_scale must be a one-element tensor, got "
                         f"{tuple(inv_scale.shape) if isinstance(inv_scale, Tensor) else type(inv_scale).__name__}")
    _check_lists("multi_tensor_unscale_l2norm", noop_flag, tensor_lists, 1)
    unscaled = torch._foreach_mul([t.float() for t in tensor_lists[0]], inv_scale.float().reshape(()))
    return multi_tensor_l2norm(chunk_size, noop_flag, [unscaled], per_tensor)


def multi_tensor_compute_scale_and_scale_inv(chunk_size: int, noop_flag: Tensor,
                                             tensor_lists: Sequence[List[Tensor]], max_fp8: float,
                                             force_pow_2_scales: bool = False, epsilon: float = 0.0) -> None:
    """tensor_lists = [amaxes, scales, scale_invs] (fp32): scale := max_fp8 / max(amax, epsilon)
    (FLT_MAX where that overflows; rounded down to a power of two with force_pow_2_scales; 1
    where amax is 0), scale_inv := 1 / scale, as TE's current-scaling kernels derive them."""
    _check_lists("multi_tensor_compute_scale_and_scale_inv", noop_flag, tensor_lists, 3)
    for amax, scale, scale_inv in zip(*tensor_lists):
        bounded = torch.clamp_min(amax.float(), epsilon)
        # Tensor / tensor: correctly rounded (a float / tensor multiplies by the reciprocal).
        quotient = torch.full_like(bounded, max_fp8) / bounded
        quotient = torch.where(torch.isinf(quotient), torch.full_like(quotient, FLT_MAX), quotient)
        if force_pow_2_scales:
            quotient = round_down_to_power_of_2(quotient)
        quotient = torch.where(bounded == 0, torch.ones_like(quotient), quotient)
        scale.copy_(quotient)
        scale_inv.copy_(torch.reciprocal(quotient))


def multi_tensor_compute_scale_inv_e8m0(chunk_size: int, noop_flag, tensor_lists: Sequence[List[Tensor]]) -> None:
    """tensor_lists = [amaxes, scale_invs (uint8)]: each MXFP8 block's E8M0 exponent of
    amax / 448 (E4M3's largest), rounded up. noop_flag is not read (TE passes None)."""
    if len(tensor_lists) != 2 or len(tensor_lists[0]) != len(tensor_lists[1]):
        raise ValueError("multi_tensor_compute_scale_inv_e8m0: tensor_lists must be [amaxes, scale_invs] of "
                         "equal length")
    e4m3_max = torch.finfo(torch.float8_e4m3fn).max
    for amax, scale_inv in zip(*tensor_lists):
        scale_inv.copy_(e8m0_exponent(amax.float(), e4m3_max))

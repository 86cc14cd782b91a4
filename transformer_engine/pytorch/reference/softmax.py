"""The attention-softmax ops with their exact signatures and semantics, in plain PyTorch.

input [b, h, sq, sk] (or [b*h, sq, sk]); math in float32 (float64 for float64 input);
outputs rounded once to the input dtype.
    logits  z = scale * input
    'padding'              z = -10000 where mask (bool, [b|1, h|1, sq|1, sk]) is True, as TE
                           does: a fully masked row comes out uniform, 1/sk
    'causal'               keys j > i dropped (output exactly 0); sq == sk
    'causal_bottom_right'  keys j > i + (sk - sq) dropped; a row with no key left is all 0
    output = softmax(z) over the last dim.
The backward is the exact gradient: dx = scale * y * (dy - sum(dy * y)), and 0 wherever
input does not reach the output (masked or dropped positions).
"""
from typing import Optional

import torch
from torch import Tensor

MASKED_LOGIT = -10000.0
MASK_TYPES = ("none", "padding", "causal", "causal_bottom_right")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _dropped(mask_type: str, sq: int, sk: int, device: torch.device) -> Optional[Tensor]:
    """[sq, sk] bool, True where a causal mask drops the key; None for the other kinds."""
    if mask_type not in ("causal", "causal_bottom_right"):
        return None
    offset = sk - sq if mask_type == "causal_bottom_right" else 0
    query = torch.arange(sq, device=device).unsqueeze(-1)
    key = torch.arange(sk, device=device)
    return key > query + offset


def scaled_softmax_fwd(input: Tensor, mask: Optional[Tensor], scale: float, mask_type: str) -> Tensor:
    """Differentiable: autograd through it gives the gradient scaled_softmax_bwd computes."""
    z = input.to(_acc_dtype(input.dtype)) * scale
    if mask_type == "padding":
        z = z.masked_fill(mask, MASKED_LOGIT)
    dropped = _dropped(mask_type, input.shape[-2], input.shape[-1], input.device)
    if dropped is not None:
        z = z.masked_fill(dropped, float("-inf"))
    y = torch.softmax(z, dim=-1)
    if dropped is not None:
        y = y.masked_fill(dropped, 0.0)  # rows with every key dropped: NaN -> 0
    return y.to(input.dtype)


def scaled_softmax_bwd(grad_output: Tensor, output: Tensor, mask: Optional[Tensor], scale: float,
                       mask_type: str) -> Tensor:
    acc = _acc_dtype(output.dtype)
    y, dy = output.to(acc), grad_output.to(acc)
    dx = scale * y * (dy - (dy * y).sum(dim=-1, keepdim=True))
    if mask_type == "padding":
        dx = dx.masked_fill(mask, 0.0)
    dropped = _dropped(mask_type, output.shape[-2], output.shape[-1], output.device)
    if dropped is not None:
        dx = dx.masked_fill(dropped, 0.0)
    return dx.to(output.dtype)

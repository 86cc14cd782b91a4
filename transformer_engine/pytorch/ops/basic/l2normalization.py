"""te.ops.L2Normalization: y = x / sqrt(sum(x^2) + eps) over the last dimension (attention's
qk_norm_type="L2Normalization"); no parameters. Computed in fp32, one rounding."""
from typing import Optional

import torch
from torch import Tensor

from ...utils import check_module_input
from ..op import BasicOperation


class L2Normalization(BasicOperation):
    def __init__(self, *, eps: float = 1e-6, seq_length: Optional[int] = None,
                 micro_batch_size: Optional[int] = None) -> None:
        super().__init__()
        if eps < 0:
            raise ValueError(f"L2Normalization: eps must be >= 0, got {eps}")
        self.eps = float(eps)

    def forward(self, x: Tensor) -> Tensor:
        check_module_input("L2Normalization", "x", x)
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.square().sum(dim=-1, keepdim=True) + self.eps)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"

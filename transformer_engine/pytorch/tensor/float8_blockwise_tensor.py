"""Float8BlockScaling's tensors: Float8BlockQuantizer casts in 1 x 128 blocks (block_scaling_dim=1;
the column-wise copy in 128 x 1) or 128 x 128 blocks (2, both usages), one fp32 scale per block
(a power of two with force_pow_2_scales), into a Float8BlockwiseQTensor."""
from typing import Union

import torch

from ..constants import DType
from ..fp8.block_tensor import BlockLayout
from ._block import BlockQuantizer, BlockScaledTensor
from .quantizer import fp8_torch_dtype


class Float8BlockwiseQTensor(BlockScaledTensor):
    """A tensor stored in Float8BlockScaling's blocks (see BlockScaledTensor for its attributes)."""

    @property
    def _is_2D_scaled(self) -> bool:
        return self._storage.operand.stored.block == (128, 128)


class Float8BlockQuantizer(BlockQuantizer):
    tensor_class = Float8BlockwiseQTensor

    def __init__(self, fp8_dtype: Union[DType, torch.dtype], *, rowwise: bool = True, columnwise: bool = True,
                 amax_epsilon: float = 0.0, force_pow_2_scales: bool = True, block_scaling_dim: int = 2,
                 all_gather_usage: bool = False) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.fp8_dtype = fp8_torch_dtype(fp8_dtype, "Float8BlockQuantizer")
        if block_scaling_dim not in (1, 2):
            raise ValueError(f"Float8BlockQuantizer: block_scaling_dim must be 1 or 2, got {block_scaling_dim}")
        if amax_epsilon < 0:
            raise ValueError(f"Float8BlockQuantizer: amax_epsilon must be >= 0, got {amax_epsilon}")
        self.amax_epsilon = float(amax_epsilon)
        self.force_pow_2_scales = force_pow_2_scales
        self.block_scaling_dim = block_scaling_dim
        self.all_gather_usage = all_gather_usage

    def serves(self, recipe) -> bool:
        return recipe.float8_block_scaling()

    @property
    def block_layout(self) -> BlockLayout:
        mode = "pow2" if self.force_pow_2_scales else "fp32"
        if self.block_scaling_dim == 2:
            return BlockLayout((128, 128), (128, 128), mode, self.amax_epsilon)
        return BlockLayout((1, 128), (128, 1), mode, self.amax_epsilon)

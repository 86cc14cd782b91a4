"""te.LayerNorm: TransformerEngine's LayerNorm module on the fused norm op."""
from typing import Iterable, Optional, Union

import torch

from ..custom_ops.norm import layernorm
from ..utils import forward_param
from ._norm_common import NormModule, resolve_normalized_shape


class LayerNorm(NormModule):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the trailing `normalized_shape`.

    Args (TransformerEngine's names and defaults):
        normalized_shape: int or tuple; the trailing dims to normalise over.
        eps: added to the variance.
        sequence_parallel: recorded on the parameters (attribute `sequence_parallel`) for
            tensor-parallel gradient reduction by the caller, as in TransformerEngine.
        params_dtype: dtype of weight and bias (default: torch.get_default_dtype()); may
            differ from the input's, the output takes the input's dtype.
        zero_centered_gamma: weight is stored around 0 (initialised to 0) and the output
            uses (1 + weight), which keeps weight decay from pulling the scale to 0.
        device: default: the current accelerator if one is present, else the CPU.
        sm_margin: GPU SMs TransformerEngine leaves free for communication; accepted for
            compatibility, it changes nothing here.
        hidden_size: TransformerEngine 1.x's name for an int normalized_shape (deprecated).
    Parameters: weight [*normalized_shape], bias [*normalized_shape].
    Statistics are computed in fp32 (fp64 for fp64 input).
    """

    def __init__(self, normalized_shape: Union[int, Iterable[int], None] = None, eps: float = 1e-5,
                 sequence_parallel: Optional[bool] = None, params_dtype: Optional[torch.dtype] = None,
                 zero_centered_gamma: bool = False, device: Optional[Union[torch.device, str]] = None,
                 sm_margin: int = 0, *, hidden_size: Optional[int] = None):
        super().__init__(resolve_normalized_shape(normalized_shape, hidden_size), eps, sequence_parallel, params_dtype, zero_centered_gamma, device,
                         sm_margin, with_bias=True)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x = self.norm_input(inp)
        y = layernorm(x, self.flat(forward_param(self, "weight")), self.flat(forward_param(self, "bias")), self.eps, self.zero_centered_gamma)
        return y if x is inp else y.view(inp.shape)

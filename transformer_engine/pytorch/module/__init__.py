"""nn.Modules with TransformerEngine's arguments and parameter names, composed from ops."""
from .fp8_padding import Fp8Padding, Fp8Unpadding
from .grouped_linear import GroupedLinear, is_module_grouped_tensor_path_supported
from .layernorm import LayerNorm
from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import LayerNormMLP
from .linear import Linear
from .rmsnorm import RMSNorm

__all__ = ["Fp8Padding", "Fp8Unpadding", "GroupedLinear", "LayerNorm", "LayerNormLinear", "LayerNormMLP", "Linear",
           "RMSNorm", "is_module_grouped_tensor_path_supported"]

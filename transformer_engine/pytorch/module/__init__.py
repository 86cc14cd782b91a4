"""nn.Modules with TransformerEngine's arguments and parameter names, composed from ops."""
from .fp8_padding import Fp8Padding, Fp8Unpadding
from .grouped_linear import GroupedLinear
from .layernorm import LayerNorm
from .linear import Linear
from .rmsnorm import RMSNorm

__all__ = ["LayerNorm", "Linear", "RMSNorm", "GroupedLinear", "Fp8Padding", "Fp8Unpadding"]

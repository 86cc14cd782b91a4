"""nn.Modules with TransformerEngine's arguments and parameter names, composed from ops."""
from .layernorm import LayerNorm
from .linear import Linear
from .rmsnorm import RMSNorm

__all__ = ["LayerNorm", "Linear", "RMSNorm"]

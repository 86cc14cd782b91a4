"""DotProductAttention (dot_product_attention.py) and TE's backend-selection interface over this
package's backends (utils.py)."""
from .dot_product_attention import DotProductAttention
from .utils import _attention_backends  # noqa: F401  (TE code imports it from here)

__all__ = ["DotProductAttention"]

"""What TransformerEngine's custom-recipe references share (transformer_engine.pytorch.custom_recipes.utils)."""
import enum


class Fp4Formats(enum.Enum):
    """The 4-bit formats a reference quantizer can produce (TE's names)."""
    E2M1 = "e2m1"


def roundup_div(x: int, y: int) -> int:
    """ceil(x / y) for non-negative x and positive y."""
    return -(-x // y)

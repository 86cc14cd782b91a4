"""What TransformerEngine's custom-recipe references share (TE main's custom_recipes.reference_utils; TE 2.18
names the module custom_recipes.utils, which re-exports this one)."""
import enum

import torch

HIGH_PRECISION_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class Fp4Formats(enum.Enum):
    """The 4-bit formats a reference quantizer can produce (TE's names)."""
    E2M1 = "e2m1"


def roundup_div(x: int, y: int) -> int:
    """ceil(x / y) for non-negative x and positive y."""
    return -(-x // y)

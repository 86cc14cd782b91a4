"""TransformerEngine's reference NVFP4 factories: refused, this package has no FP4 casts."""
from typing import Optional

from ..quantization import QuantizerRole
from ..tensor.nvfp4_tensor import NVFP4_NOT_IMPLEMENTED


def nvfp4_ref_rht_2d_quantizer_factory(role: Optional[QuantizerRole]):
    """NVFP4 with the random Hadamard transform and 16 x 16 weight blocks: refused."""
    raise NotImplementedError(f"nvfp4_ref_rht_2d_quantizer_factory: {NVFP4_NOT_IMPLEMENTED}")

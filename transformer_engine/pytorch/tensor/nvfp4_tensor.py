"""NVFP4 (4-bit E2M1 with FP8 block scales): not implemented here. The names exist so that code
importing them loads; constructing either raises NotImplementedError, as te.autocast does for
the NVFP4BlockScaling recipe (te.is_nvfp4_available() answers False)."""
from ..fp8.quantized_tensor import QuantizedTensor
from .quantizer import Quantizer

NVFP4_NOT_IMPLEMENTED = "NVFP4 is not implemented in this package (te.is_nvfp4_available() is False)"


class NVFP4Tensor(QuantizedTensor):
    def __new__(cls, *args, **kwargs):
        raise NotImplementedError(f"NVFP4Tensor: {NVFP4_NOT_IMPLEMENTED}")


class NVFP4Quantizer(Quantizer):
    def __init__(self, *args, **kwargs) -> None:
        raise NotImplementedError(f"NVFP4Quantizer: {NVFP4_NOT_IMPLEMENTED}")

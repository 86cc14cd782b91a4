"""TransformerEngine's module paths of its quantized-tensor storage classes
(transformer_engine.pytorch.tensor.storage.*). Each storage name is its tensor class here
(tensor/__init__.py says why); one module per TE module, so that TE code importing from
those paths finds them."""
from .float8_tensor_storage import Float8TensorStorage
from .mxfp8_tensor_storage import MXFP8TensorStorage
from .float8_blockwise_tensor_storage import Float8BlockwiseQTensorStorage
from .nvfp4_tensor_storage import NVFP4TensorStorage

__all__ = ["Float8TensorStorage", "MXFP8TensorStorage", "Float8BlockwiseQTensorStorage", "NVFP4TensorStorage"]

"""TransformerEngine's dtype enum (te.DType, its transformer_engine_torch.DType) and its
mappings from and to torch dtypes (TE_DType, TE_DType_To_Torch), for code that names tensor types
the TE way; and the indices of a module's FP8 slots (FP8FwdTensorIdx, FP8BwdTensorIdx, which
transformer_engine_torch calls FP8FwdTensors / FP8BwdTensors)."""
import enum
from typing import Dict

import torch


class FP8FwdTensorIdx(enum.IntEnum):
    """The forward FP8 slots of a module: (input, weight, output) per GEMM."""
    GEMM1_INPUT = 0
    GEMM1_WEIGHT = 1
    GEMM1_OUTPUT = 2
    GEMM2_INPUT = 3
    GEMM2_WEIGHT = 4
    GEMM2_OUTPUT = 5
    GEMM3_INPUT = 6
    GEMM3_WEIGHT = 7
    GEMM3_OUTPUT = 8


class FP8BwdTensorIdx(enum.IntEnum):
    """The backward FP8 slots of a module: (grad_output, grad_input) per GEMM."""
    GRAD_OUTPUT1 = 0
    GRAD_INPUT1 = 1
    GRAD_OUTPUT2 = 2
    GRAD_INPUT2 = 3
    GRAD_OUTPUT3 = 4
    GRAD_INPUT3 = 5


class DType(enum.IntEnum):
    kByte = 0
    kInt32 = 2
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat8E8M0 = 9
    kFloat4E2M1 = 10

    def to_torch(self) -> torch.dtype:
        return _TORCH[self]

    @classmethod
    def of_torch(cls, dtype: torch.dtype) -> "DType":
        if dtype not in TE_DType:
            raise ValueError(f"DType.of_torch: no TransformerEngine dtype for {dtype}")
        return TE_DType[dtype]


_TORCH = {DType.kByte: torch.uint8, DType.kInt32: torch.int32, DType.kFloat32: torch.float32,
          DType.kFloat16: torch.float16, DType.kBFloat16: torch.bfloat16, DType.kFloat8E4M3: torch.float8_e4m3fn,
          DType.kFloat8E5M2: torch.float8_e5m2, DType.kFloat8E8M0: torch.float8_e8m0fnu,
          DType.kFloat4E2M1: torch.float4_e2m1fn_x2}
TE_DType: Dict[torch.dtype, DType] = {dtype: te_dtype for te_dtype, dtype in _TORCH.items()}
TE_DType_To_Torch: Dict[DType, torch.dtype] = dict(_TORCH)

# The names TE's code and tests read besides the dtypes (their values are TE's).
AttnTypes = ("self", "cross")
AttnBiasTypes = ("pre_scale_bias", "post_scale_bias", "no_bias", "alibi")
LayerTypes = ("encoder", "decoder")
GemmParallelModes = ("row", "column", None)
dist_group_type = torch.distributed.ProcessGroup
MXFP8_BLOCK_SCALING_SIZE = 32  # elements per MXFP8 scale block (1 x 32)
NVFP4_BLOCK_SCALING_SIZE = 16  # elements per NVFP4 scale block (1 x 16)

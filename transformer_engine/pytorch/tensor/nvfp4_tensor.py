"""NVFP4BlockScaling's tensors: NVFP4Quantizer casts a tensor's 2-D matrix to E2M1 codes with
E4M3 scales per 16 values (or per 16 x 16 tile for weights) and an fp32 amax, row-wise and, for
the GEMM contracting the rows, column-wise (the transpose's codes, after the random Hadamard
transform where asked), into an NVFP4Tensor (fp8/nvfp4_operand.py; the numerics in
reference/nvfp4.py). TE's arguments, its 4over6 and row-scaled variants included.
"""
import dataclasses
import math
from typing import Hashable, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor

from ..constants import DType
from ..fp8.nvfp4_operand import KERNELS, Nvfp4Cast, Nvfp4Pair, Nvfp4Usage
from ..fp8.quantized_tensor import QuantizedTensor, _Storage
from ..reference.nvfp4 import RHT_SIGNS
from ._usages import HeldUsages
from .fsdp2 import Fsdp2AllGather
from .nvfp4_buffers import operand_from_buffers
from .quantizer import Quantizer

BLOCK = 16


def unsigned_for_rht(matrix: Tensor) -> Tensor:
    """matrix [rows, cols] with each row multiplied by TE's transform sign of its place in its
    block of 16 rows (exact): the signed transform of the transpose of this is the plain
    Hadamard transform of matrix^T (the signs square to 1), TE's with_random_sign_mask=False."""
    signs = torch.tensor(RHT_SIGNS, dtype=matrix.dtype, device=matrix.device)
    rows = matrix.shape[0]
    if rows % BLOCK:
        raise ValueError(f"NVFP4Quantizer: the Hadamard transform runs over blocks of {BLOCK} rows, got {rows} rows")
    return (matrix.reshape(rows // BLOCK, BLOCK, -1) * signs.view(1, BLOCK, 1)).reshape(matrix.shape)  # [rows, cols]


def _usage_field(usage: str, field: str) -> property:
    """A read-only attribute of TE's: `field` of the usage held (None where not cast)."""
    def read(self) -> Optional[Tensor]:
        held = getattr(self._storage.operand, usage)
        return None if held is None else getattr(held, field)
    return property(read)


def _codes_field(usage: str) -> property:
    """TE's _rowwise_data / _columnwise_data: the usage's codes (None where not cast). Set to
    None (CPU offloading), the usage is dropped with its scales and amax, the shape kept; set to
    codes, they replace the held ones (uint8, the held codes' shape)."""
    def write(self, codes: Optional[Tensor]) -> None:
        operand = self._storage.operand
        held = getattr(operand, usage)
        if codes is None:
            setattr(operand, usage, None)
            return
        name = f"NVFP4Tensor._{usage}_data"
        if held is None:
            raise RuntimeError(f"{name}: no {usage} usage is held to take these codes (quantize with {usage}=True)")
        if codes.dtype != torch.uint8 or codes.shape != held.data.shape:
            raise ValueError(f"{name}: codes must be uint8 {tuple(held.data.shape)} (two a byte), got "
                             f"{codes.dtype} {tuple(codes.shape)}")
        setattr(operand, usage, dataclasses.replace(held, data=codes))
    return _usage_field(usage, "data").setter(write)


def te_padded_scales(scales: Tensor) -> Tensor:
    """E4M3 scales [rows, blocks] as TE stores them: their bytes in [rows rounded up to 128,
    blocks rounded up to 4] (the GEMM's swizzle tiles), zeros in the padding."""
    rows, blocks = scales.shape
    padded = scales.new_zeros((-(-rows // 128) * 128, -(-blocks // 4) * 4), dtype=torch.uint8)
    padded[:rows, :blocks] = scales.view(torch.uint8)
    return padded


def _scales_field(usage: str) -> property:
    """A read-only attribute of TE's: the usage's scales in TE's padded layout (None where not cast)."""
    def read(self) -> Optional[Tensor]:
        held = getattr(self._storage.operand, usage)
        return None if held is None else te_padded_scales(held.scales)
    return property(read)


class NVFP4Tensor(HeldUsages, Fsdp2AllGather, QuantizedTensor):
    """TE's attributes of an NVFP4 tensor: _rowwise_data uint8 [rows, cols / 2] (two codes a
    byte), _rowwise_scale_inv uint8 (the E4M3 scales' bytes [rows, cols / 16] in TE's layout,
    padded with zeros to [rows rounded up to 128, cols / 16 rounded up to 4]), _amax_rowwise
    fp32 [1] ([rows] when row-scaled); the _columnwise_* ones of the transpose [cols, rows];
    None where the usage was not cast; and how it was cast (_row_scaled_nvfp4,
    _nvfp4_use_4over6, _nvfp4_e4m3_max). get_data_tensors() gives the two usages' codes."""

    def __new__(cls, *args, rowwise_data: Optional[Tensor] = None, rowwise_scale_inv: Optional[Tensor] = None,
                columnwise_data: Optional[Tensor] = None, columnwise_scale_inv: Optional[Tensor] = None,
                amax_rowwise: Optional[Tensor] = None, amax_columnwise: Optional[Tensor] = None,
                fp4_dtype: DType = DType.kFloat4E2M1, quantizer: Optional[Quantizer] = None,
                with_gemm_swizzled_scales: bool = False, row_scaled_nvfp4: bool = False,
                nvfp4_use_4over6: bool = False, nvfp4_e4m3_max: int = 448, fake_dtype: Optional[torch.dtype] = None,
                requires_grad: bool = False):
        """TE's constructors from raw buffers: NVFP4Tensor(shape, dtype, rowwise_data=..., ...) and
        NVFP4TensorStorage(rowwise_data=..., ..., fake_dtype=...) (tensor/nvfp4_buffers.py checks
        them). Writes re-quantise with `quantizer` (default: an NVFP4Quantizer of these usages)."""
        if len(args) not in (0, 2):
            raise TypeError(f"NVFP4Tensor: positional arguments are (shape, dtype), got {len(args)} of them")
        if with_gemm_swizzled_scales:
            raise ValueError("NVFP4Tensor: with_gemm_swizzled_scales=True: the scales must be in TE's unswizzled "
                             "layout (this package's GEMMs read them so)")
        if DType(fp4_dtype) != DType.kFloat4E2M1:
            raise ValueError(f"NVFP4Tensor: fp4_dtype must be kFloat4E2M1, got {fp4_dtype}")
        shape = torch.Size(args[0]) if args else None
        dtype = args[1] if args else (fake_dtype or torch.float32)
        operand = operand_from_buffers(shape, rowwise_data, rowwise_scale_inv, amax_rowwise, columnwise_data,
                                       columnwise_scale_inv, amax_columnwise, row_scaled_nvfp4, nvfp4_e4m3_max)
        if quantizer is None:
            quantizer = NVFP4Quantizer(rowwise=operand.rowwise is not None, columnwise=operand.columnwise is not None,
                                       row_scaled_nvfp4=row_scaled_nvfp4, nvfp4_use_4over6=nvfp4_use_4over6,
                                       nvfp4_e4m3_max=nvfp4_e4m3_max)
        return cls._over(_Storage(operand, quantizer, shape if shape is not None else operand.shape), dtype,
                         requires_grad)

    def get_metadata(self) -> dict:
        """TE's: the buffers and flags NVFP4TensorStorage(**metadata) rebuilds this tensor's
        codes from (the matrix's shape aside: the codes give its width, rounded up to even)."""
        return {"rowwise_data": self._rowwise_data, "rowwise_scale_inv": self._rowwise_scale_inv,
                "columnwise_data": self._columnwise_data, "columnwise_scale_inv": self._columnwise_scale_inv,
                "amax_rowwise": self._amax_rowwise, "amax_columnwise": self._amax_columnwise,
                "fp4_dtype": self._fp4_dtype, "quantizer": self._quantizer,
                "with_gemm_swizzled_scales": self._with_gemm_swizzled_scales,
                "row_scaled_nvfp4": self._row_scaled_nvfp4, "nvfp4_use_4over6": self._nvfp4_use_4over6,
                "nvfp4_e4m3_max": self._nvfp4_e4m3_max, "fake_dtype": self.dtype}

    _rowwise_data = _codes_field("rowwise")
    _rowwise_scale_inv = _scales_field("rowwise")
    _amax_rowwise = _usage_field("rowwise", "amax")
    _columnwise_data = _codes_field("columnwise")
    _columnwise_scale_inv = _scales_field("columnwise")
    _amax_columnwise = _usage_field("columnwise", "amax")

    @property
    def _fp4_dtype(self) -> DType:
        return DType.kFloat4E2M1

    @property
    def _with_gemm_swizzled_scales(self) -> bool:
        return False

    @property
    def _row_scaled_nvfp4(self) -> bool:
        return self._storage.operand.stored.row_scaled

    @property
    def _nvfp4_e4m3_max(self) -> int:
        return self._storage.operand.stored.e4m3_max

    @property
    def _nvfp4_use_4over6(self) -> bool:
        return self._storage.quantizer.nvfp4_use_4over6

    @property
    def _quantizer(self) -> Quantizer:
        return self._storage.quantizer



class NVFP4Quantizer(Quantizer):
    """TE's NVFP4Quantizer. with_rht: the column-wise usage casts the random Hadamard transform
    of the values (the weight-gradient GEMM's operands; both of them transformed, the product
    is unchanged), with TE's fixed signs or, with_random_sign_mask=False, none;
    with_post_rht_amax: its amax is the transformed values'; with_2d_quantization:
    16 x 16 tiles (weights); stochastic_rounding: each cast draws a Philox key from torch's
    default generator (reproducible under torch.manual_seed); with_amax_reduction: the amaxes
    are reduced (max) over amax_reduction_group before the cast.

    row_scaled_nvfp4: one amax per row of the matrix (each row's own global scale; 1 x 16
    blocks; the row-wise usage required), and, as TE main, the column-wise usage row-scaled too:
    one amax per row of the transpose (per column of the matrix), after the transform where it
    applies; nvfp4_use_4over6: each block cast with its largest value on the
    code 6 and on the code 4, keeping the one with the smaller error (nvfp4_4over6_err_mode
    'MAE' or 'MSE'; nvfp4_4over6_err_use_fast_math: the error measured scaled by the global
    scale, as TE's fast-math kernel does, which TE switches by an environment variable that this
    package does not read), with the global scale bound by nvfp4_e4m3_max (448, or 256; 448
    without 4over6, as TE)."""
    tensor_class = NVFP4Tensor
    casts = KERNELS  # the ops' kernels (custom_recipes' reference quantizer: plain PyTorch)

    def __init__(self, fp4_dtype: Union[DType, torch.dtype] = DType.kFloat4E2M1, rowwise: bool = True,
                 columnwise: bool = True, with_amax_reduction: bool = False, amax_reduction_group=None,
                 with_rht: bool = False, with_post_rht_amax: bool = False, with_2d_quantization: bool = False,
                 stochastic_rounding: bool = False, row_scaled_nvfp4: bool = False, nvfp4_use_4over6: bool = False,
                 nvfp4_e4m3_max: int = 448, nvfp4_4over6_err_mode: str = "MAE",
                 with_random_sign_mask: bool = True, nvfp4_4over6_err_use_fast_math: bool = False) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        if fp4_dtype not in (DType.kFloat4E2M1, torch.float4_e2m1fn_x2):
            raise ValueError(f"NVFP4Quantizer: fp4_dtype must be te.DType.kFloat4E2M1, got {fp4_dtype!r}")
        if nvfp4_e4m3_max not in (448, 256):
            raise ValueError(f"NVFP4Quantizer: nvfp4_e4m3_max must be 448 or 256, got {nvfp4_e4m3_max!r}")
        err_mode = str(nvfp4_4over6_err_mode).upper()
        if err_mode not in ("MAE", "MSE"):
            raise ValueError(f"NVFP4Quantizer: nvfp4_4over6_err_mode must be 'MAE' or 'MSE', got "
                             f"{nvfp4_4over6_err_mode!r}")
        if nvfp4_use_4over6 and stochastic_rounding:
            raise ValueError("NVFP4Quantizer: nvfp4_use_4over6 keeps each block's nearer cast; it cannot be combined "
                             "with stochastic_rounding")
        if row_scaled_nvfp4 and with_2d_quantization:
            raise ValueError("NVFP4Quantizer: row_scaled_nvfp4 scales each row on its own; it cannot be combined with "
                             "with_2d_quantization (16 x 16 tiles span 16 rows)")
        self.fp8_dtype = torch.float4_e2m1fn_x2  # the format (the base class names it so): dtype is kFloat4E2M1
        self.with_rht = with_rht
        self.with_post_rht_amax = with_post_rht_amax
        self.with_random_sign_mask = with_random_sign_mask
        self.with_2d_quantization = with_2d_quantization
        self.stochastic_rounding = stochastic_rounding
        self.with_amax_reduction = with_amax_reduction
        self.amax_reduction_group = amax_reduction_group
        self.row_scaled_nvfp4 = row_scaled_nvfp4
        self.nvfp4_use_4over6 = nvfp4_use_4over6
        self.nvfp4_e4m3_max = nvfp4_e4m3_max if nvfp4_use_4over6 else 448
        self.nvfp4_4over6_err_mode = err_mode
        self.nvfp4_4over6_err_use_fast_math = nvfp4_4over6_err_use_fast_math

    @property
    def layout(self) -> Hashable:
        """What a GEMM needs of a stored operand: NVFP4 codes, the column-wise usage transformed or not."""
        return ("nvfp4", self.with_rht)

    def serves(self, recipe) -> bool:
        return recipe.nvfp4()

    def is_quantizable(self, tensor: Tensor) -> bool:
        """TE's rule for its kernels: 2-D or more, both dimensions of the matrix multiples of 16;
        never for row-scaled casts (as TE)."""
        return (not self.row_scaled_nvfp4 and tensor.dim() >= 2 and tensor.shape[-1] % BLOCK == 0
                and math.prod(tensor.shape[:-1]) % BLOCK == 0)

    def _cast(self, rht: bool) -> Nvfp4Cast:
        four_over_six = self.nvfp4_4over6_err_mode.lower() if self.nvfp4_use_4over6 else "off"
        return Nvfp4Cast(BLOCK if self.with_2d_quantization else 1, rht, self.nvfp4_e4m3_max, four_over_six,
                         self.nvfp4_4over6_err_use_fast_math, self.row_scaled_nvfp4)

    def operand_of(self, x: Tensor) -> Nvfp4Pair:
        matrix = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)  # [prod(shape[:-1]), shape[-1]]
        if self.row_scaled_nvfp4 and not self.rowwise_usage:
            raise ValueError("NVFP4Quantizer: a row-scaled cast makes the row-wise usage (TE's rule), and this one is "
                             "asked for the column-wise usage alone (quantize with rowwise=True)")
        transformed_amax = self.with_rht and self.with_post_rht_amax
        casts = self.casts
        amax = None
        if self.row_scaled_nvfp4:  # each row its own scale: nothing to agree on over ranks
            amax = casts.amax(matrix, False, False, True)
        elif self.rowwise_usage or (self.columnwise_usage and not transformed_amax):
            amax = self._reduced(casts.amax(matrix, False, False))
        rowwise = columnwise = None
        if self.rowwise_usage:
            rowwise = Nvfp4Usage.quantize(matrix, self._cast(False), False, self._rounding_key(), amax, casts)
        if self.columnwise_usage:
            columnwise = self._columnwise(matrix, rowwise, amax, transformed_amax)
        return Nvfp4Pair(rowwise, columnwise)

    def _columnwise(self, matrix: Tensor, rowwise: Optional[Nvfp4Usage], amax: Optional[Tensor],
                    transformed_amax: bool) -> Nvfp4Usage:
        """The column-wise usage of matrix, given its row-wise one (None where not cast) and amax."""
        casts, cast = self.casts, self._cast(self.with_rht)
        if rowwise is not None and cast.tiles_transpose and not self.stochastic_rounding:
            return rowwise.transposed(casts)  # a weight's 16 x 16 tiles: its codes transposed
        source = matrix if self.with_random_sign_mask or not self.with_rht else unsigned_for_rht(matrix)
        if self.row_scaled_nvfp4:  # TE main: one amax per row of the transpose, after the transform
            column_amax = casts.amax(source, True, self.with_rht, True)
        else:
            column_amax = self._reduced(casts.amax(source, True, True)) if transformed_amax else amax
        return Nvfp4Usage.quantize(source, cast, True, self._rounding_key(), column_amax, casts)

    def share_scale_over(self, group) -> None:
        """Each cast takes its amax over `group` (an all-reduce, which every rank's write of its
        shard joins): the shards of an FSDP2 weight are cast with the whole weight's amax."""
        self.with_amax_reduction, self.amax_reduction_group = True, group

    def _reduced(self, amax: Tensor) -> Tensor:
        if self.with_amax_reduction and dist.is_available() and dist.is_initialized():
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.amax_reduction_group)
        return amax

    def _rounding_key(self) -> Optional[Tensor]:
        """Stochastic rounding's Philox (seed, offset), drawn from torch's generator; None: nearest."""
        if not self.stochastic_rounding:
            return None
        return torch.randint(2 ** 62, (2,), dtype=torch.int64)

    def calibrate(self, tensor: Tensor) -> None:
        """Nothing to keep: every cast scales from its own amax."""

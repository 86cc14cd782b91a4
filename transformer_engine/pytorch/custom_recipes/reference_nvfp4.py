"""TransformerEngine's reference NVFP4 quantizer (custom_recipes.reference_nvfp4; TE 2.18 names it
custom_recipes.quantization_ref_nvfp4, which re-exports this module), built on
this package's plain-PyTorch definition of NVFP4 (reference/nvfp4.py), so that TE's tests compare
NVFP4Quantizer's kernels with it:
- NVFP4QuantizerRef(...).quantize(x) returns an NVFP4TensorRef whose data / scale (row-wise
  codes, two a byte, and E4M3 scales), data_t / scale_t (those of x^T, after the random
  Hadamard transform with with_rht) and global_amax_row / global_amax_col are what the kernels
  must give bit for bit;
- as a CustomRecipe's quantizer (nvfp4_ref_rht_2d_quantizer_factory) it casts the modules' GEMM
  operands as NVFP4Quantizer does, in plain PyTorch, without stochastic rounding;
- qgemm is the GEMM of two such casts as a block-scaled tensor core computes it: each 16-long
  block's fp32 dot product of the codes times its two scales, summed in fp32 block by block,
  times the global factor, plus out when accumulating, rounded once.
NVFP4 with its 4over6 and row-scaled variants; MXFP4 (pow_2_scales) is refused.
"""
import dataclasses
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..fp8.nvfp4_operand import REFERENCE
from ..quantization import QuantizerRole
from ..reference import nvfp4
from ..tensor.nvfp4_tensor import NVFP4Quantizer, unsigned_for_rht
from . import reference_utils as utils


def nvfp4_ref_rht_2d_quantizer_factory(role: Optional[QuantizerRole]) -> "NVFP4QuantizerRef":
    """CustomRecipe factory of the reference: 16 x 16 tiles for the weights of GEMM modules, the
    random Hadamard transform (on the column-wise usage) for everything else."""
    if role is not None and role.module_type in ("linear", "grouped_linear") and role.tensor_type == "weight":
        return NVFP4QuantizerRef(utils.Fp4Formats.E2M1, quant_tile_shape=(16, 16), with_rht=False)
    return NVFP4QuantizerRef(utils.Fp4Formats.E2M1, quant_tile_shape=(1, 16), with_rht=True)


nvfp4_ref_rht_2d_factory = nvfp4_ref_rht_2d_quantizer_factory  # TE main's name


@dataclasses.dataclass
class NVFP4TensorRef:
    """A reference cast: data uint8 [rows, cols / 2], scale float8_e4m3fn [rows, cols / 16] of
    the 2-D input; data_t, scale_t of its transpose; the two global amaxes (fp32 [1])."""
    data: Optional[Tensor] = None
    scale: Optional[Tensor] = None
    data_t: Optional[Tensor] = None
    scale_t: Optional[Tensor] = None
    global_amax_row: Optional[Tensor] = None
    global_amax_col: Optional[Tensor] = None
    dtype: Optional[torch.dtype] = None
    device: Optional[torch.device] = None
    quant_dtype: utils.Fp4Formats = utils.Fp4Formats.E2M1
    original_shape: Optional[Tuple[int, ...]] = None
    nvfp4_use_4over6: bool = False
    nvfp4_e4m3_max: int = 448

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> Tensor:
        """The row-wise codes' values (TE's reference dequantises those)."""
        rows, cols = self.original_shape
        return nvfp4.nvfp4_dequantize(self.data, self.scale, self.global_amax_row, cols, dtype or self.dtype,
                                      self.nvfp4_e4m3_max)


class NVFP4QuantizerRef(NVFP4Quantizer):
    """TE's reference quantizer's arguments; quant_tile_shape (1, 16) or (16, 16). Its casts
    run reference/nvfp4.py (the column-wise amax after the transform, as TE's reference takes it)."""
    casts = REFERENCE

    def __init__(self, dtype: utils.Fp4Formats = utils.Fp4Formats.E2M1, rowwise: bool = True,
                 columnwise: bool = True, pow_2_scales: bool = False, eps: float = 0.0,
                 quant_tile_shape: Tuple[int, int] = (1, 16), row_scaled_nvfp4: bool = False,
                 nvfp4_use_4over6: bool = False, nvfp4_e4m3_max: int = 448, nvfp4_4over6_err_mode: str = "MAE",
                 nvfp4_4over6_err_use_fast_math: bool = False, with_rht: bool = False,
                 with_random_sign_mask: bool = True) -> None:
        if dtype is not utils.Fp4Formats.E2M1:
            raise ValueError(f"NVFP4QuantizerRef: dtype must be Fp4Formats.E2M1, got {dtype!r}")
        if tuple(quant_tile_shape) not in ((1, 16), (16, 16)):
            raise ValueError(f"NVFP4QuantizerRef: quant_tile_shape must be (1, 16) or (16, 16), got "
                             f"{quant_tile_shape!r}")
        if pow_2_scales:
            raise NotImplementedError("NVFP4QuantizerRef: pow_2_scales=True (MXFP4) is not supported here")
        super().__init__(rowwise=rowwise, columnwise=columnwise, with_rht=with_rht, with_post_rht_amax=with_rht,
                         with_2d_quantization=tuple(quant_tile_shape) == (16, 16), row_scaled_nvfp4=row_scaled_nvfp4,
                         nvfp4_use_4over6=nvfp4_use_4over6, nvfp4_e4m3_max=nvfp4_e4m3_max,
                         nvfp4_4over6_err_mode=nvfp4_4over6_err_mode, with_random_sign_mask=with_random_sign_mask,
                         nvfp4_4over6_err_use_fast_math=nvfp4_4over6_err_use_fast_math)
        self.pow_2_scales = False
        self.eps = eps
        self.quant_tile_shape = tuple(quant_tile_shape)

    def _apply_rht(self, x: Tensor) -> Tensor:
        """The random Hadamard transform of each 16 values of x's rows (x itself without with_rht;
        without the signs with with_random_sign_mask=False)."""
        if not self.with_rht:
            return x
        return nvfp4.rht16(x if self.with_random_sign_mask else unsigned_for_rht(x.t()).t())

    def quantize(self, tensor: Tensor, **kwargs) -> NVFP4TensorRef:
        """tensor [..., cols] cast as its 2-D matrix, as TE's reference returns it."""
        matrix = tensor.reshape(-1, tensor.shape[-1])  # [rows, cols]
        operand = self.operand_of(matrix)
        result = NVFP4TensorRef(dtype=tensor.dtype, device=tensor.device, original_shape=tuple(matrix.shape),
                                nvfp4_use_4over6=self.nvfp4_use_4over6, nvfp4_e4m3_max=self.nvfp4_e4m3_max)
        if operand.rowwise is not None:
            result.data, result.scale = operand.rowwise.data, operand.rowwise.scales
            result.global_amax_row = result.global_amax_col = operand.rowwise.amax
        if operand.columnwise is not None:
            result.data_t, result.scale_t = operand.columnwise.data, operand.columnwise.scales
            result.global_amax_col = operand.columnwise.amax
        return result

    def qgemm(self, qx: Tensor, qw: Tensor, m_params, out_dtype: torch.dtype, sx: Tensor, sw: Tensor,
              bias: Optional[Tensor] = None, out: Optional[Tensor] = None, accumulate: bool = False,
              gemm_type=None, qresult_x: Optional[NVFP4TensorRef] = None,
              qresult_w: Optional[NVFP4TensorRef] = None) -> Tensor:
        """qx [m, k / 2] and qw [n, k / 2] (packed codes) with their E4M3 scales sx [m, k / 16],
        sw [n, k / 16] -> [m, n] in out_dtype: the tensor core's order (see the module's
        docstring), with alpha = (g_x * g_w) / (6 * 6 * E_x * E_w) from the casts qresult_x
        and qresult_w (their row amaxes, or column amaxes for the weight-gradient GEMM; a
        row-scaled x scales each output row by its own)."""
        if bias is not None:
            raise ValueError("NVFP4QuantizerRef.qgemm: bias is not supported (TE's reference takes none)")
        if qresult_x is None or qresult_w is None:
            raise ValueError("NVFP4QuantizerRef.qgemm: qresult_x and qresult_w (the casts, for their amaxes) are "
                             "required")
        k = qx.shape[1] * 2
        if qw.shape[1] * 2 != k:
            raise ValueError(f"NVFP4QuantizerRef.qgemm: qx holds k = {k} and qw k = {qw.shape[1] * 2}")
        blocks = k // nvfp4.BLOCK
        for name, scales, rows in (("sx", sx, qx.shape[0]), ("sw", sw, qw.shape[0])):
            if tuple(scales.shape) != (rows, blocks):
                raise ValueError(f"NVFP4QuantizerRef.qgemm: {name} must be [{rows}, {blocks}], got "
                                 f"{tuple(scales.shape)}")
        x = nvfp4.e2m1_values(nvfp4.unpack_codes(qx.view(torch.uint8), k))  # [m, k] fp32
        w = nvfp4.e2m1_values(nvfp4.unpack_codes(qw.view(torch.uint8), k))  # [n, k] fp32
        x_scales, w_scales = sx.view(torch.float8_e4m3fn).float(), sw.view(torch.float8_e4m3fn).float()
        y = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
        for block in range(blocks):
            part = slice(block * nvfp4.BLOCK, (block + 1) * nvfp4.BLOCK)
            y = y + torch.outer(x_scales[:, block], w_scales[:, block]) * (x[:, part] @ w[:, part].t())
        y = _global_factor(qresult_x, qresult_w, gemm_type, x.shape[0]) * y
        if accumulate:
            if out is None:
                raise ValueError("NVFP4QuantizerRef.qgemm: accumulate=True needs out")
            y = y + out.float()
        return y.to(out_dtype)


def _global_factor(x: NVFP4TensorRef, w: NVFP4TensorRef, gemm_type, rows: int) -> Tensor:
    """alpha, fp32 [1] or [rows, 1] (a row-scaled x)."""
    wgrad = getattr(gemm_type, "name", None) == "WGRAD"
    x_amax = x.global_amax_col if wgrad else x.global_amax_row
    w_amax = w.global_amax_col if wgrad else w.global_amax_row
    product = x_amax.float() * w_amax.float()
    if product.numel() > 1:
        product = product.view(rows, 1)
    return product / (nvfp4.E2M1_MAX * nvfp4.E2M1_MAX * x.nvfp4_e4m3_max * w.nvfp4_e4m3_max)

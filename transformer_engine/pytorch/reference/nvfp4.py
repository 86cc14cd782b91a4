"""NVFP4 casts in plain PyTorch, with the ops' signatures and semantics (TE's NVFP4BlockScaling).

An NVFP4 tensor [rows, cols] holds 4-bit E2M1 codes (values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and
their negatives), two per byte (the even column in the low nibble), a float8_e4m3fn scale per
block of 16 consecutive values of a row (block_rows = 1) or per 16 x 16 tile (block_rows = 16,
TE's 2-D weight blocks; the tile's scale is stored on each of its 16 rows), and one fp32 amax
for the whole tensor. With g = amax, fp32 arithmetic throughout:

    S_enc   = min(448 * 6 / g, FLT_MAX), 1 where that is 0 (g = inf); S_dec = 1 / S_enc
    scale   = e4m3(clamp(min(block_amax * (S_enc * (1 / 6)), FLT_MAX), -448, 448))   (nearest even)
    encode  = min(1 / (scale * S_dec), FLT_MAX)
    code    = e2m1(clamp(x * encode, -6, 6))          (nearest, ties to the even code)
    value   = code * (scale * g * (1 / 2688)) in fp32, then converted to the output dtype (as TE's)

block_amax skips NaN (the package's amax rule); a NaN element gets code +0, a negative value
that rounds to zero -0 (code 8). Ragged edges are padded with zeros to whole blocks; the codes
and scales of the padding are not returned.

Options of the cast (nvfp4_quantize; nvfp4_amax takes the first two, so that the amax is that
of exactly what is cast):
- transpose: cast input^T (the column-wise usage, for the GEMMs that contract the rows);
- rht: TE's random Hadamard transform first, on each 16 consecutive values of a row (cols a
  multiple of 16): y = (x * signs) H / 4 with H the 16 x 16 Sylvester Hadamard matrix and TE's
  fixed signs, computed as a fast Walsh-Hadamard transform in fp32 (butterflies of strides 1, 2,
  4, 8, each a + b then a - b), times 1/4, rounded to the input's dtype (as TE's transform
  returns it);
- sr_rng (int64 [2]: seed, offset): stochastic rounding of the codes: |x * encode| between
  grid neighbours lo < |v| < hi rounds to hi with probability (|v| - lo) / (hi - lo), by Philox
  keyed by the seed, counter (column // 4, row, offset low, offset high), lane column % 4: up
  when the word's top 24 bits over 2^24 are below that fraction (fp32).
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..scaling import amax as amax_over
from .philox import MASK32, philox4x32

BLOCK = 16
E2M1_MAX, E4M3_MAX = 6.0, 448.0
FLT_MAX = torch.finfo(torch.float32).max
# TE's fixed signs of the random Hadamard transform (get_wgrad_sign_vector).
RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Magnitudes past which the code rises: ties (0.25, 1.25, 2.5, 5) stay on the even code below,
# the others (0.75, 1.75, 3.5) go up to the even code above.
_UP_ABOVE = (0.25, 1.25, 2.5, 5.0)
_UP_FROM = (0.75, 1.75, 3.5)


def _f32(value: float) -> Tensor:
    return torch.tensor(value, dtype=torch.float32)


def _walsh_hadamard(y: Tensor) -> Tensor:
    """y [blocks, 16] fp32 times the Sylvester Hadamard matrix H (symmetric): butterflies of
    strides 1, 2, 4, 8, each a + b then a - b."""
    for stride in (1, 2, 4, 8):
        pairs = y.reshape(-1, BLOCK // (2 * stride), 2, stride)  # [blocks, pairs, (a, b), stride]
        a, b = pairs[:, :, 0], pairs[:, :, 1]
        y = torch.stack([a + b, a - b], dim=2).reshape(-1, BLOCK)
    return y


def _signs(device: torch.device) -> Tensor:
    return torch.tensor(RHT_SIGNS, dtype=torch.float32, device=device)


def _check_rht_width(name: str, x: Tensor) -> None:
    if x.shape[-1] % BLOCK:
        raise ValueError(f"{name}: the last dimension ({x.shape[-1]}) must be a multiple of {BLOCK}")


def rht16(x: Tensor) -> Tensor:
    """The random Hadamard transform of each 16 values along the last dimension (see above)."""
    _check_rht_width("rht16", x)
    y = _walsh_hadamard(x.float().reshape(-1, BLOCK) * _signs(x.device))  # [blocks, 16]
    return (y * 0.25).reshape(x.shape).to(x.dtype)


def inverse_rht16(y: Tensor) -> Tensor:
    """rht16's inverse in fp32 (its matrix diag(signs) H / 4 is orthogonal: the inverse is
    H diag(signs) / 4), for the values of a transformed tensor's codes."""
    _check_rht_width("inverse_rht16", y)
    x = _walsh_hadamard(y.float().reshape(-1, BLOCK)) * _signs(y.device) * 0.25  # [blocks, 16]
    return x.reshape(y.shape)


def _source(input: Tensor, transpose: bool, rht: bool) -> Tensor:
    """What is cast: input (or input^T) [rows, cols], after the transform when rht."""
    source = input.t() if transpose else input
    return rht16(source) if rht else source


def nvfp4_amax(input: Tensor, transpose: bool, rht: bool) -> Tensor:
    """fp32 [1]: max |x| of what nvfp4_quantize(input, ..., transpose, rht) casts (NaN skipped)."""
    return amax_over(_source(input, transpose, rht)).reshape(1).float()


def global_scales(amax: Tensor) -> Tuple[Tensor, Tensor]:
    """(S_enc, S_dec) fp32 from the tensor's amax (fp32 [1])."""
    encode = torch.minimum(_f32(E4M3_MAX * E2M1_MAX) / amax.float(), _f32(FLT_MAX))
    encode = torch.where(encode == 0, torch.ones_like(encode), encode)
    return encode, torch.reciprocal(encode)


def e2m1_codes(v: Tensor) -> Tensor:
    """uint8 codes (sign in bit 3) of fp32 values already within [-6, 6], nearest even; NaN -> 0."""
    magnitude = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for bound in _UP_ABOVE:
        code += (magnitude > bound).to(torch.uint8)
    for bound in _UP_FROM:
        code += (magnitude >= bound).to(torch.uint8)
    return code | ((v < 0).to(torch.uint8) << 3)


def e2m1_values(codes: Tensor) -> Tensor:
    """fp32 values of uint8 codes (low 4 bits)."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32, device=codes.device)
    return table[codes.long() & 0xF]


def _stochastic_codes(v: Tensor, rng: Tensor) -> Tensor:
    """Codes of fp32 values within [-6, 6] [rows, cols], rounded stochastically (see above)."""
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=v.device)
    magnitude = v.abs().nan_to_num(0.0)
    below = (torch.bucketize(magnitude.contiguous(), grid, right=True) - 1).clamp(0, 6)  # grid index at or below
    lo, hi = grid[below], grid[below + 1]
    fraction = (magnitude - lo) / (hi - lo)
    rows, cols = v.shape
    seed, offset = (int(t) for t in rng.tolist())
    row = torch.arange(rows, dtype=torch.int64, device=v.device).view(rows, 1).expand(rows, cols)
    column = torch.arange(cols, dtype=torch.int64, device=v.device).view(1, cols).expand(rows, cols)
    counter = torch.stack([column // 4, row, torch.full_like(row, offset & MASK32),
                           torch.full_like(row, (offset >> 32) & MASK32)], dim=-1)
    word = philox4x32(counter, seed).gather(-1, (column % 4).unsqueeze(-1)).squeeze(-1)
    up = (word >> 8).to(torch.float32) * 2.0 ** -24 < fraction
    code = (below + up.long()).to(torch.uint8)
    return code | ((v < 0).to(torch.uint8) << 3)


def pack_codes(codes: Tensor) -> Tensor:
    """uint8 codes [rows, cols] -> bytes [rows, ceil(cols / 2)], the even column in the low nibble."""
    if codes.shape[1] % 2:
        codes = F.pad(codes, (0, 1))
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_codes(data: Tensor, cols: int) -> Tensor:
    """bytes [rows, ceil(cols / 2)] -> uint8 codes [rows, cols]."""
    return torch.stack([data & 0xF, data >> 4], dim=-1).reshape(data.shape[0], 2 * data.shape[1])[:, :cols]


def nvfp4_quantize(input: Tensor, amax: Tensor, block_rows: int, transpose: bool, rht: bool,
                   sr_rng: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """(data uint8 [rows, ceil(cols / 2)], scales float8_e4m3fn [rows, ceil(cols / 16)]) of
    input [rows, cols] (or its transpose), with the tensor's amax (nvfp4_amax's, or reduced
    over ranks)."""
    if block_rows not in (1, BLOCK):
        raise ValueError(f"nvfp4_quantize: block_rows must be 1 or {BLOCK}, got {block_rows}")
    source = _source(input, transpose, rht).float()
    rows, cols = source.shape
    grid_rows, grid_cols = -(-rows // block_rows), -(-cols // BLOCK)
    padded = F.pad(source, (0, grid_cols * BLOCK - cols, 0, grid_rows * block_rows - rows))
    blocks = padded.reshape(grid_rows, block_rows, grid_cols, BLOCK)
    block_amax = amax_over(blocks, dim=(1, 3))  # [grid_rows, grid_cols]
    encode_global, decode_global = global_scales(amax)
    multiplier = encode_global * torch.reciprocal(_f32(E2M1_MAX))
    decode = torch.minimum(block_amax * multiplier, _f32(FLT_MAX)).clamp(-E4M3_MAX, E4M3_MAX)
    scales = decode.to(torch.float8_e4m3fn)  # [grid_rows, grid_cols]
    encode = torch.minimum(torch.reciprocal(scales.float() * decode_global), _f32(FLT_MAX))
    scaled = (blocks * encode[:, None, :, None]).clamp(-E2M1_MAX, E2M1_MAX).reshape(padded.shape)
    codes = e2m1_codes(scaled) if sr_rng is None else _stochastic_codes(scaled, sr_rng)
    per_row = scales.repeat_interleave(block_rows, dim=0)[:rows]  # the tile's scale on each of its rows
    return pack_codes(codes[:rows, :cols]), per_row.contiguous()


def nvfp4_dequantize(data: Tensor, scales: Tensor, amax: Tensor, cols: int, out_dtype: torch.dtype) -> Tensor:
    """The values [rows, cols] in out_dtype of codes data [rows, ceil(cols / 2)] with scales
    [rows, ceil(cols / 16)] and the tensor's amax."""
    factor = scales.float() * amax.float() * torch.reciprocal(_f32(E4M3_MAX * E2M1_MAX))  # [rows, blocks]
    per_value = factor.repeat_interleave(BLOCK, dim=1)[:, :cols]
    return (e2m1_values(unpack_codes(data, cols)) * per_value).to(out_dtype)

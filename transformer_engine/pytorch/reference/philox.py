"""Philox4x32-10 in plain PyTorch (int64 arithmetic on 32-bit words), the counter-based
generator of the kernels' random draws (attention's dropout, NVFP4's stochastic rounding):
kernels/cpu/simd/philox_*.h compute the same words."""
from typing import Tuple

import torch
from torch import Tensor

_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85  # Philox4x32's constants
MASK32 = 0xFFFFFFFF


def _mulhilo(multiplier: int, x: Tensor) -> Tuple[Tensor, Tensor]:
    """(high, low) 32-bit halves of multiplier * x, x int64 in [0, 2^32), in int64 without overflow."""
    low_part = multiplier * (x & 0xFFFF)  # < 2^48
    high_part = multiplier * (x >> 16)  # < 2^48; the product is high_part * 2^16 + low_part
    below = low_part + ((high_part & 0xFFFF) << 16)  # < 2^49
    return ((high_part >> 16) + (below >> 32)) & MASK32, below & MASK32


def philox4x32(counter: Tensor, key: int) -> Tensor:
    """Philox4x32-10: counter int64 [..., 4] (32-bit words), key a 64-bit int (word 0 its low
    half) -> the four 32-bit output words [..., 4] (int64)."""
    c0, c1, c2, c3 = counter.unbind(-1)
    k0, k1 = key & MASK32, (key >> 32) & MASK32
    for _ in range(10):
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _W0) & MASK32, (k1 + _W1) & MASK32
    return torch.stack([c0, c1, c2, c3], dim=-1)

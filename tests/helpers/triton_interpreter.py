"""A patch of Triton's interpreter (3.9) so that its float conversions to and from bf16 and
FP8 give what the GPU's do, measured defects otherwise:
- fp32 -> bf16 truncates instead of rounding to nearest even;
- fp32 -> fp8 neither carries the rounding into the exponent nor saturates (the GPU's
  `cvt.rn.satfinite` rounds to nearest even and clamps finite overflow to +-max; NaN stays NaN);
- fp8 -> wider reads e4m3's NaN code (0x7f) as 480.
The conversions involving bf16, e4m3 or e5m2 are done by PyTorch instead (exact upcasts, round
to nearest even downcasts), with the saturation first. Only the test harness patches; the
kernels are written for the GPU. Applied by conftest.py when the interpreter is in use.
"""
import numpy as np
import torch


def _torch_dtypes(tl):
    return {tl.float32: torch.float32, tl.float64: torch.float64, tl.float16: torch.float16,
            tl.bfloat16: torch.bfloat16, tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}


def _storage(dtype: torch.dtype) -> torch.dtype:
    """The type the interpreter keeps `dtype`'s values in (bf16 and fp8 as raw bits)."""
    return {torch.bfloat16: torch.uint16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}.get(
        dtype, dtype)


def convert(data: np.ndarray, source: torch.dtype, target: torch.dtype) -> np.ndarray:
    """data (the interpreter's storage of `source` values) converted as the GPU converts."""
    values = torch.from_numpy(np.ascontiguousarray(data)).view(_storage(source)).view(source)
    if target in (torch.float8_e4m3fn, torch.float8_e5m2):
        top = torch.finfo(target).max
        wide = values.double()
        values = torch.where(wide.abs() > top, wide.sign() * top, wide)  # NaN compares false: stays NaN
    return values.to(target).view(_storage(target)).numpy().reshape(data.shape)


def patch_casts() -> None:
    """Routes the interpreter's float conversions involving bf16 or FP8 through convert()."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    dtypes = _torch_dtypes(tl)
    exact_elsewhere = (torch.float32, torch.float64, torch.float16)
    original_cast, original_fp_to_fp = InterpreterBuilder.cast_impl, InterpreterBuilder.create_fp_to_fp

    def patched(original):
        def cast(self, src, dst_type, *rest):
            source, target = dtypes.get(src.dtype.scalar), dtypes.get(dst_type.scalar)
            if source is None or target is None or (source in exact_elsewhere and target in exact_elsewhere):
                return original(self, src, dst_type, *rest)
            return TensorHandle(convert(src.data, source, target), dst_type.scalar)
        return cast

    InterpreterBuilder.cast_impl = patched(original_cast)
    InterpreterBuilder.create_fp_to_fp = patched(original_fp_to_fp)

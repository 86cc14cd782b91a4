"""The Triton FP8 cast kernels (transformer_engine/pytorch/triton/fp8_cast.py, fp8_block.py,
fp8_transpose.py):
their values are tested through the ops on every backend (test_fp8_cast_ops.py,
test_fp8_block.py); here, that the ops dispatch to them on accelerators and in the tests'
interpreter backend, what the reference serves instead, and that they compile for sm_90 and
sm_100 with saturating FP8 conversions, no float64 and correctly rounded scale divisions; and
that E4M3 goes to the reference on GPUs without it."""
import types

import pytest
import torch

import backends
import transformer_engine.pytorch as te
from numerics import assert_same_fp8
from transformer_engine.pytorch import reference
from triton_harness import POINTER, assert_compiles

pytest.importorskip("triton")
from transformer_engine.pytorch.triton import (_device, activation, fp8_block, fp8_cast, fp8_gemm,  # noqa: E402
                                               fp8_transpose, norm)

OPS = {fp8_cast: ("fp8_quantize", "fp8_quantize_transpose", "fp8_dequantize"),
       fp8_block: ("fp8_block_quantize", "fp8_block_dequantize"),
       fp8_transpose: ("fp8_transpose",)}


def test_the_ops_dispatch_to_the_kernels_on_accelerators():
    """As build_info reports it: no FP8 cast runs the reference on a GPU."""
    paths = te.build_info()["ops"]
    for names in OPS.values():
        for name in names:
            assert paths[name] == {"cpu": "kernel", "cuda": "triton", "musa": "triton"}, name


class _Ran(Exception):
    pass


@pytest.mark.parametrize("module", list(OPS), ids=lambda m: m.__name__.rpartition(".")[2])
def test_the_interpreter_backend_runs_the_kernels(monkeypatch, module):
    """The "triton-interpreter" backend of the op tests goes through the Triton kernels."""
    triton_backend = [b for b in backends.available() if b.name in ("triton-interpreter", "cuda")][0]
    x = torch.randn(4, 64, device=triton_backend.device)
    calls = {"fp8_quantize": lambda: torch.ops.portable_te.fp8_quantize(x, x.new_ones(1), torch.float8_e4m3fn),
             "fp8_block_quantize": lambda: torch.ops.portable_te.fp8_block_quantize(x, 1, 32, torch.float8_e4m3fn,
                                                                                     "e8m0", 0.0),
             "fp8_transpose": lambda: torch.ops.portable_te.fp8_transpose(x.to(torch.float8_e5m2))}
    name = OPS[module][0]

    def ran(*args):
        raise _Ran

    monkeypatch.setattr(module, name, ran)
    with backends.serving(triton_backend), pytest.raises(_Ran):
        calls[name]()


def test_block_shapes_the_kernels_do_not_tile_fall_back_to_the_reference():
    x = torch.randn(10, 96)
    assert not fp8_block.supports("fp8_block_quantize", (x, 3, 32, torch.float8_e4m3fn, "fp32", 0.0))
    assert not fp8_block.supports("fp8_block_quantize", (x, 256, 256, torch.float8_e4m3fn, "fp32", 0.0))
    assert fp8_block.supports("fp8_block_dequantize", (x, x, 128, 128, torch.float32))
    assert not fp8_cast.supports("fp8_quantize_transpose", (torch.empty(1, 64 * 65536 + 1), x, torch.float8_e4m3fn))


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_e8m0_scales_at_the_edges_of_the_range(fp8_dtype):
    """Blocks whose amax is 0, subnormal, tiny, huge or inf: the exponent rule's corner cases."""
    magnitudes = [0.0, 1e-45, 1e-40, 2.0 ** -127, 1e-30, 1.0, 448.0, 449.0, 57344.0, 3e38, float("inf")]
    x = torch.cat([torch.full((1, 32), m) for m in magnitudes], dim=1)  # one block per magnitude
    got = fp8_block.fp8_block_quantize(x, 1, 32, fp8_dtype, "e8m0", 0.0)
    want = reference.fp8_block_quantize(x, 1, 32, fp8_dtype, "e8m0", 0.0)
    assert_same_fp8(got[0], want[0])
    assert torch.equal(got[1], want[1]), (got[1], want[1])


def fp8_cast_variants():
    """What tests/helpers/triton_compile.py compiles of triton/fp8_cast.py: the casts from bf16 / fp32 / fp16 to
    both formats, the transposing cast, and dequantization to bf16 and fp32."""
    found = []
    for source, target, fp8_max in (("bf16", "e4m3", 448.0), ("fp32", "e5m2", 57344.0), ("fp16", "e4m3", 448.0)):
        signature = {"X": POINTER[source], "SCALE": "*fp32", "Y": POINTER[target], "AMAX_PARTIAL": "*fp32",
                     "n": "i64", "FP8_MAX": "constexpr", "BLOCK": "constexpr"}
        found.append((f"quantize[{source}->{target}]", fp8_cast._quantize_kernel, signature,
                      {"FP8_MAX": fp8_max, "BLOCK": fp8_cast.BLOCK}))
    for target, fp8_max in (("e4m3", 448.0), ("e5m2", 57344.0)):
        signature = {"X": "*bf16", "SCALE": "*fp32", "Y": POINTER[target], "Y_T": POINTER[target],
                     "AMAX_PARTIAL": "*fp32", "n_rows": "i32", "n_cols": "i32", "FP8_MAX": "constexpr",
                     "TILE": "constexpr"}
        found.append((f"quantize_transpose[bf16->{target}]", fp8_cast._quantize_transpose_kernel, signature,
                      {"FP8_MAX": fp8_max, "TILE": fp8_cast.TILE}))
    for source, target in (("e4m3", "bf16"), ("e5m2", "fp32")):
        signature = {"X": POINTER[source], "SCALE_INV": "*fp32", "Y": POINTER[target], "n": "i64",
                     "BLOCK": "constexpr"}
        found.append((f"dequantize[{source}->{target}]", fp8_cast._dequantize_kernel, signature,
                      {"BLOCK": fp8_cast.BLOCK}))
    return found


_BLOCK_LAYOUTS = (((1, 128), "pow2", "bf16", "e4m3"), ((128, 1), "pow2", "bf16", "e4m3"),
                  ((128, 128), "pow2", "fp32", "e4m3"), ((1, 128), "fp32", "bf16", "e5m2"), ((1, 32), "e8m0", "bf16", "e4m3"),
            ((32, 1), "e8m0", "fp16", "e4m3"))
_FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def fp8_block_variants():
    """What tests/helpers/triton_compile.py compiles of triton/fp8_block.py: the recipes' block layouts (1x128 and
    128x128 with power-of-two scales, 1x128 fp32 scales, 1x32 and 32x1 E8M0) and dequantization."""
    found = []
    for (block_rows, block_cols), mode, source, target in _BLOCK_LAYOUTS:
        tile_rows, tile_cols = fp8_block._tile(block_rows, block_cols)
        signature = {"X": POINTER[source], "Y": POINTER[target], "SCALE_INV": "*u8" if mode == "e8m0" else "*fp32",
                     "n_rows": "i32", "n_cols": "i32", "grid_rows": "i32", "grid_cols": "i32", "amax_epsilon": "fp32",
                     "e8m0_reciprocal": "fp32", "FP8_MAX": "constexpr", "MODE": "constexpr",
                     "BLOCK_ROWS": "constexpr", "BLOCK_COLS": "constexpr", "TILE_ROWS": "constexpr",
                     "TILE_COLS": "constexpr"}
        constexprs = {"FP8_MAX": _FP8_MAX[target], "MODE": fp8_block._MODES[mode], "BLOCK_ROWS": block_rows,
                      "BLOCK_COLS": block_cols, "TILE_ROWS": tile_rows, "TILE_COLS": tile_cols}
        found.append((f"block_quantize[{block_rows}x{block_cols},{mode},{source}->{target}]",
                      fp8_block._block_quantize_kernel, signature, constexprs))
    for (block_rows, block_cols), e8m0 in (((1, 128), False), ((1, 32), True)):
        tile_rows, tile_cols = fp8_block._tile(block_rows, block_cols)
        signature = {"X": "*fp8e4nv", "SCALE_INV": "*u8" if e8m0 else "*fp32", "Y": "*bf16", "n_rows": "i32",
                     "n_cols": "i32", "grid_cols": "i32", "E8M0": "constexpr", "BLOCK_ROWS": "constexpr",
                     "BLOCK_COLS": "constexpr", "TILE_ROWS": "constexpr", "TILE_COLS": "constexpr"}
        constexprs = {"E8M0": e8m0, "BLOCK_ROWS": block_rows, "BLOCK_COLS": block_cols, "TILE_ROWS": tile_rows,
                      "TILE_COLS": tile_cols}
        found.append((f"block_dequantize[{block_rows}x{block_cols},e8m0={e8m0}]", fp8_block._block_dequantize_kernel,
                      signature, constexprs))
    return found


def fp8_transpose_variants():
    """What tests/helpers/triton_compile.py compiles of triton/fp8_transpose.py: codes as bytes, read through any
    strides, and through rows of unit stride (a launch on a contiguous or column-sliced matrix specialises
    stride_col to 1). The stores are 16-byte vectors in both; the loads become so only where the row stride is known
    to be a multiple of 16 as well, which the harness leaves unknown."""
    found = []
    for name, stride_col in (("strided", "i32"), ("unit_stride_rows", "constexpr")):
        signature = {"X": POINTER["u8"], "Y_T": POINTER["u8"], "n_rows": "i32", "n_cols": "i32", "stride_row": "i32",
                     "stride_col": stride_col, "TILE": "constexpr"}
        constexprs = {"TILE": fp8_transpose.TILE, **({"stride_col": 1} if stride_col == "constexpr" else {})}
        found.append((f"transpose[{name}]", fp8_transpose._transpose_kernel, signature, constexprs))
    return found


def test_kernels_compile_for_hopper_and_blackwell():
    """Quantize 3 variants, transposing 2, dequantize 2 (fp8_cast_variants);
    block quantize 6 layouts and block dequantize 2 (fp8_block_variants); the
    transpose of codes, strided and with unit-stride rows, moving bytes and converting none
    (fp8_transpose_variants)."""
    assert_compiles(fp8_cast_variants, count=7, fp8_variants=5)
    assert_compiles(fp8_block_variants, count=8, fp8_variants=6, exact_division=True)
    assert_compiles(fp8_transpose_variants, count=2)


class _FakeGpuModule:
    """torch.cuda / torch.musa as has_e4m3 reads them: a compute capability."""

    def __init__(self, capability):
        self.capability = capability

    def get_device_capability(self, device=None):
        return self.capability


@pytest.mark.parametrize("kind, capability, e4m3", [("cuda", (8, 0), False), ("cuda", (8, 9), True),
                                                    ("cuda", (9, 0), True), ("cuda", (10, 0), True),
                                                    ("musa", (2, 2), False), ("musa", (3, 1), True)])
def test_e4m3_needs_sm89_or_an_mp31_part(monkeypatch, kind, capability, e4m3):
    """A100 and MUSA parts before the S5000 class have no E4M3: the reference serves it there."""
    monkeypatch.setattr(torch, kind, _FakeGpuModule(capability), raising=False)
    device = torch.device("cuda") if kind == "cuda" else types.SimpleNamespace(type="musa")
    assert _device.has_e4m3(device) is e4m3
    assert _device.fp8_runs(device, torch.float8_e4m3fn) is e4m3
    assert _device.fp8_runs(device, torch.float8_e5m2)


def test_kernels_leave_e4m3_to_the_reference_where_the_device_lacks_it(monkeypatch):
    monkeypatch.setattr(_device, "has_e4m3", lambda device: False)
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    x, w, scale = torch.ones(4, 64), torch.ones(64), torch.ones(1)
    for fp8_dtype, runs in ((e4m3, False), (e5m2, True)):
        assert fp8_cast.supports("fp8_quantize", (x, scale, fp8_dtype)) is runs
        assert fp8_cast.supports("fp8_dequantize", (x.to(fp8_dtype), scale, torch.float32)) is runs
        assert fp8_block.supports("fp8_block_quantize", (x, 1, 32, fp8_dtype, "e8m0", 0.0)) is runs
        assert norm.supports("rmsnorm_fp8_fwd", (x, w, scale, fp8_dtype, 1e-5, False, False)) is runs
        assert activation.supports("activation_fp8", (x, None, "gelu", 7.0, 1.702, scale, fp8_dtype)) is runs
        assert fp8_transpose.supports("fp8_transpose", (x.to(fp8_dtype),))  # bytes moved: E4M3 or not
    assert norm.supports("rmsnorm_fwd", (x, w, 1e-5, False))  # no FP8: unaffected
    codes, scales = torch.zeros(4, 64, dtype=e5m2), torch.zeros(4, 2, dtype=torch.uint8)
    assert not fp8_gemm.supports("fp8_block_gemm", (codes, scales, [1, 32], False, codes.to(e4m3), scales, [1, 32],
                                                    False, None, torch.float32))

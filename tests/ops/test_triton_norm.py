"""The Triton LayerNorm / RMSNorm kernels (transformer_engine/pytorch/triton/norm.py) against the
reference ops: on CUDA tensors where a GPU is present, else on CPU tensors in Triton's
interpreter (conftest.py). Forward outputs and statistics, every gradient, zero-centred gamma,
mixed parameter dtypes, odd and one-element rows, zero rows, rows whose float32 variance
overflows, non-finite rows; that the ops dispatch to them; and that they compile for sm_90 and
sm_100 with no float64 arithmetic (tests/helpers/triton_harness.py)."""
import subprocess
import sys

import pytest
import torch

from backends import TRITON_DEVICE as DEVICE
from numerics import assert_close
from triton_harness import POINTER, assert_compiles
from transformer_engine.pytorch.custom_ops import _registry
from transformer_engine.pytorch.reference import norm as reference

triton = pytest.importorskip("triton")
from transformer_engine.pytorch.triton import norm as kernels  # noqa: E402

SHAPES = [(37, 200), (2, 3, 64), (5, 1), (0, 48), (16, 4096)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _inputs(shape, dtype, weight_dtype, generator_seed=0):
    generator = torch.Generator().manual_seed(generator_seed)
    x = torch.randn(shape, generator=generator).to(dtype)
    weight = (torch.rand(shape[-1], generator=generator) + 0.5).to(weight_dtype)
    bias = torch.randn(shape[-1], generator=generator).to(weight_dtype)
    grad = torch.randn(shape, generator=generator).to(dtype)
    return [t.to(DEVICE) for t in (x, weight, bias, grad)]


def _assert_outputs(got, want, dtypes, names):
    for g, w, dtype, name in zip(got, want, dtypes, names):
        assert g.dtype == w.dtype, f"{name}: {g.dtype} != {w.dtype}"
        # The interpreter rounds fp32 -> bf16 by truncation (a Triton 3.9 defect), one ulp
        # further than the GPU: within the dtype's tolerance.
        assert_close(g.cpu(), w.cpu(), dtype=dtype, name=name)


@pytest.mark.parametrize("zero_centered_gamma", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16], ids=["w_fp32", "w_bf16"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_layernorm_matches_reference(shape, dtype, weight_dtype, zero_centered_gamma):
    x, weight, bias, grad = _inputs(shape, dtype, weight_dtype)
    got = kernels.layernorm_fwd(x, weight, bias, 1e-5, zero_centered_gamma)
    want = reference.layernorm_fwd(x, weight, bias, 1e-5, zero_centered_gamma)
    _assert_outputs(got, want, (dtype, torch.float32, torch.float32), ("output", "mean", "rstd"))
    mean, rstd = want[1], want[2]
    got = kernels.layernorm_bwd(grad, x, mean, rstd, weight, zero_centered_gamma)
    want = reference.layernorm_bwd(grad, x, mean, rstd, weight, zero_centered_gamma)
    # Parameter gradients sum over the rows: fp32 partials summed in another order.
    _assert_outputs(got, want, (dtype, weight_dtype, weight_dtype), ("grad_input", "grad_weight", "grad_bias"))


@pytest.mark.parametrize("zero_centered_gamma", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rmsnorm_matches_reference(shape, dtype, zero_centered_gamma):
    x, weight, _, grad = _inputs(shape, dtype, dtype)
    got = kernels.rmsnorm_fwd(x, weight, 1e-6, zero_centered_gamma)
    want = reference.rmsnorm_fwd(x, weight, 1e-6, zero_centered_gamma)
    _assert_outputs(got, want, (dtype, torch.float32), ("output", "rstd"))
    got = kernels.rmsnorm_bwd(grad, x, want[1], weight, zero_centered_gamma)
    want = reference.rmsnorm_bwd(grad, x, want[1], weight, zero_centered_gamma)
    _assert_outputs(got, want, (dtype, dtype), ("grad_input", "grad_weight"))


def test_overflowing_and_non_finite_rows():
    """float32 rows beyond ~1.8e19 keep finite statistics (as the reference's float64 ones);
    rows with an inf or a NaN keep non-finite ones."""
    x = torch.randn(6, 96, generator=torch.Generator().manual_seed(3))
    x[1] *= 1e20
    x[2] *= 3e37
    x[3, 5] = float("inf")
    x[4, 7] = float("nan")
    x = x.to(DEVICE)
    weight = torch.ones(96, device=DEVICE)
    for got, want in ((kernels.layernorm_fwd(x, weight, None, 1e-5, False),
                       reference.layernorm_fwd(x, weight, None, 1e-5, False)),
                      (kernels.rmsnorm_fwd(x, weight, 1e-5, False), reference.rmsnorm_fwd(x, weight, 1e-5, False))):
        assert torch.isfinite(got[-1][[0, 1, 2, 5]]).all()
        assert_close(got[-1].cpu(), want[-1].cpu(), dtype=torch.float32, name="rstd")
        assert_close(got[0].cpu(), want[0].cpu(), dtype=torch.float32, name="output")


def test_the_ops_dispatch_to_the_kernels_on_accelerators():
    for name in ("layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd", "add_layernorm_fwd",
                 "add_layernorm_bwd", "add_rmsnorm_fwd", "add_rmsnorm_bwd", "layernorm_fp8_fwd", "rmsnorm_fp8_fwd"):
        assert _registry.op_paths(name) == {"cpu": "kernel", "cuda": "triton", "musa": "triton"}
    x = torch.ones(2, 8, dtype=torch.float64)
    assert not kernels.supports("layernorm_fwd", (x, x[0], None, 1e-5, False))  # float64: the reference
    assert not kernels.supports("rmsnorm_bwd", (x, x.float().new_ones(2, kernels.MAX_HIDDEN + 1), None, x[0]))
    assert kernels.supports("rmsnorm_bwd", (x.float(), x.float(), x[:, 0].float(), x[0].bfloat16(), False))


_FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def _forward_variant(dtype, centered, bias, zero_centered, residual=False, fp8=None, write_output=True):
    data = POINTER[dtype]
    signature = {"X": data, "R": data, "W": data, "B": data, "Y": data, "SUM": data, "MEAN": "*fp32",
                 "RSTD": "*fp32", "SCALE": "*fp32", "Y_FP8": POINTER[fp8] if fp8 else data, "AMAX_PARTIAL": "*fp32",
                 "n_rows": "i32", "n_cols": "i32", "eps": "fp32", "CENTERED": "constexpr",
                 "ZERO_CENTERED_GAMMA": "constexpr", "HAS_BIAS": "constexpr", "HAS_RESIDUAL": "constexpr",
                 "WRITE_OUTPUT": "constexpr", "FP8_MAX": "constexpr", "BLOCK": "constexpr", "ROWS": "constexpr"}
    constexprs = {"CENTERED": centered, "ZERO_CENTERED_GAMMA": zero_centered, "HAS_BIAS": bias,
                  "HAS_RESIDUAL": residual, "WRITE_OUTPUT": write_output, "FP8_MAX": _FP8_MAX.get(fp8, 0.0),
                  "BLOCK": 1024, "ROWS": 4}
    name = f"norm_fwd[{dtype},centered={centered},bias={bias},residual={residual},fp8={fp8},output={write_output}]"
    return name, kernels._norm_fwd_kernel, signature, constexprs


def _backward_variant(dtype, centered, zero_centered, grad_sum=False):
    data = POINTER[dtype]
    signature = {"DY": data, "DSUM": data, "X": data, "MEAN": "*fp32", "RSTD": "*fp32", "W": data, "DX": data,
                 "DW_PARTIAL": "*fp32", "DB_PARTIAL": "*fp32", "n_rows": "i32", "n_cols": "i32",
                 "rows_per_program": "i32", "CENTERED": "constexpr", "ZERO_CENTERED_GAMMA": "constexpr",
                 "HAS_DSUM": "constexpr", "BLOCK": "constexpr"}
    constexprs = {"CENTERED": centered, "ZERO_CENTERED_GAMMA": zero_centered, "HAS_DSUM": grad_sum, "BLOCK": 1024}
    return (f"norm_bwd[{dtype},centered={centered},grad_sum={grad_sum}]", kernels._norm_bwd_kernel, signature,
            constexprs)


def compile_variants():
    """What tests/helpers/triton_compile.py compiles of triton/norm.py: the forward (centred or not, bias or not,
    zero-centred gamma or not, with a residual, with an FP8 output with or without the high-precision one) and the
    backward (with or without a residual's gradient), in bf16, fp32 and fp16."""
    found = []
    for dtype, centered, bias, zero_centered in (("bf16", True, True, False), ("bf16", False, False, False),
                                                 ("fp32", True, False, True), ("fp16", False, False, True)):
        found.append(_forward_variant(dtype, centered, bias, zero_centered))
        found.append(_backward_variant(dtype, centered, zero_centered))
    found.append(_forward_variant("bf16", True, True, False, residual=True))
    found.append(_forward_variant("bf16", False, False, False, residual=True))
    found.append(_backward_variant("bf16", True, False, grad_sum=True))
    found.append(_backward_variant("bf16", False, False, grad_sum=True))
    found.append(_forward_variant("bf16", True, True, False, fp8="e4m3", write_output=False))
    found.append(_forward_variant("bf16", False, False, True, fp8="e4m3", write_output=True))
    found.append(_forward_variant("fp32", False, False, False, fp8="e5m2", write_output=False))
    return found


def test_kernels_compile_for_hopper_and_blackwell():
    """sm_90 and sm_100 cubins for every kernel variant (compile_variants: forward 4
    plain, 2 with a residual, 3 to FP8; backward 4 plain, 2 with a residual's gradient), with
    no float64 instruction in the PTX and saturating FP8 conversions."""
    assert_compiles(compile_variants, count=15, fp8_variants=3)


def test_importing_the_package_does_not_import_triton():
    code = "import sys, transformer_engine.pytorch as te; te.build_info(); print('triton' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr[-2000:]

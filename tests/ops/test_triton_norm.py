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
from triton_harness import assert_compiles
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


def test_kernels_compile_for_hopper_and_blackwell():
    """sm_90 and sm_100 cubins for every kernel variant (tests/helpers/triton_variants/norm.py: forward 4
    plain, 2 with a residual, 3 to FP8; backward 4 plain, 2 with a residual's gradient), with
    no float64 instruction in the PTX and saturating FP8 conversions."""
    assert_compiles("norm", variants=15, fp8_variants=3)


def test_importing_the_package_does_not_import_triton():
    code = "import sys, transformer_engine.pytorch as te; te.build_info(); print('triton' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr[-2000:]

"""Shared fixtures: devices (CPU always, CUDA/MUSA when present), seeding, CPU SIMD tiers."""
import importlib.util
import os

import pytest
import torch

# Without a GPU the Triton kernels run on CPU tensors in Triton's interpreter, which Triton
# chooses once, when it is first imported (tests/ops/test_triton_*.py).
# Its float conversions are patched to round and saturate as the GPU's (triton_interpreter.py).
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    if importlib.util.find_spec("triton") is not None:
        from triton_interpreter import patch_casts
        patch_casts()

import backends
import transformer_engine.pytorch as te
from transformer_engine import _kernels


# The devices present: those of the backends (tests/helpers/backends.py), each once.
DEVICES = list(dict.fromkeys(backend.device.type for backend in backends.available()))

# The kernels stream the outputs of ops that move more than a quarter of the last-level cache,
# up to hundreds of MiB on large server parts; the tests size their streaming cases for
# 16 MiB, the lowest threshold, and set it.
DEFAULT_STREAMING_STORE_MIN_BYTES = _kernels.set_streaming_store_min_bytes(16 << 20)
_TIERS = ["portable", "avx2", "avx512", "amx"]
# The tiers this CPU has. amx runs the other families' avx512 builds and differs in the GEMM
# alone, so only the GEMM's tests (gemm_tier) run on it.
GEMM_TIERS = _TIERS[: _TIERS.index(_kernels.detected_cpu_isa()) + 1]
CPU_TIERS = [tier for tier in GEMM_TIERS if tier != "amx"]


@pytest.fixture(params=DEVICES)
def device(request):
    """Runs the test once per device present (CPU always, CUDA / MUSA where present): for tests of
    modules, which the device's kernels serve; op tests take `backend`, which also runs the
    Triton kernels in the interpreter without a GPU."""
    return torch.device(request.param)


@pytest.fixture(params=backends.available(), ids=str)
def backend(request):
    """Runs the test once per backend (tests/helpers/backends.py): the CPU kernels, the Triton kernels
    (in the interpreter without a GPU), and the GPUs present; tensors go to backend.device."""
    with backends.serving(request.param) as served:
        yield served


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(1234)


def _capped_at(tier):
    previous = _kernels.limit_cpu_isa(tier)
    try:
        assert te.build_info()["cpu_isa_active"] == tier
        yield tier
    finally:
        _kernels.limit_cpu_isa(previous)


@pytest.fixture(params=CPU_TIERS)
def cpu_tier(request):
    """Runs the test once per SIMD tier this CPU has (the kernels dispatch on the cap)."""
    yield from _capped_at(request.param)


@pytest.fixture(params=GEMM_TIERS)
def gemm_tier(request):
    """cpu_tier for the GEMM: also the AMX tiles where the CPU has them."""
    yield from _capped_at(request.param)


@pytest.fixture(params=[torch.bfloat16, torch.float32], ids=["bf16_gemm", "fp32_gemm"])
def cpu_gemm(request):
    """Runs the test with CPU GEMMs in bf16 (our bf16 kernel: what machines with AVX512-BF16 or
    AMX run) and in fp32, whatever this machine has."""
    from transformer_engine.pytorch.custom_ops.linear import set_cpu_gemm_dtype
    previous = set_cpu_gemm_dtype(request.param)
    try:
        yield request.param
    finally:
        set_cpu_gemm_dtype(previous)

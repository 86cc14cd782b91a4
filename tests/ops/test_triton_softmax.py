"""The Triton attention-softmax kernels (transformer_engine/pytorch/triton/softmax.py) against the
reference ops: on CUDA tensors where a GPU is present, else on CPU tensors in Triton's
interpreter (conftest.py). Every mask kind, fp32 / bf16 / fp16, odd shapes, one key, rows up to
MAX_KEYS, zero rows, the 3-D layout, broadcast and strided padding masks, fully masked rows,
rows with no key left, non-finite scores; that the ops dispatch to them; and that they compile
for sm_90 and sm_100 with no float64 arithmetic (tests/helpers/triton_harness.py)."""
import pytest
import torch

from backends import TRITON_DEVICE as DEVICE
from numerics import assert_close
from triton_harness import POINTER, assert_compiles
from transformer_engine.pytorch.custom_ops import _registry
from transformer_engine.pytorch.reference import softmax as reference

triton = pytest.importorskip("triton")
from transformer_engine.pytorch.triton import softmax as kernels  # noqa: E402

MASK_TYPES = ["none", "padding", "causal", "causal_bottom_right"]
# [b, h, sq, sk]; the largest is one register block of MAX_KEYS (2 programs of one row).
SHAPES = [(2, 3, 37, 69), (1, 2, 9, 3), (3, 1, 5, 1), (0, 2, 4, 4), (1, 1, 2, 10000)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SCALE = 0.37


def _square_if_causal(mask_type, shape):
    b, h, sq, sk = shape
    return (b, h, sq, sq) if mask_type == "causal" else shape


def _inputs(mask_type, shape, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=generator) * 3).to(dtype)
    dy = torch.randn(shape, generator=generator).to(dtype)
    mask = None
    if mask_type == "padding":
        b, _, sq, sk = shape
        mask = torch.rand(b, 1, sq, sk, generator=generator) < 0.3
        if sq > 1:
            mask[:, :, 1] = True  # a fully masked row: uniform 1/sk
    return [t.to(DEVICE) if t is not None else None for t in (x, mask, dy)]


def _check(x, mask, dy, mask_type, dtype, scale=SCALE):
    """Forward and backward against the reference, the backward from the reference's output."""
    got = kernels.scaled_softmax_fwd(x, mask, scale, mask_type)
    want = reference.scaled_softmax_fwd(x, mask, scale, mask_type)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert_close(got.cpu(), want.cpu(), dtype=dtype, name="output")
    got = kernels.scaled_softmax_bwd(dy, want, mask, scale, mask_type)
    want = reference.scaled_softmax_bwd(dy, want, mask, scale, mask_type)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert_close(got.cpu(), want.cpu(), dtype=dtype, name="grad_input")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("mask_type", MASK_TYPES)
def test_matches_reference(mask_type, shape, dtype):
    shape = _square_if_causal(mask_type, shape)
    x, mask, dy = _inputs(mask_type, shape, dtype)
    _check(x, mask, dy, mask_type, dtype)


@pytest.mark.parametrize("mask_type", ["none", "causal", "causal_bottom_right"])
def test_three_dimensional_layout(mask_type):
    """[b*h, sq, sk]: the causal masks' query index is the row's position within sq."""
    x, _, dy = _inputs(mask_type, _square_if_causal(mask_type, (1, 6, 7, 11)), torch.float32)
    _check(x[0], None, dy[0], mask_type, torch.float32)


def test_padding_masks_broadcast_and_strided():
    """Masks broadcast along batch, heads or queries, per head, and with a non-unit last stride."""
    x, _, dy = _inputs("none", (2, 3, 7, 33), torch.bfloat16)
    generator = torch.Generator().manual_seed(1)
    for mask in (torch.rand(1, 1, 7, 33, generator=generator) < 0.4,
                 torch.rand(2, 1, 1, 33, generator=generator) < 0.4,
                 torch.rand(2, 3, 7, 33, generator=generator) < 0.4,
                 torch.rand(1, 3, 1, 33, generator=generator) < 0.4,
                 (torch.rand(2, 1, 33, 7, generator=generator) < 0.4).transpose(-1, -2)):
        _check(x, mask.to(DEVICE), dy, "padding", torch.bfloat16)


def test_rows_without_keys_are_zero():
    """Bottom-right causal with sq > sk: the first sq - sk queries see no key (output and
    gradient 0, not NaN); a fully padding-masked row is uniform with a zero gradient."""
    x, _, dy = _inputs("none", (1, 2, 9, 4), torch.float32)
    y = kernels.scaled_softmax_fwd(x, None, 1.0, "causal_bottom_right")
    assert torch.equal(y[:, :, :5].cpu(), torch.zeros(1, 2, 5, 4))
    assert torch.equal(kernels.scaled_softmax_bwd(dy, y, None, 1.0, "causal_bottom_right")[:, :, :5].cpu(),
                       torch.zeros(1, 2, 5, 4))
    mask = torch.ones(1, 1, 9, 4, dtype=torch.bool, device=DEVICE)
    y = kernels.scaled_softmax_fwd(x, mask, 1.0, "padding")
    assert torch.equal(y.cpu(), torch.full((1, 2, 9, 4), 0.25))
    assert torch.equal(kernels.scaled_softmax_bwd(dy, y, mask, 1.0, "padding").cpu(), torch.zeros(1, 2, 9, 4))


def test_non_finite_scores_as_the_reference():
    """A NaN or +inf score makes its row NaN, a row of -inf scores is NaN (0 / 0), a -inf score
    among finite ones gives 0: what the reference (torch.softmax) gives. Other rows untouched."""
    x = torch.randn(1, 1, 6, 40, generator=torch.Generator().manual_seed(2))
    x[0, 0, 0, 17] = float("nan")
    x[0, 0, 1, 3] = float("inf")
    x[0, 0, 2] = float("-inf")
    x[0, 0, 3, 5:30] = float("-inf")
    x = x.to(DEVICE)
    for mask_type in ("none", "causal_bottom_right"):
        got = kernels.scaled_softmax_fwd(x, None, 1.0, mask_type).cpu()
        want = reference.scaled_softmax_fwd(x, None, 1.0, mask_type).cpu()
        assert torch.equal(got.isnan(), want.isnan())
        assert_close(got, want, name=mask_type)
        assert not got[0, 0, 4:].isnan().any()


def test_the_ops_dispatch_to_the_kernels_on_accelerators():
    for name in ("scaled_softmax_fwd", "scaled_softmax_bwd"):
        assert _registry.op_paths(name) == {"cpu": "kernel", "cuda": "triton", "musa": "triton"}
    x = torch.ones(1, 2, 3, 8)
    assert kernels.supports("scaled_softmax_fwd", (x, None, 1.0, "none"))
    assert kernels.supports("scaled_softmax_bwd", (x, x.bfloat16(), None, 1.0, "none"))
    assert not kernels.supports("scaled_softmax_fwd", (x.double(), None, 1.0, "none"))  # the reference
    long_rows = x.new_ones(1, 1, 2, kernels.MAX_KEYS + 1)
    assert not kernels.supports("scaled_softmax_bwd", (long_rows, long_rows, None, 1.0, "none"))


def compile_variants():
    """What tests/helpers/triton_compile.py compiles of triton/softmax.py: forward and backward with each mask kind
    (none, padding, causal; the two causal alignments differ only in a runtime offset), in bf16, fp16 and fp32."""
    found = []
    for dtype, padding, causal in (("bf16", False, False), ("bf16", True, False), ("fp16", False, True),
                                   ("fp32", True, False)):
        data = POINTER[dtype]
        mask = POINTER["u8"] if padding else data  # without a mask the output pointer stands in
        shape = {"n_rows": "i32", "sq": "i32", "sk": "i32", "heads": "i32", "causal_offset": "i32",
                 "mask_stride_b": "i64", "mask_stride_h": "i64", "mask_stride_q": "i64", "scale": "fp32",
                 "PADDING": "constexpr", "CAUSAL": "constexpr", "BLOCK": "constexpr", "ROWS": "constexpr"}
        constexprs = {"PADDING": padding, "CAUSAL": causal, "BLOCK": 2048, "ROWS": 2}
        name = f"{dtype},padding={padding},causal={causal}"
        found.append((f"softmax_fwd[{name}]", kernels._softmax_fwd_kernel,
                      {"X": data, "MASK": mask, "Y": data, **shape}, constexprs))
        found.append((f"softmax_bwd[{name}]", kernels._softmax_bwd_kernel,
                      {"DY": data, "Y": data, "MASK": mask, "DX": data, **shape}, constexprs))
    return found


def test_kernels_compile_for_hopper_and_blackwell():
    """sm_90 and sm_100 cubins for every kernel variant, with no float64 instruction in the PTX:
    forward and backward, each in 4 mask/dtype variants (compile_variants)."""
    assert_compiles(compile_variants, count=8)

"""The Triton cross-entropy kernels (transformer_engine/pytorch/triton/cross_entropy.py) against
the reference ops: on CUDA tensors where a GPU is present, else on CPU tensors in Triton's
interpreter (conftest.py). fp32 / bf16 / fp16 logits, vocabularies from 1 to 128k (one slice,
several, a partial last one), label smoothing, ignored rows, grad_scale of the tensor or per
row, the loss alone, zero rows, large and non-finite logits, out-of-range targets; the
backward; that the ops dispatch to them; and that they compile for sm_90 and sm_100 with no
float64 arithmetic (tests/helpers/triton_harness.py)."""
import pytest
import torch
import torch.nn.functional as F

from backends import TRITON_DEVICE as DEVICE
from numerics import assert_close
from triton_harness import POINTER, assert_compiles
from transformer_engine.pytorch.custom_ops import _registry
from transformer_engine.pytorch.reference import cross_entropy as reference

triton = pytest.importorskip("triton")
from transformer_engine.pytorch.triton import cross_entropy as kernels  # noqa: E402

# [rows, vocab]: one logit; one partial slice; one full slice; a slice and one more logit;
# several slices with a partial last one; zero rows.
SHAPES = [(1, 1), (37, 69), (5, 4096), (3, 4097), (4, 20000), (0, 10)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _inputs(shape, dtype, seed=0, ignore_index=-100):
    generator = torch.Generator().manual_seed(seed)
    rows, vocab = shape
    logits = (torch.randn(shape, generator=generator) * 3).to(dtype)
    target = torch.randint(0, vocab, (rows,), generator=generator)
    target[::3] = ignore_index
    return logits.to(DEVICE), target.to(DEVICE)


def _grad_scales(rows):
    return {"none": None, "tensor": torch.tensor(0.37, device=DEVICE),
            "rows": torch.rand(rows, generator=torch.Generator().manual_seed(5)).to(DEVICE)}


def _check_forward(logits, target, label_smoothing, grad_scale, ignore_index=-100, compute_grad=True):
    loss, grad = kernels.cross_entropy_fwd(logits, target, label_smoothing, ignore_index, compute_grad, grad_scale)
    loss_ref, grad_ref = reference.cross_entropy_fwd(logits, target, label_smoothing, ignore_index, compute_grad,
                                                     grad_scale)
    assert loss.dtype == loss_ref.dtype == torch.float32 and grad.dtype == logits.dtype
    assert grad.shape == grad_ref.shape
    # Sums of exponentials over the vocabulary, in another order: a few fp32 ulps of the loss.
    assert_close(loss.cpu(), loss_ref.cpu(), name="loss", rtol=1e-5)
    assert_close(grad.cpu(), grad_ref.cpu(), dtype=logits.dtype, name="grad")
    return loss, grad


@pytest.mark.parametrize("grad_scale", ["none", "tensor", "rows"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_matches_reference(shape, dtype, label_smoothing, grad_scale):
    logits, target = _inputs(shape, dtype)
    _check_forward(logits, target, label_smoothing, _grad_scales(shape[0])[grad_scale])


def test_loss_alone():
    logits, target = _inputs((37, 69), torch.bfloat16)
    loss, grad = _check_forward(logits, target, 0.1, None, compute_grad=False)
    assert grad.shape == (0, 69)


def test_large_vocabulary():
    """A 128k vocabulary (32 slices of 4096), every row kept, a custom ignore_index."""
    logits, target = _inputs((2, 131072 + 5), torch.bfloat16, ignore_index=7)
    _check_forward(logits, target, 0.1, torch.tensor(0.5, device=DEVICE), ignore_index=7)


def test_ignored_rows_are_zero_whatever_their_logits():
    logits, target = _inputs((4, 300), torch.float32)
    logits[1] = float("nan")
    target[1] = -100
    loss, grad = kernels.cross_entropy_fwd(logits, target, 0.1, -100, True, None)
    assert loss[1].item() == 0.0 and torch.equal(grad[1].cpu(), torch.zeros(300))
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()


def test_large_logits_keep_the_small_part_of_the_loss():
    """The loss is formed relative to the row max, and the smoothing term from differences of
    logits: near 1e5 (an fp32 ulp of 0.008) the loss keeps its fp32 precision."""
    for label_smoothing in (0.0, 0.1):
        two = torch.tensor([[1e30, 1e30]], device=DEVICE)
        loss, _ = kernels.cross_entropy_fwd(two, torch.tensor([0], device=DEVICE), label_smoothing, -100, False)
        assert_close(loss.cpu().double(), torch.tensor([0.6931471805599453], dtype=torch.float64), rtol=1e-6)
        for offset in (1e5, 3e6, -2e7):
            generator = torch.Generator().manual_seed(3)
            x = torch.randn(6, 5000, generator=generator) * 2 + offset
            target = torch.randint(0, 5000, (6,), generator=generator)
            want = F.cross_entropy(x.double(), target, label_smoothing=label_smoothing, reduction="none")
            loss, _ = kernels.cross_entropy_fwd(x.to(DEVICE), target.to(DEVICE), label_smoothing, -100, False)
            assert_close(loss.cpu().double(), want, rtol=2e-6, atol=1e-6)


def test_non_finite_logits():
    """-inf logits count 0 (as torch; with label smoothing the loss is inf); a NaN or +inf
    logit makes its row's loss and gradient NaN (as the reference); the rows are independent."""
    x = torch.randn(6, 5000, generator=torch.Generator().manual_seed(4))
    target = torch.tensor([1, 2, 3, 4, 5, 6])
    x[0, 100:4500] = float("-inf")  # across slices, the target's among the finite ones
    x[1, 7] = float("nan")
    x[2, 4999] = float("inf")
    x[3, 0] = float("-inf")
    x[4, 5] = float("-inf")  # the target logit: infinite loss
    x, target = x.to(DEVICE), target.to(DEVICE)
    loss, grad = kernels.cross_entropy_fwd(x, target, 0.0, -100, True, None)
    want = F.cross_entropy(x.double(), target, reduction="none")
    assert_close(loss.cpu().double(), want.cpu(), rtol=2e-6, atol=1e-6)
    # The reference leaves the smoothing term (inf) out without smoothing, as torch: all of it compares.
    _check_forward(x, target, 0.0, None)
    _check_forward(x, target, 0.1, None)


def test_out_of_range_target_gives_nan_not_a_stray_read():
    """The op refuses such targets where it can read them (custom_ops/cross_entropy.py);
    the kernel itself poisons the row instead of reading outside it."""
    logits, _ = _inputs((3, 50), torch.float32)
    target = torch.tensor([4, 50, -2], device=DEVICE)
    loss, grad = kernels.cross_entropy_fwd(logits, target, 0.0, -100, True, None)
    assert torch.isfinite(loss[0]) and torch.isfinite(grad[0]).all()
    assert loss[1:].isnan().all() and grad[1:].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(37, 69), (3, 9000), (0, 10)], ids=str)
def test_backward_matches_reference(shape, dtype):
    logits, target = _inputs(shape, dtype)
    grad = reference.cross_entropy_fwd(logits, target, 0.1, -100, True)[1]
    grad_loss = torch.randn(shape[0], generator=torch.Generator().manual_seed(6)).to(DEVICE)
    got = kernels.cross_entropy_bwd(grad, grad_loss)
    want = reference.cross_entropy_bwd(grad, grad_loss)
    assert got.dtype == dtype and got.shape == want.shape
    assert torch.equal(got.cpu(), want.cpu())  # one fp32 product, rounded once, in both


def test_non_contiguous_arguments():
    logits = torch.randn(300, 12, generator=torch.Generator().manual_seed(7)).to(DEVICE).t()  # [12, 300]
    target = torch.randint(0, 300, (12, 2), generator=torch.Generator().manual_seed(8)).to(DEVICE)[:, 1]
    _check_forward(logits, target, 0.1, None)
    grad_loss = torch.randn(12, 2, device=DEVICE)[:, 0]
    assert torch.equal(kernels.cross_entropy_bwd(logits, grad_loss).cpu(),
                       reference.cross_entropy_bwd(logits, grad_loss).cpu())


def test_the_ops_dispatch_to_the_kernels_on_accelerators():
    for name in ("cross_entropy_fwd", "cross_entropy_bwd"):
        assert _registry.op_paths(name) == {"cpu": "kernel", "cuda": "triton", "musa": "triton"}
    logits, target = torch.ones(2, 8), torch.zeros(2, dtype=torch.long)
    assert kernels.supports("cross_entropy_fwd", (logits.bfloat16(), target, 0.0, -100, True, None))
    assert kernels.supports("cross_entropy_bwd", (logits, torch.ones(2)))
    assert not kernels.supports("cross_entropy_fwd", (logits.double(), target, 0.0, -100, True, None))


def compile_variants():
    """What tests/helpers/triton_compile.py compiles of triton/cross_entropy.py: the forward with and without the
    gradient, label smoothing and a grad_scale, and the backward, in bf16, fp16 and fp32; the vocabulary split's
    partials and gradient in bf16."""
    found = []
    for dtype, compute_grad, smoothing, grad_scale in (("bf16", True, False, True), ("bf16", True, True, False),
                                                       ("fp16", False, True, False), ("fp32", True, True, True)):
        data = POINTER[dtype]
        signature = {"LOGITS": data, "TARGET": "*i64", "GRAD_SCALE": "*fp32", "LOSS": "*fp32", "GRAD": data,
                     "vocab": "i32", "ignore_index": "i32", "label_smoothing": "fp32", "grad_scale_stride": "i32",
                     "HAS_GRAD_SCALE": "constexpr", "SMOOTHING": "constexpr", "COMPUTE_GRAD": "constexpr",
                     "CHUNK": "constexpr"}
        constexprs = {"HAS_GRAD_SCALE": grad_scale, "SMOOTHING": smoothing, "COMPUTE_GRAD": compute_grad,
                      "CHUNK": 4096}
        found.append((f"cross_entropy_fwd[{dtype},grad={compute_grad},smoothing={smoothing},scale={grad_scale}]",
                      kernels._cross_entropy_fwd_kernel, signature, constexprs))
    for dtype in ("bf16", "fp16", "fp32"):
        data = POINTER[dtype]
        found.append((f"cross_entropy_bwd[{dtype}]", kernels._cross_entropy_bwd_kernel,
                      {"GRAD": data, "GRAD_LOSS": "*fp32", "GRAD_LOGITS": data, "vocab": "i32", "BLOCK": "constexpr"},
                      {"BLOCK": 4096}))
    found.append(("cross_entropy_partials[bf16]", kernels._partials_kernel,
                  {"LOGITS": "*bf16", "TARGET": "*i64", "PARTIALS": "*fp32", "shard": "i32", "vocab_start": "i32",
                   "ignore_index": "i32", "CHUNK": "constexpr"}, {"CHUNK": 4096}))
    found.append(("cross_entropy_sharded_grad[bf16]", kernels._sharded_grad_kernel,
                  {"LOGITS": "*bf16", "TARGET": "*i64", "ROW_MAX": "*fp32", "SUM_EXP": "*fp32", "GRAD_LOSS": "*fp32",
                   "GRAD": "*bf16", "shard": "i32", "vocab_start": "i32", "vocab_size": "i32", "ignore_index": "i32",
                   "label_smoothing": "fp32", "CHUNK": "constexpr"}, {"CHUNK": 4096}))
    return found


def test_kernels_compile_for_hopper_and_blackwell():
    """sm_90 and sm_100 cubins for every kernel variant, with no float64 instruction in the PTX:
    4 forward variants, 3 backward and the split vocabulary's partials and gradient
    (compile_variants)."""
    assert_compiles(compile_variants, count=9)

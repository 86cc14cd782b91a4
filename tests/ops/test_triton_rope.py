"""The Triton RoPE kernel (transformer_engine/pytorch/triton/rope.py) against the reference ops:
on CUDA tensors where a GPU is present, else on CPU tensors in Triton's interpreter
(conftest.py). Every format, halves and interleaved pairs, partial rotary dims, start
positions, empty and many packed sequences, several blocks of heads, odd sizes, no tokens or
no heads, non-contiguous input; the float32 sin / cos against float64 up to large angles; that
the ops dispatch to it; and that it compiles for sm_90 and sm_100 with no float64 arithmetic
(tests/helpers/triton_harness.py)."""
import pytest
import torch

from backends import TRITON_DEVICE as DEVICE
from numerics import assert_close
from triton_harness import POINTER, assert_compiles
from transformer_engine.pytorch.custom_ops import _registry
from transformer_engine.pytorch.reference import rope as reference

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from transformer_engine.pytorch.triton import rope as kernels  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _case(tensor_format, shape, rotary_dim, dtype, seq_lens=None, starts=None, seed=0):
    """(input, freqs, cu_seqlens, start_positions): arbitrary angles, so that no symmetry between
    a pair's two channels hides a mix-up."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator).to(dtype)
    cu_seqlens = torch.tensor([0] + seq_lens).cumsum(0).to(torch.int32) if seq_lens is not None else None
    start_positions = torch.tensor(starts) if starts is not None else None
    freqs = torch.randn(64, 1, 1, rotary_dim, generator=generator) * 4
    return [t.to(DEVICE) if t is not None else None for t in (x, freqs, cu_seqlens, start_positions)]


def _assert_matches_reference(x, freqs, tensor_format, interleaved, cu_seqlens, start_positions):
    args = (freqs, tensor_format, interleaved, cu_seqlens, start_positions)
    for name, kernel, ref in (("forward", kernels.rope_fwd, reference.rope_fwd),
                              ("backward", kernels.rope_bwd, reference.rope_bwd)):
        got, want = kernel(x, *args), ref(x, *args)
        assert got.dtype == x.dtype and got.shape == x.shape and got.is_contiguous()
        assert_close(got.cpu(), want.cpu(), name=f"{tensor_format} {name}")
        rotary_dim = freqs.shape[-1]
        assert torch.equal(got[..., rotary_dim:], x[..., rotary_dim:]), f"{name}: pass-through channels"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "pairs"])
@pytest.mark.parametrize("rotary_dim", [24, 10, 2], ids=lambda d: f"d2={d}")
@pytest.mark.parametrize("tensor_format,shape,seq_lens,starts", [
    ("sbhd", (7, 3, 5, 24), None, None), ("sbhd", (7, 3, 5, 24), None, [3, 0, 9]),
    ("bshd", (2, 9, 3, 27), None, [1, 5]), ("thd", (16, 3, 25), [5, 0, 8, 3], None),
    ("thd", (16, 3, 25), [5, 0, 8, 3], [2, 7, 0, 4])], ids=["sbhd", "sbhd-start", "bshd-start", "thd", "thd-start"])
def test_matches_reference(tensor_format, shape, seq_lens, starts, rotary_dim, interleaved, dtype):
    if rotary_dim > shape[-1]:
        pytest.skip("rotary dim above the head dim")
    x, freqs, cu_seqlens, start_positions = _case(tensor_format, shape, rotary_dim, dtype, seq_lens, starts)
    _assert_matches_reference(x, freqs, tensor_format, interleaved, cu_seqlens, start_positions)


def test_several_blocks_of_heads():
    """40 heads of 128 channels: blocks of 16 heads, the last one partly outside."""
    x, freqs, _, start_positions = _case("bshd", (2, 2, 40, 128), 96, torch.bfloat16, starts=[4, 1])
    for interleaved in (False, True):
        _assert_matches_reference(x, freqs, "bshd", interleaved, None, start_positions)


def test_many_packed_sequences():
    """More sequences than one step of the kernel's search through cu_seqlens compares, most of
    them empty: a token's sequence is found across steps."""
    seq_lens = [0] * 300
    seq_lens[0], seq_lens[255], seq_lens[256], seq_lens[299] = 2, 3, 1, 4
    x, freqs, cu_seqlens, _ = _case("thd", (10, 2, 16), 16, torch.float32, seq_lens)
    start_positions = (torch.arange(300) % 7).to(DEVICE)
    _assert_matches_reference(x, freqs, "thd", False, cu_seqlens, start_positions)
    _assert_matches_reference(x, freqs, "thd", True, cu_seqlens.long(), None)


def test_non_contiguous_input_and_angles():
    base, freqs, _, _ = _case("sbhd", (3, 6, 4, 32), 64, torch.float32)
    x = base.transpose(0, 1)  # [6, 3, 4, 32] sbhd, strided
    _assert_matches_reference(x, freqs[..., ::2], "sbhd", True, None, None)


@pytest.mark.parametrize("tensor_format,shape,seq_lens", [
    ("sbhd", (0, 2, 3, 8), None), ("bshd", (2, 0, 3, 8), None), ("sbhd", (4, 2, 0, 8), None),
    ("thd", (0, 3, 8), [0, 0])], ids=str)
def test_no_tokens_or_no_heads_launch_nothing(tensor_format, shape, seq_lens):
    x, freqs, cu_seqlens, _ = _case(tensor_format, shape, 8, torch.bfloat16, seq_lens)
    for kernel in (kernels.rope_fwd, kernels.rope_bwd):
        out = kernel(x, freqs, tensor_format, False, cu_seqlens, None)
        assert out.shape == x.shape and out.dtype == x.dtype


@triton.jit
def _sin_cos_kernel(ANGLES, SIN, COS, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    sin, cos = kernels._sin_cos(tl.load(ANGLES + offsets, mask=mask, other=0.0))
    tl.store(SIN + offsets, sin, mask=mask)
    tl.store(COS + offsets, cos, mask=mask)


@pytest.mark.parametrize("scale", [1.0, 100.0, 1e4, 1e6], ids=str)
def test_sin_cos_within_1e7_of_exact(scale):
    """The kernel's float32 sin and cos against float64 ones of the same float32 angles, up to
    the angles of a million-token context: within 1e-7 (PyTorch's float32 ones: 3.5e-8)."""
    angles = ((torch.rand(1 << 14, generator=torch.Generator().manual_seed(1)) * 2 - 1) * scale).to(DEVICE)
    sin, cos = torch.empty_like(angles), torch.empty_like(angles)
    _sin_cos_kernel[(4,)](angles, sin, cos, angles.numel(), BLOCK=4096)
    exact = angles.cpu().double()
    assert (sin.cpu().double() - exact.sin()).abs().max().item() < 1e-7
    assert (cos.cpu().double() - exact.cos()).abs().max().item() < 1e-7


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # the interpreter's NaN -> int32
def test_non_finite_angles_give_nan():
    angles = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0], device=DEVICE)
    sin, cos = torch.empty_like(angles), torch.empty_like(angles)
    _sin_cos_kernel[(1,)](angles, sin, cos, 4, BLOCK=4)
    assert sin[:3].isnan().all() and cos[:3].isnan().all()
    assert sin[3].item() == 0.0 and cos[3].item() == 1.0


def test_the_ops_dispatch_to_the_kernel_on_accelerators():
    for name in ("rope_fwd", "rope_bwd"):
        assert _registry.op_paths(name) == {"cpu": "kernel", "cuda": "triton", "musa": "triton"}
    freqs = torch.zeros(4, 1, 1, 8)
    bf16 = torch.zeros(4, 1, 2, 8, dtype=torch.bfloat16)
    assert kernels.supports("rope_fwd", (bf16, freqs, "sbhd", False, None, None))
    wide = torch.zeros(4, 1, 1, kernels.MAX_HEAD_DIM + 2)
    assert not kernels.supports("rope_bwd", (wide, freqs, "sbhd", False, None, None))  # the reference


def compile_variants():
    """What tests/helpers/triton_compile.py compiles of triton/rope.py: each format, halves and interleaved pairs,
    forward and backward, with and without start_positions and pass-through channels, in bf16, fp32 and fp16."""
    found = []
    for dtype, tensor_format, interleaved, backward, has_start, pass_block in (
            ("bf16", "sbhd", False, False, False, 0), ("bf16", "sbhd", False, True, True, 64),
            ("bf16", "bshd", True, False, True, 0), ("fp32", "thd", False, False, True, 0),
            ("fp16", "thd", True, True, False, 32)):
        data = POINTER[dtype]
        signature = {"X": data, "Y": data, "FREQS": "*fp32", "CU_SEQLENS": "*i64", "START_POSITIONS": "*i64",
                     "seq_len": "i32", "batch": "i32", "heads": "i32", "head_dim": "i32", "pairs": "i32",
                     "FORMAT": "constexpr", "INTERLEAVED": "constexpr", "BACKWARD": "constexpr",
                     "HAS_START": "constexpr", "HEADS_BLOCK": "constexpr", "PAIRS_BLOCK": "constexpr",
                     "PASS_BLOCK": "constexpr", "SEQUENCES_BLOCK": "constexpr"}
        constexprs = {"FORMAT": tensor_format, "INTERLEAVED": interleaved, "BACKWARD": backward,
                      "HAS_START": has_start, "HEADS_BLOCK": 16, "PAIRS_BLOCK": 64, "PASS_BLOCK": pass_block,
                      "SEQUENCES_BLOCK": 256}
        name = (f"rope_{'bwd' if backward else 'fwd'}[{dtype},{tensor_format},"
                f"{'pairs' if interleaved else 'halves'},start={has_start},pass={pass_block > 0}]")
        found.append((name, kernels._rope_kernel, signature, constexprs))
    return found


def test_kernel_compiles_for_hopper_and_blackwell():
    """sm_90 and sm_100 cubins for 5 variants (compile_variants: every format,
    halves and pairs, forward and backward, start positions, pass-through channels; bf16, fp32,
    fp16), with no float64 instruction and no inexact division in the PTX."""
    assert_compiles(compile_variants, count=5, exact_division=True)

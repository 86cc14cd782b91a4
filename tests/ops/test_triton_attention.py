"""The Triton flash-attention kernels (transformer_engine/pytorch/triton/attention.py) against the
float64 reference and the CPU kernel: on CUDA tensors where a GPU is present, else on CPU tensors
in Triton's interpreter (conftest.py). Every mask structure (causal top-left and bottom-right,
windows), GQA / MQA, (dk, dv) pairs, padded lengths, packed sequences with gaps and empty ones,
ALiBi, sinks with their gradient, rows that see no key, the max logit, fp32 / bf16 / fp16;
forward and every gradient; determinism; what supports() leaves to the reference; and that the
kernels compile for sm_90 and sm_100 with no float64 arithmetic (tests/helpers/triton_harness.py)."""
import pytest
import torch

from backends import TRITON_DEVICE as DEVICE
from flash_attention_check import fwd_args
from numerics import assert_close
from triton_harness import POINTER, assert_compiles
from transformer_engine.pytorch import reference

triton = pytest.importorskip("triton")
from transformer_engine.pytorch.triton import attention as kernels  # noqa: E402

ops = torch.ops.portable_te


def _run(q, k, v, dtype, **options):
    """The Triton forward and backward of one call against the float64 reference (D from the
    kernel's own out, as the op defines it) and, on the CPU, the CPU kernel; returns (out, grads)."""
    scale = q.shape[-1] ** -0.5
    ours = [t.to(dtype).to(DEVICE) for t in (q, k, v)]
    extra = {name: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for name, t in options.items()}
    args = fwd_args(*ours, scale=scale, last=True, **extra)
    out, lse, max_logit = kernels.flash_attention_fwd(*args)
    exact = [t.to(dtype).double() for t in (q, k, v)]
    ref_options = {name: (t.double() if name == "softmax_offset" else t) for name, t in options.items()}
    want_out, want_lse, want_logit = reference.flash_attention_fwd(*fwd_args(*exact, scale=scale, last=True,
                                                                             **ref_options))
    assert out.dtype == dtype and lse.dtype == torch.float64
    assert_close(out.cpu(), want_out, dtype=dtype, name="out")
    seen = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), seen)
    torch.testing.assert_close(lse.cpu()[seen], want_lse[seen], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(max_logit.cpu().double(), want_logit.double(), rtol=1e-5, atol=1e-5)
    grad_out = torch.randn(out.shape).to(dtype)
    bwd = fwd_args(*ours, scale=scale, last=False, **extra)
    grads = kernels.flash_attention_bwd(grad_out.to(DEVICE), *bwd[:3], out, lse, *bwd[3:])
    ref_bwd = fwd_args(*exact, scale=scale, last=False, **ref_options)
    want = reference.flash_attention_bwd(grad_out.double(), *ref_bwd[:3], out.cpu().double(), want_lse, *ref_bwd[3:])
    for name, got, expected in zip(("grad_q", "grad_k", "grad_v"), grads[:3], want[:3]):
        assert got.dtype == dtype and got.shape == expected.shape
        assert_close(got.cpu(), expected, dtype=dtype, name=name, atol=1e-4)
    if options.get("softmax_offset") is not None:
        torch.testing.assert_close(grads[4].cpu().double(), want[4].double(), rtol=1e-4, atol=1e-5)
    if DEVICE.type == "cpu":  # the CPU kernel on the same call
        cpu_out = ops.flash_attention_fwd(*fwd_args(*[t.cpu() for t in ours], scale=scale, last=True, **options))[0]
        assert_close(out, cpu_out, dtype=dtype, name="out against the CPU kernel")
    return out, grads


MASKS = {"none": ((-1, -1), False), "causal": ((-1, 0), False), "causal_bottom_right": ((-1, 0), True),
         "window": ((7, 3), False), "window_bottom_right": ((5, 0), True)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(37, 69), (69, 37), (130, 70)], ids=["sq<skv", "sq>skv", "blocks"])
@pytest.mark.parametrize("mask", MASKS)
def test_masks(mask, shape, dtype):
    (window, bottom_right), (sq, skv) = MASKS[mask], shape
    q, k, v = torch.randn(2, 4, sq, 24), torch.randn(2, 2, skv, 24), torch.randn(2, 2, skv, 16)
    _run(q, k, v, dtype, window=window, bottom_right=bottom_right)


@pytest.mark.parametrize("heads,groups,dims", [(4, 4, (64, 64)), (6, 1, (48, 32)), (4, 2, (192, 128))],
                         ids=["mha_64", "mqa_48/32", "gqa_mla_192/128"])
def test_gqa_and_head_dims(heads, groups, dims):
    q, k, v = torch.randn(1, heads, 33, dims[0]), torch.randn(1, groups, 33, dims[0]), torch.randn(1, groups, 33, dims[1])
    _run(q, k, v, torch.bfloat16, window=(-1, 0))


def test_fp16():
    q, k, v = torch.randn(2, 2, 40, 32), torch.randn(2, 2, 40, 32), torch.randn(2, 2, 40, 32)
    _run(q, k, v, torch.float16, window=(-1, 0))


def test_padded_lengths_and_rows_without_keys():
    """Sequences shorter than the tensor (zero rows past them), and a bottom-right window that
    leaves the first queries without keys: zero output, -inf lse, no gradient, no NaN."""
    q, k, v = torch.randn(3, 2, 40, 16), torch.randn(3, 2, 50, 16), torch.randn(3, 2, 50, 16)
    cu_q, cu_kv = torch.tensor([0, 40, 41, 41]), torch.tensor([0, 50, 57, 60])
    out, grads = _run(q, k, v, torch.float32, window=(-1, 0), bottom_right=True, cu_seqlens_q=cu_q,
                      cu_seqlens_kv=cu_kv)
    assert not out[1, :, 1:].any() and not out[2].any()
    q, k, v = torch.randn(1, 2, 20, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    out, grads = _run(q, k, v, torch.float32, window=(-1, 0), bottom_right=True)
    assert not out[:, :, :15].any() and not grads[0][:, :, :15].any()


def test_packed_sequences_with_gaps_and_empty_ones():
    lengths = [5, 0, 33, 1, 70]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    padded = torch.tensor([0] + (torch.tensor(lengths) + 3).cumsum(0).tolist(), dtype=torch.int32)
    tokens = int(padded[-1])
    q, k, v = torch.randn(tokens, 4, 16), torch.randn(tokens, 2, 16), torch.randn(tokens, 2, 16)
    out, _ = _run(q, k, v, torch.bfloat16, window=(-1, 0), bottom_right=True, cu_seqlens_q=cu, cu_seqlens_kv=cu,
                  cu_seqlens_q_padded=padded, cu_seqlens_kv_padded=padded)
    assert not out[5:8].any(), "the gap after the first sequence stays zero"


@pytest.mark.parametrize("per_sequence", [False, True], ids=["slopes[h]", "slopes[b,h]"])
def test_alibi(per_sequence):
    q, k, v = torch.randn(2, 4, 33, 16), torch.randn(2, 4, 41, 16), torch.randn(2, 4, 41, 16)
    slopes = torch.rand(2, 4) if per_sequence else torch.rand(4)
    _run(q, k, v, torch.float32, window=(5, 3), alibi_slopes=slopes)


def test_sinks_and_their_gradient():
    q, k, v = torch.randn(2, 4, 30, 16), torch.randn(2, 2, 30, 16), torch.randn(2, 2, 30, 16)
    _run(q, k, v, torch.float32, window=(-1, 0), softmax_offset=torch.randn(4))


def test_deterministic():
    q, k, v = (torch.randn(1, 4, 90, 32).to(DEVICE) for _ in range(3))
    args = fwd_args(q, k, v[:, :4], scale=0.2, window=(-1, 0), last=True)
    first, second = kernels.flash_attention_fwd(*args), kernels.flash_attention_fwd(*args)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    bwd = fwd_args(q, k, v, scale=0.2, window=(-1, 0), last=False)
    grads = [kernels.flash_attention_bwd(first[0], *bwd[:3], first[0], first[1], *bwd[3:]) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(grads[0][:3], grads[1][:3]))


@pytest.mark.parametrize("what", ["bias", "mask", "dropout", "softcap", "float64"])
def test_supports_leaves_the_rest_to_the_reference(what):
    q, k, v = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    options = {"bias": dict(bias=torch.randn(1, 2, 8, 8)), "mask": dict(mask=torch.zeros(1, 1, 8, 8, dtype=torch.bool)),
               "dropout": dict(dropout=0.1, dropout_rng=torch.tensor([1, 2])), "softcap": dict(softcap=5.0),
               "float64": {}}[what]
    if what == "float64":
        q, k, v = q.double(), k.double(), v.double()
    assert kernels.supports("flash_attention_fwd", fwd_args(q, k, v, last=True, **options)) is False
    assert kernels.supports("flash_attention_fwd", fwd_args(q.float(), k.float(), v.float(), last=True))


def compile_variants():
    """What tests/helpers/triton_compile.py compiles of triton/attention.py: the forward, dK/dV
    and dQ kernels in bf16 (causal bottom-right with ALiBi and a sink in the forward) and fp32
    (plain), head dim 128, and D's kernel."""
    found = []
    for dtype, alibi in (("bf16", True), ("fp32", False)):
        data = POINTER[dtype]
        head = {"batch": "i32", "heads": "i32"}
        sizes = {"dk": "i32", "dv": "i32", "scale": "fp32", "window_left": "i32", "window_right": "i32",
                 "slopes_sb": "i32"}
        strides = lambda *names: {f"{n}_{s}": "i64" for n in names for s in ("sb", "sh", "st")}  # noqa: E731
        flags = {"BOTTOM_RIGHT": alibi, "HAS_ALIBI": alibi, "FP32": dtype == "fp32", "BLOCK_M": 64, "BLOCK_N": 64,
                 "BLOCK_DK": 128, "BLOCK_DV": 128}
        tables = {"LENS": "*i32", "STARTS": "*i64", "SLOPES": "*fp32"}
        found.append((f"attention_fwd[{dtype}]", kernels._fwd_kernel,
                      {"Q": data, "K": data, "V": data, "OUT": data, "LSE": "*fp32", "ROW_MAX": "*fp32", **tables,
                       "SINK": "*fp32", **strides("q", "k", "v", "o", "l"), **head, "ratio": "i32", **sizes,
                       **{name: "constexpr" for name in ("HAS_SINK", *flags)}}, {**flags, "HAS_SINK": alibi}))
        grads = {"Q": data, "K": data, "V": data, "DOUT": data, "LSE": "*fp32", "DELTA": "*fp32"}
        plain = {**flags, "FP8": False, "GRAD_E5M2": False}
        found.append((f"attention_dkdv[{dtype}]", kernels._dkdv_kernel,
                      {**grads, "DK": data, "DV": data, **tables, **strides("q", "k", "v", "do", "l"), **head,
                       "kv_heads": "i32", **sizes, "probs_scale": "fp32", "grad_scores_scale": "fp32",
                       "dp_factor": "fp32", "dk_factor": "fp32", "dv_factor": "fp32",
                       **{name: "constexpr" for name in plain}}, plain))
        found.append((f"attention_dq[{dtype}]", kernels._dq_kernel,
                      {**grads, "DQ": data, "AMAX": "*fp32", **tables, **strides("q", "k", "v", "do", "l"), **head,
                       "ratio": "i32", **sizes, "grad_scores_scale": "fp32", "dp_factor": "fp32", "dq_factor": "fp32",
                       **{name: "constexpr" for name in plain}}, plain))
    found.append(("attention_delta[bf16]", kernels._delta_kernel,
                  {"OUT": POINTER["bf16"], "DOUT": POINTER["bf16"], "DELTA": "*fp32", "n_rows": "i32", "dv": "i32",
                   "factor": "fp32", "BLOCK_ROWS": "constexpr", "BLOCK_DV": "constexpr"},
                  {"BLOCK_ROWS": 32, "BLOCK_DV": 128}))
    return found


def test_kernels_compile_for_hopper_and_blackwell():
    """sm_90 and sm_100 cubins for every kernel variant, with no float64 instruction in the PTX."""
    assert_compiles(compile_variants, count=7)

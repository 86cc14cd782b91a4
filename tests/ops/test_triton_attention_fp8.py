"""The Triton FP8 attention kernels (transformer_engine/pytorch/triton/attention_fp8.py) against
the plain-PyTorch emulation (reference/attention_fp8.py): on CUDA tensors where a GPU is present,
else on CPU tensors in Triton's interpreter (conftest.py). Masks, GQA, packed sequences, ALiBi,
sinks, both formats of G, fp32 and bf16 code values; out, lse, the amaxes and every gradient;
rows that see nothing; what supports() leaves to the reference; and that the kernels compile for
sm_90 and sm_100 with saturating FP8 conversions and no float64 arithmetic."""
import pytest
import torch

from backends import TRITON_DEVICE as DEVICE
from flash_attention_check import fwd_args
from fp8_attention_check import BWD_SCALES, FWD_SCALES, assert_emulated, codes
from triton_harness import POINTER, assert_compiles
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.reference.attention_fp8 import E4M3, E5M2

triton = pytest.importorskip("triton")
from transformer_engine.pytorch.triton import attention_fp8 as kernels  # noqa: E402


def _call(q, k, v, **options):
    """flash_attention_fp8_fwd's arguments before fp8_scales (softcap left out)."""
    args = fwd_args(q, k, v, scale=q.shape[-1] ** -0.5, last=False, **options)
    return args[:17] + args[18:]


def _check(q, k, v, dtype, grad_format=1, **options):
    q, k, v = (t.to(dtype) for t in (q, k, v))
    host = _call(q, k, v, **options)
    device = _call(*(t.to(DEVICE) for t in (q, k, v)),
                   **{name: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for name, t in options.items()})
    out, lse, _, probs_amax = kernels.flash_attention_fp8_fwd(*device, FWD_SCALES)
    want_out, want_lse, _, want_amax = reference.flash_attention_fp8_fwd(*host, FWD_SCALES)
    assert out.dtype == torch.float32
    step = 2.0 ** -3 * want_amax.item() * v.float().abs().max().item() * 0.5
    assert_emulated(out.cpu(), want_out, step, "out")
    seen = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), seen)
    torch.testing.assert_close(lse.cpu()[seen], want_lse[seen], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(probs_amax.cpu(), want_amax, rtol=1e-5, atol=0)
    grad_out = codes(*out.shape, dtype=dtype, fp8=E5M2 if grad_format else E4M3)
    out_codes = (want_out * 2).to(E4M3).to(dtype)
    scales = BWD_SCALES.clone()
    scales[3] = 0.5
    grads = kernels.flash_attention_fp8_bwd(grad_out.to(DEVICE), *device[:3], out_codes.to(DEVICE), lse, *device[3:],
                                            scales, grad_format)
    want = reference.flash_attention_fp8_bwd(grad_out, *host[:3], out_codes, want_lse, *host[3:], scales, grad_format)
    for index, name in ((0, "grad_q"), (1, "grad_k"), (2, "grad_v")):
        assert grads[index].dtype == torch.float32
        step = 2.0 ** -2 * want[index].abs().max().item() + 1e-30
        assert_emulated(grads[index].cpu(), want[index], step, name)
    torch.testing.assert_close(grads[5].cpu(), want[5], rtol=2e-5, atol=0)
    if options.get("softmax_offset") is not None:
        torch.testing.assert_close(grads[4].cpu(), want[4], rtol=1e-4, atol=1e-5)
    return out


MASKS = {"none": ((-1, -1), False), "causal": ((-1, 0), False), "causal_bottom_right": ((-1, 0), True),
         "window": ((7, 2), False)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mask", MASKS)
def test_masks_and_gqa(mask, dtype):
    window, bottom_right = MASKS[mask]
    q, k, v = codes(2, 4, 37, 32), codes(2, 2, 69, 32), codes(2, 2, 69, 24)
    _check(q, k, v, dtype, window=window, bottom_right=bottom_right)


@pytest.mark.parametrize("grad_format", [0, 1], ids=["G_e4m3", "G_e5m2"])
def test_blocks_and_grad_formats(grad_format):
    q, k, v = codes(1, 2, 130, 64), codes(1, 2, 150, 64), codes(1, 2, 150, 64)
    _check(q, k, v, torch.bfloat16, grad_format, window=(-1, 0), bottom_right=True)


@pytest.mark.parametrize("term", ["packed", "alibi", "sink", "rows_without_keys"])
def test_terms(term):
    q, k, v = codes(2, 4, 21, 16), codes(2, 4, 29, 16), codes(2, 4, 29, 16)
    options = dict(window=(-1, 0), bottom_right=True)
    if term == "packed":
        cu = torch.tensor([0, 5, 5, 30], dtype=torch.int32)
        q, k, v = codes(30, 4, 16), codes(30, 2, 16), codes(30, 2, 16)
        options.update(cu_seqlens_q=cu, cu_seqlens_kv=cu)
    elif term == "alibi":
        options["alibi_slopes"] = torch.rand(4)
    elif term == "sink":
        options["softmax_offset"] = torch.randn(4)
    else:  # sq > skv bottom-right: the first queries see no key
        q = codes(2, 4, 40, 16)
    out = _check(q, k, v, torch.bfloat16, **options)
    if term == "rows_without_keys":
        assert not out[:, :, :11].any()


def test_supports_leaves_the_rest_to_the_reference():
    q, k, v = codes(1, 2, 8, 16), codes(1, 2, 8, 16), codes(1, 2, 8, 16)
    assert kernels.supports("flash_attention_fp8_fwd", _call(q, k, v) + (FWD_SCALES,))
    for options in (dict(bias=torch.randn(1, 2, 8, 8).to(torch.bfloat16)),
                    dict(dropout=0.1, dropout_rng=torch.tensor([1, 2]))):
        assert not kernels.supports("flash_attention_fp8_fwd", _call(q, k, v, **options) + (FWD_SCALES,))
    # A paged cache: the plain forward reads its pages (attention_decode.py), the FP8 kernels do not.
    pools = codes(3, 4, 2, 16)  # [pages, page_size, g, d]
    paged = _call(q, pools, pools, page_table=torch.tensor([[2, 0]], dtype=torch.int32),
                  cu_seqlens_q=torch.tensor([0, 8], dtype=torch.int32),
                  cu_seqlens_kv=torch.tensor([0, 8], dtype=torch.int32))
    assert not kernels.supports("flash_attention_fp8_fwd", paged + (FWD_SCALES,))


def compile_variants():
    """What tests/helpers/triton_compile.py compiles of triton/attention_fp8.py: the FP8 forward
    in bf16 (causal bottom-right, ALiBi, sink) and fp32, and the backward kernels of
    triton/attention.py with FP8 on (G in E5M2), head dim 128."""
    from transformer_engine.pytorch.triton import attention as plain
    found = []
    strides = lambda *names: {f"{n}_{s}": "i64" for n in names for s in ("sb", "sh", "st")}  # noqa: E731
    tables = {"LENS": "*i32", "STARTS": "*i64", "SLOPES": "*fp32"}
    sizes = {"dk": "i32", "dv": "i32", "scale": "fp32", "window_left": "i32", "window_right": "i32",
             "slopes_sb": "i32"}
    for dtype, alibi in (("bf16", True), ("fp32", False)):
        data = POINTER[dtype]
        flags = {"BOTTOM_RIGHT": alibi, "HAS_ALIBI": alibi, "HAS_SINK": alibi, "FP32": dtype == "fp32", "BLOCK_M": 64,
                 "BLOCK_N": 64, "BLOCK_DK": 128, "BLOCK_DV": 128}
        found.append((f"attention_fp8_fwd[{dtype}]", kernels._fp8_fwd_kernel,
                      {"Q": data, "K": data, "V": data, "OUT": "*fp32", "LSE": "*fp32", "ROW_MAX": "*fp32",
                       "AMAX": "*fp32", **tables, "SINK": "*fp32", **strides("q", "k", "v", "o", "l"), "batch": "i32",
                       "heads": "i32", "ratio": "i32", **sizes, "probs_scale": "fp32", "out_factor": "fp32",
                       **{name: "constexpr" for name in flags}}, flags))
    data = POINTER["bf16"]
    flags = {"BOTTOM_RIGHT": True, "HAS_ALIBI": False, "FP32": False, "FP8": True, "GRAD_E5M2": True, "BLOCK_M": 64,
             "BLOCK_N": 64, "BLOCK_DK": 128, "BLOCK_DV": 128}
    grads = {"Q": data, "K": data, "V": data, "DOUT": data, "LSE": "*fp32", "DELTA": "*fp32"}
    found.append(("attention_dkdv[fp8]", plain._dkdv_kernel,
                  {**grads, "DK": "*fp32", "DV": "*fp32", **tables, **strides("q", "k", "v", "do", "l"),
                   "batch": "i32", "heads": "i32", "kv_heads": "i32", **sizes, "probs_scale": "fp32",
                   "grad_scores_scale": "fp32", "dp_factor": "fp32", "dk_factor": "fp32", "dv_factor": "fp32",
                   **{name: "constexpr" for name in flags}}, flags))
    found.append(("attention_dq[fp8]", plain._dq_kernel,
                  {**grads, "DQ": "*fp32", "AMAX": "*fp32", **tables, **strides("q", "k", "v", "do", "l"),
                   "batch": "i32", "heads": "i32", "ratio": "i32", **sizes, "grad_scores_scale": "fp32",
                   "dp_factor": "fp32", "dq_factor": "fp32", **{name: "constexpr" for name in flags}}, flags))
    return found


def test_kernels_compile_for_hopper_and_blackwell():
    """sm_90 and sm_100 cubins for the FP8 forward (bf16, fp32) and the FP8 backward kernels, every
    FP8 conversion saturating, no float64."""
    assert_compiles(compile_variants, count=4, fp8_variants=4)

"""FP8 attention's ops (flash_attention_fp8_fwd / _bwd, TE's fp8_dpa emulated): every output
against the plain-PyTorch emulation of reference/attention_fp8.py over masks, GQA, layouts,
dropout, sinks, ALiBi and bias, fp32 and bf16 inputs; the amaxes; the FP8 products' exactness;
determinism; bad arguments refused by name; opcheck and compile.

The emulation sums in other orders than the kernel (fp32, exact products) and takes P from
torch.exp rather than the kernel's exp: both agree to a few ulps, which can move a P (or G)
sitting within an ulp of a rounding boundary to the neighbouring FP8 code. `assert_emulated`
(fp8_attention_check.py) allows such moves in a handful of elements, each by at most the one
code step it makes."""
import pytest
import torch

from flash_attention_check import fwd_args
from fp8_attention_check import BWD_SCALES, FWD_SCALES, assert_emulated, codes
from numerics import assert_value_error_naming
from op_cases import BF16, F32, OpCases
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.reference.attention_fp8 import E4M3, E5M2

ops = torch.ops.portable_te
CASES = OpCases("attention_fp8")


def _fp8_call(q, k, v, window=(-1, -1), bottom_right=False, cu=(None, None), padded=(None, None), slopes=None,
              bias=None, mask=None, softmax_offset=None, dropout=0.0, dropout_rng=None):
    """flash_attention_fp8_fwd's arguments but fp8_scales, in schema order (softcap left out; the
    last, return_max_logit False, is the backward's bias_grad)."""
    args = fwd_args(q, k, v, cu_seqlens_q=cu[0], cu_seqlens_kv=cu[1], cu_seqlens_q_padded=padded[0],
                    cu_seqlens_kv_padded=padded[1], alibi_slopes=slopes, bias=bias, mask=mask,
                    softmax_offset=softmax_offset, dropout_rng=dropout_rng, scale=q.shape[-1] ** -0.5,
                    window=window, bottom_right=bottom_right, softcap=0.0, dropout=dropout, last=False)
    return args[:17] + args[18:]  # without softcap


def _check(q, k, v, dtype, grad_scores_format=1, outliers=0.01, **options):
    """The ops' forward and backward against the emulation on the same codes (outliers: the
    share of elements allowed one code step of P or G apart, see assert_emulated)."""
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    call = _fp8_call(q, k, v, **options)
    out, lse, _, probs_amax = ops.flash_attention_fp8_fwd(*call, FWD_SCALES)
    want_out, want_lse, _, want_amax = reference.flash_attention_fp8_fwd(*call, FWD_SCALES)
    v_max, seen = v.float().abs().max().item(), torch.isfinite(want_lse)
    # A P code moved by one step changes out by at most 2^-3 P v_max (in real units).
    assert_emulated(out, want_out, 2.0 ** -3 * want_amax.item() * v_max * 0.5, "out", outliers)
    assert torch.equal(torch.isfinite(lse), seen)
    torch.testing.assert_close(lse[seen], want_lse[seen], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(probs_amax, want_amax, rtol=2e-6, atol=0)
    grad_out = codes(*out.shape, dtype=dtype, fp8=E5M2 if grad_scores_format else E4M3)
    out_codes = (out * 2).to(E4M3).to(dtype)  # the O slot's codes (out_si = 0.5)
    scales = BWD_SCALES.clone()
    scales[3] = 0.5
    bwd_call = (grad_out, *call[:3], out_codes, lse, *call[3:], scales, grad_scores_format)
    grads = ops.flash_attention_fp8_bwd(*bwd_call)
    want = reference.flash_attention_fp8_bwd(*bwd_call)
    for index, name in ((0, "grad_q"), (1, "grad_k"), (2, "grad_v")):
        # One G (or P) code step: 2^-2 of the largest term the gradient sums.
        step = 2.0 ** -2 * want[index].float().abs().max().item() + 1e-30
        assert_emulated(grads[index], want[index], step, name, outliers)
    torch.testing.assert_close(grads[5], want[5], rtol=2e-5, atol=0)
    if options.get("softmax_offset") is not None:
        torch.testing.assert_close(grads[4], want[4], rtol=1e-4, atol=1e-5)
    return out, grads


MASKS = {"none": ((-1, -1), False), "causal": ((-1, 0), False), "causal_bottom_right": ((-1, 0), True),
         "window": ((7, 2), False)}


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("heads,groups", [(4, 4), (4, 2), (3, 1)], ids=["mha", "gqa", "mqa"])
def test_padded_layout(heads, groups, mask, dtype):
    window, bottom_right = MASKS[mask]
    q, k, v = codes(2, heads, 37, 32), codes(2, groups, 69, 32), codes(2, groups, 69, 24)
    _check(q, k, v, dtype, window=window, bottom_right=bottom_right)


@pytest.mark.parametrize("grad_scores_format", [0, 1], ids=["G_e4m3", "G_e5m2"])
def test_blocks_and_grad_formats(grad_scores_format):
    """More than one query and key block (64 each), G's two formats."""
    q, k, v = codes(1, 2, 130, 64), codes(1, 2, 150, 64), codes(1, 2, 150, 64)
    _check(q, k, v, BF16, grad_scores_format, window=(-1, 0), bottom_right=True)


@pytest.mark.parametrize("window", [(-1, -1), (4200, 0)], ids=["none", "window"])
def test_keys_past_the_kept_logits(window):
    """The forward keeps the logits of a query block's first 4096 keys for its values pass and
    computes those of later keys again: past that point both kinds of key block meet in one
    row (a few queries, so that the emulation stays small). 72 queries: two query blocks.
    Each output sums 4200 P codes, small ones (P ~ 1 / 4200, subnormal at S's scale), so that
    some 1.4% of them meet a P the exp's ulps moved by one code: 3% allowed, each one step.
    (The same outputs, bit for bit, as computing every logit twice.)"""
    q, k, v = codes(1, 2, 72, 16), codes(1, 1, 4200, 16), codes(1, 1, 4200, 16)
    _check(q, k, v, BF16, window=window, bottom_right=True, outliers=0.03)


def test_packed_sequences_with_empty_ones():
    lengths_q, lengths_kv = [5, 0, 33, 1], [9, 4, 33, 0]
    cu_q = torch.tensor([0] + torch.tensor(lengths_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_kv = torch.tensor([0] + torch.tensor(lengths_kv).cumsum(0).tolist(), dtype=torch.int32)
    q, k, v = codes(int(cu_q[-1]), 4, 16), codes(int(cu_kv[-1]), 2, 16), codes(int(cu_kv[-1]), 2, 16)
    out, grads = _check(q, k, v, BF16, window=(-1, 0), bottom_right=True, cu=(cu_q, cu_kv))
    assert not out[5:5].any() and not grads[1][-0:0].any()


@pytest.mark.parametrize("term", ["dropout", "sink", "alibi", "bias", "mask"])
def test_terms(term):
    q, k, v = codes(2, 4, 21, 16), codes(2, 4, 29, 16), codes(2, 4, 29, 16)
    options = {
        "dropout": dict(dropout=0.25, dropout_rng=torch.tensor([7, 3])),
        "sink": dict(softmax_offset=torch.randn(4)),
        "alibi": dict(slopes=torch.rand(4)),
        "bias": dict(bias=torch.randn(1, 4, 21, 29).to(BF16)),
        "mask": dict(mask=torch.rand(2, 1, 21, 29) < 0.3),
    }[term]
    _check(q, k, v, BF16, window=(-1, 0), bottom_right=True, **options)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
def test_cpu_tiers(cpu_tier, dtype):
    """Every SIMD tier's FP8 rounding of P and G (and, for bf16, with and without the dot products)."""
    q, k, v = codes(2, 4, 67, 40), codes(2, 2, 67, 40), codes(2, 2, 67, 24)
    _check(q, k, v, dtype, grad_scores_format=0, window=(9, 0), bottom_right=True, slopes=torch.rand(4))


def test_products_are_exact():
    """One key per query (a diagonal window): P = 1, so out = the value row times the factors,
    exactly; and with a dense row of equal logits P = 1/n exactly when n is a power of two."""
    q, k, v = codes(1, 2, 16, 32), codes(1, 2, 16, 32), codes(1, 2, 16, 32)
    out, _, _, amax = ops.flash_attention_fp8_fwd(*_fp8_call(q, k, v, window=(0, 0)), FWD_SCALES)
    p_code = torch.tensor(1.0 * 448).to(E4M3).float()  # P = 1 quantised with scale 448
    factor = torch.tensor(1 / 448.0) * torch.tensor(0.5)  # probs_si * v_si in fp32
    assert out.dtype == torch.float32 and torch.equal(out, p_code * v.float() * factor)
    assert amax.item() == 1.0
    zeros = torch.zeros(1, 1, 8, 16, dtype=BF16)
    values = codes(1, 1, 8, 16)
    out, _, _, amax = ops.flash_attention_fp8_fwd(*_fp8_call(zeros, zeros, values), FWD_SCALES)
    p = (torch.tensor(1 / 8.0) * 448).to(E4M3).float()  # P = 1/8 exactly, code 56
    want = (p * values.float().sum(2, keepdim=True) * factor).expand_as(out)
    assert torch.equal(out, want) and amax.item() == 0.125


def test_rows_that_see_nothing_are_zero():
    q, k, v = codes(1, 2, 8, 16), codes(1, 2, 8, 16), codes(1, 2, 8, 16)
    mask = torch.zeros(1, 1, 8, 8, dtype=torch.bool)
    mask[..., 3, :] = True
    out, lse, _, _ = ops.flash_attention_fp8_fwd(*_fp8_call(q, k, v, mask=mask), FWD_SCALES)
    assert not out[0, :, 3].any() and torch.isneginf(lse[0, :, 3]).all()
    grads = ops.flash_attention_fp8_bwd(codes(*out.shape), q, k, v, out.to(BF16), lse, *_fp8_call(q, k, v, mask=mask)[3:],
                                        BWD_SCALES, 1)
    assert not grads[0][0, :, 3].any() and all(torch.isfinite(g).all() for g in grads[:3])


def test_deterministic_whatever_the_threads():
    q, k, v = codes(2, 4, 100, 32), codes(2, 2, 100, 32), codes(2, 2, 100, 32)
    grad_out = codes(2, 4, 100, 32, fp8=E5M2)
    call = _fp8_call(q, k, v, window=(-1, 0))
    runs = []
    threads = torch.get_num_threads()
    try:
        for n in (1, threads):
            torch.set_num_threads(n)
            out, lse, _, amax = ops.flash_attention_fp8_fwd(*call, FWD_SCALES)
            grads = ops.flash_attention_fp8_bwd(grad_out, *call[:3], out.to(BF16), lse, *call[3:], BWD_SCALES, 1)
            runs.append((out, amax, *grads[:3], grads[5]))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1]))


@pytest.mark.parametrize("what,words", [
    ("softcap-free schema", None),
    ("scales shape", ["flash_attention_fp8_fwd", "fp8_scales", "[5]"]),
    ("scale zero", ["flash_attention_fp8_fwd", "fp8_scales[3]", "positive"]),
    ("grad format", ["flash_attention_fp8_bwd", "grad_scores_format", "E5M2"]),
])
def test_bad_arguments_are_refused_by_name(what, words):
    q, k, v = codes(1, 2, 8, 16), codes(1, 2, 8, 16), codes(1, 2, 8, 16)
    call = _fp8_call(q, k, v)
    if words is None:
        assert "softcap" not in str(ops.flash_attention_fp8_fwd.default._schema)
        return
    if what == "scales shape":
        assert_value_error_naming(lambda: ops.flash_attention_fp8_fwd(*call, FWD_SCALES[:4]), words)
    elif what == "scale zero":
        scales = FWD_SCALES.clone()
        scales[3] = 0
        assert_value_error_naming(lambda: ops.flash_attention_fp8_fwd(*call, scales), words)
    else:
        out, lse, _, _ = ops.flash_attention_fp8_fwd(*call, FWD_SCALES)
        out = out.to(BF16)
        assert_value_error_naming(
            lambda: ops.flash_attention_fp8_bwd(out, *call[:3], out, lse, *call[3:], BWD_SCALES, 2), words)


def test_forward_has_no_autograd_of_its_own():
    q = codes(1, 2, 8, 16).requires_grad_()
    out = ops.flash_attention_fp8_fwd(*_fp8_call(q, q.detach(), q.detach()), FWD_SCALES)[0]
    with pytest.raises(NotImplementedError, match="grad_out"):
        out.sum().backward()


# --- the op cases: opcheck, compile and the reference on every backend -------------------------

def _case_tensors(d, packed=False):
    if packed:
        cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=d)
        return codes(12, 4, 16, device=d), codes(12, 2, 16, device=d), codes(12, 2, 16, device=d), (cu, cu)
    return codes(1, 4, 9, 16, device=d), codes(1, 2, 11, 16, device=d), codes(1, 2, 11, 16, device=d), (None, None)


@CASES.case("flash_attention_fp8_fwd")
def _(d):
    q, k, v, _ = _case_tensors(d)
    return _fp8_call(q, k, v, window=(-1, 0), bottom_right=True) + (FWD_SCALES,), ()


@CASES.case("flash_attention_fp8_fwd[thd,dropout]")
def _(d):
    q, k, v, cu = _case_tensors(d, packed=True)
    call = _fp8_call(q, k, v, window=(-1, 0), cu=cu, dropout=0.2, dropout_rng=torch.tensor([3, 9], device=d))
    return call + (FWD_SCALES,), ()


def _bwd_case(d, packed, grad_scores_format):
    q, k, v, cu = _case_tensors(d, packed)
    call = _fp8_call(q, k, v, window=(-1, 0), cu=cu)
    out, lse, _, _ = reference.flash_attention_fp8_fwd(*call, FWD_SCALES)
    grad_out = codes(*out.shape, fp8=E5M2, device=d)
    return (grad_out, q, k, v, out.to(E4M3).to(BF16), lse, *call[3:], BWD_SCALES, grad_scores_format), ()


@CASES.case("flash_attention_fp8_bwd")
def _(d):
    return _bwd_case(d, False, 1)


@CASES.case("flash_attention_fp8_bwd[thd,e4m3]")
def _(d):
    return _bwd_case(d, True, 0)


test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()

"""The NVFP4 GEMM (fp8/nvfp4_gemm.py) against the float64 product of the dequantised operands.

The bound: every product code_a * scale_a * code_b * scale_b is exact in fp32; the GEMM sums k of
them in fp32 (each addition off by at most 2^-24 of the running sum's magnitude, so the sum by
at most k * 2^-24 * sum |a_i b_i|), multiplies by alpha in fp32 (2^-24 more) and rounds once
to the output dtype (half its ulp). So |got - want| <= (k + 1) * 2^-24 * alpha * (|A| @ |B|^T)
+ half an ulp of the output, with want the float64 product of the decoded values times alpha."""
import pytest
import torch

from transformer_engine.pytorch import NVFP4Quantizer
from transformer_engine.pytorch.custom_ops.nvfp4 import nvfp4_dequantize
from transformer_engine.pytorch.custom_ops.nvfp4_gemm import nvfp4_gemm, nvfp4_gemm_accumulate
from transformer_engine.pytorch.custom_ops.scaled_gemm import scaled_gemm, scaled_gemm_accumulate
from transformer_engine.pytorch.fp8.gemm import fp8_gemm, fp8_gemm_accumulate
from transformer_engine.pytorch.fp8.nvfp4_gemm import UNIT_AMAX

E4M3 = torch.float8_e4m3fn


def test_the_unit_amax_decodes_every_scale_exactly():
    """Dequantising with amax 2688 multiplies each code by scale * 2688 * fp32(1/2688): that is
    the scale itself for every finite E4M3 value, so the GEMM's operands are exact."""
    every = torch.arange(256, dtype=torch.uint8).view(E4M3)
    scales = every[torch.isfinite(every.float())].reshape(-1, 1)  # [254, 1]: one block per row
    data = torch.full((scales.shape[0], 8), 0x71, dtype=torch.uint8)  # codes 1 and 7 (0.5 and 6) in turn
    values = nvfp4_dequantize(data, scales, torch.tensor([UNIT_AMAX]), 16, torch.float32)
    assert torch.equal(values, torch.tensor([0.5, 6.0] * 8) * scales.float())


def _decoded64(usage):
    """code * scale of each element, exact in fp32 (so in float64)."""
    return nvfp4_dequantize(usage.data, usage.scales, torch.tensor([UNIT_AMAX]), usage.cols, torch.float32).double()


def _check(got, a, b, bias=None):
    alpha = (a.amax.float() * b.amax.float()) * (torch.ones(1) / torch.tensor([6.0 * 6.0 * 448 * 448]))  # TE's
    a64, b64 = _decoded64(a), _decoded64(b)
    want = (a64 @ b64.t()) * alpha.double()
    if bias is not None:
        want = want + bias.double()
    k = a64.shape[1]
    bound = (k + 1) * 2.0 ** -24 * alpha.double() * (a64.abs() @ b64.abs().t())
    ulp = torch.finfo(got.dtype).eps * want.abs()  # an ulp, generously, of the output dtype
    assert ((got.double() - want).abs() <= bound + ulp + 1e-30).all()


@pytest.mark.parametrize("m,n,k", [(32, 48, 64), (7, 5, 50), (1, 16, 16)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gemm_is_the_dequantised_product(m, n, k, out_dtype):
    torch.manual_seed(m + n + k)
    a = NVFP4Quantizer(columnwise=False)(torch.randn(m, k) * 3)._storage.operand
    b = NVFP4Quantizer(columnwise=False, with_2d_quantization=True)(torch.randn(n, k))._storage.operand
    bias = torch.randn(n)
    for with_bias in (None, bias):
        got = fp8_gemm(a, b, out_dtype, with_bias)
        assert got.dtype == out_dtype and got.shape == (m, n)
        _check(got, a.rowwise, b.rowwise, with_bias)


def test_transformed_pairs_cancel_and_mismatches_are_refused():
    """The weight-gradient GEMM's operands both carry the Hadamard transform along k: their
    product approximates the untransformed one; a transformed operand against a plain one is
    refused."""
    torch.manual_seed(0)
    x, dy = torch.randn(64, 32), torch.randn(64, 48)  # [tokens, in], [tokens, out]
    quantizer = NVFP4Quantizer(rowwise=False, with_rht=True, with_post_rht_amax=True)
    dy_t, x_t = quantizer(dy)._storage.operand.t(), quantizer(x)._storage.operand.t()  # [out, tokens], [in, tokens]
    got = fp8_gemm(dy_t, x_t, torch.float32)
    _check(got, dy_t, x_t)
    want = dy.t() @ x
    assert (got - want).norm() <= 0.2 * want.norm()
    plain = NVFP4Quantizer(rowwise=False)(x)._storage.operand.t()
    with pytest.raises(ValueError, match="Hadamard"):
        fp8_gemm(dy_t, plain, torch.float32)


def test_accumulate_adds_in_fp32():
    torch.manual_seed(1)
    a = NVFP4Quantizer(columnwise=False)(torch.randn(16, 32))._storage.operand
    b = NVFP4Quantizer(columnwise=False)(torch.randn(24, 32))._storage.operand
    out = torch.randn(16, 24)
    start = out.clone()
    fp8_gemm_accumulate(a, b, out)
    torch.testing.assert_close(out, start + fp8_gemm(a, b, torch.float32), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("m,n,k", [(1, 7, 32), (5, 40, 1040), (13, 33, 48), (16, 9, 272), (17, 70, 64),
                                   (200, 45, 528), (3, 600, 16)])
def test_the_kernel_reads_the_codes_as_decoding_first_would(gemm_tier, m, n, k):
    """The CPU kernel widens each code with its block's scale while it packs (and, for few rows,
    where it reads them in place): the bits of decoding both operands to bf16 first and summing
    those on the same tier, for every path of the kernel (rows in place, widened, packed), with
    alpha, bias, an fp16 output and accumulation into the output. (These inputs' sums are exact,
    so the avx2 tier's block order gives the same bits: test_each_tier_sums_in_the_order_it_states.)"""
    torch.manual_seed(m * n + k)
    a = NVFP4Quantizer(columnwise=False)(torch.randn(m, k) * 3)._storage.operand.rowwise
    b = NVFP4Quantizer(columnwise=False, with_2d_quantization=True)(torch.randn(n, k))._storage.operand.rowwise
    a_values, b_values = (nvfp4_dequantize(x.data, x.scales, torch.tensor([UNIT_AMAX]), k, torch.bfloat16)
                          for x in (a, b))
    alpha, bias = torch.tensor([0.37]), torch.randn(n)
    for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
        got = nvfp4_gemm(a.data, a.scales, b.data, b.scales, k, alpha, None, None, bias, out_dtype)
        assert torch.equal(got, scaled_gemm(a_values, b_values, alpha, None, bias, out_dtype))
    out = torch.randn(m, n)
    want = out.clone()
    nvfp4_gemm_accumulate(a.data, a.scales, b.data, b.scales, k, alpha, out)
    scaled_gemm_accumulate(a_values, b_values, alpha, None, want)
    assert torch.equal(out, want)


def _wide_nvfp4(rows, k):
    """A row-wise NVFP4 operand whose blocks lie orders of magnitude apart: fp32 sums of its
    products round, so the order of the additions shows in the bits."""
    spread = torch.exp(torch.randn(rows, k // 16, 1) * 4).expand(rows, k // 16, 16).reshape(rows, k)
    return NVFP4Quantizer(columnwise=False)(torch.randn(rows, k) * spread)._storage.operand.rowwise


def _block_order(a, b, alpha, out_dtype):
    """TE's tensor-core order: each block of 16 k summed exactly (float64 holds it), the blocks
    added in fp32 in k order, times alpha in fp32, one rounding."""
    a64, b64 = _decoded64(a), _decoded64(b)
    sums = torch.zeros(a64.shape[0], b64.shape[0])
    for k0 in range(0, a64.shape[1], 16):
        sums = sums + (a64[:, k0:k0 + 16] @ b64[:, k0:k0 + 16].t()).float()
    return (sums * alpha).to(out_dtype)


@pytest.mark.parametrize("m,n,k", [(17, 70, 64), (200, 45, 528), (33, 600, 1040), (5, 40, 256)])
def test_each_tier_sums_in_the_order_it_states(gemm_tier, m, n, k):
    """The avx2 tier multiplies NVFP4 by NVFP4 on byte products past the few rows read in place
    (nvfp4_byte_kernel_avx2.h): each block's sum is exact, the blocks are added in fp32 in k order
    (TE's tensor-core order). Every other path sums the products in its own fp32 order, the one it
    gives decoded bf16 operands. Inputs whose sums round tell the orders apart."""
    torch.manual_seed(m + n + k)
    a, b = _wide_nvfp4(m, k), _wide_nvfp4(n, k)
    alpha = torch.tensor([0.37])
    decoded = [nvfp4_dequantize(x.data, x.scales, torch.tensor([UNIT_AMAX]), k, torch.bfloat16) for x in (a, b)]
    for out_dtype in (torch.float32, torch.bfloat16):
        got = nvfp4_gemm(a.data, a.scales, b.data, b.scales, k, alpha, None, None, None, out_dtype)
        k_order = scaled_gemm(*decoded, alpha, None, None, out_dtype)
        if gemm_tier == "avx2" and m > 16:
            assert torch.equal(got, _block_order(a, b, alpha, out_dtype))
            if out_dtype == torch.float32:
                assert not torch.equal(got, k_order)  # the inputs do tell the orders apart
        else:
            assert torch.equal(got, k_order)


@pytest.mark.parametrize("rows", [1, 17, 200])
def test_the_codes_go_to_the_kernel_whatever_the_cpu_gemm_dtype(monkeypatch, cpu_gemm, rows):
    """With fp32 GEMMs (CPUs without bf16 matrix units) as with bf16 ones, whatever the rows, the
    kernel takes the codes and scales as they are (its FMA tiers widen them to fp32 as they pack
    them), where ATen's fp32 GEMM would need both operands decoded first; a ragged k (not whole
    blocks of 16) is decoded first. TE's numerics either way."""
    from transformer_engine.pytorch.fp8 import nvfp4_gemm as module
    decoded = []
    monkeypatch.setattr(module, "nvfp4_dequantize", lambda *args: decoded.append(1) or nvfp4_dequantize(*args))
    for k, ragged in ((64, False), (50, True)):
        a = NVFP4Quantizer(columnwise=False)(torch.randn(rows, k) * 3)._storage.operand
        b = NVFP4Quantizer(columnwise=False, with_2d_quantization=True)(torch.randn(24, k))._storage.operand
        decoded.clear()
        _check(fp8_gemm(a, b, torch.float32), a.rowwise, b.rowwise)
        assert bool(decoded) == ragged, (k, rows)


def test_a_nan_scale_reaches_its_rows_outputs_alone():
    """A block whose E4M3 scale is NaN makes its row's outputs NaN and no other."""
    a = NVFP4Quantizer(columnwise=False)(torch.randn(20, 64))._storage.operand.rowwise
    b = NVFP4Quantizer(columnwise=False)(torch.randn(24, 64))._storage.operand.rowwise
    scales = a.scales.clone()
    scales.view(torch.uint8)[3, 2] = 0x7F  # E4M3's NaN
    for rows in (4, 20):  # few rows of a (read in place) and more (packed)
        got = nvfp4_gemm(a.data[:rows], scales[:rows], b.data, b.scales, 64, torch.ones(1), None, None, None,
                         torch.float32)
        assert got[3].isnan().all() and not got[torch.arange(rows) != 3].isnan().any()

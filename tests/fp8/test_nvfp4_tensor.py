"""NVFP4 tensors: the format's definition (reference/nvfp4.py) checked from first principles (the
E2M1 grid and its ties, TE's scale formulas on worked values, the Hadamard transform against
its matrix in float64, saturation, NaN, zeros, inf), and NVFP4Quantizer / NVFP4Tensor against
the reference quantizer TE's tests use (custom_recipes.quantization_ref_nvfp4), bit for bit:
row-wise and column-wise, 1 x 16 and 16 x 16 blocks, the random Hadamard transform with its
amax, ragged shapes, make_empty + update_quantized; stochastic rounding reproducible and
unbiased; views, usages, pickling as plain values. (The 4over6 and row-scaled variants:
test_nvfp4_variants.py.)"""
import io

import pytest
import torch

from transformer_engine.pytorch import NVFP4Quantizer, NVFP4Tensor
from transformer_engine.pytorch.custom_recipes import utils
from transformer_engine.pytorch.custom_recipes.quantization_ref_nvfp4 import NVFP4QuantizerRef
from transformer_engine.pytorch.reference import nvfp4 as ref
from transformer_engine.pytorch.tensor.nvfp4_tensor import te_padded_scales

E4M3 = torch.float8_e4m3fn


class TestDefinition:
    def test_e2m1_grid_and_its_ties(self):
        """Nearest value, ties to the even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2,
        2.5 -> 2, 3.5 -> 4, 5 -> 4); -0 for negatives that round to zero, +0 for NaN."""
        v = torch.tensor([0.0, 0.25, 0.2501, 0.75, 1.25, 1.2501, 1.75, 2.5, 2.5001, 3.5, 5.0, 5.0001, 6.0,
                          -0.1, -0.0, float("nan"), -6.0, -2.5, -3.0])
        want = [0.0, 0.0, 0.5, 1.0, 1.0, 1.5, 2.0, 2.0, 3.0, 4.0, 4.0, 6.0, 6.0, -0.0, 0.0, 0.0, -6.0, -2.0, -3.0]
        codes = ref.e2m1_codes(v)
        got = ref.e2m1_values(codes)
        assert got.tolist() == want
        assert codes[13].item() == 8 and codes[14].item() == 0  # -0 from a negative, +0 from -0.0 itself
        assert torch.equal(torch.signbit(got), torch.signbit(torch.tensor(want)))

    def test_packing_puts_the_even_column_low(self):
        codes = torch.tensor([[1, 2, 3, 4, 5]], dtype=torch.uint8)
        packed = ref.pack_codes(codes)
        assert packed.tolist() == [[0x21, 0x43, 0x05]]
        assert torch.equal(ref.unpack_codes(packed, 5), codes)

    def test_scales_on_worked_values(self):
        """amax 3: S_enc = 2688 / 3 = 896; a block whose amax is 1.5: scale = e4m3(1.5 * (896 *
        fp32(1/6))) = e4m3(224.00000...) = 224; encode = 1 / (224 * (1 / 896)) = 4, so 1.5 -> 6
        and 0.3 -> 1.2 -> 1.0; the values come back as code * 224 * 3 / 2688 = code / 4."""
        x = torch.zeros(1, 32)
        x[0, 0], x[0, 1], x[0, 16] = 1.5, 0.3, 3.0
        amax = ref.nvfp4_amax(x, False, False)
        assert amax.item() == 3.0
        data, scales = ref.nvfp4_quantize(x, amax, 1, False, False, None)
        assert scales.float().tolist() == [[224.0, 448.0]]
        values = ref.nvfp4_dequantize(data, scales, amax, 32, torch.float32)
        assert values[0, 0].item() == 1.5 and values[0, 1].item() == 0.25 and values[0, 16].item() == 3.0

    def test_rht_is_its_matrix(self):
        hadamard = torch.ones(1, 1, dtype=torch.float64)
        while hadamard.shape[0] < 16:
            hadamard = torch.cat([torch.cat([hadamard, hadamard], 1), torch.cat([hadamard, -hadamard], 1)])
        matrix = torch.diag(torch.tensor(ref.RHT_SIGNS, dtype=torch.float64)) @ hadamard / 4
        x = torch.randn(6, 48, dtype=torch.float64)
        want = (x.reshape(-1, 16) @ matrix).reshape(6, 48)
        torch.testing.assert_close(ref.rht16(x.float()).double(), want, rtol=0, atol=1e-6)
        assert ref.rht16(x.to(torch.bfloat16)).dtype == torch.bfloat16  # rounded to the input's dtype
        torch.testing.assert_close(ref.inverse_rht16(ref.rht16(x.float())).double(), x, rtol=0, atol=1e-6)
        with pytest.raises(ValueError, match="multiple of 16"):
            ref.rht16(torch.zeros(2, 20))

    def test_zeros_inf_and_nan(self):
        zeros = torch.zeros(3, 16)
        data, scales = ref.nvfp4_quantize(zeros, ref.nvfp4_amax(zeros, False, False), 1, False, False, None)
        assert not data.any() and not scales.float().any()
        x = torch.tensor([[float("inf"), 1.0, float("nan")] + [0.5] * 13])
        amax = ref.nvfp4_amax(x, False, False)
        assert amax.item() == float("inf")  # NaN skipped, inf counted
        data, scales = ref.nvfp4_quantize(x, amax, 1, False, False, None)
        codes = ref.unpack_codes(data, 16)
        assert codes[0, 0].item() == 7 and codes[0, 2].item() == 0  # inf saturates to 6, NaN is +0
        assert scales.float().item() == 448.0

    def test_stochastic_rounding_is_seeded_and_unbiased(self):
        torch.manual_seed(0)
        x = torch.randn(8, 64)
        amax = ref.nvfp4_amax(x, False, False)

        def draw(seed, offset=0):
            data, scales = ref.nvfp4_quantize(x, amax, 1, False, False, torch.tensor([seed, offset]))
            return ref.nvfp4_dequantize(data, scales, amax, 64, torch.float32)
        assert torch.equal(draw(3), draw(3))
        assert not torch.equal(draw(3), draw(4)) and not torch.equal(draw(3), draw(3, 1))
        mean = torch.stack([draw(seed) for seed in range(300)]).mean(0)
        nearest = ref.nvfp4_dequantize(*ref.nvfp4_quantize(x, amax, 1, False, False, None), amax, 64, torch.float32)
        assert (mean - x).abs().mean() < 0.2 * (nearest - x).abs().mean()


def _unpacked(data):
    return ref.unpack_codes(data, data.shape[1] * 2)


SHAPES = [(128, 128), (33, 50), (16, 272), (304, 48)]


class TestQuantizer:
    @pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
    @pytest.mark.parametrize("tiles", [False, True], ids=["1x16", "16x16"])
    def test_casts_as_the_reference(self, shape, dtype, tiles):
        torch.manual_seed(1)
        x = (torch.randn(shape) * 4).to(dtype)
        quantizer = NVFP4Quantizer(rowwise=True, columnwise=True, with_2d_quantization=tiles)
        got = quantizer(x)
        want = NVFP4QuantizerRef(utils.Fp4Formats.E2M1, quant_tile_shape=(16, 16) if tiles else (1, 16)).quantize(x)
        assert isinstance(got, NVFP4Tensor) and got.shape == x.shape and got.dtype == dtype
        assert torch.equal(got._rowwise_data, want.data)
        assert torch.equal(got._rowwise_scale_inv, te_padded_scales(want.scale))
        assert torch.equal(got._columnwise_data, want.data_t)
        assert torch.equal(got._columnwise_scale_inv, te_padded_scales(want.scale_t))
        assert torch.equal(got._amax_rowwise, want.global_amax_row)
        assert torch.equal(got._amax_columnwise, want.global_amax_col)
        empty = quantizer.make_empty(shape, dtype=dtype)
        quantizer.update_quantized(x, empty)
        assert torch.equal(empty._rowwise_data, got._rowwise_data)
        assert torch.equal(empty._columnwise_data, got._columnwise_data)

    @pytest.mark.parametrize("rowwise", [True, False], ids=["both", "columnwise_only"])
    def test_hadamard_columnwise_as_the_reference(self, rowwise):
        torch.manual_seed(2)
        x = torch.randn(64, 96).to(torch.bfloat16)
        got = NVFP4Quantizer(rowwise=rowwise, columnwise=True, with_rht=True, with_post_rht_amax=True)(x)
        want = NVFP4QuantizerRef(utils.Fp4Formats.E2M1, rowwise=rowwise, with_rht=True).quantize(x)
        assert torch.equal(got._columnwise_data, want.data_t)
        assert torch.equal(got._columnwise_scale_inv, te_padded_scales(want.scale_t))
        assert torch.equal(got._amax_columnwise, want.global_amax_col)
        assert (got._rowwise_data is not None) == rowwise

    def test_hadamard_without_signs(self):
        """with_random_sign_mask=False: the plain Hadamard transform (H / 4) of the transpose's rows."""
        torch.manual_seed(4)
        x = torch.randn(32, 48)
        got = NVFP4Quantizer(rowwise=False, with_rht=True, with_post_rht_amax=True, with_random_sign_mask=False)(x)
        hadamard = torch.ones(1, 1, dtype=torch.float64)
        while hadamard.shape[0] < 16:
            hadamard = torch.cat([torch.cat([hadamard, hadamard], 1), torch.cat([hadamard, -hadamard], 1)])
        transformed = (x.t().double().reshape(-1, 16) @ hadamard / 4).reshape(48, 32)  # [cols, rows]
        want = NVFP4QuantizerRef(utils.Fp4Formats.E2M1, rowwise=False, with_rht=True, with_random_sign_mask=False)
        torch.testing.assert_close(want._apply_rht(x.t()).double(), transformed, rtol=0, atol=1e-5)
        assert torch.equal(got._columnwise_data, want.quantize(x).data_t)
        torch.testing.assert_close(got._amax_columnwise, transformed.abs().max().float().reshape(1), rtol=1e-6, atol=0)

    def test_dequantize_within_nvfp4s_error(self):
        """Row-wise: each value within half the largest E2M1 step of its block (1/6 of the block's
        amax) plus the E4M3 rounding of the scale (2^-4 of it). Column-wise after the transform:
        the inverse transform is orthogonal, so each block's error keeps its norm."""
        torch.manual_seed(3)
        x = torch.randn(64, 80)
        values = NVFP4Quantizer()(x).dequantize()
        block_amax = x.reshape(64, 5, 16).abs().amax(-1, keepdim=True)
        assert ((values - x).reshape(64, 5, 16).abs() <= block_amax * (1 / 6 + 2 ** -4) + 1e-6).all()
        transformed = NVFP4Quantizer(rowwise=False, with_rht=True, with_post_rht_amax=True)(x).dequantize()
        assert (transformed - x).norm() <= 0.15 * x.norm()
        assert (values - x).norm() <= 0.15 * x.norm()

    def test_stochastic_rounding_follows_torch_seed(self):
        x = torch.randn(32, 32)
        quantizer = NVFP4Quantizer(stochastic_rounding=True)
        torch.manual_seed(5)
        first = quantizer(x)._rowwise_data
        torch.manual_seed(5)
        assert torch.equal(quantizer(x)._rowwise_data, first)
        assert not torch.equal(quantizer(x)._rowwise_data, first)

    def test_views_usages_and_pickling(self):
        x = torch.randn(64, 48).to(torch.bfloat16)
        t = NVFP4Quantizer()(x)
        view = t.view(4, 16, 48)
        assert isinstance(view, NVFP4Tensor) and torch.equal(view.dequantize().reshape(64, 48), t.dequantize())
        rows = t[16:32]  # whole blocks of the column-wise codes (the transpose's columns): a view
        assert isinstance(rows, NVFP4Tensor) and torch.equal(rows.dequantize(), t.dequantize()[16:32])
        assert rows._columnwise_data.data_ptr() == t._columnwise_data.data_ptr() + 8
        rows = t[:8]  # half a column-wise block: the values
        assert not isinstance(rows, NVFP4Tensor) and torch.equal(rows, t.dequantize()[:8])
        buffer = io.BytesIO()
        torch.save({"w": t}, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=True)["w"]
        assert type(loaded) is torch.Tensor and torch.equal(loaded, t.dequantize())
        t.update_usage(rowwise_usage=False)
        assert t.get_usages() == {"rowwise": False, "columnwise": True} and t._rowwise_data is None
        with pytest.raises(RuntimeError, match="no rowwise data"):
            t.update_usage(rowwise_usage=True)


def test_scale_attributes_are_in_tes_padded_layout():
    """TE stores NVFP4 scales padded to [rows rounded up to 128, blocks rounded up to 4] (its
    tests slice the valid part, or check the padding is zero)."""
    t = NVFP4Quantizer()(torch.randn(48, 80))
    assert t._rowwise_scale_inv.shape == (128, 8) and t._columnwise_scale_inv.shape == (128, 4)
    assert not t._rowwise_scale_inv[48:].any() and not t._rowwise_scale_inv[:, 5:].any()
    assert torch.equal(t._rowwise_scale_inv[:48, :5], t._storage.operand.rowwise.scales.view(torch.uint8))


@pytest.mark.parametrize("tiles", [False, True], ids=["1x16", "16x16"])
def test_a_shard_built_as_fsdp2_builds_it_holds_the_rows_codes(tiles):
    """fully_shard allocates a shard with new_zeros and copies its chunk of the weight into it:
    both stay NVFP4, and the shard's codes, scales and amax are the weight's rows' (the
    column-wise ones: its columns), bit for bit."""
    weight = NVFP4Quantizer(with_2d_quantization=tiles)(torch.randn(64, 48))
    shard = weight.new_zeros(32, 48)
    assert isinstance(shard, NVFP4Tensor) and not shard.dequantize().any()
    shard[:32].copy_(torch.chunk(weight, 2)[1])
    rows, columns = weight._storage.operand.rowwise, weight._storage.operand.columnwise
    held = shard._storage.operand
    assert torch.equal(held.rowwise.data, rows.data[32:]) and torch.equal(held.columnwise.data, columns.data[:, 16:])
    assert torch.equal(held.rowwise.scales.view(torch.uint8), rows.scales[32:].view(torch.uint8))
    assert torch.equal(held.columnwise.scales.view(torch.uint8), columns.scales[:, 2:].view(torch.uint8))
    assert torch.equal(held.rowwise.amax, rows.amax) and torch.equal(shard.dequantize(), weight.dequantize()[32:])


def test_tes_buffer_constructors_rebuild_the_tensor():
    """NVFP4TensorStorage(**tensor.get_metadata()) and NVFP4Tensor(shape, dtype, rowwise_data=...)
    (TE's constructors from raw buffers, TE's padded scale layout) hold the same codes and values;
    a transpose's column-wise buffers put in the row-wise slots are that transpose's row-wise cast;
    an odd width comes from the shape."""
    from transformer_engine.pytorch.tensor.storage.nvfp4_tensor_storage import NVFP4TensorStorage
    x = torch.randn(48, 64)
    tensor = NVFP4Quantizer()(x)
    metadata = tensor.get_metadata()
    rebuilt = NVFP4TensorStorage(**metadata)
    assert rebuilt.shape == (48, 64) and rebuilt.dtype == torch.float32
    assert rebuilt._rowwise_data is tensor._rowwise_data and rebuilt._columnwise_data is tensor._columnwise_data
    assert torch.equal(rebuilt.dequantize(), tensor.dequantize())
    for name in ("data", "scale_inv"):
        metadata[f"rowwise_{name}"] = metadata.pop(f"columnwise_{name}")
    metadata["amax_rowwise"] = metadata.pop("amax_columnwise")
    transposed = NVFP4TensorStorage(**metadata)
    assert transposed.shape == (64, 48)
    assert torch.equal(transposed.dequantize(), NVFP4Quantizer(columnwise=False)(x.t().contiguous()).dequantize())
    odd = NVFP4Quantizer(columnwise=False)(torch.randn(32, 37))
    wrapped = NVFP4Tensor((32, 37), torch.bfloat16, rowwise_data=odd._rowwise_data,
                             rowwise_scale_inv=odd._rowwise_scale_inv, amax_rowwise=odd._amax_rowwise)
    assert wrapped.shape == (32, 37) and wrapped.dtype == torch.bfloat16
    assert torch.equal(wrapped.dequantize(), odd.dequantize().bfloat16())


@pytest.mark.parametrize("change, words", [
    (dict(rowwise_data=None, columnwise_data=None), "rowwise_data or columnwise_data is needed"),
    (dict(rowwise_data=torch.zeros(8, 16, dtype=torch.int8)), r"rowwise_data must be uint8 .*torch.int8 \(8, 16\)"),
    (dict(rowwise_scale_inv=torch.zeros(8, 1, dtype=torch.uint8)), r"at least \[8, 2\].*\(8, 1\)"),
    (dict(amax_rowwise=torch.ones(3)), r"amax_rowwise must hold 1 .*got 3 values"),
    (dict(with_gemm_swizzled_scales=True), "unswizzled"),
    (dict(rowwise_scale_inv=torch.zeros(8, 2)), r"rowwise_scale_inv must be uint8 or float8_e4m3fn.*torch.float32"),
    (dict(columnwise_data=torch.zeros(5, 4, dtype=torch.uint8), columnwise_scale_inv=torch.zeros(128, 4,
          dtype=torch.uint8), amax_columnwise=torch.ones(1)), "columnwise_data .* has 5 rows, the matrix 32 columns"),
])
def test_tes_buffer_constructor_refuses_bad_buffers_by_name(change, words):
    buffers = dict(rowwise_data=torch.zeros(8, 16, dtype=torch.uint8), rowwise_scale_inv=torch.zeros(128, 4,
                   dtype=torch.uint8), amax_rowwise=torch.ones(1))
    with pytest.raises(ValueError, match=words):
        NVFP4Tensor(**{**buffers, **change})

"""TE's NVFP4 variants: 4over6 (each block cast twice, map-to-4 and map-to-6, the smaller error
kept; the global scale bound 448 or 256) and row-scaled NVFP4 (one amax per row).

- the definition on worked values (reference/nvfp4.py), from first principles;
- NVFP4Quantizer (the kernels) against the reference quantizer TE's tests use, bit for bit;
- the recipe's choice of quantizer per operand (TE's rules), and what is refused, by name;
- the GEMMs: alpha with each operand's bound, row-scaled outputs against float64 within the
  bound of tests/fp8/test_nvfp4_gemm.py, the grouped GEMM and tex.generic_gemm equal to
  general_gemm bit for bit, the reference's tensor-core GEMM (qgemm) within that bound;
- modules: te.Linear under row-scaled activations with a backward_override and (TE main) without
  one, 4over6 training."""
import pytest
import torch

import transformer_engine.pytorch as te
import transformer_engine_torch as tex
from transformer_engine.common import recipe
from transformer_engine.pytorch import NVFP4Quantizer
from transformer_engine.pytorch.constants import TE_DType
from transformer_engine.pytorch.cpp_extensions import general_gemm, general_grouped_gemm
from transformer_engine.pytorch.custom_recipes import utils
from transformer_engine.pytorch.custom_recipes.quantization_ref_nvfp4 import NVFP4QuantizerRef
from transformer_engine.pytorch.fp8.gemm import fp8_gemm, fp8_gemm_accumulate
from transformer_engine.pytorch.quantization import NVFP4BlockScalingRecipeState
from transformer_engine.pytorch.reference import nvfp4 as ref
from transformer_engine.pytorch.tensor.nvfp4_tensor import te_padded_scales
from transformer_engine.pytorch.tensor.for_recipe import nvfp4_quantizer

BF16 = torch.bfloat16


class TestDefinition:
    def test_map_to_4_represents_what_map_to_6_cannot(self):
        """E = 256, amax 6: S_enc = 1536 / 6 = 256. A block [6, 4.5]: map-to-6's scale is 256
        (encode 1), so 4.5 rounds to 4 (error 0.5); map-to-4's is 384 (encode 2/3), 6 -> 4 and
        4.5 -> 3, both exact: 4over6 keeps map-to-4, and the values come back exactly."""
        x = torch.zeros(1, 16)
        x[0, 0], x[0, 1] = 6.0, 4.5
        amax = ref.nvfp4_amax(x, False, False)
        for mode in ("mae", "mse"):
            data, scales = ref.nvfp4_quantize(x, amax, 1, False, False, None, 256, mode)
            assert scales.float().item() == 384.0
            assert ref.unpack_codes(data, 16)[0, :2].tolist() == [6, 5]  # the codes of 4 and 3
            assert torch.equal(ref.nvfp4_dequantize(data, scales, amax, 16, torch.float32, 256), x)
        data, scales = ref.nvfp4_quantize(x, amax, 1, False, False, None, 256)
        assert scales.float().item() == 256.0
        assert ref.nvfp4_dequantize(data, scales, amax, 16, torch.float32, 256)[0, 1].item() == 4.0

    def test_a_tie_keeps_map_to_6(self):
        """E = 448, amax 6: S_enc = 448, a block whose amax is 6 has base 448, and map-to-4's
        1.5x clamps to 448 too: the same cast twice, equal errors, map-to-6 (the standard cast)."""
        x = torch.tensor([[6.0, 1.0, -2.5] + [0.0] * 13])
        amax = ref.nvfp4_amax(x, False, False)
        standard = ref.nvfp4_quantize(x, amax, 1, False, False, None)
        four_over_six = ref.nvfp4_quantize(x, amax, 1, False, False, None, 448, "mae")
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(standard, four_over_six))

    def test_row_scaled_rows_scale_alone(self):
        """Each row's amax sets its own global scale: a row 1000x larger leaves the other's codes
        and scales those of the row cast alone."""
        torch.manual_seed(0)
        x = torch.randn(2, 32)
        x[1] *= 1000
        amax = ref.nvfp4_amax(x, False, False, per_row=True)
        assert torch.equal(amax, x.abs().amax(1))
        data, scales = ref.nvfp4_quantize(x, amax, 1, False, False, None)
        alone = ref.nvfp4_quantize(x[:1], amax[:1], 1, False, False, None)
        assert torch.equal(data[:1], alone[0]) and torch.equal(scales[:1].view(torch.uint8), alone[1].view(torch.uint8))
        values = ref.nvfp4_dequantize(data, scales, amax, 32, torch.float32)
        assert ((values - x).abs() <= x.abs().amax(1, keepdim=True) * (1 / 6 + 2 ** -4)).all()

    def test_options_are_checked(self):
        x = torch.randn(32, 32)
        amax = ref.nvfp4_amax(x, False, False)
        with pytest.raises(ValueError, match="four_over_six"):
            ref.nvfp4_quantize(x, amax, 1, False, False, None, 448, "max")
        with pytest.raises(ValueError, match="sr_rng"):
            ref.nvfp4_quantize(x, amax, 1, False, False, torch.tensor([1, 2]), 448, "mae")
        with pytest.raises(ValueError, match="e4m3_max"):
            ref.nvfp4_quantize(x, amax, 1, False, False, None, 300)
        with pytest.raises(ValueError, match="one per row"):
            ref.nvfp4_quantize(x, ref.nvfp4_amax(x, False, False, per_row=True), 16, False, False, None)


SHAPES = [(128, 128), (33, 48), (48, 272)]


def _ref_quantizer(**options):
    return NVFP4QuantizerRef(utils.Fp4Formats.E2M1, **options)


def _assert_same_cast(got, want, columnwise):
    assert torch.equal(got._rowwise_data, want.data)
    assert torch.equal(got._rowwise_scale_inv, te_padded_scales(want.scale))
    assert torch.equal(got._amax_rowwise, want.global_amax_row)
    if columnwise:
        assert torch.equal(got._columnwise_data, want.data_t)
        assert torch.equal(got._columnwise_scale_inv, te_padded_scales(want.scale_t))
        assert torch.equal(got._amax_columnwise, want.global_amax_col)


class TestQuantizer:
    @pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
    @pytest.mark.parametrize("dtype", [torch.float32, BF16], ids=["fp32", "bf16"])
    @pytest.mark.parametrize("tiles", [False, True], ids=["1x16", "16x16"])
    @pytest.mark.parametrize("mode,e4m3_max,fast", [("MAE", 448, False), ("MSE", 256, False), ("MAE", 256, True),
                                                    ("MSE", 448, True)])
    def test_4over6_casts_as_the_reference(self, shape, dtype, tiles, mode, e4m3_max, fast):
        torch.manual_seed(1)
        x = (torch.randn(shape) * 4).to(dtype)
        options = dict(nvfp4_use_4over6=True, nvfp4_e4m3_max=e4m3_max, nvfp4_4over6_err_mode=mode,
                       nvfp4_4over6_err_use_fast_math=fast)
        got = NVFP4Quantizer(with_2d_quantization=tiles, **options)(x)
        want = _ref_quantizer(quant_tile_shape=(16, 16) if tiles else (1, 16), **options).quantize(x)
        _assert_same_cast(got, want, columnwise=True)
        assert got._nvfp4_use_4over6 and got._nvfp4_e4m3_max == e4m3_max
        values = got.dequantize(dtype=torch.float32)
        assert torch.equal(values, want.dequantize(torch.float32))
        assert (values - x.float()).norm() <= 0.15 * x.float().norm()

    @pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
    @pytest.mark.parametrize("dtype", [torch.float32, BF16], ids=["fp32", "bf16"])
    @pytest.mark.parametrize("four_over_six", [False, True], ids=["nvfp4", "4over6"])
    def test_row_scaled_casts_as_the_reference(self, shape, dtype, four_over_six):
        torch.manual_seed(2)
        x = (torch.randn(shape) * torch.rand(shape[0], 1) * 100).to(dtype)
        x[0] = 0  # an all-zero row
        options = dict(row_scaled_nvfp4=True, nvfp4_use_4over6=four_over_six, nvfp4_e4m3_max=256 if four_over_six
                       else 448)
        quantizer = NVFP4Quantizer(columnwise=False, **options)
        got = quantizer(x)
        want = _ref_quantizer(columnwise=False, **options).quantize(x)
        _assert_same_cast(got, want, columnwise=False)
        assert got._row_scaled_nvfp4 and got._amax_rowwise.shape == (shape[0],)
        assert torch.equal(got.dequantize(dtype=torch.float32), want.dequantize(torch.float32))
        empty = quantizer.make_empty(shape, dtype=dtype)
        quantizer.update_quantized(x, empty)
        assert torch.equal(empty._rowwise_data, got._rowwise_data)
        assert torch.equal(empty._amax_rowwise, got._amax_rowwise)

    def test_e4m3_max_is_448_without_4over6(self):
        """As TE: the 256 bound is 4over6's; a standard cast keeps 448."""
        assert NVFP4Quantizer(nvfp4_e4m3_max=256).nvfp4_e4m3_max == 448
        assert NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=256).nvfp4_e4m3_max == 256

    @pytest.mark.parametrize("call,words", [
        (lambda: NVFP4Quantizer(nvfp4_e4m3_max=300), "nvfp4_e4m3_max"),
        (lambda: NVFP4Quantizer(nvfp4_4over6_err_mode="max"), "nvfp4_4over6_err_mode"),
        (lambda: NVFP4Quantizer(nvfp4_use_4over6=True, stochastic_rounding=True), "stochastic_rounding"),
        (lambda: NVFP4Quantizer(row_scaled_nvfp4=True, with_2d_quantization=True), "with_2d_quantization"),
        (lambda: NVFP4Quantizer(row_scaled_nvfp4=True, rowwise=False)(torch.randn(16, 16)), "column-wise usage alone"),
    ])
    def test_bad_combinations_are_refused(self, call, words):
        with pytest.raises(ValueError, match=words):
            call()

    def test_row_scaled_is_not_quantizable_as_te(self):
        assert not NVFP4Quantizer(row_scaled_nvfp4=True, columnwise=False).is_quantizable(torch.zeros(16, 16))


class TestRecipe:
    def test_fields_are_validated(self):
        r = recipe.NVFP4BlockScaling(row_scaled_activation=True, nvfp4_4over6="weights")
        assert r.row_scaled_activation and r.nvfp4_4over6 == "weights" and r.nvfp4_4over6_e4m3_use_256 == "all"
        for field, value in (("nvfp4_4over6", "inputs"), ("nvfp4_4over6_e4m3_use_256", "x"),
                             ("nvfp4_4over6_err_mode", "mae")):
            with pytest.raises(ValueError, match=field):
                recipe.NVFP4BlockScaling(**{field: value})

    @pytest.mark.parametrize("scope,use_256", [("all", "all"), ("weights", "activations"), ("activations", "none"),
                                               ("none", "all")])
    def test_each_operand_gets_te_s_quantizer(self, scope, use_256):
        r = recipe.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True, row_scaled_activation=True,
                                     nvfp4_4over6=scope, nvfp4_4over6_e4m3_use_256=use_256,
                                     nvfp4_4over6_err_mode="MSE")
        for role in ("input", "weight", "grad"):
            q = nvfp4_quantizer(r, role)
            covered = role != "grad" and scope in ("all", {"input": "activations", "weight": "weights"}[role])
            bound_256 = covered and use_256 in ("all", {"input": "activations", "weight": "weights"}[role])
            assert q.nvfp4_use_4over6 == covered and q.nvfp4_e4m3_max == (256 if bound_256 else 448)
            assert q.row_scaled_nvfp4 == (role == "input") and q.nvfp4_4over6_err_mode == "MSE"

    def test_4over6_with_the_transform_is_refused(self):
        with pytest.raises(ValueError, match="Hadamard"):
            nvfp4_quantizer(recipe.NVFP4BlockScaling(nvfp4_4over6="activations"), "input")

    def test_recipe_state_makes_the_slots_quantizers(self):
        r = recipe.NVFP4BlockScaling(disable_rht=True, nvfp4_4over6="weights")
        forward = NVFP4BlockScalingRecipeState(r, mode="forward", num_quantizers=3).make_quantizers()
        assert [q.nvfp4_use_4over6 for q in forward] == [False, True, False]
        backward = NVFP4BlockScalingRecipeState(r, mode="backward", num_quantizers=2).make_quantizers()
        assert all(q.stochastic_rounding and not q.nvfp4_use_4over6 for q in backward)
        with pytest.raises(ValueError, match="mode"):
            NVFP4BlockScalingRecipeState(r, mode="sideways")


def _decoded64(usage):
    """code * scale of each element, exact in fp32 (so in float64)."""
    return ref.nvfp4_dequantize(usage.data, usage.scales, torch.tensor([6.0 * 448]), usage.cols,
                                torch.float32).double()


def _within_bound(got, a, b, global_scales, bias=None):
    """got against float64 with the bound of test_nvfp4_gemm.py, global_scales (float64) the
    per-element factor [m | 1, n | 1]."""
    a64, b64 = _decoded64(a), _decoded64(b)
    want = (a64 @ b64.t()) * global_scales
    if bias is not None:
        want = want + bias.double()
    bound = (a64.shape[1] + 2) * 2.0 ** -24 * global_scales * (a64.abs() @ b64.abs().t())
    ulp = torch.finfo(got.dtype).eps * want.abs()
    assert ((got.double() - want).abs() <= bound + ulp + 1e-30).all()


class TestGemm:
    def test_alpha_takes_each_operands_bound(self):
        torch.manual_seed(3)
        x = NVFP4Quantizer(columnwise=False, nvfp4_use_4over6=True, nvfp4_e4m3_max=256)(torch.randn(16, 64))
        w = NVFP4Quantizer(columnwise=False)(torch.randn(32, 64))
        a, b = x._storage.operand.rowwise, w._storage.operand.rowwise
        got = fp8_gemm(a, b, torch.float32)
        factor = torch.tensor([1.0]) / torch.tensor([6.0 * 6.0 * 256 * 448])
        alpha = (a.amax * b.amax) * factor
        _within_bound(got, a, b, alpha.double())
        torch.testing.assert_close(got, x.dequantize() @ w.dequantize().t(), rtol=1e-5, atol=1e-5)

    @pytest.mark.parametrize("out_dtype", [torch.float32, BF16], ids=["fp32", "bf16"])
    def test_row_scaled_rows_take_their_own_amax(self, out_dtype):
        torch.manual_seed(4)
        x = torch.randn(48, 64) * torch.logspace(-3, 3, 48).view(48, 1)
        xq = NVFP4Quantizer(columnwise=False, row_scaled_nvfp4=True)(x)
        wq = NVFP4Quantizer(columnwise=False)(torch.randn(40, 64))
        bias = torch.randn(40)
        a, b = xq._storage.operand.rowwise, wq._storage.operand.rowwise
        got = fp8_gemm(a, b, out_dtype, bias)
        factor = (torch.tensor([1.0]) / torch.tensor([6.0 * 6.0 * 448 * 448])).double()
        _within_bound(got, a, b, factor * (a.amax.view(-1, 1) * b.amax).double(), bias)
        with pytest.raises(NotImplementedError, match="row-scaled"):
            fp8_gemm_accumulate(a, b, torch.zeros(48, 40))

    def test_general_gemm_grouped_and_tex_agree_bit_for_bit(self):
        torch.manual_seed(5)
        xq = NVFP4Quantizer(columnwise=False, row_scaled_nvfp4=True)
        wq = NVFP4Quantizer()
        splits = [16, 0, 48]
        xs = [xq(torch.randn(m, 64)) for m in splits]
        ws = [wq(torch.randn(32, 64)) for _ in splits]
        biases = [torch.randn(32, dtype=BF16) for _ in splits]
        singles = [general_gemm(w, x, out_dtype=BF16, layout="TN", bias=b)[0] for x, w, b in zip(xs, ws, biases)]
        out = [torch.empty(sum(splits), 32, dtype=BF16)]
        grouped, _, _ = general_grouped_gemm(ws, xs, out, [None] * 3, BF16, layout="TN", m_splits=splits,
                                             bias=biases, use_bias=True, single_output=True)
        assert grouped is out[0] and torch.equal(grouped, torch.cat(singles))
        lists = [torch.empty(m, 32, dtype=BF16) for m in splits]
        grouped_list, _, _ = general_grouped_gemm(ws, xs, lists, [None] * 3, BF16, bias=biases, use_bias=True)
        assert all(torch.equal(g, s) for g, s in zip(grouped_list, singles))
        plain = NVFP4Quantizer()(torch.randn(16, 64))
        via_tex = tex.generic_gemm(ws[0], True, plain, False, None, None, TE_DType[torch.float32], None, None, False,
                                   None, False, None, 0, False, False)[0]
        assert torch.equal(via_tex, general_gemm(ws[0], plain, out_dtype=torch.float32, layout="TN")[0])
        with pytest.raises(ValueError, match="m_splits"):
            general_grouped_gemm(ws, xs, out, [None] * 3, BF16, m_splits=[16, 48], single_output=True)

    @pytest.mark.parametrize("row_scaled", [False, True], ids=["nvfp4", "row_scaled"])
    def test_reference_tensor_core_gemm_is_within_the_bound(self, row_scaled):
        """NVFP4QuantizerRef.qgemm sums each 16-long block times its scales, then the blocks:
        another fp32 order of the same exact products as ours, within the same bound."""
        torch.manual_seed(6)
        x, w = torch.randn(32, 128), torch.randn(48, 128)
        options = dict(nvfp4_use_4over6=True, nvfp4_e4m3_max=256)
        rx = _ref_quantizer(columnwise=False, row_scaled_nvfp4=row_scaled, **options).quantize(x)
        rw = _ref_quantizer(**options).quantize(w)
        got = _ref_quantizer().qgemm(rx.data, rw.data, None, torch.float32, rx.scale, rw.scale, qresult_x=rx,
                                     qresult_w=rw)
        xq = NVFP4Quantizer(columnwise=False, row_scaled_nvfp4=row_scaled, **options)(x)
        a, b = xq._storage.operand.rowwise, NVFP4Quantizer(**options)(w)._storage.operand.rowwise
        amaxes = (a.amax.view(-1, 1) if row_scaled else a.amax) * b.amax
        _within_bound(got, a, b, amaxes.double() / (6.0 * 6.0 * 256 * 256))


def _nvfp4_recipe(**fields):
    r = recipe.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True, **fields)
    r.fp4_quant_fwd_inp, r.fp4_quant_bwd_grad = recipe.QParams(), recipe.QParams()
    return r


class TestModules:
    @pytest.mark.parametrize("override", ["dequantized", "high_precision"])
    def test_linear_under_row_scaled_activations(self, override):
        """The forward GEMM is the row-scaled input's codes times the weight's; the backward runs
        in high precision from the values the override names."""
        torch.manual_seed(7)
        lin = te.Linear(64, 48, params_dtype=BF16)
        x = (torch.randn(32, 64) * torch.logspace(-2, 2, 32).view(32, 1)).to(BF16).requires_grad_()
        with te.autocast(recipe=_nvfp4_recipe(row_scaled_activation=True, backward_override=override)):
            y = lin(x)
        xq = NVFP4Quantizer(columnwise=False, row_scaled_nvfp4=True)(x.detach())
        wq = NVFP4Quantizer(columnwise=False, with_2d_quantization=True)(lin.weight.detach())
        want = fp8_gemm(xq._storage.operand, wq._storage.operand, BF16, lin.bias.detach())
        assert torch.equal(y, want)
        y.float().sum().backward()
        weight = wq.dequantize(dtype=BF16) if override == "dequantized" else lin.weight.detach()
        torch.testing.assert_close(x.grad, torch.ones(32, 48, dtype=BF16) @ weight, rtol=1e-2, atol=1e-2)

    @pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
    def test_row_scaled_column_wise_usage_is_the_transposes_row_scaled_cast(self, rht):
        """TE main: a row-scaled cast's column-wise usage takes one amax per row of the
        transpose (after the transform where it applies), codes and scales as the reference's."""
        x = torch.randn(48, 64, dtype=BF16) * torch.logspace(-2, 2, 64, dtype=BF16)
        got = NVFP4Quantizer(row_scaled_nvfp4=True, with_rht=rht, with_post_rht_amax=rht)(x)._storage.operand.columnwise
        amax = ref.nvfp4_amax(x, True, rht, True)
        data, scales = ref.nvfp4_quantize(x, amax, 1, True, rht, None)
        assert got.row_scaled and torch.equal(got.amax, amax) and torch.equal(got.data, data)
        assert torch.equal(got.scales.view(torch.uint8), scales.view(torch.uint8))

    def test_linear_trains_under_row_scaled_activations_without_an_override(self):
        """TE main: the input's column-wise usage is row-scaled too, so the weight gradient runs in
        NVFP4 with no backward_override: within NVFP4's error of the exact product."""
        torch.manual_seed(5)
        lin = te.Linear(64, 48, params_dtype=BF16)
        x = torch.randn(32, 64, dtype=BF16, requires_grad=True)
        with te.autocast(recipe=_nvfp4_recipe(row_scaled_activation=True)):
            y = lin(x)
        dy = torch.randn(32, 48, dtype=BF16)
        y.backward(dy)
        want = dy.float().t() @ x.detach().float()
        assert (lin.weight.grad.float() - want).norm() <= 0.15 * want.norm()

    def test_4over6_training_tracks_bf16(self):
        """A LayerNormMLP regression: 4over6 on every forward cast (weights in 16 x 16 tiles,
        bound 256) ends within 10% of bf16's loss."""
        r = _nvfp4_recipe(nvfp4_4over6="all")
        losses = {}
        for name, context in (("bf16", None), ("4over6", r)):
            torch.manual_seed(8)
            model = te.LayerNormMLP(64, 128, params_dtype=BF16)
            target = torch.nn.Linear(64, 64).to(BF16)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            for _ in range(30):
                x = torch.randn(64, 64, dtype=BF16)
                with te.autocast(enabled=context is not None, recipe=context):
                    loss = torch.nn.functional.mse_loss(model(x).float(), target(x).detach().float())
                opt.zero_grad()
                loss.backward()
                opt.step()
            losses[name] = loss.item()
        assert losses["4over6"] <= 1.1 * losses["bf16"] + 1e-3

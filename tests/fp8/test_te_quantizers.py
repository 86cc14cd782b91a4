"""TE 2.x's quantizers and quantized tensors (transformer_engine.pytorch.tensor) against plain
PyTorch: the codes and scales each scheme defines, the attributes TE code reads, writes that
re-quantise, usages, autograd through quantize -> dequantize, and refusals."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.constants import DType

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def reference_codes(x, scale, fp8_dtype):
    """saturate(x * scale) rounded to nearest even, in plain PyTorch."""
    limit = torch.finfo(fp8_dtype).max
    return (x.float() * scale).clamp(-limit, limit).to(fp8_dtype)


@pytest.mark.parametrize("fp8_dtype", [DType.kFloat8E4M3, DType.kFloat8E5M2])
@pytest.mark.parametrize("shape", [(), (7,), (5, 33), (2, 3, 17)])
def test_delayed_scaling_quantizer_casts_at_its_scale_and_keeps_the_running_amax(fp8_dtype, shape):
    torch.manual_seed(0)
    scale, amax = torch.tensor([3.5]), torch.tensor([0.25])
    quantizer = te.Float8Quantizer(scale, amax, fp8_dtype)
    x = torch.randn(shape)
    q = quantizer(x)
    assert isinstance(q, te.Float8Tensor) and q.shape == x.shape and q.dtype == x.dtype
    expected = reference_codes(x, 3.5, fp8_dtype.to_torch())
    assert torch.equal(q._data, expected.view(torch.uint8))
    assert q._scale_inv.item() == pytest.approx(1 / 3.5) and q._fp8_dtype == fp8_dtype
    torch.testing.assert_close(q.dequantize(), expected.float() * q._scale_inv.item(), rtol=0, atol=0)
    assert amax.item() == max(0.25, x.abs().max().item() if x.numel() else 0.0)


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_current_scaling_quantizer_derives_the_scale_from_the_tensor(pow2, dtype):
    torch.manual_seed(1)
    x = (torch.randn(9, 40) * 7).to(dtype)
    quantizer = te.Float8CurrentScalingQuantizer(DType.kFloat8E4M3, force_pow_2_scales=pow2)
    q = quantizer(x)
    scale = torch.tensor([448.0]) / x.float().abs().max()
    if pow2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    torch.testing.assert_close(quantizer.scale, scale, rtol=0, atol=0)
    assert torch.equal(q._data, reference_codes(x, scale, E4M3).view(torch.uint8))
    assert q._transpose is not None and torch.equal(q._transpose, q._data.t())  # column-wise usage
    quantizer.set_usage(columnwise=False)
    assert quantizer(x)._transpose is None


@pytest.mark.parametrize("make, cls, block", [
    (lambda: te.MXFP8Quantizer(DType.kFloat8E4M3), te.MXFP8Tensor, 32),
    (lambda: te.Float8BlockQuantizer(DType.kFloat8E4M3, block_scaling_dim=1), te.Float8BlockwiseQTensor, 128),
])
def test_block_quantizers_flatten_leading_dims_and_dequantize_to_the_shape(make, cls, block):
    torch.manual_seed(2)
    x = torch.randn(2, 3, 2 * block)
    q = make()(x)
    assert isinstance(q, cls) and q.shape == x.shape
    assert q._rowwise_data.shape == (6, 2 * block) and q._rowwise_scale_inv.shape == (6, 2)
    assert q._columnwise_data is not None
    torch.testing.assert_close(q.dequantize(), x, rtol=0.07, atol=1e-2)
    # Column-wise only: the row-wise copy dropped, the values read from the column-wise one.
    values = q.dequantize()
    q.update_usage(rowwise_usage=False)
    assert q._rowwise_data is None
    torch.testing.assert_close(q.dequantize(), values, rtol=0.07, atol=1e-2)
    with pytest.raises(RuntimeError, match="rowwise"):
        q.update_usage(rowwise_usage=True)


def test_writes_requantise_and_noop_flag_keeps_the_values():
    x = torch.linspace(-1, 1, 24).reshape(4, 6)
    q = te.Float8Quantizer(torch.tensor([2.0]), torch.zeros(1), DType.kFloat8E4M3)(x)
    kept = q.dequantize().clone()
    q.quantize_(3 * x, noop_flag=torch.ones(1))
    torch.testing.assert_close(q.dequantize(), kept, rtol=0, atol=0)
    q.quantize_(3 * x, noop_flag=torch.zeros(1))
    torch.testing.assert_close(q.dequantize(), reference_codes(3 * x, 2.0, E4M3).float() / 2, rtol=0, atol=0)
    stored = q.dequantize()
    q += 1  # an in-place op adds to the stored values in high precision and re-quantises
    assert isinstance(q, te.Float8Tensor)
    torch.testing.assert_close(q.dequantize(), reference_codes(stored + 1, 2.0, E4M3).float() / 2, rtol=0, atol=0)


def test_update_quantized_and_make_empty():
    quantizer = te.Float8CurrentScalingQuantizer(DType.kFloat8E5M2)
    empty = quantizer.make_empty((3, 5), dtype=torch.bfloat16)
    assert isinstance(empty, te.Float8Tensor) and empty.dtype == torch.bfloat16 and not empty.dequantize().any()
    source = torch.randn(3, 5)
    quantizer.update_quantized(source, empty)
    torch.testing.assert_close(empty.dequantize().float(), source, rtol=0.25, atol=1e-3)
    with pytest.raises(ValueError, match="shape"):
        quantizer.update_quantized(torch.randn(2, 5), empty)
    with pytest.raises(ValueError, match="Float8Tensor"):
        te.MXFP8Quantizer(DType.kFloat8E4M3).update_quantized(torch.randn(3, 32), empty)


@pytest.mark.parametrize("make", [
    lambda: te.Float8CurrentScalingQuantizer(DType.kFloat8E4M3),
    lambda: te.MXFP8Quantizer(DType.kFloat8E4M3),
    lambda: te.Float8BlockQuantizer(DType.kFloat8E4M3),
])
def test_gradient_passes_through_quantize_and_dequantize(make):
    x = torch.randn(64, 64, requires_grad=True)
    q = make()(x)
    assert q.grad_fn is not None and q.requires_grad
    (q.dequantize() * 3).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))


def test_float8_tensor_from_codes_and_replace_raw_data():
    from transformer_engine.pytorch.tensor.utils import replace_raw_data
    codes = torch.tensor([[1.0, -2.0], [0.5, 448.0]]).to(E4M3).view(torch.uint8)
    t = te.Float8Tensor(shape=(2, 2), dtype=torch.float32, data=codes, fp8_scale_inv=torch.tensor([0.5]),
                        fp8_dtype=DType.kFloat8E4M3)
    torch.testing.assert_close(t.dequantize(), torch.tensor([[0.5, -1.0], [0.25, 224.0]]))
    t.update_usage(columnwise_usage=True)
    attributes = ("_quantizer", "_fp8_dtype", "_scale_inv", "_transpose", "_transpose_invalid")
    before = {name: getattr(t, name) for name in attributes}
    assert t._transpose is before["_transpose"]  # TE's attributes are stored: one object per read
    buffer = torch.zeros(2, 2, dtype=torch.uint8)
    replace_raw_data(t, buffer)
    assert all(getattr(t, name) is before[name] for name in attributes)  # only the codes moved
    buffer.zero_()  # the tensor now stores its codes in the buffer
    assert not t.dequantize().any()


@pytest.mark.parametrize("call, error, words", [
    (lambda: te.Float8CurrentScalingQuantizer(torch.float16), ValueError, "fp8_dtype"),
    (lambda: te.Float8Quantizer(torch.ones(2), torch.zeros(1), DType.kFloat8E4M3), ValueError, "scale"),
    (lambda: te.Float8BlockQuantizer(DType.kFloat8E4M3, block_scaling_dim=3), ValueError, "block_scaling_dim"),
    (lambda: te.MXFP8Quantizer(DType.kFloat8E4M3)(torch.arange(4)), TypeError, "floating-point"),
    (lambda: te.NVFP4Quantizer(DType.kFloat8E4M3), ValueError, "fp4_dtype"),
    (lambda: te.NVFP4Quantizer(nvfp4_e4m3_max=100), ValueError, "nvfp4_e4m3_max"),
])
def test_bad_arguments_are_refused(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_quantized_model_init_stores_weights_as_the_recipes_tensor_class():
    for rec, cls in ((recipe.Float8CurrentScaling(), te.Float8Tensor), (recipe.MXFP8BlockScaling(), te.MXFP8Tensor),
                     (recipe.Float8BlockScaling(), te.Float8BlockwiseQTensor)):
        with te.quantized_model_init(recipe=rec):
            layer = te.Linear(64, 32)
        assert isinstance(layer.weight, cls)
        with te.autocast(recipe=rec):
            out = layer(torch.randn(4, 64))
        out.sum().backward()
        assert layer.weight.grad is not None and layer.weight.grad.shape == (32, 64)


@pytest.mark.parametrize("override", ["high_precision", "dequantized"])
@pytest.mark.parametrize("recipe_class", [recipe.Float8CurrentScaling, recipe.MXFP8BlockScaling])
def test_backward_override_runs_the_backward_gemms_in_high_precision(override, recipe_class):
    """The output gradient is not cast; the backward GEMMs see the unquantised x and W
    ('high_precision') or the forward's FP8 operands dequantised ('dequantized')."""
    torch.manual_seed(5)
    rec = recipe_class(backward_override=override)
    layer = te.Linear(64, 32, bias=False)
    x = torch.randn(16, 64, requires_grad=True)
    with te.autocast(recipe=rec):
        y = layer(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    if override == "high_precision":
        w, inp = layer.weight.detach(), x.detach()
    else:
        quantizer = (te.MXFP8Quantizer(DType.kFloat8E4M3, columnwise=False) if rec.mxfp8()
                     else te.Float8CurrentScalingQuantizer(DType.kFloat8E4M3))
        w, inp = quantizer(layer.weight.detach()).dequantize(), quantizer(x.detach()).dequantize()
    torch.testing.assert_close(x.grad, dy @ w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.weight.grad, dy.t() @ inp, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("override", ["high_precision", "dequantized"])
def test_grouped_linear_backward_override_matches_its_splits(override):
    """Each split's gradients as te.Linear's backward_override computes them."""
    torch.manual_seed(6)
    rec = recipe.Float8CurrentScaling(backward_override=override)
    layer = te.GroupedLinear(3, 32, 16, bias=False)
    x = torch.randn(12, 32, requires_grad=True)
    splits = [5, 0, 7]
    with te.autocast(recipe=rec):
        y = layer(x, splits)
    dy = torch.randn_like(y)
    y.backward(dy)
    quantizer = te.Float8CurrentScalingQuantizer(DType.kFloat8E4M3)
    for i, (x_i, dy_i) in enumerate(zip(torch.split(x.detach(), splits), torch.split(dy, splits))):
        w = getattr(layer, f"weight{i}").detach()
        if override == "dequantized" and x_i.shape[0]:
            w, x_i = quantizer(w).dequantize(), quantizer(x_i).dequantize()
        elif override == "dequantized":
            w = quantizer(w).dequantize()
        torch.testing.assert_close(getattr(layer, f"weight{i}").grad, dy_i.t() @ x_i, rtol=1e-5, atol=1e-5)
        start = sum(splits[:i])
        torch.testing.assert_close(x.grad[start:start + splits[i]], dy_i @ w, rtol=1e-5, atol=1e-5)


def test_a_weight_stored_for_another_kind_of_recipe_is_refused_by_name():
    with te.quantized_model_init(recipe=recipe.MXFP8BlockScaling()):
        layer = te.Linear(64, 32)
    with pytest.raises(RuntimeError, match="Recipe mismatch for .*MXFP8Tensor"):
        with pytest.warns(UserWarning, match="Recipe type changed"):
            with te.autocast(recipe=recipe.DelayedScaling()):
                layer(torch.randn(4, 64))


def test_recipe_changes_warn_once():
    layer = te.Linear(32, 32)
    x = torch.randn(4, 32)
    with te.autocast(recipe=recipe.DelayedScaling()):
        layer(x)
    with pytest.warns(UserWarning, match="Recipe type changed from DelayedScaling to MXFP8BlockScaling"):
        with te.autocast(recipe=recipe.MXFP8BlockScaling()):
            layer(x)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with te.autocast(recipe=recipe.MXFP8BlockScaling()):
            layer(x)
    with te.quantized_model_init(recipe=recipe.DelayedScaling(amax_history_len=8)):
        stored = te.Linear(32, 32)
    with pytest.warns(UserWarning, match="Quantizer is being updated"):
        with te.autocast(recipe=recipe.DelayedScaling(amax_history_len=1)):
            stored(x)


@pytest.mark.parametrize("rec, cls", [(recipe.DelayedScaling(), te.Float8Quantizer),
                                      (recipe.Float8CurrentScaling(), te.Float8CurrentScalingQuantizer),
                                      (recipe.Float8BlockScaling(), te.Float8BlockQuantizer),
                                      (recipe.MXFP8BlockScaling(), te.MXFP8Quantizer)])
def test_module_quantizers_follow_the_recipe_and_delayed_ones_share_the_state(rec, cls):
    layer = te.Linear(32, 32)
    assert layer.quantizers == {"scaling_fwd": [], "scaling_bwd": []}
    with te.autocast(recipe=rec):
        layer(torch.randn(4, 32))
    forward, backward = layer.quantizers["scaling_fwd"], layer.quantizers["scaling_bwd"]
    assert len(forward) == 3 and len(backward) == 2 and all(isinstance(q, cls) for q in forward + backward)
    if rec.delayed():
        forward[0].scale.fill_(2.0)  # a view of the module's own scale
        assert layer.fp8_meta["scaling_fwd"].scale[0].item() == 2.0


def test_a_linear_casts_through_the_quantizers_of_its_slots():
    """The module's GEMM operands are cast by TE quantizers over its fp8_meta slots: a scale
    written into the state (here through the quantizer TE code gets) is the one the next
    forward casts with, and the cast records its amax into that slot's live row."""
    torch.manual_seed(0)
    layer = te.Linear(32, 16, bias=False)
    rec = recipe.DelayedScaling()
    x = torch.randn(8, 32)
    with te.autocast(recipe=rec):
        layer(x)
    layer.quantizers["scaling_fwd"][0].scale.fill_(4.0)  # the input slot
    layer.quantizers["scaling_fwd"][1].scale.fill_(8.0)  # the weight slot
    state = layer.fp8_meta["scaling_fwd"]
    state.amax_history.zero_()
    with torch.no_grad(), te.autocast(recipe=rec):
        y = layer(x)  # the update at the region's exit rolls the history: the amaxes are in the last row
    x_q = reference_codes(x, 4.0, E4M3).float() / 4.0
    w_q = reference_codes(layer.weight.detach(), 8.0, E4M3).float() / 8.0
    torch.testing.assert_close(y, x_q @ w_q.t(), rtol=1e-6, atol=1e-6)
    assert state.amax_history[-1, 0].item() == x.abs().max().item()
    assert state.amax_history[-1, 1].item() == layer.weight.detach().abs().max().item()


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("override", [None, "dequantized"])
def test_gemm_quantizers_make_the_backward_layouts_only_when_a_backward_in_fp8_is_due(training, override):
    from transformer_engine.pytorch.module._fp8_call import ONE_GEMM, gemm_quantizers
    layer = te.Linear(16, 16)
    rec = recipe.Float8CurrentScaling(backward_override=override)
    with te.autocast(recipe=rec):
        layer(torch.randn(4, 16))
    quantizers = gemm_quantizers(rec, layer.fp8_meta, needs_backward=training, gemm=ONE_GEMM[0])
    transposes = training and override is None
    assert quantizers.input.columnwise_usage == transposes and quantizers.weight.columnwise_usage == transposes
    if training:
        assert quantizers.grad_output.fp8_dtype == torch.float8_e5m2  # HYBRID: E5M2 gradients
    else:
        assert quantizers.grad_output is None  # no backward due: no gradient to cast
    kept_input = gemm_quantizers(rec, layer.fp8_meta, training, ONE_GEMM[0], save_original_input=True).input
    assert not kept_input.columnwise_usage


def test_current_scaling_slots_keep_the_last_casts_scale():
    layer = te.Linear(32, 16)
    x = torch.randn(8, 32) * 3
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        layer(x)
    state = layer.fp8_meta["scaling_fwd"]
    amax = x.abs().max()
    assert state.amax_history[0, 0] == amax
    torch.testing.assert_close(state.scale[0], 448.0 / amax)
    assert layer.quantizers["scaling_fwd"][0].scale.item() == state.scale[0].item()


def test_delayed_scaling_rolls_only_the_slots_that_recorded_an_amax():
    """A Linear's output slot is never cast: its history and scale stay as they are (TE)."""
    layer = te.Linear(16, 16)
    rec = recipe.DelayedScaling(amax_history_len=4)
    with te.autocast(recipe=rec):
        layer(torch.randn(8, 16)).sum().backward()
    state = layer.fp8_meta["scaling_fwd"]
    state.amax_history[1:, 2] = 5.0
    state.scale[2] = 3.0
    before = state.amax_history.clone()
    with te.autocast(recipe=rec):
        layer(torch.randn(8, 16)).sum().backward()
    torch.testing.assert_close(state.amax_history[:, 2], before[:, 2])  # the output slot: untouched
    assert state.scale[2].item() == 3.0
    # The input slot rolled: its older rows moved up one, the amax just recorded is the last row.
    torch.testing.assert_close(state.amax_history[1:-1, 0], before[2:, 0])
    assert state.amax_history[-1, 0].item() > 0 and state.amax_history[0, 0].item() == 0


def test_fp8_meta_takes_a_tex_fp8_tensor_meta():
    import transformer_engine_torch as tex
    layer = te.Linear(16, 16)
    with te.autocast(recipe=recipe.DelayedScaling()):
        layer(torch.randn(4, 16))
    replacement = tex.FP8TensorMeta()
    replacement.scale = torch.full((3,), 2.0)
    layer.fp8_meta["scaling_fwd"] = replacement
    assert layer.fp8_meta["scaling_fwd"].scale is replacement.scale
    with pytest.raises(TypeError, match="FP8TensorMeta"):
        layer.fp8_meta["scaling_fwd"] = {"scale": torch.ones(3)}


@pytest.mark.parametrize("rec", [recipe.Float8CurrentScaling(), recipe.MXFP8BlockScaling()])
def test_weights_made_without_autograd_keep_the_forward_usage_only(rec):
    """TE's heuristic: a model built under torch.no_grad() is for inference, its FP8 weights
    keep no column-wise copy; trained anyway, the GEMM casts the weight from its values."""
    with torch.no_grad(), te.quantized_model_init(recipe=rec):
        layer = te.Linear(64, 32)
    if isinstance(layer.weight, te.Float8Tensor):
        assert layer.weight._transpose is None and layer.weight._transpose_invalid
    else:
        assert layer.weight._columnwise_data is None
    x = torch.randn(8, 64, requires_grad=True)
    with te.autocast(recipe=rec):
        layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    with te.quantized_model_init(recipe=rec):
        trained = te.Linear(64, 32)
    assert trained.weight.get_usages()["columnwise"] or isinstance(trained.weight, te.Float8Tensor)


@pytest.mark.parametrize("rec", [recipe.DelayedScaling(), recipe.Float8CurrentScaling(), recipe.MXFP8BlockScaling(),
                                 recipe.Float8BlockScaling()], ids=lambda r: type(r).__name__)
def test_stored_weight_requantises_from_its_init_values_through_its_quantizer(rec):
    """TE's _get_quantizer(): make_empty + update_quantized of the kept init values give the
    stored FP8 weight back, bit for bit."""
    with te.quantized_model_init(recipe=rec, preserve_high_precision_init_val=True):
        model = te.Linear(64, 32)
    weight = model.weight
    quantizer = weight._get_quantizer()
    assert quantizer is weight._quantizer
    fresh = quantizer.make_empty(shape=weight.shape, dtype=weight.dtype, device=weight.device)
    quantizer.update_quantized(weight.get_high_precision_init_val().to(weight.device), fresh)
    assert type(fresh) is type(weight)
    assert torch.equal(fresh.dequantize(), weight.dequantize())


QUANTIZERS = {"per_tensor": lambda: te.Float8CurrentScalingQuantizer(DType.kFloat8E4M3),
              "mxfp8": lambda: te.MXFP8Quantizer(DType.kFloat8E4M3),
              "block_1d": lambda: te.Float8BlockQuantizer(DType.kFloat8E4M3, block_scaling_dim=1),
              "block_2d": lambda: te.Float8BlockQuantizer(DType.kFloat8E4M3, block_scaling_dim=2)}


def test_storage_classes_at_tes_module_paths():
    """tensor.storage.<name>_storage.<Name>Storage, as TE's modules have them: each the tensor class."""
    import importlib
    for module, name, cls in (("float8_tensor_storage", "Float8TensorStorage", te.Float8Tensor),
                              ("mxfp8_tensor_storage", "MXFP8TensorStorage", te.MXFP8Tensor),
                              ("float8_blockwise_tensor_storage", "Float8BlockwiseQTensorStorage",
                               te.Float8BlockwiseQTensor),
                              ("nvfp4_tensor_storage", "NVFP4TensorStorage", te.NVFP4Tensor)):
        found = getattr(importlib.import_module(f"transformer_engine.pytorch.tensor.storage.{module}"), name)
        assert found is cls and getattr(importlib.import_module("transformer_engine.pytorch.tensor.storage"),
                                        name) is cls


# NVFP4's column-wise codes are the transpose's: a cut of rows cuts their columns.
VIEWED_QUANTIZERS = {**QUANTIZERS, "nvfp4_1x16": lambda: te.NVFP4Quantizer(),
                     "nvfp4_16x16": lambda: te.NVFP4Quantizer(with_2d_quantization=True)}


@pytest.mark.parametrize("kind", VIEWED_QUANTIZERS)
def test_views_stay_quantized_and_share_the_storage(kind):
    """view / reshape keeping the last dimension, chunk / split / slices of the first on block
    boundaries: quantized views of the same codes; reads see later writes to the base."""
    torch.manual_seed(0)
    base = VIEWED_QUANTIZERS[kind]()(torch.randn(256, 128, dtype=torch.bfloat16))
    values = base.dequantize()
    views = {"view": (base.view(2, 128, 128), values.view(2, 128, 128)),
             "reshape": (base.reshape(4, 64, 128), values.reshape(4, 64, 128)),
             "chunk": (torch.chunk(base, 2, dim=0)[1], values[128:]),
             "split": (torch.split(base, [128, 128])[0], values[:128]),
             "slice": (base[128:], values[128:])}
    for name, (view, expected) in views.items():
        assert type(view) is type(base), name
        assert view.shape == expected.shape and view.dtype == base.dtype
        assert torch.equal(view.dequantize(), expected), name
    data = base._data if kind == "per_tensor" else base._rowwise_data
    viewed = views["view"][0]
    assert (viewed._data if kind == "per_tensor" else viewed._rowwise_data).data_ptr() == data.data_ptr()
    base.copy_(torch.full((256, 128), 0.5))
    assert torch.equal(views["slice"][0].dequantize(), torch.full((128, 128), 0.5, dtype=torch.bfloat16))


@pytest.mark.parametrize("kind", QUANTIZERS)
def test_a_write_into_a_view_writes_its_part_of_the_base(kind):
    torch.manual_seed(1)
    base = QUANTIZERS[kind]()(torch.randn(256, 128))
    before = base.dequantize()
    base[:128].copy_(torch.zeros(128, 128))  # re-quantises the whole base
    after = base.dequantize()
    assert torch.equal(after[:128], torch.zeros(128, 128))
    torch.testing.assert_close(after[128:], before[128:], rtol=0.07, atol=1e-2)


def test_cuts_the_block_layout_cannot_express_give_plain_values():
    base = te.MXFP8Quantizer(DType.kFloat8E4M3)(torch.randn(128, 128))
    left, right = torch.chunk(base, 2, dim=1)  # column blocks of the column-wise copy span both
    assert type(left) is torch.Tensor and torch.equal(right, base.dequantize()[:, 64:])
    rows = base[:48]  # the column-wise copy's 32-row blocks would be cut
    assert type(rows) is torch.Tensor and torch.equal(rows, base.dequantize()[:48])
    per_tensor = te.Float8CurrentScalingQuantizer(DType.kFloat8E4M3)(torch.randn(8, 6))
    assert isinstance(per_tensor[:, 2:4], te.Float8Tensor)  # any slice of per-tensor codes


@pytest.mark.parametrize("kind", VIEWED_QUANTIZERS)
def test_clone_is_a_quantized_copy(kind):
    base = VIEWED_QUANTIZERS[kind]()(torch.randn(128, 128))
    copy = base.clone()
    assert type(copy) is type(base) and torch.equal(copy.dequantize(), base.dequantize())
    copy.copy_(torch.zeros(128, 128))
    assert base.dequantize().abs().sum() > 0


def test_tex_quantize_allocates_or_writes_into_its_output():
    import transformer_engine_torch as tex
    quantizer = te.Float8CurrentScalingQuantizer(DType.kFloat8E4M3)
    x = torch.randn(16, 32)
    made = tex.quantize(x, quantizer, None, None)
    assert isinstance(made, te.Float8Tensor) and torch.equal(made.dequantize(), quantizer(x).dequantize())
    tex.quantize(torch.zeros(16, 32), quantizer, made, torch.ones(1))  # noop flag set: left as it was
    assert torch.equal(made.dequantize(), quantizer(x).dequantize())
    tex.quantize(torch.zeros(16, 32), quantizer, made, None)
    assert made.dequantize().abs().sum() == 0

def test_tex_split_quantize_casts_each_section_with_its_quantizer():
    import transformer_engine_torch as tex
    quantizers = [te.Float8CurrentScalingQuantizer(DType.kFloat8E4M3), te.NVFP4Quantizer()]
    x = torch.randn(48, 32)
    parts = tex.split_quantize(x, [16, 32], quantizers)
    assert [type(p) for p in parts] == [te.Float8Tensor, te.NVFP4Tensor]
    for part, rows, quantizer in zip(parts, (x[:16], x[16:]), quantizers):
        assert torch.equal(part.dequantize(), quantizer(rows).dequantize())
    with pytest.raises(ValueError, match="split_sections"):
        tex.split_quantize(x, [16, 16], quantizers)
    with pytest.raises(ValueError, match="2 quantizers"):
        tex.multi_tensor_quantize([x], quantizers)



@pytest.mark.parametrize("kind", QUANTIZERS)
def test_row_gathers_stay_quantized_where_the_blocks_allow(kind):
    """index_select of rows (TE's MoE permutation of an FP8 tensor) gathers the codes (and the
    scales of 1 x k blocks); 128 x 128 blocks cannot be cut by rows: plain values."""
    torch.manual_seed(2)
    base = QUANTIZERS[kind]()(torch.randn(64, 128))
    index = torch.tensor([5, 0, 63, 5, 17])
    gathered = base.index_select(0, index)
    expected = base.dequantize()[index]
    if kind == "block_2d":
        assert type(gathered) is torch.Tensor and torch.equal(gathered, expected)
        return
    assert type(gathered) is type(base) and torch.equal(gathered.dequantize(), expected)
    routing_map = torch.zeros(64, 4, dtype=torch.bool)
    routing_map[torch.arange(64), torch.arange(64) % 4] = True
    permuted, _ = te.moe_permute(base, routing_map)
    assert type(permuted) is type(base)
    torch.testing.assert_close(permuted.dequantize(), te.moe_permute(base.dequantize(), routing_map)[0], rtol=0,
                               atol=0)


@pytest.mark.parametrize("kind", QUANTIZERS)
def test_assigning_data_requantises_and_a_model_dtype_cast_keeps_fp8(kind):
    quantized = QUANTIZERS[kind]()(torch.rand(128, 128))
    values = torch.rand(128, 128)
    quantized.data = values
    assert type(quantized.data) is type(quantized)
    assert torch.equal(quantized.dequantize(), QUANTIZERS[kind]()(values).dequantize())
    with pytest.raises(ValueError, match=r"shape \(128, 128\)"):
        quantized.data = torch.rand(3, 3)
    with te.quantized_model_init(recipe=recipe.Float8CurrentScaling()):
        layer = te.Linear(16, 16)
    layer.to(torch.bfloat16)  # assigns .data in bf16: the weight stays FP8, its nominal dtype bf16
    assert isinstance(layer.weight, te.Float8Tensor) and layer.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("kind", VIEWED_QUANTIZERS)
def test_get_data_tensors_gives_the_stored_codes_on_every_alias(kind):
    """TE main's get_data_tensors(rowwise_data, columnwise_data): the row-wise and column-wise
    codes (Float8Tensor: _data and _transpose), the same objects through detach(), a Parameter and
    a subclass; one of them alone; neither refused."""
    quantized = VIEWED_QUANTIZERS[kind]()(torch.randn(64, 128))
    quantized.update_usage(columnwise_usage=True)
    rowwise, columnwise = quantized.get_data_tensors()
    names = ("_data", "_transpose") if kind == "per_tensor" else ("_rowwise_data", "_columnwise_data")
    assert rowwise is getattr(quantized, names[0]) and columnwise is getattr(quantized, names[1])
    assert rowwise.element_size() == columnwise.element_size() == 1
    assert quantized.get_data_tensors(columnwise_data=False) is rowwise
    assert quantized.get_data_tensors(rowwise_data=False) is columnwise
    quantized.__class__ = type(f"Derived{type(quantized).__name__}", (type(quantized),), {})
    for alias in (quantized.detach(), torch.nn.Parameter(quantized, requires_grad=False)):
        assert type(alias) is type(quantized)
        assert all(a is b for a, b in zip(alias.get_data_tensors(), (rowwise, columnwise)))
    with pytest.raises(ValueError, match="both False"):
        quantized.get_data_tensors(rowwise_data=False, columnwise_data=False)


def test_nvfp4_codes_can_be_dropped_and_replaced():
    """NVFP4Tensor._rowwise_data / _columnwise_data set to None drop the usage (CPU offloading)
    and keep the shape; set to codes of the held shape they replace them (the values follow);
    other codes, or codes for a usage not held, are refused with the sizes."""
    quantized = te.NVFP4Quantizer()(torch.randn(32, 64))
    rowwise = quantized._rowwise_data
    quantized._rowwise_data = torch.zeros_like(rowwise)
    assert torch.equal(quantized.dequantize()[:, :8], torch.zeros(32, 8))
    with pytest.raises(ValueError, match=r"uint8 \(32, 32\).*got torch.uint8 \(32, 31\)"):
        quantized._rowwise_data = rowwise[:, 1:]
    quantized._rowwise_data = None
    quantized._columnwise_data = None
    assert quantized.shape == (32, 64) and quantized._rowwise_data is None and quantized._columnwise_data is None
    with pytest.raises(RuntimeError, match="no rowwise usage is held"):
        quantized._rowwise_data = rowwise


def test_the_base_class_holds_no_data_and_refuses_every_op():
    """QuantizedTensor(shape, dtype), TE's base constructor: the shape and dtype, no codes; a
    view raises TE's NotImplementedError, and so does any other op, naming the tensor."""
    from transformer_engine.pytorch.quantized_tensor import QuantizedTensor
    base = QuantizedTensor((16, 8), torch.bfloat16)
    assert base.shape == (16, 8) and base.dtype == torch.bfloat16 and "no data" in repr(base)
    with pytest.raises(NotImplementedError, match="QuantizedTensor class does not support tensor views"):
        base.view(-1)
    with pytest.raises(NotImplementedError, match=r"shape \(16, 8\) holds no quantized data"):
        base + 1


@pytest.mark.parametrize("kind", ["mxfp8", "block_1d", "block_2d"])
def test_block_scaled_codes_can_be_replaced_by_tes_uint8_codes(kind):
    """_rowwise_data set to uint8 codes (TE's storage dtype) of the held shape: read as the held
    FP8 format, the values unchanged; another shape refused with both sizes; None drops them."""
    quantized = QUANTIZERS[kind]()(torch.randn(64, 128))
    values = quantized.dequantize()
    quantized._rowwise_data = quantized._rowwise_data.view(torch.uint8).clone()
    assert torch.equal(quantized.dequantize(), values)
    with pytest.raises(ValueError, match=r"_rowwise_data: codes must be one byte each, \(64, 128\): got torch.uint8 "
                                         r"\(3, 3\)"):
        quantized._rowwise_data = torch.zeros(3, 3, dtype=torch.uint8)
    codes = quantized._rowwise_data
    quantized._rowwise_data = None
    assert quantized._rowwise_data is None and quantized.shape == (64, 128)
    with pytest.raises(RuntimeError, match="_rowwise_data: that usage is not held"):
        quantized._rowwise_data = codes

"""What TE code imports below the modules: transformer_engine_torch (tex), general_gemm,
quantization's update helpers, the attention-backend query, module.base, _extra_state and
InferenceParams. Each is checked against plain PyTorch or the rule it implements."""
import pickle
from collections import OrderedDict

import pytest
import torch

import transformer_engine.pytorch as te
import transformer_engine_torch as tex
from transformer_engine.common import recipe
from transformer_engine.pytorch.constants import DType


def test_tex_is_importable_as_te_code_does_and_shares_the_dtype_enum():
    assert tex.DType is te.DType and tex.DType.kFloat8E4M3.to_torch() == torch.float8_e4m3fn
    assert tex.FP8FwdTensors.GEMM2_WEIGHT == 4 and tex.FP8BwdTensors.GRAD_OUTPUT2 == 2


@pytest.mark.parametrize("amax, expected", [(0.0, 1.0), (float("inf"), 1.0), (float("nan"), 1.0), (2.0, 448 / 2 / 2)])
def test_fused_amax_and_scale_update_after_reduction(amax, expected):
    history = torch.tensor([[0.5], [1.0]])
    scale = torch.ones(1)
    tex.fused_amax_and_scale_update_after_reduction(torch.tensor([amax]), [history], [scale], "most_recent",
                                                    DType.kFloat8E4M3, 1)
    torch.testing.assert_close(scale, torch.tensor([expected]))
    # Row 0 took the reduced amax, then the history rolled: it is the last row now, row 0 is 0.
    torch.testing.assert_close(history, torch.tensor([[0.0], [amax]]), equal_nan=True)


def test_amax_and_scale_update_matches_the_delayed_scaling_formula():
    from transformer_engine.pytorch.quantization import _amax_and_scale_update
    history, scale = torch.tensor([[3.0, 0.0], [5.0, 2.0]]), torch.ones(2)
    _amax_and_scale_update(history, scale, 448.0, recipe.DelayedScaling(margin=0, amax_compute_algo="max"))
    torch.testing.assert_close(scale, torch.tensor([448 / 5, 448 / 2]))
    torch.testing.assert_close(history, torch.tensor([[0.0, 0.0], [3.0, 0.0]]))


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("epsilon", [0.0, 100.0])
def test_multi_tensor_compute_scale_and_scale_inv(pow2, epsilon):
    amaxes = [torch.tensor([0.0, 3.0, 1e-30, float("inf")]), torch.rand(5)]
    scales = [torch.empty_like(a) for a in amaxes]
    inverses = [torch.empty_like(a) for a in amaxes]
    tex.multi_tensor_compute_scale_and_scale_inv(2048, torch.zeros(1, dtype=torch.int32), [amaxes, scales, inverses],
                                                 448.0, pow2, epsilon)
    for amax, scale, inverse in zip(amaxes, scales, inverses):
        bounded = amax.double().clamp_min(epsilon)
        expected = (448.0 / bounded).clamp_max(torch.finfo(torch.float32).max).float()
        if pow2:
            expected = torch.exp2(torch.floor(torch.log2(expected)))
        expected = torch.where(bounded == 0, 1.0, expected)
        torch.testing.assert_close(scale, expected, rtol=0, atol=0)
        torch.testing.assert_close(inverse, 1 / scale, rtol=0, atol=0)


def test_multi_tensor_unscale_l2norm():
    tensors = [torch.randn(100, dtype=torch.bfloat16), torch.randn(7, 3)]
    norm, per_tensor = tex.multi_tensor_unscale_l2norm(2048, torch.zeros(1, dtype=torch.int32), [tensors],
                                                       torch.tensor([0.5]), True)
    expected = [(t.double() * 0.5).norm() for t in tensors]
    torch.testing.assert_close(per_tensor.double(), torch.stack(expected), rtol=1e-6, atol=0)
    torch.testing.assert_close(norm.double(), torch.stack(expected).norm().reshape(1), rtol=1e-6, atol=0)


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_general_gemm_layouts_in_high_precision(layout, dtype):
    from transformer_engine.pytorch.cpp_extensions import general_gemm
    torch.manual_seed(3)
    m, n, k = 5, 6, 7
    A = {"TN": torch.randn(n, k), "NN": torch.randn(n, k), "NT": torch.randn(m, k)}[layout].to(dtype)
    B = {"TN": torch.randn(m, k), "NN": torch.randn(m, n), "NT": torch.randn(m, n)}[layout].to(dtype)
    a, b = A.double(), B.double()
    expected = {"TN": lambda: b @ a.t(), "NN": lambda: b @ a, "NT": lambda: b.t() @ a}[layout]()
    out, bias_grad, gelu_input, _ = general_gemm(A, B, layout=layout)
    assert out.dtype == dtype and bias_grad is None and gelu_input is None
    torch.testing.assert_close(out.double(), expected, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5,
                               atol=1e-2 if dtype == torch.bfloat16 else 1e-5)


def test_general_gemm_of_fp8_operands_multiplies_the_codes_once_scaled():
    from transformer_engine.pytorch.cpp_extensions import general_gemm
    torch.manual_seed(4)
    quantizer = te.Float8CurrentScalingQuantizer(DType.kFloat8E4M3)
    w8, x8 = quantizer(torch.randn(16, 32)), quantizer(torch.randn(8, 32))
    bias = torch.randn(16)
    out, _, _, _ = general_gemm(w8, x8, torch.float32, bias=bias)
    expected = x8.dequantize().double() @ w8.dequantize().double().t() + bias.double()
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-5)
    dgrad, _, _, _ = general_gemm(w8, quantizer(torch.randn(8, 16)), torch.float32, layout="NN")
    assert dgrad.shape == (8, 32)


def test_general_gemm_accumulates_and_refuses_bad_layouts():
    from transformer_engine.pytorch.cpp_extensions import general_gemm
    A, B, out = torch.randn(4, 3), torch.randn(2, 3), torch.ones(2, 4)
    general_gemm(A, B, accumulate=True, out=out)
    torch.testing.assert_close(out, B @ A.t() + 1)
    torch.testing.assert_close(general_gemm(A, B.t(), layout="TT")[0], B @ A.t())  # op(B) @ op(A)
    with pytest.raises(ValueError, match="layout"):
        general_gemm(A, B, layout="XY")


def test_attention_backend_query_answers_unfused():
    from transformer_engine.pytorch.attention.dot_product_attention.utils import (AttentionParams,
                                                                                  check_set_window_size,
                                                                                  get_attention_backend)
    flash, _, fused, _, unfused, available = get_attention_backend(AttentionParams())
    assert (flash, fused, unfused, available) == (False, False, True, [False, False, True])
    assert check_set_window_size("causal") == (-1, 0) and check_set_window_size("no_mask") == (-1, -1)


def test_module_base_dummy_wgrad_is_shared_and_zeroed_on_request():
    from transformer_engine.pytorch.module.base import get_dummy_wgrad
    first = get_dummy_wgrad([3, 4], torch.float32)
    first.fill_(7)
    again = get_dummy_wgrad([3, 4], torch.float32, zero=True)
    assert again is first and not again.any()


def _pickled_recipe_state(recipe_name, *keys):
    """Pickle bytes (protocol 0, written by hand) of {'recipe': <TE recipe_name>(), key: 0.0, ...},
    as a TE checkpoint's _extra_state holds them; the classes need not exist to classify them."""
    payload = b"(dVrecipe\nctransformer_engine.common.recipe\n" + recipe_name.encode() + b"\n)Rs"
    for key in keys:
        payload += b"V" + key.encode() + b"\nF0.0\ns"
    return payload + b"."


def test_extra_state_pickles_are_classified_without_being_loaded():
    from transformer_engine.pytorch._extra_state import should_load_extra_state_pickle
    assert should_load_extra_state_pickle(b"", "layer") is False
    assert should_load_extra_state_pickle(pickle.dumps({}), "layer") is False
    assert should_load_extra_state_pickle(_pickled_recipe_state("Float8CurrentScaling"), "layer") is False
    with pytest.raises(RuntimeError, match="layer.*never unpickles"):
        should_load_extra_state_pickle(_pickled_recipe_state("DelayedScaling", "scale_fwd"), "layer")
    with pytest.raises(RuntimeError, match="never unpickles"):
        should_load_extra_state_pickle(b"\x80\x04not a pickle", "layer")


def test_inference_params_caches_each_sequence_across_steps():
    """TE's step(): the cache is bshd whatever the input format, row i holds the step's i-th
    sequence (rows move when the batch changes), cu_seqlens count the new and all tokens."""
    params = te.InferenceParams(max_batch_size=3, max_sequence_length=6, num_heads_kv=1, head_dim_k=2,
                                dtype=torch.float32)
    params.pre_step(OrderedDict({10: 3, 11: 1}))
    k1 = torch.arange(12.).reshape(2, 3, 1, 2)  # bshd; sequence 11 has one new token, then padding
    keys, values, cu_q, cu_kv, max_kv, layout = params.step(1, k1, -k1, "bshd")
    assert keys.shape == (2, 6, 1, 2) and max_kv == 6 and layout == "bshd"
    assert cu_q.tolist() == [0, 3, 4, 4] and cu_kv.tolist() == [0, 3, 4, 4]
    params.pre_step(OrderedDict({11: 2, 12: 1}))  # 10 finished; 11 moves to row 0; 12 joins
    assert params.get_seqlens_pre_step().tolist() == [1, 0, 0]
    k2 = torch.full((2, 2, 1, 2), 9.0).transpose(0, 1)  # sbhd [s, b, h, d]
    keys, values, cu_q, cu_kv, _, layout = params.step(1, k2, -k2, "sbhd")
    assert layout == "sbhd_2bshd" and cu_q.tolist() == [0, 2, 3, 3] and cu_kv.tolist() == [0, 3, 4, 4]
    torch.testing.assert_close(keys[0, :3], torch.cat([k1[1, :1], k2[:, 0]]))
    torch.testing.assert_close(values[1, :1], -k2[:1, 1])
    assert params.sequences == OrderedDict({11: 3, 12: 1})
    with pytest.raises(ValueError, match="max_sequence_length"):
        params.pre_step(OrderedDict({11: 4}))
    with pytest.raises(ValueError, match="holds 1 sequences, the step .pre_step. has 2"):
        params.step(1, k1[:1], k1[:1], "bshd")
    with pytest.raises(NotImplementedError, match="custom KV cache"):
        te.InferenceParams(2, 6, 1, 2, torch.float32, custom_cache_manager=object)
    with pytest.raises(ValueError, match="num_heads_kv, head_dim_k, dtype"):
        te.InferenceParams(2, 6)
    with pytest.raises(ValueError, match="max_ctx_len"):
        te.InferenceParams(2, 6, 1, 2, torch.float32, qkv_format="thd")


@pytest.mark.parametrize("shape", [(8,), (12, 3)])
def test_glu_tensor_interleaving_is_te_ops_layout_and_inverts(shape):
    """interleave_glu_tensor turns [W; V] into the blocks te.ops' glu_interleave_size reads:
    SwiGLU of the interleaved input equals SwiGLU of the contiguous one."""
    t = torch.randn(shape)
    blocked = te.interleave_glu_tensor(t, 2)
    assert torch.equal(te.deinterleave_glu_tensor(blocked, 2), t)
    w, v = t.chunk(2)
    assert torch.equal(blocked[:2], w[:2]) and torch.equal(blocked[2:4], v[:2])
    x = torch.randn(5, shape[0])  # the gated activation's input: [tokens, 2n] along its last dim
    plain = te.ops.SwiGLU()(x)
    interleaved = te.ops.SwiGLU(glu_interleave_size=2)(te.interleave_glu_tensor(x.t(), 2).t())
    assert torch.equal(plain, interleaved)
    with pytest.raises(ValueError, match="multiple of 2 \\* interleave_size"):
        te.interleave_glu_tensor(torch.randn(6), 2)


def test_te_top_level_helpers():
    assert te.torch_version() == tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:3])
    assert te.CudaRNGStatesTracker is te.distributed.CudaRNGStatesTracker
    q = te.Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, device="cpu")(torch.randn(4, 4))
    assert isinstance(q, te.Float8TensorStorage) and isinstance(q, te.QuantizedTensorStorage)
    assert not isinstance(q, te.MXFP8TensorStorage)
    if torch.backends.cudnn.is_available() and torch.backends.cudnn.version() is not None:
        assert len(te.get_cudnn_version()) == 3
    else:
        with pytest.raises(RuntimeError, match="cuDNN is not available"):
            te.get_cudnn_version()


def test_fp8_te_dtype_names_the_recipe_formats_dtype():
    from transformer_engine.pytorch.quantization import get_fp8_te_dtype
    hybrid = recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID)
    assert get_fp8_te_dtype(hybrid, fprop_tensor=True) == DType.kFloat8E4M3
    assert get_fp8_te_dtype(hybrid, fprop_tensor=False) == DType.kFloat8E5M2
    e4m3 = recipe.DelayedScaling(fp8_format=recipe.Format.E4M3)
    assert get_fp8_te_dtype(e4m3, fprop_tensor=False) == DType.kFloat8E4M3


def test_quantized_tensor_module_saves_and_restores_in_order():
    from transformer_engine.pytorch import quantized_tensor as qt
    assert qt.Quantizer is te.Quantizer and qt.QuantizedTensorStorage is te.QuantizedTensorStorage
    weight = te.Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, device="cpu")(torch.randn(4, 4))
    plain = torch.randn(3)

    class Saves(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            tensors, ctx.tensor_objects = qt.prepare_for_saving(x, None, w)
            ctx.save_for_backward(*tensors)
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            x, nothing, w = qt.restore_from_func_ctx(ctx)
            assert nothing is None and isinstance(w, te.QuantizedTensorStorage) and ctx.tensor_objects is None
            return grad * 2 + x, None

    x = plain.clone().requires_grad_()
    Saves.apply(x, weight).sum().backward()
    torch.testing.assert_close(x.grad, 2 + plain)
    restored, rest = qt.restore_from_saved([None], [plain, weight], return_saved_tensors=True)
    assert restored[0] is plain and rest[0] is weight
    with pytest.raises(TypeError, match="argument 1"):
        qt.prepare_for_saving(plain, [1])
    with pytest.raises(AttributeError, match="tensor_objects"):
        qt.restore_from_func_ctx(object())


def test_base_module_of_ones_own_keeps_fp8_state_per_gemm():
    from transformer_engine.pytorch.module.base import TransformerEngineBaseModule

    class TwoGemms(TransformerEngineBaseModule):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            with self.prepare_forward_ctx(x, num_gemms=2) as x:
                assert x.is_contiguous()
                return x @ self.weight @ self.weight

    module = TwoGemms()
    module(torch.randn(4, 2).t())
    assert not module.fp8 and module.quantizers == {"scaling_fwd": [], "scaling_bwd": []}
    with te.autocast(recipe=recipe.DelayedScaling()):
        module(torch.randn(2, 4))
    assert module.fp8
    assert (len(module.quantizers["scaling_fwd"]), len(module.quantizers["scaling_bwd"])) == (6, 4)
    assert "_extra_state" in module.state_dict()
    with pytest.raises(ValueError, match="num_gemms"):
        with module.prepare_forward_ctx(torch.randn(2, 4), num_gemms=0):
            pass


def test_cudnn_fused_attention_functions_refuse_naming_dot_product_attention():
    from transformer_engine.pytorch.cpp_extensions.fused_attn import fused_attn_bwd, fused_attn_fwd
    for function in (fused_attn_fwd, fused_attn_bwd):
        with pytest.raises(NotImplementedError, match="DotProductAttention"):
            function(True, 128, 128)

"""Megatron-Core (installed by `make test`) drives this package as it drives NVIDIA's TE, on one
rank: its TE detection, its TE layer spec, and a GPT trained with that spec in fp32, bf16
(Float16Module) and FP8 (hybrid delayed scaling), against the same GPT built from Megatron's
local (non-TE) spec with the same weights.

Nothing in our package is patched. One thing in Megatron's local spec is: its attention takes
a scratch buffer from parallel_state's global memory buffer, which allocates on the CUDA
device; the fixture puts CPU buffers of the size used here in it first.
"""

import pytest
import torch

pytest.importorskip("megatron.core")

import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.extensions import transformer_engine as megatron_te  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_layer_local_spec,  # noqa: E402
                                                      get_gpt_layer_with_transformer_engine_spec)
from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: E402
from megatron.core.tensor_parallel import random as megatron_random  # noqa: E402
from megatron.core.transformer.module import Float16Module  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402
from megatron.core.utils import is_te_min_version  # noqa: E402

import transformer_engine.pytorch as te  # noqa: E402
from megatron_tp_ranks import gpt_batch  # noqa: E402

VOCAB, SEQ, BATCH, HIDDEN, HEADS = 128, 32, 2, 64, 4
# Megatron's own deprecation notices (tp_group defaults, GPTModel, fp8_autocast calls) on every build.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:megatron.*", "ignore::UserWarning:megatron.*")
# Megatron's local spec keeps these norms apart; the TE spec fuses them into the next GEMM.
TE_NAMES = {"input_layernorm": "self_attention.linear_qkv.layer_norm_",
            "pre_mlp_layernorm": "mlp.linear_fc1.layer_norm_"}


@pytest.fixture(scope="module")
def megatron_world():
    """A gloo process group of one rank with Megatron's model-parallel state and TE's RNG
    tracker (a CPU generator here)."""
    if dist.is_initialized():
        pytest.skip("another test left a process group initialised")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    megatron_random.model_parallel_cuda_manual_seed(1234, te_rng_tracker=True, force_reset_rng=True)
    for dtype in (torch.float32, torch.bfloat16):  # see the module docstring
        parallel_state.get_global_memory_buffer().buffer[("mpu", dtype)] = torch.empty(BATCH * HEADS * SEQ * SEQ,
                                                                                       dtype=dtype)
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def test_megatron_takes_its_transformer_engine_paths(megatron_world):
    assert megatron_te.HAVE_TE and megatron_random.HAVE_TE
    assert is_te_min_version("2.8.0")
    assert megatron_te.fused_topk_with_score_function is not None  # TE >= 2.7: the router
    tracker = megatron_random.get_cuda_rng_tracker()
    assert isinstance(tracker, megatron_te.TECudaRNGStatesTracker)
    assert isinstance(tracker, te.distributed.CudaRNGStatesTracker) and tracker.is_initialized()


def test_te_rng_tracker_streams_are_reproducible_and_leave_the_default_stream(megatron_world):
    tracker = megatron_random.get_cuda_rng_tracker()
    states = tracker.get_states()
    before = torch.get_rng_state()
    with tracker.fork():
        first = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before)
    tracker.set_states(states)
    with tracker.fork():
        assert torch.equal(torch.rand(4), first)
    with tracker.fork(megatron_random.get_data_parallel_rng_tracker_name()):
        assert not torch.equal(torch.rand(4), first)


def _config(precision: str) -> TransformerConfig:
    options = dict(num_layers=2, hidden_size=HIDDEN, num_attention_heads=HEADS, use_cpu_initialization=True,
                   hidden_dropout=0.0, attention_dropout=0.0)
    if precision == "bf16":
        options.update(bf16=True, params_dtype=torch.bfloat16)
    if precision == "fp8":
        options.update(fp8="hybrid", fp8_recipe="delayed", fp8_amax_history_len=16, fp8_amax_compute_algo="max")
    if precision == "fp8_params":  # weights kept in FP8 (te.quantized_model_init), MXFP8 GEMMs
        options.update(fp8="e4m3", fp8_recipe="mxfp8", fp8_param=True)
    return TransformerConfig(**options)


def _gpt(spec, precision: str) -> torch.nn.Module:
    config = _config(precision)
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ)
    return Float16Module(config, model) if precision == "bf16" else model


def _copy_local_weights(local: torch.nn.Module, te_model: torch.nn.Module) -> None:
    """te_model's parameters := local's, by name (the norms under their fused names)."""
    targets = dict(te_model.named_parameters())
    with torch.no_grad():
        for name, param in local.named_parameters():
            for local_name, te_name in TE_NAMES.items():
                prefix, found, last = name.rpartition(f".{local_name}.")
                if found:
                    name = f"{prefix}.{te_name}{last}"
            targets.pop(name).copy_(param)
    assert not targets, f"TE parameters without a local counterpart: {sorted(targets)}"


def _losses(model: torch.nn.Module, steps: int, first_microbatch: bool) -> list:
    tokens, position_ids, causal_mask = gpt_batch(7, VOCAB, SEQ, BATCH)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        if first_microbatch:
            model.module.set_is_first_microbatch() if isinstance(model, Float16Module) \
                else model.set_is_first_microbatch()
        loss = model(tokens, position_ids, causal_mask, labels=tokens).float().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


# Largest per-step loss difference allowed against the local spec. fp32: the same arithmetic
# up to summation order; bf16: both models round activations to bf16, in different places
# (TE fuses the norm into the GEMM); FP8: E4M3/E5M2 GEMM operands against fp32, about 1% of the
# loss (~4.8). Measured: 4.8e-7, 7.5e-4, 2.1e-2, and 2.5e-2 with FP8 weights.
TOLERANCE = {"fp32": 1e-5, "bf16": 4e-3, "fp8": 5e-2, "fp8_params": 5e-2}


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp8", "fp8_params"])
def test_gpt_with_the_te_spec_trains_as_the_local_spec(megatron_world, precision, cpu_tier, cpu_gemm):
    """On every SIMD tier of this CPU, with the CPU's GEMMs in bf16 (machines with bf16 units)
    and in fp32."""
    torch.manual_seed(0)
    local = _gpt(get_gpt_layer_local_spec(), "bf16" if precision == "bf16" else "fp32")
    te_model = _gpt(get_gpt_layer_with_transformer_engine_spec(), precision)
    _copy_local_weights(local, te_model)
    assert "TERowParallelLinear" in repr(te_model)  # extra_repr reads the modules' tp_size

    steps = 5
    expected = _losses(local, steps, first_microbatch=False)
    got = _losses(te_model, steps, first_microbatch=True)

    assert expected[-1] < expected[0]  # it learns
    assert max(abs(a - b) for a, b in zip(expected, got)) < TOLERANCE[precision], (expected, got)
    gemms = [m for m in te_model.modules() if isinstance(m, te.Linear)]
    assert len(gemms) == 4 * _config(precision).num_layers
    for gemm in gemms:  # FP8 ran exactly where asked for
        assert (gemm.fp8_meta is not None) == precision.startswith("fp8"), gemm
        assert isinstance(gemm.weight, te.QuantizedTensor) == (precision == "fp8_params"), gemm
        if precision == "fp8":  # delayed scaling recorded amaxes
            assert bool(gemm.fp8_meta["scaling_fwd"].amax_history.abs().sum() > 0), gemm


def _losses_and_grads(model: torch.nn.Module, steps: int) -> list:
    """Per step: the loss and every parameter's gradient (plain SGD between steps)."""
    tokens, position_ids, causal_mask = gpt_batch(11, VOCAB, SEQ, BATCH)
    results = []
    for _ in range(steps):
        model.set_is_first_microbatch()
        loss = model(tokens, position_ids, causal_mask, labels=tokens).mean()
        loss.backward()
        results.append((loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}))
        with torch.no_grad():
            for param in model.parameters():
                param -= 0.1 * param.grad
                param.grad = None
    return results


RECOMPUTE = {"full": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
             "mlp": dict(recompute_granularity="selective", recompute_modules=["mlp"])}


@pytest.mark.parametrize("recompute", sorted(RECOMPUTE))
@pytest.mark.parametrize("fp8_recipe", ["delayed", "tensorwise", "mxfp8"])
def test_gpt_recompute_under_fp8_is_bit_identical(megatron_world, fp8_recipe, recompute):
    """Recompute under FP8 goes through te.checkpoint (Megatron's te_checkpoint), whole layers
    ("full") or the MLP, whose row-parallel GEMM returns its bias parameter ("mlp"): the
    recomputed forwards cast with the scales of the original ones, so losses and gradients
    equal those without recompute, bit for bit."""
    def build(with_recompute: bool) -> torch.nn.Module:
        options = dict(num_layers=2, hidden_size=HIDDEN, num_attention_heads=HEADS, use_cpu_initialization=True,
                       hidden_dropout=0.0, attention_dropout=0.0, fp8="hybrid", fp8_recipe=fp8_recipe,
                       fp8_amax_history_len=4)
        if with_recompute:
            options.update(RECOMPUTE[recompute])
        return GPTModel(config=TransformerConfig(**options), transformer_layer_spec=get_gpt_layer_with_transformer_engine_spec(),
                        vocab_size=VOCAB, max_sequence_length=SEQ)

    torch.manual_seed(0)
    plain, recomputed = build(False), build(True)
    recomputed.load_state_dict(plain.state_dict())
    for (loss, grads), (loss_r, grads_r) in zip(_losses_and_grads(plain, 3), _losses_and_grads(recomputed, 3)):
        assert torch.equal(loss, loss_r)
        assert all(torch.equal(grads[name], grads_r[name]) for name in grads)


def test_megatron_te_wrappers_run_on_one_rank(megatron_world):
    """The wrappers outside the dense GPT spec: column-parallel and grouped (MoE expert) GEMMs,
    RMSNorm through TENorm. Each output is checked against its plain-PyTorch formula."""
    config = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=HEADS, use_cpu_initialization=True,
                               num_moe_experts=4, moe_grouped_gemm=True, normalization="RMSNorm")
    init = torch.nn.init.xavier_normal_
    x = torch.randn(8, HIDDEN, requires_grad=True)

    norm = megatron_te.TENorm(config, HIDDEN)
    assert isinstance(norm, te.RMSNorm)
    torch.testing.assert_close(norm(x), x * torch.rsqrt(x.square().mean(-1, keepdim=True) + config.layernorm_epsilon))

    column = megatron_te.TEColumnParallelLinear(HIDDEN, 2 * HIDDEN, config=config, init_method=init,
                                               gather_output=False, bias=True, skip_bias_add=False, is_expert=False)
    y, bias = column(x)
    assert bias is None
    torch.testing.assert_close(y, x @ column.weight.t() + column.bias)

    splits = [3, 0, 4, 1]
    for grouped in (megatron_te.TEColumnParallelGroupedLinear(4, HIDDEN, 2 * HIDDEN, config=config, init_method=init,
                                                              bias=False, skip_bias_add=False, is_expert=True),
                    megatron_te.TERowParallelGroupedLinear(4, HIDDEN, HIDDEN, config=config, init_method=init,
                                                           bias=False, skip_bias_add=False, is_expert=True)):
        y, _ = grouped(x, splits)
        expected = torch.cat([part @ getattr(grouped, f"weight{i}").t()
                              for i, part in enumerate(torch.split(x, splits))])
        torch.testing.assert_close(y, expected)
        y.sum().backward()
        assert all(getattr(grouped, f"weight{i}").grad is not None for i in range(4))


def test_megatron_optimizer_helpers_are_ours(megatron_world):
    """Megatron's gradient clipping and mixed-precision optimizer take TE's multi-tensor helpers
    when TE is there (instead of warning that neither TE nor apex is installed), and copy fp32
    main parameters into bf16 model parameters with them."""
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as megatron_optimizer
    assert clip_grads.l2_norm_impl is te.optimizers.multi_tensor_l2norm
    assert clip_grads.multi_tensor_scale_tensor_impl is te.optimizers.multi_tensor_scale_tensor
    assert megatron_optimizer.multi_tensor_scale_impl is te.optimizers.multi_tensor_scale

    main = [torch.randn(3, 5), torch.randn(7)]
    model = [torch.empty(3, 5, dtype=torch.bfloat16), torch.empty(7, dtype=torch.bfloat16)]
    overflow = torch.ones(1, dtype=torch.int32)
    megatron_optimizer._multi_tensor_copy_this_to_that(main, model, overflow)
    assert all(torch.equal(m, p.to(torch.bfloat16)) for p, m in zip(main, model)) and overflow.item() == 0


def test_fused_residual_rmsnorm_runs_on_te_ops():
    """Megatron's TEFusedResidualRMSNorm builds te.ops.Sequential(MakeExtraOutput(), RMSNorm())
    sharing its weight: (the RMSNorm of x, x itself), with the weight's gradient."""
    torch.manual_seed(0)
    norm = megatron_te.TEFusedResidualRMSNorm(hidden_size=64, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 2, 64, requires_grad=True)
    y, residual = norm(x)
    x64, w64 = x.detach().double().requires_grad_(), norm.weight.detach().double().requires_grad_()
    expected = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-5) * w64
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(residual, x)
    (y.sum() + residual.sum()).backward()
    (expected.sum() + x64.sum()).backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm.weight.grad.double(), w64.grad, rtol=1e-5, atol=1e-5)

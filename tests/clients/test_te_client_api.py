"""The TransformerEngine names that client frameworks (Megatron-Core, accelerate, Lightning) rely
on, tested on their own: the version and distribution metadata, FP8GlobalStateManager and the
check_*_support functions, recipes that ignore other keywords, the RNG tracker,
activation_recompute_forward (recompute done by the caller), the tensor-parallel attributes and
keywords of the modules, and save_original_input."""
import importlib.metadata

import pytest
import torch
from packaging.version import Version

import transformer_engine
import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.distributed import (CudaRNGStatesTracker, activation_recompute_forward,
                                                    get_all_rng_states, in_fp8_activation_recompute_phase,
                                                    is_fp8_activation_recompute_enabled)
from transformer_engine.pytorch.fp8 import FP8GlobalStateManager, check_fp8_support, check_mxfp8_support


def test_version_is_a_te_2x_level_in_package_and_metadata():
    version = Version(transformer_engine.__version__)
    assert version >= Version("2.8.0") and version.local is not None and version.local.startswith("portable")
    assert importlib.metadata.version("transformer-engine") == transformer_engine.__version__
    assert importlib.metadata.version("transformer_engine") == transformer_engine.__version__
    # Requirement checks ignore the local label (Lightning: "transformer_engine>=0.11.0").
    from packaging.specifiers import SpecifierSet
    assert version in SpecifierSet(">=0.11.0")


def test_te_2x_module_paths():
    from transformer_engine.pytorch import quantization
    from transformer_engine.pytorch.tensor import QuantizedTensor
    assert quantization.FP8GlobalStateManager is FP8GlobalStateManager
    assert QuantizedTensor is te.QuantizedTensor
    assert check_fp8_support() == (True, "") and check_mxfp8_support() == (True, "")


def test_global_state_manager_reads_the_autocast_regions():
    assert not FP8GlobalStateManager.is_fp8_enabled()
    assert isinstance(FP8GlobalStateManager.get_fp8_recipe(), recipe.DelayedScaling)  # the default
    mxfp8 = recipe.MXFP8BlockScaling()
    with te.autocast(recipe=mxfp8):
        assert FP8GlobalStateManager.is_fp8_enabled() and not FP8GlobalStateManager.is_fp8_calibration()
        assert FP8GlobalStateManager.get_fp8_recipe() is mxfp8
        assert FP8GlobalStateManager.get_fp8_group() is None
        assert FP8GlobalStateManager.is_first_fp8_module()
        assert not FP8GlobalStateManager.is_first_fp8_module()  # only the first caller
        with te.autocast(enabled=False):
            assert not FP8GlobalStateManager.is_fp8_enabled()
        state = FP8GlobalStateManager.get_autocast_state()
    assert not FP8GlobalStateManager.is_fp8_enabled()
    FP8GlobalStateManager.set_autocast_state(state)
    assert FP8GlobalStateManager.get_fp8_recipe() is mxfp8
    FP8GlobalStateManager.reset()
    assert not FP8GlobalStateManager.is_fp8_enabled()
    with pytest.raises(ValueError, match="what get_autocast_state"):
        FP8GlobalStateManager.set_autocast_state((True, False, mxfp8))  # TE's tuple layout is not ours
    with te.autocast(enabled=False, calibrating=True):
        assert FP8GlobalStateManager.is_fp8_calibration() and not FP8GlobalStateManager.is_first_fp8_module()
    with te.quantized_model_init(recipe=recipe.Float8CurrentScaling()):
        assert FP8GlobalStateManager.with_fp8_parameters()
    assert not FP8GlobalStateManager.with_fp8_parameters()
    assert FP8GlobalStateManager.get_meta_tensor_key(forward=False) == "scaling_bwd"


def test_recipes_ignore_keywords_they_do_not_use_and_still_check_theirs():
    megatron_style = recipe.DelayedScaling(margin=0, fp8_format=recipe.Format.HYBRID, amax_history_len=16,
                                           override_linear_precision=(False, False, True), interval=1,
                                           params_dtype=torch.bfloat16, device="cpu")
    assert megatron_style == recipe.DelayedScaling(amax_history_len=16)
    assert recipe.MXFP8BlockScaling(margin=0, interval=1) == recipe.MXFP8BlockScaling()
    assert recipe.Float8CurrentScaling(override_linear_precision=None).fp8_format is recipe.Format.HYBRID
    assert recipe.Float8BlockScaling(params_dtype=torch.float32).w_block_scaling_dim == 2
    with pytest.raises(ValueError, match="amax_history_len"):
        recipe.DelayedScaling(amax_history_len=0, device="cpu")


def test_rng_tracker_on_the_cpu():
    tracker = CudaRNGStatesTracker()
    assert tracker.device == te.default_device()
    tracker.add("model-parallel-rng", 11)
    tracker.add("other", 12)
    assert get_all_rng_states() is tracker.states_
    with pytest.raises(RuntimeError, match="seed 11"):
        tracker.add("third", 11)
    with pytest.raises(RuntimeError, match="'other' already exists"):
        tracker.add("other", 13)
    with pytest.raises(KeyError, match="'missing' is not added"):
        with tracker.fork("missing"):
            pass
    outside = torch.get_rng_state()
    saved = tracker.get_states()
    with tracker.fork():
        first = torch.rand(3)
        assert torch.equal(first, torch.rand(3, generator=torch.Generator().manual_seed(11)))
    with tracker.fork():
        assert not torch.equal(torch.rand(3), first)  # the stream moved on
    assert torch.equal(torch.get_rng_state(), outside)  # the default stream did not
    tracker.set_states(saved)
    with tracker.fork():
        assert torch.equal(torch.rand(3), first)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(te.Linear(32, 48), torch.nn.GELU(), te.Linear(48, 32))


def _fp8_state(model):
    return [{k: v.clone() for k, v in m.fp8_meta.extra_state().items() if torch.is_tensor(v)}
            for m in model if getattr(m, "fp8_meta", None) is not None]


@pytest.mark.parametrize("rec", [recipe.DelayedScaling(amax_history_len=4), recipe.Float8CurrentScaling(),
                                 recipe.MXFP8BlockScaling()], ids=["delayed", "current", "mxfp8"])
def test_activation_recompute_forward_replays_two_microbatches_exactly(rec):
    """Megatron's output-discarding recompute: forwards without grad under the first phase,
    the delayed-scaling update in between, then each forward recomputed (oldest first) under
    the second phase and differentiated. Outputs, gradients and the FP8 state afterwards are
    those of the same microbatches run without recompute."""
    inputs = [torch.randn(16, 32, generator=torch.Generator().manual_seed(i)) for i in range(2)]

    reference = _mlp()
    outputs, grads = [], []
    for x in inputs:  # forwards first, as a pipeline schedule runs them
        with te.autocast(recipe=rec):
            outputs.append(reference(x))
    for y in outputs:
        y.square().sum().backward()
        grads.append([p.grad.clone() for p in reference.parameters()])
        reference.zero_grad()

    model = _mlp()
    discarded = []
    for x in inputs:
        with te.autocast(recipe=rec), torch.no_grad(), activation_recompute_forward(True, recompute_phase=False):
            assert is_fp8_activation_recompute_enabled() and not in_fp8_activation_recompute_phase()
            discarded.append(model(x))
    for i, x in enumerate(inputs):
        with te.autocast(recipe=rec), activation_recompute_forward(True, recompute_phase=True):
            assert in_fp8_activation_recompute_phase()
            y = model(x)
        assert torch.equal(y, discarded[i]) and torch.equal(y, outputs[i].detach())
        y.square().sum().backward()
        for got, want in zip((p.grad for p in model.parameters()), grads[i]):
            assert torch.equal(got, want)
        model.zero_grad()
    assert not is_fp8_activation_recompute_enabled()
    for got, want in zip(_fp8_state(model), _fp8_state(reference)):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


def test_activation_recompute_forward_off_changes_nothing():
    x = torch.randn(4, 32)
    results = []
    for wrap in (False, True):
        model = _mlp()
        with te.autocast(recipe=recipe.DelayedScaling()):
            with activation_recompute_forward() if wrap else torch.enable_grad():
                assert not is_fp8_activation_recompute_enabled()
                results.append((model(x).detach(), _fp8_state(model)))
    (y1, state1), (y2, state2) = results
    assert torch.equal(y1, y2)
    for got, want in zip(state2, state1):
        assert all(torch.equal(got[k], want[k]) for k in got)


def test_module_tensor_parallel_keywords_and_attributes_on_one_rank():
    tracker = CudaRNGStatesTracker(device="cpu")
    tracker.add("model-parallel-rng", 5)
    tracker.add("expert-parallel-rng", 6)
    outside = torch.get_rng_state()
    linear = te.Linear(16, 8, parallel_mode="row", tp_size=1, get_rng_state_tracker=lambda: tracker,
                       rng_tracker_name="expert-parallel-rng", ub_overlap_rs=False, ub_name="proj",
                       symmetric_ar_type=None, name="proj")
    assert torch.equal(torch.get_rng_state(), outside)  # initialised from the tracker's stream
    expected = torch.empty(8, 16)
    torch.nn.init.normal_(expected, std=0.023, generator=torch.Generator().manual_seed(6))
    assert torch.equal(linear.weight.detach(), expected)
    assert (linear.tp_size, linear.parallel_mode, linear.tp_group, linear.name) == (1, "row", None, "proj")
    linear.set_tensor_parallel_group(None)
    fused = te.LayerNormLinear(16, 8, parallel_mode="column", get_rng_state_tracker=lambda: tracker, ub_name="qkv",
                               normalization="RMSNorm")
    assert (fused.tp_size, fused.parallel_mode) == (1, "column")
    mlp_tracker = CudaRNGStatesTracker(device="cpu")
    mlp_tracker.add("model-parallel-rng", 21)
    mlp = te.LayerNormMLP(16, 32, get_rng_state_tracker=lambda: mlp_tracker, tp_group=None, ub_overlap_ag=False)
    mlp.set_tensor_parallel_group(None)
    assert mlp.tp_size == 1
    stream = torch.Generator().manual_seed(21)  # fc1 then fc2, from the tracker's default stream
    for weight in (mlp.fc1_weight, mlp.fc2_weight):
        expected = torch.empty(weight.shape)
        torch.nn.init.normal_(expected, std=0.023, generator=stream)
        assert torch.equal(weight.detach(), expected)
    grouped = te.GroupedLinear(2, 16, 8, parallel_mode="column")
    grouped.set_tensor_parallel_group(None)
    assert te.Linear(16, 8, tp_size=2, parallel_mode="row").weight.shape == (8, 8)  # in_features split
    with pytest.raises(ValueError, match="parallel_mode"):
        te.Linear(16, 8, parallel_mode="diagonal")


@pytest.mark.parametrize("rec", [recipe.Float8CurrentScaling(), recipe.Float8BlockScaling(),
                                 recipe.MXFP8BlockScaling()], ids=["current", "block", "mxfp8"])
def test_save_original_input_gives_the_same_numbers(rec):
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(3))
    results = []
    for save_original_input in (False, True):
        torch.manual_seed(0)
        linear = te.Linear(64, 32, save_original_input=save_original_input)
        inp = x.clone().requires_grad_()
        with te.autocast(recipe=rec):
            y = linear(inp)
        y.square().sum().backward()
        results.append((y.detach(), inp.grad, linear.weight.grad, linear.bias.grad))
    for got, want in zip(*results):
        assert torch.equal(got, want)


def test_save_original_input_refuses_delayed_scaling():
    linear = te.Linear(16, 16, save_original_input=True)
    with pytest.raises(ValueError, match="save_original_input=True does not work with the DelayedScaling"):
        with te.autocast(recipe=recipe.DelayedScaling()):
            linear(torch.randn(4, 16))


@pytest.mark.parametrize("rec", [recipe.MXFP8BlockScaling(), recipe.Float8BlockScaling(), recipe.DelayedScaling()],
                         ids=["mxfp8", "block", "delayed"])
def test_weight_cache_made_without_grad_serves_a_later_backward(rec):
    """A reentrant checkpoint runs the first microbatch's forward under no_grad, then its
    recompute with is_first_microbatch=False: the weight cast without a backward layout is
    cast again rather than reused, for te.Linear and te.GroupedLinear alike."""
    x = torch.randn(32, 64)
    for module, call in ((te.Linear(64, 32), lambda m, **kw: m(x, **kw)),
                         (te.GroupedLinear(2, 64, 32), lambda m, **kw: m(x, [16, 16], **kw))):
        with te.autocast(recipe=rec):
            with torch.no_grad():
                expected = call(module, is_first_microbatch=True)
            y = call(module, is_first_microbatch=False)
        assert torch.equal(y.detach(), expected)
        y.sum().backward()
        assert module.weight0.grad is not None if isinstance(module, te.GroupedLinear) else module.weight.grad is not None


def test_importing_the_top_level_package_gives_the_pytorch_api():
    """As NVIDIA's package: `import transformer_engine as te` then te.pytorch.* and te.common.recipe.*
    (Megatron-Core's spelling), in a fresh interpreter."""
    import subprocess
    import sys
    code = ("import transformer_engine as te; te.pytorch.Linear(16, 16, device='cpu'); "
            "te.common.recipe.DelayedScaling(); print(te.__version__)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == transformer_engine.__version__


@pytest.mark.parametrize("make", [lambda: te.Linear(16, 8, device="meta"),
                                  lambda: te.LayerNormLinear(16, 8, device="meta"),
                                  lambda: te.LayerNormMLP(16, 32, device="meta"),
                                  lambda: te.GroupedLinear(2, 16, 8, device="meta"),
                                  lambda: te.LayerNorm(16, device="meta"), lambda: te.RMSNorm(16, device="meta")])
def test_reset_parameters_materialises_deferred_modules(make):
    """device="meta" defers initialisation (FSDP); reset_parameters() then puts the parameters
    on the current device and initialises them, as TE's modules do."""
    module = make()
    assert all(p.device.type == "meta" for p in module.parameters())
    module.reset_parameters()
    params = dict(module.named_parameters())
    assert all(p.device == te.default_device() for p in params.values())
    weights = [p for name, p in params.items() if "weight" in name]
    assert weights and all(torch.isfinite(w).all() for w in weights)
    out = module(torch.randn(4, 16), [2, 2]) if isinstance(module, te.GroupedLinear) else module(torch.randn(4, 16))
    assert torch.isfinite(out).all()

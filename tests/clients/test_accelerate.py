"""Hugging Face accelerate (installed by `make test`) finds this package as TransformerEngine and
drives it unchanged: its availability check, its convert_model, and Accelerator(
mixed_precision="fp8") with TE recipe handlers, on the CPU. Nothing in our package is patched."""
import pytest
import torch

accelerate = pytest.importorskip("accelerate")
from accelerate.state import AcceleratorState  # noqa: E402
from accelerate.utils import FP8RecipeKwargs, TERecipeKwargs, is_transformer_engine_available  # noqa: E402
from accelerate.utils import transformer_engine as accelerate_te  # noqa: E402

import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.common import recipe  # noqa: E402
from client_models import regression_batch, regression_losses, small_mlp  # noqa: E402

STEPS = 5




def _train(model: torch.nn.Module, accelerator) -> list:
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return regression_losses(model, optimizer, accelerator.backward, STEPS)


@pytest.fixture
def accelerator_factory():
    """Accelerator(cpu=True, ...) with accelerate's process-wide state reset around each."""
    def make(**options):
        AcceleratorState._reset_state(True)
        return accelerate.Accelerator(cpu=True, **options)
    yield make
    AcceleratorState._reset_state(True)


def test_accelerate_sees_transformer_engine():
    assert is_transformer_engine_available()
    assert accelerate.utils.is_fp8_available()
    from transformer_engine.pytorch.fp8 import check_fp8_support, check_mxfp8_support
    assert check_fp8_support() == (True, "") and check_mxfp8_support() == (True, "")


def test_convert_model_then_train(accelerator_factory):
    accelerator_factory()  # convert_model asks accelerate's state whether DeepSpeed shards the weights
    model = small_mlp()
    with torch.no_grad():
        accelerate_te.convert_model(model)
    assert [type(m) for m in model] == [te.Linear, te.LayerNorm, torch.nn.GELU, te.Linear]
    reference = small_mlp()
    x, y = regression_batch()
    torch.testing.assert_close(model(x), reference(x), rtol=1e-5, atol=1e-5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(STEPS):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


HANDLERS = {
    "default": (lambda: None, recipe.DelayedScaling),  # accelerate makes a TERecipeKwargs() itself
    "delayed": (lambda: TERecipeKwargs(amax_history_len=16), recipe.DelayedScaling),
    "mxfp8": (lambda: TERecipeKwargs(use_mxfp8_block_scaling=True), recipe.MXFP8BlockScaling),
    "legacy": (lambda: FP8RecipeKwargs(backend="TE", margin=1, interval=1), recipe.DelayedScaling),
}


@pytest.mark.filterwarnings("ignore:FP8RecipeKwargs is deprecated:FutureWarning")
@pytest.mark.parametrize("handler", sorted(HANDLERS))
def test_accelerator_fp8_tracks_the_same_model_without_fp8(accelerator_factory, handler, cpu_gemm):
    expected = _train(small_mlp(), accelerator_factory())
    make_handler, recipe_type = HANDLERS[handler]
    model = small_mlp()
    handler = make_handler()
    got = _train(model, accelerator_factory(mixed_precision="fp8", kwargs_handlers=[handler] if handler else None))

    gemms = [m for m in model.modules() if isinstance(m, te.Linear)]
    assert len(gemms) == 2
    for gemm in gemms:  # converted, and run in FP8 with the handler's recipe
        assert isinstance(gemm.fp8_meta.made_for, recipe_type)
    assert got[-1] < got[0]
    # E4M3 operands: each loss within 1% of the fp32 model's (measured: at most 0.26%).
    for a, b in zip(expected, got):
        assert abs(a - b) <= 0.01 * abs(a), (expected, got)


def test_accelerator_fp8_trains_a_hugging_face_model(accelerator_factory):
    """A tiny Llama through Accelerator(mixed_precision="fp8") with MXFP8: all its Linear layers
    (attention, MLP, LM head) become te.Linear and the loss tracks the model without FP8."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    input_ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(2))

    def losses(accelerator) -> list:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config)
        model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
        result = []
        for _ in range(3):
            loss = model(input_ids=input_ids, labels=input_ids).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            result.append(loss.item())
        return result, model

    expected, _ = losses(accelerator_factory())
    got, model = losses(accelerator_factory(mixed_precision="fp8",
                                            kwargs_handlers=[TERecipeKwargs(use_mxfp8_block_scaling=True)]))
    assert sum(isinstance(m, te.Linear) for m in model.modules()) == 2 * 7 + 1
    assert got[-1] < got[0]
    for a, b in zip(expected, got):  # measured: within 0.05%
        assert abs(a - b) <= 0.01 * abs(a), (expected, got)


def test_save_state_and_load_state_keep_the_fp8_state(accelerator_factory, tmp_path):
    """accelerator.save_state (safetensors) then load_state into a fresh FP8 model: weights and
    each GEMM's FP8 scales come back."""

    def prepared():
        accelerator = accelerator_factory(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs(amax_history_len=4)])
        model = small_mlp()
        model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        return accelerator, model, optimizer

    accelerator, trained, optimizer = prepared()
    regression_losses(trained, optimizer, accelerator.backward, STEPS)
    accelerator.save_state(tmp_path)
    accelerator, restored, _ = prepared()
    accelerator.load_state(tmp_path)
    for saved, loaded in ((trained[0], restored[0]), (trained[3], restored[3])):
        assert torch.equal(loaded.weight, saved.weight)
        for direction in ("scaling_fwd", "scaling_bwd"):
            assert torch.equal(loaded.fp8_meta[direction].scale, saved.fp8_meta[direction].scale)
            assert torch.equal(loaded.fp8_meta[direction].amax_history, saved.fp8_meta[direction].amax_history)

"""PyTorch Lightning (installed by `make test`) finds this package as TransformerEngine and drives
it unchanged through TransformerEnginePrecision: in Fabric (the plugin, and
precision="transformer-engine") and in a Trainer, with fp32 and bf16 weights, on the CPU.
Nothing in our package is patched."""
import pytest
import torch

L = pytest.importorskip("lightning")
from lightning.fabric.plugins.precision import TransformerEnginePrecision as FabricTEPrecision  # noqa: E402
from lightning.pytorch.plugins import TransformerEnginePrecision as TrainerTEPrecision  # noqa: E402

import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.common import recipe  # noqa: E402
from client_models import regression_batch, regression_losses, small_mlp  # noqa: E402

STEPS = 4
# Lightning opens a CUDA autocast for the ops TE does not cover, which warns on a CPU machine.
pytestmark = pytest.mark.filterwarnings("ignore:.*CUDA is not available.*", "ignore:.*does not have many workers.*")




def _assert_converted_and_ran_fp8(model: torch.nn.Module, weights_dtype: torch.dtype) -> None:
    gemms = [m for m in model.modules() if isinstance(m, te.Linear)]
    assert len(gemms) == 2 and any(isinstance(m, te.LayerNorm) for m in model.modules())
    for gemm in gemms:
        assert gemm.weight.dtype == weights_dtype
        assert isinstance(gemm.fp8_meta.made_for, recipe.DelayedScaling)
        # Lightning makes bf16 the default dtype inside the forward; the scaling state stays fp32.
        assert gemm.fp8_meta["scaling_fwd"].scale.dtype == torch.float32
        assert bool(gemm.fp8_meta["scaling_fwd"].amax_history.abs().sum() > 0)


def _fabric_losses(fabric) -> list:
    model = fabric.setup_module(small_mlp())  # before the optimizer: setup replaces the layers
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    return model, regression_losses(model, optimizer, fabric.backward, STEPS)


FABRIC_PRECISIONS = {
    "plugin-fp32": (lambda: dict(plugins=FabricTEPrecision(weights_dtype=torch.float32)), torch.float32),
    "plugin-bf16-recipe-dict": (lambda: dict(plugins=FabricTEPrecision(
        weights_dtype=torch.bfloat16, recipe={"fp8_format": "HYBRID", "amax_history_len": 16})), torch.bfloat16),
    "precision-string": (lambda: dict(precision="transformer-engine"), torch.bfloat16),
    "precision-string-fp16": (lambda: dict(precision="transformer-engine-float16"), torch.float16),
}


@pytest.mark.parametrize("name", sorted(FABRIC_PRECISIONS))
def test_fabric_transformer_engine_precision(name, cpu_gemm):
    options, weights_dtype = FABRIC_PRECISIONS[name]
    _, expected = _fabric_losses(L.Fabric(accelerator="cpu", devices=1))
    model, got = _fabric_losses(L.Fabric(accelerator="cpu", devices=1, **options()))
    _assert_converted_and_ran_fp8(model, weights_dtype)
    assert got[-1] < got[0]
    # FP8 GEMMs (and bf16 weights) against the fp32 model: within 2% (measured: at most 0.17%).
    for a, b in zip(expected, got):
        assert abs(a - b) <= 0.02 * abs(a), (expected, got)


class _Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = small_mlp()
        self.losses = []

    def training_step(self, batch, batch_index):
        loss = torch.nn.functional.mse_loss(self.net(batch[0]).float(), batch[1])
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


TRAINER_PRECISIONS = {
    "plugin-fp32": (lambda: dict(plugins=TrainerTEPrecision(weights_dtype=torch.float32)), torch.float32),
    "plugin-bf16": (lambda: dict(plugins=TrainerTEPrecision(weights_dtype=torch.bfloat16)), torch.bfloat16),
    "precision-string": (lambda: dict(precision="transformer-engine"), torch.bfloat16),
}


@pytest.mark.parametrize("name", sorted(TRAINER_PRECISIONS))
def test_trainer_transformer_engine_precision(name):
    options, weights_dtype = TRAINER_PRECISIONS[name]
    module = _Regression()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, **options())
    x, y = regression_batch()
    trainer.fit(module, torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64))
    _assert_converted_and_ran_fp8(module, weights_dtype)
    assert len(module.losses) == STEPS and module.losses[-1] < module.losses[0]


def test_fabric_init_module_builds_te_layers_directly():
    """replace_layers=True: inside fabric.init_module(), torch.nn.Linear / LayerNorm calls in
    the model's own code construct te.Linear / te.LayerNorm (with the torch layers' arguments)."""
    fabric = L.Fabric(accelerator="cpu", devices=1,
                      plugins=FabricTEPrecision(weights_dtype=torch.float32, replace_layers=True))
    with fabric.init_module():
        model = small_mlp()
    assert [type(m) for m in model] == [te.Linear, te.LayerNorm, torch.nn.GELU, te.Linear]
    model = fabric.setup_module(model)
    x, y = regression_batch()
    torch.nn.functional.mse_loss(model(x).float(), y).backward()
    _assert_converted_and_ran_fp8(model, torch.float32)


class _TERegression(_Regression):
    """Built from te layers directly, as a model meant for TE is (Lightning restores a
    checkpoint before the precision plugin would convert torch layers)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(te.Linear(32, 64), te.LayerNorm(64), torch.nn.GELU(), te.Linear(64, 16))


def test_trainer_checkpoint_keeps_the_fp8_state_and_resumes(tmp_path):
    """A Trainer checkpoint holds each GEMM's FP8 state as _extra_state, loads with
    torch.load(weights_only=True), and a resumed run starts from the saved scales."""
    def trainer(steps):
        return L.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         plugins=TrainerTEPrecision(weights_dtype=torch.bfloat16))

    def data():
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*regression_batch()), batch_size=64)

    first = _TERegression()
    run = trainer(STEPS)
    run.fit(first, data())
    path = tmp_path / "step.ckpt"
    run.save_checkpoint(path)
    state = torch.load(path, weights_only=True)["state_dict"]
    assert {"net.0._extra_state", "net.3._extra_state"} <= set(state)

    resumed = _TERegression()
    trainer(STEPS).fit(resumed, data(), ckpt_path=path)  # already at max_steps: restores, trains no more
    for saved, module in ((first.net[0], resumed.net[0]), (first.net[3], resumed.net[3])):
        assert torch.equal(module.fp8_meta["scaling_fwd"].scale, saved.fp8_meta["scaling_fwd"].scale)
        assert torch.equal(module.weight, saved.weight)

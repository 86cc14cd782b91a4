"""Train the small GPT of gpt_model.py for N steps per variant, from the same initial weights on
the same batches, and measure each variant's loss curve, held-out loss, speed and activation memory.

Variants:
    ours:      TeGPT in the high-precision dtype, te.optimizers.FusedAdam (fp32 master weights
               when the dtype is not fp32)
    ours_fp8:  the same, forward under te.autocast(recipe=DelayedScaling()): every GEMM in FP8
    eager:     PlainGPT in the same dtype, torch.optim.AdamW on its parameters
    compile:   torch.compile of PlainGPT's loss, torch.optim.AdamW
The high-precision dtype follows layer_cases.step_dtype: bf16 on accelerators and on CPUs with
bf16 matrix instructions, fp32 on other CPUs (where PyTorch's bf16 GEMM backward is very slow).
"""
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

from . import harness
from .gpt_data import Corpus, batches, load_corpus
from .gpt_model import GPTConfig, PlainGPT, te_gpt_from
from .layer_cases import step_dtype

VARIANTS = ("ours", "ours_fp8", "eager", "compile")
DEFAULT_VARIANTS = ("ours", "ours_fp8", "eager")
HIGH_PRECISION, FP8 = "ours", "ours_fp8"
BETAS = (0.9, 0.95)


@dataclass(frozen=True)
class TrainConfig:
    """steps: optimizer steps per variant; lr: peak learning rate, reached linearly over
    warmup steps and decayed on a cosine to lr / 10 at the last step; untimed: first steps
    left out of tokens/s (lazy initialisation, compilation); final_window: the final train loss
    is the mean of the last final_window steps' losses (one batch's loss is noisy);
    heldout_batches: batches of the held-out split averaged for the held-out loss."""
    model: GPTConfig = field(default_factory=GPTConfig)
    steps: int = 120
    lr: float = 3e-3
    warmup: int = 10
    seed: int = 0
    untimed: int = 5
    final_window: int = 10
    heldout_batches: int = 4

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"TrainConfig: steps must be >= 1, got {self.steps}")
        if not self.lr > 0:
            raise ValueError(f"TrainConfig: lr must be > 0, got {self.lr}")

    def lr_at(self, step: int) -> float:
        """Learning rate of step (0-based)."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - 1 - self.warmup)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


@dataclass
class VariantResult:
    """losses: train loss of every step; final_loss: mean of the last final_window of them;
    heldout_loss: mean loss over heldout_batches held-out batches after training; tokens_per_s:
    tokens per step over the median time of the timed steps (None when every step is untimed);
    saved_mb: activation memory of one forward + backward (harness.saved_bytes; None for
    compile, whose graph the saved-tensor hooks cannot see); seconds: the whole loop."""
    variant: str
    dtype: str
    losses: List[float]
    final_loss: float
    heldout_loss: float
    tokens_per_s: Optional[float]
    saved_mb: Optional[float]
    seconds: float


@dataclass
class _Trainee:
    """What a variant trains: loss(ids, targets) -> scalar, under autocast with fp8_recipe."""
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    params: List[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    fp8_recipe: Optional[recipe.Recipe]


def build_variant(name: str, initial: PlainGPT, cfg: TrainConfig, dtype: torch.dtype,
                  device: torch.device) -> _Trainee:
    """A fresh model holding copies of initial's weights, with its optimizer."""
    if name in (HIGH_PRECISION, FP8):
        model = te_gpt_from(initial, dtype, device)
        params = list(model.parameters())
        optimizer = te.optimizers.FusedAdam(params, lr=cfg.lr, betas=BETAS, master_weights=dtype != torch.float32)
        return _Trainee(model.loss, params, optimizer, recipe.DelayedScaling() if name == FP8 else None)
    if name not in ("eager", "compile"):
        raise ValueError(f"variant must be one of {VARIANTS}, got {name!r}")
    model = PlainGPT(initial.cfg, dtype, device)  # not deepcopy: FakeTensors (te-bench list) refuse it
    model.load_state_dict(initial.state_dict())
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=BETAS, weight_decay=0.0)
    return _Trainee(torch.compile(model.loss) if name == "compile" else model.loss, params, optimizer, None)


def forward_backward(trainee: _Trainee, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The loss of one batch (detached) after its backward; FP8 covers the forward only, as in TE."""
    with te.autocast(enabled=trainee.fp8_recipe is not None, recipe=trainee.fp8_recipe):
        loss = trainee.loss(ids, targets)
    loss.backward()
    return loss.detach()


def train_step(trainee: _Trainee, ids: torch.Tensor, targets: torch.Tensor, lr: float) -> torch.Tensor:
    """One optimizer step at learning rate lr; returns the batch's loss."""
    for group in trainee.optimizer.param_groups:
        group["lr"] = lr
    loss = forward_backward(trainee, ids, targets)
    trainee.optimizer.step()
    trainee.optimizer.zero_grad(set_to_none=True)
    return loss


def train_variant(name: str, initial: PlainGPT, cfg: TrainConfig, corpus: Corpus, dtype: torch.dtype,
                  device: torch.device, on_step: Callable[[int], None] = lambda step: None) -> VariantResult:
    """Trains variant `name` from initial's weights on the seeded batch stream; on_step(step)
    is called after every step (progress)."""
    trainee = build_variant(name, initial, cfg, dtype, device)
    model_cfg = cfg.model
    train_batches = batches(corpus.train, model_cfg.batch, model_cfg.seq, cfg.seed, device)
    sync = getattr(torch, device.type).synchronize
    losses: List[torch.Tensor] = []
    times: List[float] = []
    begin = time.perf_counter()
    for step in range(cfg.steps):
        ids, targets = next(train_batches)
        sync()
        start = time.perf_counter()
        losses.append(train_step(trainee, ids, targets, cfg.lr_at(step)))
        sync()
        times.append(time.perf_counter() - start)
        on_step(step)
    seconds = time.perf_counter() - begin
    curve = [float(loss) for loss in losses]  # one host transfer at the end, not a sync per step
    timed = times[cfg.untimed:]
    return VariantResult(
        variant=name, dtype=str(dtype).removeprefix("torch."), losses=curve,
        final_loss=statistics.fmean(curve[-cfg.final_window:]), heldout_loss=heldout_loss(trainee, cfg, corpus, device),
        tokens_per_s=model_cfg.tokens / statistics.median(timed) if timed else None,
        saved_mb=None if name == "compile" else activation_mb(trainee, corpus, model_cfg, device), seconds=seconds)


@torch.no_grad()
def heldout_loss(trainee: _Trainee, cfg: TrainConfig, corpus: Corpus, device: torch.device) -> float:
    """Mean loss over the first heldout_batches batches of the held-out stream (a fixed seed, so
    every variant sees the same ones)."""
    stream = batches(corpus.heldout, cfg.model.batch, cfg.model.seq, cfg.seed + 1, device)
    total = 0.0
    for _ in range(cfg.heldout_batches):
        ids, targets = next(stream)
        with te.autocast(enabled=trainee.fp8_recipe is not None, recipe=trainee.fp8_recipe):
            total += float(trainee.loss(ids, targets))
    return total / cfg.heldout_batches


def activation_mb(trainee: _Trainee, corpus: Corpus, model_cfg: GPTConfig, device: torch.device) -> float:
    """MB autograd saves for one forward + backward (the gradients are dropped after)."""
    ids, targets = next(batches(corpus.heldout, model_cfg.batch, model_cfg.seq, 0, device))
    saved = harness.saved_bytes(lambda: forward_backward(trainee, ids, targets))
    trainee.optimizer.zero_grad(set_to_none=True)
    return saved / 1e6


def train(cfg: TrainConfig, variants: Sequence[str], device: torch.device,
          on_step: Callable[[str, int], None] = lambda variant, step: None) -> Dict[str, object]:
    """Trains every variant from one seeded initialisation; returns
    {"config": ..., "corpus": ..., "variants": {name: VariantResult as a dict},
     "fp8_loss_vs_high_precision_pct": 100 (final_loss[ours_fp8] / final_loss[ours] - 1), or None
     unless both ran}."""
    unknown = [name for name in variants if name not in VARIANTS]
    if unknown or not variants:
        raise ValueError(f"variants must be a non-empty list of {VARIANTS}, got {list(variants)}")
    corpus = load_corpus(cfg.model.seq + 1)
    dtype = step_dtype(device)
    torch.manual_seed(cfg.seed)
    initial = PlainGPT(cfg.model, dtype, device)
    results = {}
    for name in variants:
        torch._dynamo.reset()  # a compile variant compiles its own model from scratch
        results[name] = train_variant(name, initial, cfg, corpus, dtype, device,
                                      lambda step, name=name: on_step(name, step))
    relative = None
    if HIGH_PRECISION in results and FP8 in results:
        relative = 100 * (results[FP8].final_loss / results[HIGH_PRECISION].final_loss - 1)
    config = dict(asdict(cfg), parameters=cfg.model.parameters(), tokens_per_step=cfg.model.tokens,
                  dtype=str(dtype).removeprefix("torch."))
    return {"config": config, "corpus": corpus.describe(),
            "variants": {name: asdict(result) for name, result in results.items()},
            "fp8_loss_vs_high_precision_pct": relative}
